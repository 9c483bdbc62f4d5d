//! The reporter loop shared by `trainlet sidecar` and `trainlet exec --report`.
//!
//! One task on a single-threaded runtime waits on everything at once:
//! - the own pod, through a watch (kube-runtime's watcher, with its backoff): the
//!   training container's GPU limit, ports, start time and OOMKilled restarts;
//! - the probe interval: NVML and `/proc/net/tcp{,6}` ([`listeners`]);
//! - OOM notifications (eventfd or inotify), or a fast poll where there are none
//!   ([`oom_watch`]);
//! - NVML events (XID errors, a lost GPU) from a thread that blocks on NVML's event
//!   API ([`crate::report::probe::gpu::events`]);
//! - the outbox's next write ([`outbox`]) and signals;
//! - in exec mode, CMD's exit (SIGCHLD, [`child`]); [`exec`] runs CMD and restarts it
//!   after a peer change.
//!
//! After each of these the observations go through the pure [`state`], which returns
//! the report, the annotations and the Events to publish. At rest a sidecar wakes once
//! per `--interval`, reads two small files and, on GPU nodes, asks NVML three
//! questions; the pod watch is an idle connection; nothing is written to the API
//! server until something changes.

mod config;
mod evaluate;
mod exec;
mod gpu;
mod handover;
mod link;
mod peers_file;
mod progress;
mod republish;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Container;
use tracing::{info, warn};

use crate::metrics::{self, ContainerLabel, Metrics, MetricsError, Readiness};
use crate::peers::drift as peer_watch;
use crate::publish::{ContainerUrgency, TokenBucket};
use crate::report::outbox::Outbox;
use crate::report::pod::{self, PodView};
use crate::report::probe::oom::watch::{self as oom_watch, OomWatch};
use crate::report::probe::oom::{self, OomKill};
use crate::report::probe::ports::listeners::{self, Listeners};
use crate::report::state::State;
use crate::signal::{self, Signals};
use crate::supervise::child::Child;
use crate::supervise::policy::{OnPeerChange, OnStall};
pub use config::{Config, Mode, ReportError};
pub use exec::exec_reporter;
use link::{Link, next_pod};

