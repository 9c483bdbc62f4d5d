//! Making CMD again for a restart: after a peer change, the cluster is resolved again
//! (the init workflow, with exec's own flags) where exec holds credentials, or read
//! from the files the sidecar moved where it hands over; after a stall, the files are
//! as they were. Either way CMD gets the variables of `trainlet.env` again.

use std::path::{Path, PathBuf};

use tracing::warn;

use super::lifecycle::{Respawn, Resume};
use crate::Failure;
use crate::bootstrap::{self, InitConfig, InitError};
use crate::render::frameworks::envfile;
use crate::render::{self, ENV_FILE, TF_CONFIG_FILE, TfConfig};

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
    pub prepare: std::rc::Rc<dyn Fn(std::process::Command) -> std::process::Command>,
    /// Init's errors as the user reads them.
    pub explain: fn(&InitError) -> String,
}

impl Respawner {
    /// The [`Respawn`] that the restart loop calls.
    pub fn into_respawn(self) -> Respawn {
        Box::new(move |resume| {
            let init = match resume {
                Resume::PeerChange { after } => self.init.clone().map(|mut c| {
                    c.min_generation = after;
                    c
                }),
                // A stall changed no peer: the files are as they were.
                Resume::Stall => None,
            };
            let argv = self.argv.clone();
            let dir = self.dir.clone();
            let prepare = self.prepare.clone();
            let explain = self.explain;
            Box::pin(async move {
                match init {
                    Some(init) => {
                        let out = bootstrap::run(&init, explain)
                            .await
                            .map_err(|e| Failure::new(e.code(), explain(&e)))?;
                        Ok(prepare(command(&argv, out.env, &init.output_dir)))
                    }
                    // The sidecar moved the files, or nothing moved.
                    None => {
                        let (env, _) = read_outputs(&dir)?;
                        Ok(prepare(command(&argv, env, &dir)))
                    }
                }
            })
        })
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
