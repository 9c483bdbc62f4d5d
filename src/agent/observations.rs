//! What the agent tells, whichever its role. Every Event (an OOM kill, a stall, a
//! restart, an XID) goes out through [`Engine::record`] and the outbox's recorder.
//! Handing over, exec tells through the observation handover
//! ([`crate::handover::observation`]) instead: `exec --observations` writes what it
//! observes instead of publishing it; the sidecar reads it, records what is new through
//! the same `record`, and merges it into the one report of the pod.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::Engine;
use crate::event::Event;
use crate::handover::observation::{
    self as handover, GpuObservation, KillObservation, Observation, Published, VERSION, Version,
    XidCountObservation,
};
use crate::metrics::{ContainerLabel, ReasonLabel, XidLabel};
use crate::publish::keys;
use crate::reason::Reason;
use crate::report::document::ExecMark;
use crate::report::previous::Previous;
use crate::report::probe::gpu::xid::XidError;
use crate::report::probe::oom::OomKill;
use crate::report::probe::ports::PortEntry;

/// At most this many `GPUXidError` Events for one XID from one version: a counter
/// that jumps by thousands is counted in full, not announced thousands of times.
const XID_EVENTS_PER_VERSION: u64 = 8;

// ---------------------------------------------------------------------------------
// What the agent tells, whichever role: every Event goes out through `record`; exec
// handing over leaves it to the sidecar, which records what exec handed over (below)
// through the same `record`.

impl Engine {
    pub(super) fn announce_kill(&mut self, kill: &OomKill, urgent: bool) {
        self.log_news(&kill.message());
        self.metrics
            .oom_kills
            .get_or_create(&ContainerLabel {
                container: kill.container.clone(),
            })
            .inc();
        self.record(Event::warning(Reason::OomKill, kill.message()), urgent);
    }

    /// Every Event of the agent, whichever role sends it and whatever it tells of, goes
    /// out through here and the outbox's recorder ([`crate::report::recorder`]): its
    /// counter, then the queue. exec handing over leaves the Event to the sidecar,
    /// which records what exec handed over through this same path.
    pub(super) fn record(&mut self, event: Event, urgent: bool) {
        match event.reason {
            Reason::Stalled => {
                self.metrics.progress.stalls.inc();
            }
            Reason::Restarting => {
                self.metrics.restarts.inc();
            }
            _ => {}
        }
        if !self.role.hands_over() {
            self.outbox.record(event, urgent);
        }
    }

    /// A warning about news (an OOM kill, an XID), at most 20 at once and then one per
    /// 3 s: in the shipped layout the news comes from the training container, which
    /// must not be able to fill the sidecar's log. What is not logged is counted, and
    /// said with the next line that is.
    pub(super) fn log_news(&mut self, line: &str) {
        if !self.news.log.take(Instant::now()) {
            self.news.unlogged += 1;
            return;
        }
        match std::mem::take(&mut self.news.unlogged) {
            0 => warn!("{line}"),
            n => warn!("{line} ({n} lines like this one were not logged before it)"),
        }
    }
}

/// exec's end: where it writes, and which run of exec it is.
pub(super) struct Outgoing {
    pub dir: PathBuf,
    pub epoch: String,
    failed: bool,
    /// exec's restarts, for the sidecar to announce and answer.
    pub restart: Option<crate::handover::observation::RestartObservation>,
}

impl Outgoing {
    pub fn new(dir: PathBuf, started: SystemTime) -> Outgoing {
        let ms = crate::time::to_ms(started);
        Outgoing {
            dir,
            epoch: format!("{}-{ms}", std::process::id()),
            failed: false,
            restart: None,
        }
    }
}

/// The sidecar's end.
pub(super) struct Inbox {
    pub dir: PathBuf,
    watch: Option<crate::watch::FileWatch>,
    /// The last version accepted.
    pub last: Option<Version>,
    published: Published,
    /// Kills published before the sidecar restarted: recorded again, silently, from
    /// the first version of the same epoch.
    seed_kills: Option<(String, u64)>,
    /// The last rejection logged, so a bad file is logged once, not every interval.
    rejected: Option<String>,
    /// exec's run of CMD as last read (started, down, the failure's time): a change is
    /// what the peers' restart barrier waits for, and goes out at once.
    group: (Option<u64>, bool, Option<u64>),
}

