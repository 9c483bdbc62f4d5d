//! The command line. Every flag can also be set through an environment variable named
//! `TRAINLET_<FLAG>`, because containers are configured by env.
//!
//! Parsing happens in two phases, as in ripgrep: clap checks only what the user typed
//! ([`args`]), and [`lower`] then validates the flags into the configs that the
//! workflows take, before any client, file or library is touched: a bad flag fails in
//! microseconds and writes nothing. [`defaults`] holds every default once; [`explain`]
//! turns the domain's errors into the one line the user reads, naming the flag that
//! fixes them.
//!
//! This module knows clap and the domain's config types, and nothing of the commands.

pub mod args;
pub mod defaults;
pub mod exec_args;
pub mod explain;
pub mod inject_args;
pub mod lower;
pub mod reference;
pub mod values;

#[cfg(test)]
mod inject_dns_tests;
#[cfg(test)]
mod inject_hostnet_tests;
#[cfg(test)]
mod inject_infer_tests;
#[cfg(test)]
mod inject_own_tests;
#[cfg(test)]
mod inject_pod_tests;
#[cfg(test)]
mod inject_tests;

use clap::{Parser, Subcommand};

use crate::flags;
use args::{GpusArgs, InitArgs, MasterArgs, ResolveArgs, SidecarArgs, StacksArgs, StatusArgs};
use exec_args::ExecArgs;
use inject_args::InjectArgs;
use values::Logs;

/// trainlet: every process of a distributed training job (PyTorch, JAX, MPI,
/// TensorFlow) on Kubernetes gets its cluster and rank without an operator, and the
/// GPU, port and OOM trouble of its pods is reported.
#[derive(Debug, Parser)]
#[command(
    name = "trainlet",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(after_help = after_help())]
pub struct Cli {
    /// Log format: `text` for people, `json` for log collectors in clusters.
    #[arg(long = flags::LOG_FORMAT, env = "TRAINLET_LOG_FORMAT", value_enum, default_value_t = defaults::LOG_FORMAT, global = true)]
    pub log_format: Logs,

    /// Log filter, in tracing's EnvFilter syntax, e.g. `info` or `trainlet=debug,kube=warn`.
    /// The Kubernetes client's own log of each failed request repeats trainlet's error
    /// and is off unless the filter names it, e.g. `info,kube_client=debug`.
    #[arg(
        long = flags::LOG_LEVEL,
        env = "TRAINLET_LOG_LEVEL",
        default_value = defaults::LOG_LEVEL,
        global = true
    )]
    pub log_level: String,

    #[command(subcommand)]
    pub command: Command,
}

/// What `trainlet --help` ends with: the env vars, and every exit code (from
/// [`crate::exit::Code::ALL`], so that the list cannot miss one).
fn after_help() -> String {
    format!(
        "Every flag can also be set by an environment variable TRAINLET_<FLAG>, for example \
         --log-format as TRAINLET_LOG_FORMAT. A DURATION is e.g. 500ms, 30s, 10m or 1h 30m, \
         at most 365d.\n\n{}",
        crate::exit::summary()
    )
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Init container: wait for the peer pods, resolve the cluster and this pod's task,
    /// and write TF_CONFIG files atomically to --output-dir.
    Init(InitArgs),
    /// Resolve the cluster once, without waiting, and print {"cluster":...,"task":...}
    /// (TensorFlow's cluster_spec()).
    Resolve(ResolveArgs),
    /// Print the address of one task, e.g. grpc://10.0.0.6:8470 (TensorFlow's master()).
    Master(MasterArgs),
    /// Run a command with the cluster's variables set (TF_CONFIG and those of the
    /// frameworks in trainlet.env: MASTER_ADDR, RANK, JAX's, MPI's): reuse
    /// <output-dir>/tf_config.json or run init first, then replace this process with the
    /// command (or supervise it with --report).
    /// The command gets PYTHONUNBUFFERED=1 unless the container sets it, as Kubeflow's
    /// operators do: Python holds back what it writes to a pipe.
    Exec(ExecArgs),
    /// Sidecar container: report GPU counts, port conflicts and OOM kills of this pod to
    /// its annotations, to Events and to Prometheus.
    Sidecar(SidecarArgs),
    /// Print the GPUs visible through NVML as JSON (TensorFlow's num_accelerators()).
    Gpus(GpusArgs),
    /// Add trainlet to the pod templates of Kubernetes YAML (like `linkerd inject`).
    Inject(InjectArgs),
    /// Show a job's pods as trainlet sees them (task, IP, phase, health, GPUs, cluster,
    /// restarts, progress, ETA, last OOM kill, last Event) and one verdict for the job
    /// (`not admitted` while the Job or JobSet is suspended, as Kueue holds it). A job
    /// that does not exist exits 2. Reads only: get on the Job or JobSet, get/list on pods
    /// and events, no watch. Also `kubectl trainlet status` when installed as the
    /// kubectl plugin `kubectl-trainlet`.
    Status(StatusArgs),
    /// Print the Python stacks of every process under `trainlet exec --report` in this
    /// pod, as exec captures them at a stall: where each rank is, then every thread's
    /// frames. Run it in the training container (`kubectl exec POD -c CONTAINER --
    /// trainlet stacks`); exec, their ancestor, reads them and answers through an
    /// abstract socket of the pod. No exec listening exits 3.
    Stacks(StacksArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_has_a_trainlet_env_var() {
        fn walk(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || arg.is_positional() {
                    continue;
                }
                let env = arg
                    .get_env()
                    .unwrap_or_else(|| panic!("{path} --{id} has no env var"));
                let long = arg.get_long().expect("flags are long");
                let want = format!("TRAINLET_{}", long.to_uppercase().replace('-', "_"));
                assert_eq!(env.to_str(), Some(want.as_str()), "{path} --{long}");
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        walk(&Cli::command(), "trainlet");
    }
}
