//! The report trainlet publishes in `trainlet.io/report`: its sections, as JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::drift::ClusterStatus;
use crate::report::probe::gpu::events::XidWatch;
use crate::report::probe::gpu::xid::XidError;
use crate::report::probe::gpu::{Expected, GpuDevice, GpuFault, GpuStatus};
use crate::report::probe::oom::OomKill;
use crate::report::probe::ports::PortEntry;

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
    /// GPUs NVML counts but cannot query (lost, needing a reset), while they are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faulty: Vec<GpuFault>,
    /// Which GPUs NVML's event API watches for XID errors, once registered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xid_watch: Option<XidWatch>,
    /// Why GPUs that were seen are gone, while they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
    /// Every XID error since trainlet started, counted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub xid_errors: Vec<XidCount>,
    /// XID errors of (GPU, XID) pairs past the ledger's cap, counted together.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub xid_errors_other: u64,
    /// Why the count is unknown, while it is (status `unknown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

/// What the sidecar has published from `trainlet exec`'s observations: the run of exec
/// (`epoch`), its last kill and its restarts announced. Read back after a restart of
/// the sidecar, so that nothing is announced twice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecMark {
    pub epoch: String,
    pub kills: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// One GPU's XID and how often it occurred.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidCount {
    #[serde(flatten)]
    pub error: XidError,
    pub count: u64,
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
    /// The sidecar publishes `trainlet exec`'s observations: see [`ExecMark`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecMark>,
    /// The peer watch: `current`, or `stale: worker/1 10.0.0.7 → 10.0.0.19`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}
