//! The reporter loop shared by `trainlet sidecar` and `trainlet exec --report`.
//!
//! One task on a single-threaded runtime waits on everything at once:
//! - the own pod, through a watch (kube-runtime's watcher, with its backoff): the
//!   training container's GPU limit, ports, start time and OOMKilled restarts;
//! - the probe interval: NVML and `/proc/net/tcp{,6}`;
//! - OOM notifications (eventfd or inotify), or a fast poll where there are none;
//! - the publish timer ([`Throttle`]) and signals;
//! - in exec mode, CMD's exit (SIGCHLD).
//!
//! At rest a sidecar wakes once per `--interval`, reads two small files and, on GPU
//! nodes, asks NVML three questions; the pod watch is an idle connection; nothing is
//! written to the API server until something changes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::{debug, info, warn};

use super::gpu::{GpuInfo, GpuProbe};
use super::oom::{self, Cgroup, CgroupVersion, Notifier, OomKill, OomLedger, ProcStat};
use super::ports::{self, ListenerFacts, Owner, PortState};
use super::{Announced, Note, Observed};
use crate::cli::{KubeArgs, ReportArgs, parse_duration};
use crate::kube::{Identity, KubeError};
use crate::metrics::{self, ContainerLabel, Metrics, PortLabel, Readiness};
use crate::publish::{self, EventBudget, Publisher, Throttle, keys};
use crate::signal::{self, Signals};
use crate::{Code, Failure};

/// How often an OOM counter is read when no notifier could be set up.
const OOM_POLL: Duration = Duration::from_millis(250);
/// How long a process of CMD's tree stays a candidate victim after it was last seen.
const RECENT: Duration = Duration::from_secs(5);
/// How often exec mode refreshes its snapshot of CMD's process tree while it polls
/// for OOM kills (no notifier available).
const TREE_REFRESH: Duration = Duration::from_secs(1);
/// Every API call gets at most this long: a server that accepts connections but
/// never answers must not stall the reporter.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the last report may take on the way out (SIGTERM or CMD's exit).
const FINAL_FLUSH: Duration = Duration::from_millis(1500);

/// Which way the reporters run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Sidecar,
    Exec,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::Exec => "exec",
        }
    }
}

/// The validated reporter flags.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub nvml_lib: Option<PathBuf>,
    pub expect_gpus: Option<u32>,
    pub container: Option<String>,
    pub interval: Duration,
    pub min_patch_interval: Duration,
    pub metrics_addr: Option<SocketAddr>,
    /// Sidecar: `--port` (replaces the containerPorts). Exec: the task's own server
    /// port from TF_CONFIG (added to the containerPorts).
    pub ports: Vec<u16>,
    pub cgroup_root: Option<PathBuf>,
    pub exit_with_main: bool,
}

impl Config {
    /// Checks the flags only: no client, no NVML, no socket.
    pub fn from_args(mode: Mode, r: &ReportArgs) -> Result<Config, Failure> {
        let interval = parse_duration("--interval", &r.interval)?;
        if interval < Duration::from_millis(100) {
            return Err(Failure::usage(format!(
                "invalid --interval {:?}: use at least 100ms, e.g. 5s",
                r.interval
            )));
        }
        let min_patch_interval = parse_duration("--min-patch-interval", &r.min_patch_interval)?;
        let metrics_addr = metrics::parse_addr(&r.metrics_addr)?;
        if let Some(lib) = &r.nvml_lib
            && lib.as_os_str().is_empty()
        {
            return Err(Failure::usage(
                "invalid --nvml-lib \"\": give the path of libnvidia-ml.so.1",
            ));
        }
        Ok(Config {
            mode,
            nvml_lib: r.nvml_lib.clone(),
            expect_gpus: r.expect_gpus,
            container: r.container.clone().filter(|c| !c.is_empty()),
            interval,
            min_patch_interval,
            metrics_addr,
            ports: Vec::new(),
            cgroup_root: None,
            exit_with_main: false,
        })
    }
}

/// What the own pod says about the training container.
#[derive(Debug, Clone, Default)]
struct PodView {
    pod: Option<Pod>,
}

impl PodView {
    fn container<'a>(&'a self, name: Option<&str>) -> Option<&'a Container> {
        super::training_container(self.pod.as_ref()?, name)
    }

    fn status(&self, name: &str) -> Option<&ContainerStatus> {
        self.pod
            .as_ref()?
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find(|s| s.name == name)
    }

    fn host_network(&self) -> bool {
        self.pod
            .as_ref()
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }
}

/// A watched cgroup.
struct Watched {
    container: String,
    container_id: String,
    cgroup: Cgroup,
    last: oom::OomCounters,
    /// When `last` was read.
    checked_at: Instant,
    notifier: Option<tokio::task::JoinHandle<()>>,
    how: String,
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(h) = self.notifier.take() {
            h.abort();
        }
    }
}