pub struct Engine {
    cfg: Config,
    since: String,
    view: PodView,
    link: Option<Link>,
    gpus: gpu::Gpus,
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
    restart_obs: Option<crate::handover::observation::RestartObservation>,
    /// Sidecar: how often the training container's news may hurry a patch.
    container_urgency: TokenBucket,
    /// Sidecar: lines logged about the training container's news, and those not.
    news_log: TokenBucket,
    news_unlogged: u64,
    /// Sidecar: it told exec of a stale cluster since the last restart it announced,
    /// so exec's next restart is one it asked for.
    restart_allowed: bool,
    /// The resolver pod's reporter: the resolution it publishes again.
    republish: republish::Republish,
    /// exec: CMD's progress and stalls (`--stall-after`, `--progress-pattern`).
    progress: Option<progress::Watching>,
    /// What `trainlet.io/progress` says now, published or about to be.
    progress_published: Option<crate::peers::progress::Annotation>,
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
            // peers.json tells of peer changes and of peers' stalls.
            // The stall rule reads the peers' progress too.
            (Mode::Exec, Some(_), Some(f))
                if cfg.restart.on_change != OnPeerChange::Report
                    || cfg.restart.on_stall != OnStall::Report
                    || cfg
                        .progress
                        .as_ref()
                        .is_some_and(|p| p.stall_after.is_some()) =>
            {
                f.parent()
                    .map(|d| peers_file::Incoming::new(d.to_path_buf()))
            }
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
            container_urgency: ContainerUrgency::bucket(Instant::now()),
            news_log: TokenBucket::new(20, Duration::from_secs(3), Instant::now()),
            news_unlogged: 0,
            restart_allowed: false,
            republish: republish::Republish::default(),
            progress: match (cfg.mode, &cfg.progress) {
                (Mode::Exec, Some(p)) => Some(progress::Watching::new(
                    p,
                    cfg.cluster_file.as_deref(),
                    started,
                )),
                _ => None,
            },
            progress_published: None,
            started: Instant::now(),
            gpus: gpu::Gpus::new(cfg.nvml_lib.clone()),
            outbox: Outbox::new(cfg.min_patch_interval, Instant::now()),
            listeners: Listeners::new(proc_root),
            oom: OomWatch::new(cfg.mode, proc_root, started),
            cfg,
            since: oom::rfc3339(started),
            view: PodView::default(),
            link: None,
            state: State::default(),
            metrics: Arc::new(Metrics::new()),
            ready: Readiness::default(),
            evaluated: false,
            warned_no_container: false,
            child: None,
            stop: false,
            terminating: false,
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
        self.metrics.probes.inc();
        self.gpus.probe();
        if self.cfg.mode == Mode::Exec {
            self.oom.refresh_tree();
            self.check_progress(false);
        }
        self.read_observations();
        if let Some(p) = self.peers_in.as_mut() {
            p.read();
        }
        self.probe_ports();
    }

    /// Who listens on the watched ports, and whether that is a conflict.
    fn probe_ports(&mut self) {
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
            self.announce_kill(&kill, true);
        }
    }

    fn announce_kill(&mut self, kill: &OomKill, urgent: bool) {
        self.log_news(&kill.message());
        self.metrics
            .oom_kills
            .get_or_create(&ContainerLabel {
                container: kill.container.clone(),
            })
            .inc();
        self.outbox.push(("OOMKill", kill.message()), urgent);
    }

    /// A warning about news (an OOM kill, an XID), at most 20 at once and then one per
    /// 3 s: in the shipped layout the news comes from the training container, which
    /// must not be able to fill the sidecar's log. What is not logged is counted, and
    /// said with the next line that is.
    fn log_news(&mut self, line: &str) {
        if !self.news_log.take(Instant::now()) {
            self.news_unlogged += 1;
            return;
        }
        match std::mem::take(&mut self.news_unlogged) {
            0 => warn!("{line}"),
            n => warn!("{line} ({n} lines like this one were not logged before it)"),
        }
    }

    /// The probes that failed, by probe: their parts of the report are partial.
    fn probe_errors(&self) -> BTreeMap<String, String> {
        let mut errors = self.oom.errors.clone();
        if let Some(e) = &self.listeners.error {
            errors.insert("ports".into(), e.clone());
        }
        errors
    }

    /// Runs until a stop signal, `--exit-with-main`, or (exec) CMD's exit.
    async fn run_loop(&mut self, signals: &mut Signals) {
        let mut pods = self.pod_stream();
        let mut next_probe = Instant::now();
        let mut next_fast = Instant::now();
        let mut next_growth = Instant::now();
        let far = || Instant::now() + Duration::from_secs(86400);
        loop {
            let recheck = self.oom.recheck_until.is_some_and(|t| t > Instant::now());
            // With an OOM notifier (v1 eventfd, v2 inotify) exec mode needs no fast
            // tick: the probe refreshes CMD's tree every --interval and a notification
            // refreshes it at once, while the victim is still in /proc. A 1 s tree
            // refresh here cost 0.1-0.2 % of a core at rest.
            let fast_period = (self.oom.any_polled() || recheck).then(|| {
                if self.oom.recheck_until.is_some() {
                    oom_watch::RECHECK
                } else {
                    oom_watch::POLL
                }
            });
            let growth = self.oom.watches_growth();
            let stall_at = self.stall_check_at();
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
                    Some(Ok(pod)) => { self.on_pod(pod); self.refresh(); }
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
                        self.refresh();
                    }
                }
                Some(ev) = self.gpus.next_event() => {
                    self.on_gpu_event(ev);
                    self.refresh();
                }
                Some(_idx) = self.oom.notified() => {
                    self.check_oom(true).await;
                    self.refresh();
                }
                _ = tokio::time::sleep_until(next_probe.into()) => {
                    self.probe();
                    if self.oom.is_watching() && fast_period.is_none() {
                        // A safety net under the notifiers.
                        self.check_oom(false).await;
                    }
                    self.refresh();
                    next_probe = Instant::now() + self.cfg.interval;
                }
                _ = tokio::time::sleep_until(stall_at.unwrap_or_else(far).into()), if stall_at.is_some() => {
                    // The moment a stall would begin: CMD's CPU over it for the note.
                    self.oom.refresh_tree();
                    self.check_progress(false);
                    self.refresh();
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
                        self.refresh();
                    }
                    next_fast = Instant::now() + fast_period.unwrap_or(oom_watch::POLL);
                }
                _ = tokio::time::sleep_until(next_growth.into()), if growth => {
                    self.oom.on_growth_tick();
                    next_growth = Instant::now() + oom_watch::GROWTH_POLL;
                }
                _ = tokio::time::sleep_until(publish_at.into()), if self.outbox.next().is_some() => {
                    self.outbox.send(&self.metrics, &self.ready).await;
                }
            }
            if self.stop
                || self.child.as_ref().is_some_and(|c| c.exit.is_some())
                || self.act_on_stale().is_some()
                || self.act_on_stall().is_some()
            {
                break;
            }
        }
    }

    /// After anything changed, in this order: the sidecar tells exec where the cluster
    /// stands (and, when exec waits for the replacements, first moves the cluster files
    /// to them); the report is computed from the observations, which touches no file;
    /// exec hands its observations to the sidecar.
    fn refresh(&mut self) {
        if self.cfg.mode == Mode::Sidecar {
            self.tell_exec();
        }
        self.evaluate();
        self.hand_over(None);
    }

    /// One event of the peer watch; a new report when where the tasks stand changed.
    fn on_peer_event(&mut self, i: usize, ev: peer_watch::PeerEvent) {
        if self.peers.as_mut().is_some_and(|p| p.on_event(i, ev)) {
            self.refresh();
        }
    }

    /// exec: reads the sidecar's peers.json; a new report when it changed.
    fn on_peers_file(&mut self) {
        if self.peers_in.as_mut().is_some_and(|p| p.read()) {
            self.refresh();
        }
    }

    /// Starts the peer watch, where there is one and a connection to the API server.
    fn start_peer_watch(&mut self) {
        if let (Some(peers), Some(link)) = (self.peers.as_mut(), self.link.as_ref()) {
            peers.start(&link.client, &link.id.namespace);
        }
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
        match metrics::bind_or_any_port(addr) {
            Ok((l, taken)) => {
                if let Some(e) = taken {
                    let at = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                    warn!(
                        "{e}: another process holds it (on a hostNetwork pod, every pod of the node shares the node's ports); serving on {at} instead, which Prometheus does not know of: give each pod of a node its own --{}",
                        crate::flags::METRICS_ADDR
                    );
                }
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
    if engine.peers_out.is_some()
        && let Some(dir) = engine.cfg.cluster_file.as_deref().and_then(Path::parent)
    {
        // A sidecar killed while it moved the files left a temporary file behind.
        for f in crate::render::remove_leftovers(dir) {
            info!("removed {}, left by an earlier run", f.display());
        }
    }
    engine.start_metrics(true)?;
    engine.connect().await?;
    if let Some(root) = &engine.cfg.cgroup_root {
        engine.oom.resolve_container_cgroups(root, &engine.view);
    }
    // What NVML shows, before the first report: a pod event or the event thread's
    // registration can bring an evaluation before the loop's first probe, and the pod
    // must not be told a count that nothing probed.
    engine.gpus.probe();
    engine.gpus.watch_events();
    engine.watch_observations();
    engine.start_peer_watch();
    engine.run_loop(&mut signals).await;
    engine.gpus.stop_events();
    engine.outbox.flush(&engine.metrics, &engine.ready).await;
    Ok(())
}
