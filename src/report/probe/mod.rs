//! What the reporters observe, one folder per probe, each whole: its parsers (pure),
//! and what watches for it.
//!
//! - [`gpu`]: NVML's view of the training container's GPUs, the event thread that
//!   hears XID errors and a GPU's loss, and the XID ledger;
//! - [`ports`]: the sockets that listen (netlink sock_diag, else `/proc/net`), who owns
//!   them, and whether the training container can listen on its own ports;
//! - [`oom`]: cgroup counters and notifiers, CMD's process tree, pod status, and the
//!   watch that counts every kill once.

pub mod gpu;
pub mod oom;
pub mod ports;
