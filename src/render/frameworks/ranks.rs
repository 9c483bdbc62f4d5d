//! The one flat rank order every framework shares: the job types in the order they
//! were defined (`--job`, or the mapping), and within a type by task index. With
//! `--job master=… --job worker=…` the master is rank 0 and worker `i` is rank `i+1`,
//! as Kubeflow's PyTorchJob numbers them.
//!
//! TensorFlow's `evaluator` is not a rank: it evaluates checkpoints beside the
//! training cluster and takes no part in its collectives.

use super::RendezvousPort;
use crate::cluster::{Cluster, Peer, Task, address};

/// The job type that is never part of the training cluster.
pub const EVALUATOR: &str = "evaluator";

/// The ranked tasks, and where the own task stands among them.
#[derive(Debug, Clone)]
pub struct Ranks<'c> {
    pub tasks: Vec<&'c Peer>,
    /// The own rank; `None` for the evaluator.
    pub own: Option<usize>,
    /// Whether the first type of the order has a task, so that rank 0 is its task 0.
    first_present: bool,
}

impl<'c> Ranks<'c> {
    pub fn new(cluster: &'c Cluster, order: &[&str], own: &Task) -> Self {
        let tasks: Vec<&Peer> = order
            .iter()
            .filter(|t| **t != EVALUATOR)
            .flat_map(|t| cluster.tasks.get(*t).into_iter().flatten())
            .collect();
        let own = tasks
            .iter()
            .position(|p| p.task_type == own.task_type && p.index == own.index);
        let first_present = order
            .first()
            .and_then(|t| cluster.tasks.get(*t))
            .is_some_and(|p| !p.is_empty());
        Ranks {
            tasks,
            own,
            first_present,
        }
    }

    /// Rank 0, where the rendezvous happens: task 0 of the first type.
    pub fn zero(&self) -> Option<&'c Peer> {
        self.tasks.first().copied().filter(|_| self.first_present)
    }

    /// Where a launcher rendezvous: rank 0's host, and `port`: rank 0's task port, a
    /// port of its own, or the launcher's `default`.
    pub fn rendezvous(&self, port: RendezvousPort, default: u16) -> Option<(&'c str, u16)> {
        let zero = self.zero()?;
        let port = match port {
            RendezvousPort::Fixed(p) => p,
            RendezvousPort::Task => address::port(&zero.address).unwrap_or(default),
            RendezvousPort::Default => default,
        };
        Some((address::host(&zero.address), port))
    }

    /// `master/0`, `worker/0`, … for `cluster.json`.
    pub fn names(&self) -> Vec<String> {
        self.tasks
            .iter()
            .map(|p| format!("{}/{}", p.task_type, p.index))
            .collect()
    }
}
