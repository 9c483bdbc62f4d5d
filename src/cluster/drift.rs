//! After the start: is the resolved cluster still the cluster? Pure.
//!
//! Every pod was given the addresses of its peers once. When a peer's pod fails or is
//! deleted, and the Job or StatefulSet controller replaces it, the replacement comes up
//! at a new address (a pod IP) and every other pod's TF_CONFIG, `MASTER_ADDR` or
//! hostfile now names an address nobody listens on. [`assess`] compares the tasks of
//! `cluster.json` with the live pods and says, per task, whether it is still held by
//! the pod it was resolved to, by a replacement (and at which address), or by nobody.
//!
//! A replacement is recognised by its *slot*: the Job and completion index it runs
//! (`batch.kubernetes.io/job-name` + `job-completion-index`, which the Job controller
//! gives the replacement of an index too, and which JobSet's Jobs keep), else its name
//! (a StatefulSet's replacement keeps the name).
//!
//! In coordinated mode only the resolver pod watches every peer: [`current`] turns
//! where its tasks stand into the cluster it publishes again, and every other pod
//! compares its files with that ([`against_published`]), watching one pod instead of N.

use std::collections::HashMap;

use super::published::Resolution;
use super::{Cluster, Peer};
use crate::event::Event;
use crate::reason::Reason;

/// The most bytes `trainlet.io/cluster` (and `peers.json`'s `cluster`) may hold: the
/// stale tasks that fit are listed, the rest counted, so that a job of thousands with
/// every peer gone still fits beside the pod's other annotations.
pub const ANNOTATION_MAX: usize = 4096;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The slot of a pod: what its replacement shares with it.
pub fn slot(meta: &ObjectMeta) -> String {
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k));
    let index = label("batch.kubernetes.io/job-completion-index").or_else(|| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get("batch.kubernetes.io/job-completion-index"))
    });
    let job = label("batch.kubernetes.io/job-name").or_else(|| label("job-name"));
    match (job, index) {
        (Some(j), Some(i)) => format!("job/{j}/{i}"),
        _ => format!("name/{}", meta.name.as_deref().unwrap_or_default()),
    }
}

/// One task of the resolved cluster, as `cluster.json` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub task_type: String,
    pub index: usize,
    pub name: String,
    pub uid: String,
    /// Empty in a `cluster.json` from before slots: then the name is the slot.
    pub slot: String,
    /// `host:port` (or a bare host).
    pub address: String,
}

impl Resolved {
    pub fn task(&self) -> String {
        format!("{}/{}", self.task_type, self.index)
    }
    fn host(&self) -> &str {
        super::address::host(&self.address)
    }
    fn slot(&self) -> String {
        if self.slot.is_empty() {
            format!("name/{}", self.name)
        } else {
            self.slot.clone()
        }
    }
}

/// What the peer watch knows of one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub name: String,
    pub uid: String,
    pub slot: String,
    pub ip: Option<String>,
    pub phase: Option<String>,
    pub deleting: bool,
    /// The node it runs on: what the resolver publishes for a replacement.
    pub node: Option<String>,
    /// Its `trainlet.io/progress` annotation, where its reporter publishes one.
    pub progress: Option<String>,
}

impl Live {
    pub fn of(
        meta: &ObjectMeta,
        ip: Option<String>,
        phase: Option<String>,
        node: Option<String>,
    ) -> Live {
        Live {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            slot: slot(meta),
            ip,
            phase,
            deleting: meta.deletion_timestamp.is_some(),
            node,
            progress: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::publish::keys::PROGRESS))
                .cloned(),
        }
    }
    /// A pod that still serves: not failed and not being deleted. A Succeeded pod
    /// finished its part; the job ending is no stale cluster.
    fn alive(&self) -> bool {
        !self.deleting && self.phase.as_deref() != Some("Failed")
    }
}

/// Where one task stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Held {
    /// By the resolved pod itself.
    Current,
    /// By nobody that serves; `why` says what became of it.
    Lost { why: String },
    /// By another pod (a new UID), at `address`: its host, which may be the one the task
    /// had (a hostNetwork pod on the same node, a DNS name, an IP handed out again).
    /// Every rank's communicator broke with the pod it replaced all the same.
    Replaced {
        pod: String,
        uid: String,
        address: String,
        node: Option<String>,
    },
}

