//! `trainlet status`: one job's pods as trainlet sees them, in one table, and a verdict
//! for the whole job. Everything comes from the Job or JobSet itself (suspended, i.e.
//! not admitted by Kueue yet; complete or failed), what the agents already published on
//! its pods (their task, report, health and cluster annotations) and those pods'
//! Events: status reads, it never writes, and needs only get and list.
//!
//! The view is pure ([`view`]): the job, its pods and Events in, rows and a verdict
//! out. Every text that comes from the cluster is escaped ([`escape`]: no control
//! character reaches the terminal) and bounded ([`cell`]), so that neither a hostile
//! annotation nor 2,000 pods make the output unreadable. [`fetch`] is the I/O.

pub mod fetch;
mod progress;
mod target;
mod text;
mod verdict;

pub use target::{Kind, Lookup, Owner, Target, not_found};
pub use text::{bound, cell, clock, escape};
pub use verdict::{owner_verdict, verdict};

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use serde::Serialize;
use serde_json::Value;

use crate::cluster::order::natural_cmp;
use crate::publish::keys;
use progress::{eta, progress};

/// One pod of the job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodRow {
    /// `worker/1`, as trainlet-init resolved it; empty before init did.
    pub task: String,
    pub pod: String,
    pub ip: String,
    pub phase: String,
    /// `ok` or `degraded` (the report's), or empty without a reporter yet.
    pub health: String,
    /// Why degraded, from the report.
    pub reasons: Vec<String>,
    /// `4/4`: seen / expected; `4` when nothing is expected; empty without a report.
    pub gpus: String,
    /// `current`, `stale: …`, or empty where no peer watch runs.
    pub cluster: String,
    /// The containers' restarts plus those of CMD under `trainlet exec`.
    pub restarts: u64,
    /// The newest OOM kill in the report: `python (pid 812) in trainer at 12:03:04Z`.
    pub last_oom: String,
    /// CMD's last progress under `trainlet exec --stall-after`: `step 42 at 12:03:04Z`,
    /// or `stalled since 12:01:00Z (step 42)`; empty without a progress watch.
    pub progress: String,
    /// The time remaining CMD last reported through the Kubeflow progress endpoint:
    /// `13m15s`; empty when it reported none.
    pub eta: String,
    /// Whether CMD is stalled now.
    pub stalled: bool,
    /// Where CMD's ranks were at the last capture of their stacks (a stall of the pod
    /// or of its job), each place once; empty without one.
    #[serde(rename = "where", skip_serializing_if = "Vec::is_empty")]
    pub stuck_at: Vec<String>,
    /// The reason of the newest Event about the pod.
    pub last_event: String,
}

/// The job as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The Job or JobSet is suspended: Kueue has not admitted it (yet).
    NotAdmitted,
    /// Every pod Running, healthy, its cluster current.
    Healthy,
    /// Pods not Running yet: scheduling, or waiting in trainlet-init.
    Starting,
    /// Running, but a pod is degraded, its cluster stale, or its CMD stalled.
    Degraded,
    /// A pod failed.
    Failing,
    /// Every pod succeeded, or the Job or JobSet is complete.
    Completed,
    /// No pod matches (yet).
    Empty,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::NotAdmitted => "not admitted",
            State::Healthy => "healthy",
            State::Starting => "starting",
            State::Degraded => "degraded",
            State::Failing => "failing",
            State::Completed => "completed",
            State::Empty => "no pods",
        }
    }
}

/// What `status` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    pub state: State,
    /// One line for the job: the state and what makes it so.
    pub verdict: String,
    /// Where the pods are stuck, grouped, the odd ones named
    /// ([`crate::stacks::odd`]): only once a pod captured its stacks.
    #[serde(rename = "where", skip_serializing_if = "Option::is_none")]
    pub stuck_at: Option<String>,
    pub pods: Vec<PodRow>,
}

/// The longest cell, in characters: longer text is cut, and ends in `…`.
pub const CELL_MAX: usize = 200;
/// The most reasons of one pod that its row keeps.
pub const REASONS_MAX: usize = 8;
/// The most pods the verdict names; it counts the others.
pub const VERDICT_PODS_MAX: usize = 5;

