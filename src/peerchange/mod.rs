//! A peer replaced or lost, between the two processes of a pod that hands over: the
//! sidecar, which holds the credentials and watches the peers, tells exec where the
//! cluster stands and moves the files when exec waits for them (`peers.json`,
//! [`file`]); [`protocol`] is that exchange as typed phases, with a pure step per side.

pub mod file;
pub mod protocol;
