//! GPUs through NVML (nvml-wrapper): the count, each device's index, UUID, name and
//! total memory, and the driver version.
//!
//! A GPU in MIG mode counts as its MIG devices (`MIG-` UUIDs), the units a
//! `nvidia.com/mig-<profile>` limit (or the device plugin's `single` strategy) hands
//! out. A GPU whose own queries fail while the others answer (NVML's "GPU is lost",
//! "GPU requires reset") is a fault of that GPU, not of NVML: the others are still
//! counted.
//!
//! NVML is loaded with `dlopen` at run time, so trainlet runs on machines without it:
//! a missing library or a failing `nvmlInit` is a state to report, not a crash. Only
//! when GPUs are expected does it make the pod `degraded` (GPUUnavailable).

pub mod events;
pub mod xid;

use std::path::PathBuf;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

/// The library NVML ships as, found through the dynamic loader's search path.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// One GPU, or one MIG device of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// The GPU's index (a MIG device's parent's).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
    /// A MIG device's index on its GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<u32>,
}

/// What is wrong with a GPU whose own queries fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// `NVML_ERROR_GPU_IS_LOST`: fallen off the bus or otherwise inaccessible.
    Lost,
    /// `NVML_ERROR_RESET_REQUIRED`: unusable until the GPU is reset.
    ResetRequired,
    /// Any other error of this GPU's queries.
    QueryFailed,
}

impl FaultKind {
    pub fn of(e: &NvmlError) -> FaultKind {
        match e {
            NvmlError::GpuLost => FaultKind::Lost,
            NvmlError::ResetRequired => FaultKind::ResetRequired,
            _ => FaultKind::QueryFailed,
        }
    }
}

/// One GPU that NVML counts but cannot query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFault {
    pub index: u32,
    /// Its UUID as an earlier probe saw it; empty when none did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    pub fault: FaultKind,
    /// NVML's error.
    pub why: String,
}

impl GpuFault {
    /// `GPU 2 (GPU-…)`, or `GPU 2` when its UUID was never seen.
    pub fn name(&self) -> String {
        if self.uuid.is_empty() {
            format!("GPU {}", self.index)
        } else {
            format!("GPU {} ({})", self.index, self.uuid)
        }
    }

    /// The reason a fault that is not a loss gives (losses are told together, by
    /// [`lost_message`]).
    pub fn message(&self, container: &str) -> String {
        match self.fault {
            FaultKind::Lost => lost_message(&[self], container),
            FaultKind::ResetRequired => format!(
                "container {container} cannot use {}: NVML says it requires a reset ({}); reset the GPU or reboot the node",
                self.name(),
                self.why
            ),
            FaultKind::QueryFailed => format!(
                "container {container} cannot query {}: {}",
                self.name(),
                self.why
            ),
        }
    }
}

/// `container trainer lost GPU 2 (GPU-…): NVML reports the GPU is lost`.
pub fn lost_message(lost: &[&GpuFault], container: &str) -> String {
    let names: Vec<String> = lost.iter().map(|f| f.name()).collect();
    format!(
        "container {container} lost {}: NVML reports the GPU{} {} lost",
        names.join(", "),
        if lost.len() == 1 { "" } else { "s" },
        if lost.len() == 1 { "is" } else { "are" },
    )
}

/// Why NVML cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Unavailable {
    /// `dlopen` failed: no driver installed, or the library is not mounted into the
    /// container (the NVIDIA container toolkit does that for GPU containers).
    LibraryNotFound { lib: String, why: String },
    /// The library loaded but `nvmlInit_v2` failed, e.g. the driver is not loaded.
    InitFailed { why: String },
    /// Init worked but a query failed.
    QueryFailed { why: String },
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::LibraryNotFound { lib, why } => {
                write!(f, "library {lib} not found ({why})")
            }
            Unavailable::InitFailed { why } => write!(f, "init failed: {why}"),
            Unavailable::QueryFailed { why } => write!(f, "query failed: {why}"),
        }
    }
}

/// What NVML shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The devices that answer (MIG devices in place of a GPU in MIG mode).
    pub devices: Vec<GpuDevice>,
    pub driver: Option<String>,
    pub nvml: Result<(), Unavailable>,
    /// GPUs NVML counts whose queries fail.
    pub faulty: Vec<GpuFault>,
}

