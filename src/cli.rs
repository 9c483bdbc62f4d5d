//! The command line. Every flag can also be set through an environment variable named
//! `TRAINLET_<FLAG>`, because containers are configured by env.
//!
//! Parsing happens in two phases, as in ripgrep: clap checks only what the user typed,
//! and each subcommand then validates its flags into a config (pure, no syscalls) before
//! any client, file or library is touched. A bad flag fails in microseconds and writes
//! nothing.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::cmd;

/// trainlet: TF_CONFIG for distributed TensorFlow on Kubernetes without an operator,
/// and a reporter for the GPU, port and OOM trouble of training pods.
#[derive(Debug, Parser)]
#[command(
    name = "trainlet",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(
    after_help = "Every flag can also be set by an environment variable TRAINLET_<FLAG>, \
for example --log-format as TRAINLET_LOG_FORMAT.\n\n\
Exit codes: 0 success, 2 invalid flags or configuration, 3 peers not ready, \
4 Kubernetes API error, 5 inconsistent peers, 6 port conflict."
)]
pub struct Cli {
    /// Log format: `text` for people, `json` for log collectors in clusters.
    #[arg(long, env = "TRAINLET_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Log filter, in tracing's EnvFilter syntax, e.g. `info` or `trainlet=debug,kube=warn`.
    #[arg(
        long,
        env = "TRAINLET_LOG_LEVEL",
        default_value = "info",
        global = true
    )]
    pub log_level: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Init container: wait for the peer pods, resolve the cluster and this pod's task,
    /// and write TF_CONFIG files atomically to --output-dir.
    Init(cmd::init::InitArgs),
    /// Resolve the cluster once, without waiting, and print {"cluster":...,"task":...}
    /// (TensorFlow's cluster_spec()).
    Resolve(cmd::resolve::ResolveArgs),
    /// Print the address of one task, e.g. grpc://10.0.0.6:8470 (TensorFlow's master()).
    Master(cmd::master::MasterArgs),
    /// Run a command with TF_CONFIG set: reuse <output-dir>/tf_config.json or run init
    /// first, then replace this process with the command (or supervise it with --report).
    Exec(cmd::exec::ExecArgs),
    /// Sidecar container: report GPU counts, port conflicts and OOM kills of this pod to
    /// its annotations, to Events and to Prometheus.
    Sidecar(cmd::sidecar::SidecarArgs),
    /// Print the GPUs visible through NVML as JSON (TensorFlow's num_accelerators()).
    Gpus(cmd::gpus::GpusArgs),
    /// Add trainlet to the pod templates of Kubernetes YAML (like `linkerd inject`).
    Inject(crate::inject::InjectArgs),
}

/// How to reach the API server and who "self" is.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Kubeconfig file. Default: the in-cluster service account, then $KUBECONFIG, then
    /// ~/.kube/config.
    #[arg(long, env = "TRAINLET_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// This pod's name. Default: $POD_NAME (downward API metadata.name), then $HOSTNAME.
    #[arg(long, env = "TRAINLET_POD_NAME", value_name = "NAME")]
    pub pod_name: Option<String>,

    /// This pod's namespace. Default: $POD_NAMESPACE (downward API metadata.namespace),
    /// then the service account's namespace file, then the kubeconfig context's namespace.
    #[arg(long, env = "TRAINLET_POD_NAMESPACE", value_name = "NS")]
    pub pod_namespace: Option<String>,
}

