//! exec's stall watch as one value: the heartbeat file, CMD's CPU over the window, the
//! stall rule ([`StallWatch`], [`judge`]: a CMD silent for `--stall-after` is stalled,
//! busy or not; CPU use is reported, never taken for progress), the `Stalled` Event's
//! note, and which peers' stalls a restart already answered. The agent feeds it the clock, CMD's
//! CPU ticks, the peers' progress and the GPUs' utilization; it says what is news.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::observation::ProgressObservation;
use super::peers::{PeerStall, to_act_on};
use super::progress::{Heartbeat, Progress, WatchConfig};
use super::watch::Watch;
use crate::time::to_ms as epoch_ms;

/// What a check found.
#[derive(Debug, Clone, PartialEq)]
pub enum News {
    /// Stall `n` began: the `Stalled` Event's note.
    Stalled { n: u64, note: String },
    /// CMD makes progress again.
    Resumed,
}

/// exec's progress watch.
pub struct Watching {
    pub watch: Arc<Watch>,
    stall: Option<StallWatch>,
    heartbeat: Option<PathBuf>,
    /// The heartbeat file's mtime as last seen: a change is progress.
    beat: Heartbeat,
    /// CMD's CPU time (clock ticks) over time, for the window of a stall.
    cpu: VecDeque<(SystemTime, u64)>,
    /// The last `Stalled` Event's note.
    note: String,
    /// Since when CMD made no progress, in its last stall: still published after the
    /// stall ends, so that a peer whose watch missed the short time a restarted stall
    /// is published as one still restarts once for it.
    last_stall: Option<SystemTime>,
    /// When CMD last started: a peer's stall that ended and began before it is old
    /// news.
    started: SystemTime,
    /// The peers' stalls known when CMD last restarted: the restart answered them.
    acted: Vec<PeerStall>,
    /// This pod tells when the job as a whole makes no progress
    /// ([`crate::stall::progress::judge`]).
    speaks_for_job: bool,
}

impl Watching {
    pub fn new(cfg: &WatchConfig, cluster_file: Option<&Path>, now: SystemTime) -> Watching {
        Watching {
            speaks_for_job: speaks_for_job(cluster_file),
            watch: Watch::new(cfg.pattern.clone()),
            stall: cfg.stall_after.map(|d| StallWatch::new(d, now)),
            heartbeat: cfg.heartbeat.clone(),
            beat: Heartbeat::new(cfg.heartbeat.as_deref().and_then(mtime)),
            cpu: VecDeque::new(),
            note: String::new(),
            last_stall: None,
            started: now,
            acted: Vec::new(),
        }
    }

    /// What exec hands the sidecar, and publishes itself with credentials (the note
    /// whole: the caller bounds it).
    pub fn observation(&self) -> ProgressObservation {
        let p = self.watch.progress();
        let stalled = self.stall.as_ref().is_some_and(StallWatch::stalled);
        ProgressObservation {
            at_ms: p.at.map(epoch_ms),
            step: p.step,
            stalled,
            silent: self.stall.as_ref().is_some_and(StallWatch::silent),
            since_ms: match self.stall.as_ref() {
                Some(s) if s.stalled() => Some(epoch_ms(s.anchor(&p))),
                _ => self.last_stall.map(epoch_ms),
            },
            stalls: self.stall.as_ref().map_or(0, |s| s.stalls),
            after_ms: self.stall.as_ref().map(|s| s.after.as_millis() as u64),
            note: self.note.clone(),
            reported: p.reported,
        }
    }