/// One task and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Drift {
    pub task: String,
    pub was: String,
    pub held: Held,
}

/// Where every resolved task stands among the live pods. Linear in tasks and pods (the
/// pods are indexed once), as it runs on every peer event of a job of thousands.
pub fn assess<'a>(resolved: &[Resolved], pods: impl IntoIterator<Item = &'a Live>) -> Vec<Drift> {
    let mut by_uid: HashMap<&str, &Live> = HashMap::new();
    let mut by_slot: HashMap<&str, Vec<&Live>> = HashMap::new();
    let mut by_name: HashMap<&str, Vec<&Live>> = HashMap::new();
    for p in pods {
        by_uid.insert(&p.uid, p);
        if p.alive() {
            by_slot.entry(&p.slot).or_default().push(p);
            by_name.entry(&p.name).or_default().push(p);
        }
    }
    resolved
        .iter()
        .map(|r| {
            let original = by_uid.get(r.uid.as_str()).copied();
            let held = match original {
                Some(p) if p.alive() => Held::Current,
                _ => {
                    let slot = r.slot();
                    let replacement = [by_slot.get(slot.as_str()), by_name.get(r.name.as_str())]
                        .into_iter()
                        .flatten()
                        .flatten()
                        .find(|p| p.uid != r.uid);
                    match replacement {
                        Some(p) => match &p.ip {
                            None => Held::Lost {
                                why: format!("its replacement {} has no address yet", p.name),
                            },
                            Some(ip) => Held::Replaced {
                                pod: p.name.clone(),
                                uid: p.uid.clone(),
                                // A DNS name follows the pod; an IP does not.
                                address: if r.host().parse::<std::net::IpAddr>().is_err() {
                                    r.host().to_string()
                                } else {
                                    ip.clone()
                                },
                                node: p.node.clone(),
                            },
                        },
                        None => Held::Lost {
                            why: match original {
                                Some(p) if p.deleting => format!("pod {} is being deleted", r.name),
                                Some(p) => format!(
                                    "pod {} is {}",
                                    r.name,
                                    p.phase.as_deref().unwrap_or("gone")
                                ),
                                None => format!("pod {} is gone", r.name),
                            },
                        },
                    }
                }
            };
            Drift {
                task: r.task(),
                was: r.host().to_string(),
                held,
            }
        })
        .collect()
}

/// One task's move: `from` → `to` (hosts: IPs, or DNS names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub from: String,
    pub to: String,
}

/// A replaced task's move to its replacement, and the pod that now holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// `type/index`.
    pub task: String,
    pub host: Move,
    /// The replacement's name and UID.
    pub pod: String,
    pub uid: String,
}

/// Where the cluster is complete again (no task lost), each replaced task's move to its
/// replacement: the host, and the pod that now holds it. `None` while a task is lost.
pub fn moves(drift: &[Drift]) -> Option<Vec<Moved>> {
    let mut out = Vec::new();
    for d in drift {
        match &d.held {
            Held::Current => {}
            Held::Lost { .. } => return None,
            Held::Replaced {
                pod, uid, address, ..
            } => out.push(Moved {
                task: d.task.clone(),
                host: Move {
                    from: d.was.clone(),
                    to: address.clone(),
                },
                pod: pod.clone(),
                uid: uid.clone(),
            }),
        }
    }
    Some(out)
}

/// Where the resolved cluster stands, as `trainlet.io/cluster` and `peers.json` carry
/// it: every decision reads this type, and only [`ClusterStatus::text`] spells it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", from = "String")]
pub enum ClusterStatus {
    /// Every task is held by the pod it was resolved to, at its address.
    Current,
    /// A task was lost or replaced: the annotation's text, `stale: …`, which names
    /// each task that moved (as [`annotation`] writes it).
    Stale(String),
}