/// The rows, ordered by task (types by name, indexes by number; pods without a task
/// last, by natural name order), and the verdict. `what` names the job in the verdict;
/// `owner` is the Job or JobSet, where a name was given; `today` is the UTC date
/// (`2026-11-25`), which times of that day leave out.
pub fn view(
    what: &str,
    owner: Option<&Owner>,
    pods: &[Pod],
    events: &[Event],
    today: &str,
) -> View {
    let mut rows: Vec<PodRow> = pods.iter().map(|p| row(p, events, today)).collect();
    rows.sort_by(by_task);
    let (state, verdict) = match owner {
        Some(o) => owner_verdict(o, &rows).unwrap_or_else(|| verdict(&o.what, &rows)),
        None => verdict(what, &rows),
    };
    View {
        state,
        verdict,
        stuck_at: stuck_at(&rows),
        pods: rows,
    }
}

/// The pods compared by where their ranks are, once any pod said.
fn stuck_at(rows: &[PodRow]) -> Option<String> {
    let pods: Vec<(String, Vec<String>)> = rows
        .iter()
        .map(|r| (r.pod.clone(), r.stuck_at.clone()))
        .collect();
    match crate::stacks::odd::compare(&pods) {
        crate::stacks::odd::Comparison::Unknown => None,
        c => Some(c.text()),
    }
}

fn by_task(a: &PodRow, b: &PodRow) -> Ordering {
    match (a.task.is_empty(), b.task.is_empty()) {
        (false, true) => Ordering::Less,
        (true, false) => Ordering::Greater,
        _ => natural_cmp(&a.task, &b.task).then_with(|| natural_cmp(&a.pod, &b.pod)),
    }
}

/// One pod's row; every text in it escaped and bounded ([`cell`]).
pub fn row(pod: &Pod, events: &[Event], today: &str) -> PodRow {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let annotation = |k: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
            .unwrap_or_default()
    };
    let status = pod.status.as_ref();
    let report: Value = serde_json::from_str(annotation(keys::REPORT)).unwrap_or(Value::Null);
    // Counts from the API and from the published report: added without wrapping.
    let container_restarts = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .map(|c| u64::try_from(c.restart_count).unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    let exec_restarts = report["exec"]["restarts"].as_u64().unwrap_or(0);
    let mut reasons: Vec<String> = report["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(cell))
        .collect();
    if reasons.len() > REASONS_MAX {
        let more = reasons.len() - REASONS_MAX;
        reasons.truncate(REASONS_MAX);
        reasons.push(format!("{more} more"));
    }
    let progress_value = serde_json::from_str::<Value>(annotation(keys::PROGRESS));
    PodRow {
        task: cell(annotation(keys::TASK)),
        ip: cell(&status.and_then(|s| s.pod_ip.clone()).unwrap_or_default()),
        phase: cell(&phase(pod)),
        health: cell(annotation(keys::HEALTH)),
        reasons,
        gpus: cell(&gpus(&report)),
        cluster: cell(annotation(keys::CLUSTER)),
        restarts: container_restarts.saturating_add(exec_restarts),
        last_oom: cell(&last_oom(&report, today)),
        progress: progress_value
            .as_ref()
            .map(|p| cell(&progress(p, today)))
            .unwrap_or_default(),
        eta: progress_value.as_ref().map(eta).unwrap_or_default(),
        stalled: progress_value.as_ref().is_ok_and(|p| p["stalled"] == true),
        stuck_at: progress_value.as_ref().map(places).unwrap_or_default(),
        last_event: cell(&last_event(&name, events)),
        pod: cell(&name),
    }
}

/// The phase, with the reason a pod waits or failed where the kubelet gave one:
/// `Pending (Unschedulable)`, `Pending (in trainlet-init)`, `Failed (OOMKilled)`.
fn phase(pod: &Pod) -> String {
    let Some(s) = pod.status.as_ref() else {
        return "Pending".into();
    };
    let phase = s.phase.clone().unwrap_or_else(|| "Pending".into());
    if pod.metadata.deletion_timestamp.is_some() {
        return format!("{phase} (deleting)");
    }
    let unschedulable = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.reason.clone());
    let terminated = s
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.reason.clone())
        .find(|r| r != "Completed");
    // A non-restartable init container that runs: the pod waits in it (trainlet-init
    // waits there for its peers).
    let in_init = s
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| {
            c.state.as_ref().is_some_and(|st| st.running.is_some()) && !c.started.unwrap_or(false)
        })
        .map(|c| c.name.clone());
    match (phase.as_str(), unschedulable, terminated) {
        ("Pending", Some(r), _) => format!("Pending ({r})"),
        ("Pending", None, _) if in_init.is_some() => {
            format!("Pending (in {})", in_init.unwrap_or_default())
        }
        ("Failed", _, Some(r)) => format!("Failed ({r})"),
        _ => phase,
    }
}

