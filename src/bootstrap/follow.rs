//! A follower's wait for the resolver pod's published cluster: a resolution from a live
//! resolver, complete, at least as new as this pod needs, that contains this pod at the
//! address the API server reports for it ([`verdict`] is the pure part); and when a
//! live resolver keeps leaving this pod out for [`FALLBACK`], the caller's turn to watch
//! every peer itself.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};
use tracing::warn;

use super::{InitConfig, InitError};
use crate::cluster::published::{self, ANNOTATION, Resolution};
use crate::cluster::{Cluster, PeerPod, Resolver, Task};
use crate::kube::{self as k8s, Identity};
use crate::peers::follow::{Verdict, follow};

/// How long a follower waits on a live resolver whose complete cluster leaves it out,
/// or is older than it needs, before it resolves by watching every peer itself. The
/// reporter on the resolver pod publishes a replacement within a second or two of
/// seeing it with an address; without a reporter there, nothing would.
pub const FALLBACK: Duration = Duration::from_secs(15);

/// What a follower resolved from.
pub(super) struct Followed {
    pub cluster: Cluster,
    pub task: Task,
    pub waited: Duration,
    pub generation: u64,
}

/// A follower's wait: the resolver pod's published cluster, checked against this pod
/// as the API server reports it now (its address may be newer than the pre-flight GET).
/// An error comes with the newest generation a live resolver published.
pub(super) async fn follow_resolver(
    cfg: &InitConfig,
    client: &Client,
    id: &Identity,
    own: &Pod,
    selector: &str,
) -> Result<Followed, (InitError, u64)> {
    let resolver = &cfg.cluster.resolver;
    let types: Vec<&str> = resolver.jobs.iter().map(|j| j.task_type.as_str()).collect();
    let first = types.first().copied().unwrap_or_default();
    let own_uid = own.uid().unwrap_or_default();
    let own_uid = own_uid.as_str();
    let min_generation = cfg.min_generation.unwrap_or(0);
    // The own address as the pre-flight GET saw it; asked again only if it differs.
    let mut own_address = resolver
        .address_of(&PeerPod::from(own))
        .map_err(|e| (e.into(), 0))?;
    let mut seen = 0;
    let followed = follow(
        client,
        &id.namespace,
        first,
        selector,
        cfg.timeout,
        FALLBACK,
        async |pod: &Pod| {
            let resolution = match published_by(pod, &id.namespace) {
                Ok(r) => r,
                Err(why) => return Verdict::Wait(why),
            };
            seen = seen.max(resolution.generation);
            let resolution = match verdict(resolution, pod, &types, cfg, own_uid, min_generation) {
                Verdict::Accept(r) => r,
                Verdict::Wait(why) => return Verdict::Wait(why),
                Verdict::Behind(why) => return Verdict::Behind(why),
            };
            let placed = resolution
                .cluster
                .tasks
                .values()
                .flatten()
                .find(|p| p.uid == own_uid)
                .map(|p| p.address.clone());
            if own_address.is_none() || own_address != placed {
                look_again(client, id, resolver, &mut own_address).await;
            }
            let resolver_uid = pod.uid().unwrap_or_default();
            match published::own_task(
                &resolution,
                &types,
                &cfg.cluster.expected,
                &resolver_uid,
                own_uid,
                Some(own_address.as_deref().unwrap_or_default()),
            ) {
                Ok(task) => Verdict::Accept((resolution, task)),
                Err(why) => {
                    warn!("the published cluster does not fit this pod yet: {why}; waiting");
                    Verdict::Wait(format!("carries a cluster this pod cannot use: {why}"))
                }
            }
        },
    )
    .await;
    match followed {
        Ok(((resolution, task), waited)) => Ok(Followed {
            waited,
            generation: resolution.generation,
            cluster: resolution.cluster,
            task,
        }),
        Err(e) => Err((e.into(), seen)),
    }
}

/// The resolution a pod's annotation carries, or why it carries none this pod can use.
fn published_by(pod: &Pod, namespace: &str) -> Result<Resolution, String> {
    let Some(text) = pod.annotations().get(ANNOTATION) else {
        return Err("has not published the cluster yet".into());
    };
    published::decode(text, namespace)
        .map_err(|e| format!("carries a cluster trainlet cannot use: {e}"))
}

/// This pod's address as the API server reports it now. A failed look keeps the old
/// address: the published one then does not fit, and the next event or the timeout
/// says so.
async fn look_again(
    client: &Client,
    id: &Identity,
    resolver: &Resolver,
    own_address: &mut Option<String>,
) {
    match k8s::get_own_pod(client, id).await {
        Ok(fresh) => {
            if let Ok(a) = resolver.address_of(&PeerPod::from(&fresh)) {
                *own_address = a;
            }
        }
        Err(e) => warn!("looking at the own pod again: {e}"),
    }
}

/// What a follower makes of a live resolver pod's resolution (pure).
fn verdict(
    resolution: Resolution,
    pod: &Pod,
    types: &[&str],
    cfg: &InitConfig,
    own_uid: &str,
    min_generation: u64,
) -> Verdict<Resolution> {
    if let Some(task) = resolution.lost.first() {
        return Verdict::Wait(format!(
            "carries a cluster in which task {task} has no live pod yet"
        ));
    }
    if resolution.generation < min_generation {
        return Verdict::Behind(format!(
            "carries a cluster older than the one this pod needs (generation {} < {min_generation})",
            resolution.generation
        ));
    }
    let resolver_uid = pod.uid().unwrap_or_default();
    let contains = resolution
        .cluster
        .tasks
        .values()
        .flatten()
        .any(|p| p.uid == own_uid);
    match published::own_task(
        &resolution,
        types,
        &cfg.cluster.expected,
        &resolver_uid,
        own_uid,
        None,
    ) {
        Ok(_) => Verdict::Accept(resolution),
        Err(why) if !contains => {
            Verdict::Behind(format!("carries a cluster this pod cannot use: {why}"))
        }
        Err(why) => Verdict::Wait(format!("carries a cluster this pod cannot use: {why}")),
    }
}
