//! Waiting for the peer set (`init`): one watch per distinct selector through
//! kube-runtime's watcher, which owns reconnects, relists after `410 Gone`, and backoff. No polling:
//! the number of API requests does not grow with the time spent waiting.
//!
//! Events are taken in batches (everything that is ready at once), so that 256 pods
//! turning Running in one second cost a handful of assessments, not 256.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, stream};
use kube::Client;
use kube::runtime::{WatchStreamExt, watcher};
use thiserror::Error;
use tracing::{debug, info, warn};

use super::owners::{CountError, OwnerCounts};
use super::store::{self, Store};
use super::{Scope, next_batch, selectors};
use crate::Code;
use crate::cluster::PeerPod;
use crate::cluster::{Assessment, Cluster, ClusterError, Resolver, Shortfall, describe};
use crate::kube::{KubeError, classify};

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
    /// No expected count was given and none can be read from an owning controller.
    #[error("cannot determine how many {task_type} pods to expect: {why}")]
    UnknownCount { task_type: String, why: String },
    /// Internal: the server refused a streaming list; retried as list + watch.
    #[error("the API server refused to stream the initial pods: {0}")]
    StreamingUnsupported(String),
}

impl From<CountError> for WaitError {
    fn from(e: CountError) -> Self {
        match e {
            CountError::Kube(k) => WaitError::Kube(k),
            CountError::Unknown { task_type, why } => WaitError::UnknownCount { task_type, why },
        }
    }
}

