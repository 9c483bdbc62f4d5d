//! CMD as trainlet's child in `exec --report`: made with the variables of
//! `trainlet.env` ([`command`]), started under a subreaper, sent the signals the kubelet
//! sends trainlet, and reaped, together with every orphan of its tree, as PID 1 must.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use tracing::{debug, info, warn};

use super::output::{Copiers, Watch};
use crate::Failure;
use crate::render::frameworks::envfile;
use crate::render::{self, ENV_FILE, TF_CONFIG_FILE, TfConfig};
use crate::report::probe::oom::procs;
use crate::signal;

/// How long exec waits, once CMD has ended, for its output to be drained from the
/// pipes (a process CMD left behind may still hold them open).
const DRAIN: Duration = Duration::from_secs(2);

/// The variable that makes Python write its output at once: a Python trainer whose
/// stdout is a pipe (exec's, or the container runtime's log pipe) otherwise holds it in
/// an 8 KiB buffer, so the stall watch sees no line for minutes and whatever is in the
/// buffer is lost when CMD is stopped. Kubeflow's training operator sets it in every
/// PyTorch and JAX container for the same reason.
pub const PYTHON_UNBUFFERED: &str = "PYTHONUNBUFFERED";

/// `PYTHONUNBUFFERED=1` for CMD, unless the container already sets it (to anything:
/// the user's choice stands). `env` reads exec's environment.
pub fn unbuffered(
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<(&'static str, &'static str)> {
    env(PYTHON_UNBUFFERED)
        .is_none()
        .then_some((PYTHON_UNBUFFERED, "1"))
}

/// The running command.
pub struct Child {
    pub pid: u32,
    /// CMD's exit status, or 128+signal, once it has ended.
    pub exit: Option<i32>,
    /// The threads that pass CMD's output through: its stderr always, its stdout too
    /// when it is watched for progress.
    output: Option<Copiers>,
}

impl Child {
    /// Starts CMD. Before that, trainlet becomes a child subreaper: orphans of CMD's
    /// tree are re-parented to trainlet, not to the node's init, so they stay visible
    /// as CMD's and trainlet reaps them. CMD's stderr is a pipe that exec passes
    /// through: exec logs there too, and the gate ([`crate::stderr_gate`]) writes its
    /// lines between CMD's (a trainer that fails at once prints its error while exec
    /// logs that it started it). With `watch`, its stdout is one as well, and both are
    /// watched for progress; without, CMD writes to exec's stdout itself.
    pub fn spawn(
        mut cmd: std::process::Command,
        watch: Option<&Arc<Watch>>,
    ) -> std::io::Result<Child> {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            debug!("cannot become a child subreaper: {e}");
        }
        if watch.is_some() {
            cmd.stdout(Stdio::piped());
        }
        cmd.stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let output = Some(Copiers::start(&mut child, watch));
        Ok(Child {
            pid: child.id(),
            exit: None,
            output,
        })
    }

    /// CMD has ended: waits (a little) until its output is written through.
    pub fn drain(&mut self) {
        if let Some(c) = self.output.take() {
            c.finish(DRAIN);
        }
    }

    /// Forwards a signal to CMD while it runs.
    pub fn forward(&self, sig: i32) {
        if self.exit.is_some() {
            return;
        }
        debug!("forwarding {} to pid {}", signal::name(sig), self.pid);
        if let Err(e) = signal::send(self.pid, sig) {
            debug!("could not forward {}: {e}", signal::name(sig));
        }
    }

    /// Reaps every exited child: CMD, whose status becomes trainlet's, and orphans of
    /// CMD's tree that were re-parented to trainlet.
    pub fn reap(&mut self) {
        loop {
            match waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(WaitStatus::Exited(pid, code)) => {
                    if pid.as_raw() as u32 == self.pid {
                        self.exit = Some(code);
                    }
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    if pid.as_raw() as u32 == self.pid {
                        info!("the command was killed by {}", sig.as_str());
                        self.exit = Some(128 + sig as i32);
                    }
                }
                Ok(_) => {}
            }
        }
    }
}

/// The live processes under trainlet: CMD's tree and the orphans of it that were
/// re-parented to trainlet. Zombies are left out: [`Child::reap`] takes them.
pub fn descendants() -> Vec<u32> {
    let procs = procs::all_processes(std::path::Path::new("/proc"), procs::page_size());
    procs::descendants(&procs, std::process::id())
        .into_values()
        .filter(|p| p.state != 'Z')
        .map(|p| p.pid)
        .collect()
}

/// CMD could not be started: shell-compatible codes, 127 when it was not found, 126
/// when it was found but cannot be executed.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {program:?}: {source}")]
pub struct SpawnError {
    pub program: String,
    pub source: std::io::Error,
}

impl SpawnError {
    pub fn code(&self) -> crate::Code {
        match self.source.kind() {
            std::io::ErrorKind::NotFound => crate::Code::CommandNotFound,
            _ => crate::Code::CannotExecute,
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
    if let Some((name, value)) = unbuffered(|n| std::env::var_os(n)) {
        cmd.env(name, value);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_is_unbuffered_unless_the_container_says_otherwise() {
        assert_eq!(unbuffered(|_| None), Some(("PYTHONUNBUFFERED", "1")));
        assert_eq!(unbuffered(|_| Some("0".into())), None);
        assert_eq!(unbuffered(|_| Some("".into())), None);
    }
}
