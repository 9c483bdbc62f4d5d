//! The supervisor's decisions, without I/O: when the agent's loop hands CMD back, what
//! made exec act on it ([`next`]), and what the policy does about it ([`on`]). The
//! restart loop (`lifecycle.rs`) only carries them out, so each transition of the
//! life of CMD has a unit test here.

use std::time::{Duration, SystemTime};

use super::policy::{OnFailure, OnPeerChange, OnStall, Policy, backoff};
use crate::flags;

/// What made exec act on CMD.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// A peer was lost or replaced: the `trainlet.io/cluster` text.
    PeerChange(String),
    /// No progress in this pod, or in a peer's: whose, and for how long.
    Stall(String),
    /// A failure worth a retry (`--on-failure restart`): this pod's CMD's (`own`), or a
    /// peer's that came while this CMD ran.
    Failure { failed: Failed, own: bool },
}

/// A failure that asks every rank to restart: whose and how (the pod, its task and
/// rank, the code or signal, the root cause), and when CMD ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    pub why: String,
    pub since: SystemTime,
}

/// Where the reporter stands when its loop returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Standing {
    /// A stop signal came while nothing was forwarded to CMD: exec ends.
    pub stopped: bool,
    /// The kubelet's stop signal was forwarded to CMD: no peer change restarts it.
    pub terminating: bool,
    /// The stale cluster the policy acts on, while it is stale.
    pub stale: Option<String>,
    /// A stall the policy acts on (`--on-stall restart|exit`): this pod's, or a peer's
    /// that began before CMD last started here.
    pub stalled: Option<String>,
    /// A peer's failure the policy acts on (`--on-failure restart`), that came after
    /// CMD last started here.
    pub failed: Option<Failed>,
}

/// What the supervisor knows when the agent's loop returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// Where the reporter stands.
    pub standing: Standing,
    /// CMD's exit status; `None` while it runs.
    pub exit: Option<i32>,
    /// `--on-peer-change`.
    pub on_change: OnPeerChange,
    /// The wait for a peer change to explain a failure ([`Next::Settle`]) is over.
    pub settled: bool,
    /// CMD's own failure, where `--on-failure restart` retries it: it acts at once,
    /// without the wait for a peer change.
    pub own_failure: Option<Failed>,
}

/// What the supervisor does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// exec ends with CMD as it is.
    End,
    /// CMD failed while the cluster looked current: wait up to [`super::policy::SETTLE`] for
    /// the peer change that explains it (a broken collective fails before the watch
    /// sees the pod go), then decide again.
    Settle,
    /// Act on this, as the policy says ([`on`]).
    Act(Trigger),
}

/// After CMD exited or the agent's loop returned: the peer change or stall the policy
/// acts on, a wait for one, or the end.
pub fn next(f: &Facts) -> Next {
    let s = &f.standing;
    if s.stopped {
        return Next::End;
    }
    let failed = f.exit.is_some_and(|code| code != 0);
    if failed
        && f.own_failure.is_none()
        && !f.settled
        && !s.terminating
        && s.stale.is_none()
        && s.stalled.is_none()
        && f.on_change != OnPeerChange::Report
    {
        return Next::Settle;
    }
    let trigger = match (&s.stale, f.exit) {
        (Some(stale), _) => Trigger::PeerChange(stale.clone()),
        // CMD ended: its own failure restarts it, and so does the stall it failed in:
        // while the pods read their ranks' stacks before the group restart, a peer that
        // restarts first breaks the collective, and CMD fails of it.
        (None, Some(_)) => match (&f.own_failure, &s.stalled) {
            (Some(own), _) if failed => Trigger::Failure {
                failed: own.clone(),
                own: true,
            },
            (None, Some(why)) if failed => Trigger::Stall(why.clone()),
            _ => return Next::End,
        },
        // A peer's failure or a stall restarts a CMD that still runs (stuck with them).
        (None, None) => match (&s.failed, &s.stalled) {
            (Some(peer), _) => Trigger::Failure {
                failed: peer.clone(),
                own: false,
            },
            (None, Some(why)) => Trigger::Stall(why.clone()),
            (None, None) => return Next::End,
        },
    };
    // The kubelet stops the container, or CMD ended well (the job's work is done,
    // whatever its peers do now): nothing restarts it.
    if s.terminating || f.exit == Some(0) {
        return Next::End;
    }
    Next::Act(trigger)
}