impl Inbox {
    pub fn new(dir: PathBuf) -> Inbox {
        Inbox {
            dir,
            watch: None,
            last: None,
            published: Published::default(),
            seed_kills: None,
            rejected: None,
            group: (None, false, None),
        }
    }

    /// The latest observation while it is current: CMD's last one, or one no older
    /// than three of exec's intervals (exec rewrites it every interval).
    pub fn fresh(&self, now: SystemTime) -> Option<&Observation> {
        let v = self.last.as_ref()?;
        let o = &v.observation;
        let limit = Duration::from_millis(o.interval_ms) * 3 + Duration::from_secs(2);
        let age = now.duration_since(v.written).unwrap_or_default();
        (o.exited.is_some() || age <= limit).then_some(o)
    }

    /// Why the sidecar cannot tell the training container's GPU count.
    pub fn why_unknown(&self, own_nvml: &str, now: SystemTime) -> String {
        match &self.last {
            None => format!(
                "no observations from trainlet exec in {} yet, and this sidecar has no GPU of its own (NVML: {own_nvml})",
                self.dir.display()
            ),
            Some(v) => format!(
                "trainlet exec's last observation is {}s old (it rewrites it every {}s): the training container's trainlet exec is gone",
                now.duration_since(v.written).unwrap_or_default().as_secs(),
                v.observation.interval_ms / 1000
            ),
        }
    }
}

impl Engine {
    /// exec: everything it observed, as of now.
    pub(super) fn observation(&self, exited: Option<i32>) -> Option<Observation> {
        let out = self.role.outgoing()?;
        let ledger = &self.probes.oom.ledger;
        let first = ledger.total + 1 - ledger.kills.len() as u64;
        Some(Observation {
            version: VERSION,
            epoch: out.epoch.clone(),
            interval_ms: self.cfg.probes.interval.as_millis() as u64,
            exited,
            gpu: GpuObservation {
                unavailable: self.probes.gpus.info.nvml.clone().err(),
                driver: self.probes.gpus.info.driver.clone(),
                devices: self.probes.gpus.info.devices.clone(),
                seen: self.probes.gpus.seen,
                lost: self.probes.gpus.lost.clone(),
                faulty: self.probes.gpus.info.faulty.clone(),
                xid_watch: self.probes.gpus.watch.clone(),
            },
            xids: self
                .probes
                .gpus
                .xids
                .counts
                .iter()
                .map(|(e, n)| XidCountObservation {
                    error: e.clone(),
                    count: *n,
                })
                .collect(),
            ports: self
                .probes
                .listeners
                .states
                .iter()
                .map(|(p, s)| PortEntry {
                    port: *p,
                    state: s.clone(),
                })
                .collect(),
            kills: ledger
                .kills
                .iter()
                .enumerate()
                .map(|(i, k)| KillObservation::from_kill(first + i as u64, k))
                .collect(),
            errors: self.probe_errors(),
            restart: out.restart.clone(),
            progress: self.own_progress(),
        })
    }

    /// exec: writes the current observation for the sidecar.
    pub(super) fn hand_over(&mut self, exited: Option<i32>) {
        let Some(o) = self.observation(exited) else {
            return;
        };
        let out = self.role.outgoing_mut().expect("observation() checked it");
        match handover::write(&out.dir, &o) {
            Ok(()) => out.failed = false,
            Err(e) if !out.failed => {
                warn!("the sidecar cannot see this container's observations: {e}");
                out.failed = true;
            }
            Err(_) => {}
        }
    }

