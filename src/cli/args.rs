//! The flags of every subcommand, as clap sees them: shared groups (kube, cluster,
//! output, report) and one struct per subcommand. Nothing here validates beyond what
//! clap checks; `lower` turns these into the configs the workflows take.

use std::path::PathBuf;

use clap::Args;

use super::defaults;
use super::values::{
    Address, Coordination, Framework, Order, Ready, StatusOutput, coordinate_from, whole,
};
use crate::flags;

/// How to reach the API server and who "self" is.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Kubeconfig file. Default: the in-cluster service account, then $KUBECONFIG, then
    /// ~/.kube/config.
    #[arg(long = flags::KUBECONFIG, env = "TRAINLET_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// This pod's name. Default: $POD_NAME (downward API metadata.name), then $HOSTNAME.
    #[arg(long = flags::POD_NAME, env = "TRAINLET_POD_NAME", value_name = "NAME")]
    pub pod_name: Option<String>,

    /// This pod's namespace. Default: $POD_NAMESPACE (downward API metadata.namespace),
    /// then the service account's namespace file, then the kubeconfig context's namespace.
    #[arg(long = flags::POD_NAMESPACE, env = "TRAINLET_POD_NAMESPACE", value_name = "NS")]
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
        long = flags::JOB,
        env = "TRAINLET_JOB",
        value_name = "TYPE=SELECTOR",
        value_delimiter = ';'
    )]
    pub jobs: Vec<String>,

    /// TensorFlow's job_to_label_mapping as JSON, e.g.
    /// '{"worker":["job-name=w"],"ps":["job-name=p"]}'. An alternative to --job.
    #[arg(
        long = flags::JOB_TO_LABEL_MAPPING,
        env = "TRAINLET_JOB_TO_LABEL_MAPPING",
        value_name = "JSON",
        conflicts_with = "jobs"
    )]
    pub job_to_label_mapping: Option<String>,

    /// Expected number of pods per type, e.g. `ps=2,worker=4`. Default: derived from the
    /// Job (completions when Indexed, else parallelism), StatefulSet or ReplicaSet that
    /// owns the matched pods.
    #[arg(
        long = flags::EXPECT,
        env = "TRAINLET_EXPECT",
        value_name = "TYPE=N",
        value_delimiter = ','
    )]
    pub expect: Vec<String>,

    /// Namespace to find peers in. Default: this pod's namespace.
    #[arg(long = flags::NAMESPACE, env = "TRAINLET_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// Find peers in every namespace, as TensorFlow's resolver does. Needs a ClusterRole
    /// that grants list and watch on pods; off by default, because another tenant's pods
    /// could join your cluster.
    #[arg(long = flags::ALL_NAMESPACES, env = "TRAINLET_ALL_NAMESPACES", conflicts_with = "namespace")]
    pub all_namespaces: bool,

    /// The server port of every task in TF_CONFIG (the resolver's tf_server_port);
    /// default 8470. Given (or --port-name), it is also the port of PyTorch's
    /// MASTER_PORT and JAX's coordinator, which otherwise use their launchers' own
    /// defaults (torchrun 29500, JAX 55527).
    #[arg(long = flags::PORT, env = "TRAINLET_PORT", value_name = "N", value_parser = whole::<u16>)]
    pub port: Option<u16>,

    /// Use each peer's containerPort of this name where it has one, else --port.
    #[arg(long = flags::PORT_NAME, env = "TRAINLET_PORT_NAME", value_name = "NAME")]
    pub port_name: Option<String>,

    /// Address of each task: the pod IP, the node's host IP (for hostNetwork), or the
    /// stable DNS name <hostname>.<subdomain>.<namespace>.svc.<cluster-domain>; with
    /// dns, init also waits (within --timeout) until each name resolves to its pod IP.
    #[arg(long = flags::ADDRESS, env = "TRAINLET_ADDRESS", value_enum, default_value_t = defaults::ADDRESS)]
    pub address: Address,

    /// Cluster DNS domain, for --address dns.
    #[arg(
        long = flags::CLUSTER_DOMAIN,
        env = "TRAINLET_CLUSTER_DOMAIN",
        value_name = "DOMAIN",
        default_value = defaults::CLUSTER_DOMAIN
    )]
    pub cluster_domain: String,

    /// Task order within a type: `index` uses the pods' Job completion, StatefulSet or
    /// Kubeflow replica index when every pod has one, else the natural order of names
    /// (w-2 before w-10); `name` is TensorFlow's plain lexicographic order.
    #[arg(long = flags::ORDER, env = "TRAINLET_ORDER", value_enum, default_value_t = defaults::ORDER)]
    pub order: Order,

    /// When a peer counts as ready: `running` is phase Running with an address, or
    /// phase Pending with an address while its init containers run (peers wait for each
    /// other in trainlet-init, so none would ever be Running otherwise); `ready` also
    /// requires the pod's Ready condition.
    #[arg(long = flags::READY, env = "TRAINLET_READY", value_enum, default_value_t = defaults::READY)]
    pub ready: Ready,

    /// Override this pod's task type (TensorFlow's settable task_type).
    #[arg(
        long = flags::TASK_TYPE,
        env = "TRAINLET_TASK_TYPE",
        value_name = "TYPE",
        requires = "task_index"
    )]
    pub task_type: Option<String>,

    /// Override this pod's task index (TensorFlow's settable task_id).
    #[arg(
        long = flags::TASK_INDEX,
        alias = "task-id",
        env = "TRAINLET_TASK_INDEX",
        value_name = "I",
        requires = "task_type"
    )]
    pub task_index: Option<usize>,

    /// RPC layer of the master address, e.g. grpc:// in cluster.json's "master".
    #[arg(
        long = flags::RPC_LAYER,
        env = "TRAINLET_RPC_LAYER",
        value_name = "LAYER",
        default_value = defaults::RPC_LAYER
    )]
    pub rpc_layer: String,

    /// Adds "environment" to TF_CONFIG, e.g. `cloud` as Kubeflow does.
    #[arg(long = flags::ENVIRONMENT, env = "TRAINLET_ENVIRONMENT", value_name = "ENV")]
    pub environment: Option<String>,
}

