//! Which processes under CMD are the job's ranks. `RANK` in a process's environment
//! does not tell alone: a launcher (torchrun's agent, `accelerate launch`) has the
//! pod's `RANK` (trainlet's files and the operators set it for the pod) and starts its
//! workers with `RANK` and `LOCAL_RANK` set anew; a helper that a rank forks or spawns
//! (a DataLoader worker, a `multiprocessing` child) inherits the rank's. Neither is a
//! rank: the summary would name the launcher's loop, or one rank twice.

use std::collections::BTreeMap;

/// What the rule reads of one Python process under CMD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pid: u32,
    /// Its parent process.
    pub parent: Option<u32>,
    /// `RANK` in its environment.
    pub rank: Option<u32>,
    /// Whether `LOCAL_RANK` is in its environment: torchrun and the launchers built on
    /// it set it for each worker.
    pub local_rank: bool,
}

/// The ranks among `seen`, by pid. A process with a `RANK` is one unless it is a
/// launcher (a child of it has a `RANK` other than its own, or `LOCAL_RANK` where it
/// has none) or a helper (its parent has the same `RANK` and is no launcher).
pub fn ranks(seen: &[Seen]) -> BTreeMap<u32, u32> {
    let by_pid: BTreeMap<u32, &Seen> = seen.iter().map(|s| (s.pid, s)).collect();
    let launches = |p: &Seen| {
        seen.iter().any(|c| {
            c.parent == Some(p.pid)
                && c.rank.is_some()
                && (c.rank != p.rank || (c.local_rank && !p.local_rank))
        })
    };
    seen.iter()
        .filter(|s| !launches(s))
        .filter(|s| {
            !s.parent
                .and_then(|pp| by_pid.get(&pp))
                .is_some_and(|p| p.rank == s.rank && !launches(p))
        })
        .filter_map(|s| Some((s.pid, s.rank?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pid: u32, parent: u32, rank: Option<u32>, local_rank: bool) -> Seen {
        Seen {
            pid,
            parent: Some(parent),
            rank,
            local_rank,
        }
    }

    #[test]
    fn torchruns_agent_is_no_rank_and_its_workers_are() {
        // Pod 1 of a job of 2 processes per pod: the agent has the pod's RANK.
        let tree = [
            seen(10, 1, Some(1), false),
            seen(11, 10, Some(2), true),
            seen(12, 10, Some(3), true),
        ];
        assert_eq!(ranks(&tree), BTreeMap::from([(11, 2), (12, 3)]));
        // Pod 0: a worker has the agent's RANK, the other another.
        let tree = [
            seen(10, 1, Some(0), false),
            seen(11, 10, Some(0), true),
            seen(12, 10, Some(1), true),
        ];
        assert_eq!(ranks(&tree), BTreeMap::from([(11, 0), (12, 1)]));
        // One process per pod: the worker's RANK is the agent's; LOCAL_RANK tells.
        let tree = [seen(10, 1, Some(4), false), seen(11, 10, Some(4), true)];
        assert_eq!(ranks(&tree), BTreeMap::from([(11, 4)]));
    }

    #[test]
    fn a_ranks_data_loader_workers_are_no_ranks_of_their_own() {
        // A torchrun worker's DataLoader workers inherit its RANK and LOCAL_RANK.
        let tree = [
            seen(10, 1, Some(0), false),
            seen(11, 10, Some(1), true),
            seen(20, 11, Some(1), true),
            seen(21, 11, Some(1), true),
        ];
        assert_eq!(ranks(&tree), BTreeMap::from([(11, 1)]));
        // `python train.py` with the pod's RANK, and its workers.
        let tree = [seen(10, 1, Some(5), false), seen(20, 10, Some(5), false)];
        assert_eq!(ranks(&tree), BTreeMap::from([(10, 5)]));
    }

    #[test]
    fn without_a_rank_nothing_is_one_and_a_launcher_setting_rank_alone_is_seen() {
        let tree = [seen(10, 1, None, false), seen(11, 10, None, false)];
        assert_eq!(ranks(&tree), BTreeMap::new());
        // A script that sets RANK for the children it spawns, without LOCAL_RANK.
        let tree = [
            seen(10, 1, None, false),
            seen(11, 10, Some(0), false),
            seen(12, 10, Some(1), false),
        ];
        assert_eq!(ranks(&tree), BTreeMap::from([(11, 0), (12, 1)]));
        let tree = [
            seen(10, 1, Some(0), false),
            seen(11, 10, Some(0), false),
            seen(12, 10, Some(1), false),
        ];
        assert_eq!(ranks(&tree), BTreeMap::from([(11, 0), (12, 1)]));
    }
}
