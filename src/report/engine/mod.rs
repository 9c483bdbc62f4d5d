//! The reporter loop shared by `trainlet sidecar` and `trainlet exec --report`.
//!
//! One task on a single-threaded runtime waits on everything at once:
//! - the own pod, through a watch (kube-runtime's watcher, with its backoff): the
//!   training container's GPU limit, ports, start time and OOMKilled restarts;
//! - the probe interval: NVML and `/proc/net/tcp{,6}` ([`listeners`]);
//! - OOM notifications (eventfd or inotify), or a fast poll where there are none
//!   ([`oom_watch`]);
//! - NVML events (XID errors, a lost GPU) from a thread that blocks on NVML's event
//!   API ([`crate::report::gpu_events`]);
//! - the outbox's next write ([`outbox`]) and signals;
//! - in exec mode, CMD's exit (SIGCHLD, [`child`]); [`exec`] runs CMD and restarts it
//!   after a peer change.
//!
//! After each of these the observations go through the pure [`state`], which returns
//! the report, the annotations and the Events to publish. At rest a sidecar wakes once
//! per `--interval`, reads two small files and, on GPU nodes, asks NVML three
//! questions; the pod watch is an idle connection; nothing is written to the API
//! server until something changes.

mod budget;
pub mod child;
mod config;
mod exec;
mod handover;
mod link;
pub mod listeners;
pub mod oom_watch;
pub mod outbox;
mod peer_watch;
mod peers_file;
pub mod state;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Container;
use tracing::{info, warn};

use crate::metrics::{self, ContainerLabel, GpuLabel, Metrics, MetricsError, PortLabel, Readiness};
use crate::report::gpu::{GpuInfo, GpuProbe, GpuStatus};
use crate::report::gpu_events::{self, GpuEvent};
use crate::report::oom::{self, OomKill};
use crate::report::pod::{self, PodView};
use crate::report::restart::OnPeerChange;
use crate::report::xid::XidLedger;
use crate::signal::{self, Signals};
use child::Child;
pub use config::{Config, Mode, ReportError};
pub use exec::{Ended, Respawn, exec};
use link::{Link, next_pod};
use listeners::Listeners;
use oom_watch::OomWatch;
use outbox::Outbox;
use state::{Health, Observed, State};

pub struct Engine {
    cfg: Config,
    since: String,
    view: PodView,
    link: Option<Link>,
    gpu_probe: GpuProbe,
    gpu: GpuInfo,
    listeners: Listeners,
    oom: OomWatch,
    state: State,
    outbox: Outbox,
    metrics: Arc<Metrics>,
    ready: Readiness,
    evaluated: bool,
    warned_no_container: bool,
    child: Option<Child>,
    stop: bool,
    /// Exec: a stop signal was forwarded to CMD.
    terminating: bool,
    /// The most GPUs NVML has shown at once: fewer later means GPUs were lost.
    gpus_seen: u32,
    gpu_lost: Option<String>,
    xids: XidLedger,
    gpu_events: Option<tokio::sync::mpsc::UnboundedReceiver<GpuEvent>>,
    gpu_events_stop: Arc<AtomicBool>,
    /// exec `--observations`: hands its observations to the sidecar.
    outgoing: Option<handover::Outgoing>,
    /// sidecar `--observations`: reads exec's observations.
    inbox: Option<handover::Inbox>,
    /// The first view of the own pod has seeded what was announced before.
    seeded: bool,
    /// The peers of the resolved cluster (the sidecar, or exec with credentials).
    peers: Option<peer_watch::PeerWatch>,
    /// Sidecar with exec handing over: where the cluster stands, for exec.
    peers_out: Option<peers_file::Outgoing>,
    /// exec handing over, with `--on-peer-change restart|exit`: the sidecar's word.
    peers_in: Option<peers_file::Incoming>,
    /// exec: its restarts, for the observation.
    restart_obs: Option<crate::report::handover::RestartObservation>,
    started: Instant,
}

