//! What the reporters are to do, and how they can fail.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::Code;
use crate::kube::{self as k8s, KubeError};
use crate::metrics::MetricsError;
use crate::stall::progress::WatchConfig;
use crate::supervise::child::SpawnError;
use crate::supervise::policy::Policy;

pub use crate::report::Mode;

/// What the reporters are to do, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub kube: k8s::Settings,
    /// The NVML library to load instead of the system's.
    pub nvml_lib: Option<PathBuf>,
    /// The expected GPU count, instead of the training container's limit.
    pub expect_gpus: Option<u32>,
    /// The training container, instead of the first that is not trainlet's.
    pub container: Option<String>,
    pub interval: Duration,
    pub min_patch_interval: Duration,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
    /// Sidecar: the ports to watch (replacing the containerPorts). Exec: the task's own
    /// server port from TF_CONFIG (added to the containerPorts).
    pub ports: Vec<u16>,
    /// Sidecar: the node's cgroup filesystem, to watch the training container's OOM kills.
    pub cgroup_root: Option<PathBuf>,
    /// Sidecar: exit once the training container has terminated for good.
    pub exit_with_main: bool,
    /// The handover directory: exec writes its observations there instead of
    /// publishing them; the sidecar reads them and publishes for both.
    pub observations: Option<PathBuf>,
    /// `cluster.json`, whose peers the sidecar (and exec, with API credentials) watch
    /// after the start.
    pub cluster_file: Option<PathBuf>,
    /// Exec: what a peer lost or replaced, or a stall, does to CMD.
    pub restart: Policy,
    /// Exec: CMD's progress is watched (`--stall-after`, `--progress-pattern`).
    pub progress: Option<WatchConfig>,
}

#[derive(Debug, Error)]
pub enum ReportError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("cannot handle signals: {0}")]
    Signals(std::io::Error),
}

impl Config {
    /// The agent's role, decided here once.
    pub fn role(&self) -> super::Role {
        super::Role::of(self.mode, self.observations.as_deref())
    }
}

impl ReportError {
    pub fn code(&self) -> Code {
        match self {
            ReportError::Kube(e) => e.code(),
            ReportError::Metrics(e) => e.code(),
            ReportError::Spawn(e) => e.code(),
            ReportError::Signals(_) => Code::Internal,
        }
    }
}
