//! The reporters' watch on their peers after the start ([`crate::cluster::drift`]):
//! where each task of `cluster.json` stands now.
//!
//! Where the job coordinates (`cluster.json`'s `coordination`), only the resolver pod
//! watches every peer, and publishes the cluster again when a task's pod is lost or
//! replaced ([`PeerWatch::republish`]); every other pod watches the resolver pod alone
//! and compares its files with what it publishes. So a job of N pods costs the API
//! server N watches of one pod and one of N pods, not N² of every pod: with every
//! pod's report patches sent to every other pod's reporter, and each pod object a few
//! KiB, that grows to gigabytes in jobs of thousands. Elsewhere (small jobs, or pods
//! without index labels) every reporter watches every peer, one watch per selector.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::SystemTime;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use super::follow;
use super::store::{self, Store};
use crate::cluster::drift::{self, Drift, Live, Resolved};
use crate::cluster::published::{self, Coordination, CoordinationRole, Resolution};
use crate::cluster::{Cluster, Peer};
use crate::render;
use crate::stall::group::{PeerFailure, PeerRun};
use crate::stall::peers::PeerStall;

/// How long the first report waits for the watches' first lists; a watch that cannot
/// list (no RBAC, the API server away) must not hold the report back.
pub const FIRST_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One event of one watch.
pub type PeerEvent = Result<watcher::Event<Pod>, watcher::Error>;

type Events = BoxStream<'static, (usize, PeerEvent)>;

/// What is watched.
enum Source {
    /// Every peer, one watch per distinct selector: the live pods by (selector, uid);
    /// `buffers` holds a relist in progress.
    Peers {
        selectors: Vec<String>,
        pods: Vec<Store<Live>>,
    },
    /// Coordinated, a follower: the pods the resolver's selector matches (one, or a
    /// replacement beside the pod it replaces).
    Resolver {
        selector: String,
        pods: Store<ResolverPod>,
    },
}

/// What a follower keeps of a resolver pod.
struct ResolverPod {
    name: String,
    uid: String,
    live: bool,
    /// Succeeded: its last published cluster stands where no live pod publishes.
    finished: bool,
    why_not_live: String,
    annotation: Option<String>,
    progress: Option<String>,
}

impl ResolverPod {
    fn of(p: &Pod) -> ResolverPod {
        ResolverPod {
            name: p.name_any(),
            uid: p.uid().unwrap_or_default(),
            live: follow::is_live(p),
            finished: follow::is_finished(p),
            why_not_live: follow::why_not_live(p),
            annotation: p.annotations().get(published::ANNOTATION).cloned(),
            progress: p.annotations().get(crate::publish::keys::PROGRESS).cloned(),
        }
    }
}

pub struct PeerWatch {
    resolved: Vec<Resolved>,
    /// Every task of `cluster.json`, the own one too: what the resolver publishes again.
    peers: Vec<Peer>,
    coordination: Option<Coordination>,
    source: Source,
    namespace: String,
    events: Option<Events>,
    /// Where the tasks stand, once every watch has listed its pods.
    pub drift: Option<Vec<Drift>>,
    /// A follower: the generation of the resolution the drift comes from.
    pub generation: Option<u64>,
    /// The peers that publish a stall, as of the last event ([`PeerWatch::stalled`]).
    stalls: Vec<PeerStall>,
    /// The latest progress any pod published, as of the last event.
    latest: Option<SystemTime>,
    /// The peers' failures and runs of CMD (`--on-failure restart`), as of the last
    /// event.
    group: (Vec<PeerFailure>, Vec<PeerRun>),
}

impl PeerWatch {
    /// The resolved cluster and what to watch, from `cluster.json`; `None` (logged)
    /// when the file is absent or names no selectors.
    pub fn load(path: &Path) -> Option<PeerWatch> {
        if !path.exists() {
            return None;
        }
        let file = match render::read_cluster_file(path) {
            Ok(f) => f,
            Err(e) => {
                warn!("no peer watch: {e}");
                return None;
            }
        };
        let follower = file
            .coordination
            .as_ref()
            .filter(|c| c.role == CoordinationRole::Follower)
            .and_then(|c| c.resolver.clone());
        let source = match follower {
            Some(selector) => Source::Resolver {
                selector,
                pods: Store::default(),
            },
            None if file.selectors.is_empty() => {
                warn!(
                    "no peer watch: {} names no selectors (written by an older trainlet init)",
                    path.display()
                );
                return None;
            }
            None => {
                let selectors: Vec<String> = file
                    .selectors
                    .values()
                    .flatten()
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let pods = selectors.iter().map(|_| Store::default()).collect();
                Source::Peers { selectors, pods }
            }
        };
        Some(PeerWatch {
            resolved: resolved_of(&file),
            peers: file.peers.clone(),
            coordination: file.coordination,
            source,
            namespace: String::new(),
            events: None,
            drift: None,
            generation: None,
            stalls: Vec::new(),
            latest: None,
            group: (Vec::new(), Vec::new()),
        })
    }