impl Engine {
    pub fn new(cfg: Config) -> Engine {
        let started = SystemTime::now();
        let proc_root = Path::new("/proc");
        let (outgoing, inbox) = match (cfg.mode, cfg.observations.clone()) {
            (Mode::Exec, Some(dir)) => (Some(handover::Outgoing::new(dir, started)), None),
            (Mode::Sidecar, Some(dir)) => (None, Some(handover::Inbox::new(dir))),
            (_, None) => (None, None),
        };
        // exec watches its peers itself only where it holds API credentials; handing
        // over, the sidecar does.
        let peers = match (cfg.mode, &cfg.cluster_file, &cfg.observations) {
            (Mode::Sidecar, Some(f), _) | (Mode::Exec, Some(f), None) => {
                peer_watch::PeerWatch::load(f)
            }
            _ => None,
        };
        let peers_out = match (cfg.mode, &inbox, &cfg.cluster_file) {
            (Mode::Sidecar, Some(_), Some(f)) => peers_file::Outgoing::new(f),
            _ => None,
        };
        let peers_in = match (cfg.mode, &cfg.observations, &cfg.cluster_file) {
            (Mode::Exec, Some(_), Some(f)) if cfg.restart.on_change != OnPeerChange::Report => f
                .parent()
                .map(|d| peers_file::Incoming::new(d.to_path_buf())),
            _ => None,
        };
        Engine {
            outgoing,
            inbox,
            seeded: false,
            peers,
            peers_out,
            peers_in,
            restart_obs: None,
            started: Instant::now(),
            gpu_probe: GpuProbe::new(cfg.nvml_lib.clone()),
            outbox: Outbox::new(cfg.min_patch_interval, Instant::now()),
            listeners: Listeners::new(proc_root),
            oom: OomWatch::new(cfg.mode, proc_root, started),
            cfg,
            since: oom::rfc3339(started),
            view: PodView::default(),
            link: None,
            gpu: GpuInfo {
                devices: Vec::new(),
                driver: None,
                nvml: Ok(()),
            },
            state: State::default(),
            metrics: Arc::new(Metrics::new()),
            ready: Readiness::default(),
            evaluated: false,
            warned_no_container: false,
            child: None,
            stop: false,
            terminating: false,
            gpus_seen: 0,
            gpu_lost: None,
            xids: XidLedger::default(),
            gpu_events: None,
            gpu_events_stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Starts the NVML event thread (XID errors, a lost GPU).
    fn watch_gpu_events(&mut self) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        gpu_events::spawn(self.cfg.nvml_lib.clone(), tx, self.gpu_events_stop.clone());
        self.gpu_events = Some(rx);
    }

    /// One XID error is one Warning Event and one count; a lost GPU is announced by
    /// the next evaluation.
    fn on_gpu_event(&mut self, ev: GpuEvent) {
        match ev {
            GpuEvent::Xid(e) => {
                let n = self.xids.record(e.clone());
                warn!(count = n, "{}", e.message());
                self.metrics
                    .gpu_xid_errors
                    .get_or_create(&handover::xid_label(&e))
                    .inc();
                self.outbox.push(("GPUXidError", e.message()), true);
            }
            GpuEvent::Lost { why } => {
                self.gpu_lost = Some(why);
                self.gpu_events = None;
            }
        }
    }

    /// The training container's name: `--container`, the pod's first non-trainlet
    /// container, or `main` while the pod is unknown.
    fn container_name(&self) -> String {
        if let Some(c) = &self.cfg.container {
            return c.clone();
        }
        self.view
            .container(None)
            .map(|c| c.name.clone())
            .unwrap_or_else(|| "main".into())
    }

    fn training(&self) -> Option<&Container> {
        self.view.container(self.cfg.container.as_deref())
    }

    fn watched_ports(&self) -> Vec<u16> {
        let from_pod = || {
            self.training()
                .map(pod::container_ports)
                .unwrap_or_default()
        };
        let mut v: Vec<u16> = match self.cfg.mode {
            Mode::Sidecar if !self.cfg.ports.is_empty() => self.cfg.ports.clone(),
            Mode::Sidecar => from_pod(),
            Mode::Exec => [from_pod(), self.cfg.ports.clone()].concat(),
        };
        v.sort_unstable();
        v.dedup();
        v
    }

    fn probe(&mut self) {
        self.gpu = self.gpu_probe.probe();
        if self.gpu.nvml.is_ok() {
            self.gpus_seen = self.gpus_seen.max(self.gpu.count());
        }
        if self.cfg.mode == Mode::Exec {
            self.oom.refresh_tree();
        }
        self.read_observations();
        if let Some(p) = self.peers_in.as_mut() {
            p.read();
        }
        let watched = self.watched_ports();
        let container = self.container_name();
        let cx = listeners::Context {
            mode: self.cfg.mode,
            view: &self.view,
            container: &container,
            tree: &self.oom.tree,
        };
        self.listeners.probe(&watched, &cx);
    }

    async fn check_oom(&mut self, notified: bool) {
        for kill in self.oom.check(notified, &self.view).await {
            self.announce_kill(&kill);
        }
    }

    fn announce_kill(&mut self, kill: &OomKill) {
        warn!("{}", kill.message());
        self.metrics
            .oom_kills
            .get_or_create(&ContainerLabel {
                container: kill.container.clone(),
            })
            .inc();
        self.outbox.push(("OOMKill", kill.message()), true);
    }

    /// The probes that failed, by probe: their parts of the report are partial.
    fn probe_errors(&self) -> BTreeMap<String, String> {
        let mut errors = self.oom.errors.clone();
        if let Some(e) = &self.listeners.error {
            errors.insert("ports".into(), e.clone());
        }
        errors
    }

    /// Builds the report from the latest observations, updates the metrics, and
    /// schedules what changed.
    fn evaluate(&mut self) {
        if self.cfg.mode == Mode::Sidecar {
            self.tell_exec();
        }
        let container = self.container_name();
        let expected = pod::expected_gpus(self.cfg.expect_gpus, self.training());
        let mut sources = self.oom.sources();
        if self.link.is_some() {
            sources.push("pod status".into());
        }
        let mut errors = self.probe_errors();
        // A sidecar reports the GPUs and ports the training container's trainlet exec
        // observed; from its own NVML only when it has GPUs of its own; else the count
        // is unknown, which is no problem to announce.
        let now = SystemTime::now();
        let exec_gpu;
        let mut ports = Cow::Borrowed(&self.listeners.states);
        let mut unknown = None;
        let (gpu, gpus_seen, gpu_lost) = match self.inbox.as_ref().and_then(|i| i.fresh(now)) {
            Some(o) => {
                exec_gpu = o.gpu_info();
                ports.to_mut().extend(o.port_states());
                for (k, v) in &o.errors {
                    errors.insert(format!("exec {k}"), v.clone());
                }
                sources.push(format!(
                    "trainlet exec in container {container} (observations)"
                ));
                (&exec_gpu, o.gpu.seen, o.gpu.lost.as_deref())
            }
            None => {
                if self.cfg.mode == Mode::Sidecar && self.gpu.count() == 0 {
                    unknown = Some(match &self.inbox {
                        Some(i) => i.why_unknown(&self.gpu.nvml_status(), now),
                        None => format!(
                            "this sidecar has no GPU of its own (NVML: {}) and no observations from trainlet exec (--observations)",
                            self.gpu.nvml_status()
                        ),
                    });
                }
                (&self.gpu, self.gpus_seen, self.gpu_lost.as_deref())
            }
        };
        let mark = self.exec_mark();
        let step = self.state.step(Observed {
            mode: self.cfg.mode.as_str(),
            container: &container,
            since: &self.since,
            gpu,
            expected: expected.as_ref(),
            ports: ports.as_ref(),
            oom_total: self.oom.ledger.total,
            oom_by_container: &self.oom.ledger.by_container,
            oom_recent: &self.oom.ledger.kills,
            oom_sources: sources,
            errors,
            gpus_seen,
            gpu_lost,
            xids: &self.xids,
            gpu_unknown: unknown.as_deref(),
            exec: mark.as_ref(),
            cluster: self.peers.as_ref().and_then(|p| p.drift.as_deref()),
        });
        if let Some(summary) = &step.summary {
            info!(devices = ?step.report.gpu.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), "report: {summary}");
        }
        let m = &self.metrics;
        m.gpus.set(match step.report.gpu.status {
            GpuStatus::Unknown => -1,
            _ => i64::from(step.report.gpu.count),
        });
        m.gpus_expected
            .set(expected.as_ref().map_or(0, |e| i64::from(e.count)));
        m.health.set(i64::from(step.report.health == Health::Ok));
        if let Some(c) = &step.report.cluster {
            m.cluster_stale.set(i64::from(c != "current"));
        }
        // No await between clear and set: a scrape on this thread never sees a gap.
        m.gpu_info.clear();
        for d in &step.report.gpu.devices {
            m.gpu_info
                .get_or_create(&GpuLabel {
                    gpu: d.index.to_string(),
                    uuid: d.uuid.clone(),
                    model: d.name.clone(),
                })
                .set(1);
        }
        // The training container's counter exists from the start, at 0, so that
        // rate() and alerts work before the first kill.
        drop(m.oom_kills.get_or_create(&ContainerLabel { container }));
        // No await between clear and set: a scrape on this thread never sees a gap.
        m.port_conflict.clear();
        for (port, state) in ports.iter() {
            m.port_conflict
                .get_or_create(&PortLabel {
                    port: port.to_string(),
                })
                .set(i64::from(state.is_conflict()));
        }
        for n in step.events {
            warn!(reason = n.0, "{}", n.1);
            self.outbox.push(n, false);
        }
        if step.urgent {
            self.outbox.hurry();
        }
        // The first report waits (a little) for the peer watch's first list, so that it
        // already says whether the cluster is current: one patch, not two.
        let peers_pending = self.peers.as_ref().is_some_and(|p| p.drift.is_none())
            && self.started.elapsed() < peer_watch::FIRST_LIST_WAIT;
        if !peers_pending {
            self.outbox.want(step.annotations);
            self.evaluated = true;
        }
        self.schedule();
        self.hand_over(None);
    }

