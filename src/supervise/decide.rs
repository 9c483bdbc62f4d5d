//! The supervisor's decisions, without I/O: when the agent's loop hands CMD back, what
//! made exec act on it ([`next`]), and what the policy does about it ([`on`]). The
//! restart loop (`lifecycle.rs`) only carries them out, so each transition of the
//! life of CMD has a unit test here.

use super::policy::{self, Decision, OnPeerChange, Policy};

/// What made exec act on CMD.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// A peer was lost or replaced: the `trainlet.io/cluster` text.
    PeerChange(String),
    /// No progress in this pod, or in a peer's: whose, and for how long.
    Stall(String),
}

/// What the supervisor knows when the agent's loop returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// A stop signal came while nothing was forwarded to CMD.
    pub stopped: bool,
    /// The kubelet's stop signal was forwarded to CMD.
    pub terminating: bool,
    /// CMD's exit status; `None` while it runs.
    pub exit: Option<i32>,
    /// The stale cluster the policy acts on, while it is stale.
    pub stale: Option<String>,
    /// A stall the policy acts on (`--on-stall restart|exit`).
    pub stalled: Option<String>,
    /// `--on-peer-change`.
    pub on_change: OnPeerChange,
    /// The wait for a peer change to explain a failure ([`Next::Settle`]) is over.
    pub settled: bool,
}

/// What the supervisor does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// exec ends with CMD as it is.
    End,
    /// CMD failed while the cluster looked current: wait up to [`policy::SETTLE`] for
    /// the peer change that explains it (a broken collective fails before the watch
    /// sees the pod go), then decide again.
    Settle,
    /// Act on this, as the policy says ([`on`]).
    Act(Trigger),
}

/// After CMD exited or the agent's loop returned: the peer change or stall the policy
/// acts on, a wait for one, or the end.
pub fn next(f: &Facts) -> Next {
    if f.stopped {
        return Next::End;
    }
    let failed = f.exit.is_some_and(|code| code != 0);
    if failed
        && !f.settled
        && !f.terminating
        && f.stale.is_none()
        && f.on_change != OnPeerChange::Report
    {
        return Next::Settle;
    }
    let trigger = match (&f.stale, &f.stalled) {
        (Some(stale), _) => Trigger::PeerChange(stale.clone()),
        // A stall restarts a CMD that still runs (hung), not one that has ended.
        (None, Some(why)) if f.exit.is_none() => Trigger::Stall(why.clone()),
        _ => return Next::End,
    };
    // The kubelet stops the container, or CMD ended well (the job's work is done,
    // whatever its peers do now): nothing restarts it.
    if f.terminating || f.exit == Some(0) {
        return Next::End;
    }
    Next::Act(trigger)
}

/// What the policy does about `trigger`, after `done` restarts.
pub fn on(policy: &Policy, done: u32, trigger: &Trigger) -> Decision {
    match trigger {
        Trigger::PeerChange(stale) => policy::decide(policy, done, stale),
        Trigger::Stall(why) => policy::decide_stall(policy, done, why),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::supervise::policy::OnStall;

    const STALE: &str = "stale: worker/1 10.0.0.7 → 10.0.0.19";
    const HUNG: &str = "trainer made no progress for 5m";

    fn restart() -> Facts {
        Facts {
            on_change: OnPeerChange::Restart,
            ..Facts::default()
        }
    }

    #[test]
    fn a_stop_signal_ends_whatever_else_holds() {
        let f = Facts {
            stopped: true,
            exit: Some(1),
            stale: Some(STALE.into()),
            stalled: Some(HUNG.into()),
            ..restart()
        };
        assert_eq!(next(&f), Next::End);
    }

    #[test]
    fn a_stale_cluster_while_cmd_runs_is_a_peer_change() {
        let f = Facts {
            stale: Some(STALE.into()),
            stalled: Some(HUNG.into()),
            ..restart()
        };
        assert_eq!(next(&f), Next::Act(Trigger::PeerChange(STALE.into())));
    }

    #[test]
    fn a_failure_of_cmd_under_a_current_cluster_first_waits_for_a_peer_change() {
        let failed = Facts {
            exit: Some(1),
            ..restart()
        };
        assert_eq!(next(&failed), Next::Settle);
        // The wait is over and nothing changed: exec ends with CMD's status.
        let settled = Facts {
            settled: true,
            ..failed.clone()
        };
        assert_eq!(next(&settled), Next::End);
        // The change came during the wait: the failure was the peer's.
        let explained = Facts {
            stale: Some(STALE.into()),
            ..settled
        };
        assert_eq!(
            next(&explained),
            Next::Act(Trigger::PeerChange(STALE.into()))
        );
        // Only reporting, or stopped by the kubelet: nothing to wait for.
        let report = Facts {
            on_change: OnPeerChange::Report,
            ..failed.clone()
        };
        assert_eq!(next(&report), Next::End);
        let terminating = Facts {
            terminating: true,
            ..failed
        };
        assert_eq!(next(&terminating), Next::End);
    }

    #[test]
    fn cmd_that_ended_well_or_is_being_stopped_is_not_restarted() {
        let done = Facts {
            exit: Some(0),
            stale: Some(STALE.into()),
            ..restart()
        };
        assert_eq!(next(&done), Next::End);
        let terminating = Facts {
            terminating: true,
            stale: Some(STALE.into()),
            ..restart()
        };
        assert_eq!(next(&terminating), Next::End);
        // A CMD killed by the kubelet's signal failed, and still is not restarted.
        let killed = Facts {
            exit: Some(143),
            ..terminating
        };
        assert_eq!(next(&killed), Next::End);
    }

    #[test]
    fn a_stall_acts_only_on_a_cmd_that_still_runs() {
        let hung = Facts {
            stalled: Some(HUNG.into()),
            ..Facts::default()
        };
        assert_eq!(next(&hung), Next::Act(Trigger::Stall(HUNG.into())));
        let ended = Facts {
            exit: Some(1),
            settled: true,
            ..hung.clone()
        };
        assert_eq!(next(&ended), Next::End);
        let nothing = Facts::default();
        assert_eq!(next(&nothing), Next::End);
    }

    #[test]
    fn the_policy_decides_each_trigger_with_one_budget() {
        let policy = Policy {
            on_change: OnPeerChange::Restart,
            on_stall: OnStall::Exit,
            max_restarts: 2,
            grace: Duration::from_secs(10),
            backoff: Duration::from_secs(10),
            wait: None,
        };
        let change = Trigger::PeerChange(STALE.into());
        assert_eq!(
            on(&policy, 0, &change),
            Decision::Restart {
                n: 1,
                of: 2,
                delay: Duration::from_secs(10)
            }
        );
        assert_eq!(
            on(&policy, 1, &change),
            Decision::Restart {
                n: 2,
                of: 2,
                delay: Duration::from_secs(20)
            }
        );
        assert_eq!(
            on(&policy, 2, &change),
            Decision::Exit {
                why: format!(
                    "the cluster changed again ({STALE}) after 2 restarts (--max-restarts 2); exiting so that the pod is replaced"
                )
            }
        );
        assert_eq!(
            on(&policy, 0, &Trigger::Stall(HUNG.into())),
            Decision::Exit {
                why: format!("{HUNG}; exiting so that the pod is replaced")
            }
        );
        let report = Policy {
            on_change: OnPeerChange::Report,
            on_stall: OnStall::Report,
            ..policy
        };
        assert_eq!(on(&report, 0, &change), Decision::Report);
        assert_eq!(
            on(&report, 0, &Trigger::Stall(HUNG.into())),
            Decision::Report
        );
    }
}