impl WaitError {
    pub fn code(&self) -> Code {
        match self {
            WaitError::Kube(k) => k.code(),
            WaitError::Cluster(c) => c.code(),
            WaitError::Timeout { .. } => Code::NotReady,
            WaitError::UnknownCount { .. } => Code::Usage,
            WaitError::StreamingUnsupported(_) => Code::Api,
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
/// controller that owns their pods. With `at_least` (elastic jobs: MIN and this pod's
/// uid) the wait ends once MIN pods of all types together are ready, this one among
/// them, and the counts are not needed.
pub async fn wait_for_peers(
    client: &Client,
    scope: &Scope,
    resolver: &Resolver,
    expected: BTreeMap<String, usize>,
    at_least: Option<(usize, &str)>,
    timeout: Option<Duration>,
) -> Result<Resolved, WaitError> {
    let start = Instant::now();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let r = watch(
        client,
        scope,
        resolver,
        expected.clone(),
        at_least,
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
                client, scope, resolver, expected, at_least, timeout, start, deadline, false,
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
    at_least: Option<(usize, &str)>,
    timeout: Option<Duration>,
    start: Instant,
    deadline: Option<tokio::time::Instant>,
    streaming: bool,
) -> Result<Resolved, WaitError> {
    // One watcher per distinct selector string; each delivers its own view.
    let selectors = selectors(resolver);
    let mut events = pod_events(client, scope, &selectors, streaming);
    let mut stores: Vec<Store<PeerPod>> = selectors.iter().map(|_| Store::default()).collect();
    let mut owners = OwnerCounts::default();
    let mut last: Option<Vec<Shortfall>> = None;
    let mut last_log = Instant::now() - Duration::from_secs(60);
    let mut last_error_log = Instant::now() - Duration::from_secs(60);

    loop {
        let Some(batch) = next_batch(&mut events, deadline).await? else {
            // The configured timeout, not the elapsed time: the message stays exact.
            let waited = timeout.unwrap_or_default();
            return Err(WaitError::Timeout {
                waited,
                shortfalls: last.unwrap_or_default(),
            });
        };
        apply(&mut stores, batch, scope, streaming, &mut last_error_log)?;
        if !stores.iter().all(Store::synced) {
            continue;
        }

        let pods = distinct(&stores);

        // Fill in the counts that --expect did not give, from the owning controllers.
        if at_least.is_none() {
            fill_expected(client, resolver, &mut owners, &mut expected, &pods).await?;
        }
        // Derived counts may still be missing; `assess` reports those types as unknown.
        let assessment = match at_least {
            Some((min, own)) => resolver.assess_at_least(&pods, min, own)?,
            None => resolver.assess(&pods, &expected)?,
        };
        match assessment {
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

/// Every store's pods, each once. A pod that several selectors match is in several
/// stores: it counts once, by the store's key. With one selector, the usual job, the
/// store's keys are already distinct and nothing is hashed: this runs on every batch.
fn distinct(stores: &[Store<PeerPod>]) -> Vec<&PeerPod> {
    if let [only] = stores {
        return only.values().collect();
    }
    let mut seen = std::collections::HashSet::new();
    stores
        .iter()
        .flat_map(|s| s.iter())
        .filter(|(k, _)| seen.insert(k.as_str()))
        .map(|(_, p)| p)
        .collect()
}

/// The pods' watch events, from one watcher per selector, tagged with its index and
/// taken in batches. Streaming: the initial state as watch events. Else
/// resourceVersion=0: the initial list is served from the API server's watch cache
/// instead of a quorum read of etcd, and the watch then catches up.
fn pod_events(
    client: &Client,
    scope: &Scope,
    selectors: &[String],
    streaming: bool,
) -> impl Stream<Item = Vec<(usize, watcher::Result<watcher::Event<PeerPod>>)>> + Unpin + use<> {
    let api = scope.api(client);
    let streams = selectors.iter().enumerate().map(|(i, sel)| {
        let cfg = watcher::Config::default().labels(sel);
        let cfg = if streaming {
            cfg.streaming_lists()
        } else {
            cfg.any_semantic()
        };
        // PeerPod parses only the fields resolution reads (see cluster::slim).
        watcher(api.clone(), cfg)
            .backoff(retry_backoff())
            .map(move |ev| (i, ev))
            .boxed()
    });
    stream::select_all(streams).ready_chunks(512)
}

/// One batch of watch events into the stores. An error the watch cannot get past ends
/// the wait; the others are logged (at most every 5 s) while the watcher backs off.
fn apply(
    stores: &mut [Store<PeerPod>],
    batch: Vec<(usize, watcher::Result<watcher::Event<PeerPod>>)>,
    scope: &Scope,
    streaming: bool,
    last_error_log: &mut Instant,
) -> Result<(), WaitError> {
    for (i, ev) in batch {
        match ev {
            Ok(ev) => stores[i].apply(ev, store::key, |p| p),
            Err(e) => {
                if let Some(fatal) = fatal_watch_error(&e, scope.label()) {
                    return Err(fatal.into());
                }
                if streaming
                    && !stores[i].synced()
                    && let Some(why) = streaming_refused(&e)
                {
                    return Err(WaitError::StreamingUnsupported(why));
                }
                if last_error_log.elapsed() > Duration::from_secs(5) {
                    warn!(error = %crate::kube::root_cause(&e), "watching pods failed; retrying with backoff");
                    *last_error_log = Instant::now();
                }
            }
        }
    }
    Ok(())
}

/// The counts of the task types that `--expect` did not give, from the controllers
/// that own their pods, where they tell.
async fn fill_expected(
    client: &Client,
    resolver: &Resolver,
    owners: &mut OwnerCounts,
    expected: &mut BTreeMap<String, usize>,
    pods: &[&PeerPod],
) -> Result<(), WaitError> {
    for job in &resolver.jobs {
        if expected.contains_key(&job.task_type) {
            continue;
        }
        if let Some(n) = owners
            .expected_for(client, resolver, &job.task_type, pods)
            .await?
        {
            info!(task_type = %job.task_type, expected = n, "expected count from the owning controller");
            expected.insert(job.task_type.clone(), n);
        }
    }
    Ok(())
}

/// How the watch retries while the API server is away: 100 ms doubling to 500 ms,
/// with jitter (so at most about 1 s between tries), never giving up.
///
/// kube-runtime's default (client-go's 800 ms doubling to 30 s) is kind to a struggling
/// server, but an agent that waited through a 5 s API server restart then slept about
/// 10 s more before it looked again, with the whole job waiting on it. An init agent
/// is blocked until it sees its peers, and the timeout bounds the whole wait, so it
/// retries at most about once a second (one cheap request per agent) and resumes
/// within a second of the server answering again.
pub(super) fn retry_backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_millis(500))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// Errors that retrying cannot fix: RBAC and authentication. Everything else (the API
/// server restarting, a dropped connection) is retried by the watcher's backoff.
pub(super) fn fatal_watch_error(e: &watcher::Error, ns: &str) -> Option<KubeError> {
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

    fn store_of(uids: &[&str]) -> Store<PeerPod> {
        let mut s = Store::default();
        s.apply(watcher::Event::Init, store::key, |p| p);
        for uid in uids {
            let mut pod = k8s_openapi::api::core::v1::Pod::default();
            pod.metadata.uid = Some((*uid).into());
            s.apply(
                watcher::Event::InitApply(PeerPod::from(&pod)),
                store::key,
                |p| p,
            );
        }
        s.apply(watcher::Event::InitDone, store::key, |p| p);
        s
    }

    fn uids(pods: &[&PeerPod]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.uid.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_pod_that_two_selectors_match_counts_once() {
        let one = [store_of(&["b", "a"])];
        assert_eq!(uids(&distinct(&one)), ["a", "b"]);
        let two = [store_of(&["b", "a"]), store_of(&["c", "a"])];
        assert_eq!(uids(&distinct(&two)), ["a", "b", "c"]);
        assert!(distinct(&[]).is_empty());
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