/// What the policy does about `trigger`, after `done` restarts.
pub fn on(policy: &Policy, done: u32, trigger: &Trigger) -> Decision {
    match trigger {
        Trigger::PeerChange(stale) => decide(policy, done, stale),
        Trigger::Stall(why) => decide_stall(policy, done, why),
        Trigger::Failure { failed, own } => decide_failure(policy, done, &failed.why, *own),
    }
}

/// What to do about a peer change or a stall.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Only report it.
    Report,
    /// Restart CMD: this is restart `n` of `of`, after `delay`.
    Restart { n: u32, of: u32, delay: Duration },
    /// Stop CMD and exit: `why` is the termination message.
    Exit { why: String },
    /// Leave CMD as it is, and the trigger answered: a peer's failure past
    /// `--max-restarts` (that peer's pod fails; its replacement is a peer change).
    Pass { why: String },
}

/// The decision on a stale cluster (`stale` is the `trainlet.io/cluster` text), after
/// `done` restarts.
pub fn decide(policy: &Policy, done: u32, stale: &str) -> Decision {
    let action = match policy.on_change {
        OnPeerChange::Report => OnStall::Report,
        OnPeerChange::Restart => OnStall::Restart,
        OnPeerChange::Exit => OnStall::Exit,
    };
    decide_on(
        action,
        policy,
        done,
        &format!("the cluster changed ({stale})"),
        &format!("the cluster changed again ({stale})"),
    )
}

/// The decision on a stall (`why` says whose and for how long), after `done`
/// restarts: the same budget and backoff as peer changes.
pub fn decide_stall(policy: &Policy, done: u32, why: &str) -> Decision {
    decide_on(policy.on_stall, policy, done, why, &format!("{why},"))
}

/// The decision on a failure worth a retry (`why` says whose and how), after `done`
/// restarts: the same budget and backoff. Past the budget, this pod's own failure
/// ends exec with CMD's code, as without `--on-failure restart` (the exit code and the
/// podFailurePolicy decide); a peer's leaves this CMD to its fate.
pub fn decide_failure(policy: &Policy, done: u32, why: &str, own: bool) -> Decision {
    let past = format!(
        "{why}, after {done} restarts (--{} {})",
        flags::MAX_RESTARTS,
        policy.max_restarts
    );
    match policy.on_failure {
        OnFailure::Exit => Decision::Report,
        OnFailure::Restart if done >= policy.max_restarts && own => Decision::Report,
        OnFailure::Restart if done >= policy.max_restarts => Decision::Pass {
            why: format!("{past}: no restart here; that pod fails and is replaced"),
        },
        OnFailure::Restart => Decision::Restart {
            n: done + 1,
            of: policy.max_restarts,
            delay: backoff(policy.backoff, done + 1),
        },
    }
}