/// What is remembered about a listening socket between probes.
#[derive(Debug, Clone)]
struct SocketMemo {
    first_seen: SystemTime,
    seen_before_start: bool,
    owner: Option<Owner>,
}

/// The connection to the API server, once the own pod is known.
struct Link {
    client: Client,
    id: Identity,
    publisher: Option<Publisher>,
}

pub struct Engine {
    cfg: Config,
    since: String,
    self_pid: u32,
    page_size: u64,
    proc_root: PathBuf,
    view: PodView,
    link: Option<Link>,
    gpu_probe: GpuProbe,
    gpu: GpuInfo,
    ports: BTreeMap<u16, PortState>,
    sockets: HashMap<u64, SocketMemo>,
    pre_spawn: HashSet<u64>,
    ledger: OomLedger,
    watched: Vec<Watched>,
    oom_tx: tokio::sync::mpsc::UnboundedSender<usize>,
    oom_rx: tokio::sync::mpsc::UnboundedReceiver<usize>,
    oom_recheck_until: Option<Instant>,
    /// The latest snapshot of CMD's process tree.
    tree: BTreeMap<u32, ProcStat>,
    tree_at: Option<Instant>,
    /// Every process of the tree seen in the last [`RECENT`], with when: the OOM
    /// victim is among them even when a snapshot taken after the kill no longer
    /// has it.
    recent: BTreeMap<u32, oom::SeenProc>,
    errors: BTreeMap<String, String>,
    announced: Announced,
    published: BTreeMap<String, String>,
    published_known: bool,
    desired: BTreeMap<String, Option<String>>,
    events: VecDeque<Note>,
    urgent: bool,
    throttle: Throttle,
    budget: EventBudget,
    next_publish: Option<Instant>,
    metrics: Arc<Metrics>,
    ready: Readiness,
    evaluated: bool,
    /// The last summary logged, so the log shows changes, not every probe.
    logged: String,
    logged_no_container: Option<()>,
    child: Option<u32>,
    child_exit: Option<i32>,
    stop: bool,
}