impl ClusterStatus {
    /// Where the tasks stand.
    pub fn of(drift: &[Drift]) -> ClusterStatus {
        match annotation(drift) {
            t if t == CURRENT => ClusterStatus::Current,
            t => ClusterStatus::Stale(t),
        }
    }

    /// What a pod's `trainlet.io/cluster` says; `None` for a text that is neither.
    pub fn parse(text: &str) -> Option<ClusterStatus> {
        match text {
            CURRENT => Some(ClusterStatus::Current),
            t if t.starts_with(STALE) => Some(ClusterStatus::Stale(t.to_string())),
            _ => None,
        }
    }

    /// The stale cluster's text, while it is stale.
    pub fn stale(&self) -> Option<&str> {
        match self {
            ClusterStatus::Current => None,
            ClusterStatus::Stale(t) => Some(t),
        }
    }

    pub fn is_current(&self) -> bool {
        *self == ClusterStatus::Current
    }

    /// `current`, or `stale: …`.
    pub fn text(&self) -> &str {
        match self {
            ClusterStatus::Current => CURRENT,
            ClusterStatus::Stale(t) => t,
        }
    }
}

impl From<ClusterStatus> for String {
    fn from(s: ClusterStatus) -> String {
        s.text().to_string()
    }
}

/// Read back from a file: any text but `current` is a stale cluster, as its writer said.
impl From<String> for ClusterStatus {
    fn from(t: String) -> ClusterStatus {
        if t == CURRENT {
            ClusterStatus::Current
        } else {
            ClusterStatus::Stale(t)
        }
    }
}

const CURRENT: &str = "current";
const STALE: &str = "stale";

/// `trainlet.io/cluster`: `current`, or `stale: worker/1 10.0.0.7 → 10.0.0.19; ps/0
/// 10.0.0.5 → none`; at most [`ANNOTATION_MAX`] bytes: the tasks that fit, then
/// `; … and N more`.
pub fn annotation(drift: &[Drift]) -> String {
    let mut stale = drift.iter().filter_map(|d| match &d.held {
        Held::Current => None,
        Held::Lost { .. } => Some(format!("{} {} → none", d.task, d.was)),
        Held::Replaced { address, pod, .. } if *address == d.was => {
            Some(format!("{} {} → {address} (new pod {pod})", d.task, d.was))
        }
        Held::Replaced { address, .. } => Some(format!("{} {} → {address}", d.task, d.was)),
    });
    let Some(first) = stale.next() else {
        return CURRENT.into();
    };
    let mut out = format!("{STALE}: {first}");
    let mut more = 0usize;
    // Room for the longest tail: "; … and 18446744073709551615 more".
    const TAIL: usize = 40;
    for s in stale {
        if more == 0 && out.len() + 2 + s.len() + TAIL <= ANNOTATION_MAX {
            out.push_str("; ");
            out.push_str(&s);
        } else {
            more += 1;
        }
    }
    if out.len() > ANNOTATION_MAX - TAIL {
        // One task alone longer than the budget (a 253-character DNS name twice).
        out = crate::publish::truncate(&out, ANNOTATION_MAX - TAIL);
    }
    if more > 0 {
        out.push_str(&format!("; … and {more} more"));
    }
    out
}

/// The resolver's side: the cluster as it stands now, to publish again. Each task is
/// held by its resolved pod (`peers`, in rank order within each type), or moved to its
/// replacement (at the same port); a task without a live pod keeps its last entry and
/// is listed as lost.
pub fn current(peers: &[Peer], drift: &[Drift]) -> (Cluster, Vec<String>) {
    let by_task: HashMap<&str, &Drift> = drift.iter().map(|d| (d.task.as_str(), d)).collect();
    let mut cluster = Cluster::default();
    let mut lost = Vec::new();
    for p in peers {
        let task = format!("{}/{}", p.task_type, p.index);
        let mut p = p.clone();
        match by_task.get(task.as_str()).map(|d| &d.held) {
            Some(Held::Lost { .. }) => lost.push(task),
            Some(Held::Replaced {
                pod,
                uid,
                address,
                node,
            }) => {
                let port = super::address::port(&p.address);
                p.address = match port {
                    Some(port) => super::address::join(address, port),
                    None => address.clone(),
                };
                p.name = pod.clone();
                p.uid = uid.clone();
                p.node = node.clone();
            }
            Some(Held::Current) | None => {}
        }
        cluster
            .tasks
            .entry(p.task_type.clone())
            .or_default()
            .push(p);
    }
    for tasks in cluster.tasks.values_mut() {
        tasks.sort_by_key(|p| p.index);
    }
    (cluster, lost)
}

