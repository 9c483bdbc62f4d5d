//! Stopping CMD and everything it started: SIGTERM to CMD, SIGTERM to whatever of its
//! tree is left once CMD is gone (orphans are trainlet's children, as it is their
//! subreaper), and SIGKILL to all of it after a grace period. So nothing of an old CMD
//! holds a port or a GPU when a new one starts, or outlives the container's main
//! process. A stop signal meanwhile is passed on, and said.

use std::time::{Duration, Instant};

use tracing::info;

use super::child::{self, Child};
use crate::flags;
use crate::signal::{self, Signals};

/// Stops `child` and its tree within `grace`; returns the stop signal (SIGTERM,
/// SIGINT) that arrived meanwhile, if one did: exec ends after this stop.
pub async fn stop_tree(child: &mut Child, signals: &mut Signals, grace: Duration) -> Option<i32> {
    if child.exit.is_none() {
        child.forward(signal::SIGTERM);
        info!(pid = child.pid, "stopping the command: SIGTERM");
    }
    let deadline = Instant::now() + grace;
    let mut stop = None;
    let mut killed = false;
    let mut rest_told = false;
    loop {
        child.reap();
        let left = child::descendants();
        let cmd_done = child.exit.is_some();
        if cmd_done && left.is_empty() {
            return stop;
        }
        if cmd_done && !rest_told {
            info!(pids = ?left, "the command has ended; stopping what is left of its processes: SIGTERM");
            for pid in &left {
                let _ = signal::send(*pid, signal::SIGTERM);
            }
            rest_told = true;
        }
        if Instant::now() >= deadline && !killed {
            info!(
                pids = ?left,
                "the command did not stop within {} {grace:?}; sending SIGKILL",
                flags::long(flags::RESTART_GRACE)
            );
            for pid in &left {
                let _ = signal::send(*pid, signal::SIGKILL);
            }
            killed = true;
        }
        tokio::select! {
            sig = signals.recv() => match sig {
                Some(signal::SIGCHLD) | None => {}
                Some(s) => {
                    for pid in &left {
                        let _ = signal::send(*pid, s);
                    }
                    if signal::STOP.contains(&s) {
                        stop = Some(s);
                    }
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Resolves on the first stop signal (SIGTERM, SIGINT) while CMD is not running, with
/// the signal.
pub async fn wait_for_stop(signals: &mut Signals) -> i32 {
    loop {
        match signals.recv().await {
            Some(s) if signal::STOP.contains(&s) => {
                info!("{}: stopping", signal::name(s));
                return s;
            }
            None => return signal::SIGTERM,
            Some(_) => {}
        }
    }
}
