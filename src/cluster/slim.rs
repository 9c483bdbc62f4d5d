//! A pod as resolution sees it: parsed from the watch straight into a compact struct
//! holding only the fields resolution reads.
//!
//! Every agent of a job watches every peer, so each pod update is parsed N times across
//! the job, and the agent that resolves the cluster holds all N at once. A full `Pod`
//! brings managedFields, the whole container spec, volumes, tolerations and
//! `last-applied-configuration`: most of the bytes, none of the information. Parsing
//! into this view skips them (serde ignores unknown fields without building values).
//! It is also not a `Pod`: `k8s_openapi`'s `Pod` is 2,248 bytes inline, each
//! `Container` 2,144 and each `ContainerStatus` 752, even when nearly every field is
//! `None`, so a one-container pod cost about 5.5 KiB before any string. Keeping the
//! facts (the named ports, whether an init container runs, the first waiting reason)
//! instead of the structures they come from is what keeps the resolver of a 1,024-pod
//! job within its memory target.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerPort, ContainerState, ContainerStateWaiting, Pod, PodCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

use super::order::INDEX_KEYS;

/// A peer pod, reduced to what resolution reads, behind one pointer: the watch's
/// events, its batches (up to 512 events) and the stores' hash tables then hold 8 bytes
/// per slot instead of the whole struct, empty slots included.
#[derive(Debug, Clone, Default)]
pub struct PeerPod(Box<PeerFacts>);

impl std::ops::Deref for PeerPod {
    type Target = PeerFacts;
    fn deref(&self) -> &PeerFacts {
        &self.0
    }
}

/// What resolution reads of a peer pod.
#[derive(Debug, Clone, Default)]
pub struct PeerFacts {
    /// Name, namespace, uid, resourceVersion, labels, the index annotations, the
    /// deletion timestamp and the owners; nothing else.
    pub metadata: ObjectMeta,
    pub node_name: Option<String>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    /// Every named container port, containers before init containers, in spec order.
    pub named_ports: Vec<(String, i32)>,
    /// `None` until the pod has a status at all.
    pub status: Option<PeerStatus>,
}

/// The parts of a pod's status that say whether it can join the cluster, or why not.
#[derive(Debug, Clone, Default)]
pub struct PeerStatus {
    pub phase: Option<String>,
    pub pod_ip: Option<String>,
    pub host_ip: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// Whether an init container is running (the pod is in `trainlet init`).
    pub init_running: bool,
    /// The `Ready` condition.
    pub ready: Option<Condition>,
    /// The `PodScheduled` condition, when it is `False`.
    pub unscheduled: Option<Condition>,
    /// The first container waiting with a reason, init containers first.
    pub waiting: Option<ContainerStateWaiting>,
}

/// A pod condition without its timestamps (160 bytes inline as `PodCondition`, 72 here).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Condition {
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
}

impl From<PodCondition> for Condition {
    fn from(c: PodCondition) -> Self {
        Condition {
            status: c.status,
            reason: c.reason,
            message: c.message,
        }
    }
}

