//! trainlet: the fallback for distributed TensorFlow on Kubernetes when no operator is
//! installed.
//!
//! Two jobs, one binary:
//! - `trainlet init` runs as an init container. It waits for the peer pods found through
//!   label selectors, resolves the cluster and this pod's own task, and writes
//!   `TF_CONFIG` atomically to a shared volume.
//! - `trainlet sidecar` (or `trainlet exec --report`) reports GPU counts, port conflicts
//!   and OOM kills to the pod's annotations, to Events and to Prometheus.
//!
//! The layout follows the concerns: pure logic (selectors, ordering, rendering, `/proc`
//! and cgroup parsing) lives in functions without I/O; the `cmd` modules are the edges
//! that talk to the API server, the kernel and the file system.
#![deny(unsafe_code)]

/// Command-line interface: clap definitions shared by every subcommand.
pub mod cli;
/// Label selectors, peers, ordering, addresses and expected counts (pure).
pub mod cluster;
/// One module per subcommand: the I/O edges that glue the pure parts together.
pub mod cmd;
/// Exit codes, on purpose, one per kind of failure.
pub mod exit;
/// `trainlet inject`: adds trainlet to existing pod templates.
pub mod inject;
/// Kubernetes client, the pod's own identity, and API errors that name what RBAC lacks.
pub mod kube;
/// Logging setup: human-readable by default, JSON for clusters.
pub mod logging;
/// Prometheus metrics and the admin HTTP server (`/metrics`, `/livez`, `/readyz`).
pub mod metrics;
/// Annotations (merge patch, only on change) and Events on the own pod.
pub mod publish;
/// The reporters: GPUs through NVML, ports from `/proc/net`, OOM kills from cgroups.
pub mod report;
/// SIGTERM and SIGINT handling, and forwarding signals to a child.
pub mod signal;
/// TF_CONFIG and the other output files (pure rendering), and the atomic writer.
pub mod tfconfig;
/// Waiting until the peer set is complete, through one list plus watch.
pub mod wait;

pub use exit::{Code, Failure};
