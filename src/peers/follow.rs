//! Coordinated mode, the followers' side: watch the one resolver pod (a label selector
//! that matches only task 0 of the first type) until it carries a published cluster
//! that this agent accepts. One object instead of N: the API server sends each follower
//! a few events, not one per peer and change.
//!
//! Only a *live* resolver pod is believed: not being deleted, not Failed, not
//! Succeeded. A resolver that failed (and that its controller replaces) still carries
//! the cluster it resolved, with the addresses of pods that may be gone; so the watch
//! is on the whole pod, whose phase is in its status, not on its metadata alone.
//!
//! The resolver pod may not exist yet, be deleted, or be replaced: the follower waits
//! for whichever live pod the selector matches, and its timeout names the resolver pod
//! and what it was waiting for. A live resolver whose complete cluster leaves this pod
//! out (a replacement, while nothing on the resolver pod publishes again) is waited for
//! at most `fallback`; then the caller resolves by watching every peer itself.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use thiserror::Error;
use tracing::{info, warn};

use super::store::{self, Store};
use super::wait::{fatal_watch_error, retry_backoff};
use crate::Code;
use crate::kube::KubeError;

/// What a follower makes of a resolver pod.
pub enum Verdict<T> {
    /// The published cluster, accepted.
    Accept(T),
    /// Not (yet) usable, and why: not published, not trainlet's format, not this job.
    Wait(String),
    /// Complete, but without this pod or older than it needs: a cluster from before
    /// this pod was (re)created, which only the resolver publishing again can mend.
    Behind(String),
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
    /// The live resolver kept a cluster that leaves this pod out for `fallback`.
    #[error("{why}")]
    Behind { why: String },
}

impl FollowError {
    pub fn code(&self) -> Code {
        match self {
            FollowError::Kube(e) => e.code(),
            FollowError::Timeout { .. } | FollowError::Behind { .. } => Code::NotReady,
        }
    }
}

/// Whether a resolver pod may be believed: not being deleted, not finished.
pub fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Failed" | "Succeeded"))
}

/// A resolver pod that finished its part (Succeeded, not being deleted): the cluster its
/// annotation holds is the last it published, and stands, as the task it held does
/// ([`crate::cluster::is_finished`]); it publishes no more.
pub fn is_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && phase == Some("Succeeded")
}

/// Why a resolver pod is not live, for messages.
pub fn why_not_live(pod: &Pod) -> String {
    let name = pod.name_any();
    if pod.metadata.deletion_timestamp.is_some() {
        return format!("pod {name:?} is being deleted");
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    format!("pod {name:?} is {}", phase.unwrap_or("gone"))
}

/// Watches the pods `selector` matches in `namespace` (normally one: the resolver)
/// until `verify` accepts a live one, or `timeout` passes, or a live one has been
/// [`Verdict::Behind`] for `fallback`. `task_type` is for messages. `verify` may ask
/// the API server (the own pod, whose address may be newer than the caller's first
/// look) while the watch holds its place; a verdict to wait waits for the next event.
pub async fn follow<T>(
    client: &Client,
    namespace: &str,
    task_type: &str,
    selector: &str,
    timeout: Option<Duration>,
    fallback: Duration,
    mut verify: impl AsyncFnMut(&Pod) -> Verdict<T>,
) -> Result<(T, Duration), FollowError> {
    let start = Instant::now();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let cfg = watcher::Config::default().labels(selector).any_semantic();
    let mut events = watcher(api, cfg)
        .backoff(retry_backoff())
        .modify(|p| p.managed_fields_mut().clear())
        .ready_chunks(64)
        .boxed();
    let mut pods: Store<Pod> = Store::default();
    let mut why = format!("no live pod matches {selector} yet");
    let mut gone: Option<String> = None;
    // Since when a live resolver's cluster has left this pod out.
    let mut behind_since: Option<tokio::time::Instant> = None;
    loop {
        // Wake at the fallback too, not only on the next event.
        let wake = match (deadline, behind_since.map(|b| b + fallback)) {
            (Some(d), Some(f)) => Some(d.min(f)),
            (d, f) => d.or(f),
        };
        let batch = super::next_batch(&mut events, wake).await?;
        if let Some(since) = behind_since
            && since + fallback <= tokio::time::Instant::now()
        {
            return Err(FollowError::Behind { why });
        }
        let Some(batch) = batch else {
            return Err(FollowError::Timeout {
                waited: timeout.unwrap_or_default(),
                task_type: task_type.to_string(),
                selector: selector.to_string(),
                why,
            });
        };
        for ev in batch {
            apply(&mut pods, ev, namespace, &mut gone)?;
        }
        let live = match speakers(&pods, gone.as_deref(), selector) {
            Ok(live) => live,
            Err(w) => {
                behind_since = None;
                why = w;
                continue;
            }
        };
        let mut behind = false;
        for pod in &live {
            let w = match verify(pod).await {
                Verdict::Accept(t) => return Ok((t, start.elapsed())),
                Verdict::Wait(w) => w,
                Verdict::Behind(w) => {
                    behind = true;
                    w
                }
            };
            let w = format!("pod {:?} {w}", pod.name_any());
            if w != why {
                info!("waiting for the resolver: {w}");
            }
            why = w;
        }
        match (behind, behind_since) {
            (true, None) => behind_since = Some(tokio::time::Instant::now()),
            (false, _) => behind_since = None,
            (true, Some(_)) => {}
        }
    }
}

/// One watch event into the store, the name of a deleted pod into `gone`. An error the
/// watch cannot get past ends the follow; the others are logged while it backs off.
fn apply(
    pods: &mut Store<Pod>,
    ev: watcher::Result<watcher::Event<Pod>>,
    namespace: &str,
    gone: &mut Option<String>,
) -> Result<(), FollowError> {
    match ev {
        Ok(ev) => {
            if let watcher::Event::Delete(p) = &ev {
                *gone = Some(p.name_any());
            }
            pods.apply(ev, store::key, |p| p);
        }
        Err(e) => {
            if let Some(fatal) = fatal_watch_error(&e, namespace) {
                return Err(fatal.into());
            }
            warn!(error = %crate::kube::root_cause(&e), "watching the resolver pod failed; retrying");
        }
    }
    Ok(())
}

/// The pods that speak for the resolver: the live ones, or where none is, those that
/// Succeeded (a late pod of a job whose resolver finished first). A pod being deleted
/// or failed is no resolver: its annotation still holds the cluster it resolved,
/// addresses of dead pods among them. Where none speaks, why.
fn speakers(pods: &Store<Pod>, gone: Option<&str>, selector: &str) -> Result<Vec<Pod>, String> {
    let mut live: Vec<Pod> = pods.values().filter(|p| is_live(p)).cloned().collect();
    if live.is_empty() {
        live = pods.values().filter(|p| is_finished(p)).cloned().collect();
    }
    if !live.is_empty() {
        return Ok(live);
    }
    Err(match (gone, pods.values().next()) {
        (_, Some(dead)) => format!("{} and has no live replacement yet", why_not_live(dead)),
        (Some(name), None) => {
            format!("pod {name:?} was deleted and has no live replacement yet")
        }
        (None, None) => format!("no live pod matches {selector} yet"),
    })
}
