//! How peers become tasks and addresses: which job a pod belongs to, its order within
//! the job, its address and port, and whether the cluster is complete.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::readiness::{Assessment, Shortfall, is_finished, is_live, readiness};
use super::selector::SelectorExt;
use super::slim::PeerPod;
use super::{AddressMode, Cluster, ClusterError, Job, OrderMode, Peer, ReadyMode, Task};
use super::{address, order};

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

/// A pod under index order: (its Job's index, its own), the key the index came from.
type Keyed<'p> = ((u64, u64), &'static str, &'p PeerPod);

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

    /// The ordered members of one job: each selector's matches in turn, ordered within
    /// the selector, a pod that several selectors match counted once.
    ///
    /// A member is a live pod or, `with_finished`, a pod that completed its index of an
    /// Indexed Job ([`completed_slot`]) where no live pod of the job holds that index:
    /// the Job controller runs a completed index no more, so a pod that starts after
    /// its peer finished would otherwise wait for it until `--timeout`. Where a live pod
    /// holds the index (a Job made again under the same name), the finished one is the
    /// past and does not count. Elastic jobs leave finished pods out: they join no
    /// rendezvous.
    pub fn members<'p>(
        &self,
        job: &Job,
        pods: &[&'p PeerPod],
        with_finished: bool,
    ) -> Result<Vec<&'p PeerPod>, ClusterError> {
        let of_job = |p: &PeerPod| {
            p.metadata
                .labels
                .as_ref()
                .is_some_and(|l| job.selectors.iter().any(|s| s.matches(l)))
        };
        // Only where a pod finished: the usual assessment of a job of thousands, on
        // every batch of events, makes no slot strings.
        let any_finished = with_finished && pods.iter().any(|p| is_finished(p));
        let held: BTreeSet<String> = pods
            .iter()
            .filter(|p| any_finished && is_live(p) && of_job(p))
            .map(|p| super::drift::slot(&p.metadata))
            .collect();
        let mut done = BTreeSet::new();
        let mut counts = |p: &PeerPod| {
            is_live(p)
                || (any_finished
                    && completed_slot(p).is_some_and(|s| !held.contains(&s) && done.insert(s)))
        };
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for sel in &job.selectors {
            let mut group: Vec<&PeerPod> = pods
                .iter()
                .copied()
                .filter(|p| p.metadata.labels.as_ref().is_some_and(|l| sel.matches(l)))
                .filter(|p| counts(p))
                .filter(|p| seen.insert(uid(p)))
                .collect();
            self.sort(&mut group)?;
            out.extend(group);
        }
        Ok(out)
    }

    fn sort(&self, group: &mut [&PeerPod]) -> Result<(), ClusterError> {
        // Borrowed, not cloned: a sort compares each name about log N times, on every
        // batch of events while the job comes up.
        fn name(p: &PeerPod) -> &str {
            p.metadata.name.as_deref().unwrap_or_default()
        }
        match self.order {
            OrderMode::Name => group.sort_by(|a, b| name(a).cmp(name(b))),
            OrderMode::Index => {
                // JobSet: the Job's index first, then the pod's within its Job. Each
                // pod's key is read once; a pod without an index orders the whole
                // group by name.
                let keyed: Option<Vec<Keyed>> = group
                    .iter()
                    .map(|p| {
                        order::pod_index(&p.metadata)
                            .map(|(i, key)| ((order::job_index(&p.metadata), i), key, *p))
                    })
                    .collect();
                match keyed {
                    Some(mut keyed) if !keyed.is_empty() => {
                        keyed.sort_by_key(|(at, _, _)| *at);
                        for w in keyed.windows(2) {
                            let ((ja, i), key, a) = w[0];
                            if (ja, i) == w[1].0 {
                                let in_job = if order::in_jobset(&a.metadata) {
                                    format!(" in Job {ja} ({})", order::jobset::GLOBAL_INDEX)
                                } else {
                                    String::new()
                                };
                                return Err(ClusterError::Inconsistent(format!(
                                    "pods {:?} and {:?} both have index {i} ({key}){in_job}; each index must be used once",
                                    name(a),
                                    name(w[1].2)
                                )));
                            }
                        }
                        for (slot, (_, _, p)) in group.iter_mut().zip(keyed) {
                            *slot = p;
                        }
                    }
                    _ => group.sort_by(|a, b| order::natural_cmp(name(a), name(b))),
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
            let members = self.members(job, pods, true)?;
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
            let members = self.members(job, pods, false)?;
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
            // What its DNS name must resolve to; a finished pod's record went with its
            // endpoint, and nobody need wait for it.
            pod_ip: p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty() && !is_finished(p)),
            slot: super::drift::slot(&p.metadata),
            past_init: matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Running" | "Succeeded" | "Failed")
            ),
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

/// The slot of a pod that completed its index of an Indexed Job (its Job's name and
/// completion index): `None` for a pod that did not finish, or finished elsewhere (a
/// pod of a StatefulSet or of a Job without indexes, whose part no index names).
fn completed_slot(p: &PeerPod) -> Option<String> {
    let slot = super::drift::slot(&p.metadata);
    (is_finished(p) && slot.starts_with("job/")).then_some(slot)
}

fn uid(p: &PeerPod) -> &str {
    p.metadata
        .uid
        .as_deref()
        .or(p.metadata.name.as_deref())
        .unwrap_or_default()
}