    fn schedule(&mut self) {
        let settled = self.outbox.schedule(Instant::now());
        // Without a link (exec outside a pod) the metrics are the report.
        if self.evaluated && (settled || self.link.is_none()) {
            self.ready.set();
        }
    }

    /// Runs until a stop signal, `--exit-with-main`, or (exec) CMD's exit.
    async fn run_loop(&mut self, signals: &mut Signals) {
        let mut pods = self.pod_stream();
        let mut next_probe = Instant::now();
        let mut next_fast = Instant::now();
        let far = || Instant::now() + Duration::from_secs(86400);
        loop {
            let recheck = self.oom.recheck_until.is_some_and(|t| t > Instant::now());
            // With an OOM notifier (v1 eventfd, v2 inotify) exec mode needs no fast
            // tick: the probe refreshes CMD's tree every --interval and a notification
            // refreshes it at once, while the victim is still in /proc. A 1 s tree
            // refresh here cost 0.1-0.2 % of a core at rest.
            let fast_period = (self.oom.any_polled() || recheck).then(|| {
                if self.oom.recheck_until.is_some() {
                    Duration::from_millis(100)
                } else {
                    oom_watch::POLL
                }
            });
            let publish_at = self.outbox.next().unwrap_or_else(far);
            tokio::select! {
                sig = signals.recv() => match (sig, &self.child) {
                    (Some(signal::SIGCHLD), _) => self.reap(),
                    (Some(s), Some(child)) => {
                        child.forward(s);
                        // The kubelet stops the container: CMD's exit ends exec, and
                        // no peer change restarts it.
                        self.terminating |= signal::STOP.contains(&s);
                    }
                    (Some(s), None) => {
                        info!("{}: stopping", signal::name(s));
                        self.stop = true;
                    }
                    (None, _) => self.stop = true,
                },
                ev = next_pod(&mut pods) => match ev {
                    Some(Ok(pod)) => { self.on_pod(pod); self.evaluate(); }
                    Some(Err(e)) => {
                        self.metrics.api_errors.inc();
                        warn!("watching the own pod: {e}; the watch retries with backoff");
                    }
                    None => pods = None,
                },
                Some((i, ev)) = peer_watch::next_event(&mut self.peers) => self.on_peer_event(i, ev),
                Some(()) = peers_file::next_state(&mut self.peers_in) => self.on_peers_file(),
                Some(()) = handover::next_version(&mut self.inbox) => {
                    if self.read_observations() {
                        self.evaluate();
                    }
                }
                Some(ev) = next_gpu_event(&mut self.gpu_events) => {
                    self.on_gpu_event(ev);
                    self.evaluate();
                }
                Some(_idx) = self.oom.notified() => {
                    self.check_oom(true).await;
                    self.evaluate();
                }
                _ = tokio::time::sleep_until(next_probe.into()) => {
                    self.probe();
                    if self.oom.is_watching() && fast_period.is_none() {
                        // A safety net under the notifiers.
                        self.check_oom(false).await;
                    }
                    self.evaluate();
                    next_probe = Instant::now() + self.cfg.interval;
                }
                _ = tokio::time::sleep_until(next_fast.into()), if fast_period.is_some() => {
                    if self.oom.recheck_until.is_some_and(|t| t <= Instant::now()) {
                        self.oom.recheck_until = None;
                    }
                    let before = self.oom.ledger.total;
                    self.check_oom(false).await;
                    if self.cfg.mode == Mode::Exec
                        && self.oom.tree_at.is_none_or(|t| t.elapsed() >= oom_watch::TREE_REFRESH)
                    {
                        self.oom.refresh_tree();
                    }
                    if self.oom.ledger.total != before {
                        self.evaluate();
                    }
                    next_fast = Instant::now() + fast_period.unwrap_or(oom_watch::POLL);
                }
                _ = tokio::time::sleep_until(publish_at.into()), if self.outbox.next().is_some() => {
                    self.outbox.send(&self.metrics, &self.ready).await;
                }
            }
            if self.stop
                || self.child.as_ref().is_some_and(|c| c.exit.is_some())
                || self.act_on_stale().is_some()
            {
                break;
            }
        }
    }

