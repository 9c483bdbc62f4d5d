//! exec's stall watch as one value: the heartbeat file, CMD's CPU over the window, the
//! stall rule ([`super::rule`]: a silence of `--stall-after` is a stall, busy or not;
//! CPU use is reported, never taken for progress) with its scope and who speaks for
//! the job, both from `cluster.json`, the `Stalled` Event's note, and which peers'
//! stalls a restart already answered. The agent feeds it the clock, CMD's CPU ticks,
//! the peers' progress and the GPUs' utilization; it says what is news.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::observation::ProgressObservation;
use super::peers::{PeerStall, to_act_on};
use super::progress::{Heartbeat, Progress, Scope, WatchConfig};
pub use super::rule::{JobView, StallKind, StallWatch, Standing, Transition, judge};
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
    /// ([`super::rule::judge`]).
    speaks_for_job: bool,
    /// Whose silence is a stall: `--stall-scope`, or what the cluster says.
    scope: Scope,
}

impl Watching {
    pub fn new(cfg: &WatchConfig, cluster_file: Option<&Path>, now: SystemTime) -> Watching {
        let cluster = cluster_file.map(crate::render::read_cluster_file);
        let cluster = cluster.as_ref().and_then(|c| c.as_ref().ok());
        Watching {
            speaks_for_job: speaks_for_job(cluster),
            scope: cfg.scope.unwrap_or_else(|| {
                let types: Vec<&str> = cluster
                    .map(|c| c.cluster.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                Scope::of(&types)
            }),
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

    /// Adds where CMD's ranks are (their stacks, captured at the stall) to the last
    /// `Stalled` Event's note; returns the note.
    pub fn note_where(&mut self, at: &str) -> String {
        self.note = format!("{}; where: {at}", self.note);
        self.note.clone()
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
            // The group restart's run is the agent's to add.
            ..ProgressObservation::default()
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
            scope: self.scope,
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
                    // Only this run's line to quote: an earlier run's would mislead.
                    StallKind::Job => {
                        let own = match progress.at {
                            Some(at) if at > stall.since => progress,
                            _ => &Progress::default(),
                        };
                        format!(
                            "{}; no pod of the job made progress either",
                            stalled_note(silent, own, cpu, &gpus)
                        )
                    }
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
    /// answer yet; never a peer's in [`Scope::Async`], whose pods wait for no other:
    /// the chief and the other workers train on while a hung worker restarts.
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
        if self.scope == Scope::Async {
            return None;
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
fn speaks_for_job(cluster: Option<&crate::render::ClusterFile>) -> bool {
    match cluster {
        Some(c) => c.rank == Some(0) || (c.ranks.len() <= 1 && c.peers.len() <= 1),
        None => true,
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
            scope: None,
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
