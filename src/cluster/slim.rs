//! A pod as the watch delivers it, cut down while it is parsed to the fields that
//! resolution reads.
//!
//! Every agent of a job watches every peer, so each pod update is parsed N times across
//! the job. A full `Pod` brings managedFields, the whole container spec, volumes,
//! tolerations and `last-applied-configuration`: most of the bytes, none of the
//! information. Parsing into this view skips them (serde ignores unknown fields without
//! building values), which cut the agents' CPU time and their peak RSS at N = 256.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ContainerState, ContainerStatus, Pod, PodCondition, PodSpec,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

use super::order::INDEX_KEYS;

/// A `Pod` holding only what trainlet reads. It is still a `Pod`, so the pure functions
/// of this module work on it unchanged.
#[derive(Debug, Clone)]
pub struct PeerPod(pub Pod);

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
    name: String,
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
    name: String,
    state: Option<ContainerState>,
}

impl<'de> Deserialize<'de> for PeerPod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = View::deserialize(d)?;
        let containers = |cs: Vec<ContainerView>| -> Vec<Container> {
            cs.into_iter()
                .map(|c| Container {
                    name: c.name,
                    ports: c.ports,
                    ..Default::default()
                })
                .collect()
        };
        let statuses = |ss: Option<Vec<StatusEntry>>| {
            ss.map(|ss| {
                ss.into_iter()
                    .map(|s| ContainerStatus {
                        name: s.name,
                        state: s.state,
                        ..Default::default()
                    })
                    .collect()
            })
        };
        let m = v.metadata;
        Ok(PeerPod(Pod {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                labels: m.labels,
                // Only the index annotations matter; last-applied-configuration and
                // friends can be kilobytes.
                annotations: m.annotations.map(|a| {
                    a.into_iter()
                        .filter(|(k, _)| INDEX_KEYS.contains(&k.as_str()))
                        .collect()
                }),
                deletion_timestamp: m.deletion_timestamp,
                owner_references: m.owner_references,
                ..Default::default()
            },
            spec: v.spec.map(|s| PodSpec {
                node_name: s.node_name,
                hostname: s.hostname,
                subdomain: s.subdomain,
                containers: containers(s.containers),
                init_containers: s.init_containers.map(containers),
                ..Default::default()
            }),
            status: v.status.map(|s| PodStatus {
                phase: s.phase,
                pod_ip: s.pod_ip,
                host_ip: s.host_ip,
                reason: s.reason,
                message: s.message,
                conditions: s.conditions,
                container_statuses: statuses(s.container_statuses),
                init_container_statuses: statuses(s.init_container_statuses),
                ..Default::default()
            }),
        }))
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
        let PeerPod(p) = serde_json::from_str(POD).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("w-1"));
        assert_eq!(p.metadata.resource_version.as_deref(), Some("42"));
        assert!(p.metadata.managed_fields.is_none());
        assert_eq!(
            p.metadata
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["batch.kubernetes.io/job-completion-index"]
        );
        assert_eq!(p.metadata.owner_references.as_ref().unwrap()[0].kind, "Job");
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            (spec.hostname.as_deref(), spec.subdomain.as_deref()),
            (Some("w-1"), Some("w"))
        );
        assert_eq!(
            spec.containers[0].ports.as_ref().unwrap()[0].container_port,
            2222
        );
        assert!(spec.containers[0].image.is_none() && spec.volumes.is_none());
        let st = p.status.as_ref().unwrap();
        assert_eq!(
            (st.phase.as_deref(), st.pod_ip.as_deref()),
            (Some("Running"), Some("10.0.0.7"))
        );
        assert!(
            st.container_statuses.as_ref().unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .running
                .is_some()
        );
        assert_eq!(super::super::order::pod_index(&p), Some((1, INDEX_KEYS[0])));
    }
}