/// Where results go.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Directory for tf_config.json, trainlet.env, cluster.json and the other
    /// frameworks' files, usually a shared emptyDir.
    #[arg(
        long = flags::OUTPUT_DIR,
        env = "TRAINLET_OUTPUT_DIR",
        value_name = "DIR",
        default_value = defaults::OUTPUT_DIR
    )]
    pub output_dir: PathBuf,

    /// Also copy the trainlet binary into DIR (usually a shared emptyDir), so the main
    /// container can run `trainlet exec` without trainlet in its image.
    #[arg(long = flags::INSTALL_TO, env = "TRAINLET_INSTALL_TO", value_name = "DIR")]
    pub install_to: Option<PathBuf>,

    /// Whether the agents of a job coordinate: `auto` from --coordinate-from pods on
    /// (384; as far as --expect or this pod's index tell), `always`, or `never`. Coordinated, only the
    /// pod of task 0 of the first type watches every peer and publishes the cluster on
    /// its pod (annotation trainlet.io/resolution); every other agent watches that one
    /// pod, so a job of N pods costs the API server O(N) instead of O(N²). It needs
    /// index labels (Indexed Jobs, StatefulSets) and one selector for the first type.
    #[arg(long = flags::COORDINATE, env = "TRAINLET_COORDINATE", value_enum, default_value_t = defaults::COORDINATE)]
    pub coordinate: Coordination,

    /// The job size from which `--coordinate auto` coordinates: a job of at least N
    /// pods (by --expect, or this pod's index being N or more). The default, 384, is
    /// where coordinating became faster than every agent watching every peer on the
    /// benchmark (docs/large-jobs.md); a lower N coordinates smaller jobs (where the
    /// API server is shared more than the agents' CPUs, or to try coordinated mode on a
    /// small job). At least 2.
    #[arg(
        long = flags::COORDINATE_FROM,
        env = "TRAINLET_COORDINATE_FROM",
        value_name = "N",
        default_value_t = defaults::COORDINATE_FROM,
        value_parser = coordinate_from
    )]
    pub coordinate_from: usize,

    /// The frameworks whose variables go into trainlet.env and CMD's environment, next
    /// to TF_CONFIG, which is always there. Every framework's file is written either
    /// way: torch.env, jax.env, mpi.env, hostfile and <type>.host. Repeatable, or
    /// comma-separated. Default: tensorflow; for `trainlet inject --wrap`, the
    /// frameworks of the wrapped command's launcher (torchrun, python -m
    /// torch.distributed.run, accelerate launch and deepspeed: pytorch; mpirun, mpiexec
    /// and horovodrun: mpi), else tensorflow.
    #[arg(
        long = flags::FRAMEWORK,
        env = "TRAINLET_FRAMEWORK",
        value_name = "NAME",
        value_enum,
        value_delimiter = ','
    )]
    pub frameworks: Vec<Framework>,

    /// Processes per pod, as torchrun's --nproc-per-node: `auto` (the training
    /// container's nvidia.com/gpu limit when above 0, else 1), `gpu` (that limit),
    /// `cpu` (every CPU torchrun sees), or a number. torchrun gets it as
    /// PET_NPROC_PER_NODE, `auto` resolved. WORLD_SIZE is pods × N for a number N, and
    /// pods for the others, as Kubeflow counts them: a plain `python train.py` is one
    /// process per pod, and torchrun sets WORLD_SIZE itself.
    #[arg(
        long = flags::NPROC_PER_NODE,
        env = "TRAINLET_NPROC_PER_NODE",
        value_name = "auto|gpu|cpu|N",
        default_value = defaults::NPROC_PER_NODE
    )]
    pub nproc_per_node: String,

    /// Slots per host in the hostfile and TRAINLET_HOSTS: a number, or `gpu` (the
    /// training container's nvidia.com/gpu limit). Default: that limit, else 1.
    #[arg(long = flags::SLOTS, env = "TRAINLET_SLOTS", value_name = "N|gpu")]
    pub slots: Option<String>,

    /// Elastic PyTorch: `MIN:MAX` pods. init completes once MIN pods are ready
    /// instead of all, and torch.env sets torchrun's c10d rendezvous (PET_NNODES=MIN:MAX,
    /// PET_RDZV_ENDPOINT at rank 0, PET_RDZV_ID), which the later pods join.
    #[arg(long = flags::NNODES, env = "TRAINLET_NNODES", value_name = "MIN:MAX")]
    pub nnodes: Option<String>,

    /// PyTorch's MASTER_PORT (and torchrun's rendezvous port), where rank 0's process
    /// listens. Default: the task port that --port or --port-name names, unless MPI is
    /// among the --framework too (that port is then its sshd's), else torchrun's 29500.
    /// On hostNetwork pods, pick one no other pod on the node uses: `trainlet inject`
    /// and the admission policy do, per job, where neither this nor a task port is
    /// given (20000-24492; see docs/hostnetwork.md).
    #[arg(long = flags::MASTER_PORT, env = "TRAINLET_MASTER_PORT", value_name = "PORT", value_parser = whole::<u16>)]
    pub master_port: Option<u16>,

    /// JAX's coordinator port, where process 0 listens. Default: the task port that
    /// --port or --port-name names, unless MPI is among the --framework too, else JAX's
    /// 55527.
    #[arg(long = flags::COORDINATOR_PORT, env = "TRAINLET_COORDINATOR_PORT", value_name = "PORT", value_parser = whole::<u16>)]
    pub coordinator_port: Option<u16>,

    /// How long to wait for peers, e.g. 90s, 10m or 1h; 0 waits forever.
    #[arg(
        long = flags::TIMEOUT,
        env = "TRAINLET_TIMEOUT",
        value_name = "DURATION",
        default_value = defaults::TIMEOUT
    )]
    pub timeout: String,

    /// Before writing anything, prove the network: each pod listens on its task's
    /// port, connects to the next task's address (the ring of the cluster's tasks) and
    /// waits for the previous task's pod to connect, within what is left of --timeout.
    /// A path that does not carry fails init with exit code 10 and a PeerUnreachable
    /// Event naming the peer and the side that saw it, instead of a framework hanging
    /// in its rendezvous. A peer already past its init (a replacement joining a
    /// running job) is not waited for. Off by default: every peer must run trainlet-init
    /// at the same time, which pods made by hand may not (docs/preflight.md).
    #[arg(long = flags::PREFLIGHT, env = "TRAINLET_PREFLIGHT")]
    pub preflight: bool,
}

