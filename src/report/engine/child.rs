//! CMD as trainlet's child in `exec --report`: started under a subreaper, sent the
//! signals the kubelet sends trainlet, and reaped, together with every orphan of its
//! tree, as PID 1 must.

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use tracing::{debug, info};

use crate::report::oom::procs;
use crate::signal;

/// The running command.
pub struct Child {
    pub pid: u32,
    /// CMD's exit status, or 128+signal, once it has ended.
    pub exit: Option<i32>,
}

impl Child {
    /// Starts CMD. Before that, trainlet becomes a child subreaper: orphans of CMD's
    /// tree are re-parented to trainlet, not to the node's init, so they stay visible
    /// as CMD's and trainlet reaps them.
    pub fn spawn(mut cmd: std::process::Command) -> std::io::Result<Child> {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            debug!("cannot become a child subreaper: {e}");
        }
        let child = cmd.spawn()?;
        Ok(Child {
            pid: child.id(),
            exit: None,
        })
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
