//! The sidecar's watch on its peers after the start ([`crate::cluster::drift`]): the
//! pods of the job types `cluster.json` was resolved from, one long-lived watch per
//! selector, and where each resolved task stands now.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::cluster::drift::{self, Drift, Live, Resolved};
use crate::tfconfig;

/// How long the first report waits for the watches' first lists; a watch that cannot
/// list (no RBAC, the API server away) must not hold the report back.
pub(super) const FIRST_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One event of one selector's watch.
pub(super) type PeerEvent = Result<watcher::Event<Pod>, watcher::Error>;

type Events = BoxStream<'static, (usize, PeerEvent)>;

pub(super) struct PeerWatch {
    resolved: Vec<Resolved>,
    selectors: Vec<String>,
    /// The live pods, by (selector, uid); `buffers` holds a relist in progress.
    pods: Vec<BTreeMap<String, Live>>,
    buffers: Vec<BTreeMap<String, Live>>,
    events: Option<Events>,
    /// Each selector's first list is complete: before that, every task would look lost.
    synced: Vec<bool>,
    /// Where the tasks stand, once every watch has listed its pods.
    pub drift: Option<Vec<Drift>>,
}

impl PeerWatch {
    /// The resolved cluster and its selectors from `cluster.json`; `None` (logged)
    /// when the file is absent or names no selectors.
    pub fn load(path: &Path) -> Option<PeerWatch> {
        if !path.exists() {
            return None;
        }
        let file = match tfconfig::read_cluster_file(path) {
            Ok(f) => f,
            Err(e) => {
                warn!("no peer watch: {e}");
                return None;
            }
        };
        if file.selectors.is_empty() {
            warn!(
                "no peer watch: {} names no selectors (written by an older trainlet init)",
                path.display()
            );
            return None;
        }
        let selectors: Vec<String> = file
            .selectors
            .values()
            .flatten()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let n = selectors.len();
        Some(PeerWatch {
            resolved: resolved_of(&file),
            selectors,
            pods: vec![BTreeMap::new(); n],
            buffers: vec![BTreeMap::new(); n],
            events: None,
            synced: vec![false; n],
            drift: None,
        })
    }

    /// Takes the resolved tasks from `cluster.json` again (the sidecar moved them to
    /// their replacements), keeping the watches, which are current; returns whether
    /// where the tasks stand changed.
    pub fn reload(&mut self, path: &Path) -> bool {
        match tfconfig::read_cluster_file(path) {
            Ok(file) => self.resolved = resolved_of(&file),
            Err(e) => {
                warn!("cannot read the moved cluster: {e}");
                return false;
            }
        }
        self.assess()
    }

    /// Starts the watches, in the own namespace.
    pub fn start(&mut self, client: &Client, namespace: &str) {
        let streams = self.selectors.iter().enumerate().map(|(i, sel)| {
            let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
            watcher(api, watcher::Config::default().labels(sel))
                .default_backoff()
                .map(move |e| (i, e))
                .boxed()
        });
        self.events = Some(futures::stream::select_all(streams).boxed());
        info!(
            tasks = self.resolved.len(),
            selectors = ?self.selectors,
            "watching the peers of the resolved cluster"
        );
    }

    /// Applies one watch event; returns whether where the tasks stand changed.
    pub fn on_event(&mut self, i: usize, ev: PeerEvent) -> bool {
        let live = |p: &Pod| {
            let status = p.status.as_ref();
            Live::of(
                &p.metadata,
                status.and_then(|s| s.pod_ip.clone()),
                status.and_then(|s| s.phase.clone()),
            )
        };
        match ev {
            Ok(watcher::Event::Init) => self.buffers[i].clear(),
            Ok(watcher::Event::InitApply(p)) => {
                let l = live(&p);
                self.buffers[i].insert(l.uid.clone(), l);
            }
            Ok(watcher::Event::InitDone) => {
                std::mem::swap(&mut self.pods[i], &mut self.buffers[i]);
                self.buffers[i].clear();
                self.synced[i] = true;
            }
            Ok(watcher::Event::Apply(p)) => {
                let l = live(&p);
                self.pods[i].insert(l.uid.clone(), l);
            }
            Ok(watcher::Event::Delete(p)) => {
                self.pods[i].remove(p.metadata.uid.as_deref().unwrap_or_default());
            }
            Err(e) => {
                warn!("watching the peers: {e}; the watch retries with backoff");
                return false;
            }
        }
        self.assess()
    }

    /// Where the tasks stand among the pods now; whether that changed.
    fn assess(&mut self) -> bool {
        if !self.synced.iter().all(|s| *s) {
            return false;
        }
        // A resolved pod's slot is learned while it is alive, so its replacement is
        // recognised after it is gone.
        for r in self.resolved.iter_mut().filter(|r| r.slot.is_empty()) {
            if let Some(p) = self.pods.iter().find_map(|m| m.get(&r.uid)) {
                r.slot = p.slot.clone();
            }
        }
        let drift = Some(drift::assess(
            &self.resolved,
            self.pods.iter().flat_map(|m| m.values()),
        ));
        let changed = drift != self.drift;
        self.drift = drift;
        changed
    }
}

/// The resolved tasks of a `cluster.json`. The own task is left out: when the own pod
/// goes, so does this watch, and its containers are not to restart for it.
fn resolved_of(file: &tfconfig::ClusterFile) -> Vec<Resolved> {
    file.peers
        .iter()
        .filter(|p| p.task_type != file.task.task_type || p.index != file.task.index)
        .map(|p| Resolved {
            task_type: p.task_type.clone(),
            index: p.index,
            name: p.name.clone(),
            uid: p.uid.clone(),
            slot: String::new(),
            address: p.address.clone(),
        })
        .collect()
}

/// The next peer event, or never without a watch.
pub(super) async fn next_event(w: &mut Option<PeerWatch>) -> Option<(usize, PeerEvent)> {
    match w.as_mut().and_then(|w| w.events.as_mut()) {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}
