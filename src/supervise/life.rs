//! exec's life of CMD as one state and a pure step: what a signal does, and how exec
//! ends. The supervisor (`lifecycle.rs`) is the only one that starts, signals and reaps
//! CMD: the agent's loop hands every signal back to it (`Handback::Signal`), and it
//! carries out the [`Act`] that [`Life::on_signal`] returns. What the policy does about a peer change, a stall or a
//! failure is `decide.rs`'s.

use crate::Code;
use crate::signal;

/// Where exec's life of CMD stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Life {
    /// CMD runs, or is stopped for a restart: `restarts` so far.
    Running { restarts: u32 },
    /// The kubelet's stop signal was forwarded to CMD: CMD's exit ends exec, and
    /// nothing restarts it.
    Terminating,
    /// A stop signal came while nothing was forwarded to CMD (CMD already ended, or it
    /// was being stopped), or the signals ended: exec stops what is left of CMD's tree
    /// and ends with CMD's status.
    Stopped,
    /// exec stops CMD and exits with `code` (`--on-peer-change exit`, `--on-stall
    /// exit`, or past `--max-restarts`): `why` is the termination message. `stopped`:
    /// a stop signal came while CMD was being stopped.
    Exiting {
        why: String,
        code: Code,
        stopped: bool,
    },
    /// A stop signal came while CMD was down, waiting to restart: exec ends with
    /// 128 + the signal, and `why` says so.
    Interrupted { why: String, signal: i32 },
}

/// What the supervisor does to CMD for a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// SIGCHLD: reap CMD (and, as PID 1, the orphans it left).
    Reap,
    /// Pass the signal on to CMD.
    Forward(i32),
    /// Nothing.
    None,
}

impl Default for Life {
    /// The life of a CMD just started.
    fn default() -> Life {
        Life::Running { restarts: 0 }
    }
}

impl Life {
    /// A signal while CMD runs (`None`: the signal stream ended). SIGCHLD reaps; any
    /// other is forwarded to CMD, and one that stops the container means CMD's exit
    /// ends exec.
    pub fn on_signal(self, sig: Option<i32>) -> (Life, Act) {
        match sig {
            Some(signal::SIGCHLD) => (self, Act::Reap),
            Some(s) if signal::STOP.contains(&s) => (self.terminating(), Act::Forward(s)),
            Some(s) => (self, Act::Forward(s)),
            None => (self.stopped(), Act::None),
        }
    }

    /// A signal while CMD has ended and exec waits for a peer change to explain it:
    /// SIGCHLD reaps what is left; a stop signal ends exec; others have no one to go to.
    pub fn on_signal_while_settling(self, sig: Option<i32>) -> (Life, Act) {
        match sig {
            Some(signal::SIGCHLD) => (self, Act::Reap),
            Some(s) if !signal::STOP.contains(&s) => (self, Act::None),
            _ => (self.stopped(), Act::None),
        }
    }

    /// A stop signal came while CMD was being stopped.
    pub fn stopped(self) -> Life {
        match self {
            Life::Exiting { why, code, .. } => Life::Exiting {
                why,
                code,
                stopped: true,
            },
            Life::Interrupted { .. } => self,
            _ => Life::Stopped,
        }
    }

    fn terminating(self) -> Life {
        match self {
            Life::Running { .. } => Life::Terminating,
            other => other,
        }
    }

    /// The policy stops CMD and exits (exit 7 for a peer's change or failure, 8 for a
    /// stall).
    pub fn exit(self, why: String, code: Code) -> Life {
        Life::Exiting {
            why,
            code,
            stopped: false,
        }
    }

    /// A stop signal while CMD was down, waiting to restart after `what`.
    pub fn interrupted(self, signal: i32, program: &str, what: &str) -> Life {
        Life::Interrupted {
            why: format!(
                "stopped by {} while waiting to restart {program} after {what}",
                signal::name(signal)
            ),
            signal,
        }
    }

    /// CMD runs again: restart `n`.
    pub fn restarted(self, n: u32) -> Life {
        match self {
            Life::Running { .. } => Life::Running { restarts: n },
            other => other,
        }
    }

    /// The restarts so far.
    pub fn restarts(&self) -> u32 {
        match self {
            Life::Running { restarts } => *restarts,
            _ => 0,
        }
    }

    /// exec keeps going with CMD: no stop signal, no decision to end.
    pub fn goes_on(&self) -> bool {
        matches!(self, Life::Running { .. })
    }

    /// A stop signal came while nothing was forwarded to CMD: exec ends.
    pub fn is_stopped(&self) -> bool {
        matches!(
            self,
            Life::Stopped | Life::Exiting { stopped: true, .. } | Life::Interrupted { .. }
        )
    }

    pub fn is_terminating(&self) -> bool {
        matches!(self, Life::Terminating)
    }

    /// Whether exec stops what is left of CMD's tree before it ends: the kubelet stops
    /// the container, and nothing of CMD's tree outlives exec.
    pub fn stops_tree(&self) -> bool {
        matches!(
            self,
            Life::Terminating | Life::Stopped | Life::Exiting { stopped: true, .. }
        )
    }

    /// exec's status at its end: 128 + the signal that interrupted a restart, the
    /// policy's exit code, else CMD's own (`cmd_exit`).
    pub fn status(&self, cmd_exit: Option<i32>) -> i32 {
        match self {
            Life::Interrupted { signal, .. } => 128 + signal,
            Life::Exiting { code, .. } => *code as i32,
            _ => cmd_exit.unwrap_or(Code::Internal as i32),
        }
    }

