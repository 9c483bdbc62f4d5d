//! The reporter's decisions, without I/O: what the probes observed goes in; the
//! report, its health, the annotations the pod should carry and the Events of each
//! transition come out. The engine feeds it after every probe, notification and pod
//! event, and publishes what it returns through the outbox.
//!
//! Health is `degraded` while a person should look: fewer GPUs than expected, GPUs
//! expected but NVML unavailable, GPUs lost since they were seen, a GPU that needs a
//! reset or does not answer, a critical XID error, a port conflict, or an OOM kill
//! since trainlet started. Events fire on transitions only: a mismatch is announced once, not every
//! interval.

use std::collections::{BTreeMap, BTreeSet};

pub use super::budget::REPORT_MAX;
use super::document::{ExecMark, GpuSection, Health, OomSection, Report, XidCount};
use super::previous::Previous;
use super::transitions::{Announced, peer_transitions, transitions};
use crate::cluster::drift::{ClusterStatus, Drift};
use crate::event::Event;
use crate::publish::keys;
use crate::report::probe::gpu::events::XidWatch;
use crate::report::probe::gpu::xid::{XidError, XidLedger};
use crate::report::probe::gpu::{self, Expected, GpuInfo, GpuStatus};
use crate::report::probe::oom::OomKill;
use crate::report::probe::ports::{self, PortEntry, PortState};

/// What the probes observed, the input of [`assemble`].
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub mode: &'static str,
    pub container: &'a str,
    pub since: &'a str,
    pub gpu: &'a GpuInfo,
    pub expected: Option<&'a Expected>,
    pub ports: &'a BTreeMap<u16, PortState>,
    pub oom_total: u64,
    pub oom_by_container: &'a BTreeMap<String, u64>,
    pub oom_recent: &'a [OomKill],
    pub oom_sources: Vec<String>,
    pub errors: BTreeMap<String, String>,
    /// The most GPUs NVML has shown at once since trainlet started.
    pub gpus_seen: u32,
    /// NVML's event thread reported the GPUs lost.
    pub gpu_lost: Option<&'a str>,
    pub xids: &'a XidLedger,
    /// Which GPUs NVML's event API watches, once registered.
    pub xid_watch: Option<&'a XidWatch>,
    /// Why the GPUs cannot be seen at all (a sidecar without GPUs or observations).
    pub gpu_unknown: Option<&'a str>,
    pub exec: Option<&'a ExecMark>,
    /// Where each task of the resolved cluster stands (the sidecar's peer watch).
    pub cluster: Option<&'a [Drift]>,
    /// What the reporter cannot publish, and why: the cluster the other pods wait for
    /// (the resolver's), or its own annotations.
    pub unpublished: Option<&'a str>,
}

/// Builds the report and decides health. Degraded means a person should look: a GPU
/// count mismatch, GPUs expected but NVML unavailable, a port conflict, or an OOM kill
/// since trainlet started.
pub fn assemble(o: Observed<'_>) -> Report {
    let status = match o.gpu_unknown {
        Some(_) => GpuStatus::Unknown,
        None => gpu::verdict(o.gpu, o.expected),
    };
    let lost = if o.gpu_unknown.is_some() {
        None
    } else {
        gpu::lost(o.gpu, o.gpus_seen, o.gpu_lost, o.container)
    };
    let mut reasons = gpu_reasons(&o, &status, lost.as_deref());
    reasons.extend(xid_reasons(o.xids));
    for (port, state) in o.ports {
        if state.is_conflict() {
            reasons.push(ports::conflict_message(*port, state, o.container));
        }
    }
    let cluster = o.cluster.map(ClusterStatus::of);
    if let Some(c) = cluster.as_ref().and_then(ClusterStatus::stale) {
        reasons.push(format!("the cluster this pod was given is {c}"));
    }
    if let Some(why) = o.unpublished {
        reasons.push(why.to_string());
    }
    reasons.extend(oom_reason(&o));
    Report {
        health: if reasons.is_empty() {
            Health::Ok
        } else {
            Health::Degraded
        },
        reasons,
        mode: o.mode,
        container: o.container.to_string(),
        since: o.since.to_string(),
        gpu: gpu_section(&o, status, lost),
        ports: o
            .ports
            .iter()
            .map(|(p, s)| PortEntry {
                port: *p,
                state: s.clone(),
            })
            .collect(),
        oom: OomSection {
            kills: o.oom_total,
            by_container: o.oom_by_container.clone(),
            sources: o.oom_sources,
            recent: o.oom_recent.to_vec(),
        },
        errors: o.errors,
        exec: o.exec.cloned(),
        cluster,
        truncated: false,
    }
}

/// The GPUs' reasons: a count that is not the one expected, GPUs lost, GPUs at fault.
fn gpu_reasons(o: &Observed<'_>, status: &GpuStatus, lost: Option<&str>) -> Vec<String> {
    let mut reasons = Vec::new();
    if let (GpuStatus::Mismatch | GpuStatus::Unavailable, Some(e)) = (status, o.expected) {
        reasons.push(gpu::message(o.gpu, e, o.container));
    }
    reasons.extend(lost.map(str::to_string));
    if o.gpu_unknown.is_none() {
        reasons.extend(gpu::fault_reasons(o.gpu, o.container));
    }
    reasons
}

