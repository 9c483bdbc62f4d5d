//! Every default value of a flag, defined once. The flags (`args`) take their defaults
//! from here, and `inject` compares against them to write only the flags a user
//! changed into the agents it adds.

use super::values::{
    Address, Coordination, FailureAction, Logs, Order, PeerChange, Ready, Stall, StallScope,
};

/// The TensorFlow server port of every task (the resolver's `tf_server_port`).
pub const PORT: u16 = 8470;
/// Addresses are pod IPs.
pub const ADDRESS: Address = Address::PodIp;
/// The cluster DNS domain, for `--address dns`.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// Tasks follow the pods' own index.
pub const ORDER: Order = Order::Index;
/// A peer is ready when Running (or in its init containers) with an address.
pub const READY: Ready = Ready::Running;
/// The scheme of `master` addresses.
pub const RPC_LAYER: &str = "grpc";
/// The shared volume's mount path, where the files go.
pub const OUTPUT_DIR: &str = "/etc/trainlet";
/// Where `inject` mounts the observation handover volume (`--observations`).
pub const OBSERVATIONS_DIR: &str = "/run/trainlet-observed";
/// How long `init` waits for its peers.
pub const TIMEOUT: &str = "10m";
/// Processes per pod: the GPU limit, else 1.
pub const NPROC_PER_NODE: &str = "auto";
/// The agents of large jobs coordinate.
pub const COORDINATE: Coordination = Coordination::Auto;
/// `--coordinate auto` coordinates jobs of this many pods or more.
pub const COORDINATE_FROM: usize = crate::bootstrap::COORDINATE_FROM;
/// `exec`: a peer lost or replaced is reported; CMD runs on.
pub const ON_PEER_CHANGE: PeerChange = PeerChange::Report;
/// `exec`: a failed CMD ends exec with its code; the pod fails.
pub const ON_FAILURE: FailureAction = FailureAction::Exit;
/// `exec`: a stall is reported; CMD runs on.
pub const ON_STALL: Stall = Stall::Report;
/// `exec`: the job's silence is a stall, a pod's alone where the cluster has `ps`.
pub const STALL_SCOPE: StallScope = StallScope::Auto;
/// `exec --on-peer-change restart`: restarts before exec exits instead.
pub const MAX_RESTARTS: u32 = 3;
/// `exec`: between SIGTERM and SIGKILL when CMD is stopped for a restart.
pub const RESTART_GRACE: &str = "30s";
/// `exec`: the delay before the first restart (the seeds' operator: 10 s, doubling).
pub const RESTART_BACKOFF: &str = "10s";
/// The reporters' probe interval.
pub const INTERVAL: &str = "5s";
/// At most one annotation patch per this interval.
pub const MIN_PATCH_INTERVAL: &str = "10s";
/// The port of the reporters' `/metrics`; Prometheus scrape annotations name it too.
pub const METRICS_PORT: u16 = 9464;
/// `inject`: the CPU and memory of trainlet's containers, requests equal to limits, so
/// that a pod whose training container is Guaranteed stays Guaranteed (the kubelet's
/// static CPU manager and topology manager align CPUs with GPUs only for those). 128Mi
/// holds the sidecar under a burst of 500 slow connections to its metrics port. 50m is
/// what a sidecar at rest never reaches, and what every pod of a job reserves: the
/// resolver of a job of a thousand pods decodes their list more slowly under it, which
/// `--resources cpu=250m` avoids.
pub const RESOURCES: &str = "cpu=50m,memory=128Mi";
/// The ServiceAccount of `manifests/rbac.yaml`.
pub const SERVICE_ACCOUNT: &str = "trainlet";
/// The release image of this version of trainlet, so injected agents match the binary
/// that injected them.
pub const IMAGE: &str = concat!("ghcr.io/trainlet/trainlet:", env!("CARGO_PKG_VERSION"));
/// Log lines for people.
pub const LOG_FORMAT: Logs = Logs::Text;
/// tracing's EnvFilter.
pub const LOG_LEVEL: &str = "info";

/// `0.0.0.0:9464`: every address of the pod, on [`METRICS_PORT`].
pub fn metrics_addr() -> String {
    format!("0.0.0.0:{METRICS_PORT}")
}
