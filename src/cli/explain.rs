//! The domain's errors as the one line the user reads, with the flag that fixes them.
//!
//! Domain modules say what went wrong in their own terms ("this pod matches none of
//! the job selectors") and choose the exit code; only the CLI knows that `--task-type`
//! is how a user overrides the own task. So the conversions into [`Failure`] live here,
//! and add that last clause where a flag is the fix. The exit code is always the
//! domain's.

use crate::Failure;
use crate::agent::ReportError;
use crate::bootstrap::InitError;
use crate::cluster::{ClusterError, DNS_ADVICE};
use crate::flags;
use crate::inject::{InjectError, TransformError};
use crate::kube::KubeError;
use crate::metrics::MetricsError;
use crate::peers::WaitError;
use crate::peers::follow::FollowError;
use crate::peers::list::ListError;
use crate::render::OutputError;
use crate::render::frameworks::{FrameworkError, PerGpu};
use crate::supervise::child::SpawnError;

/// The message of a cluster error.
pub fn cluster(e: &ClusterError) -> String {
    match e {
        ClusterError::OwnPodUnmatched { .. } => {
            format!("{e}, or pass --task-type and --task-index")
        }
        ClusterError::OwnPodAmbiguous { .. } => {
            format!("{e} or pass --task-type and --task-index")
        }
        ClusterError::TaskTypeNotInCluster { task_type, summary } => {
            format!("--task-type {task_type:?} is not a job type of the cluster ({summary})")
        }
        ClusterError::TaskIndexOutOfRange {
            index,
            task_type,
            tasks,
        } => format!("--task-index {index} is out of range: {task_type} has {tasks} tasks"),
        ClusterError::NoDnsName { pod } => format!(
            "pod {pod:?} has no spec.hostname and spec.subdomain, which --address dns needs ({DNS_ADVICE})"
        ),
        ClusterError::Inconsistent(_) => e.to_string(),
    }
}

/// The message of a Kubernetes client error.
pub fn kube(e: &KubeError) -> String {
    match e {
        KubeError::NoPodName => {
            format!("{e}: pass --pod-name or set POD_NAME from the downward API (metadata.name)")
        }
        KubeError::NoConfig { .. } => format!("{e}; pass --kubeconfig"),
        _ => e.to_string(),
    }
}

/// The message of a Kubernetes client error in `status`, which needs only the
/// read-only Role of manifests/status/role.yaml, not trainlet's own.
pub fn status(e: &KubeError) -> Failure {
    let message = match e {
        KubeError::Forbidden {
            verb,
            resource,
            namespace,
            user,
            message,
        } => format!(
            "forbidden: cannot {verb} {resource} in namespace {namespace:?}: bind {user} to the Role of manifests/status/role.yaml, which grants get and list on pods and events and get on jobs and jobsets ({message})"
        ),
        _ => kube(e),
    };
    Failure::new(e.code(), message)
}

/// The message of an error while waiting for the peers.
pub fn wait(e: &WaitError) -> String {
    match e {
        WaitError::Kube(k) => kube(k),
        WaitError::Cluster(c) => cluster(c),
        WaitError::UnknownCount { task_type, .. } => format!("{e}; pass --expect {task_type}=N"),
        WaitError::Timeout { .. } | WaitError::StreamingUnsupported(_) => e.to_string(),
    }
}

/// The message of an output file error.
pub fn output(e: &OutputError) -> String {
    match e {
        OutputError::Write { .. } => format!("{e} (is --output-dir a writable volume?)"),
        _ => e.to_string(),
    }
}

/// The message of an `init` error; also the note of the Events `init` emits.
pub fn init(e: &InitError) -> String {
    match e {
        InitError::Kube(k) => kube(k),
        InitError::Cluster(c) => cluster(c),
        InitError::Wait(w) => wait(w),
        InitError::Follow(f) => match f {
            FollowError::Kube(k) => kube(k),
            FollowError::Timeout { .. } | FollowError::Behind { .. } => f.to_string(),
        },
        InitError::TooLarge(_) => format!(
            "{e}; use --coordinate never (every agent then watches every peer), or keep fewer annotations of your own on this pod"
        ),
        InitError::Publish(_) => e.to_string(),
        InitError::Output(o) => output(o),
        InitError::InstallDir { dir, why } => {
            format!("cannot create --install-to {}: {why}", dir.display())
        }
        InitError::Framework(f) => match f {
            FrameworkError::NoRankZero { .. } => format!("{e} in --job"),
            FrameworkError::NoGpus { per_gpu } => {
                let flag = match per_gpu {
                    PerGpu::Slots => flags::SLOTS,
                    PerGpu::Processes => flags::NPROC_PER_NODE,
                };
                format!(
                    "--{flag} gpu needs a GPU limit, but the training container has no nvidia.com/gpu limit"
                )
            }
        },
        InitError::PortConflict(_) | InitError::Install(_) | InitError::Dns(_) => e.to_string(),
        InitError::Preflight(crate::preflight::PreflightError::Unreachable(_)) => format!(
            "{e} (check the NetworkPolicies of the namespace and the routes and firewalls between the nodes, or run without --{})",
            flags::PREFLIGHT
        ),
        InitError::Preflight(_) => e.to_string(),
    }
}

