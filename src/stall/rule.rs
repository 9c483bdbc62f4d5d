//! The stall rule, pure: whether one run of CMD is progressing, silent or stalled, of
//! this pod or of the job ([`judge`], by [`Scope`]), and what changed at each check
//! ([`StallWatch`]). exec's watch (`Watching`) feeds it the clock, CMD's
//! progress and what the other pods published.

use std::time::{Duration, SystemTime};

use super::progress::{Progress, Scope};

/// A change of the stall state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// A stall ([`judge`]): the `n`th since exec started.
    Stalled { n: u64, kind: StallKind },
    /// Progress again after a stall (this pod's, or another pod's after a job stall).
    Resumed,
}

/// What the job shows beyond this pod, for [`judge`]: in DDP, torchrun, DeepSpeed and
/// Accelerate scripts only global rank 0 logs, and MPI workers run `sshd -D`, so a pod
/// that never prints says nothing by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobView {
    /// Whose silence is a stall.
    pub scope: Scope,
    /// This pod speaks for the job's silence: it runs rank 0, or it knows of no other
    /// pod (exec alone, a job of one). One pod, so that a job that is silent as a
    /// whole is one stall, not one per pod.
    pub speaks_for_job: bool,
    /// The latest progress another pod of the job has published, where exec sees its
    /// peers (its own watch, or the sidecar's `peers.json`).
    pub peer_progress: Option<SystemTime>,
}

/// Which rule found a stall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallKind {
    /// CMD made progress, then none for `--stall-after` (and, in [`Scope::Job`], no
    /// other pod made any since).
    Own,
    /// No pod of the job made any progress for `--stall-after`, this one none in this
    /// run or less lately than another (this pod speaks for the job).
    Job,
}

/// Where one run of CMD stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Progress within `--stall-after`.
    Progressing,
    /// No progress since CMD started, or (in [`Scope::Job`]) none within
    /// `--stall-after` while the job makes progress or another pod speaks for it:
    /// published, but never a stall by itself.
    Silent,
    Stalled(StallKind),
}

/// The stall rule. `last` is CMD's last progress in this run (none before `started`),
/// `job` what the other pods show.
///
/// - [`Scope::Job`]: the job is stalled when no pod of it made progress for `after`
///   since this run `started`; the pod that speaks for the job says so (its own stall
///   when its progress was the job's last, else the job's). Every other pod is at most
///   silent: a rank quiet while another progresses waits in no hung collective, and a
///   hung job is told once, by one pod.
/// - [`Scope::Async`]: the job's rule, and a pod whose CMD `signalled` progress (a
///   heartbeat, a matching line, a report) and then made none for `after` is stalled
///   too, whatever the other pods do: the worker of an asynchronous job that hangs
///   alone. A pod that only printed (parameter servers, TensorFlow 2's workers, after
///   TensorFlow's start-up lines) is at most silent.
/// - [`Scope::Pod`]: a pod whose CMD made progress and then none for `after` is stalled
///   (the worker that hangs alone). One that has shown none since it `started` is
///   silent, no stall: the ranks that never print. The job as a whole is stalled when
///   no pod of it made any progress for `after`: the pod that speaks for the job says
///   so once its CMD has run that long and no other pod has published progress since
///   it started (a pod that has is the one to tell its own stall).
pub fn judge(
    started: SystemTime,
    last: Option<SystemTime>,
    after: Duration,
    job: JobView,
    now: SystemTime,
) -> Standing {
    judge_signalled(started, (last, None), after, job, now)
}

/// [`judge`], with the last progress `signalled` on purpose besides the `last` of any
/// kind: ([`Progress::at`], [`Progress::signalled`]).
pub fn judge_signalled(
    started: SystemTime,
    (last, signalled): (Option<SystemTime>, Option<SystemTime>),
    after: Duration,
    job: JobView,
    now: SystemTime,
) -> Standing {
    let since = |t: SystemTime| now.duration_since(t).unwrap_or_default();
    let own = last.filter(|at| *at > started);
    let peer = job.peer_progress.filter(|at| *at > started);
    if own.is_some_and(|at| since(at) < after) {
        return Standing::Progressing;
    }
    if job.scope == Scope::Async && signalled.is_some_and(|at| at > started) {
        return Standing::Stalled(StallKind::Own);
    }
    match (job.scope, own) {
        (Scope::Pod, Some(_)) => Standing::Stalled(StallKind::Own),
        (Scope::Pod, None) if job.speaks_for_job && peer.is_none() && since(started) >= after => {
            Standing::Stalled(StallKind::Job)
        }
        (Scope::Pod, None) => Standing::Silent,
        (Scope::Job | Scope::Async, _) => {
            let latest = own.max(peer).unwrap_or(started);
            if !job.speaks_for_job || since(latest) < after {
                Standing::Silent
            } else if own.is_some_and(|at| peer.is_none_or(|p| p <= at)) {
                Standing::Stalled(StallKind::Own)
            } else {
                Standing::Stalled(StallKind::Job)
            }
        }
    }
}