fn gpus(report: &Value) -> String {
    let Some(count) = report["gpu"]["count"].as_u64() else {
        return String::new();
    };
    if report["gpu"]["status"] == "unknown" {
        return "?".into();
    }
    match report["gpu"]["expected"]["count"].as_u64() {
        Some(expected) => format!("{count}/{expected}"),
        None => count.to_string(),
    }
}

fn last_oom(report: &Value, today: &str) -> String {
    let Some(kill) = report["oom"]["recent"].as_array().and_then(|r| r.last()) else {
        return String::new();
    };
    let container = kill["container"].as_str().unwrap_or_default();
    let time = clock(kill["time"].as_str().unwrap_or_default(), today);
    match (
        kill["process"]["comm"].as_str(),
        kill["process"]["pid"].as_u64(),
    ) {
        (Some(comm), Some(pid)) => format!("{comm} (pid {pid}) in {container} at {time}"),
        _ => format!("{container} at {time}"),
    }
}

/// When an Event happened last: by its series' last time, else its event time, else
/// the old API's last timestamp, else its creation.
fn when(e: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The newest Event about each of the job's pods, out of a namespace's Events read page
/// by page: at most one Event per pod is kept, however many the namespace holds, and
/// none about other objects. An Event that names a pod's UID must name this pod's (a
/// pod of the same name before it is another pod).
#[derive(Debug, Default)]
pub struct NewestEvents {
    /// Pod name → UID.
    pods: BTreeMap<String, String>,
    newest: BTreeMap<String, Event>,
}

impl NewestEvents {
    pub fn new(pods: &[Pod]) -> Self {
        NewestEvents {
            pods: pods
                .iter()
                .filter_map(|p| {
                    Some((
                        p.metadata.name.clone()?,
                        p.metadata.uid.clone().unwrap_or_default(),
                    ))
                })
                .collect(),
            newest: BTreeMap::new(),
        }
    }

    /// Keeps `e` if it is about one of the pods and newer than what is kept for it.
    pub fn add(&mut self, e: Event) {
        let Some(r) = e.regarding.as_ref() else {
            return;
        };
        let (Some("Pod"), Some(name)) = (r.kind.as_deref(), r.name.as_deref()) else {
            return;
        };
        let Some(uid) = self.pods.get(name) else {
            return;
        };
        if r.uid
            .as_deref()
            .is_some_and(|u| !u.is_empty() && !uid.is_empty() && u != uid)
        {
            return;
        }
        let newer = self
            .newest
            .get(name)
            .is_none_or(|kept| when(&e) >= when(kept));
        if newer {
            self.newest.insert(name.to_string(), e);
        }
    }

    /// The kept Events, one per pod at most, by pod name.
    pub fn into_events(self) -> Vec<Event> {
        self.newest.into_values().collect()
    }
}

/// The reason of the newest Event about pod `name`.
fn last_event(name: &str, events: &[Event]) -> String {
    events
        .iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Pod") && r.name.as_deref() == Some(name)
            })
        })
        .max_by_key(|e| when(e))
        .and_then(|e| e.reason.clone())
        .unwrap_or_default()
}

/// The table `status` prints: one line per pod under a header, columns aligned, `-`
/// for what is not known yet.
pub fn table(view: &View) -> String {
    let header = [
        "TASK",
        "POD",
        "IP",
        "PHASE",
        "HEALTH",
        "GPUS",
        "CLUSTER",
        "RESTARTS",
        "PROGRESS",
        "ETA",
        "LAST OOM",
        "LAST EVENT",
    ];
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in &view.pods {
        lines.push(vec![
            dash(&r.task),
            r.pod.clone(),
            dash(&r.ip),
            r.phase.clone(),
            dash(&r.health),
            dash(&r.gpus),
            dash(&r.cluster),
            r.restarts.to_string(),
            dash(&r.progress),
            dash(&r.eta),
            dash(&r.last_oom),
            dash(&r.last_event),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in &lines {
        let mut line = String::new();
        for (i, (c, w)) in l.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("   ");
            }
            line.push_str(c);
            // Padded by hand: `format!("{c:<w$}")` panics on a width past 65,535.
            line.extend(std::iter::repeat_n(
                ' ',
                w.saturating_sub(c.chars().count()),
            ));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str(&view.verdict);
    out.push('\n');
    if let Some(at) = &view.stuck_at {
        out.push_str(&format!("where: {at}\n"));
    }
    out
}

/// The places a pod's progress annotation gives (`where`): strings only, each a cell,
/// at most [`crate::stacks::summary::MAX_PLACES`].
fn places(progress: &Value) -> Vec<String> {
    progress["where"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .take(crate::stacks::summary::MAX_PLACES)
                .map(cell)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