/// Which pods form the cluster, and how each becomes a TF_CONFIG address.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// A job type and the label selector of its pods, in full Kubernetes syntax, e.g.
    /// `worker=app=mnist,role=worker` or `ps=job-name in (ps),tier!=canary`. Repeatable;
    /// several --job for one type concatenate their pods in the order given, as
    /// TensorFlow does. In the env var, separate entries with `;`.
    #[arg(
        long = "job",
        env = "TRAINLET_JOB",
        value_name = "TYPE=SELECTOR",
        value_delimiter = ';'
    )]
    pub jobs: Vec<String>,

    /// TensorFlow's job_to_label_mapping as JSON, e.g.
    /// '{"worker":["job-name=w"],"ps":["job-name=p"]}'. An alternative to --job.
    #[arg(
        long,
        env = "TRAINLET_JOB_TO_LABEL_MAPPING",
        value_name = "JSON",
        conflicts_with = "jobs"
    )]
    pub job_to_label_mapping: Option<String>,

    /// Expected number of pods per type, e.g. `ps=2,worker=4`. Default: derived from the
    /// Job (completions when Indexed, else parallelism), StatefulSet or ReplicaSet that
    /// owns the matched pods.
    #[arg(
        long,
        env = "TRAINLET_EXPECT",
        value_name = "TYPE=N",
        value_delimiter = ','
    )]
    pub expect: Vec<String>,

    /// Namespace to find peers in. Default: this pod's namespace.
    #[arg(long, env = "TRAINLET_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// Find peers in every namespace, as TensorFlow's resolver does. Needs a ClusterRole
    /// that grants list and watch on pods; off by default, because another tenant's pods
    /// could join your cluster.
    #[arg(long, env = "TRAINLET_ALL_NAMESPACES", conflicts_with = "namespace")]
    pub all_namespaces: bool,

    /// TensorFlow server port of every task (the resolver's tf_server_port).
    #[arg(long, env = "TRAINLET_PORT", value_name = "N", default_value_t = 8470)]
    pub port: u16,

    /// Use each peer's containerPort of this name where it has one, else --port.
    #[arg(long, env = "TRAINLET_PORT_NAME", value_name = "NAME")]
    pub port_name: Option<String>,

    /// Address of each task: the pod IP, the node's host IP (for hostNetwork), or the
    /// stable DNS name <hostname>.<subdomain>.<namespace>.svc.<cluster-domain>.
    #[arg(long, env = "TRAINLET_ADDRESS", value_enum, default_value_t = AddressMode::PodIp)]
    pub address: AddressMode,

    /// Cluster DNS domain, for --address dns.
    #[arg(
        long,
        env = "TRAINLET_CLUSTER_DOMAIN",
        value_name = "DOMAIN",
        default_value = "cluster.local"
    )]
    pub cluster_domain: String,

    /// Task order within a type: `index` uses the pods' Job completion, StatefulSet or
    /// Kubeflow replica index when every pod has one, else the natural order of names
    /// (w-2 before w-10); `name` is TensorFlow's plain lexicographic order.
    #[arg(long, env = "TRAINLET_ORDER", value_enum, default_value_t = OrderMode::Index)]
    pub order: OrderMode,

    /// When a peer counts as ready: `running` is phase Running with an address; `ready`
    /// also requires the pod's Ready condition.
    #[arg(long, env = "TRAINLET_READY", value_enum, default_value_t = ReadyMode::Running)]
    pub ready: ReadyMode,

    /// Override this pod's task type (TensorFlow's settable task_type).
    #[arg(
        long,
        env = "TRAINLET_TASK_TYPE",
        value_name = "TYPE",
        requires = "task_index"
    )]
    pub task_type: Option<String>,

    /// Override this pod's task index (TensorFlow's settable task_id).
    #[arg(
        long,
        alias = "task-id",
        env = "TRAINLET_TASK_INDEX",
        value_name = "I",
        requires = "task_type"
    )]
    pub task_index: Option<usize>,

    /// RPC layer of the master address, e.g. grpc:// in cluster.json's "master".
    #[arg(
        long,
        env = "TRAINLET_RPC_LAYER",
        value_name = "LAYER",
        default_value = "grpc"
    )]
    pub rpc_layer: String,

    /// Adds "environment" to TF_CONFIG, e.g. `cloud` as Kubeflow does.
    #[arg(long, env = "TRAINLET_ENVIRONMENT", value_name = "ENV")]
    pub environment: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AddressMode {
    PodIp,
    HostIp,
    Dns,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OrderMode {
    Index,
    Name,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadyMode {
    Running,
    Ready,
}

/// Where results go.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Directory for tf_config.json, trainlet.env and cluster.json, usually a shared
    /// emptyDir.
    #[arg(
        long,
        env = "TRAINLET_OUTPUT_DIR",
        value_name = "DIR",
        default_value = "/etc/trainlet"
    )]
    pub output_dir: PathBuf,

    /// Also copy the trainlet binary into DIR (usually a shared emptyDir), so the main
    /// container can run `trainlet exec` without trainlet in its image.
    #[arg(long, env = "TRAINLET_INSTALL_TO", value_name = "DIR")]
    pub install_to: Option<PathBuf>,

    /// How long to wait for peers, e.g. 90s, 10m or 1h; 0 waits forever.
    #[arg(
        long,
        env = "TRAINLET_TIMEOUT",
        value_name = "DURATION",
        default_value = "10m"
    )]
    pub timeout: String,
}

/// Flags shared by `trainlet sidecar` and `trainlet exec --report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Path of the NVML library to load instead of the system's libnvidia-ml.so.1.
    #[arg(long, env = "TRAINLET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,

    /// Expected GPU count. Default: the training container's
    /// resources.limits["nvidia.com/gpu"].
    #[arg(long, env = "TRAINLET_EXPECT_GPUS", value_name = "N")]
    pub expect_gpus: Option<u32>,

    /// The training container's name. Default: the first container of the pod that is
    /// not a trainlet container.
    #[arg(long, env = "TRAINLET_CONTAINER", value_name = "NAME")]
    pub container: Option<String>,

    /// How often the probes run (GPUs, ports, pod status). OOM kills are watched
    /// continuously and reported within about a second.
    #[arg(
        long,
        env = "TRAINLET_INTERVAL",
        value_name = "DURATION",
        default_value = "5s"
    )]
    pub interval: String,

    /// At most one annotation patch per this interval; an OOM kill or a new port
    /// conflict is published at once.
    #[arg(
        long,
        env = "TRAINLET_MIN_PATCH_INTERVAL",
        value_name = "DURATION",
        default_value = "10s"
    )]
    pub min_patch_interval: String,

    /// Address of the Prometheus endpoint (/metrics, /livez, /readyz); `off` disables it.
    #[arg(
        long,
        env = "TRAINLET_METRICS_ADDR",
        value_name = "ADDR",
        default_value = "0.0.0.0:9464"
    )]
    pub metrics_addr: String,
}

/// Parses a duration such as `500ms`, `10s`, `10m` or `1h 30m`; a bare `0` is zero.
pub fn parse_duration(flag: &str, value: &str) -> Result<std::time::Duration, crate::Failure> {
    let v = value.trim();
    if v == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    humantime::parse_duration(v).map_err(|e| {
        let zero = if flag == "--timeout" {
            "; 0 means no limit"
        } else {
            ""
        };
        crate::Failure::usage(format!(
            "invalid {flag} {value:?}: {e} (use e.g. 30s, 10m or 1h{zero})"
        ))
    })
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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("--timeout", "0").unwrap().as_secs(), 0);
        assert_eq!(parse_duration("--timeout", "10m").unwrap().as_secs(), 600);
        assert_eq!(
            parse_duration("--timeout", "1h 30m").unwrap().as_secs(),
            5400
        );
        let e = parse_duration("--timeout", "soon").unwrap_err();
        assert_eq!(e.code, crate::Code::Usage);
        assert!(
            e.message.starts_with("invalid --timeout \"soon\""),
            "{}",
            e.message
        );
    }
}