    /// Why exec stopped CMD and exits, if it did.
    pub fn why(self) -> Option<String> {
        match self {
            Life::Exiting { why, .. } | Life::Interrupted { why, .. } => Some(why),
            _ => None,
        }
    }
}

/// How CMD ended under `exec --report`.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// CMD's exit code, or 128+signal; [`Code::PeerChanged`] or [`Code::Stalled`]
    /// when exec stopped it.
    pub code: i32,
    /// The last OOM kill among CMD's processes, if there was one.
    pub oom: Option<String>,
    /// Why exec stopped CMD and exits, if it did.
    pub why: Option<String>,
}

impl Ended {
    /// Why CMD ended, for the termination message; `None` when it succeeded.
    pub fn reason(&self, program: &str) -> Option<String> {
        if let Some(why) = &self.why {
            return Some(why.clone());
        }
        if self.code == 0 {
            return None;
        }
        let how = match self.code {
            c if c > 128 => format!(
                "{program} was killed by signal {} ({})",
                c - 128,
                signal::name(c - 128)
            ),
            c => format!("{program} exited with code {c}"),
        };
        Some(match &self.oom {
            Some(kill) => format!("{how}; {kill}"),
            None => how,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signal::{SIGCHLD, SIGKILL, SIGTERM, SIGUSR1};

    fn running(n: u32) -> Life {
        Life::Running { restarts: n }
    }

    #[test]
    fn sigchld_reaps_and_changes_nothing() {
        assert_eq!(running(2).on_signal(Some(SIGCHLD)), (running(2), Act::Reap));
        assert_eq!(
            Life::Terminating.on_signal(Some(SIGCHLD)),
            (Life::Terminating, Act::Reap)
        );
        assert_eq!(
            running(0).on_signal_while_settling(Some(SIGCHLD)),
            (running(0), Act::Reap)
        );
    }

    #[test]
    fn a_stop_signal_is_forwarded_and_ends_exec_with_cmd() {
        let (life, act) = running(1).on_signal(Some(SIGTERM));
        assert_eq!(
            (life.clone(), act),
            (Life::Terminating, Act::Forward(SIGTERM))
        );
        assert!(life.is_terminating() && life.stops_tree() && !life.goes_on());
        assert!(!life.is_stopped());
        assert_eq!(life.status(Some(143)), 143);
        assert_eq!(life.why(), None);
    }

    #[test]
    fn another_signal_is_forwarded_and_changes_nothing() {
        assert_eq!(
            running(1).on_signal(Some(SIGUSR1)),
            (running(1), Act::Forward(SIGUSR1))
        );
        assert_eq!(
            running(1).on_signal_while_settling(Some(SIGUSR1)),
            (running(1), Act::None)
        );
    }

    #[test]
    fn the_end_of_the_signals_or_a_stop_while_settling_stops_exec() {
        for (life, act) in [
            running(0).on_signal(None),
            running(0).on_signal_while_settling(Some(SIGTERM)),
            running(0).on_signal_while_settling(None),
        ] {
            assert_eq!((life.clone(), act), (Life::Stopped, Act::None));
            assert!(life.is_stopped() && life.stops_tree());
            assert_eq!(life.status(Some(1)), 1);
            assert_eq!(life.status(None), Code::Internal as i32);
        }
    }

    #[test]
    fn the_policy_exits_with_its_code_and_why() {
        let life = running(3).exit(
            "the cluster changed (worker/1 lost)".into(),
            Code::PeerChanged,
        );
        assert!(!life.goes_on() && !life.stops_tree() && !life.is_stopped());
        assert_eq!(life.status(Some(143)), Code::PeerChanged as i32);
        let stopped = life.clone().stopped();
        assert!(stopped.stops_tree() && stopped.is_stopped());
        assert_eq!(stopped.status(None), Code::PeerChanged as i32);
        assert_eq!(
            stopped.why().as_deref(),
            Some("the cluster changed (worker/1 lost)")
        );
    }

    #[test]
    fn a_stop_signal_while_waiting_to_restart_ends_exec_with_it() {
        let life = running(1).interrupted(SIGTERM, "python", "a stall (no progress for 1m)");
        assert_eq!(life.status(Some(0)), 128 + SIGTERM);
        assert!(life.is_stopped() && !life.stops_tree());
        assert_eq!(
            life.clone().stopped(),
            life,
            "a second stop changes nothing"
        );
        assert_eq!(
            life.why().as_deref(),
            Some(
                "stopped by SIGTERM while waiting to restart python after a stall (no progress for 1m)"
            )
        );
    }

    #[test]
    fn a_restart_counts_and_keeps_an_end_that_was_decided() {
        assert_eq!(running(1).restarted(2), running(2));
        assert_eq!(running(2).restarts(), 2);
        assert_eq!(Life::Terminating.restarted(3), Life::Terminating);
        assert_eq!(Life::default(), running(0));
        assert_eq!(Life::Stopped.status(Some(128 + SIGKILL)), 137);
    }

    #[test]
    fn the_termination_reason_names_the_code_the_signal_and_an_oom_kill() {
        let ended = |code, oom: Option<&str>| Ended {
            code,
            oom: oom.map(String::from),
            why: None,
        };
        assert_eq!(ended(0, None).reason("python"), None);
        assert_eq!(
            ended(3, None).reason("python").as_deref(),
            Some("python exited with code 3")
        );
        assert_eq!(
            ended(
                137,
                Some(
                    "process python (pid 812) in container trainer was OOM-killed; memory limit 4Gi"
                )
            )
            .reason("torchrun")
            .as_deref(),
            Some(
                "torchrun was killed by signal 9 (SIGKILL); process python (pid 812) in container trainer was OOM-killed; memory limit 4Gi"
            )
        );
    }
}
