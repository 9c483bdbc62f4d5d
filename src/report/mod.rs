//! The reporters of `trainlet sidecar` and `trainlet exec --report`.
//!
//! Three probes observe: [`gpu`] (NVML), [`ports`] (`/proc/net/tcp{,6}` and socket
//! owners) and [`oom`] (cgroup counters and notifiers, CMD's process tree, pod status).
//! [`pod`] reads what the own pod says about the training container. The [`engine`]
//! runs them: its pure [`engine::state`] turns the observations into one report, decides
//! health and picks the Events of each transition; its [`engine::outbox`] publishes
//! only what changed; the loop around them is I/O.
//!
//! A failing probe degrades only its own part: NVML erroring is a GPU state, an
//! unreadable `/proc/net` makes the ports `unknown`, a missing cgroup leaves pod
//! status as the only OOM source. None of them stops the others.

pub mod engine;
pub mod gpu;
pub mod gpu_events;
pub mod handover;
pub mod oom;
pub mod pod;
pub mod ports;
pub mod restart;
pub mod sock_diag;
pub mod xid;
