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
pub mod rehost;
pub mod selector;
pub mod slim;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use thiserror::Error;

use crate::Code;
pub use config::{ClusterConfig, Namespaces};
use selector::{Selector, SelectorExt};
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

/// How a task's address is formed. Derives `clap::ValueEnum` so the CLI can offer it
/// as a flag value; the type itself belongs to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AddressMode {
    /// The pod IP.
    PodIp,
    /// The node's host IP, for `hostNetwork` pods.
    HostIp,
    /// `<hostname>.<subdomain>.<namespace>.svc.<cluster-domain>`.
    Dns,
}

/// The order of tasks within a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OrderMode {
    /// The pods' own index (Job completion, StatefulSet, Kubeflow), else natural names.
    Index,
    /// TensorFlow's plain lexicographic order of names.
    Name,
}

/// When a peer counts as ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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

/// Task types become JSON keys and env values; keep them to what TensorFlow and the
/// operators use (`chief`, `ps`, `worker`, `evaluator`, ...).
/// Whether a name is an RFC 1123 DNS label, as namespace names are: at most 63
/// characters of `[a-z0-9-]`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

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

/// How peers become tasks and addresses.
#[derive(Debug, Clone)]
pub struct Resolver {
    pub jobs: Vec<Job>,
    pub port: u16,
    pub port_name: Option<String>,
    pub address: AddressMode,
    pub cluster_domain: String,
    pub order: OrderMode,
    pub ready: ReadyMode,
}

/// One task of the resolved cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// Why one type is not complete yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Shortfall {
    pub task_type: String,
    /// `None` while the expected count is unknown (no --expect, owner not read yet).
    pub expected: Option<usize>,
    pub live: usize,
    pub ready: usize,
    /// Each live pod that is not ready: its name and why, e.g. `is Pending (Unschedulable: ...)`.
    pub not_ready: Vec<(String, String)>,
}

impl Shortfall {
    /// `worker: expected 3, ready 2 of 2 live (1 missing)`, then the not-ready pods.
    pub fn describe(&self) -> String {
        let mut s = match self.expected {
            Some(n) => format!(
                "{}: expected {n}, ready {} of {} live",
                self.task_type, self.ready, self.live
            ),
            None => format!(
                "{}: expected count unknown (no owning Job, StatefulSet or ReplicaSet seen; pass --expect), ready {} of {} live",
                self.task_type, self.ready, self.live
            ),
        };
        if let Some(n) = self.expected {
            if n > self.live {
                s.push_str(&format!(" ({} missing)", n - self.live));
            } else if n < self.live {
                s.push_str(&format!(" ({} too many)", self.live - n));
            }
        }
        for (name, why) in &self.not_ready {
            s.push_str(&format!("; pod {name:?} {why}"));
        }
        s
    }
}

/// Every shortfall, for messages: `ps: expected 1, ready 0 of 1 live; worker: ...`.
pub fn describe(shortfalls: &[Shortfall]) -> String {
    shortfalls
        .iter()
        .map(Shortfall::describe)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The outcome of looking at the current pods.
#[derive(Debug, Clone, PartialEq)]
pub enum Assessment {
    Complete(Cluster),
    Waiting(Vec<Shortfall>),
}

/// A live pod is a peer: not being deleted, not finished. Pods a Job left behind before
/// a retry are Failed or Succeeded and do not count; their replacements do.
pub fn is_live(pod: &PeerPod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase(pod), "Succeeded" | "Failed")
}