impl OutputArgs {
    /// The frameworks `--framework` gives, or TensorFlow's where it is not given (which
    /// `trainlet inject` tells from an explicit `--framework tensorflow`: it then infers
    /// them from the wrapped command).
    pub fn chosen_frameworks(&self) -> Vec<Framework> {
        if self.frameworks.is_empty() {
            vec![Framework::Tensorflow]
        } else {
            self.frameworks.clone()
        }
    }
}

/// Flags shared by `trainlet sidecar` and `trainlet exec --report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Path of the NVML library to load instead of the system's libnvidia-ml.so.1.
    #[arg(long = flags::NVML_LIB, env = "TRAINLET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,

    /// Expected GPU count. Default: the training container's
    /// resources.limits["nvidia.com/gpu"].
    #[arg(long = flags::EXPECT_GPUS, env = "TRAINLET_EXPECT_GPUS", value_name = "N")]
    pub expect_gpus: Option<u32>,

    /// The training container's name. Default: the first container of the pod that is
    /// not a trainlet container.
    #[arg(long = flags::CONTAINER, env = "TRAINLET_CONTAINER", value_name = "NAME")]
    pub container: Option<String>,

    /// How often the probes run (GPUs, ports, pod status). OOM kills are watched
    /// continuously and reported within about a second.
    #[arg(
        long = flags::INTERVAL,
        env = "TRAINLET_INTERVAL",
        value_name = "DURATION",
        default_value = defaults::INTERVAL
    )]
    pub interval: String,

    /// At most one annotation patch per this interval; an OOM kill or a new port
    /// conflict is published at once.
    #[arg(
        long = flags::MIN_PATCH_INTERVAL,
        env = "TRAINLET_MIN_PATCH_INTERVAL",
        value_name = "DURATION",
        default_value = defaults::MIN_PATCH_INTERVAL
    )]
    pub min_patch_interval: String,

    /// Address of the Prometheus endpoint (/metrics, /livez, /readyz); `off` disables it.
    #[arg(
        long = flags::METRICS_ADDR,
        env = "TRAINLET_METRICS_ADDR",
        value_name = "ADDR",
        default_value_t = defaults::metrics_addr()
    )]
    pub metrics_addr: String,

    /// The observation handover: a directory on a volume shared by the training
    /// container (writable) and the trainlet sidecar (read-only); `inject --wrap` mounts
    /// one at /run/trainlet-observed. `exec --report` writes what only it sees there (its GPUs,
    /// CMD's ports and OOM kills) instead of publishing it, so the training container
    /// needs no API credentials; the sidecar reads it and is the pod's only reporter.
    #[arg(long = flags::OBSERVATIONS, env = "TRAINLET_OBSERVATIONS", value_name = "DIR")]
    pub observations: Option<PathBuf>,
}

