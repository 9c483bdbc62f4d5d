//! The flags of `trainlet exec`: the command's supervision (restarts on a peer's
//! change or a failure) and the stall watch, which inject writes into a wrapped
//! container too.

use clap::Args;

use super::args::{InitArgs, ReportArgs};
use super::defaults;
use super::values::{FailureAction, PeerChange, Stall, StallScope, whole};
use crate::flags;

/// `trainlet exec`.
#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub init: InitArgs,

    /// Stay as CMD's parent and run the reporters (GPUs, ports, OOM kills of CMD and its
    /// children) in-process, forwarding signals to CMD. CMD's root cause, from the
    /// TORCHELASTIC_ERROR_FILE that exec sets for it, goes into the termination message;
    /// a launcher (torchrun, mpirun, deepspeed, accelerate launch) that exits 1 ends
    /// exec with 9 (retryable) unless that root cause is permanent (an ImportError, a
    /// SyntaxError, ...). See docs/failure-handling.md.
    #[arg(long = flags::REPORT, env = "TRAINLET_REPORT")]
    pub report: bool,

    #[command(flatten)]
    pub report_args: ReportArgs,

    /// What to do when a peer of the resolved cluster is lost (its pod deleted or Failed,
    /// and no replacement with an address) or replaced (another pod holds its Job index
    /// or StatefulSet name, whatever its address) after the start; a peer that Succeeded
    /// is neither (exec watches the peers of cluster.json itself with API
    /// credentials; with --observations the trainlet sidecar watches and tells it through
    /// peers.json). `report`: PeerLost/PeerReplaced Events, trainlet.io/cluster
    /// `stale: …`, health degraded; CMD runs on. `restart`: stop CMD (SIGTERM, then
    /// SIGKILL after --restart-grace), wait until the cluster is complete again,
    /// rewrite the files and start CMD again with the new addresses, as every other
    /// pod of the job does: an in-place group restart without an operator. `exit`:
    /// stop CMD and exit 7, so that the Job controller replaces the pod. `restart` and
    /// `exit` imply --report.
    #[arg(long = flags::ON_PEER_CHANGE, env = "TRAINLET_ON_PEER_CHANGE", value_enum, value_name = "WHAT", default_value_t = defaults::ON_PEER_CHANGE)]
    pub on_peer_change: PeerChange,

    /// What to do when CMD fails with a code worth a retry: not one of
    /// --permanent-exit-codes, and for a launcher (torchrun, mpirun, deepspeed,
    /// accelerate launch) not a permanent root cause (an ImportError, a SyntaxError).
    /// `exit`: end with CMD's code (a launcher's retryable exit 1 as 9), so that the
    /// pod fails and the Job controller replaces it. `restart`: an in-place group
    /// restart without a new pod: exec publishes the failure (trainlet.io/progress),
    /// every pod's exec stops its CMD, and once every rank has stopped (the barrier:
    /// --restart-grace plus 15s at most, then CMD starts anyway and exec says which
    /// pods did not stop) each starts its CMD again with the same cluster, after the
    /// backoff. One restart per failure, whichever pods see it first; shares
    /// --max-restarts with peer changes and stalls, past which exec ends with CMD's
    /// code. A failure of the node's (a lost GPU, an XID that needs a reset) is better
    /// replaced: see docs/failure-handling.md. `restart` implies --report.
    #[arg(long = flags::ON_FAILURE, env = "TRAINLET_ON_FAILURE", value_enum, value_name = "WHAT", default_value_t = defaults::ON_FAILURE)]
    pub on_failure: FailureAction,

    /// With --on-failure restart: CMD's exit codes that no restart retries,
    /// comma-separated without spaces, each from 1 to 255 in digits (default 1, 2,
    /// 126, 127, 128, 139, the codes inject --failure-policy fails the Job on). A
    /// launcher's exit 1 is judged by its root cause instead.
    #[arg(long = flags::PERMANENT_EXIT_CODES, env = "TRAINLET_PERMANENT_EXIT_CODES", value_name = "CODES")]
    pub permanent_exit_codes: Option<String>,

    /// `--on-peer-change restart`: how many restarts; the next change exits 7.
    #[arg(long = flags::MAX_RESTARTS, env = "TRAINLET_MAX_RESTARTS", value_name = "N", default_value_t = defaults::MAX_RESTARTS, allow_negative_numbers = true, value_parser = whole::<u32>)]
    pub max_restarts: u32,

    /// How long CMD has between SIGTERM and SIGKILL when it is stopped for a restart
    /// or an exit on a peer change.
    #[arg(long = flags::RESTART_GRACE, env = "TRAINLET_RESTART_GRACE", value_name = "DURATION", default_value = defaults::RESTART_GRACE)]
    pub restart_grace: String,

    /// The delay before the first restart; it doubles for each later one, up to 360s
    /// (the operators' restart backoff).
    #[arg(long = flags::RESTART_BACKOFF, env = "TRAINLET_RESTART_BACKOFF", value_name = "DURATION", default_value = defaults::RESTART_BACKOFF)]
    pub restart_backoff: String,

    #[command(flatten)]
    pub stall: StallArgs,

    /// Do not serve Kubeflow Trainer's progress endpoint. While exec watches CMD's
    /// progress (--stall-after, --progress-pattern) it serves it on 127.0.0.1 over TLS
    /// and gives CMD KUBEFLOW_TRAINER_SERVER_URL, _CA_CERT and _TOKEN, unless CMD's
    /// environment has them (Kubeflow Trainer's own): the Kubeflow SDK's
    /// update_trainjob_status() and Transformers' KubeflowCallback then report
    /// percentage, time remaining and metrics to exec. A report is progress, its
    /// current_step the step; trainlet.io/progress and the metrics publish the rest.
    /// See docs/stall-watch.md.
    #[arg(long = flags::NO_KUBEFLOW_ENDPOINT, env = "TRAINLET_NO_KUBEFLOW_ENDPOINT")]
    pub no_kubeflow_endpoint: bool,

    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The stall watch of `exec` (and `inject`, which writes them into exec's command).
#[derive(Debug, Clone, Args)]
pub struct StallArgs {
    /// Call CMD stalled after this long without progress (e.g. 10m; at least 1s): without
    /// a new line of output (or a line --progress-pattern matches), and without a touch of
    /// the file $TRAINLET_HEARTBEAT names. Off unless given. By default the job is stalled
    /// when no pod of it made progress for this long, and rank 0's pod says so: a pod
    /// that is quiet while another prints (the ranks of DDP, torchrun or DeepSpeed that
    /// print a start-up warning and then nothing, MPI's sshd) is only silent; see
    /// --stall-scope. CMD's output then passes through exec (unchanged,
    /// unbuffered) to be watched, and CMD gets PYTHONUNBUFFERED=1 unless the container
    /// sets it (a Python trainer writing to a pipe otherwise holds its lines back).
    /// Choose it longer than CMD's longest silent phase (compilation, loading a
    /// checkpoint, an evaluation that prints nothing): a busy CMD that prints nothing is
    /// stalled too. Implies --report.
    #[arg(long = flags::STALL_AFTER, env = "TRAINLET_STALL_AFTER", value_name = "DURATION")]
    pub stall_after: Option<String>,

    /// What a stall does: `report` (the Stalled Event, trainlet.io/progress, the
    /// metrics; CMD runs on), `restart` (stop CMD and start it again, in every pod of the
    /// job: a hung collective holds every rank; shares --max-restarts and the backoff
    /// with peer changes), or `exit` (stop CMD and exit 8, so the Job controller
    /// replaces the pod).
    #[arg(long = flags::ON_STALL, env = "TRAINLET_ON_STALL", value_enum, value_name = "WHAT", default_value_t = defaults::ON_STALL)]
    pub on_stall: Stall,

    /// Whose silence is a stall. `job`: the job is stalled when no pod of it made
    /// progress for --stall-after, and rank 0's pod says so; a pod quiet while another
    /// makes progress is only silent. That is synchronous training (DDP, FSDP,
    /// DeepSpeed, Horovod, MultiWorkerMirroredStrategy, JAX, MPI), where a rank that
    /// hangs stops every other in the next collective. `pod`: each pod is stalled when
    /// its CMD made progress and then none for --stall-after, whatever the others do:
    /// pods that each print on their own. `auto`: `job`, and, when the cluster has a
    /// `ps` type (TensorFlow's ParameterServerStrategy, whose workers can hang alone),
    /// each pod whose CMD signalled progress (the heartbeat file, a --progress-pattern
    /// match, a Kubeflow report) and then made none; parameter servers print start-up
    /// lines and then serve in silence, which no stall is.
    #[arg(long = flags::STALL_SCOPE, env = "TRAINLET_STALL_SCOPE", value_enum, value_name = "SCOPE", default_value_t = defaults::STALL_SCOPE)]
    pub stall_scope: StallScope,

    /// Only output lines this regular expression matches are progress (Rust regex
    /// syntax, e.g. `step (\d+)`); its first capture group, when a number, is the step
    /// (the metric trainlet_progress_step). Default: every new line, on stdout or
    /// stderr, ended by a newline or a carriage return.
    #[arg(long = flags::PROGRESS_PATTERN, env = "TRAINLET_PROGRESS_PATTERN", value_name = "REGEX")]
    pub progress_pattern: Option<String>,
}
