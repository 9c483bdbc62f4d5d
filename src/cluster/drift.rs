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

use std::collections::HashMap;

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
}

impl Live {
    pub fn of(meta: &ObjectMeta, ip: Option<String>, phase: Option<String>) -> Live {
        Live {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            slot: slot(meta),
            ip,
            phase,
            deleting: meta.deletion_timestamp.is_some(),
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
    /// By the resolved pod, or by a replacement at the same address.
    Current,
    /// By nobody that serves; `why` says what became of it.
    Lost { why: String },
    /// By another pod, at another address.
    Replaced {
        pod: String,
        uid: String,
        address: String,
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
                            // A DNS name follows the pod; an IP does not.
                            Some(_) if r.host().parse::<std::net::IpAddr>().is_err() => {
                                Held::Current
                            }
                            Some(ip) if ip == r.host() => Held::Current,
                            Some(ip) => Held::Replaced {
                                pod: p.name.clone(),
                                uid: p.uid.clone(),
                                address: ip.clone(),
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

/// Where the cluster is complete again (no task lost), each replaced task's move to its
/// replacement: the host, and the pod that now holds it. `None` while a task is lost.
pub fn moves(drift: &[Drift]) -> Option<Vec<(String, super::rehost::Move, String, String)>> {
    let mut out = Vec::new();
    for d in drift {
        match &d.held {
            Held::Current => {}
            Held::Lost { .. } => return None,
            Held::Replaced { pod, uid, address } => out.push((
                d.task.clone(),
                super::rehost::Move {
                    from: d.was.clone(),
                    to: address.clone(),
                },
                pod.clone(),
                uid.clone(),
            )),
        }
    }
    Some(out)
}

/// `trainlet.io/cluster`: `current`, or `stale: worker/1 10.0.0.7 → 10.0.0.19; ps/0
/// 10.0.0.5 → none`.
pub fn annotation(drift: &[Drift]) -> String {
    let stale: Vec<String> = drift
        .iter()
        .filter_map(|d| match &d.held {
            Held::Current => None,
            Held::Lost { .. } => Some(format!("{} {} → none", d.task, d.was)),
            Held::Replaced { address, .. } => Some(format!("{} {} → {address}", d.task, d.was)),
        })
        .collect();
    if stale.is_empty() {
        "current".into()
    } else {
        format!("stale: {}", stale.join("; "))
    }
}

/// The Warning Event of a task's new state: (reason, note); none for `Current`.
pub fn event(d: &Drift) -> Option<(&'static str, String)> {
    match &d.held {
        Held::Current => None,
        Held::Lost { why } => Some((
            "PeerLost",
            format!(
                "task {} ({}) has no live pod: {why}; the cluster this pod was given is stale",
                d.task, d.was
            ),
        )),
        Held::Replaced { pod, address, .. } => Some((
            "PeerReplaced",
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
        }
    }

    #[test]
    fn a_replacement_at_a_new_ip_is_stale_and_the_old_ip_back_is_current() {
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
        assert_eq!(event(&d[1]).unwrap().0, "PeerReplaced");
        assert_eq!(
            moves(&d),
            Some(vec![(
                "worker/1".to_string(),
                crate::cluster::rehost::Move {
                    from: "10.0.0.7".into(),
                    to: "10.0.0.19".into()
                },
                "w-1-bbbb".to_string(),
                "uid-1b".to_string()
            )])
        );
        // The old address returns.
        let back = live("w-1-bbbb", "uid-1b", "job/w/1", Some("10.0.0.7"), "Running");
        assert_eq!(annotation(&assess(&r, &[original, back])), "current");
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
        r.address = "mnist-0.mnist.ml.svc.cluster.local:8470".into();
        assert_eq!(annotation(&assess(&[r], &[new])), "current");
        let mut v6 = resolved(1, "[fd00::7]");
        v6.address = "[fd00::7]:8470".into();
        let at = live("w-1-bbbb", "uid-1b", "job/w/1", Some("fd00::7"), "Running");
        assert_eq!(annotation(&assess(&[v6], &[at])), "current");
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
}