/// `trainlet init`.
#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `trainlet resolve`.
#[derive(Debug, Clone, Args)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `trainlet master`.
#[derive(Debug, Clone, Args)]
pub struct MasterArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Directory where `trainlet init` wrote cluster.json.
    #[arg(
        long = flags::OUTPUT_DIR,
        env = "TRAINLET_OUTPUT_DIR",
        value_name = "DIR",
        default_value = defaults::OUTPUT_DIR
    )]
    pub output_dir: PathBuf,
}

/// `trainlet sidecar`.
#[derive(Debug, Clone, Args)]
pub struct SidecarArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub report: ReportArgs,

    /// A port to watch for conflicts. Repeatable, or comma-separated. Default: the
    /// training container's containerPorts.
    #[arg(
        long = flags::PORT,
        env = "TRAINLET_PORT",
        value_name = "N",
        value_delimiter = ','
    )]
    pub ports: Vec<u16>,

    /// The node's cgroup filesystem, mounted read-only into the sidecar (e.g. a
    /// hostPath of /sys/fs/cgroup at /host/sys/fs/cgroup). With it, OOM kills of
    /// processes inside the training container are counted, not only the kills of
    /// the container itself that pod status shows. The pod is found by its UID.
    #[arg(long = flags::CGROUP_ROOT, env = "TRAINLET_CGROUP_ROOT", value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,

    /// The cluster.json of trainlet-init: after the start, the sidecar watches the pods
    /// of the job types it was resolved from and reports a peer lost (its pod deleted or
    /// Failed, and no replacement with an address) or replaced (another pod holds its Job
    /// index or StatefulSet name, whatever its address; a Succeeded peer is neither):
    /// PeerLost, PeerReplaced, trainlet.io/cluster, degraded. Used
    /// when the file exists; `off` turns the watch off. Default: cluster.json in the
    /// default --output-dir of init (/etc/trainlet).
    #[arg(long = flags::CLUSTER_FILE, env = "TRAINLET_CLUSTER_FILE", value_name = "PATH")]
    pub cluster_file: Option<String>,

    /// Exit 0 once the training container has terminated for good, so that a Job
    /// with a classic sidecar can complete. Native sidecars do not need it.
    #[arg(long = flags::EXIT_WITH_MAIN, env = "TRAINLET_EXIT_WITH_MAIN")]
    pub exit_with_main: bool,
}