/// The message of an inject error.
pub fn inject(e: &InjectError) -> String {
    match e {
        InjectError::Transform { input, error } => format!("{input}: {}", transform(error)),
        _ => e.to_string(),
    }
}

/// The message of a transformation error.
pub fn transform(e: &TransformError) -> String {
    match e {
        TransformError::ImplicitEntrypoint {
            doc,
            what,
            container,
        } => format!(
            "cannot --wrap container {container:?} of {what} (document {doc}): {}",
            TransformError::IMPLICIT_ENTRYPOINT
        ),
        TransformError::WrapNotFound { container, found } => format!(
            "--wrap {container:?}: no pod template has a container of that name (found: {found})"
        ),
        TransformError::Syntax { .. } | TransformError::Shape { .. } => e.to_string(),
    }
}

/// The message of a `resolve` error.
pub fn list(e: &ListError) -> String {
    match e {
        ListError::Kube(k) => kube(k),
        ListError::Cluster(c) => cluster(c),
        ListError::NotReady(_) => e.to_string(),
    }
}

/// The message of a metrics server error.
pub fn metrics(e: &MetricsError) -> String {
    match e {
        MetricsError::Bind { .. } => format!("{e} (pass another --metrics-addr, or `off`)"),
    }
}

/// The message of a reporter error.
pub fn report(e: &ReportError) -> String {
    match e {
        ReportError::Kube(k) => kube(k),
        ReportError::Metrics(m) => metrics(m),
        _ => e.to_string(),
    }
}

macro_rules! failure_from {
    ($($ty:ty => $explain:path),* $(,)?) => {
        $(impl From<$ty> for Failure {
            fn from(e: $ty) -> Self {
                Failure::new(e.code(), $explain(&e))
            }
        })*
    };
}

failure_from! {
    ClusterError => cluster,
    KubeError => kube,
    WaitError => wait,
    OutputError => output,
    InitError => init,
    ListError => list,
    InjectError => inject,
    MetricsError => metrics,
    ReportError => report,
    SpawnError => spawn,
}

fn spawn(e: &SpawnError) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages the cluster's own tests assert as variants, as the user reads them.
    #[test]
    fn cluster_errors_name_the_flags_that_fix_them() {
        let f = Failure::from(ClusterError::OwnPodAmbiguous {
            pod: "w".into(),
            types: "ps, worker".into(),
        });
        assert_eq!(
            f.message,
            "this pod \"w\" matches the selectors of several job types (ps, worker); make the selectors disjoint or pass --task-type and --task-index"
        );
        assert_eq!(f.code, crate::Code::Inconsistent);
        assert_eq!(
            Failure::from(ClusterError::OwnPodUnmatched {
                pod: "n".into(),
                jobs: "ps: role=ps; worker: app=x".into()
            })
            .message,
            "this pod \"n\" matches none of the job selectors (ps: role=ps; worker: app=x); fix its labels or the selectors, or pass --task-type and --task-index"
        );
        let dns = Failure::from(ClusterError::NoDnsName { pod: "w-9".into() });
        assert!(
            dns.message.starts_with(
                "pod \"w-9\" has no spec.hostname and spec.subdomain, which --address dns needs"
            ),
            "{}",
            dns.message
        );
        assert_eq!(dns.code, crate::Code::Usage);
    }

    #[test]
    fn one_per_gpu_without_gpus_names_its_flag() {
        let no_gpus = |per_gpu| init(&InitError::Framework(FrameworkError::NoGpus { per_gpu }));
        assert_eq!(
            no_gpus(PerGpu::Processes),
            "--nproc-per-node gpu needs a GPU limit, but the training container has no nvidia.com/gpu limit"
        );
        assert_eq!(
            no_gpus(PerGpu::Slots),
            "--slots gpu needs a GPU limit, but the training container has no nvidia.com/gpu limit"
        );
    }
}
