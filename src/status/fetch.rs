//! What `status` reads: the pods that the selectors match, and the namespace's Events.
//! Two lists (one per selector for the pods), nothing watched, nothing written.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::kube::{KubeError, classify};

/// A Job's pods carry this label (set by the Job controller).
pub const JOB_LABEL: &str = "batch.kubernetes.io/job-name";
/// A JobSet's pods carry this label.
pub const JOBSET_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";

/// The pods any of `selectors` matches in `namespace`, each once.
pub async fn pods(
    client: &Client,
    namespace: &str,
    selectors: &[String],
) -> Result<Vec<Pod>, KubeError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for sel in selectors {
        let list = api
            .list(&ListParams::default().labels(sel))
            .await
            .map_err(|e| classify(&e, "list", "pods", namespace))?;
        for p in list {
            if seen.insert(p.metadata.uid.clone().unwrap_or_default()) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The Events of `namespace` (events.k8s.io/v1; the kubelet's and trainlet's alike).
pub async fn events(client: &Client, namespace: &str) -> Result<Vec<Event>, KubeError> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|e| classify(&e, "list", "events.events.k8s.io", namespace))?
        .items)
}
