//! The flags of `trainlet inject`: init's, the wrapped exec's and the sidecar's, and
//! inject's own. Apart from args.rs, which holds the groups they share.

use std::path::PathBuf;

use clap::Args;

use super::args::{ClusterArgs, OutputArgs};
use super::defaults;
use super::exec_args::StallArgs;
use super::values::{FailureAction, PeerChange, whole};
use crate::flags;

/// `trainlet inject`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "The init flags (--job, --expect, --port, --address, ...) are those \
of `trainlet init` and are passed to the trainlet-init container; flags left at their \
defaults are not written. Output goes to stdout, one note per document to stderr.\n\n\
Example: trainlet inject -f job.yaml --job worker=app=mnist,role=worker --wrap train | kubectl apply -f -"
)]
pub struct InjectArgs {
    /// Kubernetes YAML to read; `-` or absent reads standard input. Several documents
    /// (`---`) and `List`s are handled.
    #[arg(
        short = 'f',
        long = flags::FILENAME,
        env = "TRAINLET_FILENAME",
        value_name = "FILE"
    )]
    pub filename: Option<PathBuf>,

    /// trainlet's image for the init container and the sidecar. The default is the
    /// release of this binary, so the injected agents match the one that injected them.
    #[arg(long = flags::IMAGE, env = "TRAINLET_IMAGE", value_name = "IMAGE", default_value = defaults::IMAGE)]
    pub image: String,

    /// Run this container's command under `<install-to>/trainlet exec --report --`, so it
    /// gets TF_CONFIG in its environment and its GPUs, ports and OOM kills are reported.
    /// The container must set `command`: inject cannot see an image's ENTRYPOINT.
    #[arg(long = flags::WRAP, env = "TRAINLET_WRAP", value_name = "CONTAINER")]
    pub wrap: Option<String>,

    /// Add the sidecar as a regular container that exits when the main container does
    /// (`--exit-with-main`), for clusters older than Kubernetes 1.29, which lack native
    /// sidecars (init containers with restartPolicy: Always).
    #[arg(long = flags::CLASSIC_SIDECAR, env = "TRAINLET_CLASSIC_SIDECAR")]
    pub classic_sidecar: bool,

    /// Give every Job (and every replicated Job of a JobSet) a podFailurePolicy that
    /// acts on trainlet's exit codes without an operator: fail the Job at once on a
    /// permanent code (a bad trainlet-init configuration, a command not found, a
    /// segfault), ignore pods evicted by a disruption (DisruptionTarget), and count the
    /// rest against backoffLimit. Sets the pod template's restartPolicy to Never, which
    /// podFailurePolicy requires. See docs/failure-handling.md.
    #[arg(long = flags::FAILURE_POLICY, env = "TRAINLET_FAILURE_POLICY")]
    pub failure_policy: bool,

    /// With --failure-policy or --on-failure restart: the training container's exit
    /// codes that are not worth a retry, comma-separated without spaces (e.g.
    /// `2,126,127,42`), instead of trainlet's (1, 2, 126, 127, 128, 139; 2, 126, 127,
    /// 128, 139 for a container that runs a launcher such as torchrun itself, whose
    /// exit 1 may be any worker's transient failure). Each from 1 to 255. They fail the
    /// Job at once (every other code is counted against backoffLimit), and with
    /// --on-failure restart the wrapped `trainlet exec` ends on them instead of
    /// restarting in place (`exec --permanent-exit-codes`, written into its command).
    #[arg(
        long = flags::PERMANENT_EXIT_CODES,
        env = "TRAINLET_PERMANENT_EXIT_CODES",
        value_name = "CODES"
    )]
    pub permanent_exit_codes: Option<String>,

    /// With --wrap: what the wrapped container's `trainlet exec` does when a peer is lost
    /// or replaced after the start (`exec --on-peer-change`, written into its command):
    /// `report` (Events and the annotation; CMD runs on), `restart` (stop CMD, wait for
    /// the cluster, start CMD again with the new addresses: an in-place group restart),
    /// or `exit` (exit 7, so that the Job controller replaces the pod).
    #[arg(long = flags::ON_PEER_CHANGE, env = "TRAINLET_ON_PEER_CHANGE", value_enum, value_name = "WHAT", default_value_t = defaults::ON_PEER_CHANGE)]
    pub on_peer_change: PeerChange,

    /// With --wrap: what the wrapped container's `trainlet exec` does when its command
    /// fails with a code worth a retry (`exec --on-failure`, written into its command):
    /// `exit` (end with the command's code; the pod fails and is replaced) or `restart`
    /// (start the command again in place in every pod of the job, once every rank has
    /// stopped its own). See docs/failure-handling.md.
    #[arg(long = flags::ON_FAILURE, env = "TRAINLET_ON_FAILURE", value_enum, value_name = "WHAT", default_value_t = defaults::ON_FAILURE)]
    pub on_failure: FailureAction,

    /// With --wrap: how many times the wrapped container's `trainlet exec` restarts its
    /// command (`--on-peer-change restart`, `--on-stall restart`) before the next change
    /// exits instead (`exec --max-restarts`, written into its command).
    #[arg(long = flags::MAX_RESTARTS, env = "TRAINLET_MAX_RESTARTS", value_name = "N", default_value_t = defaults::MAX_RESTARTS, allow_negative_numbers = true, value_parser = whole::<u32>)]
    pub max_restarts: u32,

    /// With --wrap: how long the wrapped command has between SIGTERM and SIGKILL when
    /// its `trainlet exec` stops it for a restart or an exit (`exec --restart-grace`,
    /// written into its command).
    #[arg(long = flags::RESTART_GRACE, env = "TRAINLET_RESTART_GRACE", value_name = "DURATION", default_value = defaults::RESTART_GRACE)]
    pub restart_grace: String,

    /// CPU and memory of trainlet's init container and sidecar, as `cpu=Q,memory=Q`
    /// (either may be left out to keep its default). Requests equal limits, so a pod
    /// whose other containers are Guaranteed stays in the Guaranteed QoS class, which
    /// the kubelet's static CPU manager and topology manager need to align CPUs with
    /// GPUs. Memory takes `Mi` or `Gi`: `128m` would be 128 millibytes, and is refused.
    #[arg(long = flags::RESOURCES, env = "TRAINLET_RESOURCES", value_name = "cpu=Q,memory=Q", default_value = defaults::RESOURCES)]
    pub resources: String,

    /// With --wrap: the wrapped container's stall watch, written into its command.
    #[command(flatten)]
    pub stall: StallArgs,

    /// Mount a memory-backed emptyDir of this size (a quantity such as 8Gi) at /dev/shm
    /// in the pod's containers: NCCL and PyTorch's DataLoader workers share memory
    /// there, and a container's own /dev/shm is 64 MiB. It counts against the
    /// container's memory limit. Containers that already mount something at /dev/shm
    /// keep it.
    #[arg(long = flags::SHM_SIZE, env = "TRAINLET_SHM_SIZE", value_name = "SIZE")]
    pub shm_size: Option<String>,

    /// Where the sidecar serves /metrics, /livez and /readyz, as IPV4:PORT or
    /// [::]:PORT (its --metrics-addr): the port is also the sidecar's containerPort,
    /// its startupProbe's and the prometheus.io/port annotation's. Default:
    /// 0.0.0.0:9464, except on hostNetwork pod templates, where every pod of a node
    /// shares the node's ports: there inject keeps the port an earlier inject wrote, or
    /// chooses one per job from its namespace and name (25000-29492; see
    /// docs/hostnetwork.md), and declares no containerPort.
    #[arg(long = flags::METRICS_ADDR, env = "TRAINLET_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<String>,

    /// ServiceAccount for pod templates that set none (or `default`); it must be bound to
    /// trainlet's Role, as manifests/rbac.yaml does for `trainlet`.
    #[arg(
        long = flags::SERVICE_ACCOUNT,
        env = "TRAINLET_SERVICE_ACCOUNT",
        value_name = "NAME",
        default_value = defaults::SERVICE_ACCOUNT
    )]
    pub service_account: String,

    /// Print a MutatingAdmissionPolicy (with its binding and a ValidatingAdmissionPolicy)
    /// that does at each pod's creation what inject does, for pods labelled
    /// `trainlet.io/inject: "true"`, with the settings in their `trainlet.io/<flag>`
    /// annotations; reads no manifests. Takes --image, --resources and
    /// --service-account; the other settings come from each pod. The image and
    /// resources go into the policy's parameter object, the ConfigMap
    /// trainlet-system/trainlet-inject printed with it, where they can be changed later
    /// without printing the policy again. Kubernetes 1.36+ (or 1.34 with the
    /// MutatingAdmissionPolicy gate). See docs/admission.md.
    #[arg(long = flags::ADMISSION_POLICY, env = "TRAINLET_ADMISSION_POLICY")]
    pub admission_policy: bool,

    #[command(flatten)]
    pub cluster: ClusterArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}
