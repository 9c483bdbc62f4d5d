//! The group restart for a failed CMD (`--on-failure restart`), without I/O: which
//! peer's failure this pod's CMD restarts for ([`failure_to_act_on`]), and the barrier
//! that keeps every rank's new CMD from starting before every rank has stopped its old
//! one ([`not_stopped`]).
//!
//! A rank that fails leaves every other rank stuck in its next collective (or failing
//! in it a moment later). Each pod's exec publishes, in `trainlet.io/progress`, when its
//! CMD last started, whether it is stopped and waiting to start again, and its last
//! failure worth a retry; every pod reads its peers'. Times are wall-clock times, as
//! the stall's restart compares them: a failure that came after this CMD started is
//! one this CMD must restart for; one from before, this CMD is already the answer to.
//! So each failure restarts every pod's CMD once, whichever pods see it first, and the
//! ranks that fail a moment later in the broken collective join the same restart.

use std::time::{Duration, SystemTime};

/// A peer's failure that asks the job for a restart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerFailure {
    pub pod: String,
    /// When its CMD ended.
    pub since: SystemTime,
    /// How it ended and why: its task, the code or signal, the root cause.
    pub note: String,
}

/// A peer's current run of CMD, as its exec publishes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerRun {
    pub pod: String,
    /// When its CMD last started.
    pub started: SystemTime,
    /// Its CMD is stopped, and waits for the others to stop theirs.
    pub down: bool,
}

/// The peer failure a pod's CMD restarts for, if any: the earliest of the others' that
/// came after this CMD `started` and that no restart of it answered yet (`acted`, the
/// failures known when it last restarted).
pub fn failure_to_act_on<'a>(
    failures: &'a [PeerFailure],
    own: Option<&str>,
    started: SystemTime,
    acted: &[PeerFailure],
) -> Option<&'a PeerFailure> {
    failures
        .iter()
        .filter(|f| Some(f.pod.as_str()) != own)
        .filter(|f| f.since > started)
        .filter(|f| !acted.iter().any(|a| a.pod == f.pod && a.since == f.since))
        .min_by_key(|f| f.since)
}

/// How long before CMD ended an OOM kill in its tree can be the start of its failure:
/// torchrun stops a failed worker's siblings with SIGTERM and waits up to 30 s
/// (`torch.distributed.elastic`'s `PContext.close`) before it exits itself, and 5 s more
/// for its own exit.
pub const KILL_BEFORE_FAILURE: Duration = Duration::from_secs(35);

/// When a failed CMD began to fail: at the OOM kill of one of its processes, when one
/// came at most [`KILL_BEFORE_FAILURE`] before it `ended`, or else when it ended. The
/// launcher of the rank that was killed exits only once it has stopped the rank's local
/// siblings, while a peer's launcher whose rank saw the broken collective may exit first:
/// dated by the ends, the failure would be the peer's.
pub fn failure_time(ended: SystemTime, first_kill: Option<SystemTime>) -> SystemTime {
    match first_kill {
        Some(k)
            if k <= ended && ended.duration_since(k).unwrap_or_default() <= KILL_BEFORE_FAILURE =>
        {
            k
        }
        _ => ended,
    }
}

/// The first of the OOM kills that a failure of CMD can still be dated by, after a kill
/// `now`: an earlier one stays, unless it is too old to be part of one failure.
pub fn first_kill(earlier: Option<SystemTime>, now: SystemTime) -> SystemTime {
    match earlier {
        Some(k) if now.duration_since(k).unwrap_or_default() <= KILL_BEFORE_FAILURE => k,
        _ => now,
    }
}

/// The barrier: the peers whose CMD of the failed run may still be running, for a
/// restart that answers a failure at `since`. A peer has stopped it when it says it is
/// down, or when it started a new CMD after the failure (it passed the barrier before
/// this pod published that it is down, which this pod's own wait then allows). Empty:
/// every rank has stopped, and CMD may start again.
pub fn not_stopped(runs: &[PeerRun], own: Option<&str>, since: SystemTime) -> Vec<String> {
    let mut left: Vec<String> = runs
        .iter()
        .filter(|r| Some(r.pod.as_str()) != own)
        .filter(|r| !r.down && r.started <= since)
        .map(|r| r.pod.clone())
        .collect();
    left.sort();
    left.dedup();
    left
}

/// How long a rank waits at the barrier: the time a peer may take to stop its CMD
/// (`--restart-grace`, between SIGTERM and SIGKILL) and [`BARRIER_SLACK`] for it to
/// learn of the failure and say that it stopped.
pub fn barrier_timeout(grace: Duration) -> Duration {
    grace + BARRIER_SLACK
}

