//! What the agent is to do, one config per component (linkerd's proxy is the model):
//! what the probes look at, how the agent publishes, and what only its role has; and
//! how it can fail.

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

/// What either agent is to do, validated; what only one of them has comes beside it
/// ([`SidecarConfig`], [`ExecConfig`]) and goes into its role.
#[derive(Debug, Clone)]
pub struct Config {
    pub kube: k8s::Settings,
    pub probes: ProbeConfig,
    pub publish: PublishConfig,
    /// `cluster.json`, whose peers the sidecar (and exec, with API credentials) watch
    /// after the start.
    pub cluster_file: Option<PathBuf>,
}

/// What the probes look at, and how often.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// The NVML library to load instead of the system's.
    pub nvml_lib: Option<PathBuf>,
    /// The expected GPU count, instead of the training container's limit.
    pub expect_gpus: Option<u32>,
    /// The training container, instead of the first that is not trainlet's.
    pub container: Option<String>,
    pub interval: Duration,
    /// The sidecar: the ports to watch (replacing the containerPorts). exec: the task's
    /// own server port from TF_CONFIG (added to the containerPorts).
    pub ports: Vec<u16>,
}

/// How the agent publishes.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    pub min_patch_interval: Duration,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_addr: Option<SocketAddr>,
}

/// Which agent this is, with its own flags: made into its role once.
#[derive(Debug, Clone)]
pub enum RoleConfig {
    Sidecar(SidecarConfig),
    Exec(ExecConfig),
}

/// `trainlet sidecar`'s own flags.
#[derive(Debug, Clone, Default)]
pub struct SidecarConfig {
    /// The node's cgroup filesystem, to watch the training container's OOM kills.
    pub cgroup_root: Option<PathBuf>,
    /// Exit once the training container has terminated for good.
    pub exit_with_main: bool,
    /// The handover directory: the training container's exec writes its observations
    /// there, and this sidecar publishes them.
    pub observations: Option<PathBuf>,
}

/// `trainlet exec --report`'s own flags.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// The handover directory: exec writes its observations there instead of
    /// publishing them (it has no credentials).
    pub observations: Option<PathBuf>,
    /// What a peer lost or replaced, a stall or a failure does to CMD.
    pub restart: Policy,
    /// CMD's progress is watched (`--stall-after`, `--progress-pattern`).
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

impl ExecConfig {
    /// exec without credentials: it hands its observations to the sidecar
    /// (`--observations`).
    pub fn hands_over(&self) -> bool {
        self.observations.is_some()
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
