//! Waiting for the peer set: one list plus watch per selector through kube-runtime's
//! watcher, which owns reconnects, relists after `410 Gone`, and backoff. No polling:
//! the number of API requests does not grow with the time spent waiting.
//!
//! Events are taken in batches (everything that is ready at once), so that 256 pods
//! turning Running in one second cost a handful of assessments, not 256.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job as BatchJob;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::cluster::slim::PeerPod;
use crate::cluster::{Assessment, Cluster, ClusterError, Resolver, Shortfall};
use crate::kube::{KubeError, classify};
use crate::{Code, Failure};

/// Where peers are looked for.
#[derive(Debug, Clone)]
pub enum Scope {
    Namespace(String),
    All,
}

impl Scope {
    pub(crate) fn api(&self, client: &Client) -> Api<PeerPod> {
        match self {
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
            Scope::All => Api::all(client.clone()),
        }
    }

    pub(crate) fn label(&self) -> &str {
        match self {
            Scope::Namespace(ns) => ns,
            Scope::All => "(all namespaces)",
        }
    }
}

#[derive(Debug, Error)]
pub enum WaitError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("peers not ready after {}: {}", humantime::format_duration(*waited), describe(shortfalls))]
    Timeout {
        waited: Duration,
        shortfalls: Vec<Shortfall>,
    },
    #[error(
        "cannot determine how many {task_type} pods to expect: {why}; pass --expect {task_type}=N"
    )]
    UnknownCount { task_type: String, why: String },
    /// Internal: the server refused a streaming list; retried as list + watch.
    #[error("the API server refused to stream the initial pods: {0}")]
    StreamingUnsupported(String),
}

