//! Which peers a pod proves the network with, and what it concludes: the pure half of
//! the pre-flight.
//!
//! The tasks form a ring in the cluster's order (task type, then index), which every
//! pod of the job resolved alike: each pod connects to the next task's address and is
//! connected by the previous task's pod. Every pod thus opens one connection and
//! accepts one, O(N) for the job, and every pod-to-pod path of the ring is proven from
//! both ends: the connecting pod knows it got through, the accepting pod knows it was
//! reached.

use crate::cluster::{Cluster, address, published};

/// One task of the ring, as the files name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// `worker/1`.
    pub task: String,
    /// Its pod's name.
    pub pod: String,
    /// `host:port`: the address the files give the framework.
    pub address: String,
    /// Its pod was past its init containers when the cluster was resolved: its
    /// training process, not its init, holds the task's port.
    pub past_init: bool,
}

/// The own task's neighbours: the one it connects to and the one that connects to it
/// (the same task in a job of two). `None` where there is nothing to prove: a job of
/// one, or a task outside the cluster (TensorFlow's evaluator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub next: Neighbour,
    pub previous: Neighbour,
    /// The own task's port: where the previous task's pod connects.
    pub port: u16,
    /// The resolved cluster's digest, which keys the hellos ([`super::hello`]): only the
    /// pods that resolved the same cluster prove a path to each other.
    pub resolution: [u8; 32],
}

/// The ring around `own` (`type/index`) in `cluster`.
pub fn ring(cluster: &Cluster, own: &str) -> Option<Ring> {
    let tasks: Vec<Neighbour> = cluster
        .tasks
        .iter()
        .flat_map(|(ty, peers)| {
            peers.iter().map(move |p| Neighbour {
                task: format!("{ty}/{}", p.index),
                pod: p.name.clone(),
                address: p.address.clone(),
                past_init: p.past_init,
            })
        })
        .collect();
    let n = tasks.len();
    let at = tasks.iter().position(|t| t.task == own)?;
    if n < 2 {
        return None;
    }
    Some(Ring {
        next: tasks[(at + 1) % n].clone(),
        previous: tasks[(at + n - 1) % n].clone(),
        port: address::port(&tasks[at].address)?,
        resolution: published::digest(cluster),
    })
}

/// How the connection to the next task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    Connected,
    /// Its pod answered, but nothing listened: reached, where that pod is past its
    /// init (its training process may not listen on the task's port at all).
    Refused,
    /// No answer to any attempt (what a dropped packet gives).
    NoAnswer,
    /// The last attempt's error: no route, a reset, a hello not acknowledged.
    Failed(String),
}

/// How the wait for the previous task's pod ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Its hello checked out, and it confirmed that it holds the ack.
    Reached,
    /// Its pod is past its init: its training process, not its trainlet-init, runs.
    PastInit,
    /// Not reached; `refused` says why the last hello that did not count (any
    /// connection's) did not: what a pod of another resolution, or a forger, sent.
    NotReached { refused: Option<String> },
}

