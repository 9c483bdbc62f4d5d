//! Pods from short specs, and the kubelet player that writes their status (this
//! control plane has no kubelet and no scheduler).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// A pod from a short spec. Build it, then `create` it.
#[derive(Clone)]
pub struct PodSpec {
    pub name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    ports: Vec<(String, i32)>,
    hostname: Option<String>,
    subdomain: Option<String>,
    gpus: Option<u32>,
    /// Further limits of the container, e.g. `nvidia.com/mig-1g.10gb`.
    limits: BTreeMap<String, String>,
    container: String,
    owner: Option<Value>,
    service_account: Option<String>,
    host_network: bool,
}

pub fn pod(name: &str) -> PodSpec {
    PodSpec {
        name: name.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        ports: Vec::new(),
        hostname: None,
        subdomain: None,
        gpus: None,
        limits: BTreeMap::new(),
        container: "trainer".into(),
        owner: None,
        service_account: None,
        host_network: false,
    }
}

impl PodSpec {
    /// Labels in selector syntax: `app=mnist,role=worker`.
    pub fn labels(mut self, spec: &str) -> Self {
        for kv in spec.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').expect("k=v");
            self.labels.insert(k.into(), v.into());
        }
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }
    pub fn port(mut self, name: &str, port: i32) -> Self {
        self.ports.push((name.into(), port));
        self
    }
    pub fn dns(mut self, hostname: &str, subdomain: &str) -> Self {
        self.hostname = Some(hostname.into());
        self.subdomain = Some(subdomain.into());
        self
    }
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus = Some(n);
        self
    }
    /// A limit of the container (an extended resource such as
    /// `nvidia.com/mig-1g.10gb`: `2`).
    pub fn limit(mut self, resource: &str, value: &str) -> Self {
        self.limits.insert(resource.into(), value.into());
        self
    }
    pub fn container(mut self, name: &str) -> Self {
        self.container = name.into();
        self
    }
    pub fn host_network(mut self) -> Self {
        self.host_network = true;
        self
    }
    pub fn service_account(mut self, sa: &str) -> Self {
        self.service_account = Some(sa.into());
        self
    }
    /// A controller owner reference, as the Job or StatefulSet controller would set.
    pub fn owned_by(mut self, api_version: &str, kind: &str, name: &str, uid: &str) -> Self {
        self.owner = Some(
            json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}),
        );
        self
    }

    pub fn to_pod(&self) -> Pod {
        let mut container = json!({"name": self.container, "image": "registry.example/train:1"});
        if !self.ports.is_empty() {
            container["ports"] = self
                .ports
                .iter()
                .map(|(n, p)| json!({"name": n, "containerPort": p}))
                .collect();
        }
        let mut limits = self.limits.clone();
        if let Some(n) = self.gpus {
            limits.insert("nvidia.com/gpu".into(), n.to_string());
        }
        if !limits.is_empty() {
            container["resources"] = json!({ "limits": limits });
        }
        let mut spec = json!({"containers": [container], "restartPolicy": "Never"});
        if let Some(h) = &self.hostname {
            spec["hostname"] = json!(h);
        }
        if let Some(s) = &self.subdomain {
            spec["subdomain"] = json!(s);
        }
        if let Some(sa) = &self.service_account {
            spec["serviceAccountName"] = json!(sa);
        }
        if self.host_network {
            spec["hostNetwork"] = json!(true);
        }
        let mut meta =
            json!({"name": self.name, "labels": self.labels, "annotations": self.annotations});
        if let Some(o) = &self.owner {
            meta["ownerReferences"] = json!([o]);
        }
        serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
    }

    pub async fn create(&self, client: &Client, ns: &str) -> Pod {
        Api::<Pod>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &self.to_pod())
            .await
            .unwrap_or_else(|e| panic!("create pod {}: {e}", self.name))
    }
}

/// Plays the kubelet (and the scheduler): binds pods to nodes and writes their status
/// through the status subresource, as the real ones do.
#[derive(Clone)]
pub struct Kubelet {
    pub api: Api<Pod>,
}

impl Kubelet {
    pub fn new(client: &Client, ns: &str) -> Self {
        Kubelet {
            api: Api::namespaced(client.clone(), ns),
        }
    }

    /// Sets spec.nodeName through the binding subresource, as the scheduler does.
    pub async fn bind(&self, pod: &str, node: &str) {
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
        self.api
            .create_subresource::<Value, Value>("binding", pod, &PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("bind {pod}: {e}"));
    }

    /// Writes a merge patch to the status subresource and returns the updated pod.
    pub async fn status(&self, pod: &str, status: Value) -> Pod {
        self.api
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap_or_else(|e| panic!("patch status of {pod}: {e}"))
    }

    /// Scheduled and running with this pod IP (and Ready, with a started container).
    pub async fn run(&self, pod: &str, ip: &str) -> Pod {
        self.bind(pod, "node-a").await;
        self.running(pod, ip).await
    }

    /// Running with this IP; the pod must be bound already.
    pub async fn running(&self, pod: &str, ip: &str) -> Pod {
        let p = self.api.get(pod).await.unwrap();
        let container = p.spec.as_ref().unwrap().containers[0].name.clone();
        self.running_as(pod, ip, &container).await
    }

    /// Running with this IP, for a pod whose (first) container is `container`: one
    /// request, for benchmarks that count the API server's requests.
    pub async fn running_as(&self, pod: &str, ip: &str, container: &str) -> Pod {
        let now = now();
        self.status(
            pod,
            json!({
                "phase": "Running",
                "podIP": ip, "podIPs": [{"ip": ip}],
                "hostIP": "192.168.0.10", "hostIPs": [{"ip": "192.168.0.10"}],
                "startTime": now,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now}
                ],
                "containerStatuses": [{
                    "name": container, "image": "registry.example/train:1", "imageID": "",
                    "ready": true, "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": now}}
                }]
            }),
        )
        .await
    }

    /// Pending and unschedulable, with the scheduler's message.
    pub async fn unschedulable(&self, pod: &str, message: &str) -> Pod {
        self.status(
            pod,
            json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message, "lastTransitionTime": now()}]
            }),
        )
        .await
    }

    /// Sets only the phase.
    pub async fn phase(&self, pod: &str, phase: &str) -> Pod {
        self.status(pod, json!({ "phase": phase })).await
    }

    /// Running, and the container restarted once after an OOM kill.
    pub async fn oom_killed(&self, pod: &str, container: &str, restarts: i32) -> Pod {
        self.oom_killed_at(pod, container, restarts, std::time::SystemTime::now())
            .await
    }

    /// `oom_killed`, the container having finished at `at` (and restarted then).
    pub async fn oom_killed_at(
        &self,
        pod: &str,
        container: &str,
        restarts: i32,
        at: std::time::SystemTime,
    ) -> Pod {
        let now = humantime::format_rfc3339_seconds(at).to_string();
        self.status(
            pod,
            json!({
                "containerStatuses": [{
                    "name": container, "image": "registry.example/train:1", "imageID": "",
                    "ready": true, "restartCount": restarts, "started": true,
                    "state": {"running": {"startedAt": now}},
                    "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": now, "finishedAt": now}}
                }]
            }),
        )
        .await
    }
}

pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
