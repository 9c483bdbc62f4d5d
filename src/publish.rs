//! What trainlet tells the cluster about its own pod: annotations (JSON merge patch of
//! only the keys that changed) and Events (events.k8s.io/v1, through kube-runtime's
//! recorder, which also folds repeats into a series).
//!
//! Publishing is best effort for `init`: a missing RBAC verb here is logged as a warning,
//! because the TF_CONFIG files are what the job needs, not the annotation.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use thiserror::Error;

use crate::kube::{KubeError, classify};

/// The annotation keys trainlet writes. They are a contract: dashboards and controllers
/// read them.
pub mod keys {
    pub const TASK: &str = "trainlet.io/task";
    pub const GPU_COUNT: &str = "trainlet.io/gpu-count";
    pub const GPU_PRODUCT: &str = "trainlet.io/gpu-product";
    pub const PORT_CONFLICT: &str = "trainlet.io/port-conflict";
    pub const OOM_KILLS: &str = "trainlet.io/oom-kills";
    pub const HEALTH: &str = "trainlet.io/health";
    pub const REPORT: &str = "trainlet.io/report";
}

#[derive(Debug, Error)]
pub enum PublishError {
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// Publishes annotations and Events on one pod.
#[derive(Clone)]
pub struct Publisher {
    api: Api<Pod>,
    pod_name: String,
    namespace: String,
    reference: ObjectReference,
    recorder: Recorder,
}

impl Publisher {
    pub fn new(client: Client, pod: &Pod) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let reporter = Reporter {
            controller: "trainlet".into(),
            instance: Some(pod_name.clone()),
        };
        Publisher {
            api: Api::namespaced(client.clone(), &namespace),
            reference: pod.object_ref(&()),
            recorder: Recorder::new(client, reporter),
            pod_name,
            namespace,
        }
    }

    /// Sets (`Some`) or removes (`None`) annotations with one JSON merge patch.
    pub async fn annotate(
        &self,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), PublishError> {
        if changes.is_empty() {
            return Ok(());
        }
        let patch = serde_json::json!({ "metadata": { "annotations": changes } });
        self.api
            .patch(
                &self.pod_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| classify(&e, "patch", "pods", &self.namespace))?;
        Ok(())
    }

    /// Emits an Event on the pod. `reason` is PascalCase, `note` at most 1 kB.
    pub async fn event(&self, warning: bool, reason: &str, note: &str) -> Result<(), PublishError> {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(truncate(note, 1024)),
            action: reason.into(),
            secondary: None,
        };
        self.recorder
            .publish(&ev, &self.reference)
            .await
            .map_err(|e| classify(&e, "create", "events", &self.namespace))?;
        Ok(())
    }
}

/// Cuts at a character boundary, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(super::truncate("abc", 10), "abc");
        assert_eq!(super::truncate("ééééé", 6), "é...");
    }
}