    /// One event of the peer watch; a new report when where the tasks stand changed.
    fn on_peer_event(&mut self, i: usize, ev: peer_watch::PeerEvent) {
        if self.peers.as_mut().is_some_and(|p| p.on_event(i, ev)) {
            self.evaluate();
        }
    }

    /// exec: reads the sidecar's peers.json; a new report when it changed.
    fn on_peers_file(&mut self) {
        if self.peers_in.as_mut().is_some_and(|p| p.read()) {
            self.evaluate();
        }
    }

    /// Starts the peer watch, where there is one and a connection to the API server.
    fn start_peer_watch(&mut self) {
        if let (Some(peers), Some(link)) = (self.peers.as_mut(), self.link.as_ref()) {
            peers.start(&link.client, &link.id.namespace);
        }
    }

    fn stop_gpu_events(&mut self) {
        self.gpu_events_stop.store(true, Ordering::Relaxed);
        self.gpu_events = None;
    }

    fn reap(&mut self) {
        if let Some(child) = &mut self.child {
            child.reap();
        }
    }

    /// Binds the metrics server and spawns it.
    fn start_metrics(&self, required: bool) -> Result<(), MetricsError> {
        let Some(addr) = self.cfg.metrics_addr else {
            return Ok(());
        };
        match metrics::bind(addr) {
            Ok(l) => {
                tokio::spawn(metrics::serve(l, self.metrics.clone(), self.ready.clone()));
                Ok(())
            }
            Err(e) if required => Err(e),
            Err(e) => {
                warn!("{e}; going on without metrics");
                Ok(())
            }
        }
    }
}

/// `trainlet sidecar`.
pub async fn sidecar(cfg: Config) -> Result<(), ReportError> {
    let mut engine = Engine::new(cfg);
    let mut signals = Signals::new(&signal::STOP).map_err(ReportError::Signals)?;
    engine.start_metrics(true)?;
    engine.connect().await?;
    if let Some(root) = &engine.cfg.cgroup_root {
        engine.oom.resolve_container_cgroups(root, &engine.view);
    }
    engine.watch_gpu_events();
    engine.watch_observations();
    engine.start_peer_watch();
    engine.run_loop(&mut signals).await;
    engine.stop_gpu_events();
    engine.outbox.flush(&engine.metrics, &engine.ready).await;
    Ok(())
}

/// The next NVML event, or never when the thread is not running.
async fn next_gpu_event(
    rx: &mut Option<tokio::sync::mpsc::UnboundedReceiver<GpuEvent>>,
) -> Option<GpuEvent> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