/// What the pod concludes, where it could not prove the ring: each line names a peer
/// and the side that saw the failure.
pub fn verdict(
    ring: &Ring,
    out: &Outbound,
    next_past_init: bool,
    previous: &Inbound,
    waited: std::time::Duration,
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let secs = waited.as_secs_f64();
    match out {
        Outbound::Connected => {}
        Outbound::Refused if next_past_init => {}
        Outbound::Refused => problems.push(format!(
            "{} ({}) at {} refused this pod's connections for {secs:.0}s: its trainlet-init never listened",
            ring.next.task, ring.next.pod, ring.next.address
        )),
        Outbound::NoAnswer => problems.push(format!(
            "this pod cannot reach {} ({}) at {}: no answer within {secs:.0}s",
            ring.next.task, ring.next.pod, ring.next.address
        )),
        Outbound::Failed(why) => problems.push(format!(
            "this pod cannot reach {} ({}) at {}: {why}",
            ring.next.task, ring.next.pod, ring.next.address
        )),
    }
    if let Inbound::NotReached { refused } = previous {
        let why = refused.as_ref().map_or(String::new(), |why| {
            format!(" (the last hello refused: {why})")
        });
        problems.push(format!(
            "{} ({}, {}) did not reach this pod's port {} within {secs:.0}s{why}",
            ring.previous.task,
            ring.previous.pod,
            address::host(&ring.previous.address),
            ring.port,
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Peer;
    use std::time::Duration;

    fn cluster(types: &[(&str, usize)]) -> Cluster {
        let mut c = Cluster::default();
        let mut ip = 5;
        for (ty, n) in types {
            let peers = (0..*n)
                .map(|i| {
                    ip += 1;
                    Peer {
                        name: format!("{ty}-{i}"),
                        task_type: ty.to_string(),
                        index: i,
                        address: format!("10.0.0.{ip}:8470"),
                        node: None,
                        uid: format!("u-{ty}-{i}"),
                        namespace: "ns".into(),
                        pod_ip: None,
                        slot: String::new(),
                        past_init: false,
                    }
                })
                .collect();
            c.tasks.insert(ty.to_string(), peers);
        }
        c
    }

    fn tasks(r: &Ring) -> (&str, &str) {
        (r.previous.task.as_str(), r.next.task.as_str())
    }

    #[test]
    fn every_task_connects_to_the_next_and_is_reached_by_the_previous() {
        let c = cluster(&[("ps", 1), ("worker", 3)]);
        assert_eq!(tasks(&ring(&c, "ps/0").unwrap()), ("worker/2", "worker/0"));
        assert_eq!(tasks(&ring(&c, "worker/0").unwrap()), ("ps/0", "worker/1"));
        let last = ring(&c, "worker/2").unwrap();
        assert_eq!(tasks(&last), ("worker/1", "ps/0"));
        assert_eq!(last.next.address, "10.0.0.6:8470");
        assert_eq!(last.next.pod, "ps-0");
        // Two tasks: each is the other's next and previous.
        let two = cluster(&[("worker", 2)]);
        assert_eq!(
            tasks(&ring(&two, "worker/1").unwrap()),
            ("worker/0", "worker/0")
        );
        // Nothing to prove alone, or outside the cluster.
        assert_eq!(ring(&cluster(&[("worker", 1)]), "worker/0"), None);
        assert_eq!(ring(&c, "evaluator/0"), None);
    }

    #[test]
    fn each_task_is_the_next_of_exactly_one_other() {
        for n in 2..40 {
            let c = cluster(&[("worker", n)]);
            let mut nexts: Vec<String> = (0..n)
                .map(|i| ring(&c, &format!("worker/{i}")).unwrap().next.task)
                .collect();
            nexts.sort();
            nexts.dedup();
            assert_eq!(nexts.len(), n);
        }
    }

    #[test]
    fn every_pod_of_one_resolution_keys_its_ring_alike() {
        let c = cluster(&[("worker", 3)]);
        let digest = published::digest(&c);
        for i in 0..3 {
            assert_eq!(ring(&c, &format!("worker/{i}")).unwrap().resolution, digest);
        }
        let mut other = c.clone();
        other.tasks.get_mut("worker").unwrap()[1].uid = "u-replaced".into();
        assert_ne!(ring(&other, "worker/0").unwrap().resolution, digest);
    }

    #[test]
    fn the_verdict_names_each_peer_and_the_side_that_saw_it() {
        let c = cluster(&[("worker", 3)]);
        let r = ring(&c, "worker/1").unwrap();
        let t = Duration::from_secs(30);
        let not_reached = Inbound::NotReached { refused: None };
        assert_eq!(
            verdict(&r, &Outbound::Connected, false, &Inbound::Reached, t),
            Ok(())
        );
        // A peer past its init answers with a refusal: reached.
        assert_eq!(
            verdict(&r, &Outbound::Refused, true, &Inbound::PastInit, t),
            Ok(())
        );
        assert_eq!(
            verdict(&r, &Outbound::NoAnswer, false, &not_reached, t),
            Err(vec![
                "this pod cannot reach worker/2 (worker-2) at 10.0.0.8:8470: no answer within 30s"
                    .to_string(),
                "worker/0 (worker-0, 10.0.0.6) did not reach this pod's port 8470 within 30s"
                    .to_string()
            ])
        );
        assert_eq!(
            verdict(
                &r,
                &Outbound::Failed("No route to host (os error 113)".into()),
                false,
                &Inbound::Reached,
                t
            ),
            Err(vec![
                "this pod cannot reach worker/2 (worker-2) at 10.0.0.8:8470: No route to host (os error 113)"
                    .to_string()
            ])
        );
        assert_eq!(
            verdict(&r, &Outbound::Refused, false, &Inbound::Reached, t),
            Err(vec![
                "worker/2 (worker-2) at 10.0.0.8:8470 refused this pod's connections for 30s: its trainlet-init never listened"
                    .to_string()
            ])
        );
        // The hellos refused meanwhile say what came instead of the previous task's.
        let refused = Inbound::NotReached {
            refused: Some("its hello is from \"worker/5\", not from worker/0".into()),
        };
        assert_eq!(
            verdict(&r, &Outbound::Connected, false, &refused, t),
            Err(vec![
                "worker/0 (worker-0, 10.0.0.6) did not reach this pod's port 8470 within 30s (the last hello refused: its hello is from \"worker/5\", not from worker/0)"
                    .to_string()
            ])
        );
    }
}