/// A follower's side: where each resolved task stands in the resolver's latest
/// resolution. A task the resolution lists as lost is lost; one held there by the same
/// pod is current; one held by another pod is replaced, at whatever host.
pub fn against_published(resolved: &[Resolved], published: &Resolution) -> Vec<Drift> {
    resolved
        .iter()
        .map(|r| {
            let task = r.task();
            let held = match published.cluster.task(&r.task_type, r.index) {
                _ if published.lost.contains(&task) => Held::Lost {
                    why: "the resolver pod sees no live pod for it".into(),
                },
                None => Held::Lost {
                    why: "the resolver's cluster has no such task".into(),
                },
                Some(p) if p.uid == r.uid => Held::Current,
                Some(p) => Held::Replaced {
                    pod: p.name.clone(),
                    uid: p.uid.clone(),
                    address: super::address::host(&p.address).to_string(),
                    node: p.node.clone(),
                },
            };
            Drift {
                task,
                was: r.host().to_string(),
                held,
            }
        })
        .collect()
}

/// A follower's side while no live pod publishes: the resolver's own task is lost, for
/// `why`; of the others it cannot tell, so they stand as they were.
pub fn resolver_gone(resolved: &[Resolved], resolver_task: &str, why: &str) -> Vec<Drift> {
    resolved
        .iter()
        .map(|r| Drift {
            task: r.task(),
            was: r.host().to_string(),
            held: if r.task() == resolver_task {
                Held::Lost { why: why.into() }
            } else {
                Held::Current
            },
        })
        .collect()
}

