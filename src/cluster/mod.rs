//! The cluster, as TensorFlow sees it: job types, their pods in a stable order, and an
//! address for each. Everything here is pure: pods in, a cluster or a shortfall out.
//!
//! Fixes to TensorFlow's `KubernetesClusterResolver`, each on purpose:
//! - peers come from one namespace unless `--all-namespaces` is asked for;
//! - order follows the pods' own index, else natural name order (`w-2` < `w-10`);
//! - addresses are pod IPs by default (host IPs collide when two pods share a node);
//! - this pod's own task is resolved, not left to the user;
//! - a peer that is not ready yet is waited for, not an exception.

pub mod address;
pub mod config;
pub mod drift;
pub mod order;
pub mod published;
mod readiness;
mod resolver;
pub mod selector;
pub mod slim;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Code;
pub use config::{ClusterConfig, Namespaces};
pub use readiness::{Assessment, Shortfall, describe, is_live, phase, readiness};
pub use resolver::Resolver;
use selector::Selector;
pub use slim::PeerPod;

/// Errors in the cluster's definition or in the peers found.
///
/// The messages say what is wrong in the cluster's own terms; `cli::lower` adds the flag
/// that fixes it where one does (`--task-type`, `--address dns`), because only the CLI
/// knows its flags.
#[derive(Debug, Error, PartialEq)]
pub enum ClusterError {
    #[error("{0}")]
    Inconsistent(String),
    /// The own pod matches no job type's selectors.
    #[error(
        "this pod {pod:?} matches none of the job selectors ({jobs}); fix its labels or the selectors"
    )]
    OwnPodUnmatched { pod: String, jobs: String },
    /// The own pod matches the selectors of several job types.
    #[error(
        "this pod {pod:?} matches the selectors of several job types ({types}); make the selectors disjoint"
    )]
    OwnPodAmbiguous { pod: String, types: String },
    /// An explicitly given own task type that the cluster does not have.
    #[error("task type {task_type:?} is not a job type of the cluster ({summary})")]
    TaskTypeNotInCluster { task_type: String, summary: String },
    /// An explicitly given own task index beyond the type's tasks.
    #[error("task index {index} is out of range: {task_type} has {tasks} tasks")]
    TaskIndexOutOfRange {
        index: usize,
        task_type: String,
        tasks: usize,
    },
    /// DNS addresses were asked for, but a peer has no stable DNS name.
    #[error(
        "pod {pod:?} has no spec.hostname and spec.subdomain, which DNS addresses need ({DNS_ADVICE})"
    )]
    NoDnsName { pod: String },
}

/// How to give pods stable DNS names, for [`ClusterError::NoDnsName`].
pub const DNS_ADVICE: &str = "use a StatefulSet with serviceName, or an Indexed Job with subdomain set, and a headless Service";

impl ClusterError {
    /// The exit code: a problem with the peers found is "inconsistent", anything else is
    /// a configuration the user must change.
    pub fn code(&self) -> Code {
        match self {
            ClusterError::Inconsistent(_)
            | ClusterError::OwnPodUnmatched { .. }
            | ClusterError::OwnPodAmbiguous { .. }
            | ClusterError::TaskTypeNotInCluster { .. }
            | ClusterError::TaskIndexOutOfRange { .. } => Code::Inconsistent,
            _ => Code::Usage,
        }
    }
}

/// How a task's address is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressMode {
    /// The pod IP.
    PodIp,
    /// The node's host IP, for `hostNetwork` pods.
    HostIp,
    /// `<hostname>.<subdomain>.<namespace>.svc.<cluster-domain>`.
    Dns,
}

/// The order of tasks within a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderMode {
    /// The pods' own index (Job completion, StatefulSet, Kubeflow), else natural names.
    Index,
    /// TensorFlow's plain lexicographic order of names.
    Name,
}

/// When a peer counts as ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyMode {
    /// Running (or Pending in its init containers) with an address.
    Running,
    /// Also the pod's Ready condition.
    Ready,
}

/// One TensorFlow job type (`ps`, `worker`, ...) and the selectors of its pods, whose
/// matches are concatenated in this order.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub task_type: String,
    pub selectors: Vec<Selector>,
}

