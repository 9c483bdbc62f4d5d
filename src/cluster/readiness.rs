//! Whether a peer pod is ready to be a task, and what the wait is for when it is not.

use super::slim::PeerPod;
use super::{AddressMode, Cluster, ReadyMode};
use crate::flags;

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
                "{}: expected count unknown (no owning Job, StatefulSet or ReplicaSet seen; pass --{}), ready {} of {} live",
                self.task_type,
                flags::EXPECT,
                self.ready,
                self.live
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

/// A pod that finished its part: Succeeded, and not being deleted. In an Indexed Job it
/// completed its index, which the Job controller never runs again: a pod that starts
/// later (a slow node, a late replacement) counts it as the task it was rather than
/// wait for a pod that will never come ([`super::Resolver::members`]).
pub fn is_finished(pod: &PeerPod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && phase(pod) == "Succeeded"
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
/// not count. A Succeeded pod (one the resolver counts: [`is_finished`]) is ready at its
/// last address, and never Ready: its Ready condition went False when it completed.
pub fn readiness(pod: &PeerPod, mode: ReadyMode, address: AddressMode) -> Result<(), String> {
    let status = pod.status.as_ref();
    let phase = phase(pod);
    let in_init = phase == "Pending" && status.is_some_and(|s| s.init_running);
    let finished = phase == "Succeeded";
    if phase != "Running" && !in_init && !finished {
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
    if mode == ReadyMode::Ready && !finished {
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
