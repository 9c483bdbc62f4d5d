//! The words of trainlet's command line, each spelled once: the parser (`cli::args`)
//! takes its long flag names from here, `cli::lower` writes the agents' command lines
//! that `inject` puts into pod templates with them, `inject` writes the sidecar's and
//! exec's own, and a message that must tell the user which flag to change names it
//! through these. A renamed flag is then renamed everywhere, or the build fails.
//!
//! Only names live here: no parsing, no clap. Each constant is the flag without its
//! leading `--`; [`long`] adds it.

/// `--NAME`, for messages.
pub fn long(name: &str) -> String {
    format!("--{name}")
}

/// `--NAME=VALUE`, for command lines trainlet writes (inject's agents).
pub fn with_value(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

// The subcommands inject writes into pod templates.
pub const INIT: &str = "init";
pub const SIDECAR: &str = "sidecar";
pub const EXEC: &str = "exec";

// Identity and the API server.
pub const KUBECONFIG: &str = "kubeconfig";
pub const POD_NAME: &str = "pod-name";
pub const POD_NAMESPACE: &str = "pod-namespace";

// The cluster (`init`, `resolve`, `master`, `exec`, `inject`).
pub const JOB: &str = "job";
pub const JOB_TO_LABEL_MAPPING: &str = "job-to-label-mapping";
pub const EXPECT: &str = "expect";
pub const NAMESPACE: &str = "namespace";

// `status`.
pub const SELECTOR: &str = "selector";
pub const OUTPUT: &str = "output";
pub const ALL_NAMESPACES: &str = "all-namespaces";
pub const PORT: &str = "port";
pub const PORT_NAME: &str = "port-name";
pub const ADDRESS: &str = "address";
pub const CLUSTER_DOMAIN: &str = "cluster-domain";
pub const ORDER: &str = "order";
pub const READY: &str = "ready";
pub const TASK_TYPE: &str = "task-type";
pub const TASK_INDEX: &str = "task-index";
pub const RPC_LAYER: &str = "rpc-layer";
pub const ENVIRONMENT: &str = "environment";

// What init writes.
pub const OUTPUT_DIR: &str = "output-dir";
pub const INSTALL_TO: &str = "install-to";
pub const COORDINATE: &str = "coordinate";
pub const COORDINATE_FROM: &str = "coordinate-from";
pub const FRAMEWORK: &str = "framework";
pub const NPROC_PER_NODE: &str = "nproc-per-node";
pub const SLOTS: &str = "slots";
pub const NNODES: &str = "nnodes";
pub const MASTER_PORT: &str = "master-port";
pub const COORDINATOR_PORT: &str = "coordinator-port";
pub const TIMEOUT: &str = "timeout";
pub const PREFLIGHT: &str = "preflight";

// The reporters (`sidecar`, `exec --report`).
pub const NVML_LIB: &str = "nvml-lib";
pub const EXPECT_GPUS: &str = "expect-gpus";
pub const CONTAINER: &str = "container";
pub const INTERVAL: &str = "interval";
pub const MIN_PATCH_INTERVAL: &str = "min-patch-interval";
pub const METRICS_ADDR: &str = "metrics-addr";
pub const OBSERVATIONS: &str = "observations";
pub const CGROUP_ROOT: &str = "cgroup-root";
pub const CLUSTER_FILE: &str = "cluster-file";
pub const EXIT_WITH_MAIN: &str = "exit-with-main";

// `exec`.
pub const REPORT: &str = "report";
pub const ON_PEER_CHANGE: &str = "on-peer-change";
pub const ON_FAILURE: &str = "on-failure";
pub const MAX_RESTARTS: &str = "max-restarts";
pub const STALL_AFTER: &str = "stall-after";
pub const ON_STALL: &str = "on-stall";
pub const STALL_SCOPE: &str = "stall-scope";
pub const PROGRESS_PATTERN: &str = "progress-pattern";
pub const RESTART_GRACE: &str = "restart-grace";
pub const RESTART_BACKOFF: &str = "restart-backoff";
pub const NO_KUBEFLOW_ENDPOINT: &str = "no-kubeflow-endpoint";

// `inject`.
pub const FILENAME: &str = "filename";
pub const IMAGE: &str = "image";
pub const WRAP: &str = "wrap";
pub const CLASSIC_SIDECAR: &str = "classic-sidecar";
pub const FAILURE_POLICY: &str = "failure-policy";
pub const PERMANENT_EXIT_CODES: &str = "permanent-exit-codes";
pub const SERVICE_ACCOUNT: &str = "service-account";
pub const RESOURCES: &str = "resources";
pub const SHM_SIZE: &str = "shm-size";
pub const ADMISSION_POLICY: &str = "admission-policy";

// Logging.
pub const LOG_FORMAT: &str = "log-format";
pub const LOG_LEVEL: &str = "log-level";
