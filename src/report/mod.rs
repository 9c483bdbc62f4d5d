//! The reporters of `trainlet sidecar` and `trainlet exec --report`.
//!
//! Three probes ([`gpu`], [`ports`], [`oom`]) observe; this module turns what they
//! observed into one [`Report`], decides health, renders the annotations and picks
//! the Events to emit on transitions. All of that is pure and unit-tested; the
//! [`engine`] is the loop that runs the probes, watches the own pod, and publishes.
//!
//! A failing probe degrades only its own part: NVML erroring is a GPU state, an
//! unreadable `/proc/net` makes the ports `unknown`, a missing cgroup leaves pod
//! status as the only OOM source. None of them stops the others.

pub mod engine;
pub mod gpu;
pub mod oom;
pub mod ports;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use crate::publish::keys;
use gpu::{Expected, GpuDevice, GpuInfo, GpuStatus};
use oom::OomKill;
use ports::PortState;

/// The most `trainlet.io/report` may hold (annotations share a 256 KiB budget per
/// object; trainlet keeps to a small part of it).
pub const REPORT_MAX: usize = 16 * 1024;

/// The extended resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Ok,
    Degraded,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Degraded => "degraded",
        }
    }
}

/// The GPU part of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSection {
    pub count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<Expected>,
    pub status: GpuStatus,
    pub nvml: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    pub devices: Vec<GpuDevice>,
}

/// One watched port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortEntry {
    pub port: u16,
    #[serde(flatten)]
    pub state: PortState,
}

/// The OOM part of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomSection {
    /// Total kills since trainlet started.
    pub kills: u64,
    pub by_container: BTreeMap<String, u64>,
    /// What is watched, e.g. `cgroup v1 /sys/fs/cgroup/memory/... (eventfd)`, and pod
    /// status.
    pub sources: Vec<String>,
    /// The most recent kills, oldest first.
    pub recent: Vec<OomKill>,
}

/// Everything trainlet knows, as published in `trainlet.io/report`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub health: Health,
    /// Why `degraded`; empty when ok.
    pub reasons: Vec<String>,
    /// `sidecar` or `exec`.
    pub mode: &'static str,
    /// The training container.
    pub container: String,
    /// When trainlet started (RFC 3339): the OOM count runs from here.
    pub since: String,
    pub gpu: GpuSection,
    pub ports: Vec<PortEntry>,
    pub oom: OomSection,
    /// Probes that failed, by probe: their part of the report is partial.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

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
}

/// Builds the report and decides health. Degraded means a person should look: a GPU
/// count mismatch, GPUs expected but NVML unavailable, a port conflict, or an OOM kill
/// since trainlet started.
pub fn assemble(o: Observed<'_>) -> Report {
    let status = gpu::verdict(o.gpu, o.expected);
    let mut reasons = Vec::new();
    if let (GpuStatus::Mismatch | GpuStatus::Unavailable, Some(e)) = (&status, o.expected) {
        reasons.push(gpu::message(o.gpu, e, o.container));
    }
    for (port, state) in o.ports {
        if state.is_conflict() {
            reasons.push(ports::conflict_message(*port, state, o.container));
        }
    }
    if o.oom_total > 0 {
        let last = o
            .oom_recent
            .last()
            .map(|k| format!(" (last: {})", k.message()))
            .unwrap_or_default();
        reasons.push(format!(
            "{} OOM kill{} since {}{last}",
            o.oom_total,
            if o.oom_total == 1 { "" } else { "s" },
            o.since
        ));
    }
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
        gpu: GpuSection {
            count: o.gpu.count(),
            expected: o.expected.cloned(),
            status,
            nvml: o.gpu.nvml_status(),
            driver: o.gpu.driver.clone(),
            devices: o.gpu.devices.clone(),
        },
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
        truncated: false,
    }
}

/// The report as JSON of at most [`REPORT_MAX`] bytes: the oldest kills go first,
/// then device details, then reasons are cut; `truncated` says so.
pub fn render(report: &Report) -> String {
    let mut r = report.clone();
    let mut json = serde_json::to_string(&r).expect("a report serializes");
    while json.len() > REPORT_MAX {
        r.truncated = true;
        if !r.oom.recent.is_empty() {
            r.oom.recent.remove(0);
        } else if !r.gpu.devices.is_empty() {
            r.gpu.devices.clear();
        } else if !r.errors.is_empty() {
            r.errors.clear();
        } else if r.ports.len() > 1 {
            r.ports.retain(|p| p.state.is_conflict());
            if r.ports.len() > 64 {
                r.ports.truncate(64);
            }
            if serde_json::to_string(&r).map_or(0, |s| s.len()) > REPORT_MAX {
                r.ports.clear();
            }
        } else {
            for reason in &mut r.reasons {
                *reason = crate::publish::truncate(reason, 200);
            }
            r.reasons.truncate(8);
            json = serde_json::to_string(&r).expect("a report serializes");
            break;
        }
        json = serde_json::to_string(&r).expect("a report serializes");
    }
    json
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
    BTreeMap::from([
        (keys::GPU_COUNT.into(), Some(report.gpu.count.to_string())),
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
        (keys::REPORT.into(), Some(report_json.to_string())),
    ])
}

/// What was already announced by Events, so that Events fire on transitions only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Announced {
    gpu: Option<(GpuStatus, u32)>,
    conflicts: BTreeSet<u16>,
}