/// What both decisions share: `why` for an exit at once, `again` before the count of
/// restarts for an exit past `--max-restarts`.
fn decide_on(action: OnStall, policy: &Policy, done: u32, why: &str, again: &str) -> Decision {
    match action {
        OnStall::Report => Decision::Report,
        OnStall::Exit => Decision::Exit {
            why: format!("{why}; exiting so that the pod is replaced"),
        },
        OnStall::Restart if done >= policy.max_restarts => Decision::Exit {
            why: format!(
                "{again} after {done} restarts (--{} {}); exiting so that the pod is replaced",
                flags::MAX_RESTARTS,
                policy.max_restarts
            ),
        },
        OnStall::Restart => Decision::Restart {
            n: done + 1,
            of: policy.max_restarts,
            delay: backoff(policy.backoff, done + 1),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(on_change: OnPeerChange, max: u32) -> Policy {
        Policy {
            on_change,
            on_stall: OnStall::Report,
            on_failure: OnFailure::Exit,
            max_restarts: max,
            grace: Duration::from_secs(30),
            backoff: Duration::from_secs(10),
            wait: None,
        }
    }

    const STALE: &str = "stale: worker/1 10.0.0.7 → 10.0.0.19";
    const HUNG: &str = "trainer made no progress for 5m";

    fn restart() -> Facts {
        Facts {
            on_change: OnPeerChange::Restart,
            ..Facts::default()
        }
    }

    fn standing(stale: Option<&str>, stalled: Option<&str>) -> Standing {
        Standing {
            stale: stale.map(String::from),
            stalled: stalled.map(String::from),
            ..Standing::default()
        }
    }

    #[test]
    fn a_stop_signal_ends_whatever_else_holds() {
        let f = Facts {
            standing: Standing {
                stopped: true,
                ..standing(Some(STALE), Some(HUNG))
            },
            exit: Some(1),
            ..restart()
        };
        assert_eq!(next(&f), Next::End);
    }

    #[test]
    fn a_stale_cluster_while_cmd_runs_is_a_peer_change() {
        let f = Facts {
            standing: standing(Some(STALE), Some(HUNG)),
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
            standing: standing(Some(STALE), None),
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
            standing: Standing {
                terminating: true,
                ..Standing::default()
            },
            ..failed
        };
        assert_eq!(next(&terminating), Next::End);
    }

    #[test]
    fn cmd_that_ended_well_or_is_being_stopped_is_not_restarted() {
        let done = Facts {
            standing: standing(Some(STALE), None),
            exit: Some(0),
            ..restart()
        };
        assert_eq!(next(&done), Next::End);
        let terminating = Facts {
            standing: Standing {
                terminating: true,
                ..standing(Some(STALE), None)
            },
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
    fn a_stall_acts_on_a_cmd_that_runs_or_failed_in_it() {
        let hung = Facts {
            standing: standing(None, Some(HUNG)),
            ..Facts::default()
        };
        assert_eq!(next(&hung), Next::Act(Trigger::Stall(HUNG.into())));
        // Failed in the stall (a peer restarted first): restarted for it, with no wait
        // for a peer change, which the stall already explains.
        let failed = Facts {
            exit: Some(1),
            ..hung.clone()
        };
        assert_eq!(next(&failed), Next::Act(Trigger::Stall(HUNG.into())));
        // Ended well: the job's work is done.
        let done = Facts {
            exit: Some(0),
            ..hung.clone()
        };
        assert_eq!(next(&done), Next::End);
        let nothing = Facts::default();
        assert_eq!(next(&nothing), Next::End);
    }

    /// `on` hands each trigger to its decision, with the one restart budget (the
    /// decisions themselves are tested below).
    #[test]
    fn the_policy_decides_each_trigger_with_one_budget() {
        let p = Policy {
            on_stall: OnStall::Exit,
            ..policy(OnPeerChange::Restart, 2)
        };
        for done in 0..3 {
            assert_eq!(
                on(&p, done, &Trigger::PeerChange(STALE.into())),
                decide(&p, done, STALE)
            );
            assert_eq!(
                on(&p, done, &Trigger::Stall(HUNG.into())),
                decide_stall(&p, done, HUNG)
            );
        }
        assert_eq!(
            on(&p, 2, &Trigger::PeerChange(STALE.into())),
            Decision::Exit {
                why: format!(
                    "the cluster changed again ({STALE}) after 2 restarts (--max-restarts 2); exiting so that the pod is replaced"
                )
            }
        );
        assert_eq!(
            on(&p, 0, &Trigger::Stall(HUNG.into())),
            Decision::Exit {
                why: format!("{HUNG}; exiting so that the pod is replaced")
            }
        );
    }

    const BOOM: &str = "pod w-1 (worker/1, rank 1): torchrun exited with code 1";

    fn boom() -> Failed {
        Failed {
            why: BOOM.into(),
            since: std::time::UNIX_EPOCH + Duration::from_secs(100),
        }
    }

    /// CMD's own failure worth a retry acts at once, with no wait for a peer change;
    /// a peer's restarts a CMD that still runs; a stale cluster comes first.
    #[test]
    fn a_failure_restarts_at_once_and_a_peers_only_a_running_cmd() {
        let own = Facts {
            exit: Some(1),
            own_failure: Some(boom()),
            ..restart()
        };
        let failure = |own| {
            Next::Act(Trigger::Failure {
                failed: boom(),
                own,
            })
        };
        assert_eq!(next(&own), failure(true));
        let peer = Facts {
            standing: Standing {
                failed: Some(boom()),
                ..standing(None, Some(HUNG))
            },
            ..restart()
        };
        assert_eq!(next(&peer), failure(false));
        // CMD ended by itself and its failure is not retried: exec ends.
        let ended = Facts {
            standing: Standing {
                failed: Some(boom()),
                ..Standing::default()
            },
            exit: Some(1),
            settled: true,
            ..peer.clone()
        };
        assert_eq!(next(&ended), Next::End);
        let stale = Facts {
            standing: standing(Some(STALE), None),
            ..own.clone()
        };
        assert_eq!(next(&stale), Next::Act(Trigger::PeerChange(STALE.into())));
        let terminating = Facts {
            standing: Standing {
                terminating: true,
                ..Standing::default()
            },
            ..own
        };
        assert_eq!(next(&terminating), Next::End);
    }

    #[test]
    fn a_failure_shares_the_budget_and_past_it_ends_as_without_the_flag() {
        let p = Policy {
            on_failure: OnFailure::Restart,
            ..policy(OnPeerChange::Report, 2)
        };
        assert_eq!(
            decide_failure(&p, 1, BOOM, true),
            Decision::Restart {
                n: 2,
                of: 2,
                delay: Duration::from_secs(20)
            }
        );
        assert_eq!(decide_failure(&p, 2, BOOM, true), Decision::Report);
        assert_eq!(
            decide_failure(&p, 2, BOOM, false),
            Decision::Pass {
                why: format!(
                    "{BOOM}, after 2 restarts (--max-restarts 2): no restart here; that pod fails and is replaced"
                )
            }
        );
        assert_eq!(
            decide_failure(&policy(OnPeerChange::Restart, 3), 0, BOOM, true),
            Decision::Report
        );
    }

    #[test]
    fn restarts_are_counted_then_exec_exits() {
        let p = policy(OnPeerChange::Restart, 2);
        let stale = "stale: worker/1 10.0.0.7 → 10.0.0.19";
        assert_eq!(
            decide(&p, 0, stale),
            Decision::Restart {
                n: 1,
                of: 2,
                delay: Duration::from_secs(10)
            }
        );
        assert_eq!(
            decide(&p, 1, stale),
            Decision::Restart {
                n: 2,
                of: 2,
                delay: Duration::from_secs(20)
            }
        );
        assert_eq!(
            decide(&p, 2, stale),
            Decision::Exit {
                why: "the cluster changed again (stale: worker/1 10.0.0.7 → 10.0.0.19) after 2 restarts (--max-restarts 2); exiting so that the pod is replaced".into()
            }
        );
        assert_eq!(
            decide(&policy(OnPeerChange::Report, 3), 0, stale),
            Decision::Report
        );
        assert_eq!(
            decide(&policy(OnPeerChange::Exit, 3), 0, stale),
            Decision::Exit {
                why: "the cluster changed (stale: worker/1 10.0.0.7 → 10.0.0.19); exiting so that the pod is replaced".into()
            }
        );
        assert!(matches!(
            decide(&policy(OnPeerChange::Restart, 0), 0, stale),
            Decision::Exit { .. }
        ));
    }

    #[test]
    fn a_stall_shares_the_restart_budget_and_backoff() {
        let p = Policy {
            on_stall: OnStall::Restart,
            ..policy(OnPeerChange::Report, 2)
        };
        let why = "no progress for 5s";
        assert_eq!(
            decide_stall(&p, 1, why),
            Decision::Restart {
                n: 2,
                of: 2,
                delay: Duration::from_secs(20)
            }
        );
        assert_eq!(
            decide_stall(&p, 2, why),
            Decision::Exit {
                why: "no progress for 5s, after 2 restarts (--max-restarts 2); exiting so that the pod is replaced".into()
            }
        );
        let exit = Policy {
            on_stall: OnStall::Exit,
            ..p.clone()
        };
        assert_eq!(
            decide_stall(&exit, 0, why),
            Decision::Exit {
                why: "no progress for 5s; exiting so that the pod is replaced".into()
            }
        );
        assert_eq!(
            decide_stall(&policy(OnPeerChange::Restart, 3), 0, why),
            Decision::Report
        );
    }
}