impl Engine {
    pub fn new(cfg: Config) -> Engine {
        let started = SystemTime::now();
        let (oom_tx, oom_rx) = tokio::sync::mpsc::unbounded_channel();
        Engine {
            gpu_probe: GpuProbe::new(cfg.nvml_lib.clone()),
            throttle: Throttle::new(cfg.min_patch_interval),
            cfg,
            since: oom::rfc3339(started),
            self_pid: std::process::id(),
            page_size: oom::page_size(),
            proc_root: PathBuf::from("/proc"),
            view: PodView::default(),
            link: None,
            gpu: GpuInfo {
                devices: Vec::new(),
                driver: None,
                nvml: Ok(()),
            },
            ports: BTreeMap::new(),
            sockets: HashMap::new(),
            pre_spawn: HashSet::new(),
            ledger: OomLedger::new(started),
            watched: Vec::new(),
            oom_tx,
            oom_rx,
            oom_recheck_until: None,
            tree: BTreeMap::new(),
            tree_at: None,
            recent: BTreeMap::new(),
            errors: BTreeMap::new(),
            announced: Announced::default(),
            published: BTreeMap::new(),
            published_known: false,
            desired: BTreeMap::new(),
            events: VecDeque::new(),
            urgent: false,
            budget: EventBudget::new(Instant::now()),
            next_publish: None,
            metrics: Arc::new(Metrics::new()),
            ready: Readiness::default(),
            evaluated: false,
            logged: String::new(),
            logged_no_container: None,
            child: None,
            child_exit: None,
            stop: false,
        }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    pub fn readiness(&self) -> Readiness {
        self.ready.clone()
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

    // ----------------------------------------------------------------- the API side

    /// Connects: the client, the identity, and the pre-flight GET of the own pod.
    /// A transient failure leaves the watch to catch up; any other is returned.
    pub async fn connect(&mut self, args: &KubeArgs) -> Result<(), KubeError> {
        let (client, default_ns) = crate::kube::client(args.kubeconfig.as_deref()).await?;
        let id = Identity {
            pod_name: crate::kube::pod_name(args).ok_or(KubeError::NoPodName)?,
            namespace: crate::kube::pod_namespace(args, &default_ns),
        };
        let pod = match tokio::time::timeout(API_TIMEOUT, crate::kube::get_own_pod(&client, &id))
            .await
        {
            Ok(Ok(p)) => Some(p),
            Ok(Err(e)) if e.is_transient() => {
                self.metrics.api_errors.inc();
                warn!("{e}; reporting locally and retrying in the background");
                None
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                self.metrics.api_errors.inc();
                warn!(
                    "the API server did not answer the GET of pod {} within {API_TIMEOUT:?}; retrying in the background",
                    id.pod_name
                );
                None
            }
        };
        info!(pod = %id.pod_name, namespace = %id.namespace, "reporting on the own pod");
        self.link = Some(Link {
            client,
            id,
            publisher: None,
        });
        if let Some(p) = pod {
            self.on_pod(p);
        }
        Ok(())
    }

    fn pod_stream(&self) -> Option<BoxStream<'static, Result<Pod, watcher::Error>>> {
        let link = self.link.as_ref()?;
        let api: Api<Pod> = Api::namespaced(link.client.clone(), &link.id.namespace);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", link.id.pod_name));
        Some(
            watcher(api, cfg)
                .default_backoff()
                .applied_objects()
                .boxed(),
        )
    }

    fn on_pod(&mut self, mut pod: Pod) {
        pod.metadata.managed_fields = None;
        if let Some(link) = &mut self.link
            && link.publisher.is_none()
        {
            link.publisher = Some(Publisher::new(link.client.clone(), &pod));
        }
        if !self.published_known {
            // What the pod carries when trainlet starts: a restarted reporter whose
            // annotations are still right sends nothing. Later watch events are not
            // used for this, because one may predate trainlet's own last patch.
            self.published_known = true;
            for k in [
                keys::GPU_COUNT,
                keys::GPU_PRODUCT,
                keys::PORT_CONFLICT,
                keys::OOM_KILLS,
                keys::HEALTH,
                keys::REPORT,
            ] {
                if let Some(v) = pod.metadata.annotations.as_ref().and_then(|a| a.get(k)) {
                    self.published.insert(k.to_string(), v.clone());
                }
            }
        }
        self.view.pod = Some(pod);
        if self.training().is_none() && self.logged_no_container.is_none() {
            let containers: Vec<String> = self
                .view
                .pod
                .iter()
                .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
                .map(|c| c.name.clone())
                .collect();
            warn!(
                "no training container {} in the pod (containers: {}); GPU limits and ports come from flags only (pass --container)",
                self.cfg
                    .container
                    .as_deref()
                    .unwrap_or("that is not trainlet's"),
                containers.join(", ")
            );
            self.logged_no_container = Some(());
        }
        // OOMKilled terminations in pod status.
        let limit = self.training().and_then(super::memory_limit);
        let found = oom::status_ooms(self.view.pod.as_ref().expect("set above"));
        for s in found {
            let limit = self
                .view
                .pod
                .as_ref()
                .and_then(|p| super::training_container(p, Some(&s.container)))
                .and_then(super::memory_limit)
                .or_else(|| limit.clone());
            if let Some(kill) = self.ledger.record_status(&s, limit) {
                self.announce_kill(&kill);
            }
        }
        if self.cfg.mode == Mode::Sidecar {
            self.resolve_container_cgroups();
        }
        if self.cfg.exit_with_main && self.main_finished() {
            info!(
                container = %self.container_name(),
                "the training container has terminated; exiting (--exit-with-main)"
            );
            self.stop = true;
        }
    }

    /// Whether the training container has terminated for good, so a classic sidecar
    /// may exit and let the Job complete.
    fn main_finished(&self) -> bool {
        let Some(pod) = &self.view.pod else {
            return false;
        };
        if matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) {
            return true;
        }
        let restart = pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always");
        let Some(st) = self.view.status(&self.container_name()) else {
            return false;
        };
        let Some(t) = st.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
            return false;
        };
        match restart {
            "Never" => true,
            "OnFailure" => t.exit_code == 0,
            _ => false,
        }
    }

    // ----------------------------------------------------------------- the probes

    fn probe(&mut self) {
        self.gpu = self.gpu_probe.probe();
        if self.cfg.mode == Mode::Exec {
            self.refresh_tree();
        }
        self.probe_ports();
    }

    fn watched_ports(&self) -> Vec<u16> {
        let mut v: Vec<u16> = match self.cfg.mode {
            Mode::Sidecar if !self.cfg.ports.is_empty() => self.cfg.ports.clone(),
            Mode::Sidecar => self
                .training()
                .map(super::container_ports)
                .unwrap_or_default(),
            Mode::Exec => {
                let mut v = self
                    .training()
                    .map(super::container_ports)
                    .unwrap_or_default();
                v.extend(&self.cfg.ports);
                v
            }
        };
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether the training container has not started yet, as far as the pod says.
    fn training_not_started(&self) -> bool {
        if self.view.pod.is_none() {
            return false;
        }
        match self.view.status(&self.container_name()) {
            None => true,
            Some(s) => s
                .state
                .as_ref()
                .is_none_or(|st| st.running.is_none() && st.terminated.is_none()),
        }
    }

    fn training_started_at(&self) -> Option<SystemTime> {
        let st = self.view.status(&self.container_name())?;
        let t = st.state.as_ref()?.running.as_ref()?.started_at.as_ref()?;
        Some(SystemTime::from(t.0))
    }

    fn training_container_id(&self) -> Option<String> {
        let id = self
            .view
            .status(&self.container_name())?
            .container_id
            .clone()?;
        let id = id
            .split_once("://")
            .map_or(id.as_str(), |(_, i)| i)
            .to_string();
        (!id.is_empty()).then_some(id)
    }

    /// Whether a visible process belongs to the training container. Exec mode: it is
    /// in CMD's tree. Sidecar: its cgroup names the training container's ID; without
    /// that ID, only the sidecar's own processes are known not to belong.
    fn in_training(&self, pid: u32, own_cgroup: &Option<String>) -> Option<bool> {
        match self.cfg.mode {
            Mode::Exec => Some(self.tree.contains_key(&pid)),
            Mode::Sidecar => {
                let cg =
                    std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup"))
                        .ok()?;
                match self.training_container_id() {
                    Some(id) => Some(cg.contains(&id)),
                    None if own_cgroup.as_deref() == Some(cg.as_str()) => Some(false),
                    None => None,
                }
            }
        }
    }

    fn probe_ports(&mut self) {
        let watched = self.watched_ports();
        if watched.is_empty() {
            self.ports.clear();
            self.errors.remove("ports");
            return;
        }
        let listeners = match ports::scan(&self.proc_root) {
            Ok(l) => {
                self.errors.remove("ports");
                l
            }
            Err(e) => {
                let msg = e.to_string();
                self.ports = watched
                    .iter()
                    .map(|p| (*p, PortState::Unknown { error: msg.clone() }))
                    .collect();
                self.errors.insert("ports".into(), msg);
                return;
            }
        };
        let by_port = ports::by_port(&listeners, &watched);
        let live: HashSet<u64> = by_port.values().flatten().map(|l| l.inode).collect();
        self.sockets.retain(|inode, _| live.contains(inode));
        let new: HashSet<u64> = live
            .iter()
            .filter(|i| !self.sockets.contains_key(i))
            .copied()
            .collect();
        if !new.is_empty() {
            let owners = ports::owners(&self.proc_root, &new);
            let not_started = self.cfg.mode == Mode::Sidecar && self.training_not_started();
            let now = SystemTime::now();
            for inode in new {
                self.sockets.insert(
                    inode,
                    SocketMemo {
                        first_seen: now,
                        seen_before_start: not_started,
                        owner: owners.get(&inode).cloned(),
                    },
                );
            }
        }
        let own_cgroup = std::fs::read_to_string(self.proc_root.join("self/cgroup")).ok();
        let started_at = self.training_started_at();
        let host_network = self.view.host_network();
        let mut states = BTreeMap::new();
        for (port, ls) in by_port {
            let facts: Vec<ListenerFacts> = ls
                .iter()
                .map(|l| {
                    let memo = &self.sockets[&l.inode];
                    let owner = memo.owner.clone();
                    let is_self = owner.as_ref().is_some_and(|o| o.pid == self.self_pid);
                    let in_training = owner
                        .as_ref()
                        .filter(|_| !is_self)
                        .and_then(|o| self.in_training(o.pid, &own_cgroup));
                    let seen_before_start = match self.cfg.mode {
                        Mode::Exec => self.pre_spawn.contains(&l.inode),
                        Mode::Sidecar => {
                            memo.seen_before_start
                                || started_at.is_some_and(|s| memo.first_seen < s)
                        }
                    };
                    ListenerFacts {
                        inode: l.inode,
                        owner,
                        in_training,
                        is_self,
                        seen_before_start,
                    }
                })
                .collect();
            states.insert(port, ports::classify(&facts, host_network));
        }
        self.ports = states;
    }

    /// Exec mode: the snapshot of CMD's process tree (every descendant of trainlet).
    fn refresh_tree(&mut self) {
        let all = oom::all_processes(&self.proc_root, self.page_size);
        self.tree = oom::descendants(&all, self.self_pid);
        let now = Instant::now();
        self.tree_at = Some(now);
        for (pid, seen) in self.recent.iter_mut() {
            if seen.vanished.is_none() && !self.tree.contains_key(pid) {
                seen.vanished = Some(now);
            }
        }
        for (pid, p) in &self.tree {
            self.recent.insert(
                *pid,
                oom::SeenProc {
                    stat: p.clone(),
                    seen: now,
                    vanished: None,
                },
            );
        }
        self.recent
            .retain(|_, p| now.duration_since(p.seen) <= RECENT);
    }

    // ----------------------------------------------------------------- OOM kills

    /// Starts watching a cgroup: the baseline counters and a notifier task.
    fn watch_cgroup(&mut self, container: String, container_id: String, cgroup: Cgroup) {
        let last = match cgroup.counters() {
            Ok(c) => c,
            Err(e) => {
                self.errors
                    .insert(format!("oom:{container}"), e.to_string());
                return;
            }
        };
        self.errors.remove(&format!("oom:{container}"));
        let idx = self.watched.len();
        let (notifier, how) = match Notifier::new(&cgroup) {
            Ok(mut n) => {
                let kind = n.kind();
                let tx = self.oom_tx.clone();
                let task = tokio::spawn(async move {
                    while n.wait().await.is_ok() {
                        if tx.send(idx).is_err() {
                            return;
                        }
                    }
                });
                (Some(task), kind.to_string())
            }
            Err(why) => {
                debug!(
                    "polling {} every {OOM_POLL:?}: {why}",
                    cgroup.path.display()
                );
                (None, format!("polled every {}ms", OOM_POLL.as_millis()))
            }
        };
        info!(
            container = %container,
            cgroup = %cgroup.path.display(),
            how = %how,
            "watching OOM kills"
        );
        self.watched.push(Watched {
            container,
            container_id,
            cgroup,
            last,
            checked_at: Instant::now(),
            notifier,
            how,
        });
    }

    /// Sidecar with `--cgroup-root`: finds the cgroups of the pod's (non-trainlet)
    /// containers by pod UID and container ID, again whenever a container restarts.
    fn resolve_container_cgroups(&mut self) {
        let (Some(root), Some(pod)) = (self.cfg.cgroup_root.clone(), self.view.pod.clone()) else {
            return;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let wanted: Vec<(String, String)> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter(|c| !super::is_trainlet_container(c))
            .filter_map(|c| {
                let id = self.view.status(&c.name)?.container_id.clone()?;
                Some((c.name.clone(), id))
            })
            .collect();
        let before = self.watched.len();
        self.watched.retain(|w| {
            wanted
                .iter()
                .any(|(n, id)| *n == w.container && *id == w.container_id)
        });
        if self.watched.len() != before {
            // Indexes changed: restart every notifier with its new index.
            let old: Vec<Watched> = std::mem::take(&mut self.watched);
            for mut w in old {
                let (c, id, cg) = (
                    w.container.clone(),
                    w.container_id.clone(),
                    w.cgroup.clone(),
                );
                if let Some(h) = w.notifier.take() {
                    h.abort();
                }
                self.watch_cgroup(c, id, cg);
            }
        }
        for (name, id) in wanted {
            if self.watched.iter().any(|w| w.container == name) {
                continue;
            }
            match oom::find_container_cgroup(&root, &uid, &id) {
                Some((version, path)) => {
                    self.watch_cgroup(name, id, Cgroup { version, path });
                }
                None => {
                    self.errors.insert(
                        format!("oom:{name}"),
                        format!(
                            "no cgroup of container {name} ({id}) for pod UID {uid} under --cgroup-root {}",
                            root.display()
                        ),
                    );
                }
            }
        }
    }

    fn any_polled(&self) -> bool {
        self.watched.iter().any(|w| w.notifier.is_none())
    }

    /// Reads the counters; each increase becomes OOM kills, attributed to processes
    /// in exec mode.
    async fn check_oom(&mut self, notified: bool) {
        if notified && self.cfg.mode == Mode::Exec {
            // v1 signals before the kill: the victim may still be in /proc now.
            self.refresh_tree();
        }
        let mut rose = false;
        for i in 0..self.watched.len() {
            let now = match self.watched[i].cgroup.counters() {
                Ok(c) => c,
                Err(e) => {
                    debug!("{e}");
                    continue;
                }
            };
            let last = self.watched[i].last;
            let since = self.watched[i].checked_at;
            self.watched[i].last = now;
            self.watched[i].checked_at = Instant::now();
            let kills = now.oom_kill.saturating_sub(last.oom_kill);
            let group = now.oom_group_kill > last.oom_group_kill;
            if kills == 0 {
                if now.under_oom || notified {
                    // Under OOM, the kill is about to happen: look again soon.
                    self.oom_recheck_until = Some(Instant::now() + Duration::from_secs(2));
                }
                continue;
            }
            rose = true;
            self.record_cgroup_kills(i, kills, group, since).await;
        }
        if rose {
            self.oom_recheck_until = None;
            if self.cfg.mode == Mode::Exec {
                self.refresh_tree();
            }
        }
    }

    async fn record_cgroup_kills(&mut self, i: usize, kills: u64, group: bool, since: Instant) {
        let container = self.watched[i].container.clone();
        let cg = self.watched[i].cgroup.clone();
        let victims = if self.cfg.mode == Mode::Exec {
            // The counter rises as the victim is sent SIGKILL; give it a moment to die.
            let mut picked = Vec::new();
            let mut gone = BTreeSet::new();
            for attempt in 0..20 {
                gone = self
                    .recent
                    .keys()
                    .copied()
                    .filter(|pid| oom::is_gone(&self.proc_root, *pid, self.page_size))
                    .collect();
                // The first choice gets 250 ms to die before the second counts.
                picked =
                    oom::pick_victims(&self.recent, &gone, since, kills as usize, attempt >= 5);
                if picked.len() >= kills as usize {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Whatever vanished is accounted for now, victim or not.
            self.recent
                .retain(|pid, p| !gone.contains(pid) && p.vanished.is_none());
            picked
        } else {
            Vec::new()
        };
        let (usage, peak) = cg.usage();
        let limit = cg.limit().map(oom::quantity).or_else(|| {
            self.view
                .pod
                .as_ref()
                .and_then(|p| super::training_container(p, Some(&container)))
                .and_then(super::memory_limit)
        });
        let now = SystemTime::now();
        for k in 0..kills as usize {
            let kill = OomKill {
                time: oom::rfc3339(now),
                container: container.clone(),
                source: "cgroup",
                process: victims.get(k).cloned(),
                group,
                memory_usage: usage,
                memory_peak: peak,
                memory_limit: limit.clone(),
                restart_count: None,
                exit_code: None,
            };
            self.ledger.record_cgroup(kill.clone(), now);
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
        self.events.push_back(("OOMKill", kill.message()));
        self.urgent = true;
    }

    // ----------------------------------------------------------------- publishing

    /// Builds the report from the latest observations and schedules what changed.
    fn evaluate(&mut self) {
        let container = self.container_name();
        let expected = super::expected_gpus(self.cfg.expect_gpus, self.training());
        let mut sources: Vec<String> = self
            .watched
            .iter()
            .map(|w| {
                format!(
                    "cgroup {} {} ({})",
                    match w.cgroup.version {
                        CgroupVersion::V1 => "v1",
                        CgroupVersion::V2 => "v2",
                    },
                    w.cgroup.path.display(),
                    w.how
                )
            })
            .collect();
        if self.link.is_some() {
            sources.push("pod status".into());
        }
        let report = super::assemble(Observed {
            mode: self.cfg.mode.as_str(),
            container: &container,
            since: &self.since,
            gpu: &self.gpu,
            expected: expected.as_ref(),
            ports: &self.ports,
            oom_total: self.ledger.total,
            oom_by_container: &self.ledger.by_container,
            oom_recent: &self.ledger.kills,
            oom_sources: sources,
            errors: self.errors.clone(),
        });
        let json = super::render(&report);
        self.desired = super::annotations(&report, &json);
        let summary = format!(
            "health={} gpus={}/{} nvml={:?} ports={} oom_kills={}",
            report.health.as_str(),
            report.gpu.count,
            expected
                .as_ref()
                .map_or("-".to_string(), |e| e.count.to_string()),
            report.gpu.nvml,
            self.ports
                .iter()
                .map(|(p, s)| format!(
                    "{p}:{}",
                    match s {
                        PortState::Free => "free",
                        PortState::Listening { .. } => "listening",
                        PortState::Conflict { .. } => "conflict",
                        PortState::Unknown { .. } => "unknown",
                    }
                ))
                .collect::<Vec<_>>()
                .join(","),
            report.oom.kills
        );
        if summary != self.logged {
            info!(devices = ?report.gpu.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), "report: {summary}");
            self.logged = summary;
        }

        let m = &self.metrics;
        m.gpus.set(i64::from(report.gpu.count));
        m.gpus_expected
            .set(expected.as_ref().map_or(0, |e| i64::from(e.count)));
        m.health.set(i64::from(report.health == super::Health::Ok));
        // The training container's counter exists from the start, at 0, so that
        // rate() and alerts work before the first kill.
        drop(m.oom_kills.get_or_create(&ContainerLabel {
            container: container.clone(),
        }));
        // No await between clear and set: a scrape on this thread never sees a gap.
        m.port_conflict.clear();
        for (port, state) in &self.ports {
            m.port_conflict
                .get_or_create(&PortLabel {
                    port: port.to_string(),
                })
                .set(i64::from(state.is_conflict()));
        }

        let (notes, urgent) = super::transitions(&mut self.announced, &report);
        for n in notes {
            warn!(reason = n.0, "{}", n.1);
            self.events.push_back(n);
        }
        self.urgent |= urgent;
        self.evaluated = true;
        self.schedule();
    }

    fn publisher(&self) -> Option<&Publisher> {
        self.link.as_ref()?.publisher.as_ref()
    }

    fn schedule(&mut self) {
        if self.publisher().is_none() {
            self.next_publish = None;
            if self.link.is_none() && self.evaluated {
                // Nothing to publish to (exec mode outside a pod): the metrics are
                // the report.
                self.ready.set();
            }
            return;
        }
        let changes = publish::diff(&self.published, &self.desired);
        if changes.is_empty() && self.events.is_empty() {
            self.next_publish = None;
            self.urgent = false;
            if self.evaluated {
                self.ready.set();
            }
            return;
        }
        self.next_publish = Some(self.throttle.due(Instant::now(), self.urgent));
    }

    async fn publish(&mut self) {
        let Some(publisher) = self.publisher().cloned() else {
            return;
        };
        let changes = publish::diff(&self.published, &self.desired);
        if !changes.is_empty() {
            let r = tokio::time::timeout(API_TIMEOUT, publisher.annotate(&changes)).await;
            match r {
                Ok(Ok(())) => {
                    publish::apply(&mut self.published, &changes);
                    self.metrics.annotation_patches.inc();
                    self.throttle.succeeded(Instant::now());
                    self.urgent = false;
                    self.ready.set();
                    let keys: Vec<&str> = changes.keys().map(String::as_str).collect();
                    info!(
                        health = self
                            .published
                            .get(keys::HEALTH)
                            .map(String::as_str)
                            .unwrap_or(""),
                        "annotated the pod: {}",
                        keys.join(", ")
                    );
                }
                Ok(Err(e)) => return self.api_failed(&format!("could not annotate the pod: {e}")),
                Err(_) => {
                    return self.api_failed(&format!(
                        "could not annotate the pod: no answer within {API_TIMEOUT:?}"
                    ));
                }
            }
        }
        while let Some((reason, note)) = self.events.front().cloned() {
            if !self.budget.take(Instant::now()) {
                warn!(reason, "too many Events; dropping: {note}");
                self.events.pop_front();
                continue;
            }
            match tokio::time::timeout(API_TIMEOUT, publisher.warning(reason, &note)).await {
                Ok(Ok(())) => {
                    self.events.pop_front();
                }
                Ok(Err(e)) => {
                    return self.api_failed(&format!("could not emit the {reason} Event: {e}"));
                }
                Err(_) => {
                    return self.api_failed(&format!(
                        "could not emit the {reason} Event: no answer within {API_TIMEOUT:?}"
                    ));
                }
            }
        }
        self.schedule();
    }

    fn api_failed(&mut self, what: &str) {
        self.metrics.api_errors.inc();
        let delay = self.throttle.failed(Instant::now());
        warn!("{what}; retrying in {delay:?}");
        self.next_publish = Some(Instant::now() + delay);
    }

    /// One last publish, bounded in time, when stopping.
    async fn flush(&mut self) {
        if self.next_publish.is_none() {
            return;
        }
        let _ = tokio::time::timeout(FINAL_FLUSH, async {
            // Skip the interval and backoff: this is the last chance.
            self.throttle = Throttle::new(Duration::ZERO);
            self.publish().await;
        })
        .await;
    }

    // ----------------------------------------------------------------- the loop

    /// Runs until a stop signal, `--exit-with-main`, or (exec) CMD's exit.
    async fn run_loop(&mut self, signals: &mut Signals) {
        let mut pods = self.pod_stream();
        let mut next_probe = Instant::now();
        let mut next_fast = Instant::now();
        let far = || Instant::now() + Duration::from_secs(86400);
        loop {
            let fast_period = if self.any_polled()
                || self.oom_recheck_until.is_some_and(|t| t > Instant::now())
            {
                Some(if self.oom_recheck_until.is_some() {
                    Duration::from_millis(100)
                } else {
                    OOM_POLL
                })
            } else {
                // With an OOM notifier (v1 eventfd, v2 inotify) exec mode needs no
                // fast tick: the probe refreshes CMD's tree every --interval and a
                // notification refreshes it at once, while the victim is still in
                // /proc. A 1 s tree refresh here cost 0.1-0.2 % of a core at rest.
                None
            };
            let publish_at = self.next_publish.unwrap_or_else(far);
            tokio::select! {
                sig = signals.recv() => {
                    match sig {
                        Some(signal::SIGCHLD) => self.reap(),
                        Some(s) if self.child.is_some() => self.forward(s),
                        Some(s) => {
                            info!("{}: stopping", signal::name(s));
                            self.stop = true;
                        }
                        None => self.stop = true,
                    }
                }
                ev = next_pod(&mut pods) => {
                    match ev {
                        Some(Ok(pod)) => { self.on_pod(pod); self.evaluate(); }
                        Some(Err(e)) => {
                            self.metrics.api_errors.inc();
                            warn!("watching the own pod: {e}; the watch retries with backoff");
                        }
                        None => pods = None,
                    }
                }
                Some(_idx) = self.oom_rx.recv() => {
                    self.check_oom(true).await;
                    self.evaluate();
                }
                _ = tokio::time::sleep_until(next_probe.into()) => {
                    self.probe();
                    if !self.watched.is_empty() && fast_period.is_none() {
                        // A safety net under the notifiers.
                        self.check_oom(false).await;
                    }
                    self.evaluate();
                    next_probe = Instant::now() + self.cfg.interval;
                }
                _ = tokio::time::sleep_until(next_fast.into()), if fast_period.is_some() => {
                    if self.oom_recheck_until.is_some_and(|t| t <= Instant::now()) {
                        self.oom_recheck_until = None;
                    }
                    let before = self.ledger.total;
                    self.check_oom(false).await;
                    if self.cfg.mode == Mode::Exec
                        && self.tree_at.is_none_or(|t| t.elapsed() >= TREE_REFRESH)
                    {
                        self.refresh_tree();
                    }
                    if self.ledger.total != before {
                        self.evaluate();
                    }
                    next_fast = Instant::now() + fast_period.unwrap_or(OOM_POLL);
                }
                _ = tokio::time::sleep_until(publish_at.into()), if self.next_publish.is_some() => {
                    self.publish().await;
                }
            }
            if self.child.is_some() && self.child_exit.is_some() {
                break;
            }
            if self.stop {
                break;
            }
        }
    }

    // ----------------------------------------------------------------- exec mode

    fn forward(&mut self, sig: i32) {
        let Some(pid) = self.child else { return };
        if self.child_exit.is_some() {
            return;
        }
        debug!("forwarding {} to pid {pid}", signal::name(sig));
        if let Err(e) = signal::send(pid, sig) {
            debug!("could not forward {}: {e}", signal::name(sig));
        }
    }

    /// Reaps every exited child: CMD (whose status becomes trainlet's), and orphans
    /// of CMD's tree that were re-parented to trainlet, the subreaper.
    fn reap(&mut self) {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        loop {
            match waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(WaitStatus::Exited(pid, code)) => {
                    if Some(pid.as_raw() as u32) == self.child {
                        self.child_exit = Some(code);
                    }
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    if Some(pid.as_raw() as u32) == self.child {
                        info!("the command was killed by {}", sig.as_str());
                        self.child_exit = Some(128 + sig as i32);
                    }
                }
                Ok(_) => {}
            }
        }
    }
}

async fn next_pod(
    s: &mut Option<BoxStream<'static, Result<Pod, watcher::Error>>>,
) -> Option<Result<Pod, watcher::Error>> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// Binds the metrics server and spawns it.
fn start_metrics(engine: &Engine, required: bool) -> Result<(), Failure> {
    let Some(addr) = engine.cfg.metrics_addr else {
        return Ok(());
    };
    match metrics::bind(addr) {
        Ok(l) => {
            tokio::spawn(metrics::serve(l, engine.metrics(), engine.readiness()));
            Ok(())
        }
        Err(e) if required => Err(e.into()),
        Err(e) => {
            warn!("{e}; going on without metrics");
            Ok(())
        }
    }
}

/// `trainlet sidecar`.
pub async fn sidecar(cfg: Config, kube: &KubeArgs) -> Result<Code, Failure> {
    let mut engine = Engine::new(cfg);
    let mut signals = Signals::new(&signal::STOP)
        .map_err(|e| Failure::new(Code::Internal, format!("cannot handle signals: {e}")))?;
    start_metrics(&engine, true)?;
    engine.connect(kube).await?;
    if engine.cfg.cgroup_root.is_some() {
        engine.resolve_container_cgroups();
    }
    engine.run_loop(&mut signals).await;
    engine.flush().await;
    Ok(Code::Ok)
}

/// `trainlet exec --report`: runs CMD as a child and reports until it exits. Returns
/// CMD's exit code, or 128+signal.
pub async fn exec(
    mut cfg: Config,
    kube: &KubeArgs,
    mut cmd: std::process::Command,
    program: &str,
    own_port: Option<u16>,
) -> Result<i32, Failure> {
    cfg.ports.extend(own_port);
    let mut engine = Engine::new(cfg);
    // Orphans of CMD's tree are re-parented to trainlet, not to the node's init: they
    // stay visible as CMD's, and trainlet reaps them as PID 1 must.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        debug!("cannot become a child subreaper: {e}");
    }
    let mut wanted = signal::FORWARD.to_vec();
    wanted.push(signal::SIGCHLD);
    let mut signals = Signals::new(&wanted)
        .map_err(|e| Failure::new(Code::Internal, format!("cannot handle signals: {e}")))?;
    start_metrics(&engine, false)?;

    // Before CMD exists: who already listens (such a port is a conflict), and the
    // own cgroup's OOM counters as the baseline.
    if let Ok(l) = ports::scan(&engine.proc_root) {
        engine.pre_spawn = l.iter().map(|l| l.inode).collect();
    }
    match oom::own_cgroup() {
        Ok(cg) => {
            let name = engine.container_name();
            engine.watch_cgroup(name, String::new(), cg);
        }
        Err(e) => {
            warn!("OOM kills of CMD's processes cannot be watched: {e}");
            engine.errors.insert("oom".into(), e.to_string());
        }
    }

    let child = cmd
        .spawn()
        .map_err(|e| crate::cmd::exec::spawn_failure(program, &e))?;
    engine.child = Some(child.id());
    info!(pid = child.id(), "started {program}");
    drop(child);

    match engine.connect(kube).await {
        Ok(()) => {}
        Err(e) => warn!("reporting to the pod is off: {e}"),
    }
    // The name may have changed now that the pod is known.
    if let Some(w) = engine.watched.first_mut()
        && w.container_id.is_empty()
    {
        w.container = engine
            .cfg
            .container
            .clone()
            .or_else(|| engine.view.container(None).map(|c| c.name.clone()))
            .unwrap_or_else(|| "main".into());
    }
    engine.reap();
    if engine.child_exit.is_none() {
        engine.run_loop(&mut signals).await;
    }
    // CMD is gone: one last look at the counters (CMD itself may have been the
    // victim), then the last report.
    engine.check_oom(false).await;
    if engine.evaluated || engine.link.is_some() {
        engine.evaluate();
    }
    engine.flush().await;
    Ok(engine.child_exit.unwrap_or(Code::Internal as i32))
}