/// Adds a selector to a job type, creating the type after the existing ones: types keep
/// the order of their first appearance, and several selectors of one type concatenate
/// their pods in the order given, as TensorFlow does.
pub fn add_selector(jobs: &mut Vec<Job>, ty: &str, sel: Selector) {
    match jobs.iter_mut().find(|j| j.task_type == ty) {
        Some(j) => j.selectors.push(sel),
        None => jobs.push(Job {
            task_type: ty.to_string(),
            selectors: vec![sel],
        }),
    }
}

/// Whether a name is an RFC 1123 DNS label, as namespace names are: at most 63
/// characters of `[a-z0-9-]`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    is_short_name(s, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'
    })
}

/// The shape Kubernetes gives its short names (a DNS label, a label's name or value):
/// 1 to 63 bytes that `allowed` takes, the first and the last alphanumeric.
pub fn is_short_name(s: &str, allowed: impl Fn(u8) -> bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| allowed(c))
}

/// Task types become JSON keys and env values; keep them to what TensorFlow and the
/// operators use (`chief`, `ps`, `worker`, `evaluator`, ...).
pub fn validate_task_type(ty: &str) -> Result<(), String> {
    let ok = ty.len() <= 63
        && ty.starts_with(|c: char| c.is_ascii_alphabetic())
        && ty
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "task type {ty:?} must start with a letter and contain only letters, digits, '_' and '-'"
        ))
    }
}

/// One task of the resolved cluster, as `cluster.json` lists it too (the fields it
/// leaves out are `serde(skip)`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Peer {
    pub name: String,
    #[serde(rename = "type")]
    pub task_type: String,
    pub index: usize,
    pub address: String,
    pub node: Option<String>,
    pub uid: String,
    #[serde(skip)]
    pub namespace: String,
    /// The pod's `status.podIP` when the cluster was resolved from the pods (not from
    /// the resolver pod's annotation, which does not carry it): what its DNS name must
    /// resolve to with `--address dns`. Not part of a peer's identity.
    #[serde(skip)]
    pub pod_ip: Option<String>,
    /// What its replacement will share with it ([`drift::slot`]), from the pod's labels
    /// when resolved: the peer watch recognises the replacement of a pod that was gone
    /// before the watch first listed the pods. Not part of a peer's identity. Absent in
    /// a `cluster.json` written before it was recorded, or where the cluster came from
    /// a resolver pod's annotation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub slot: String,
    /// The pod was past its init containers (Running, or ended) when resolved: a
    /// replacement's peer whose training process need not answer on the task's port
    /// (the pre-flight does not wait for it). Not part of a peer's identity.
    #[serde(skip)]
    pub past_init: bool,
}

impl PartialEq for Peer {
    fn eq(&self, o: &Self) -> bool {
        (
            &self.name,
            &self.task_type,
            self.index,
            &self.address,
            &self.node,
            &self.uid,
            &self.namespace,
        ) == (
            &o.name,
            &o.task_type,
            o.index,
            &o.address,
            &o.node,
            &o.uid,
            &o.namespace,
        )
    }
}

/// The resolved cluster: every type's tasks, in task-index order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Cluster {
    pub tasks: BTreeMap<String, Vec<Peer>>,
}

impl Cluster {
    /// The `cluster` section of TF_CONFIG: type -> ["host:port", ...], keys sorted.
    pub fn spec(&self) -> BTreeMap<&str, Vec<&str>> {
        self.tasks
            .iter()
            .map(|(t, peers)| {
                (
                    t.as_str(),
                    peers.iter().map(|p| p.address.as_str()).collect(),
                )
            })
            .collect()
    }

    /// `ps:2,worker:4`, for messages.
    pub fn summary(&self) -> String {
        self.tasks
            .iter()
            .map(|(t, p)| format!("{t}:{}", p.len()))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn task(&self, task_type: &str, index: usize) -> Option<&Peer> {
        self.tasks.get(task_type).and_then(|p| p.get(index))
    }
}

/// This process's own task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Task {
    #[serde(rename = "type")]
    pub task_type: String,
    pub index: usize,
}

#[cfg(test)]
mod tests;