/// The stall state of one run of CMD.
#[derive(Debug, Clone, PartialEq)]
pub struct StallWatch {
    pub after: Duration,
    /// When the watch (re)started: progress before it is no progress of this run.
    pub since: SystemTime,
    pub standing: Standing,
    /// Stalls since exec started, over every run of CMD.
    pub stalls: u64,
    /// The last moment checked: a moment a stall would begin that is no later was
    /// judged already, and is not due again.
    pub judged: Option<SystemTime>,
    /// What the job showed at the last check: the other pods' progress is part of the
    /// job's silence, and a pod that does not speak for the job never stalls in
    /// [`Scope::Job`].
    pub job: Option<JobView>,
}

impl StallWatch {
    pub fn new(after: Duration, now: SystemTime) -> StallWatch {
        StallWatch {
            after,
            since: now,
            standing: Standing::Silent,
            stalls: 0,
            judged: None,
            job: None,
        }
    }

    pub fn stalled(&self) -> bool {
        matches!(self.standing, Standing::Stalled(_))
    }

    /// No progress of its own within `--stall-after` that makes it progressing: none
    /// in this run yet, or (in [`Scope::Job`]) none lately while the job goes on. A job
    /// stall is silent too.
    pub fn silent(&self) -> bool {
        matches!(
            self.standing,
            Standing::Silent | Standing::Stalled(StallKind::Job)
        )
    }

    /// CMD started again: its silence counts from now.
    pub fn restart(&mut self, now: SystemTime) {
        self.since = now;
        self.standing = Standing::Silent;
    }

    /// Since when CMD made no progress: the last progress, or the start when there was
    /// none yet; in [`Scope::Job`], since when the job made none (another pod's later
    /// progress, as the last check saw it).
    pub fn anchor(&self, progress: &Progress) -> SystemTime {
        let peer = self
            .job
            .filter(|j| {
                j.scope == Scope::Job || (j.scope == Scope::Async && progress.signalled.is_none())
            })
            .and_then(|j| j.peer_progress);
        progress
            .at
            .max(peer)
            .filter(|at| *at > self.since)
            .unwrap_or(self.since)
    }

    /// When a check could first find this run stalled if nothing happens before: its
    /// last progress (or its start) plus `after`; none while it is stalled already,
    /// nor when a check at or after that moment found no stall (a rank only silent).
    /// exec checks then too, not only every `--interval`: a stall is seen when it
    /// begins, not up to an interval later. The moment may be past already, and is
    /// then due at once: progress that CMD printed just before the last check, seen
    /// only after it, moves the moment, and exec may get to it late. None either in
    /// [`Scope::Job`] for a pod that does not speak for the job: it never stalls.
    pub fn due(&self, progress: &Progress) -> Option<SystemTime> {
        let mute = self.job.is_some_and(|j| {
            !j.speaks_for_job
                && (j.scope == Scope::Job
                    || (j.scope == Scope::Async && progress.signalled.is_none()))
        });
        if self.stalled() || mute {
            return None;
        }
        self.anchor(progress)
            .checked_add(self.after)
            .filter(|due| self.judged.is_none_or(|j| *due > j))
    }

    /// What changed at `now`.
    pub fn check(
        &mut self,
        progress: &Progress,
        job: JobView,
        now: SystemTime,
    ) -> Option<Transition> {
        let was = self.stalled();
        self.judged = Some(now);
        self.job = Some(job);
        let own = (progress.at, progress.signalled);
        self.standing = judge_signalled(self.since, own, self.after, job, now);
        match (was, self.standing) {
            (false, Standing::Stalled(kind)) => {
                self.stalls = self.stalls.saturating_add(1);
                Some(Transition::Stalled {
                    n: self.stalls,
                    kind,
                })
            }
            (true, Standing::Progressing | Standing::Silent) => Some(Transition::Resumed),
            _ => None,
        }
    }
}