    /// Takes the resolved tasks from `cluster.json` again (the sidecar moved them to
    /// their replacements), keeping the watches, which are current; returns whether
    /// where the tasks stand changed.
    pub fn reload(&mut self, path: &Path) -> bool {
        match render::read_cluster_file(path) {
            Ok(file) => {
                self.resolved = resolved_of(&file);
                self.peers = file.peers.clone();
                self.coordination = file.coordination;
            }
            Err(e) => {
                warn!("cannot read the moved cluster: {e}");
                return false;
            }
        }
        self.assess()
    }

    /// Starts the watches, in the own namespace.
    pub fn start(&mut self, client: &Client, namespace: &str) {
        self.namespace = namespace.to_string();
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let watch = |i: usize, sel: &str| {
            watcher(api.clone(), watcher::Config::default().labels(sel))
                .default_backoff()
                .modify(|p| p.managed_fields_mut().clear())
                .map(move |e| (i, e))
                .boxed()
        };
        match &self.source {
            Source::Peers { selectors, .. } => {
                let streams = selectors.iter().enumerate().map(|(i, s)| watch(i, s));
                self.events = Some(futures::stream::select_all(streams).boxed());
                info!(
                    tasks = self.resolved.len(),
                    selectors = ?selectors,
                    "watching the peers of the resolved cluster"
                );
            }
            Source::Resolver { selector, .. } => {
                self.events = Some(watch(0, selector));
                info!(
                    tasks = self.resolved.len(),
                    resolver = %selector,
                    "watching the resolver pod, which watches the peers of the resolved cluster"
                );
            }
        }
    }