/// A few critical XIDs by name, the rest summed up: one GPU can report many, and the
/// reasons after them (a port conflict) must still fit in the report.
fn xid_reasons(xids: &XidLedger) -> Vec<String> {
    const XID_REASONS: usize = 3;
    let critical: Vec<&XidError> = xids.critical().collect();
    let mut reasons: Vec<String> = critical
        .iter()
        .take(XID_REASONS)
        .map(|e| match xids.counts[*e] {
            1 => e.message(),
            n => format!("{} ({n} times)", e.message()),
        })
        .collect();
    if critical.len() > XID_REASONS {
        let rest = &critical[XID_REASONS..];
        let gpus: BTreeSet<u32> = rest.iter().map(|e| e.gpu).collect();
        reasons.push(format!(
            "{} more kinds of critical XID error on {} GPU{} ({} in all)",
            rest.len(),
            gpus.len(),
            if gpus.len() == 1 { "" } else { "s" },
            rest.iter().map(|e| xids.counts[*e]).sum::<u64>()
        ));
    }
    reasons
}

/// The OOM kills since trainlet started, the last one named.
fn oom_reason(o: &Observed<'_>) -> Option<String> {
    if o.oom_total == 0 {
        return None;
    }
    let last = o
        .oom_recent
        .last()
        .map(|k| format!(" (last: {})", k.message()))
        .unwrap_or_default();
    Some(format!(
        "{} OOM kill{} since {}{last}",
        o.oom_total,
        if o.oom_total == 1 { "" } else { "s" },
        o.since
    ))
}

/// The report's GPU section.
fn gpu_section(o: &Observed<'_>, status: GpuStatus, lost: Option<String>) -> GpuSection {
    GpuSection {
        count: o.gpu.count(),
        expected: o.expected.cloned(),
        status,
        nvml: o.gpu.nvml_status(),
        driver: o.gpu.driver.clone(),
        devices: o.gpu.devices.clone(),
        faulty: o.gpu.faulty.clone(),
        xid_watch: o.xid_watch.cloned(),
        lost,
        xid_errors: o
            .xids
            .counts
            .iter()
            .map(|(e, n)| XidCount {
                error: e.clone(),
                count: *n,
            })
            .collect(),
        xid_errors_other: o.xids.other,
        unknown: o.gpu_unknown.map(str::to_string),
    }
}

/// The report as JSON of at most [`REPORT_MAX`] bytes: see [`super::budget`].
pub fn render(report: &Report) -> String {
    let value = serde_json::to_value(report).expect("a report serializes");
    super::budget::fit(value, REPORT_MAX)
}

/// The annotations the pod should carry: `Some` to set, `None` to remove.
pub fn annotations(report: &Report, report_json: &str) -> BTreeMap<String, Option<String>> {
    let conflicts: Vec<String> = report
        .ports
        .iter()
        .filter(|p| p.state.is_conflict())
        .map(|p| p.port.to_string())
        .collect();
    let products = {
        let mut seen: Vec<&str> = Vec::new();
        for d in &report.gpu.devices {
            if !seen.contains(&d.name.as_str()) {
                seen.push(&d.name);
            }
        }
        seen.join(",")
    };
    let count = match report.gpu.status {
        GpuStatus::Unknown => "unknown".to_string(),
        _ => report.gpu.count.to_string(),
    };
    BTreeMap::from([
        (keys::GPU_COUNT.into(), Some(count)),
        (
            keys::GPU_PRODUCT.into(),
            (!products.is_empty()).then_some(products),
        ),
        (
            keys::PORT_CONFLICT.into(),
            (!conflicts.is_empty()).then(|| conflicts.join(",")),
        ),
        (keys::OOM_KILLS.into(), Some(report.oom.kills.to_string())),
        (keys::HEALTH.into(), Some(report.health.as_str().into())),
        (
            keys::CLUSTER.into(),
            report.cluster.as_ref().map(|c| c.text().to_string()),
        ),
        (keys::REPORT.into(), Some(report_json.to_string())),
    ])
}

/// What the engine remembers between evaluations: the transitions already announced,
/// and the last summary logged, so the log shows changes, not every probe.
#[derive(Debug, Default)]
pub struct State {
    announced: Announced,
    logged: String,
}

/// The outcome of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub report: Report,
    /// The annotations the pod should carry: `Some` to set, `None` to remove.
    pub annotations: BTreeMap<String, Option<String>>,
    /// The Events of what changed since the last step.
    pub events: Vec<Event>,
    /// Publish at once (a new port conflict), not at the next patch interval.
    pub urgent: bool,
    /// A one-line summary, when it differs from the last one logged.
    pub summary: Option<String>,
}

impl State {
    /// Starts from what the pod already says, so that a restarted reporter does not
    /// announce again what the pod's Events already told.
    pub fn seed(&mut self, prev: &Previous) {
        if let Some(status) = &prev.gpu.status {
            self.announced.gpu = Some((status.clone(), prev.gpu.count));
        }
        self.announced.conflicts = prev
            .ports
            .iter()
            .filter(|p| p.state.is_conflict())
            .map(|p| p.port)
            .collect();
        self.announced.lost = prev.gpu.lost.clone();
        gpu::new_resets(&prev.gpu.faulty, &mut self.announced.resets, "");
    }

