//! Coordinated mode, the followers' side: watch the one resolver pod (a label selector
//! that matches only task 0 of the first type) until it carries a published cluster
//! that this agent accepts. One object instead of N: the API server sends each follower
//! a few events, not one per peer and change; and only the pod's metadata, where the
//! annotation is (a metadata watch), not its spec and status with every update.
//!
//! The resolver pod may not exist yet, be deleted, or be replaced: the follower waits
//! for whichever live pod the selector matches, and its timeout names the resolver pod
//! and what it was waiting for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use thiserror::Error;
use tracing::{info, warn};

use super::watch::{fatal_watch_error, retry_backoff};
use crate::Code;
use crate::kube::KubeError;

/// What a follower makes of a resolver pod.
pub enum Verdict<T> {
    /// The published cluster, accepted.
    Accept(T),
    /// Not (yet) usable, and why: not published, not trainlet's format, not this job.
    Wait(String),
}

#[derive(Debug, Error)]
pub enum FollowError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(
        "peers not ready after {}: waiting for the cluster from the resolver pod (task 0 of {task_type}, {selector}): {why}",
        humantime::format_duration(*waited)
    )]
    Timeout {
        waited: Duration,
        task_type: String,
        selector: String,
        why: String,
    },
}

impl FollowError {
    pub fn code(&self) -> Code {
        match self {
            FollowError::Kube(e) => e.code(),
            FollowError::Timeout { .. } => Code::NotReady,
        }
    }
}

/// Watches the pods `selector` matches in `namespace` (normally one: the resolver)
/// until `verify` accepts one, or `timeout` passes. `task_type` is for messages.
pub async fn follow<T>(
    client: &Client,
    namespace: &str,
    task_type: &str,
    selector: &str,
    timeout: Option<Duration>,
    mut verify: impl FnMut(&PartialObjectMeta<Pod>) -> Verdict<T>,
) -> Result<(T, Duration), FollowError> {
    let start = Instant::now();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    // An Api of PartialObjectMeta makes metadata-only requests.
    let api: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), namespace);
    let cfg = watcher::Config::default().labels(selector).any_semantic();
    let mut events = watcher(api, cfg)
        .backoff(retry_backoff())
        .ready_chunks(64)
        .boxed();
    let mut pods: HashMap<String, PartialObjectMeta<Pod>> = HashMap::new();
    let mut init: HashMap<String, PartialObjectMeta<Pod>> = HashMap::new();
    let mut why = format!("no live pod matches {selector} yet");
    let mut gone: Option<String> = None;
    loop {
        let Some(batch) = super::next_batch(&mut events, deadline).await? else {
            return Err(FollowError::Timeout {
                waited: timeout.unwrap_or_default(),
                task_type: task_type.to_string(),
                selector: selector.to_string(),
                why,
            });
        };
        for ev in batch {
            match ev {
                Ok(watcher::Event::Init) => init.clear(),
                Ok(watcher::Event::InitApply(p)) => {
                    init.insert(p.uid().unwrap_or_default(), p);
                }
                Ok(watcher::Event::InitDone) => pods = std::mem::take(&mut init),
                Ok(watcher::Event::Apply(p)) => {
                    pods.insert(p.uid().unwrap_or_default(), p);
                }
                Ok(watcher::Event::Delete(p)) => {
                    pods.remove(&p.uid().unwrap_or_default());
                    gone = Some(p.name_any());
                }
                Err(e) => {
                    if let Some(fatal) = fatal_watch_error(&e, namespace) {
                        return Err(fatal.into());
                    }
                    warn!(error = %crate::kube::root_cause(&e), "watching the resolver pod failed; retrying");
                }
            }
        }
        // Metadata only: a pod being deleted is gone; a finished resolver's annotation
        // still holds the cluster it resolved.
        let live: Vec<&PartialObjectMeta<Pod>> = pods
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if live.is_empty() {
            why = match &gone {
                Some(name) => format!("pod {name:?} was deleted and has no live replacement yet"),
                None => format!("no live pod matches {selector} yet"),
            };
            continue;
        }
        for pod in live {
            match verify(pod) {
                Verdict::Accept(t) => return Ok((t, start.elapsed())),
                Verdict::Wait(w) => {
                    let w = format!("pod {:?} {w}", pod.name_any());
                    if w != why {
                        info!("waiting for the resolver: {w}");
                    }
                    why = w;
                }
            }
        }
    }
}
