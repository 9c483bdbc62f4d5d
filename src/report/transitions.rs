//! The Events of a report's transitions: what changed since the last report, each
//! announced once (a mismatch once, not every interval), and the peers' losses and
//! replacements once per task and state.

use std::collections::{BTreeMap, BTreeSet};

use super::document::Report;
use crate::cluster::drift::{self, Drift, Held};
use crate::event::Event;
use crate::reason::Reason;
use crate::report::probe::gpu::{self, GpuInfo, GpuStatus};
use crate::report::probe::ports;

/// What was already announced by Events, so that Events fire on transitions only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Announced {
    pub(super) gpu: Option<(GpuStatus, u32)>,
    pub(super) conflicts: BTreeSet<u16>,
    /// The GPUs announced as needing a reset, by index.
    pub(super) resets: BTreeSet<u32>,
    /// Why the GPUs are gone, as first announced: NVML's event thread and the probe's
    /// count can both tell, in either order, and the report says what the Event said.
    pub(super) lost: Option<String>,
    /// Each task's state last announced by the peer watch ([`held_key`]).
    peers: BTreeMap<String, String>,
}

/// The Events for what changed since the last report, and whether any of it is urgent
/// (a new conflict: publish at once). OOM kills are announced where they are
/// recorded, one Event each.
pub fn transitions(announced: &mut Announced, report: &Report) -> (Vec<Event>, bool) {
    let mut out = Vec::new();
    let mut urgent = false;
    let now = (report.gpu.status.clone(), report.gpu.count);
    // A count that becomes known is published at once: until then the pod said
    // `unknown`, which a dashboard or an alert reads as a problem.
    if matches!(announced.gpu, Some((GpuStatus::Unknown, _))) && now.0 != GpuStatus::Unknown {
        urgent = true;
    }
    if announced.gpu.as_ref() != Some(&now) {
        if let Some(e) = &report.gpu.expected {
            let info = GpuInfo {
                devices: report.gpu.devices.clone(),
                driver: report.gpu.driver.clone(),
                nvml: if report.gpu.nvml == "ok" {
                    Ok(())
                } else {
                    Err(gpu::Unavailable::QueryFailed { why: String::new() })
                },
                faulty: report.gpu.faulty.clone(),
            };
            let was = announced.gpu.as_ref().map(|(s, _)| s.clone());
            match report.gpu.status {
                GpuStatus::Mismatch => out.push(Event::warning(
                    Reason::GpuCountMismatch,
                    gpu::message(&info, e, &report.container),
                )),
                GpuStatus::Unavailable if was != Some(GpuStatus::Unavailable) => {
                    let why = report.gpu.nvml.trim_start_matches("unavailable: ");
                    out.push(Event::warning(
                        Reason::GpuUnavailable,
                        format!(
                            "container {} expects {} GPU{} ({}) but NVML is unavailable: {why}",
                            report.container,
                            e.count,
                            if e.count == 1 { "" } else { "s" },
                            e.source
                        ),
                    ))
                }
                _ => {}
            }
        }
        announced.gpu = Some(now);
    }
    match &report.gpu.lost {
        Some(why) if announced.lost.is_none() => {
            out.push(Event::warning(Reason::GpuLost, why.clone()));
            urgent = true;
            announced.lost = Some(why.clone());
        }
        None => announced.lost = None,
        Some(_) => {}
    }
    for note in gpu::new_resets(&report.gpu.faulty, &mut announced.resets, &report.container) {
        out.push(Event::warning(Reason::GpuResetRequired, note));
        urgent = true;
    }
    let conflicts: BTreeSet<u16> = report
        .ports
        .iter()
        .filter(|p| p.state.is_conflict())
        .map(|p| p.port)
        .collect();
    for p in report.ports.iter().filter(|p| p.state.is_conflict()) {
        if !announced.conflicts.contains(&p.port) {
            out.push(Event::warning(
                Reason::PortConflict,
                ports::conflict_message(p.port, &p.state, &report.container),
            ));
            urgent = true;
        }
    }
    announced.conflicts = conflicts;
    (out, urgent)
}

/// What makes a task's state news: lost (whatever became of it since), or replaced at
/// this address.
fn held_key(h: &Held) -> String {
    match h {
        Held::Current => "current".into(),
        Held::Lost { .. } => "lost".into(),
        Held::Replaced { uid, address, .. } => format!("replaced {uid} {address}"),
    }
}

/// PeerLost / PeerReplaced, once per task and state (a pod being deleted, then gone,
/// then replaced without an address yet is one loss); a task back to current clears.
pub fn peer_transitions(announced: &mut Announced, cluster: &[Drift]) -> Vec<Event> {
    let mut out = Vec::new();
    for d in cluster {
        let key = held_key(&d.held);
        if announced.peers.get(&d.task) != Some(&key) {
            out.extend(drift::event(d));
            announced.peers.insert(d.task.clone(), key);
        }
    }
    out
}
