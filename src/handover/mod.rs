//! The files between the training container's `trainlet exec` and the `trainlet`
//! sidecar, which share a pod but not its credentials: the training container holds no
//! API token, so exec hands what only it can see to the sidecar, and the sidecar tells
//! exec where the cluster stands.
//!
//! - [`observation`]: exec → sidecar, `exec.json` in the observation volume: exec's
//!   GPUs, CMD's ports and OOM kills, its restarts; the format, and the guarded parse
//!   of what a less trusted container wrote;
//! - [`peers`]: sidecar → exec, `peers.json` next to init's files: where the cluster
//!   stands, and when the files were moved to a replaced peer;
//! - [`file`]: both files' I/O, one way: the atomic write, and a bounded read that
//!   follows no symlink and does not block on a FIFO.
//!
//! A file carries *state*, not a stream of messages, so either side can restart at any
//! time without a handshake; each side wakes on inotify ([`crate::watch`]) and reads
//! every `--interval` besides.

pub mod file;
pub mod observation;