    /// One sample, every `--interval` and when a stall would begin: the heartbeat
    /// file's mtime and CMD's CPU time (`ticks`); the progress as of now.
    pub fn sample(&mut self, now: SystemTime, ticks: u64, interval: Duration) -> Progress {
        if self.beat.changed(self.heartbeat.as_deref().and_then(mtime)) {
            self.watch.heartbeat(now);
        }
        self.cpu.push_back((now, ticks));
        let keep = self.stall.as_ref().map_or(Duration::ZERO, |s| s.after) + interval * 2;
        while self.cpu.len() > 2
            && self
                .cpu
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t).unwrap_or_default() > keep)
        {
            self.cpu.pop_front();
        }
        self.watch.progress()
    }

    /// Whether the stall rule is to be checked now: there is one (`--stall-after`),
    /// and CMD runs or is stalled (`ended`: CMD has exited, and only an end of a stall
    /// is news).
    pub fn judges(&self, ended: bool) -> bool {
        self.stall.as_ref().is_some_and(|s| !ended || s.stalled())
    }

    /// The stall rule over `progress` and the peers' latest progress; on a new stall,
    /// its note, with CMD's CPU over the window and the GPUs' utilization (`gpus`,
    /// asked only then).
    pub fn check(
        &mut self,
        progress: &Progress,
        peer_progress: Option<SystemTime>,
        now: SystemTime,
        gpus: impl FnOnce() -> Vec<u32>,
    ) -> Option<News> {
        let job = JobView {
            speaks_for_job: self.speaks_for_job,
            peer_progress,
        };
        let stall = self.stall.as_mut()?;
        match stall.check(progress, job, now)? {
            Transition::Stalled { n, kind } => {
                let anchor = stall.anchor(progress);
                let silent = now.duration_since(anchor).unwrap_or_default();
                let cpu = cpu_percent(&self.cpu, anchor);
                let gpus = gpus();
                self.last_stall = Some(anchor);
                self.note = match kind {
                    StallKind::Own => stalled_note(silent, progress, cpu, &gpus),
                    // Nothing of this run to quote: an earlier run's line would mislead.
                    StallKind::Job => format!(
                        "{}; no pod of the job made progress either",
                        stalled_note(silent, &Progress::default(), cpu, &gpus)
                    ),
                };
                Some(News::Stalled {
                    n,
                    note: self.note.clone(),
                })
            }
            Transition::Resumed => Some(News::Resumed),
        }
    }

    /// (stalled, silent); `None` without `--stall-after`, when nothing is ever called
    /// stalled.
    pub fn standing(&self) -> Option<(bool, bool)> {
        self.stall.as_ref().map(|s| (s.stalled(), s.silent()))
    }

    /// When to check besides every `--interval`: the moment a stall would begin
    /// ([`StallWatch::due`]), while it is ahead.
    pub fn due(&self) -> Option<SystemTime> {
        self.stall.as_ref()?.due(&self.watch.progress())
    }

    /// The stall to act on (`--on-stall restart|exit`): this pod's own (`container`
    /// names it, asked only then), the job's, or a peer's that this run of CMD did not
    /// answer yet.
    pub fn to_act_on(
        &self,
        container: impl FnOnce() -> String,
        peers: &[PeerStall],
        own: Option<&str>,
    ) -> Option<String> {
        if let Some(s) = self.stall.as_ref() {
            let after = humantime::format_duration(s.after);
            match s.standing {
                Standing::Stalled(StallKind::Own) => {
                    return Some(format!("{} made no progress for {after}", container()));
                }
                Standing::Stalled(StallKind::Job) => {
                    return Some(format!("no pod of the job made progress for {after}"));
                }
                _ => {}
            }
        }
        to_act_on(peers, own, self.started, &self.acted).map(|s| {
            format!(
                "pod {} made no progress since {}",
                s.pod,
                crate::time::rfc3339_seconds(s.since)
            )
        })
    }

    /// CMD started again at `now`: its silence counts from now, and the peers' stalls
    /// `known` now were answered by this restart.
    pub fn restarted(&mut self, now: SystemTime, known: Vec<PeerStall>) {
        self.started = now;
        self.acted = known;
        // A touch by the CMD that was stopped is no progress of this run.
        self.beat = Heartbeat::new(self.heartbeat.as_deref().and_then(mtime));
        if let Some(s) = self.stall.as_mut() {
            s.restart(now);
        }
    }
}

// ---------------------------------------------------------------------------------
// The stall rule, pure: silence, a stall of this pod or of the job, its note.

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
    /// CMD made progress, then none for `--stall-after`.
    Own,
    /// No pod of the job made any progress for `--stall-after` (this pod speaks for
    /// the job).
    Job,
}