pub fn describe(shortfalls: &[Shortfall]) -> String {
    shortfalls
        .iter()
        .map(Shortfall::describe)
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<WaitError> for Failure {
    fn from(e: WaitError) -> Self {
        match e {
            WaitError::Kube(k) => k.into(),
            WaitError::Cluster(c) => c.into(),
            WaitError::Timeout { .. } => Failure::new(Code::NotReady, e.to_string()),
            WaitError::UnknownCount { .. } => Failure::new(Code::Usage, e.to_string()),
            WaitError::StreamingUnsupported(_) => Failure::new(Code::Api, e.to_string()),
        }
    }
}

/// The result of a successful wait.
pub struct Resolved {
    pub cluster: Cluster,
    pub waited: Duration,
    pub expected: BTreeMap<String, usize>,
}

/// Watches the peers until the cluster is complete or `timeout` passes (`None`: never).
///
/// `expected` holds the counts given by `--expect`; other types get theirs from the
/// controller that owns their pods.
pub async fn wait_for_peers(
    client: &Client,
    scope: &Scope,
    resolver: &Resolver,
    expected: BTreeMap<String, usize>,
    timeout: Option<Duration>,
) -> Result<Resolved, WaitError> {
    let start = Instant::now();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let r = watch(
        client,
        scope,
        resolver,
        expected.clone(),
        timeout,
        start,
        deadline,
        true,
    )
    .await;
    match r {
        Err(WaitError::StreamingUnsupported(why)) => {
            info!("the API server does not stream initial events ({why}); using list + watch");
            watch(
                client, scope, resolver, expected, timeout, start, deadline, false,
            )
            .await
        }
        r => r,
    }
}

/// One attempt. With `streaming`, each selector's initial state arrives as watch events
/// (`sendInitialEvents`, the WatchList feature, on by default in Kubernetes 1.34; off
/// in 1.33): one
/// request instead of a list plus a watch, and no list body held in memory. Servers
/// without it refuse the parameters, and the caller falls back to list + watch.
#[allow(clippy::too_many_arguments)]
async fn watch(
    client: &Client,
    scope: &Scope,
    resolver: &Resolver,
    mut expected: BTreeMap<String, usize>,
    timeout: Option<Duration>,
    start: Instant,
    deadline: Option<tokio::time::Instant>,
    streaming: bool,
) -> Result<Resolved, WaitError> {
    // One watcher per distinct selector string; each delivers its own view.
    let mut selectors: Vec<String> = Vec::new();
    for job in &resolver.jobs {
        for s in &job.selectors {
            let s = s.to_string();
            if !selectors.contains(&s) {
                selectors.push(s);
            }
        }
    }
    let api = scope.api(client);
    let streams = selectors.iter().enumerate().map(|(i, sel)| {
        // Streaming: the initial state as watch events. Else resourceVersion=0: the
        // initial list is served from the API server's watch cache instead of a quorum
        // read of etcd, and the watch then catches up.
        let cfg = watcher::Config::default().labels(sel);
        let cfg = if streaming {
            cfg.streaming_lists()
        } else {
            cfg.any_semantic()
        };
        // PeerPod parses only the fields resolution reads (see cluster::slim).
        watcher(api.clone(), cfg)
            .default_backoff()
            .map(move |ev| (i, ev))
            .boxed()
    });
    let mut events = stream::select_all(streams).ready_chunks(512);

    let mut stores: Vec<HashMap<String, PeerPod>> = vec![HashMap::new(); selectors.len()];
    let mut buffers: Vec<HashMap<String, PeerPod>> = vec![HashMap::new(); selectors.len()];
    let mut synced = vec![false; selectors.len()];
    let mut owners = OwnerCounts::default();
    let mut last: Option<Vec<Shortfall>> = None;
    let mut last_log = Instant::now() - Duration::from_secs(60);
    let mut last_error_log = Instant::now() - Duration::from_secs(60);

    loop {
        let batch = match deadline {
            Some(d) => tokio::select! {
                b = events.next() => b,
                _ = tokio::time::sleep_until(d) => {
                    // The configured timeout, not the elapsed time: the message stays exact.
                    let waited = timeout.unwrap_or_default();
                    return Err(WaitError::Timeout { waited, shortfalls: last.unwrap_or_default() });
                }
            },
            None => events.next().await,
        };
        let Some(batch) = batch else {
            // The watchers never end on their own; treat it like a broken connection.
            return Err(KubeError::Unreachable {
                verb: "watch".into(),
                resource: "pods".into(),
                message: "watch stream ended".into(),
            }
            .into());
        };
        for (i, ev) in batch {
            match ev {
                Ok(watcher::Event::Init) => buffers[i].clear(),
                Ok(watcher::Event::InitApply(p)) => {
                    buffers[i].insert(key(&p.0), p);
                }
                Ok(watcher::Event::InitDone) => {
                    std::mem::swap(&mut stores[i], &mut buffers[i]);
                    buffers[i].clear();
                    synced[i] = true;
                }
                Ok(watcher::Event::Apply(p)) => {
                    stores[i].insert(key(&p.0), p);
                }
                Ok(watcher::Event::Delete(p)) => {
                    stores[i].remove(&key(&p.0));
                }
                Err(e) => {
                    if let Some(fatal) = fatal_watch_error(&e, scope.label()) {
                        return Err(fatal.into());
                    }
                    if streaming
                        && !synced[i]
                        && let Some(why) = streaming_refused(&e)
                    {
                        return Err(WaitError::StreamingUnsupported(why));
                    }
                    if last_error_log.elapsed() > Duration::from_secs(5) {
                        warn!(error = %crate::kube::root_cause(&e), "watching pods failed; retrying with backoff");
                        last_error_log = Instant::now();
                    }
                }
            }
        }
        if !synced.iter().all(|s| *s) {
            continue;
        }

        // A pod that several selectors match is in several stores: count it once, by
        // the store's key (no allocation on this per-batch path).
        let mut seen = std::collections::HashSet::new();
        let pods: Vec<&Pod> = stores
            .iter()
            .flat_map(|s| s.iter())
            .filter(|(k, _)| seen.insert(k.as_str()))
            .map(|(_, p)| &p.0)
            .collect();

        // Fill in the counts that --expect did not give, from the owning controllers.
        for job in &resolver.jobs {
            if expected.contains_key(&job.task_type) {
                continue;
            }
            if let Some(n) = owners
                .expected_for(client, resolver, &job.task_type, &pods)
                .await?
            {
                info!(task_type = %job.task_type, expected = n, "expected count from the owning controller");
                expected.insert(job.task_type.clone(), n);
            }
        }
        // Derived counts may still be missing; `assess` reports those types as unknown.
        match resolver.assess(&pods, &expected)? {
            Assessment::Complete(cluster) => {
                return Ok(Resolved {
                    cluster,
                    waited: start.elapsed(),
                    expected,
                });
            }
            Assessment::Waiting(shortfalls) => {
                if last.as_ref() != Some(&shortfalls) {
                    if last_log.elapsed() >= Duration::from_secs(2) {
                        info!("waiting for peers: {}", describe(&shortfalls));
                        last_log = Instant::now();
                    } else {
                        debug!("waiting for peers: {}", describe(&shortfalls));
                    }
                    last = Some(shortfalls);
                }
            }
        }
    }
}

fn key(p: &Pod) -> String {
    p.metadata
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
}

/// Errors that retrying cannot fix: RBAC and authentication. Everything else (the API
/// server restarting, a dropped connection) is retried by the watcher's backoff.
fn fatal_watch_error(e: &watcher::Error, ns: &str) -> Option<KubeError> {
    let (verb, err) = match e {
        watcher::Error::InitialListFailed(err) => ("list", err),
        watcher::Error::WatchStartFailed(err) | watcher::Error::WatchFailed(err) => ("watch", err),
        watcher::Error::WatchError(status) if matches!(status.code, 401 | 403) => {
            return Some(classify(
                &kube::Error::Api(status.clone()),
                "watch",
                "pods",
                ns,
            ));
        }
        _ => return None,
    };
    match err {
        kube::Error::Api(s) if matches!(s.code, 401 | 403) => Some(classify(err, verb, "pods", ns)),
        _ => None,
    }
}

/// A server without the WatchList feature answers `sendInitialEvents` with 400 or 422
/// (Invalid: "sendInitialEvents is forbidden ..."); that is a reason to fall back, not
/// to retry.
fn streaming_refused(e: &watcher::Error) -> Option<String> {
    let status = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s,
        _ => return None,
    };
    matches!(status.code, 400 | 422).then(|| format!("{} ({})", status.message, status.code))
}