/// An Event to emit: (reason, note).
pub type Note = (&'static str, String);

/// The Events for what changed since the last report, and whether any of it is urgent
/// (a new conflict: publish at once). OOM kills are announced where they are
/// recorded, one Event each.
pub fn transitions(announced: &mut Announced, report: &Report) -> (Vec<Note>, bool) {
    let mut out = Vec::new();
    let mut urgent = false;
    let now = (report.gpu.status.clone(), report.gpu.count);
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
            };
            let was = announced.gpu.as_ref().map(|(s, _)| s.clone());
            match report.gpu.status {
                GpuStatus::Mismatch => out.push((
                    "GPUCountMismatch",
                    gpu::message(&info, e, &report.container),
                )),
                GpuStatus::Unavailable if was != Some(GpuStatus::Unavailable) => {
                    let why = report.gpu.nvml.trim_start_matches("unavailable: ");
                    out.push((
                        "GPUUnavailable",
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
    let conflicts: BTreeSet<u16> = report
        .ports
        .iter()
        .filter(|p| p.state.is_conflict())
        .map(|p| p.port)
        .collect();
    for p in report.ports.iter().filter(|p| p.state.is_conflict()) {
        if !announced.conflicts.contains(&p.port) {
            out.push((
                "PortConflict",
                ports::conflict_message(p.port, &p.state, &report.container),
            ));
            urgent = true;
        }
    }
    announced.conflicts = conflicts;
    (out, urgent)
}

/// Whether a container is trainlet's own: named `trainlet...`, or running
/// `trainlet sidecar`.
pub fn is_trainlet_container(c: &Container) -> bool {
    if c.name.starts_with("trainlet") {
        return true;
    }
    let words: Vec<&str> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
        .collect();
    words.iter().any(|w| w.ends_with("trainlet")) && words.contains(&"sidecar")
}

/// The training container: `--container`, else the first container that is not
/// trainlet's.
pub fn training_container<'a>(pod: &'a Pod, name: Option<&str>) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    match name {
        Some(n) => spec.containers.iter().find(|c| c.name == n),
        None => spec.containers.iter().find(|c| !is_trainlet_container(c)),
    }
}

/// The expected GPU count: `--expect-gpus`, else the training container's
/// `resources.limits["nvidia.com/gpu"]`.
pub fn expected_gpus(flag: Option<u32>, container: Option<&Container>) -> Option<Expected> {
    if let Some(n) = flag {
        return Some(Expected {
            count: n,
            source: "--expect-gpus".into(),
        });
    }
    let q = container?
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get(GPU_RESOURCE)?;
    Some(Expected {
        count: q.0.trim().parse().ok()?,
        source: format!("resources.limits[\"{GPU_RESOURCE}\"]"),
    })
}

/// The container's TCP containerPorts.
pub fn container_ports(c: &Container) -> Vec<u16> {
    let mut v: Vec<u16> = c
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p != 0)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The memory limit of a container as written in its spec (`2Gi`).
pub fn memory_limit(c: &Container) -> Option<String> {
    Some(
        c.resources
            .as_ref()?
            .limits
            .as_ref()?
            .get("memory")?
            .0
            .clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::Unavailable;
    use ports::{ConflictReason, Owner};

    fn gpus(n: u32) -> GpuInfo {
        GpuInfo {
            devices: (0..n)
                .map(|i| GpuDevice {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "Fake GPU".into(),
                    memory_total_bytes: 16 << 30,
                })
                .collect(),
            driver: Some("550.54.15".into()),
            nvml: Ok(()),
        }
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
            mode: "sidecar",
            container: "trainer",
            since: "2026-11-21T10:00:00Z",
            gpu: g,
            expected: e,
            ports,
            oom_total: by.values().sum(),
            oom_by_container: by,
            oom_recent: recent,
            oom_sources: vec!["pod status".into()],
            errors: BTreeMap::new(),
        })
    }

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

        let none = GpuInfo {
            devices: vec![],
            driver: None,
            nvml: Err(Unavailable::LibraryNotFound {
                lib: "libnvidia-ml.so.1".into(),
                why: "libnvidia-ml.so.1: cannot open shared object file: No such file or directory"
                    .into(),
            }),
        };
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
        assert_eq!(ev[0].0, "GPUCountMismatch");
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

    fn container(json: serde_json::Value) -> Container {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn pod_spec_helpers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "trainlet", "image": "trainlet:1", "args": ["sidecar"]},
                {"name": "trainer", "image": "tf:2", "ports": [{"containerPort": 2222}, {"containerPort": 8470}, {"containerPort": 53, "protocol": "UDP"}],
                 "resources": {"limits": {"nvidia.com/gpu": "4", "memory": "2Gi"}}}
            ]}
        }))
        .unwrap();
        let c = training_container(&pod, None).unwrap();
        assert_eq!(c.name, "trainer");
        assert_eq!(
            training_container(&pod, Some("trainlet")).unwrap().name,
            "trainlet"
        );
        assert!(training_container(&pod, Some("nope")).is_none());
        assert_eq!(container_ports(c), vec![2222, 8470]);
        assert_eq!(expected_gpus(None, Some(c)).unwrap().count, 4);
        assert_eq!(
            expected_gpus(Some(2), Some(c)).unwrap().source,
            "--expect-gpus"
        );
        assert_eq!(memory_limit(c), Some("2Gi".into()));
        let side = container(
            serde_json::json!({"name": "reporter", "image": "x", "command": ["/bin/trainlet"], "args": ["sidecar", "--interval", "5s"]}),
        );
        assert!(is_trainlet_container(&side));
        let exec = container(
            serde_json::json!({"name": "main", "image": "x", "command": ["/trainlet/trainlet", "exec", "--report", "--", "python"]}),
        );
        assert!(!is_trainlet_container(&exec));
    }
}