impl GpuInfo {
    /// No devices, and why.
    pub fn unavailable(u: Unavailable) -> GpuInfo {
        GpuInfo {
            devices: Vec::new(),
            driver: None,
            nvml: Err(u),
            faulty: Vec::new(),
        }
    }

    pub fn count(&self) -> u32 {
        self.devices.len() as u32
    }

    /// `ok` or `unavailable: <why>`, as printed by `trainlet gpus`.
    pub fn nvml_status(&self) -> String {
        match &self.nvml {
            Ok(()) => "ok".into(),
            Err(u) => format!("unavailable: {u}"),
        }
    }

    /// The distinct model names, in device order: `NVIDIA H100 80GB HBM3`.
    pub fn products(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for d in &self.devices {
            if !out.contains(&d.name) {
                out.push(d.name.clone());
            }
        }
        out
    }

    /// `trainlet gpus` output, the shape of TensorFlow's `num_accelerators()` plus
    /// the devices and NVML's state.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "GPU": self.count(),
            "devices": self.devices,
            "driver_version": self.driver,
            "nvml": self.nvml_status(),
        })
    }
}

/// How many GPUs are expected, and who said so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expected {
    pub count: u32,
    /// `--expect-gpus`, `resources.limits["nvidia.com/gpu"]`, or the
    /// `nvidia.com/mig-*` limits that make up the count.
    pub source: String,
}

/// The GPU verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuStatus {
    /// As many as expected, or none expected.
    Ok,
    Mismatch,
    Unavailable,
    /// The reporter cannot see the training container's GPUs: a sidecar without a GPU
    /// of its own and without observations from `trainlet exec`.
    Unknown,
}

/// Compares what NVML shows with what is expected. Pure.
pub fn verdict(info: &GpuInfo, expected: Option<&Expected>) -> GpuStatus {
    let Some(exp) = expected.filter(|e| e.count > 0) else {
        return GpuStatus::Ok;
    };
    if info.nvml.is_err() {
        return GpuStatus::Unavailable;
    }
    if info.count() != exp.count {
        return GpuStatus::Mismatch;
    }
    GpuStatus::Ok
}

/// The Event message for a GPU verdict, naming the container and the source of the
/// expectation.
pub fn message(info: &GpuInfo, expected: &Expected, container: &str) -> String {
    match &info.nvml {
        Err(u) => format!(
            "container {container} expects {} GPU{} ({}) but NVML is unavailable: {u}",
            expected.count,
            plural(expected.count),
            expected.source
        ),
        Ok(()) => {
            let products = info.products();
            let what = if products.is_empty() {
                String::new()
            } else {
                format!(" ({})", products.join(", "))
            };
            format!(
                "container {container} sees {} GPU{}{what} but {} {} expected ({})",
                info.count(),
                plural(info.count()),
                expected.count,
                if expected.count == 1 { "is" } else { "are" },
                expected.source
            )
        }
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Why GPUs that NVML showed are gone, if they are: NVML's event thread said so
/// (`event`), NVML says "GPU is lost" for some (named), or fewer answer now than the
/// most `seen` ("Failed to initialize NVML: Unknown Error" after the container lost its
/// device nodes). A GPU that needs a reset is not lost: it has a reason of its own.
pub fn lost(info: &GpuInfo, seen: u32, event: Option<&str>, container: &str) -> Option<String> {
    if let Some(why) = event {
        return Some(format!("container {container} lost its GPUs: {why}"));
    }
    let lost: Vec<&GpuFault> = info
        .faulty
        .iter()
        .filter(|f| f.fault == FaultKind::Lost)
        .collect();
    if !lost.is_empty() {
        return Some(lost_message(&lost, container));
    }
    let now = info.count();
    (now + (info.faulty.len() as u32) < seen).then(|| {
        format!(
            "container {container} saw {seen} GPU{} and now sees {now} (NVML: {})",
            plural(seen),
            info.nvml_status()
        )
    })
}

/// The reasons of the faults that are not losses (those are told by [`lost`]).
pub fn fault_reasons<'a>(
    info: &'a GpuInfo,
    container: &'a str,
) -> impl Iterator<Item = String> + 'a {
    info.faulty
        .iter()
        .filter(|f| f.fault != FaultKind::Lost)
        .map(move |f| f.message(container))
}

