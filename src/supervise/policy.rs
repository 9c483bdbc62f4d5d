//! The restart policy: what `trainlet exec` is told to do when a peer of the resolved
//! cluster is lost or replaced (`--on-peer-change`) or CMD stalls (`--on-stall`), the
//! restart budget and the backoff. `decide.rs` applies it.
//!
//! The operators restart the whole group when one member fails (JobSet's in-place
//! restart, Volcano's `RestartJob`, the tf-operator's restart policies); trainlet does it
//! from inside each pod: every pod's exec sees the change on its own, stops CMD, waits
//! until the cluster is complete again and starts CMD with the new addresses. The
//! seeds' backoff (10 s, doubling, at most 360 s) keeps a replacement that keeps failing
//! from restarting the whole job in a tight loop, and `--max-restarts` ends it.

use std::time::Duration;

/// What a peer lost or replaced does to CMD (`--on-peer-change`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnPeerChange {
    /// Report the stale cluster (Events, `trainlet.io/cluster`, the metric); CMD runs on.
    #[default]
    Report,
    /// Stop CMD, wait for the cluster, rewrite the files, start CMD again.
    Restart,
    /// Stop CMD and exit 7, so the Job controller replaces the pod and its init
    /// resolves the new cluster.
    Exit,
}

/// What a stall does to CMD (`--on-stall`): no progress for `--stall-after` in this
/// pod, or in a peer's (its published `trainlet.io/progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStall {
    /// Report it (the `Stalled` Event, `trainlet.io/progress`, the metrics).
    #[default]
    Report,
    /// Stop CMD and start it again, in every pod of the job: a hung collective holds
    /// every rank, and all of them must form it again together.
    Restart,
    /// Stop CMD and exit 8, so the Job controller replaces the pod.
    Exit,
}

/// What a failure of CMD does (`--on-failure`): a non-zero exit that is worth a retry
/// (not a permanent code, not a launcher's permanent root cause).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// exec ends with CMD's code (a launcher's retryable exit 1 as 9): the pod fails,
    /// and the Job controller (or its podFailurePolicy) decides.
    #[default]
    Exit,
    /// Start CMD again in place, in every pod of the job: the other ranks are stuck in
    /// (or failing in) their next collective with the rank that failed.
    Restart,
}

/// The restart policy, from exec's flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub on_change: OnPeerChange,
    pub on_stall: OnStall,
    pub on_failure: OnFailure,
    /// Restarts allowed; the next change after the last one ends exec.
    pub max_restarts: u32,
    /// Between SIGTERM and SIGKILL when CMD is stopped.
    pub grace: Duration,
    /// The delay before the first restart; it doubles for each later one.
    pub backoff: Duration,
    /// How long a restart waits for the cluster to be complete again (init's
    /// `--timeout`); `None` waits forever.
    pub wait: Option<Duration>,
}

/// How long exec waits, after CMD failed while the cluster looked current, for a peer
/// change to show: a broken collective usually fails within a second of the peer's
/// death, and the API server's watch tells of the pod about as fast.
pub const SETTLE: Duration = Duration::from_secs(5);

/// How long a failed CMD's restart waits, after it told its peers of the failure, for a
/// peer's failure from before it: the ranks of one breakdown fail one after another
/// (a rank dies, its peers' collectives break), and the launcher of the rank that failed
/// first may exit last, once it has stopped that rank's local siblings. The restart
/// names the failure that came first, in every pod. A peer's failure takes about a
/// second to arrive (its exec, its sidecar, the API server, this pod's sidecar); the
/// wait ends as soon as one that came first does.
pub const EARLIER_FAILURE: Duration = Duration::from_secs(3);

/// The longest delay between two restarts, as the seeds' operator has it.
pub const MAX_BACKOFF: Duration = Duration::from_secs(360);

/// The delay before restart `n` (1-based): `base`, doubled per restart, at most
/// [`MAX_BACKOFF`].
pub fn backoff(base: Duration, n: u32) -> Duration {
    let factor = 2u32.saturating_pow(n.saturating_sub(1));
    base.saturating_mul(factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_backoff_is_the_seeds_ten_seconds_doubling_to_360() {
        let s = |n| backoff(Duration::from_secs(10), n).as_secs();
        assert_eq!(
            [s(1), s(2), s(3), s(4), s(5), s(6), s(7)],
            [10, 20, 40, 80, 160, 320, 360]
        );
        assert_eq!(s(u32::MAX), 360);
    }

    proptest! {
        /// Never shorter than the base (up to the cap), never longer than 360 s, and
        /// never shrinking from one restart to the next.
        #[test]
        fn the_backoff_grows_and_is_bounded(base_ms in 1u64..400_000, n in 1u32..64) {
            let base = Duration::from_millis(base_ms);
            let d = backoff(base, n);
            prop_assert!(d <= MAX_BACKOFF);
            prop_assert!(d >= base.min(MAX_BACKOFF));
            prop_assert!(backoff(base, n + 1) >= d);
        }
    }
}