    /// Applies one watch event; returns whether where the tasks stand changed.
    pub fn on_event(&mut self, i: usize, ev: PeerEvent) -> bool {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                warn!("watching the peers: {e}; the watch retries with backoff");
                return false;
            }
        };
        match &mut self.source {
            Source::Peers { pods, .. } => pods[i].apply(ev, store::key, |p: Pod| {
                let status = p.status.as_ref();
                Live::of(
                    &p.metadata,
                    status.and_then(|s| s.pod_ip.clone()),
                    status.and_then(|s| s.phase.clone()),
                    p.spec.as_ref().and_then(|s| s.node_name.clone()),
                )
            }),
            Source::Resolver { pods, .. } => pods.apply(ev, store::key, |p| ResolverPod::of(&p)),
        }
        let stalls = self.stalled();
        let latest = self.latest_progress(None);
        let group = (self.failures(), self.runs());
        let progress_changed =
            stalls != self.stalls || latest != self.latest || group != self.group;
        self.stalls = stalls;
        self.latest = latest;
        self.group = group;
        self.assess() | progress_changed
    }

    /// The live pods' names and `trainlet.io/progress`: every peer's, or a follower's
    /// resolver pod's alone.
    fn progress_annotations(&self) -> Vec<(&str, &str)> {
        match &self.source {
            Source::Peers { pods, .. } => pods
                .iter()
                .flat_map(Store::values)
                .filter(|p| !p.deleting)
                .filter_map(|p| Some((p.name.as_str(), p.progress.as_deref()?)))
                .collect(),
            Source::Resolver { pods, .. } => pods
                .values()
                .filter(|p| p.live)
                .filter_map(|p| Some((p.name.as_str(), p.progress.as_deref()?)))
                .collect(),
        }
    }

    /// The live peers whose reporters publish a stall (`trainlet.io/progress`), with
    /// since when they make no progress, by pod name. A follower of a coordinated job
    /// sees the resolver pod's, and those the resolver pod relays.
    pub fn stalled(&self) -> Vec<PeerStall> {
        let mut out: Vec<PeerStall> = self
            .progress_annotations()
            .into_iter()
            .flat_map(|(name, text)| crate::stall::peers::stalls_in(name, text))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The live pods whose reporters publish a failure that asks for a restart
    /// (`--on-failure restart`), by pod name. A follower of a coordinated job sees the
    /// resolver pod's alone.
    pub fn failures(&self) -> Vec<PeerFailure> {
        let mut out: Vec<PeerFailure> = self
            .progress_annotations()
            .into_iter()
            .filter_map(|(name, text)| crate::stall::peers::failure_in(name, text))
            .collect();
        out.sort();
        out
    }

    /// The live pods' runs of CMD, for the restart barrier, by pod name.
    pub fn runs(&self) -> Vec<PeerRun> {
        let mut out: Vec<PeerRun> = self
            .progress_annotations()
            .into_iter()
            .filter_map(|(name, text)| crate::stall::peers::run_in(name, text))
            .collect();
        out.sort();
        out
    }

    /// The latest progress a live pod other than `own` published
    /// (`trainlet.io/progress`'s `at`): whether the job makes progress beyond this pod.
    pub fn latest_progress(&self, own: Option<&str>) -> Option<SystemTime> {
        self.progress_annotations()
            .into_iter()
            .filter(|(name, _)| Some(*name) != own)
            .filter_map(|(_, text)| crate::stall::peers::peer_progress(text))
            .max()
    }

    /// Where the tasks stand now; whether that changed.
    fn assess(&mut self) -> bool {
        let drift = match &self.source {
            Source::Peers { pods, .. } => {
                if !pods.iter().all(Store::synced) {
                    return false;
                }
                // A resolved pod's slot is learned while it is alive, so its replacement
                // is recognised after it is gone.
                for r in self.resolved.iter_mut().filter(|r| r.slot.is_empty()) {
                    if let Some(p) = pods.iter().find_map(|m| m.get(&r.uid)) {
                        r.slot = p.slot.clone();
                    }
                }
                drift::assess(&self.resolved, pods.iter().flat_map(Store::values))
            }
            Source::Resolver { pods, .. } => {
                if !pods.synced() {
                    return false;
                }
                let (drift, generation) = self.against_resolver(pods);
                self.generation = generation;
                drift
            }
        };
        let drift = Some(drift);
        let changed = drift != self.drift;
        self.drift = drift;
        changed
    }

    /// A follower: its files against the resolution of the live resolver pod.
    fn against_resolver(&self, pods: &Store<ResolverPod>) -> (Vec<Drift>, Option<u64>) {
        let Some(c) = &self.coordination else {
            return (Vec::new(), None);
        };
        let task = c.resolver_task();
        // A resolver that Succeeded finished its part; the cluster it published last
        // stands (it tracks no replacement after that).
        let believed = pods.values().find(|p| p.live);
        let Some(pod) = believed.or_else(|| pods.values().find(|p| p.finished)) else {
            let why = match pods.values().next() {
                Some(dead) => format!("the resolver {}", dead.why_not_live),
                None => "no live resolver pod".to_string(),
            };
            return (drift::resolver_gone(&self.resolved, &task, &why), None);
        };
        let decoded = pod
            .annotation
            .as_deref()
            .map(|t| published::decode(t, &self.namespace));
        let resolution = match decoded {
            Some(Ok(r)) if self.carried_by(&r, &pod.uid) => r,
            Some(Ok(_)) | None => {
                // A new resolver pod still resolving, or one that carries another
                // pod's cluster: the resolver's task has no pod to speak for it yet.
                let why = format!(
                    "the resolver pod {} has not published the cluster yet",
                    pod.name
                );
                return (drift::resolver_gone(&self.resolved, &task, &why), None);
            }
            Some(Err(e)) => {
                let why = format!(
                    "the resolver pod {} carries no usable cluster: {e}",
                    pod.name
                );
                return (drift::resolver_gone(&self.resolved, &task, &why), None);
            }
        };
        if resolution.generation < c.generation {
            // These files are newer than anything the resolver published (this pod
            // resolved on its own): nothing to compare with yet.
            let current = self
                .resolved
                .iter()
                .map(|r| Drift {
                    task: r.task(),
                    was: crate::cluster::address::host(&r.address).to_string(),
                    held: drift::Held::Current,
                })
                .collect();
            return (current, Some(c.generation));
        }
        (
            drift::against_published(&self.resolved, &resolution),
            Some(resolution.generation),
        )
    }

    /// Whether a resolution is the one `uid`'s pod resolved: its first task is that pod.
    fn carried_by(&self, r: &Resolution, uid: &str) -> bool {
        let first = self
            .coordination
            .as_ref()
            .and_then(|c| c.types.first())
            .map_or("", String::as_str);
        r.cluster.task(first, 0).is_some_and(|p| p.uid == uid)
    }

    /// The resolver pod of a coordinated job: the other pods' stalls, to relay to the
    /// followers (which watch it alone); nothing on other pods.
    pub fn to_relay(&self, own: Option<&str>) -> Vec<PeerStall> {
        let resolver = self
            .coordination
            .as_ref()
            .is_some_and(|c| c.role == CoordinationRole::Resolver);
        if !resolver {
            return Vec::new();
        }
        let mut stalls: Vec<PeerStall> = self
            .stalled()
            .into_iter()
            .filter(|s| Some(s.pod.as_str()) != own)
            .collect();
        stalls.sort_by_key(|s| s.since);
        stalls
    }

    /// The resolver pod's reporter: the cluster as it stands now (replacements moved in,
    /// lost tasks listed) and the types' order, to publish again; `None` on other pods
    /// and before every watch has listed its pods.
    pub fn republish(&self) -> Option<(Cluster, Vec<String>, &[String])> {
        let c = self
            .coordination
            .as_ref()
            .filter(|c| c.role == CoordinationRole::Resolver)?;
        let drift = self.drift.as_deref()?;
        let (cluster, lost) = drift::current(&self.peers, drift);
        Some((cluster, lost, &c.types))
    }
}

