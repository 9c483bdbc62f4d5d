//! exec's progress watch as one value: the heartbeat file, CMD's CPU over the window,
//! the stall rule ([`super::progress::StallWatch`]), the `Stalled` Event's note, and
//! which peers' stalls a restart already answered. The agent feeds it the clock, CMD's
//! CPU ticks, the peers' progress and the GPUs' utilization; it says what is news.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::observation::ProgressObservation;
use super::peers::{PeerStall, to_act_on};
use super::progress::{
    Heartbeat, JobView, Progress, StallKind, StallWatch, Standing, Transition, WatchConfig,
    stalled_note,
};
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
}
