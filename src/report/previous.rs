//! What a restarted reporter reads back from the pod's `trainlet.io/report`: only the
//! parts that decide what was already announced, so that it does not announce again
//! what the pod's Events already told.

use serde::Deserialize;

use super::document::{ExecMark, XidCount};
use crate::report::probe::gpu::{GpuFault, GpuStatus};
use crate::report::probe::ports::PortEntry;

/// What a reporter published before it restarted, read back from the pod's
/// `trainlet.io/report`: only the parts that decide what was already announced.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Previous {
    #[serde(default)]
    pub gpu: PreviousGpu,
    #[serde(default)]
    pub ports: Vec<PortEntry>,
    #[serde(default)]
    pub exec: Option<ExecMark>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PreviousGpu {
    #[serde(default)]
    pub status: Option<GpuStatus>,
    #[serde(default)]
    pub count: u32,
    #[serde(default)]
    pub lost: Option<String>,
    #[serde(default)]
    pub faulty: Vec<GpuFault>,
    #[serde(default)]
    pub xid_errors: Vec<XidCount>,
}

impl Previous {
    /// `None` when the pod carries no report, or one this version cannot read.
    pub fn parse(report_json: &str) -> Option<Previous> {
        serde_json::from_str(report_json).ok()
    }
}