/// The notes of `GPUResetRequired` for the GPUs that need a reset and were not yet
/// `announced`; `announced` becomes the GPUs that need one now.
pub fn new_resets(
    faulty: &[GpuFault],
    announced: &mut std::collections::BTreeSet<u32>,
    container: &str,
) -> Vec<String> {
    let resets = faulty
        .iter()
        .filter(|f| f.fault == FaultKind::ResetRequired);
    let notes = resets
        .clone()
        .filter(|f| !announced.contains(&f.index))
        .map(|f| f.message(container))
        .collect();
    *announced = resets.map(|f| f.index).collect();
    notes
}

/// Loads and initialises NVML from `lib` (`--nvml-lib`), else [`DEFAULT_LIB`] through
/// the loader's search path. The probe and the event thread each hold one.
pub fn open(lib: Option<&std::path::Path>) -> Result<Nvml, NvmlError> {
    let path = lib.map_or(std::ffi::OsStr::new(DEFAULT_LIB), |p| p.as_os_str());
    Nvml::builder().lib_path(path).init()
}

/// `NVML_DEVICE_MIG_ENABLE` in nvml.h: a GPU's current MIG mode when it is on.
const MIG_ENABLE: u32 = 1;

/// The devices of GPU `i`: itself, or its MIG devices when it is in MIG mode (those
/// NVML answers `NVML_ERROR_NOT_FOUND` for are not this container's); and the GPU's
/// UUID.
fn query(nvml: &Nvml, i: u32) -> Result<(String, Vec<GpuDevice>), NvmlError> {
    let d = nvml.device_by_index(i)?;
    let uuid = d.uuid()?;
    let mig = match d.mig_mode() {
        Ok(m) => m.current == MIG_ENABLE,
        Err(e @ (NvmlError::GpuLost | NvmlError::ResetRequired)) => return Err(e),
        // Not supported (no MIG on this GPU), or an NVML too old to know.
        Err(_) => false,
    };
    if !mig {
        let device = GpuDevice {
            index: i,
            uuid: uuid.clone(),
            name: d.name()?,
            memory_total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
            mig: None,
        };
        return Ok((uuid, vec![device]));
    }
    let mut devices = Vec::new();
    for j in 0..d.mig_device_count()? {
        let m = match d.mig_device_by_index(j) {
            Ok(m) => m,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(e),
        };
        devices.push(GpuDevice {
            index: i,
            uuid: m.uuid()?,
            name: m.name()?,
            memory_total_bytes: m.memory_info().map(|m| m.total).unwrap_or(0),
            mig: Some(j),
        });
    }
    Ok((uuid, devices))
}

/// Loads NVML once and queries it on every probe; retries loading while it fails, so
/// a driver that comes up late is picked up.
pub struct GpuProbe {
    lib: Option<PathBuf>,
    nvml: Option<Nvml>,
    /// Each GPU's UUID as last seen, to name a GPU that no longer answers.
    known: std::collections::BTreeMap<u32, String>,
}

impl GpuProbe {
    pub fn new(lib: Option<PathBuf>) -> Self {
        GpuProbe {
            lib,
            nvml: None,
            known: Default::default(),
        }
    }

