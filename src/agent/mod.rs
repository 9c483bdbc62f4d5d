//! The agent: the one process trainlet runs beside training, as `trainlet exec
//! --report` (beside CMD, [`exec_reporter`]) or `trainlet sidecar` ([`sidecar`]); which
//! one, and how exec reaches the API server, is its [`Role`], decided once.
//!
//! One task on a single-threaded runtime waits on everything at once (`input.rs`, one
//! `Input` per kind of wake-up):
//! - the own pod, through a watch (kube-runtime's watcher, with its backoff): the
//!   training container's GPU limit, ports, start time and OOMKilled restarts;
//! - the probe interval: NVML and `/proc/net/tcp{,6}`;
//! - OOM notifications (eventfd or inotify), or a fast poll where there are none;
//! - NVML events (XID errors, a lost GPU) from a thread that blocks on NVML's event
//!   API ([`crate::report::probe::gpu::events`]);
//! - the peer watch, or the sidecar's `peers.json`; exec's observations (the sidecar);
//! - the outbox's next write and signals; in exec, CMD's exit (SIGCHLD) and the moment
//!   a stall would begin.
//!
//! After each of these the observations go through the pure `crate::report::state`,
//! which returns the report, the annotations and the Events to publish. exec's loop
//! hands CMD back to the supervisor ([`crate::supervise::lifecycle`]) when the
//! cluster or a stall asks for action. At rest a sidecar wakes once per `--interval`,
//! reads two small files and, on GPU nodes, asks NVML three questions; the pod watch
//! is an idle connection; nothing is written to the API server until something
//! changes.

mod config;
mod evaluate;
mod exec;
mod gpu;
mod group;
mod input;
mod link;
mod observations;
mod republish;
mod role;
mod sidecar;
mod stall;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Container;
use tracing::warn;

use crate::metrics::{self, Metrics, MetricsError, Readiness};
use crate::publish::{ContainerUrgency, TokenBucket};
use crate::report::outbox::Outbox;
use crate::report::pod::{self, PodView};
use crate::report::probe::oom::watch::OomWatch;
use crate::report::probe::ports::listeners::{self, Listeners};
use crate::report::state::State;
pub use config::{
    Config, ExecConfig, Mode, ProbeConfig, PublishConfig, ReportError, RoleConfig, SidecarConfig,
};
pub use exec::exec_reporter;
use link::Link;
use role::Role;
pub use sidecar::sidecar;

pub struct Engine {
    cfg: Config,
    /// Which process this is and what only it has, decided once ([`Role::new`]).
    role: Role,
    clock: Clock,
    view: PodView,
    link: Option<Link>,
    probes: Probes,
    state: State,
    outbox: Outbox,
    metrics: Arc<Metrics>,
    ready: Readiness,
    once: Once,
    /// The sidecar: a stop signal or `--exit-with-main` ends its loop. (exec's loop
    /// hands signals to the supervisor, which owns CMD's life.)
    stopping: bool,
    /// exec: its loop's timers and pod watch, kept from one run of the loop to the
    /// next.
    wake: Option<input::Wake>,
    /// News from the training container, bounded.
    news: News,
    /// The resolver pod's reporter: the resolution it publishes again.
    republish: republish::Republish,
    /// What `trainlet.io/progress` says now (published or about to be; the sidecar
    /// publishes exec's).
    progress: Option<crate::stall::peers::Annotation>,
}

/// When the agent started.
struct Clock {
    at: Instant,
    /// The same, as the report's `since`.
    since: String,
}

/// The three probes: GPUs (NVML), listening ports, OOM kills.
struct Probes {
    gpus: gpu::Gpus,
    listeners: Listeners,
    oom: OomWatch,
}

/// Things done once.
#[derive(Default)]
struct Once {
    /// A report was computed: `/readyz` may say ready once it is out.
    evaluated: bool,
    /// The pod has no training container: said once.
    warned_no_container: bool,
    /// The first view of the own pod has seeded what was announced before.
    seeded: bool,
}

