//! The reporters of `trainlet sidecar` and `trainlet exec --report`.
//!
//! Three probes observe ([`probe`]): the GPUs through NVML, their XID errors and their
//! loss; the ports (the sockets that listen, and who owns them); and OOM kills (cgroup
//! counters and notifiers, CMD's process tree, pod status). [`pod`] reads what the own
//! pod says about the training container. The pure [`state`] turns the observations
//! into one report, decides health and picks the Events of each transition; [`budget`]
//! fits the report into its annotation; the [`outbox`] publishes only what changed;
//! the agent (`src/agent`) is the loop around them, and the only part that does I/O.
//!
//! A failing probe degrades only its own part: NVML erroring is a GPU state, an
//! unreadable `/proc/net` makes the ports `unknown`, a missing cgroup leaves pod
//! status as the only OOM source. None of them stops the others.

pub mod budget;
pub mod document;
pub mod outbox;
pub mod pod;
pub mod previous;
pub mod probe;
pub mod recorder;
pub mod state;
pub mod transitions;

/// Which way the reporters run: in their own container, or in the training
/// container's `trainlet exec`, beside CMD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Sidecar,
    Exec,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::Exec => "exec",
        }
    }
}
