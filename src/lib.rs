//! trainlet: the fallback for distributed training (TensorFlow, PyTorch, JAX, MPI) on
//! Kubernetes when no operator is installed.
//!
//! Two jobs, one binary:
//! - `trainlet init` runs as an init container. It waits for the peer pods found through
//!   label selectors, resolves the cluster and this pod's own task, and writes
//!   `TF_CONFIG` and every other framework's format atomically to a shared volume.
//! - `trainlet sidecar` (or `trainlet exec --report`) reports GPU counts, port conflicts
//!   and OOM kills to the pod's annotations, to Events and to Prometheus.
//!
//! Dependencies run one way: `main` → [`cli`] (clap, lowering flags into configs,
//! explaining errors) → [`cmd`] (one thin edge per subcommand) → the domain. The domain
//! modules never import `cli` or `cmd`:
//! - the long-running agents: [`agent`] (`exec --report` and `sidecar`: the role, the
//!   loop), over [`supervise`] (CMD's life and its decisions), [`stall`] (the stall
//!   watch), [`peerchange`] (exec ↔ sidecar about the cluster), [`report`] (probes,
//!   the report, the outbox) and [`handover`] (exec's observations for the sidecar);
//! - workflows: [`bootstrap`] (init), [`peers`] (list and watch the peer pods),
//!   [`inject`], [`status`];
//! - pure logic: [`cluster`] (selectors, readiness, order, addresses, where each task
//!   stands), [`render`] (every file init writes), and the pure halves of `report`,
//!   `stall`, `supervise` and `peerchange`;
//! - edges to the outside: [`kube`] (client, identity), [`publish`] (annotations,
//!   Events), [`metrics`] (`/metrics`), [`signal`], [`logging`]; [`exit`] is the
//!   contract of exit codes that every layer shares, [`flags`] the spelling of every
//!   flag, [`reason`] of every Event reason, [`time`] of every wall-clock time.
//!   docs/architecture.md has the map.
#![deny(unsafe_code)]

/// The two long-running processes, `trainlet exec --report` and `trainlet sidecar`:
/// the role decided once, and the loop that ties probes, peers, stalls and CMD.
pub mod agent;
/// The init workflow: wait, resolve, check the port, write, annotate, install.
pub mod bootstrap;
/// The command line: clap definitions, lowering flags into configs, defaults, and
/// error messages that name the flag to fix.
pub mod cli;
/// Job types, peers, readiness, ordering and addresses (pure).
pub mod cluster;
/// One thin module per subcommand: lower the flags, run one workflow, print.
pub mod cmd;
/// One Event as trainlet sends it: type, reason, note.
pub mod event;
/// Exit codes, on purpose, one per kind of failure.
pub mod exit;
/// The spelling of every flag, once: the parser, inject and messages share it.
pub mod flags;
/// The files between the training container's `trainlet exec` and the sidecar.
pub mod handover;
/// Giving a burst's freed heap back to the kernel.
pub mod heap;
/// `trainlet inject`: adds trainlet to existing pod templates.
pub mod inject;
/// Kubernetes client, the pod's own identity, and API errors that name what RBAC lacks.
pub mod kube;
/// Kubeflow Trainer's progress endpoint, which `trainlet exec` serves to CMD.
pub mod kubeflow;
/// Logging setup: human-readable by default, JSON for clusters.
pub mod logging;
/// Prometheus metrics and the admin HTTP server (`/metrics`, `/livez`, `/readyz`).
pub mod metrics;
/// A peer change between exec and the sidecar: `peers.json` and the typed exchange.
pub mod peerchange;
/// The peer pods on the API server: one list (resolve) or a watch until complete (init).
pub mod peers;
/// The pre-flight: the pods prove the network between them before CMD starts.
pub mod preflight;
/// Annotations (merge patch, only on change) and Events on the own pod.
pub mod publish;
/// The reason of every Event trainlet sends, spelled once.
pub mod reason;
/// The files trainlet writes for the training container: TF_CONFIG, every framework's
/// format, cluster.json (pure rendering), their atomic writer, and moving them to a
/// replaced peer's address.
pub mod render;
/// The reporters: GPUs through NVML, ports from `/proc/net`, OOM kills from cgroups,
/// and the engine that publishes what they see.
pub mod report;
/// SIGTERM and SIGINT handling, and forwarding signals to a child.
pub mod signal;
/// Where a hung job is stuck (pure): its ranks' Python stacks, said short and compared.
pub mod stacks;
/// The stall watch (pure): progress, silence, stalls of this pod and of its peers.
pub mod stall;
/// `trainlet status`: a job's pods as trainlet sees them, and a verdict.
pub mod status;
/// exec's own log lines between CMD's lines on the stderr they share.
pub mod stderr_gate;
/// Small helpers for the streams the loops wait on.
pub mod stream;
/// `trainlet exec`'s life of CMD: start, stop its tree, restart on a peer change.
pub mod supervise;
/// The container's termination message (`/dev/termination-log`).
pub mod termination;
/// Text people read: the characters that hide or reorder it.
pub mod text;
/// Wall-clock times as RFC 3339 text and epoch milliseconds, total: never a panic.
pub mod time;
/// Waking on a file's change (inotify).
pub mod watch;

pub use exit::{Code, Exit, Failure};

#[cfg(test)]
mod testing;