/// Where one run of CMD stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Progress within `--stall-after`.
    Progressing,
    /// No progress since CMD started: published, but never a stall by itself.
    Silent,
    Stalled(StallKind),
}

/// The stall rule. A pod whose CMD made progress and then none for `after` is stalled
/// (the rank that logs and stops). A pod whose CMD has shown no progress since it
/// `started` is silent, which is no stall: the ranks that never print. The job as a
/// whole is stalled when no pod of it made any progress for `after`: the pod that
/// speaks for the job says so once its CMD has run that long and no other pod has
/// published progress since it started (a pod that has is the one to tell its own
/// stall, so one stall is never announced twice).
///
/// `last` is CMD's last progress in this run (none before `started`).
pub fn judge(
    started: SystemTime,
    last: Option<SystemTime>,
    after: Duration,
    job: JobView,
    now: SystemTime,
) -> Standing {
    let since = |t: SystemTime| now.duration_since(t).unwrap_or_default();
    match last.filter(|at| *at > started) {
        Some(at) if since(at) >= after => Standing::Stalled(StallKind::Own),
        Some(_) => Standing::Progressing,
        None if job.speaks_for_job
            && job.peer_progress.is_none_or(|p| p <= started)
            && since(started) >= after =>
        {
            Standing::Stalled(StallKind::Job)
        }
        None => Standing::Silent,
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
}

impl StallWatch {
    pub fn new(after: Duration, now: SystemTime) -> StallWatch {
        StallWatch {
            after,
            since: now,
            standing: Standing::Silent,
            stalls: 0,
            judged: None,
        }
    }

    pub fn stalled(&self) -> bool {
        matches!(self.standing, Standing::Stalled(_))
    }

    /// No progress in this run yet (a job stall is silent too).
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
    /// none yet.
    pub fn anchor(&self, progress: &Progress) -> SystemTime {
        progress
            .at
            .filter(|at| *at > self.since)
            .unwrap_or(self.since)
    }

    /// When a check could first find this run stalled if nothing happens before: its
    /// last progress (or its start) plus `after`; none while it is stalled already,
    /// nor when a check at or after that moment found no stall (a rank only silent).
    /// exec checks then too, not only every `--interval`: a stall is seen when it
    /// begins, not up to an interval later. The moment may be past already, and is
    /// then due at once: progress that CMD printed just before the last check, seen
    /// only after it, moves the moment, and exec may get to it late.
    pub fn due(&self, progress: &Progress) -> Option<SystemTime> {
        if self.stalled() {
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
        self.standing = judge(self.since, progress.at, self.after, job, now);
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

/// The `Stalled` Event's text: how long, the last progress, and what CMD did
/// meanwhile: its CPU use over the window, and the GPUs' utilization where NVML sees
/// them. What was seen, not a guess at why.
pub fn stalled_note(
    silent: Duration,
    progress: &Progress,
    cpu_percent: Option<f64>,
    gpu_percent: &[u32],
) -> String {
    let mut note = format!("no progress for {}", for_people(silent));
    match (progress.step, progress.line.is_empty()) {
        (Some(step), false) if progress.stepped => {
            note.push_str(&format!("; last step {step} in {:?}", progress.line));
        }
        (Some(step), false) => {
            note.push_str(&format!(
                "; last step {step}; last output {:?}",
                progress.line
            ));
        }
        (None, false) => note.push_str(&format!("; last output {:?}", progress.line)),
        (_, true) => note.push_str("; no progress output yet"),
    }
    if let Some(cpu) = cpu_percent {
        note.push_str(&format!("; CMD used {cpu:.0}% of a core over the window"));
    }
    if !gpu_percent.is_empty() {
        let each: Vec<String> = gpu_percent.iter().map(|p| format!("{p}%")).collect();
        note.push_str(&format!("; GPU utilization {}", each.join(" ")));
    }
    note
}

/// A duration as the notes say it: whole seconds (`5s`, `10m 3s`), or milliseconds
/// under a second (`800ms`), never `0s` for a silence that was there.
pub fn for_people(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// The heartbeat file's mtime, if it can be read.
fn mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Whether this pod speaks for the job's silence: it runs rank 0 of the resolved
/// cluster, or there is no cluster of several pods it knows of (exec alone).
fn speaks_for_job(cluster_file: Option<&Path>) -> bool {
    match cluster_file.map(crate::render::read_cluster_file) {
        Some(Ok(c)) => c.rank == Some(0) || (c.ranks.len() <= 1 && c.peers.len() <= 1),
        _ => true,
    }
}

/// CPU use of CMD's tree over the window, in percent of a core, from the samples.
fn cpu_percent(samples: &VecDeque<(SystemTime, u64)>, from: SystemTime) -> Option<f64> {
    let (t1, c1) = *samples.back()?;
    let (t0, c0) = *samples
        .iter()
        .rev()
        .find(|(t, _)| *t <= from)
        .or(samples.front())?;
    let secs = t1.duration_since(t0).ok()?.as_secs_f64();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (secs > 0.0).then(|| c1.saturating_sub(c0) as f64 / hz / secs * 100.0)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn cpu_use_over_the_window() {
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        let samples: VecDeque<(SystemTime, u64)> = [(t(0), 0), (t(5), 500), (t(10), 1000)]
            .into_iter()
            .collect();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as f64;
        let got = cpu_percent(&samples, t(5)).unwrap();
        assert!((got - 500.0 / hz / 5.0 * 100.0).abs() < 1e-9, "{got}");
        assert_eq!(cpu_percent(&VecDeque::new(), t(0)), None);
    }

    /// One run of CMD: a heartbeat, then silence past `--stall-after` is stall 1 with
    /// its note (CPU over the window, the GPUs'); the stall is CMD's own to act on;
    /// after a restart, the peers' stalls known then are answered, a new one is not.
    #[test]
    fn a_run_stalls_once_and_a_restart_answers_the_peers_stalls_it_knew() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let cfg = WatchConfig {
            stall_after: Some(Duration::from_secs(5)),
            pattern: super::super::progress::Pattern::default(),
            heartbeat: None,
        };
        let mut w = Watching::new(&cfg, None, t0);
        let interval = Duration::from_secs(1);
        w.watch.heartbeat(at(1));
        let p = w.sample(at(1), 100, interval);
        assert!(w.judges(false));
        assert_eq!(w.check(&p, None, at(1), Vec::new), None);
        assert_eq!(w.due(), Some(at(6)));
        // Two CPU samples 5 s apart, 250 ticks: 50 ticks a second.
        let p = w.sample(at(6), 350, interval);
        let news = w.check(&p, None, at(6), || vec![0, 97]);
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as f64;
        let cpu = 250.0 / hz / 5.0 * 100.0;
        let note = format!(
            "no progress for 5s; no progress output yet; CMD used {cpu:.0}% of a core over the window; GPU utilization 0% 97%"
        );
        assert_eq!(
            news,
            Some(News::Stalled {
                n: 1,
                note: note.clone()
            })
        );
        assert_eq!(w.standing(), Some((true, false)));
        assert_eq!(
            w.to_act_on(|| "trainer".into(), &[], Some("w-0"))
                .as_deref(),
            Some("trainer made no progress for 5s")
        );
        let o = w.observation();
        assert_eq!((o.stalled, o.stalls, o.note), (true, 1, note));
        // CMD ended while stalled: still judged, for the end of the stall.
        assert!(w.judges(true));

        let peer = |pod: &str, since: u64| PeerStall {
            pod: pod.into(),
            since: at(since),
            ongoing: true,
        };
        w.restarted(at(7), vec![peer("w-1", 2)]);
        // The new run has shown nothing yet: silent, not stalled.
        assert_eq!(w.standing(), Some((false, true)));
        assert!(!w.judges(true), "ended, not stalled: nothing to judge");
        assert_eq!(
            w.to_act_on(|| unreachable!(), &[peer("w-1", 2)], Some("w-0")),
            None
        );
        assert_eq!(
            w.to_act_on(
                || unreachable!(),
                &[peer("w-1", 2), peer("w-2", 8)],
                Some("w-0")
            )
            .as_deref(),
            Some("pod w-2 made no progress since 2027-01-15T08:00:08Z")
        );
    }
}