    /// Evaluates the latest observations.
    pub fn step(&mut self, observed: Observed<'_>) -> Step {
        let observed_cluster = observed.cluster;
        let mut report = assemble(observed);
        let (mut events, mut urgent) = transitions(&mut self.announced, &report);
        // While the GPUs are gone, the report keeps the reason the Event gave.
        if let (Some(said), Some(now)) = (&self.announced.lost, report.gpu.lost.as_mut())
            && said != now
        {
            for r in report.reasons.iter_mut().filter(|r| *r == now) {
                *r = said.clone();
            }
            *now = said.clone();
        }
        let json = render(&report);
        let annotations = annotations(&report, &json);
        if let Some(c) = observed_cluster {
            let peers = peer_transitions(&mut self.announced, c);
            urgent |= !peers.is_empty();
            events.extend(peers);
        }
        let line = summary(&report);
        let summary = (line != self.logged).then(|| {
            self.logged = line.clone();
            line
        });
        Step {
            report,
            annotations,
            events,
            urgent,
            summary,
        }
    }
}

/// `health=ok gpus=4/4 nvml="ok" ports=8470:listening oom_kills=0`, for the log.
fn summary(report: &Report) -> String {
    format!(
        "health={} gpus={}/{} nvml={:?} ports={} oom_kills={}",
        report.health.as_str(),
        report.gpu.count,
        report
            .gpu
            .expected
            .as_ref()
            .map_or("-".to_string(), |e| e.count.to_string()),
        report.gpu.nvml,
        report
            .ports
            .iter()
            .map(|p| format!(
                "{}:{}",
                p.port,
                match p.state {
                    PortState::Free => "free",
                    PortState::Listening { .. } => "listening",
                    PortState::Conflict { .. } => "conflict",
                    PortState::Unknown { .. } => "unknown",
                }
            ))
            .collect::<Vec<_>>()
            .join(","),
        report.oom.kills
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::probe::gpu::{FaultKind, GpuDevice, GpuFault, Unavailable};
    use crate::report::probe::ports::{ConflictReason, Owner};

    fn gpus(n: u32) -> GpuInfo {
        GpuInfo {
            devices: (0..n)
                .map(|i| GpuDevice {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "Fake GPU".into(),
                    memory_total_bytes: 16 << 30,
                    mig: None,
                })
                .collect(),
            driver: Some("550.54.15".into()),
            nvml: Ok(()),
            faulty: vec![],
        }
    }

    /// No GPU: the NVML library is not there, for `why`.
    fn no_nvml(why: &str) -> GpuInfo {
        GpuInfo::unavailable(Unavailable::LibraryNotFound {
            lib: "libnvidia-ml.so.1".into(),
            why: why.into(),
        })
    }

    fn limit(n: u32) -> Expected {
        Expected {
            count: n,
            source: "resources.limits[\"nvidia.com/gpu\"]".into(),
        }
    }

    fn observe<'a>(
        g: &'a GpuInfo,
        e: Option<&'a Expected>,
        ports: &'a BTreeMap<u16, PortState>,
        by: &'a BTreeMap<String, u64>,
        recent: &'a [OomKill],
    ) -> Report {
        assemble(Observed {
            ports,
            oom_total: by.values().sum(),
            oom_by_container: by,
            oom_recent: recent,
            oom_sources: vec!["pod status".into()],
            gpus_seen: g.count(),
            ..observed(g, e)
        })
    }

    static NO_XIDS: XidLedger = XidLedger {
        other: 0,
        counts: BTreeMap::new(),
    };

    #[test]
    fn four_of_four_gpus_is_ok_and_annotated() {
        let g = gpus(4);
        let e = limit(4);
        let ports = BTreeMap::from([(8470, PortState::Free)]);
        let r = observe(&g, Some(&e), &ports, &BTreeMap::new(), &[]);
        assert_eq!(r.health, Health::Ok);
        assert!(r.reasons.is_empty());
        let json = render(&r);
        let a = annotations(&r, &json);
        assert_eq!(a[keys::GPU_COUNT], Some("4".into()));
        assert_eq!(a[keys::GPU_PRODUCT], Some("Fake GPU".into()));
        assert_eq!(a[keys::PORT_CONFLICT], None);
        assert_eq!(a[keys::OOM_KILLS], Some("0".into()));
        assert_eq!(a[keys::HEALTH], Some("ok".into()));
        let v: serde_json::Value = serde_json::from_str(a[keys::REPORT].as_ref().unwrap()).unwrap();
        assert_eq!(v["gpu"]["status"], "ok");
        assert_eq!(v["gpu"]["expected"]["count"], 4);
        assert_eq!(
            v["ports"][0],
            serde_json::json!({"port": 8470, "state": "free"})
        );
    }

    #[test]
    fn mismatch_unavailable_conflict_and_oom_degrade_with_reasons() {
        let g = gpus(4);
        let e = limit(8);
        let held = PortState::Conflict {
            reason: ConflictReason::ForeignProcess,
            owner: Some(Owner {
                pid: 7,
                comm: "nc".into(),
            }),
        };
        let ports = BTreeMap::from([(2222, PortState::Free), (8470, held)]);
        let by = BTreeMap::from([("trainer".to_string(), 1)]);
        let r = observe(&g, Some(&e), &ports, &by, &[]);
        assert_eq!(r.health, Health::Degraded);
        assert_eq!(
            r.reasons,
            vec![
                "container trainer sees 4 GPUs (Fake GPU) but 8 are expected (resources.limits[\"nvidia.com/gpu\"])".to_string(),
                "port 8470 is held by process nc (pid 7), which is not part of container trainer; trainer cannot listen on it".to_string(),
                "1 OOM kill since 2026-11-21T10:00:00Z".to_string(),
            ]
        );
        let a = annotations(&r, "{}");
        assert_eq!(a[keys::PORT_CONFLICT], Some("8470".into()));
        assert_eq!(a[keys::OOM_KILLS], Some("1".into()));
        assert_eq!(a[keys::HEALTH], Some("degraded".into()));

        let none =
            no_nvml("libnvidia-ml.so.1: cannot open shared object file: No such file or directory");
        let one = limit(1);
        let r = observe(&none, Some(&one), &BTreeMap::new(), &BTreeMap::new(), &[]);
        assert_eq!(r.gpu.status, GpuStatus::Unavailable);
        assert_eq!(annotations(&r, "{}")[keys::GPU_COUNT], Some("0".into()));
        assert_eq!(annotations(&r, "{}")[keys::GPU_PRODUCT], None);
    }

    #[test]
    fn events_fire_on_transitions_only() {
        let mut ann = Announced::default();
        let g = gpus(4);
        let e = limit(8);
        let free = BTreeMap::from([(8470, PortState::Free)]);
        let r = observe(&g, Some(&e), &free, &BTreeMap::new(), &[]);
        let (ev, urgent) = transitions(&mut ann, &r);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason.as_str(), "GPUCountMismatch");
        assert!(!urgent);
        // The same state again: nothing.
        assert_eq!(transitions(&mut ann, &r), (vec![], false));
        // A new conflict: one Event, urgent.
        let held = BTreeMap::from([(
            8470,
            PortState::Conflict {
                reason: ConflictReason::BeforeStart,
                owner: None,
            },
        )]);
        let r2 = observe(&g, Some(&e), &held, &BTreeMap::new(), &[]);
        let (ev, urgent) = transitions(&mut ann, &r2);
        assert_eq!(
            ev,
            vec![(
                "PortConflict",
                "port 8470 was already listening before container trainer started; trainer cannot listen on it".to_string()
            )]
        );
        assert!(urgent);
        assert_eq!(transitions(&mut ann, &r2), (vec![], false));
        // Cleared, then back: announced again.
        transitions(&mut ann, &r);
        assert_eq!(transitions(&mut ann, &r2).0.len(), 1);

        // Unavailable NVML with GPUs expected.
        let mut ann = Announced::default();
        let none = GpuInfo {
            devices: vec![],
            driver: None,
            faulty: vec![],
            nvml: Err(Unavailable::InitFailed {
                why: "NVIDIA driver is not loaded".into(),
            }),
        };
        let one = limit(1);
        let r = observe(&none, Some(&one), &free, &BTreeMap::new(), &[]);
        let (ev, _) = transitions(&mut ann, &r);
        assert_eq!(
            ev,
            vec![(
                "GPUUnavailable",
                "container trainer expects 1 GPU (resources.limits[\"nvidia.com/gpu\"]) but NVML is unavailable: init failed: NVIDIA driver is not loaded".to_string()
            )]
        );
        assert!(transitions(&mut ann, &r).0.is_empty());
    }

    #[test]
    fn the_report_stays_under_16_kib() {
        let g = gpus(8);
        let kill = OomKill {
            time: "2026-11-21T10:00:00Z".into(),
            container: "trainer".into(),
            source: "cgroup",
            process: None,
            group: false,
            memory_usage: Some(1),
            memory_peak: Some(1),
            memory_limit: Some("2Gi".into()),
            restart_count: None,
            exit_code: None,
        };
        let recent: Vec<OomKill> = (0..20).map(|_| kill.clone()).collect();
        let ports: BTreeMap<u16, PortState> = (1000..1700).map(|p| (p, PortState::Free)).collect();
        let by = BTreeMap::from([("trainer".to_string(), 20)]);
        let r = observe(&g, None, &ports, &by, &recent);
        let json = render(&r);
        assert!(json.len() <= REPORT_MAX, "{}", json.len());
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["truncated"], true);
        assert_eq!(v["oom"]["kills"], 20);
    }

    /// One evaluation through [`State::step`], as the engine makes it.
    fn step(
        state: &mut State,
        g: &GpuInfo,
        e: Option<&Expected>,
        ports: &BTreeMap<u16, PortState>,
        kills: &[OomKill],
    ) -> Step {
        let by = if kills.is_empty() {
            BTreeMap::new()
        } else {
            BTreeMap::from([("trainer".to_string(), kills.len() as u64)])
        };
        state.step(Observed {
            mode: "exec",
            ports,
            oom_total: kills.len() as u64,
            oom_by_container: &by,
            oom_recent: kills,
            oom_sources: vec!["pod status".into()],
            gpus_seen: g.count(),
            ..observed(g, e)
        })
    }

    /// [`step`] with GPUs seen before and XIDs counted.
    fn step_gpu(state: &mut State, g: &GpuInfo, seen: u32, xids: &XidLedger) -> Step {
        state.step(Observed {
            mode: "exec",
            gpus_seen: seen,
            xids,
            ..observed(g, None)
        })
    }

    /// As many critical XIDs as the training container can hand over (the ledger keeps
    /// 64 pairs, the rest counted together) and a port conflict: the report names a
    /// few XIDs, sums up the rest, keeps the conflict among its reasons, and fits.
    #[test]
    fn many_xids_leave_room_for_the_other_reasons() {
        let mut state = State::default();
        let mut xids = XidLedger::default();
        for i in 0..256u32 {
            xids.add(
                XidError {
                    gpu: i,
                    uuid: format!("GPU-{:036x}", u128::from(i) * 0x9e3779b97f4a7c15),
                    xid: 79,
                },
                3,
            );
        }
        let held = PortState::Conflict {
            reason: ConflictReason::ForeignProcess,
            owner: Some(Owner {
                pid: 7,
                comm: "nc".into(),
            }),
        };
        let ports = BTreeMap::from([(8470, held)]);
        let eight = gpus(8);
        let s = state.step(Observed {
            ports: &ports,
            gpus_seen: 8,
            xids: &xids,
            ..observed(&eight, None)
        });
        let conflict = "port 8470 is held by process nc (pid 7), which is not part of container trainer; trainer cannot listen on it";
        assert_eq!(s.report.reasons.len(), 5, "{:?}", s.report.reasons);
        assert_eq!(
            s.report.reasons[3],
            "61 more kinds of critical XID error on 61 GPUs (183 in all)"
        );
        assert_eq!(s.report.reasons[4], conflict);
        let text = s.annotations[keys::REPORT].clone().unwrap();
        assert!(
            text.len() <= super::super::budget::REPORT_MAX,
            "{}",
            text.len()
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["reasons"][4], conflict, "{text}");
        assert_eq!(v["ports"][0]["port"], 8470);
        assert_eq!(v["gpu"]["xid_errors_other"], 3 * 192);
        assert_eq!(s.annotations[keys::PORT_CONFLICT], Some("8470".into()));
    }

    /// A loss told first by the count and then by NVML's event thread (or the other way
    /// round) is one loss: one Event, and the report keeps its reason.
    #[test]
    fn a_gpu_loss_keeps_the_reason_its_event_gave() {
        let mut state = State::default();
        let observe = |state: &mut State, g: &GpuInfo, lost: Option<&str>| {
            state.step(Observed {
                gpus_seen: 4,
                gpu_lost: lost,
                ..observed(g, None)
            })
        };
        observe(&mut state, &gpus(4), None);
        let first = observe(&mut state, &gpus(0), None);
        assert_eq!(first.events.len(), 1);
        let said = first.events[0].note.clone();
        assert_eq!(
            said,
            "container trainer saw 4 GPUs and now sees 0 (NVML: ok)"
        );
        let then = observe(&mut state, &gpus(0), Some("NVML reports the GPU is lost"));
        assert!(then.events.is_empty());
        assert_eq!(then.report.gpu.lost.as_deref(), Some(said.as_str()));
        assert!(
            then.report.reasons.contains(&said),
            "{:?}",
            then.report.reasons
        );
        // Back: the next loss is news again.
        observe(&mut state, &gpus(4), None);
        assert_eq!(observe(&mut state, &gpus(0), Some("gone")).events.len(), 1);
    }

    /// The sidecar's first report may say the GPU count is unknown (exec's first
    /// observation has not arrived); the count once known goes out at once, not at the
    /// next patch interval.
    #[test]
    fn a_gpu_count_that_becomes_known_is_urgent() {
        let mut state = State::default();
        let four = gpus(4);
        let observe = |state: &mut State, unknown: Option<&str>| {
            state.step(Observed {
                gpus_seen: 4,
                gpu_unknown: unknown,
                ..observed(&four, None)
            })
        };
        let first = observe(&mut state, Some("no observations yet"));
        assert_eq!(first.annotations[keys::GPU_COUNT], Some("unknown".into()));
        let known = observe(&mut state, None);
        assert_eq!(known.annotations[keys::GPU_COUNT], Some("4".into()));
        assert!(known.urgent);
        assert!(!observe(&mut state, None).urgent);
    }

    #[test]
    fn a_critical_xid_degrades_and_repeats_are_counted() {
        let mut state = State::default();
        let mut xids = XidLedger::default();
        let e = XidError {
            gpu: 2,
            uuid: "GPU-2".into(),
            xid: 79,
        };
        xids.record(e.clone());
        let s = step_gpu(&mut state, &gpus(4), 4, &xids);
        assert_eq!(s.report.health, Health::Degraded);
        assert_eq!(
            s.report.reasons,
            ["GPU 2 (GPU-2) reported XID 79 (GPU has fallen off the bus)"]
        );
        xids.record(e);
        xids.record(XidError {
            gpu: 0,
            uuid: "GPU-0".into(),
            xid: 13,
        });
        let s = step_gpu(&mut state, &gpus(4), 4, &xids);
        assert_eq!(
            s.report.reasons,
            ["GPU 2 (GPU-2) reported XID 79 (GPU has fallen off the bus) (2 times)"]
        );
        let v: serde_json::Value = serde_json::from_str(&render(&s.report)).unwrap();
        assert_eq!(
            v["gpu"]["xid_errors"],
            serde_json::json!([
                {"gpu": 0, "uuid": "GPU-0", "xid": 13, "count": 1},
                {"gpu": 2, "uuid": "GPU-2", "xid": 79, "count": 2}
            ])
        );
        // A non-critical XID alone is counted, not degraded.
        let mut only13 = XidLedger::default();
        only13.record(XidError {
            gpu: 0,
            uuid: "GPU-0".into(),
            xid: 13,
        });
        let s = step_gpu(&mut State::default(), &gpus(4), 4, &only13);
        assert_eq!(s.report.health, Health::Ok);
    }

    #[test]
    fn gpus_lost_mid_run_are_announced_once_and_degrade() {
        let mut state = State::default();
        let s = step_gpu(&mut state, &gpus(4), 4, &XidLedger::default());
        assert!(s.events.is_empty());
        let gone = GpuInfo {
            devices: vec![],
            driver: None,
            faulty: vec![],
            nvml: Err(Unavailable::QueryFailed {
                why: "GPU is lost".into(),
            }),
        };
        let s = step_gpu(&mut state, &gone, 4, &XidLedger::default());
        assert_eq!(s.report.health, Health::Degraded);
        let note = "container trainer saw 4 GPUs and now sees 0 (NVML: unavailable: query failed: GPU is lost)";
        assert_eq!(pairs(&s), [("GPULost", note)]);
        assert!(s.urgent);
        // Still lost: no second Event.
        let s = step_gpu(&mut state, &gone, 4, &XidLedger::default());
        assert!(s.events.is_empty());
        assert_eq!(s.report.reasons, [note]);
        // Back: ok again.
        let s = step_gpu(&mut state, &gpus(4), 4, &XidLedger::default());
        assert_eq!(s.report.health, Health::Ok);
    }

    /// Four GPUs, `bad` of them faulty with `kind`: what the probe returns when NVML
    /// counts them but their queries fail.
    fn with_fault(bad: u32, kind: FaultKind, why: &str) -> GpuInfo {
        let mut g = gpus(4);
        g.devices.retain(|d| d.index != bad);
        g.faulty = vec![GpuFault {
            index: bad,
            uuid: format!("GPU-{bad}"),
            fault: kind,
            why: why.into(),
        }];
        g
    }

    #[test]
    fn one_lost_gpu_is_named_and_the_others_still_count() {
        let mut state = State::default();
        let e = limit(4);
        let xids = XidLedger::default();
        let step = |state: &mut State, g: &GpuInfo| {
            state.step(Observed {
                gpus_seen: 4,
                xids: &xids,
                ..observed(g, Some(&e))
            })
        };
        assert!(step(&mut state, &gpus(4)).events.is_empty());
        let g = with_fault(
            2,
            FaultKind::Lost,
            "device fell off the bus or has otherwise become inacessible",
        );
        let s = step(&mut state, &g);
        let mismatch = "container trainer sees 3 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"])";
        let lost = "container trainer lost GPU 2 (GPU-2): NVML reports the GPU is lost";
        assert_eq!(s.report.health, Health::Degraded);
        assert_eq!(s.report.reasons, [mismatch, lost]);
        assert_eq!(
            pairs(&s),
            [("GPUCountMismatch", mismatch), ("GPULost", lost)]
        );
        assert_eq!(s.annotations[keys::GPU_COUNT], Some("3".into()));
        let v: serde_json::Value = serde_json::from_str(&render(&s.report)).unwrap();
        assert_eq!(v["gpu"]["lost"], lost);
        assert_eq!(
            v["gpu"]["faulty"],
            serde_json::json!([{"index": 2, "uuid": "GPU-2", "fault": "lost",
                "why": "device fell off the bus or has otherwise become inacessible"}])
        );
        assert_eq!(
            v["gpu"]["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["index"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            [0, 1, 3]
        );
        // Still lost: nothing new.
        assert!(step(&mut state, &g).events.is_empty());
    }

    #[test]
    fn a_gpu_that_requires_a_reset_is_announced_once_as_such() {
        let mut state = State::default();
        let e = limit(4);
        let xids = XidLedger::default();
        let step = |state: &mut State, g: &GpuInfo| {
            state.step(Observed {
                gpus_seen: 4,
                xids: &xids,
                ..observed(g, Some(&e))
            })
        };
        step(&mut state, &gpus(4));
        let g = with_fault(
            1,
            FaultKind::ResetRequired,
            "device requires a reset before it can be used again",
        );
        let s = step(&mut state, &g);
        let mismatch = "container trainer sees 3 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"])";
        let reset = "container trainer cannot use GPU 1 (GPU-1): NVML says it requires a reset (device requires a reset before it can be used again); reset the GPU or reboot the node";
        assert_eq!(s.report.reasons, [mismatch, reset]);
        assert_eq!(s.report.gpu.lost, None);
        assert_eq!(
            pairs(&s),
            [("GPUCountMismatch", mismatch), ("GPUResetRequired", reset)]
        );
        assert!(s.urgent);
        assert!(step(&mut state, &g).events.is_empty());
        // A restarted reporter does not announce it again.
        let json = render(&step(&mut state, &g).report);
        let mut again = State::default();
        again.seed(&Previous::parse(&json).unwrap());
        assert!(step(&mut again, &g).events.is_empty());
        // Reset: ok, and a later need for a reset is news again.
        assert_eq!(step(&mut state, &gpus(4)).report.health, Health::Ok);
        assert_eq!(step(&mut state, &g).events.len(), 2);
    }

    #[test]
    fn mig_devices_count_against_mig_limits() {
        let mig = GpuInfo {
            devices: (0..2)
                .map(|j| GpuDevice {
                    index: 0,
                    uuid: format!("MIG-{j}"),
                    name: "NVIDIA A100-SXM4-80GB MIG 1g.10gb".into(),
                    memory_total_bytes: 9728 << 20,
                    mig: Some(j),
                })
                .collect(),
            driver: None,
            nvml: Ok(()),
            faulty: vec![],
        };
        let two = Expected {
            count: 2,
            source: "resources.limits[\"nvidia.com/mig-1g.10gb\"]".into(),
        };
        let r = assemble(Observed {
            gpus_seen: 2,
            ..observed(&mig, Some(&two))
        });
        assert_eq!(r.health, Health::Ok);
        assert_eq!(r.gpu.status, GpuStatus::Ok);
        let three = Expected { count: 3, ..two };
        let r = assemble(Observed {
            gpus_seen: 2,
            ..observed(&mig, Some(&three))
        });
        assert_eq!(
            r.reasons,
            [
                "container trainer sees 2 GPUs (NVIDIA A100-SXM4-80GB MIG 1g.10gb) but 3 are expected (resources.limits[\"nvidia.com/mig-1g.10gb\"])"
            ]
        );
    }

    fn reasons(s: &Step) -> Vec<&str> {
        s.events.iter().map(|e| e.reason.as_str()).collect()
    }

    /// Each Event as (reason, note).
    fn pairs(s: &Step) -> Vec<(&str, &str)> {
        s.events
            .iter()
            .map(|e| (e.reason.as_str(), e.note.as_str()))
            .collect()
    }

    fn free() -> BTreeMap<u16, PortState> {
        BTreeMap::from([(8470, PortState::Free)])
    }

    fn conflict() -> BTreeMap<u16, PortState> {
        BTreeMap::from([(
            8470,
            PortState::Conflict {
                reason: ConflictReason::ForeignProcess,
                owner: Some(Owner {
                    pid: 7,
                    comm: "nc".into(),
                }),
            },
        )])
    }

    #[test]
    fn step_gpu_mismatch_degrades_once_then_recovers_to_ok() {
        let mut st = State::default();
        let e = limit(4);
        let ok = step(&mut st, &gpus(4), Some(&e), &free(), &[]);
        assert_eq!(ok.report.health, Health::Ok);
        assert!(ok.events.is_empty());
        assert!(!ok.urgent);
        assert_eq!(
            ok.summary.as_deref(),
            Some("health=ok gpus=4/4 nvml=\"ok\" ports=8470:free oom_kills=0")
        );

        let lost = step(&mut st, &gpus(3), Some(&e), &free(), &[]);
        assert_eq!(lost.report.health, Health::Degraded);
        assert_eq!(reasons(&lost), ["GPUCountMismatch"]);
        assert_eq!(
            lost.events[0].note,
            "container trainer sees 3 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"])"
        );
        assert_eq!(lost.annotations[keys::HEALTH], Some("degraded".into()));
        assert_eq!(lost.annotations[keys::GPU_COUNT], Some("3".into()));

        // The same mismatch again: no new Event, no new log line.
        let again = step(&mut st, &gpus(3), Some(&e), &free(), &[]);
        assert!(again.events.is_empty());
        assert_eq!(again.summary, None);

        let back = step(&mut st, &gpus(4), Some(&e), &free(), &[]);
        assert_eq!(back.report.health, Health::Ok);
        assert!(back.report.reasons.is_empty());
        assert!(back.events.is_empty(), "recovery is no Warning");
        assert_eq!(back.annotations[keys::HEALTH], Some("ok".into()));
    }

    #[test]
    fn step_gpu_unavailable_is_announced_once() {
        let mut st = State::default();
        let none = no_nvml("not found");
        let e = limit(2);
        let s = step(&mut st, &none, Some(&e), &free(), &[]);
        assert_eq!(s.report.health, Health::Degraded);
        assert_eq!(s.report.gpu.status, GpuStatus::Unavailable);
        assert_eq!(reasons(&s), ["GPUUnavailable"]);
        assert!(
            s.events[0]
                .note
                .starts_with("container trainer expects 2 GPUs (resources.limits[\"nvidia.com/gpu\"]) but NVML is unavailable: "),
            "{}",
            s.events[0].note
        );
        assert!(
            step(&mut st, &none, Some(&e), &free(), &[])
                .events
                .is_empty()
        );
        // Without an expected count, no GPU is no problem.
        let mut st = State::default();
        let s = step(&mut st, &none, None, &free(), &[]);
        assert_eq!(s.report.health, Health::Ok);
        assert!(s.events.is_empty());
    }

    #[test]
    fn step_port_conflict_appears_urgently_and_clears() {
        let mut st = State::default();
        step(&mut st, &gpus(0), None, &free(), &[]);
        let c = step(&mut st, &gpus(0), None, &conflict(), &[]);
        assert_eq!(c.report.health, Health::Degraded);
        assert_eq!(reasons(&c), ["PortConflict"]);
        assert!(c.urgent, "a new conflict goes out at once");
        assert_eq!(c.annotations[keys::PORT_CONFLICT], Some("8470".into()));

        let still = step(&mut st, &gpus(0), None, &conflict(), &[]);
        assert!(still.events.is_empty());
        assert!(!still.urgent);

        let cleared = step(&mut st, &gpus(0), None, &free(), &[]);
        assert_eq!(cleared.report.health, Health::Ok);
        assert!(cleared.events.is_empty());
        assert_eq!(
            cleared.annotations[keys::PORT_CONFLICT],
            None,
            "the annotation is removed"
        );
        // Appearing again is a new transition.
        assert_eq!(
            reasons(&step(&mut st, &gpus(0), None, &conflict(), &[])),
            ["PortConflict"]
        );
    }

    #[test]
    fn step_oom_kill_degrades_and_is_counted() {
        let mut st = State::default();
        assert_eq!(
            step(&mut st, &gpus(0), None, &free(), &[]).report.health,
            Health::Ok
        );
        let kill = OomKill {
            time: "2026-11-21T10:05:00Z".into(),
            container: "trainer".into(),
            source: "cgroup",
            process: None,
            group: false,
            memory_usage: None,
            memory_peak: None,
            memory_limit: Some("2Gi".into()),
            restart_count: None,
            exit_code: None,
        };
        let s = step(
            &mut st,
            &gpus(0),
            None,
            &free(),
            std::slice::from_ref(&kill),
        );
        assert_eq!(s.report.health, Health::Degraded);
        assert_eq!(s.annotations[keys::OOM_KILLS], Some("1".into()));
        assert_eq!(
            s.report.reasons,
            [format!(
                "1 OOM kill since 2026-11-21T10:00:00Z (last: {})",
                kill.message()
            )]
        );
        // OOMKill Events are emitted where kills are recorded, one each, not here.
        assert!(s.events.is_empty());
        let v: serde_json::Value =
            serde_json::from_str(s.annotations[keys::REPORT].as_ref().unwrap()).unwrap();
        assert_eq!(v["oom"]["kills"], 1);
        assert_eq!(v["health"], "degraded");
    }

    #[test]
    fn a_seeded_state_does_not_announce_again_what_the_pod_already_says() {
        let e = limit(4);
        let mut first = State::default();
        let s = step(&mut first, &gpus(3), Some(&e), &conflict(), &[]);
        assert_eq!(reasons(&s), ["GPUCountMismatch", "PortConflict"]);
        let prev = Previous::parse(s.annotations[keys::REPORT].as_ref().unwrap()).unwrap();
        let mut restarted = State::default();
        restarted.seed(&prev);
        let s = step(&mut restarted, &gpus(3), Some(&e), &conflict(), &[]);
        assert!(s.events.is_empty(), "{:?}", s.events);
        // What changed while it was down is still news.
        let s = step(&mut restarted, &gpus(2), Some(&e), &conflict(), &[]);
        assert_eq!(reasons(&s), ["GPUCountMismatch"]);
        assert_eq!(Previous::parse("not json"), None);
    }

    #[test]
    fn an_unknown_gpu_count_is_said_so_and_is_no_problem() {
        let none = no_nvml("not found");
        let e = limit(4);
        let mut st = State::default();
        let s = st.step(Observed {
            gpu_unknown: Some("no observations"),
            ..observed(&none, Some(&e))
        });
        assert_eq!(s.report.health, Health::Ok);
        assert_eq!(s.report.gpu.status, GpuStatus::Unknown);
        assert_eq!(s.report.gpu.unknown.as_deref(), Some("no observations"));
        assert_eq!(s.annotations[keys::GPU_COUNT], Some("unknown".into()));
        assert!(s.events.is_empty());
    }

    /// What a sidecar of container `trainer` observes with nothing wrong but the GPUs
    /// `g`: the base the tests change.
    fn observed<'a>(g: &'a GpuInfo, e: Option<&'a Expected>) -> Observed<'a> {
        static NONE: BTreeMap<u16, PortState> = BTreeMap::new();
        static BY: BTreeMap<String, u64> = BTreeMap::new();
        Observed {
            mode: "sidecar",
            container: "trainer",
            since: "2026-11-21T10:00:00Z",
            gpu: g,
            expected: e,
            ports: &NONE,
            oom_total: 0,
            oom_by_container: &BY,
            oom_recent: &[],
            oom_sources: vec![],
            errors: BTreeMap::new(),
            gpus_seen: 0,
            gpu_lost: None,
            xids: &NO_XIDS,
            xid_watch: None,
            gpu_unknown: None,
            exec: None,
            cluster: None,
            unpublished: None,
        }
    }
}