    /// Sidecar: starts from what the pod already carries, so that a restarted sidecar
    /// announces nothing twice (see [`super::state::State::seed`]).
    pub(super) fn seed_from(&mut self, pod: &Pod) {
        let Some(prev) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::REPORT))
            .and_then(|r| Previous::parse(r))
        else {
            return;
        };
        self.state.seed(&prev);
        if self.probes.gpus.xids.counts.is_empty() {
            for x in &prev.gpu.xid_errors {
                self.probes.gpus.xids.add(x.error.clone(), x.count);
                self.metrics
                    .gpu_xid_errors
                    .get_or_create(&xid_label(&x.error, self.probes.gpus.xids.kept(&x.error)))
                    .inc_by(x.count);
            }
        }
        if let (Some(inbox), Some(mark)) = (self.role.inbox_mut(), prev.exec) {
            inbox.published = Published {
                epoch: mark.epoch.clone(),
                kills: mark.kills,
                xids: prev
                    .gpu
                    .xid_errors
                    .iter()
                    .map(|x| (x.error.clone(), x.count))
                    .collect(),
                restarts: mark.restarts,
                stalls: prev_stalls(pod),
            };
            info!(
                epoch = %mark.epoch,
                kills = mark.kills,
                "resuming from the report on the pod: what it announced is not announced again"
            );
            inbox.seed_kills = Some((mark.epoch, mark.kills));
        }
    }

    /// Sidecar: reads the observation file; announces what a new version adds.
    /// Returns whether anything changed.
    pub(super) fn read_observations(&mut self) -> bool {
        let Some(o) = self.new_observation() else {
            return false;
        };
        let container = self.container_name();
        let now = SystemTime::now();
        self.seed_kills(&o, &container, now);
        let inbox = self
            .role
            .inbox_mut()
            .expect("a new observation comes from the inbox");
        let news = handover::news(&mut inbox.published, &o);
        let group = o.progress.as_ref().map_or((None, false, None), |p| {
            (p.started_ms, p.down, p.failed.as_ref().map(|f| f.since_ms))
        });
        let group_changed = std::mem::replace(&mut inbox.group, group) != group;
        // The current run of CMD failed (exec hands the failure over before the restart).
        let own_failure = matches!(group, (Some(started), _, Some(since)) if since >= started);
        // News from the training container may hurry a patch only so often.
        let urgent = (!news.kills.is_empty()
            || !news.xids.is_empty()
            || news.restart.is_some()
            || news.stall.is_some()
            || group_changed)
            && self.news.urgency.take(std::time::Instant::now());
        // The run's state is the restart barrier's (`--on-failure restart`): the peers
        // wait on this pod's `down` and `started`, not on the patch interval.
        if group_changed && urgent {
            self.outbox.hurry();
        }
        let stalled = o.progress.as_ref().is_some_and(|p| p.stalled);
        if let Some(note) = &news.stall {
            self.log_news(note);
            self.record(Event::warning(Reason::Stalled, note.clone()), urgent);
        }
        for k in &news.kills {
            let kill = k.to_kill(&container);
            self.probes.oom.ledger.record_cgroup(kill.clone(), now);
            self.announce_kill(&kill, urgent);
        }
        self.announce_xids(news.xids, urgent);
        if let Some(note) = news.restart {
            // Its own stall is exec's to see: a restart of a stalled CMD is explained.
            // So is its own failure (--on-failure restart), which it hands over first.
            let own_stall = stalled || news.stall.is_some() || own_failure;
            self.announce_restart(note, own_stall, urgent);
        }
        true
    }

    /// Sidecar: the observation file's version when it is new; a rejected one is
    /// counted and logged once, and the last good one stays.
    fn new_observation(&mut self) -> Option<Observation> {
        let inbox = self.role.inbox_mut()?;
        let version = match handover::read(&inbox.dir) {
            Ok(None) => return None,
            Ok(Some(v)) => v,
            Err(rejected) => {
                self.metrics
                    .observations_rejected
                    .get_or_create(&ReasonLabel {
                        reason: rejected.reason().into(),
                    })
                    .inc();
                let why = rejected.to_string();
                if inbox.rejected.as_ref() != Some(&why) {
                    warn!(
                        "rejected an observation from the training container: {why}; keeping the last good one"
                    );
                    inbox.rejected = Some(why);
                }
                return None;
            }
        };
        inbox.rejected = None;
        if inbox
            .last
            .as_ref()
            .is_some_and(|l| l.observation == version.observation)
        {
            inbox.last = Some(version);
            return None;
        }
        self.metrics.observations.inc();
        let o = version.observation.clone();
        if inbox.last.is_none() {
            info!(epoch = %o.epoch, dir = %inbox.dir.display(), "reading trainlet exec's observations");
        }
        inbox.last = Some(version);
        Some(o)
    }

    /// Sidecar, on the first observation after its own restart: the kills its last
    /// report counted, from the observation of the same run of exec, or carried over
    /// where exec started again since.
    fn seed_kills(&mut self, o: &Observation, container: &str, now: SystemTime) {
        let Some((epoch, upto)) = self.role.inbox_mut().and_then(|i| i.seed_kills.take()) else {
            return;
        };
        if epoch == o.epoch {
            for k in o.kills.iter().filter(|k| k.seq <= upto) {
                self.probes
                    .oom
                    .ledger
                    .record_cgroup(k.to_kill(container), now);
            }
        } else {
            // exec started again since that report (its container was restarted, or
            // the whole pod: Kubernetes' RestartAllContainers), with observations of
            // its own: the kills the report counted are in no file any more.
            self.probes.oom.ledger.carry(container, upto);
        }
    }

    /// Sidecar: XID errors exec saw, counted, each announced (at most
    /// [`XID_EVENTS_PER_VERSION`] Events per version).
    fn announce_xids(&mut self, xids: Vec<(XidError, u64)>, urgent: bool) {
        for (e, n) in xids {
            self.log_news(&format!("{} ({n} new)", e.message()));
            self.probes.gpus.xids.add(e.clone(), n);
            self.metrics
                .gpu_xid_errors
                .get_or_create(&xid_label(&e, self.probes.gpus.xids.kept(&e)))
                .inc_by(n);
            for _ in 0..n.min(XID_EVENTS_PER_VERSION) {
                self.record(Event::warning(Reason::GpuXidError, e.message()), urgent);
            }
        }
    }

    /// Sidecar: a restart of CMD that exec reports. exec restarts CMD only on the
    /// sidecar's word that the cluster changed, so a restart the sidecar never asked
    /// for is not counted ([`crate::peerchange::protocol::Relay::explains_restart`]),
    /// unless it was exec's own (`own_stall`: its stall or its failure).
    fn announce_restart(&mut self, note: String, own_stall: bool, urgent: bool) {
        let explained = match self.role.peers_out_mut() {
            Some(o) => o.relay.explains_restart(own_stall),
            None => own_stall,
        };
        if explained {
            self.log_news(&note);
            self.record(Event::warning(Reason::Restarting, note), urgent);
        } else {
            self.metrics
                .observations_rejected
                .get_or_create(&ReasonLabel {
                    reason: "restart-unexplained".into(),
                })
                .inc();
            warn!(
                "trainlet exec reports a restart of its command, but this sidecar told it of no peer change since the last one; not announced"
            );
        }
    }

    /// Sidecar: what the report says about the observations it publishes.
    pub(super) fn exec_mark(&self) -> Option<ExecMark> {
        let inbox = self.role.inbox()?;
        inbox.last.as_ref()?;
        Some(ExecMark {
            epoch: inbox.published.epoch.clone(),
            kills: inbox.published.kills,
            restarts: inbox.published.restarts,
        })
    }

    /// Sidecar: watches the directory, so a new version is read at once.
    pub(super) fn watch_observations(&mut self) {
        if let Some(inbox) = self.role.inbox_mut() {
            inbox.watch = crate::watch::entry_or_poll(&inbox.dir, handover::FILE);
        }
    }
}

/// The series of one XID: its own while the ledger keeps the pair, else `other`.
pub(super) fn xid_label(e: &crate::report::probe::gpu::xid::XidError, kept: bool) -> XidLabel {
    if !kept {
        return XidLabel {
            gpu: "other".into(),
            uuid: "other".into(),
            xid: "other".into(),
        };
    }
    XidLabel {
        gpu: e.gpu.to_string(),
        uuid: e.uuid.clone(),
        xid: e.xid.to_string(),
    }
}

/// The next new version in the directory, or never without a watch.
pub(super) async fn next_version(inbox: &mut Option<&mut Inbox>) -> Option<()> {
    match inbox.as_mut() {
        Some(i) => crate::watch::woken(&mut i.watch).await,
        None => std::future::pending().await,
    }
}

/// The stalls the pod's `trainlet.io/progress` already announced, for a restarted
/// sidecar: none is announced twice.
fn prev_stalls(pod: &Pod) -> u64 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::PROGRESS))
        .and_then(|t| serde_json::from_str::<crate::stall::peers::Annotation>(t).ok())
        .map_or(0, |a| a.stalls)
}
