//! Making CMD again for a restart: after a peer change, the cluster is resolved again
//! (the init workflow, with exec's own flags) where exec holds credentials, or read from
//! the files the sidecar moved where it hands over; after a stall or a failure, the
//! files are as they were. Either way CMD gets the variables of `trainlet.env` again.

use std::path::{Path, PathBuf};

use tracing::warn;

use crate::Failure;
use crate::bootstrap::{self, InitConfig, InitError};
use crate::render::frameworks::envfile;
use crate::render::{self, ENV_FILE, TF_CONFIG_FILE, TfConfig};

/// Why CMD starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// A peer changed (`--on-peer-change restart`): wait until the cluster is complete
    /// again and write its files. `after` is, in a coordinated job, the generation of
    /// the resolution that showed the change: resolving again must not take an older
    /// one, which still names the pod that went.
    PeerChange { after: Option<u64> },
    /// A stall (`--on-stall restart`) or a failure (`--on-failure restart`): the
    /// cluster is as it was, and so are its files.
    AsItWas,
}

/// What a restart needs to make CMD again.
pub struct Respawner {
    /// CMD and its arguments.
    pub argv: Vec<String>,
    /// Where init's files are.
    pub dir: PathBuf,
    /// Resolving again after a peer change: init's config, where exec holds
    /// credentials; `None` where it hands over (the sidecar moves the files).
    pub init: Option<InitConfig>,
    /// What CMD gets besides trainlet.env (the heartbeat file, torch's error file),
    /// applied at each start.
    pub prepare: Box<dyn Fn(std::process::Command) -> std::process::Command>,
    /// Init's errors as the user reads them.
    pub explain: fn(&InitError) -> String,
    /// CMD's failure with this exit code, in words (how it ended, its root cause),
    /// when it is worth a retry; `None` when it is permanent.
    pub retried: Box<dyn Fn(i32) -> Option<String>>,
}

impl Respawner {
    /// CMD again, for a restart: after a peer change, from the cluster resolved again
    /// (with credentials) or from the files the sidecar moved; after a stall, from the
    /// files as they were.
    pub async fn command(&self, resume: Resume) -> Result<std::process::Command, Failure> {
        let init = match resume {
            Resume::PeerChange { after } => self.init.clone().map(|mut c| {
                c.min_generation = after;
                c
            }),
            // A stall changed no peer: the files are as they were.
            Resume::AsItWas => None,
        };
        match init {
            Some(init) => {
                let out = bootstrap::run(&init, self.explain)
                    .await
                    .map_err(|e| Failure::new(e.code(), (self.explain)(&e)))?;
                Ok((self.prepare)(command(
                    &self.argv,
                    out.env,
                    &init.output_dir,
                )))
            }
            // The sidecar moved the files, or nothing moved.
            None => {
                let (env, _) = read_outputs(&self.dir)?;
                Ok((self.prepare)(command(&self.argv, env, &self.dir)))
            }
        }
    }
}

/// The init container's files: trainlet.env holds what its --framework chose. A
/// tf_config.json alone (written by hand, or by an older init) gives TF_CONFIG.
pub fn read_outputs(dir: &Path) -> Result<(Vec<(String, String)>, TfConfig), Failure> {
    let (_, tf) = render::read_tf_config(&dir.join(TF_CONFIG_FILE))?;
    let env_file = dir.join(ENV_FILE);
    let env = if env_file.exists() {
        render::read_env(&env_file)?
    } else {
        render::tf_env(&tf)
    };
    Ok((env, tf))
}

/// CMD with the variables of trainlet.env, those that fit in an environment.
pub fn command(argv: &[String], env: Vec<(String, String)>, dir: &Path) -> std::process::Command {
    let (env, too_long) = envfile::fitting(env);
    for name in too_long {
        warn!(
            "{name} is longer than the kernel allows one environment variable (128 KiB) and is left out of CMD's environment; read it from {} instead",
            dir.display()
        );
    }
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env);
    if let Some((name, value)) = super::child::unbuffered(|n| std::env::var_os(n)) {
        cmd.env(name, value);
    }
    cmd
}
