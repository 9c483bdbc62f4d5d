//! One module per subcommand. These are the edges: they validate flags into a config
//! (no I/O), then talk to the API server, the kernel and the file system.

pub mod exec;
pub mod gpus;
pub mod init;
pub mod master;
pub mod resolve;
pub mod sidecar;

use std::collections::BTreeMap;

use crate::cli::{ClusterArgs, Command};
use crate::cluster::{self, Resolver, Task};
use crate::{Code, Failure};

/// Runs one subcommand to its exit code.
pub fn run(command: Command) -> Result<Code, Failure> {
    match command {
        Command::Init(a) => init::run(a),
        Command::Resolve(a) => resolve::run(a),
        Command::Master(a) => master::run(a),
        Command::Exec(a) => exec::run(a),
        Command::Sidecar(a) => sidecar::run(a),
        Command::Gpus(a) => gpus::run(a),
        Command::Inject(a) => crate::inject::run(a),
    }
}

/// A single-threaded runtime: trainlet waits on a socket or two, and one thread keeps
/// the init container's memory and start-up cost minimal.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            Failure::new(
                Code::Internal,
                format!("cannot start the async runtime: {e}"),
            )
        })
}

/// The cluster flags, validated.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub resolver: Resolver,
    pub expected: BTreeMap<String, usize>,
    pub task_override: Option<Task>,
    pub rpc_layer: String,
    pub environment: Option<String>,
}

impl ClusterConfig {
    /// Checks the flags only: no client, no file, no syscall.
    pub fn from_args(a: &ClusterArgs) -> Result<Self, Failure> {
        let jobs = match &a.job_to_label_mapping {
            Some(json) => cluster::parse_mapping(json)?,
            None => cluster::parse_job_flags(&a.jobs)?,
        };
        let expected = cluster::parse_expect(&a.expect, &jobs)?;
        if a.port == 0 {
            return Err(Failure::usage(
                "invalid --port 0: use the TensorFlow server port, e.g. 8470",
            ));
        }
        if let Some(n) = &a.port_name
            && (n.is_empty() || n.len() > 15)
        {
            return Err(Failure::usage(format!(
                "invalid --port-name {n:?}: a container port name has 1 to 15 characters"
            )));
        }
        let task_override = match (&a.task_type, a.task_index) {
            (Some(t), Some(i)) => {
                if !jobs.iter().any(|j| &j.task_type == t) {
                    let known: Vec<&str> = jobs.iter().map(|j| j.task_type.as_str()).collect();
                    return Err(Failure::usage(format!(
                        "invalid --task-type {t:?}: not a job type given by --job ({})",
                        known.join(", ")
                    )));
                }
                Some(Task {
                    task_type: t.clone(),
                    index: i,
                })
            }
            _ => None,
        };
        if a.rpc_layer.contains("://") {
            return Err(Failure::usage(format!(
                "invalid --rpc-layer {:?}: give the scheme only, e.g. grpc",
                a.rpc_layer
            )));
        }
        Ok(ClusterConfig {
            resolver: Resolver {
                jobs,
                port: a.port,
                port_name: a.port_name.clone(),
                address: a.address,
                cluster_domain: a.cluster_domain.trim_matches('.').to_string(),
                order: a.order,
                ready: a.ready,
            },
            expected,
            task_override,
            rpc_layer: a.rpc_layer.clone(),
            environment: a.environment.clone().filter(|e| !e.is_empty()),
        })
    }
}

/// The peer namespace: --all-namespaces, --namespace, else the pod's own.
pub(crate) fn scope(a: &ClusterArgs, own_namespace: &str) -> crate::wait::Scope {
    if a.all_namespaces {
        crate::wait::Scope::All
    } else {
        crate::wait::Scope::Namespace(
            a.namespace
                .clone()
                .unwrap_or_else(|| own_namespace.to_string()),
        )
    }
}