impl kube::Resource for PeerPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// The own pod, read in full by a GET, seen the way the watch sees its peers. Going
/// through JSON keeps one reduction, the one the watch uses.
impl From<&Pod> for PeerPod {
    fn from(pod: &Pod) -> Self {
        serde_json::to_value(pod)
            .and_then(serde_json::from_value)
            .expect("a serialized Pod parses as its own view: every field of the view is optional")
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct View {
    #[serde(default)]
    metadata: MetaView,
    spec: Option<SpecView>,
    status: Option<StatusView>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaView {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    deletion_timestamp: Option<Time>,
    owner_references: Option<Vec<OwnerReference>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView {
    node_name: Option<String>,
    hostname: Option<String>,
    subdomain: Option<String>,
    #[serde(default)]
    containers: Vec<ContainerView>,
    init_containers: Option<Vec<ContainerView>>,
}

#[derive(Deserialize)]
struct ContainerView {
    ports: Option<Vec<ContainerPort>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusView {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
    reason: Option<String>,
    message: Option<String>,
    conditions: Option<Vec<PodCondition>>,
    container_statuses: Option<Vec<StatusEntry>>,
    init_container_statuses: Option<Vec<StatusEntry>>,
}

#[derive(Deserialize)]
struct StatusEntry {
    state: Option<ContainerState>,
}

impl<'de> Deserialize<'de> for PeerPod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = View::deserialize(d)?;
        let (mut node_name, mut hostname, mut subdomain, mut named_ports) =
            (None, None, None, Vec::new());
        if let Some(s) = v.spec {
            (node_name, hostname, subdomain) = (s.node_name, s.hostname, s.subdomain);
            named_ports = s
                .containers
                .into_iter()
                .chain(s.init_containers.into_iter().flatten())
                .flat_map(|c| c.ports.into_iter().flatten())
                .filter_map(|p| Some((p.name?, p.container_port)))
                .collect();
            named_ports.shrink_to_fit();
        }
        Ok(PeerPod(Box::new(PeerFacts {
            metadata: metadata(v.metadata),
            node_name,
            hostname,
            subdomain,
            named_ports,
            status: v.status.map(status),
        })))
    }
}

/// The metadata resolution reads.
fn metadata(m: MetaView) -> ObjectMeta {
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        // Only the index annotations matter; last-applied-configuration and
        // friends can be kilobytes. An index that is also a label is read from the
        // label, so its annotation (set beside it by Indexed Jobs and JobSets) is
        // dropped: an empty map costs nothing, one entry a whole B-tree node.
        annotations: m
            .annotations
            .map(|a| {
                a.into_iter()
                    .filter(|(k, _)| {
                        INDEX_KEYS.contains(&k.as_str()) || k == super::order::jobset::GLOBAL_INDEX
                    })
                    .filter(|(k, _)| !m.labels.as_ref().is_some_and(|l| l.contains_key(k)))
                    .collect::<BTreeMap<_, _>>()
            })
            .filter(|a| !a.is_empty()),
        labels: m.labels,
        deletion_timestamp: m.deletion_timestamp,
        owner_references: m.owner_references,
        ..Default::default()
    }
}

/// The status resolution and its messages read.
fn status(s: StatusView) -> PeerStatus {
    let conditions = s.conditions.unwrap_or_default();
    let init = s.init_container_statuses.unwrap_or_default();
    let init_running = init
        .iter()
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    let waiting = init
        .into_iter()
        .chain(s.container_statuses.into_iter().flatten())
        .filter_map(|c| c.state?.waiting)
        .find(|w| w.reason.is_some());
    let mut ready = None;
    let mut unscheduled = None;
    for c in conditions {
        if c.type_ == "Ready" && ready.is_none() {
            ready = Some(c.into());
        } else if c.type_ == "PodScheduled" && c.status == "False" && unscheduled.is_none() {
            unscheduled = Some(c.into());
        }
    }
    PeerStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        host_ip: s.host_ip,
        reason: s.reason,
        message: s.message,
        init_running,
        ready,
        unscheduled,
        waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod as the API server sends it, managedFields and all.
    const POD: &str = r#"{
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "w-1", "namespace": "ml", "uid": "u1", "resourceVersion": "42",
        "labels": {"app": "x", "batch.kubernetes.io/job-completion-index": "1"},
        "annotations": {"batch.kubernetes.io/job-completion-index": "1", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "w", "uid": "j1", "controller": true}],
        "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]},
      "spec": {"nodeName": "n1", "hostname": "w-1", "subdomain": "w",
        "containers": [{"name": "tf", "image": "tf:2", "ports": [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}], "resources": {"limits": {"cpu": "1"}}}],
        "volumes": [{"name": "v", "emptyDir": {}}], "tolerations": [{"key": "k", "operator": "Exists"}]},
      "status": {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}], "hostIP": "192.168.1.2",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "tf", "image": "tf:2", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
    }"#;

    #[test]
    fn keeps_what_resolution_reads_and_drops_the_rest() {
        let p: PeerPod = serde_json::from_str(POD).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("w-1"));
        assert_eq!(p.metadata.resource_version.as_deref(), Some("42"));
        assert!(p.metadata.managed_fields.is_none());
        // The index is also a label, so its annotation is dropped, as is
        // last-applied-configuration.
        assert_eq!(p.metadata.annotations, None);
        // Without the label, the index annotation is kept.
        let unlabelled: PeerPod = serde_json::from_str(&POD.replace(
            r#""app": "x", "batch.kubernetes.io/job-completion-index": "1""#,
            r#""app": "x""#,
        ))
        .unwrap();
        assert_eq!(
            unlabelled
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["batch.kubernetes.io/job-completion-index"]
        );
        assert_eq!(
            super::super::order::pod_index(&unlabelled.metadata),
            Some((1, INDEX_KEYS[0]))
        );
        assert_eq!(p.metadata.owner_references.as_ref().unwrap()[0].kind, "Job");
        assert_eq!(
            (
                p.hostname.as_deref(),
                p.subdomain.as_deref(),
                p.node_name.as_deref()
            ),
            (Some("w-1"), Some("w"), Some("n1"))
        );
        assert_eq!(p.named_ports, [("tfjob-port".to_string(), 2222)]);
        let st = p.status.as_ref().unwrap();
        assert_eq!(
            (
                st.phase.as_deref(),
                st.pod_ip.as_deref(),
                st.host_ip.as_deref()
            ),
            (Some("Running"), Some("10.0.0.7"), Some("192.168.1.2"))
        );
        assert_eq!(st.ready.as_ref().unwrap().status, "True");
        assert!(!st.init_running && st.unscheduled.is_none() && st.waiting.is_none());
        assert_eq!(
            super::super::order::pod_index(&p.metadata),
            Some((1, INDEX_KEYS[0]))
        );
    }

    #[test]
    fn keeps_the_facts_of_a_pod_that_is_not_running_yet() {
        let pending = r#"{"metadata": {"name": "w-2"},
          "spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80}, {"name": "tf", "containerPort": 2222}]}],
                   "initContainers": [{"name": "trainlet", "ports": [{"name": "init", "containerPort": 9}]}]},
          "status": {"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"},
                           {"type": "Ready", "status": "False"}],
            "initContainerStatuses": [{"name": "trainlet", "state": {"running": {}}}],
            "containerStatuses": [{"name": "a", "state": {"waiting": {}}}, {"name": "b", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no"}}}]}}"#;
        let p: PeerPod = serde_json::from_str(pending).unwrap();
        assert_eq!(
            p.named_ports,
            [("tf".to_string(), 2222), ("init".to_string(), 9)]
        );
        let st = p.status.clone().unwrap();
        assert!(st.init_running);
        assert_eq!(st.ready.unwrap().status, "False");
        assert_eq!(
            st.unscheduled.unwrap().reason.as_deref(),
            Some("Unschedulable")
        );
        assert_eq!(
            st.waiting.unwrap().reason.as_deref(),
            Some("ImagePullBackOff")
        );
    }

    #[test]
    fn a_full_pod_converts_to_the_same_view_as_its_json() {
        let full: Pod = serde_json::from_str(POD).unwrap();
        let from_json: PeerPod = serde_json::from_str(POD).unwrap();
        assert_eq!(
            format!("{:?}", PeerPod::from(&full)),
            format!("{from_json:?}")
        );
    }

    #[test]
    fn the_view_is_a_fraction_of_a_pod() {
        assert_eq!(size_of::<PeerPod>(), size_of::<usize>());
        // What a one-container pod costs inline as a `Pod`, before any string.
        let pod = size_of::<Pod>()
            + size_of::<k8s_openapi::api::core::v1::Container>()
            + size_of::<k8s_openapi::api::core::v1::ContainerStatus>();
        assert!(
            size_of::<PeerFacts>() * 5 < pod,
            "{} of {pod}",
            size_of::<PeerFacts>()
        );
    }
}
