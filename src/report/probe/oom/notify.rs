//! Noticing an OOM kill within about a second: cgroup v1 through an eventfd
//! registered in `cgroup.event_control` (the kernel signals it when the cgroup goes
//! under OOM, before the kill), v2 through inotify on `memory.events`. Where neither
//! can be set up (a read-only cgroup mount has no writable `cgroup.event_control`) the
//! engine polls. Both descriptors go through [`crate::watch`], the crate's one place that
//! registers a descriptor with tokio.

use super::cgroup::{Cgroup, CgroupVersion};
use crate::watch::{FileWatch, register};

/// Wakes the reporter when a cgroup's OOM state changes.
pub enum Notifier {
    /// cgroup v1: an eventfd registered with `cgroup.event_control` for
    /// `memory.oom_control`. The kernel signals it when the cgroup goes under OOM,
    /// before the victim dies.
    EventFd {
        fd: tokio::io::unix::AsyncFd<nix::sys::eventfd::EventFd>,
        _oom_control: std::fs::File,
    },
    /// cgroup v2: inotify on `memory.events`, which the kernel touches on every event.
    Inotify(FileWatch),
}

impl Notifier {
    /// Sets up the best notifier for a cgroup; the error says why polling is used.
    /// Must run inside the tokio runtime.
    pub fn new(cg: &Cgroup) -> Result<Notifier, String> {
        match cg.version {
            CgroupVersion::V1 => {
                use nix::sys::eventfd::{EfdFlags, EventFd};
                use std::os::fd::AsRawFd;
                let efd = EventFd::from_value_and_flags(
                    0,
                    EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
                )
                .map_err(|e| format!("eventfd: {e}"))?;
                let oc_path = cg.path.join("memory.oom_control");
                let oc = std::fs::File::open(&oc_path)
                    .map_err(|e| format!("{}: {e}", oc_path.display()))?;
                let ctl = cg.path.join("cgroup.event_control");
                std::fs::write(&ctl, format!("{} {}", efd.as_raw_fd(), oc.as_raw_fd()))
                    .map_err(|e| format!("{}: {e}", ctl.display()))?;
                let fd = register(efd)?;
                Ok(Notifier::EventFd {
                    fd,
                    _oom_control: oc,
                })
            }
            CgroupVersion::V2 => Ok(Notifier::Inotify(FileWatch::file(
                &cg.path.join("memory.events"),
            )?)),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Notifier::EventFd { .. } => "eventfd",
            Notifier::Inotify(_) => "inotify",
        }
    }

    /// Waits for the next notification.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match self {
            Notifier::EventFd { fd, .. } => loop {
                let mut guard = fd.readable().await?;
                match guard.try_io(|inner| inner.get_ref().read().map_err(std::io::Error::from)) {
                    Ok(r) => return r.map(|_| ()),
                    Err(_would_block) => continue,
                }
            },
            Notifier::Inotify(w) => w.wait().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The v2 notifier is inotify on `memory.events`; on a plain file the plumbing is
    /// the same (kernfs adds only the kernel's own writes).
    #[tokio::test]
    async fn the_v2_notifier_wakes_on_a_change_of_memory_events() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("memory.events");
        std::fs::write(&events, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let cg = Cgroup {
            version: CgroupVersion::V2,
            path: dir.path().to_path_buf(),
        };
        let mut n = Notifier::new(&cg).unwrap();
        assert_eq!(n.kind(), "inotify");
        std::fs::write(&events, "low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n").unwrap();
        tokio::time::timeout(Duration::from_secs(5), n.wait())
            .await
            .expect("a notification within 5 s")
            .unwrap();
        assert_eq!(cg.counters().unwrap().oom_kill, 1);
        // v1 without a writable cgroup.event_control: no notifier, so polling.
        let v1 = Cgroup {
            version: CgroupVersion::V1,
            path: dir.path().to_path_buf(),
        };
        assert!(Notifier::new(&v1).is_err());
    }
}