/// `trainlet gpus`.
#[derive(Debug, Clone, Args)]
pub struct GpusArgs {
    /// Path of the NVML library to load instead of the system's libnvidia-ml.so.1.
    #[arg(long = flags::NVML_LIB, env = "TRAINLET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
}

/// `trainlet stacks`.
#[derive(Debug, Clone, Args)]
pub struct StacksArgs {
    /// The container whose `trainlet exec` to ask, where several in the pod run one;
    /// the container's own --container (TRAINLET_CONTAINER) by default, then the only
    /// one that listens.
    #[arg(long = flags::CONTAINER, env = "TRAINLET_CONTAINER", value_name = "NAME")]
    pub container: Option<String>,
}

/// `trainlet status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The job: `job/NAME` (the pods of Job NAME), `jobset/NAME` (of JobSet NAME), or
    /// NAME (a Job's, else a JobSet's). Or select the pods with --selector instead.
    #[arg(value_name = "JOB")]
    pub target: Option<String>,

    /// A label selector of the job's pods, in full Kubernetes syntax, e.g.
    /// `app=mnist`; repeatable, for jobs whose types have selectors of their own. In
    /// the env var, separate entries with `;`.
    #[arg(
        short = 'l',
        long = flags::SELECTOR,
        env = "TRAINLET_SELECTOR",
        value_name = "SELECTOR",
        value_delimiter = ';'
    )]
    pub selectors: Vec<String>,

    /// The namespace of the job. Default: the kubeconfig context's namespace.
    #[arg(short = 'n', long = flags::NAMESPACE, env = "TRAINLET_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// `table` for people, `json` for scripts (the rows and the verdict).
    #[arg(short = 'o', long = flags::OUTPUT, env = "TRAINLET_OUTPUT", value_enum, value_name = "FORMAT", default_value_t = StatusOutput::Table)]
    pub output: StatusOutput,

    /// Kubeconfig file. Default: $KUBECONFIG, then ~/.kube/config, then the in-cluster
    /// service account.
    #[arg(long = flags::KUBECONFIG, env = "TRAINLET_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}
