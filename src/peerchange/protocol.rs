//! The exchange between exec, which hands over and has no credentials, and the sidecar,
//! which watches the peers, as typed phases with a pure step per side. Both sides
//! exchange *state* in files (`exec.json`, `peers.json`), so each step reads what the
//! other side last wrote, and either side may restart at any time.
//!
//! A restart after a peer change, from both sides:
//! 1. the sidecar's watch sees a task lost or replaced: it writes `stale: …` to
//!    `peers.json` ([`Relay::told`]: exec's next restart is one it asked for);
//! 2. exec sees it, stops CMD, announces restart `n` in its observation, and waits
//!    ([`Waiting`]) with the generation of `peers.json` it saw ([`ExecWait`]);
//! 3. once every task has a live pod again, the sidecar moves init's files to the
//!    replacements ([`Relay::to_answer`], then the I/O, then [`Relay::answered`]) and
//!    writes `current` with a higher generation;
//! 4. exec sees that generation ([`ExecWait::over`]) and starts CMD from the moved
//!    files; the sidecar announces the restart only if it asked for it
//!    ([`Relay::explains_restart`]).

use crate::cluster::drift::Moved;

/// exec's wait for the files, as the sidecar reads it from exec's observation: which
/// run of exec (its epoch) and which restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub epoch: String,
    pub restart: u32,
}

/// The sidecar's answer to a wait: the moves to make (none where every task is where it
/// was, e.g. a peer that came back at its address), then a higher generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub waiting: Waiting,
    pub moves: Vec<Moved>,
}

/// The sidecar's side.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Relay {
    /// Raised each time the sidecar has answered a wait; `peers.json` carries it.
    pub generation: u64,
    /// The wait last answered: each is answered once.
    answered: Option<Waiting>,
    /// It told exec of a stale cluster, or of a peer's stall, since the last restart
    /// exec announced.
    allowed: bool,
}

impl Relay {
    /// Going on from the generation a sidecar before this one left in `peers.json`.
    pub fn new(generation: u64) -> Relay {
        Relay {
            generation,
            ..Relay::default()
        }
    }

    /// The answer to exec's wait, if there is one to give now: exec waits, the wait was
    /// not answered yet, and every task has a live pod (`moves` is `None` while a task
    /// is lost).
    pub fn to_answer(&self, waiting: Option<Waiting>, moves: Option<Vec<Moved>>) -> Option<Answer> {
        let waiting = waiting.filter(|w| self.answered.as_ref() != Some(w))?;
        Some(Answer {
            waiting,
            moves: moves?,
        })
    }

    /// The answer's moves are made: the next `peers.json` says so with a higher
    /// generation.
    pub fn answered(&mut self, answer: Answer) {
        self.generation += 1;
        self.answered = Some(answer.waiting);
    }

    /// What `peers.json` now tells exec: `stale` when a stale cluster was written,
    /// `stalled_peers` when it lists peers' stalls. Either may make exec restart.
    pub fn told(&mut self, stale: bool, stalled_peers: bool) {
        self.allowed |= stale || stalled_peers;
    }

    /// exec announced a restart: whether it is one the sidecar asked for (once per
    /// telling), or explained by exec's own stall (`own_stall`). A restart neither
    /// explains is not announced: the training container cannot make the sidecar
    /// publish restarts at will.
    pub fn explains_restart(&mut self, own_stall: bool) -> bool {
        std::mem::take(&mut self.allowed) || own_stall
    }
}

/// exec's side: a wait for the moved files, from the generation of `peers.json` exec
/// saw when it stopped CMD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecWait {
    pub before: u64,
}

impl ExecWait {
    /// The files were moved for this wait: a higher generation, and the cluster current.
    pub fn over(&self, generation: u64, current: bool) -> bool {
        generation > self.before && current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::drift::Move;

    fn wait(epoch: &str, restart: u32) -> Option<Waiting> {
        Some(Waiting {
            epoch: epoch.into(),
            restart,
        })
    }

    fn moved() -> Vec<Moved> {
        vec![Moved {
            task: "worker/1".into(),
            host: Move {
                from: "10.0.0.7".into(),
                to: "10.0.0.19".into(),
            },
            pod: "w-1-bbbb".into(),
            uid: "uid-1b".into(),
        }]
    }

    #[test]
    fn no_answer_while_exec_does_not_wait_or_a_task_is_lost() {
        let relay = Relay::new(3);
        assert_eq!(relay.to_answer(None, Some(moved())), None);
        assert_eq!(relay.to_answer(wait("12-1", 1), None), None);
    }

    #[test]
    fn a_wait_is_answered_once_with_the_moves_and_a_higher_generation() {
        let mut relay = Relay::new(3);
        let answer = relay.to_answer(wait("12-1", 1), Some(moved())).unwrap();
        assert_eq!(answer.moves, moved());
        relay.answered(answer);
        assert_eq!(relay.generation, 4);
        // The same wait, read again from exec's observation: answered already.
        assert_eq!(relay.to_answer(wait("12-1", 1), Some(moved())), None);
        // A move that failed is not answered: the generation stays.
        let failed = Relay::new(3);
        let _ = failed.to_answer(wait("12-1", 1), Some(moved())).unwrap();
        assert_eq!(failed.generation, 3);
        assert!(failed.to_answer(wait("12-1", 1), Some(moved())).is_some());
    }

    #[test]
    fn the_next_restart_or_a_new_exec_is_a_new_wait() {
        let mut relay = Relay::new(0);
        relay.answered(relay.to_answer(wait("12-1", 1), Some(moved())).unwrap());
        // Nothing to move (the peer came back where it was): still answered.
        let again = relay.to_answer(wait("12-1", 2), Some(Vec::new())).unwrap();
        assert_eq!(again.moves, Vec::new());
        relay.answered(again);
        assert_eq!(relay.generation, 2);
        // exec itself restarted (a new epoch) and waits for its restart 2.
        assert!(relay.to_answer(wait("40-7", 2), Some(Vec::new())).is_some());
    }

    #[test]
    fn a_restart_is_announced_only_once_per_telling_or_for_exec_s_own_stall() {
        let mut relay = Relay::new(0);
        assert!(!relay.explains_restart(false), "told nothing yet");
        relay.told(true, false);
        assert!(relay.explains_restart(false));
        assert!(!relay.explains_restart(false), "one telling, one restart");
        relay.told(false, true);
        assert!(relay.explains_restart(false), "a peer's stall");
        relay.told(false, false);
        assert!(!relay.explains_restart(false));
        assert!(relay.explains_restart(true), "exec's own stall");
    }

    #[test]
    fn exec_waits_for_a_higher_generation_that_says_current() {
        let w = ExecWait { before: 4 };
        assert!(!w.over(4, true), "the file exec saw when it stopped CMD");
        assert!(!w.over(5, false), "moved, but stale again");
        assert!(w.over(5, true));
        assert!(!ExecWait { before: 0 }.over(0, false), "no peers.json yet");
    }
}
