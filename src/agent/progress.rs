//! The reporter's side of the progress watch ([`crate::stall::progress`]).
//!
//! exec: every `--interval` it looks at the heartbeat file and CMD's CPU time, checks
//! for a stall, and on one writes the `Stalled` Event's note (what CMD did over the
//! window: CPU, GPU utilization) and counts it; it acts on a stall (its own, or a
//! peer's from the peer watch or `peers.json`) through the lifecycle. The sidecar
//! publishes what exec handed over. Either publishes `trainlet.io/progress` and the
//! progress metrics.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{info, warn};

use super::{Engine, Mode};
use crate::handover::observation::{MAX_TEXT, ProgressObservation};
use crate::metrics::ContainerLabel;
use crate::stall::peers::{PeerStall, annotation, to_act_on};
use crate::stall::progress::{
    Heartbeat, JobView, Progress, StallKind, StallWatch, Standing, Transition, WatchConfig,
    stalled_note,
};
use crate::supervise::output::Watch;
use crate::supervise::policy::OnStall;
use crate::time::to_ms as epoch_ms;

/// exec's progress watch.
pub(super) struct Watching {
    pub watch: Arc<Watch>,
    pub stall: Option<StallWatch>,
    heartbeat: Option<PathBuf>,
    /// The heartbeat file's mtime as last seen: a change is progress.
    beat: Heartbeat,
    /// CMD's CPU time (clock ticks) over time, for the window of a stall.
    cpu: VecDeque<(SystemTime, u64)>,
    /// The last `Stalled` Event's note.
    pub note: String,
    /// Since when CMD made no progress, in its last stall: still published after the
    /// stall ends, so that a peer whose watch missed the short time a restarted stall
    /// is published as one still restarts once for it.
    last_stall: Option<SystemTime>,
    /// When CMD last started: a peer's stall that ended and began before it is old
    /// news.
    pub started: SystemTime,
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

    /// What exec hands the sidecar, and publishes itself with credentials.
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
            note: crate::publish::truncate(&self.note, MAX_TEXT),
        }
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