/// The training container's news (an OOM kill, an XID, a stall), which it must not be
/// able to turn into a flood of patches or log lines.
struct News {
    /// How often the news may hurry a patch.
    urgency: TokenBucket,
    /// Lines logged about the news, and those not.
    log: TokenBucket,
    unlogged: u64,
}

impl Engine {
    pub fn new(cfg: Config, own: RoleConfig) -> Engine {
        let started = SystemTime::now();
        let proc_root = Path::new("/proc");
        let role = Role::new(&cfg, own, started);
        Engine {
            news: News {
                urgency: ContainerUrgency::bucket(Instant::now()),
                log: TokenBucket::new(20, Duration::from_secs(3), Instant::now()),
                unlogged: 0,
            },
            republish: republish::Republish::default(),
            progress: None,
            clock: Clock {
                at: Instant::now(),
                since: crate::time::rfc3339_seconds(started),
            },
            probes: Probes {
                gpus: gpu::Gpus::new(cfg.probes.nvml_lib.clone()),
                listeners: Listeners::new(proc_root),
                oom: OomWatch::new(role.mode(), proc_root, started),
            },
            outbox: Outbox::new(cfg.publish.min_patch_interval, Instant::now()),
            role,
            cfg,
            view: PodView::default(),
            link: None,
            state: State::default(),
            metrics: Arc::new(Metrics::new()),
            ready: Readiness::default(),
            once: Once::default(),
            stopping: false,
            wake: None,
        }
    }

    /// The training container's name: `--container`, the pod's first non-trainlet
    /// container, or `main` while the pod is unknown.
    fn container_name(&self) -> String {
        if let Some(c) = &self.cfg.probes.container {
            return c.clone();
        }
        self.view
            .container(None)
            .map(|c| c.name.clone())
            .unwrap_or_else(|| "main".into())
    }

    fn training(&self) -> Option<&Container> {
        self.view.container(self.cfg.probes.container.as_deref())
    }

    fn watched_ports(&self) -> Vec<u16> {
        let from_pod = || {
            self.training()
                .map(pod::container_ports)
                .unwrap_or_default()
        };
        let mut v: Vec<u16> = match self.role.mode() {
            Mode::Sidecar if !self.cfg.probes.ports.is_empty() => self.cfg.probes.ports.clone(),
            Mode::Sidecar => from_pod(),
            Mode::Exec => [from_pod(), self.cfg.probes.ports.clone()].concat(),
        };
        v.sort_unstable();
        v.dedup();
        v
    }

    fn probe(&mut self) {
        self.metrics.probes.inc();
        self.probes.gpus.probe();
        if self.role.exec().is_some() {
            self.probes.oom.refresh_tree();
            self.check_progress(false);
        }
        self.read_observations();
        if let Some(p) = self.role.peers_in_mut() {
            p.read();
        }
        self.probe_ports();
    }

    /// Who listens on the watched ports, and whether that is a conflict.
    fn probe_ports(&mut self) {
        let watched = self.watched_ports();
        let container = self.container_name();
        let cx = listeners::Context {
            mode: self.role.mode(),
            view: &self.view,
            container: &container,
            tree: &self.probes.oom.tree,
        };
        self.probes.listeners.probe(&watched, &cx);
    }

    /// The probes that failed, by probe: their parts of the report are partial.
    fn probe_errors(&self) -> BTreeMap<String, String> {
        let mut errors = self.probes.oom.errors.clone();
        if let Some(e) = &self.probes.listeners.error {
            errors.insert("ports".into(), e.clone());
        }
        errors
    }

    /// Starts the peer watch, where there is one and a connection to the API server.
    fn start_peer_watch(&mut self) {
        if let (Some(peers), Some(link)) = (self.role.peers_mut(), self.link.as_ref()) {
            peers.start(&link.client, &link.id.namespace);
        }
    }

    /// exec: where CMD's output goes through to be watched for progress, if it is.
    fn output_watch(&self) -> Option<Arc<crate::supervise::output::Watch>> {
        let w = self.role.exec()?.watching.as_ref()?;
        Some(w.watch.clone())
    }

    /// Binds the metrics server and spawns it.
    fn start_metrics(&self, required: bool) -> Result<(), MetricsError> {
        let Some(addr) = self.cfg.publish.metrics_addr else {
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