    fn lib_name(&self) -> String {
        self.lib
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| DEFAULT_LIB.to_string())
    }

    fn load(&mut self) -> Result<&Nvml, Unavailable> {
        if self.nvml.is_none() {
            let nvml = open(self.lib.as_deref()).map_err(|e| match e {
                NvmlError::LibloadingError(le) => Unavailable::LibraryNotFound {
                    lib: self.lib_name(),
                    why: crate::kube::root_cause(&le),
                },
                NvmlError::FailedToLoadSymbol(s) => Unavailable::InitFailed {
                    why: format!("{} lacks nvmlInit_v2: {s}", self.lib_name()),
                },
                other => Unavailable::InitFailed {
                    why: other.to_string(),
                },
            })?;
            self.nvml = Some(nvml);
        }
        Ok(self.nvml.as_ref().expect("set above"))
    }

    /// Queries NVML. Never fails: a failure is part of the answer.
    /// Each GPU's utilization now (percent of the last sample period NVML kept a
    /// kernel running), for the `Stalled` Event; empty where NVML cannot tell.
    pub fn utilization(&mut self) -> Vec<u32> {
        let Ok(nvml) = self.load() else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|i| nvml.device_by_index(i).ok()?.utilization_rates().ok())
            .map(|u| u.gpu)
            .collect()
    }

    pub fn probe(&mut self) -> GpuInfo {
        let nvml = match self.load() {
            Ok(n) => n,
            Err(u) => return GpuInfo::unavailable(u),
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                // NVML itself fails: drop the handle so the next probe starts clean.
                self.nvml = None;
                return GpuInfo::unavailable(Unavailable::QueryFailed { why: e.to_string() });
            }
        };
        let driver = nvml.sys_driver_version().ok();
        let answers: Vec<_> = (0..count).map(|i| (i, query(nvml, i))).collect();
        let mut devices = Vec::new();
        let mut faulty = Vec::new();
        for (i, answer) in answers {
            match answer {
                Ok((uuid, mut d)) => {
                    self.known.insert(i, uuid);
                    devices.append(&mut d);
                }
                Err(e) => faulty.push(GpuFault {
                    index: i,
                    uuid: self.known.get(&i).cloned().unwrap_or_default(),
                    fault: FaultKind::of(&e),
                    why: e.to_string(),
                }),
            }
        }
        GpuInfo {
            devices,
            driver,
            nvml: Ok(()),
            faulty,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(n: u32, nvml: Result<(), Unavailable>) -> GpuInfo {
        GpuInfo {
            devices: (0..n)
                .map(|i| GpuDevice {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_total_bytes: 80 << 30,
                    mig: None,
                })
                .collect(),
            driver: Some("550.54.15".into()),
            nvml,
            faulty: vec![],
        }
    }

    fn limit(n: u32) -> Expected {
        Expected {
            count: n,
            source: "resources.limits[\"nvidia.com/gpu\"]".into(),
        }
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict(&info(4, Ok(())), Some(&limit(4))), GpuStatus::Ok);
        assert_eq!(
            verdict(&info(4, Ok(())), Some(&limit(8))),
            GpuStatus::Mismatch
        );
        assert_eq!(verdict(&info(4, Ok(())), None), GpuStatus::Ok);
        let missing = Err(Unavailable::LibraryNotFound {
            lib: "libnvidia-ml.so.1".into(),
            why: "cannot open shared object file".into(),
        });
        assert_eq!(
            verdict(&info(0, missing.clone()), Some(&limit(1))),
            GpuStatus::Unavailable
        );
        // No GPUs expected: a missing NVML is normal.
        assert_eq!(verdict(&info(0, missing.clone()), None), GpuStatus::Ok);
        assert_eq!(verdict(&info(0, missing), Some(&limit(0))), GpuStatus::Ok);
    }

    #[test]
    fn messages() {
        assert_eq!(
            message(&info(4, Ok(())), &limit(8), "trainer"),
            "container trainer sees 4 GPUs (NVIDIA H100 80GB HBM3) but 8 are expected (resources.limits[\"nvidia.com/gpu\"])"
        );
        let init = Err(Unavailable::InitFailed {
            why: "NVIDIA driver is not loaded".into(),
        });
        assert_eq!(
            message(&info(0, init), &limit(1), "trainer"),
            "container trainer expects 1 GPU (resources.limits[\"nvidia.com/gpu\"]) but NVML is unavailable: init failed: NVIDIA driver is not loaded"
        );
    }

    #[test]
    fn gpus_json_shape() {
        let v = info(1, Ok(())).to_json();
        assert_eq!(
            v.to_string(),
            r#"{"GPU":1,"devices":[{"index":0,"uuid":"GPU-0","name":"NVIDIA H100 80GB HBM3","memory_total_bytes":85899345920}],"driver_version":"550.54.15","nvml":"ok"}"#
        );
        let none = GpuInfo::unavailable(Unavailable::InitFailed { why: "x".into() });
        assert_eq!(none.to_json()["nvml"], "unavailable: init failed: x");
    }

    #[test]
    fn a_missing_library_is_reported_not_fatal() {
        let mut p = GpuProbe::new(Some("/nonexistent/libnvidia-ml.so.1".into()));
        let i = p.probe();
        assert_eq!(i.count(), 0);
        let s = i.nvml_status();
        assert!(
            s.starts_with("unavailable: library /nonexistent/libnvidia-ml.so.1 not found ("),
            "{s}"
        );
    }
}