impl Engine {
    /// exec, every `--interval`: the heartbeat, a CPU sample, and the stall check.
    /// `ended`: CMD has exited, and only an end of a stall is news.
    pub(super) fn check_progress(&mut self, ended: bool) {
        let now = SystemTime::now();
        let ticks: u64 = self.probes.oom.tree.values().map(|p| p.cpu_ticks).sum();
        let Some(w) = self.progress.watching.as_mut() else {
            return;
        };
        if w.beat.changed(w.heartbeat.as_deref().and_then(mtime)) {
            w.watch.heartbeat(now);
        }
        w.cpu.push_back((now, ticks));
        let keep = w.stall.as_ref().map_or(Duration::ZERO, |s| s.after) + self.cfg.interval * 2;
        while w.cpu.len() > 2
            && w.cpu
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t).unwrap_or_default() > keep)
        {
            w.cpu.pop_front();
        }
        let progress = w.watch.progress();
        let speaks_for_job = w.speaks_for_job;
        let Some(stall) = w.stall.as_ref() else {
            self.set_progress_metrics(&progress, None);
            return;
        };
        if ended && !stall.stalled() {
            let silent = stall.silent();
            self.set_progress_metrics(&progress, Some((false, silent)));
            return;
        }
        let job = JobView {
            speaks_for_job,
            peer_progress: self.peer_progress(),
        };
        let w = self.progress.watching.as_mut().expect("checked above");
        let stall = w.stall.as_mut().expect("checked above");
        match stall.check(&progress, job, now) {
            Some(Transition::Stalled { n, kind }) => {
                let anchor = stall.anchor(&progress);
                let silent = now.duration_since(anchor).unwrap_or_default();
                let cpu = cpu_percent(&w.cpu, anchor);
                let gpus = self.probes.gpus.utilization();
                let w = self.progress.watching.as_mut().expect("checked above");
                w.last_stall = Some(anchor);
                w.note = match kind {
                    StallKind::Own => stalled_note(silent, &progress, cpu, &gpus),
                    // Nothing of this run to quote: an earlier run's line would mislead.
                    StallKind::Job => format!(
                        "{}; no pod of the job made progress either",
                        stalled_note(silent, &Progress::default(), cpu, &gpus)
                    ),
                };
                warn!(stall = n, "{}", w.note);
                let note = w.note.clone();
                self.metrics.progress.stalls.inc();
                if self.outgoing.is_none() {
                    self.outbox.push(("Stalled", note), true);
                }
            }
            Some(Transition::Resumed) => info!("{} makes progress again", self.container_name()),
            None => {}
        }
        let standing = self
            .progress
            .watching
            .as_ref()
            .and_then(|w| w.stall.as_ref())
            .map(|s| (s.stalled(), s.silent()));
        self.set_progress_metrics(&progress, standing);
    }

    /// exec: when to check for a stall besides every `--interval`: the moment one would
    /// begin ([`crate::stall::progress::StallWatch::due`]), while it is ahead (a
    /// moment passed without a stall, a rank only silent, waits for the probes).
    pub(super) fn stall_check_at(&self) -> Option<std::time::Instant> {
        if self.cfg.mode != Mode::Exec {
            return None;
        }
        let w = self.progress.watching.as_ref()?;
        let due = w.stall.as_ref()?.due(&w.watch.progress())?;
        let left = due.duration_since(SystemTime::now()).ok()?;
        // A millisecond past it, so that the check's own clock reads it as passed.
        Some(std::time::Instant::now() + left + Duration::from_millis(1))
    }

    /// `standing` (stalled, silent): `None` without `--stall-after`, when nothing is
    /// ever called stalled and `trainlet_stalled` and `trainlet_silent` have no series.
    pub(super) fn set_progress_metrics(&self, p: &Progress, standing: Option<(bool, bool)>) {
        let label = ContainerLabel {
            container: self.container_name(),
        };
        if let Some((stalled, silent)) = standing {
            self.metrics
                .progress
                .stalled
                .get_or_create(&label)
                .set(i64::from(stalled));
            self.metrics
                .progress
                .silent
                .get_or_create(&label)
                .set(i64::from(silent));
        }
        if let Some(at) = p.at {
            let secs = at
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.metrics
                .progress
                .last_progress
                .get_or_create(&label)
                .set(secs);
        }
        if let Some(step) = p.step {
            self.metrics
                .progress
                .progress_step
                .get_or_create(&label)
                .set(step);
        }
    }

    /// exec with `--on-stall restart|exit`: the stall to act on, while CMD runs: its
    /// own, or a peer's ([`crate::stall::peers::to_act_on`]).
    pub(super) fn act_on_stall(&self) -> Option<String> {
        if self.cfg.mode != Mode::Exec || self.cfg.restart.on_stall == OnStall::Report {
            return None;
        }
        let w = self.progress.watching.as_ref()?;
        if let Some(s) = w.stall.as_ref() {
            let after = humantime::format_duration(s.after);
            match s.standing {
                Standing::Stalled(StallKind::Own) => {
                    return Some(format!(
                        "{} made no progress for {after}",
                        self.container_name()
                    ));
                }
                Standing::Stalled(StallKind::Job) => {
                    return Some(format!("no pod of the job made progress for {after}"));
                }
                _ => {}
            }
        }
        let peers = self.peer_stalls();
        let own = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref());
        to_act_on(&peers, own, w.started, &w.acted).map(|s| {
            format!(
                "pod {} made no progress since {}",
                s.pod,
                crate::time::rfc3339_seconds(s.since)
            )
        })
    }

    /// The latest progress another pod of the job published, where exec sees its
    /// peers: from `peers.json` handing over, else from its own peer watch.
    fn peer_progress(&self) -> Option<SystemTime> {
        let own = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref());
        self.cluster_view()?.peer_progress(own)
    }

    /// The peers' stalls exec knows of: from `peers.json` handing over, else from its
    /// own peer watch.
    fn peer_stalls(&self) -> Vec<PeerStall> {
        self.cluster_view().map(|v| v.stalled()).unwrap_or_default()
    }

    /// `trainlet.io/progress` as of now, for the annotations: exec's own progress
    /// where it publishes, else (the sidecar) what exec handed over, whose metrics it
    /// serves too.
    pub(super) fn progress_annotation(&mut self) -> Option<String> {
        let o = match (&self.progress.watching, &self.inbox) {
            (Some(w), _) if self.outgoing.is_none() => w.observation(),
            (_, Some(inbox)) => {
                let o = inbox.fresh(SystemTime::now())?.progress.clone()?;
                let p = Progress {
                    at: o.at_ms.map(crate::time::from_ms),
                    step: o.step,
                    ..Progress::default()
                };
                self.set_progress_metrics(&p, o.after_ms.map(|_| (o.stalled, o.silent)));
                o
            }
            _ => return None,
        };
        let after = o.after_ms.map(Duration::from_millis);
        let own = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref());
        let relayed = self
            .peers
            .as_ref()
            .map(|p| p.to_relay(own))
            .unwrap_or_default();
        let a = annotation(&o, self.progress.published.as_ref(), after, &relayed);
        let text = serde_json::to_string(&a).expect("plain data");
        self.progress.published = Some(a);
        Some(text)
    }

    /// CMD started again: its silence counts from now, and the peers' stalls known now
    /// were answered by this restart. Called before the peer watch is made anew.
    pub(super) fn progress_restarted(&mut self) {
        let now = SystemTime::now();
        let known = self.peer_stalls();
        if let Some(w) = self.progress.watching.as_mut() {
            w.started = now;
            w.acted = known;
            // A touch by the CMD that was stopped is no progress of this run.
            w.beat = Heartbeat::new(w.heartbeat.as_deref().and_then(mtime));
            if let Some(s) = w.stall.as_mut() {
                s.restart(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
}