/// The pod's phase; `Pending` until the kubelet writes one.
pub fn phase(pod: &PeerPod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Whether a peer is ready to be part of the cluster, or why not.
///
/// With `running` (the default) a peer counts once it has its address and is either
/// Running or still Pending in its init containers. The second case is what makes
/// trainlet usable as an init container at all: every pod of the job sits in its own
/// `trainlet init` at the same time, Pending with a pod IP, and requiring Running would
/// deadlock them all. A pod that has no IP yet, is unschedulable or pulls images does
/// not count.
pub fn readiness(pod: &PeerPod, mode: ReadyMode, address: AddressMode) -> Result<(), String> {
    let status = pod.status.as_ref();
    let phase = phase(pod);
    let in_init = phase == "Pending" && status.is_some_and(|s| s.init_running);
    if phase != "Running" && !in_init {
        return Err(format!("is {phase}{}", reason_suffix(pod)));
    }
    let has_ip = match address {
        AddressMode::HostIp => status
            .and_then(|s| s.host_ip.as_deref())
            .is_some_and(|ip| !ip.is_empty()),
        // A DNS record of a headless Service exists only once the pod has an IP.
        AddressMode::PodIp | AddressMode::Dns => status
            .and_then(|s| s.pod_ip.as_deref())
            .is_some_and(|ip| !ip.is_empty()),
    };
    if !has_ip {
        let which = if address == AddressMode::HostIp {
            "host IP"
        } else {
            "pod IP"
        };
        return Err(format!("is {phase} but has no {which} yet"));
    }
    if mode == ReadyMode::Ready {
        match status.and_then(|s| s.ready.as_ref()) {
            Some(c) if c.status == "True" => {}
            Some(c) => {
                return Err(format!(
                    "is {phase} but not Ready ({}{})",
                    c.reason.as_deref().unwrap_or("no reason"),
                    c.message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ));
            }
            None => return Err(format!("is {phase} but has no Ready condition yet")),
        }
    }
    Ok(())
}

/// ` (Unschedulable: 0/3 nodes are available...)` or ` (ImagePullBackOff: ...)`: the most
/// useful reason a person would otherwise dig out of `kubectl describe`.
fn reason_suffix(pod: &PeerPod) -> String {
    let Some(status) = pod.status.as_ref() else {
        return " (not scheduled yet)".into();
    };
    let fmt = |reason: &str, message: Option<&str>| match message.filter(|m| !m.is_empty()) {
        Some(m) => format!(" ({reason}: {m})"),
        None => format!(" ({reason})"),
    };
    if let Some(c) = &status.unscheduled {
        return fmt(
            c.reason.as_deref().unwrap_or("NotScheduled"),
            c.message.as_deref(),
        );
    }
    if let Some(w) = &status.waiting {
        return fmt(
            w.reason.as_deref().unwrap_or_default(),
            w.message.as_deref(),
        );
    }
    if let Some(r) = status.reason.as_deref() {
        return fmt(r, status.message.as_deref());
    }
    if pod.node_name.is_none() {
        return " (not scheduled yet)".into();
    }
    String::new()
}

impl Resolver {
    /// The job types whose selectors match this pod.
    pub fn types_of(&self, pod: &ObjectMeta) -> Vec<&str> {
        let empty = BTreeMap::new();
        let labels = pod.labels.as_ref().unwrap_or(&empty);
        self.jobs
            .iter()
            .filter(|j| j.selectors.iter().any(|s| s.matches(labels)))
            .map(|j| j.task_type.as_str())
            .collect()
    }

    /// A pod's address in the cluster (`host:port`), if it has one yet.
    pub fn address_of(&self, pod: &PeerPod) -> Result<Option<String>, ClusterError> {
        Ok(self
            .host(pod)?
            .map(|h| address::join(&h, self.port_of(pod))))
    }

    /// The host part of a peer's address, if it has one yet.
    fn host(&self, pod: &PeerPod) -> Result<Option<String>, ClusterError> {
        let status = pod.status.as_ref();
        let nonempty = |s: Option<&String>| s.filter(|s| !s.is_empty()).cloned();
        Ok(match self.address {
            AddressMode::PodIp => nonempty(status.and_then(|s| s.pod_ip.as_ref())),
            AddressMode::HostIp => nonempty(status.and_then(|s| s.host_ip.as_ref())),
            AddressMode::Dns => Some(self.dns_name(pod)?),
        })
    }

    fn dns_name(&self, pod: &PeerPod) -> Result<String, ClusterError> {
        let hostname = pod.hostname.as_deref().filter(|s| !s.is_empty());
        let subdomain = pod.subdomain.as_deref().filter(|s| !s.is_empty());
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        match (hostname, subdomain) {
            (Some(h), Some(d)) => Ok(format!(
                "{h}.{d}.{}.svc.{}",
                pod.metadata.namespace.as_deref().unwrap_or("default"),
                self.cluster_domain
            )),
            _ => Err(ClusterError::NoDnsName {
                pod: name.to_string(),
            }),
        }
    }

    /// The port of a peer: its containerPort named --port-name if it has one, else --port.
    fn port_of(&self, pod: &PeerPod) -> u16 {
        let Some(want) = self.port_name.as_deref() else {
            return self.port;
        };
        pod.named_ports
            .iter()
            .find(|(name, _)| name == want)
            .and_then(|(_, port)| u16::try_from(*port).ok())
            .unwrap_or(self.port)
    }

    /// The ordered live pods of one job: each selector's matches in turn, ordered within
    /// the selector, a pod that several selectors match counted once.
    fn members<'p>(
        &self,
        job: &Job,
        pods: &[&'p PeerPod],
    ) -> Result<Vec<&'p PeerPod>, ClusterError> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for sel in &job.selectors {
            let mut group: Vec<&PeerPod> = pods
                .iter()
                .copied()
                .filter(|p| is_live(p))
                .filter(|p| p.metadata.labels.as_ref().is_some_and(|l| sel.matches(l)))
                .filter(|p| seen.insert(uid(p)))
                .collect();
            self.sort(&mut group)?;
            out.extend(group);
        }
        Ok(out)
    }

    fn sort(&self, group: &mut [&PeerPod]) -> Result<(), ClusterError> {
        let name = |p: &&PeerPod| p.metadata.name.clone().unwrap_or_default();
        match self.order {
            OrderMode::Name => group.sort_by_key(name),
            OrderMode::Index => {
                let indexes: Option<Vec<(u64, &str)>> = group
                    .iter()
                    .map(|p| order::pod_index(&p.metadata))
                    .collect();
                if indexes.is_some() && !group.is_empty() {
                    // JobSet: the Job's index first, then the pod's within its Job.
                    let key = |p: &PeerPod| {
                        order::pod_index(&p.metadata)
                            .map(|(i, key)| (order::job_index(&p.metadata), i, key))
                    };
                    group.sort_by_key(|p| key(p).map(|(j, i, _)| (j, i)));
                    for w in group.windows(2) {
                        if let (Some((ja, i, key)), Some((jb, j, _))) = (key(w[0]), key(w[1]))
                            && (ja, i) == (jb, j)
                        {
                            let in_job = if order::in_jobset(&w[0].metadata) {
                                format!(" in Job {ja} ({})", order::jobset::GLOBAL_INDEX)
                            } else {
                                String::new()
                            };
                            return Err(ClusterError::Inconsistent(format!(
                                "pods {:?} and {:?} both have index {i} ({key}){in_job}; each index must be used once",
                                name(&w[0]),
                                name(&w[1])
                            )));
                        }
                    }
                } else {
                    group.sort_by(|a, b| order::natural_cmp(&name(a), &name(b)));
                }
            }
        }
        Ok(())
    }

    /// Looks at the pods and either resolves the cluster or says what is missing.
    ///
    /// `expected` holds the count of each type that is known (from `--expect` or the
    /// owning controller). A pod that several job types match is an error: its task
    /// would be ambiguous.
    pub fn assess(
        &self,
        pods: &[&PeerPod],
        expected: &BTreeMap<String, usize>,
    ) -> Result<Assessment, ClusterError> {
        let mut cluster = Cluster::default();
        let mut shortfalls = Vec::new();
        let mut owner_type: BTreeMap<&str, &str> = BTreeMap::new();
        for job in &self.jobs {
            let members = self.members(job, pods)?;
            for p in &members {
                if let Some(other) = owner_type.insert(uid(p), &job.task_type) {
                    return Err(ClusterError::Inconsistent(format!(
                        "pod {:?} matches the selectors of both job types {other:?} and {:?}; make the selectors disjoint",
                        p.metadata.name.as_deref().unwrap_or_default(),
                        job.task_type
                    )));
                }
            }
            // With --address dns, a pod without hostname/subdomain can never get an
            // address: fail now rather than wait for the timeout.
            if self.address == AddressMode::Dns {
                for p in &members {
                    self.dns_name(p)?;
                }
            }
            let not_ready: Vec<(String, String)> = members
                .iter()
                .filter_map(|p| {
                    readiness(p, self.ready, self.address)
                        .err()
                        .map(|why| (p.metadata.name.clone().unwrap_or_default(), why))
                })
                .collect();
            let want = expected.get(&job.task_type).copied();
            let ready = members.len() - not_ready.len();
            if want != Some(members.len()) || !not_ready.is_empty() {
                shortfalls.push(Shortfall {
                    task_type: job.task_type.clone(),
                    expected: want,
                    live: members.len(),
                    ready,
                    not_ready,
                });
                continue;
            }
            let mut peers = Vec::with_capacity(members.len());
            for (index, p) in members.iter().enumerate() {
                peers.push(self.peer(p, &job.task_type, index)?);
            }
            cluster.tasks.insert(job.task_type.clone(), peers);
        }
        Ok(if shortfalls.is_empty() {
            Assessment::Complete(cluster)
        } else {
            Assessment::Waiting(shortfalls)
        })
    }

    /// Elastic jobs (`--nnodes MIN:MAX`): complete once at least `min` pods of all
    /// types together are ready, this pod (`own_uid`) among them. The cluster is the
    /// ready pods, in order; the others join the rendezvous later with a cluster of
    /// their own, so nobody waits for them.
    pub fn assess_at_least(
        &self,
        pods: &[&PeerPod],
        min: usize,
        own_uid: &str,
    ) -> Result<Assessment, ClusterError> {
        let mut cluster = Cluster::default();
        let mut shortfalls = Vec::new();
        let mut ready_total = 0;
        for job in &self.jobs {
            let members = self.members(job, pods)?;
            let (ready, not_ready): (Vec<&PeerPod>, Vec<&PeerPod>) = members
                .iter()
                .partition(|p| readiness(p, self.ready, self.address).is_ok());
            ready_total += ready.len();
            shortfalls.push(Shortfall {
                task_type: job.task_type.clone(),
                expected: None,
                live: members.len(),
                ready: ready.len(),
                not_ready: not_ready
                    .iter()
                    .filter_map(|p| {
                        let why = readiness(p, self.ready, self.address).err()?;
                        Some((p.metadata.name.clone().unwrap_or_default(), why))
                    })
                    .collect(),
            });
            let mut peers = Vec::with_capacity(ready.len());
            for (index, p) in ready.iter().enumerate() {
                peers.push(self.peer(p, &job.task_type, index)?);
            }
            cluster.tasks.insert(job.task_type.clone(), peers);
        }
        let own_ready = cluster.tasks.values().flatten().any(|p| p.uid == own_uid);
        if ready_total >= min && own_ready {
            return Ok(Assessment::Complete(cluster));
        }
        // One line says what elastic waits for: MIN in all.
        if let Some(first) = shortfalls.first_mut() {
            first.expected = Some(min);
        }
        Ok(Assessment::Waiting(shortfalls))
    }

    /// One ready pod as the task `index` of `task_type`.
    fn peer(&self, p: &PeerPod, task_type: &str, index: usize) -> Result<Peer, ClusterError> {
        let host = self.host(p)?.unwrap_or_default();
        Ok(Peer {
            name: p.metadata.name.clone().unwrap_or_default(),
            task_type: task_type.to_string(),
            index,
            address: address::join(&host, self.port_of(p)),
            node: p.node_name.clone(),
            uid: uid(p).to_string(),
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
        })
    }

    /// This pod's own task: the override if given (checked against the cluster), else
    /// the one task whose pod has this uid.
    pub fn own_task(
        &self,
        cluster: &Cluster,
        own_uid: &str,
        own_name: &str,
        over: Option<Task>,
    ) -> Result<Task, ClusterError> {
        if let Some(t) = over {
            let n = cluster.tasks.get(&t.task_type).map_or(0, Vec::len);
            if n == 0 {
                return Err(ClusterError::TaskTypeNotInCluster {
                    task_type: t.task_type,
                    summary: cluster.summary(),
                });
            }
            if t.index >= n {
                return Err(ClusterError::TaskIndexOutOfRange {
                    index: t.index,
                    task_type: t.task_type,
                    tasks: n,
                });
            }
            return Ok(t);
        }
        cluster
            .tasks
            .values()
            .flatten()
            .find(|p| p.uid == own_uid)
            .map(|p| Task {
                task_type: p.task_type.clone(),
                index: p.index,
            })
            .ok_or_else(|| self.unmatched(own_name))
    }

    /// Checks, before any waiting, that this pod belongs to exactly one job type.
    pub fn check_own_pod(&self, pod: &ObjectMeta) -> Result<(), ClusterError> {
        let name = pod.name.as_deref().unwrap_or_default();
        match self.types_of(pod).as_slice() {
            [_] => Ok(()),
            [] => Err(self.unmatched(name)),
            many => Err(ClusterError::OwnPodAmbiguous {
                pod: name.to_string(),
                types: many.join(", "),
            }),
        }
    }

    fn unmatched(&self, name: &str) -> ClusterError {
        let jobs: Vec<String> = self
            .jobs
            .iter()
            .map(|j| {
                let sels: Vec<String> = j.selectors.iter().map(ToString::to_string).collect();
                format!("{}: {}", j.task_type, sels.join(" | "))
            })
            .collect();
        ClusterError::OwnPodUnmatched {
            pod: name.to_string(),
            jobs: jobs.join("; "),
        }
    }
}

fn uid(p: &PeerPod) -> &str {
    p.metadata
        .uid
        .as_deref()
        .or(p.metadata.name.as_deref())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
