//! `resolve`'s way to the peers: one list per distinct selector, no waiting, as
//! TensorFlow's `cluster_spec()` does. A matched pod that is not ready is an error.

use std::collections::HashSet;

use kube::Client;
use kube::api::ListParams;
use thiserror::Error;

use super::{Scope, selectors};
use crate::Code;
use crate::cluster::PeerPod;
use crate::cluster::{
    Assessment, Cluster, ClusterConfig, ClusterError, Task, describe, is_live, phase, readiness,
};
use crate::kube::{KubeError, classify};

#[derive(Debug, Error)]
pub enum ListError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A matched pod, or a whole type, is not ready now.
    #[error("{0}")]
    NotReady(String),
}

impl ListError {
    pub fn code(&self) -> Code {
        match self {
            ListError::Kube(k) => k.code(),
            ListError::Cluster(c) => c.code(),
            ListError::NotReady(_) => Code::NotReady,
        }
    }
}

/// Lists the peers once and resolves them. The own task is included when `own` (the
/// own pod's name and namespace) is one of the matched pods, or is given by the
/// configuration's task override.
pub async fn resolve_now(
    client: &Client,
    scope: &Scope,
    cfg: &ClusterConfig,
    own: Option<(&str, &str)>,
) -> Result<(Cluster, Option<Task>), ListError> {
    let pods = list_peers(client, scope, cfg).await?;
    let refs: Vec<&PeerPod> = pods.iter().collect();
    let resolver = &cfg.resolver;

    // Like cluster_spec(): every matched pod must be ready now.
    for p in &refs {
        if is_live(p)
            && !resolver.types_of(&p.metadata).is_empty()
            && readiness(p, resolver.ready, resolver.address).is_err()
        {
            return Err(ListError::NotReady(format!(
                "pod {:?} is not running; phase: {:?}",
                p.metadata.name.as_deref().unwrap_or_default(),
                phase(p)
            )));
        }
    }
    // Without expected counts, the pods that exist are the cluster, as in TensorFlow
    // (with the pods that completed their index, as init counts them); but a type
    // without any pod is no cluster at all (a wrong selector or namespace), not an
    // empty list to succeed with.
    let mut expected = cfg.expected.clone();
    for job in &resolver.jobs {
        let n = resolver.members(job, &refs, true)?.len();
        if n == 0 && !expected.contains_key(&job.task_type) {
            let sels: Vec<String> = job.selectors.iter().map(ToString::to_string).collect();
            return Err(ListError::NotReady(format!(
                "no live pod matches job type {} ({}) in {}",
                job.task_type,
                sels.join(" | "),
                match scope {
                    Scope::Namespace(ns) => format!("namespace {ns:?} (does it exist?)"),
                    Scope::All => "any namespace".to_string(),
                }
            )));
        }
        expected.entry(job.task_type.clone()).or_insert(n);
    }
    let cluster = match resolver.assess(&refs, &expected)? {
        Assessment::Complete(c) => c,
        Assessment::Waiting(s) => {
            return Err(ListError::NotReady(format!(
                "peers not ready: {}",
                describe(&s)
            )));
        }
    };
    let task = match &cfg.task_override {
        Some(t) => Some(resolver.own_task(&cluster, "", "", Some(t.clone()))?),
        None => own.and_then(|(name, ns)| {
            cluster
                .tasks
                .values()
                .flatten()
                .find(|p| p.name == name && p.namespace == ns)
                .map(|p| Task {
                    task_type: p.task_type.clone(),
                    index: p.index,
                })
        }),
    };
    Ok((cluster, task))
}

/// One list per distinct selector, deduplicated by uid, parsed into the slim view.
async fn list_peers(
    client: &Client,
    scope: &Scope,
    cfg: &ClusterConfig,
) -> Result<Vec<PeerPod>, KubeError> {
    let api = scope.api(client);
    let mut seen_uid = HashSet::new();
    let mut out = Vec::new();
    for sel in selectors(&cfg.resolver) {
        let list = api
            .list(&ListParams::default().labels(&sel))
            .await
            .map_err(|e| classify(&e, "list", "pods", scope.label()))?;
        for p in list.items {
            if seen_uid.insert(p.metadata.uid.clone().unwrap_or_default()) {
                out.push(p);
            }
        }
    }
    Ok(out)
}
