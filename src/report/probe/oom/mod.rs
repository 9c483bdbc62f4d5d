//! OOM kills: from cgroup counters, attributed to a process where possible, and from
//! pod status.
//!
//! - [`cgroup`]: the memory cgroups and their counters, in both versions' formats;
//! - [`notify`]: eventfd (v1) and inotify (v2) notifications of a change;
//! - [`procs`]: CMD's process tree, to name the victim in exec mode;
//! - [`ledger`]: every kill counted once, from whichever source saw it first.

pub mod cgroup;
pub mod ledger;
pub mod notify;
pub mod procs;
pub mod watch;

use thiserror::Error;

pub use cgroup::{Cgroup, CgroupVersion, OomCounters, find_container_cgroup, own_cgroup, quantity};
pub use ledger::{OomKill, OomLedger, status_ooms};
pub use notify::Notifier;
pub use procs::{ProcStat, SeenProc};

#[derive(Debug, Error)]
pub enum OomError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} has no {field} line: not a memory cgroup of a supported kernel")]
    Format { path: String, field: &'static str },
    #[error(
        "no memory cgroup found for this process in /proc/self/cgroup and /proc/self/mountinfo (is the cgroup filesystem mounted?)"
    )]
    NoOwnCgroup,
}