/// The resolved tasks of a `cluster.json`. The own task is left out: when the own pod
/// goes, so does this watch, and its containers are not to restart for it.
fn resolved_of(file: &render::ClusterFile) -> Vec<Resolved> {
    file.peers
        .iter()
        .filter(|p| p.task_type != file.task.task_type || p.index != file.task.index)
        .map(|p| Resolved {
            task_type: p.task_type.clone(),
            index: p.index,
            name: p.name.clone(),
            uid: p.uid.clone(),
            slot: p.slot.clone(),
            address: p.address.clone(),
        })
        .collect()
}

/// The next peer event, or never without a watch.
pub async fn next_event(w: &mut Option<PeerWatch>) -> Option<(usize, PeerEvent)> {
    crate::stream::next_or_pending(&mut w.as_mut().and_then(|w| w.events.as_mut())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer deleted before the watch first listed the pods is never seen alive: its
    /// replacement is known by the slot that init recorded in cluster.json.
    #[test]
    fn the_resolved_tasks_carry_the_slots_init_recorded() {
        let file: render::ClusterFile = serde_json::from_value(serde_json::json!({
            "cluster": {"worker": ["10.0.0.6:8470", "10.0.0.7:8470"]},
            "task": {"type": "worker", "index": 1},
            "master": "grpc://10.0.0.6:8470",
            "peers": [
                {"name": "w-0-aaaa", "type": "worker", "index": 0, "address": "10.0.0.6:8470",
                 "node": "n1", "uid": "u0", "slot": "job/w/0"},
                {"name": "w-1-aaaa", "type": "worker", "index": 1, "address": "10.0.0.7:8470",
                 "node": "n2", "uid": "u1", "slot": "job/w/1"}
            ],
            "resolved_at": "2026-01-01T00:00:00Z",
            "waited_seconds": 0.0
        }))
        .unwrap();
        let resolved = resolved_of(&file);
        assert_eq!(resolved.len(), 1, "the own task is left out");
        assert_eq!(resolved[0].slot, "job/w/0");
        let replacement = crate::cluster::drift::Live {
            name: "w-0-bbbb".into(),
            uid: "u0b".into(),
            slot: "job/w/0".into(),
            ip: Some("10.0.0.19".into()),
            phase: Some("Running".into()),
            deleting: false,
            node: Some("n1".into()),
            progress: None,
        };
        assert_eq!(
            drift::annotation(&drift::assess(&resolved, [&replacement])),
            "stale: worker/0 10.0.0.6 → 10.0.0.19"
        );
    }
}