/// Expected counts read from the controllers that own the pods, cached by owner uid.
#[derive(Default)]
struct OwnerCounts {
    by_uid: HashMap<String, usize>,
}

impl OwnerCounts {
    /// The expected count of a type: the sum over the distinct controllers that own its
    /// live pods. `None` while no pod of the type has been seen.
    async fn expected_for(
        &mut self,
        client: &Client,
        resolver: &Resolver,
        task_type: &str,
        pods: &[&Pod],
    ) -> Result<Option<usize>, WaitError> {
        let members: Vec<&Pod> = pods
            .iter()
            .copied()
            .filter(|p| crate::cluster::is_live(p) && resolver.types_of(p).contains(&task_type))
            .collect();
        if members.is_empty() {
            return Ok(None);
        }
        let mut total = 0;
        let mut counted = std::collections::HashSet::new();
        for pod in members {
            let name = pod.name_any();
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .ok_or_else(|| WaitError::UnknownCount {
                    task_type: task_type.into(),
                    why: format!("pod {name:?} has no owning Job, StatefulSet or ReplicaSet"),
                })?;
            if !counted.insert(owner.uid.clone()) {
                continue;
            }
            if let Some(n) = self.by_uid.get(&owner.uid) {
                total += n;
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let n = owner_count(client, &ns, &owner.kind, &owner.name)
                .await?
                .ok_or_else(|| WaitError::UnknownCount {
                    task_type: task_type.into(),
                    why: format!(
                        "pod {name:?} is owned by {} {:?}, which does not say how many pods it wants",
                        owner.kind, owner.name
                    ),
                })?;
            self.by_uid.insert(owner.uid.clone(), n);
            total += n;
        }
        Ok(Some(total))
    }
}

/// Job: completions when Indexed, else parallelism. StatefulSet, ReplicaSet: replicas.
async fn owner_count(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
) -> Result<Option<usize>, KubeError> {
    async fn get<K>(client: &Client, ns: &str, name: &str, resource: &str) -> Result<K, KubeError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::<K>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .map_err(|e| classify(&e, "get", resource, ns))
    }
    let n = match kind {
        "Job" => {
            let job: BatchJob = get(client, ns, name, "jobs").await?;
            let spec = job.spec.unwrap_or_default();
            if spec.completion_mode.as_deref() == Some("Indexed") {
                spec.completions
            } else {
                spec.parallelism.or(Some(1))
            }
        }
        "StatefulSet" => get::<StatefulSet>(client, ns, name, "statefulsets")
            .await?
            .spec
            .and_then(|s| s.replicas)
            .or(Some(1)),
        "ReplicaSet" => get::<ReplicaSet>(client, ns, name, "replicasets")
            .await?
            .spec
            .and_then(|s| s.replicas)
            .or(Some(1)),
        _ => None,
    };
    Ok(n.and_then(|n| usize::try_from(n).ok()).filter(|n| *n > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_refused_streaming_list_falls_back_but_rbac_and_outages_do_not() {
        let refused = watcher::Error::WatchStartFailed(api(
            422,
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        ));
        assert_eq!(
            streaming_refused(&refused).as_deref(),
            Some(
                "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled (422)"
            )
        );
        assert_eq!(
            streaming_refused(&watcher::Error::WatchStartFailed(api(403, "forbidden"))),
            None
        );
        assert_eq!(
            streaming_refused(&watcher::Error::WatchStartFailed(api(503, "unavailable"))),
            None
        );
        let forbidden = fatal_watch_error(
            &watcher::Error::WatchStartFailed(api(403, "pods is forbidden")),
            "ns",
        )
        .unwrap();
        assert!(
            forbidden
                .to_string()
                .starts_with("forbidden: cannot watch pods in namespace \"ns\""),
            "{forbidden}"
        );
        assert!(
            fatal_watch_error(&watcher::Error::InitialListFailed(api(500, "etcd")), "ns").is_none()
        );
    }
}