/// What a peer needs besides its grace to see a failure and publish that it stopped:
/// two publications of the pod's annotation and two reads of a watch, a second or two
/// on a loaded API server.
pub const BARRIER_SLACK: Duration = Duration::from_secs(15);

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use proptest::prelude::*;

    use super::*;

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    fn failure(pod: &str, s: u64) -> PeerFailure {
        PeerFailure {
            pod: pod.into(),
            since: t(s),
            note: format!("{pod} exited with code 1"),
        }
    }

    fn run(pod: &str, started: u64, down: bool) -> PeerRun {
        PeerRun {
            pod: pod.into(),
            started: t(started),
            down,
        }
    }

    #[test]
    fn a_peers_failure_after_this_run_started_is_acted_on_once() {
        let f = [failure("w-1", 20)];
        assert_eq!(failure_to_act_on(&f, Some("w-0"), t(10), &[]), Some(&f[0]));
        // This pod's own is its own to see.
        assert_eq!(failure_to_act_on(&f, Some("w-1"), t(10), &[]), None);
        // This run started after it: the restart that started it answered it.
        assert_eq!(failure_to_act_on(&f, Some("w-0"), t(25), &[]), None);
        // Known at the last restart: answered, even on a clock that reads it later.
        assert_eq!(failure_to_act_on(&f, Some("w-0"), t(10), &f), None);
    }

    #[test]
    fn of_several_failures_the_earliest_is_named() {
        let f = [failure("w-2", 31), failure("w-1", 30)];
        assert_eq!(
            failure_to_act_on(&f, Some("w-0"), t(10), &[]).map(|f| f.pod.as_str()),
            Some("w-1")
        );
    }

    #[test]
    fn a_failure_is_dated_by_the_oom_kill_that_began_it() {
        // Rank 2 OOM-killed at 100 s; its launcher stopped rank 3 and exited at 103 s.
        assert_eq!(failure_time(t(103), Some(t(100))), t(100));
        assert_eq!(failure_time(t(103), None), t(103));
        // A kill 35 s before the end still began it; one 36 s before did not.
        assert_eq!(failure_time(t(135), Some(t(100))), t(100));
        assert_eq!(failure_time(t(136), Some(t(100))), t(136));
        // A clock that read the kill after the end: the end.
        assert_eq!(failure_time(t(99), Some(t(100))), t(99));
        // Of two kills close together the first counts; a later one after a long
        // quiet starts anew.
        assert_eq!(first_kill(Some(t(100)), t(120)), t(100));
        assert_eq!(first_kill(Some(t(100)), t(136)), t(136));
        assert_eq!(first_kill(None, t(7)), t(7));
    }

    #[test]
    fn the_barrier_waits_for_peers_still_running_the_failed_run() {
        let runs = [
            run("w-0", 10, false),
            run("w-1", 10, true),
            run("w-2", 10, false),
        ];
        assert_eq!(not_stopped(&runs, Some("w-0"), t(20)), ["w-2"]);
        // w-2 stopped: every rank has.
        let runs = [run("w-1", 10, true), run("w-2", 10, true)];
        assert!(not_stopped(&runs, Some("w-0"), t(20)).is_empty());
        // w-2 already started again after the failure: its old CMD is gone.
        let runs = [run("w-1", 10, true), run("w-2", 22, false)];
        assert!(not_stopped(&runs, Some("w-0"), t(20)).is_empty());
    }

    proptest! {
        /// Whatever the runs, the barrier never names this pod and names a peer only if
        /// its published run is of the failed one and not stopped.
        #[test]
        fn the_barrier_names_only_running_peers_of_the_failed_run(
            runs in proptest::collection::vec((0u8..5, 0u64..40, any::<bool>()), 0..12),
            since in 0u64..40,
        ) {
            let runs: Vec<PeerRun> = runs
                .iter()
                .map(|(p, s, d)| run(&format!("w-{p}"), *s, *d))
                .collect();
            let left = not_stopped(&runs, Some("w-0"), t(since));
            prop_assert!(!left.contains(&"w-0".to_string()));
            for pod in &left {
                prop_assert!(runs.iter().any(|r| &r.pod == pod && !r.down && r.started <= t(since)));
            }
            for r in runs.iter().filter(|r| r.pod != "w-0" && !r.down && r.started <= t(since)) {
                prop_assert!(left.contains(&r.pod));
            }
        }
    }
}