/// The Warning Event of a task's new state; none for `Current`.
pub fn event(d: &Drift) -> Option<Event> {
    match &d.held {
        Held::Current => None,
        Held::Lost { why } => Some(Event::warning(
            Reason::PeerLost,
            format!(
                "task {} ({}) has no live pod: {why}; the cluster this pod was given is stale",
                d.task, d.was
            ),
        )),
        Held::Replaced { pod, address, .. } if *address == d.was => Some(Event::warning(
            Reason::PeerReplaced,
            format!(
                "task {} ({}) is held by a new pod, {pod}, at the same address; the cluster this pod was given is stale",
                d.task, d.was
            ),
        )),
        Held::Replaced { pod, address, .. } => Some(Event::warning(
            Reason::PeerReplaced,
            format!(
                "task {} moved: {} → {address} (pod {pod}); the cluster this pod was given is stale",
                d.task, d.was
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(i: usize, ip: &str) -> Resolved {
        Resolved {
            task_type: "worker".into(),
            index: i,
            name: format!("w-{i}-aaaa"),
            uid: format!("uid-{i}"),
            slot: format!("job/w/{i}"),
            address: format!("{ip}:8470"),
        }
    }

    fn live(name: &str, uid: &str, slot: &str, ip: Option<&str>, phase: &str) -> Live {
        Live {
            name: name.into(),
            uid: uid.into(),
            slot: slot.into(),
            ip: ip.map(String::from),
            phase: Some(phase.into()),
            deleting: false,
            node: Some("n2".into()),
            progress: None,
        }
    }

    #[test]
    fn a_replacement_at_a_new_ip_is_stale_and_so_is_one_at_the_old_ip() {
        let r = [resolved(0, "10.0.0.6"), resolved(1, "10.0.0.7")];
        let original = live("w-0-aaaa", "uid-0", "job/w/0", Some("10.0.0.6"), "Running");
        let all = [
            original.clone(),
            live("w-1-aaaa", "uid-1", "job/w/1", Some("10.0.0.7"), "Running"),
        ];
        let d = assess(&r, &all);
        assert!(d.iter().all(|d| d.held == Held::Current));
        assert_eq!(annotation(&d), "current");

        // Pod 1 deleted: lost, and nothing to move to while it is.
        let d = assess(&r, std::slice::from_ref(&original));
        assert_eq!(annotation(&d), "stale: worker/1 10.0.0.7 → none");
        assert_eq!(moves(&d), None);
        assert_eq!(
            event(&d[1]).unwrap(),
            (
                "PeerLost",
                "task worker/1 (10.0.0.7) has no live pod: pod w-1-aaaa is gone; the cluster this pod was given is stale".to_string()
            )
        );
        // Its replacement, before and after it has an IP.
        let pending = live("w-1-bbbb", "uid-1b", "job/w/1", None, "Pending");
        let d = assess(&r, &[original.clone(), pending]);
        assert_eq!(
            d[1].held,
            Held::Lost {
                why: "its replacement w-1-bbbb has no address yet".into()
            }
        );
        let moved = live(
            "w-1-bbbb",
            "uid-1b",
            "job/w/1",
            Some("10.0.0.19"),
            "Running",
        );
        let d = assess(&r, &[original.clone(), moved]);
        assert_eq!(annotation(&d), "stale: worker/1 10.0.0.7 → 10.0.0.19");
        assert_eq!(event(&d[1]).unwrap().reason.as_str(), "PeerReplaced");
        assert_eq!(
            moves(&d),
            Some(vec![Moved {
                task: "worker/1".to_string(),
                host: Move {
                    from: "10.0.0.7".into(),
                    to: "10.0.0.19".into()
                },
                pod: "w-1-bbbb".to_string(),
                uid: "uid-1b".to_string()
            }])
        );
        // The old address returns: still another pod, still stale.
        let back = live("w-1-bbbb", "uid-1b", "job/w/1", Some("10.0.0.7"), "Running");
        assert_eq!(
            annotation(&assess(&r, &[original, back])),
            "stale: worker/1 10.0.0.7 → 10.0.0.7 (new pod w-1-bbbb)"
        );
    }

    #[test]
    fn failed_and_deleting_pods_do_not_hold_their_task_but_succeeded_ones_do() {
        let r = [resolved(0, "10.0.0.6")];
        let failed = live("w-0-aaaa", "uid-0", "job/w/0", Some("10.0.0.6"), "Failed");
        assert_eq!(
            assess(&r, &[failed])[0].held,
            Held::Lost {
                why: "pod w-0-aaaa is Failed".into()
            }
        );
        let mut deleting = live("w-0-aaaa", "uid-0", "job/w/0", Some("10.0.0.6"), "Running");
        deleting.deleting = true;
        assert_eq!(
            assess(&r, &[deleting])[0].held,
            Held::Lost {
                why: "pod w-0-aaaa is being deleted".into()
            }
        );
        let done = live(
            "w-0-aaaa",
            "uid-0",
            "job/w/0",
            Some("10.0.0.6"),
            "Succeeded",
        );
        assert_eq!(assess(&r, &[done])[0].held, Held::Current);
    }

    #[test]
    fn a_statefulset_replacement_keeps_its_name_and_dns_addresses_follow_pods() {
        let mut r = resolved(0, "10.0.0.6");
        r.slot = String::new();
        r.name = "mnist-0".into();
        let new = live(
            "mnist-0",
            "uid-new",
            "name/mnist-0",
            Some("10.0.0.30"),
            "Running",
        );
        assert_eq!(
            annotation(&assess(
                std::slice::from_ref(&r),
                std::slice::from_ref(&new)
            )),
            "stale: worker/0 10.0.0.6 → 10.0.0.30"
        );
        // A DNS name follows the pod: the task stays at its name, held by a new pod.
        r.address = "mnist-0.mnist.ml.svc.cluster.local:8470".into();
        assert_eq!(
            annotation(&assess(&[r], &[new])),
            "stale: worker/0 mnist-0.mnist.ml.svc.cluster.local → mnist-0.mnist.ml.svc.cluster.local (new pod mnist-0)"
        );
        let mut v6 = resolved(1, "[fd00::7]");
        v6.address = "[fd00::7]:8470".into();
        let at = live("w-1-bbbb", "uid-1b", "job/w/1", Some("fd00::7"), "Running");
        assert_eq!(
            annotation(&assess(&[v6], &[at])),
            "stale: worker/1 fd00::7 → fd00::7 (new pod w-1-bbbb)"
        );
    }

    /// hostNetwork: a pod replaced on the same node keeps the node's IP, yet every
    /// rank's communicator broke with the pod it replaced. A replacement is a new UID,
    /// whatever its address; it moves the files nowhere, and names the new pod.
    #[test]
    fn a_replacement_at_the_same_address_is_a_replacement() {
        let r = resolved(1, "10.0.0.7");
        let same = live("w-1-bbbb", "uid-1b", "job/w/1", Some("10.0.0.7"), "Running");
        let d = assess(std::slice::from_ref(&r), std::slice::from_ref(&same));
        assert_eq!(
            d[0].held,
            Held::Replaced {
                pod: "w-1-bbbb".into(),
                uid: "uid-1b".into(),
                address: "10.0.0.7".into(),
                node: Some("n2".into()),
            }
        );
        assert_eq!(
            annotation(&d),
            "stale: worker/1 10.0.0.7 → 10.0.0.7 (new pod w-1-bbbb)"
        );
        assert_eq!(
            event(&d[0]).unwrap().note,
            "task worker/1 (10.0.0.7) is held by a new pod, w-1-bbbb, at the same address; the cluster this pod was given is stale"
        );
        let m = moves(&d).unwrap();
        assert_eq!(m[0].host.from, m[0].host.to);
        assert_eq!(
            (m[0].pod.as_str(), m[0].uid.as_str()),
            ("w-1-bbbb", "uid-1b")
        );
        // The resolved pod itself, still at its address: current.
        let own = live("w-1-aaaa", "uid-1", "job/w/1", Some("10.0.0.7"), "Running");
        assert_eq!(assess(&[r], &[own])[0].held, Held::Current);
    }

    #[test]
    fn the_slot_is_the_job_and_index_else_the_name() {
        let meta: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "mnist-worker-1-x7k2p",
            "labels": {"batch.kubernetes.io/job-name": "mnist-worker", "batch.kubernetes.io/job-completion-index": "1"}
        }))
        .unwrap();
        assert_eq!(slot(&meta), "job/mnist-worker/1");
        let sts: ObjectMeta =
            serde_json::from_value(serde_json::json!({"name": "mnist-2"})).unwrap();
        assert_eq!(slot(&sts), "name/mnist-2");
    }

    #[test]
    fn a_job_of_thousands_without_peers_fits_in_the_annotation() {
        let r: Vec<Resolved> = (0..2400)
            .map(|i| {
                let mut r = resolved(i, "x");
                r.task_type = "t".repeat(63);
                r.address = format!("[fd00:1234:5678:9abc::{i:x}]:8470");
                r
            })
            .collect();
        let text = annotation(&assess(&r, &[]));
        assert!(text.len() <= ANNOTATION_MAX, "{}", text.len());
        assert!(text.len() > ANNOTATION_MAX - 200, "{}", text.len());
        let listed = text.matches(" → none").count();
        assert!(
            text.ends_with(&format!("; … and {} more", 2400 - listed)),
            "{}",
            &text[text.len() - 60..]
        );
        assert!(text.starts_with(&format!(
            "stale: {}/0 fd00:1234:5678:9abc::0 → none; ",
            "t".repeat(63)
        )));
        // One task alone over the budget is cut, and still says what it is.
        let mut huge = resolved(0, "x");
        huge.address = format!("{}:8470", "d".repeat(5000));
        let text = annotation(&assess(&[huge], &[]));
        assert!(text.len() <= ANNOTATION_MAX && text.starts_with("stale: worker/0 ddd"));
    }

    fn peer(t: &str, i: usize, ip: &str) -> Peer {
        Peer {
            name: format!("{t}-{i}-aaaa"),
            task_type: t.into(),
            index: i,
            address: format!("{ip}:8470"),
            node: Some("n1".into()),
            uid: format!("uid-{i}"),
            namespace: "ml".into(),
            pod_ip: None,
            slot: String::new(),
            past_init: false,
        }
    }

    #[test]
    fn the_resolver_publishes_replacements_and_lost_tasks() {
        let peers = [
            peer("worker", 0, "10.0.0.6"),
            peer("worker", 1, "10.0.0.7"),
            peer("worker", 2, "10.0.0.8"),
        ];
        let r: Vec<Resolved> = (1..3)
            .map(|i| resolved(i, &format!("10.0.0.{}", 6 + i)))
            .collect();
        let pods = [
            live(
                "w-1-bbbb",
                "uid-1b",
                "job/w/1",
                Some("10.0.0.19"),
                "Running",
            ),
            live("w-2-aaaa", "uid-2", "job/w/2", Some("10.0.0.8"), "Failed"),
        ];
        let (c, lost) = current(&peers, &assess(&r, &pods));
        assert_eq!(lost, ["worker/2"]);
        let w = &c.tasks["worker"];
        assert_eq!(w.len(), 3);
        assert_eq!(w[0], peers[0], "the resolver's own task stays");
        assert_eq!(
            (
                w[1].name.as_str(),
                w[1].uid.as_str(),
                w[1].address.as_str(),
                w[1].node.as_deref()
            ),
            ("w-1-bbbb", "uid-1b", "10.0.0.19:8470", Some("n2"))
        );
        assert_eq!(w[2], peers[2], "a lost task keeps the pod that held it");
        // IPv6 keeps its brackets and port.
        let v6 = [peer("worker", 1, "[fd00::7]")];
        let mut r6 = resolved(1, "x");
        r6.address = "[fd00::7]:8470".into();
        let moved = live("w-1-bbbb", "uid-1b", "job/w/1", Some("fd00::21"), "Running");
        let (c, _) = current(&v6, &assess(&[r6], &[moved]));
        assert_eq!(c.tasks["worker"][0].address, "[fd00::21]:8470");
    }

    #[test]
    fn a_follower_compares_its_files_with_the_resolvers_cluster() {
        let r: Vec<Resolved> = (1..4)
            .map(|i| resolved(i, &format!("10.0.0.{}", 6 + i)))
            .collect();
        let mut c = Cluster::default();
        let mut moved = peer("worker", 1, "10.0.0.19");
        moved.uid = "uid-1b".into();
        moved.name = "w-1-bbbb".into();
        // Task 2: another pod at the same address (a DNS name, a hostNetwork pod on the
        // same node) is a replacement all the same.
        let mut same_host = peer("worker", 2, "10.0.0.8");
        same_host.uid = "uid-2b".into();
        c.tasks.insert(
            "worker".into(),
            vec![
                peer("worker", 0, "10.0.0.6"),
                moved,
                same_host,
                peer("worker", 3, "10.0.0.9"),
            ],
        );
        let published = Resolution {
            cluster: c,
            generation: 5,
            lost: vec!["worker/3".into()],
        };
        let d = against_published(&r, &published);
        assert_eq!(
            annotation(&d),
            "stale: worker/1 10.0.0.7 → 10.0.0.19; worker/2 10.0.0.8 → 10.0.0.8 (new pod worker-2-aaaa); worker/3 10.0.0.9 → none"
        );
        assert!(matches!(d[1].held, Held::Replaced { .. }), "{:?}", d[1]);
        assert_eq!(
            event(&d[2]).unwrap().note,
            "task worker/3 (10.0.0.9) has no live pod: the resolver pod sees no live pod for it; the cluster this pod was given is stale"
        );
        assert_eq!(moves(&d), None, "nothing moves while a task is lost");
        // A task the resolver's cluster does not have at all.
        let r9 = [resolved(9, "10.0.0.99")];
        assert_eq!(
            against_published(&r9, &published)[0].held,
            Held::Lost {
                why: "the resolver's cluster has no such task".into()
            }
        );
        // The resolver pod gone: its task is lost, the others cannot be told.
        let d = resolver_gone(&r, "worker/1", "pod w-1-aaaa is gone");
        assert_eq!(annotation(&d), "stale: worker/1 10.0.0.7 → none");
    }
}
