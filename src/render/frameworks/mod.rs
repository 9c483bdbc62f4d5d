//! Every framework's view of one resolved cluster. The cluster (ordered tasks with
//! addresses, and the own task) already holds everything each framework needs; each
//! format here is a pure renderer of it, in the variable names and file formats of the
//! system a user would otherwise install (Kubeflow's PyTorchJob and JAXJob,
//! mpi-operator, Volcano), so that moving to or from trainlet changes no training code.
//!
//! All formats share one flat rank order ([`ranks`]): the job types in the order they
//! were defined, and within a type by task index.

pub mod envfile;
pub mod jax;
pub mod mpi;
pub mod ranks;
pub mod torch;
pub mod volcano;

use thiserror::Error;

use crate::Code;
use crate::cluster::{Cluster, Task};
pub use ranks::Ranks;

/// A framework whose variables `trainlet.env` and `trainlet exec` carry. Every
/// framework's file is written either way; this selects what lands in the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Framework {
    /// TF_CONFIG, TRAINLET_TASK_TYPE and TRAINLET_TASK_INDEX, which `trainlet.env`
    /// always holds: choosing it alone (the default) adds nothing else.
    Tensorflow,
    /// torch.env: MASTER_ADDR, WORLD_SIZE, RANK and torchrun's PET_* variables.
    Pytorch,
    /// jax.env: JAX_COORDINATOR_ADDRESS and the process count and id.
    Jax,
    /// mpi.env: TRAINLET_HOSTS for `horovodrun -H` (the hostfile is always written).
    Mpi,
}

impl Framework {
    /// Its name, as `--framework` takes it and as messages say it.
    pub fn name(self) -> String {
        match self {
            Framework::Tensorflow => "tensorflow",
            Framework::Pytorch => "pytorch",
            Framework::Jax => "jax",
            Framework::Mpi => "mpi",
        }
        .to_string()
    }
}

/// How many processes each pod runs (torchrun's `--nproc-per-node`).
///
/// Only a number counts in `WORLD_SIZE`: the others count 1, as Kubeflow counts a
/// non-numeric `nprocPerNode` (kubeflow/training-operator,
/// `pkg/controller.v1/pytorch/envvar.go`, `getNprocPerNodeInt`). A plain
/// `python train.py` is one process per pod, and `init_process_group` waits for
/// exactly `WORLD_SIZE` ranks; torchrun sets `WORLD_SIZE` itself for the processes it
/// starts, from `PET_NNODES` and `PET_NPROC_PER_NODE`. So both work without flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nproc {
    /// For torchrun, the training container's GPU limit when it is above 0, else 1 —
    /// resolved here, since torchrun's own `auto` starts one process per CPU on a pod
    /// without GPUs.
    Auto,
    /// For torchrun, the training container's GPU limit, which must be above 0.
    Gpu,
    /// For torchrun, `cpu`: one process per CPU it sees.
    Cpu,
    /// N processes per pod, started by torchrun or by the user's own launcher: counts N.
    Count(u32),
}

/// How many slots each host gets in the hostfile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// The training container's GPU limit when it is above 0, else 1.
    Auto,
    /// The GPU limit, which must be above 0.
    Gpu,
    Count(u32),
}

/// Elastic training (`--nnodes MIN:MAX`): torchrun's c10d rendezvous forms with MIN to
/// MAX pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elastic {
    pub min: usize,
    pub max: usize,
}

/// What the frameworks are configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameworkConfig {
    /// Selected for `trainlet.env` and exec, deduplicated, TensorFlow by default.
    pub frameworks: Vec<Framework>,
    pub nproc: Nproc,
    pub slots: Slots,
    pub elastic: Option<Elastic>,
    /// Where PyTorch's rank 0 listens (MASTER_PORT).
    pub torch_port: RendezvousPort,
    /// Where JAX's process 0 listens (the coordinator).
    pub jax_port: RendezvousPort,
}

/// Where a launcher's rank 0 listens for the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RendezvousPort {
    /// The launcher's own default (torchrun's 29500, JAX's 55527).
    Default,
    /// Rank 0's task port from the cluster (`--port` or `--port-name` named it for
    /// this framework).
    Task,
    /// A port of its own (`--master-port`, `--coordinator-port`).
    Fixed(u16),
}

impl Default for FrameworkConfig {
    fn default() -> Self {
        FrameworkConfig {
            frameworks: vec![Framework::Tensorflow],
            nproc: Nproc::Auto,
            slots: Slots::Auto,
            elastic: None,
            torch_port: RendezvousPort::Default,
            jax_port: RendezvousPort::Default,
        }
    }
}

/// What the own pod adds: facts only the running pod knows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodFacts {
    /// The training container's `nvidia.com/gpu` limit (0 without one).
    pub gpus: u32,
    /// Names one run of the job for torchrun's rendezvous: the owner's uid, else the
    /// job's name.
    pub run_id: String,
}

#[derive(Debug, Error, PartialEq)]
pub enum FrameworkError {
    /// The first job type has no task, so there is no rank 0 to rendezvous at.
    #[error(
        "{framework} needs a rank 0, but the first job type {task_type:?} has no task; list the type of rank 0 first"
    )]
    NoRankZero {
        framework: String,
        task_type: String,
    },
    /// One per GPU was asked for, but the training container has no GPU limit.
    #[error(
        "{per_gpu} per GPU needs a GPU limit, but the training container has no nvidia.com/gpu limit"
    )]
    NoGpus { per_gpu: PerGpu },
}

/// What was asked for one per GPU (`cli::explain` names the flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerGpu {
    /// MPI slots per host.
    Slots,
    /// Processes per node (torchrun, `WORLD_SIZE`).
    Processes,
}

impl std::fmt::Display for PerGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PerGpu::Slots => "one MPI slot",
            PerGpu::Processes => "one process",
        })
    }
}

impl FrameworkError {
    pub fn code(&self) -> Code {
        match self {
            FrameworkError::NoRankZero { .. } => Code::Inconsistent,
            FrameworkError::NoGpus { .. } => Code::Usage,
        }
    }
}

/// One file to write next to `tf_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    pub name: String,
    pub contents: String,
}

/// Everything the frameworks add: files, and the variables of the selected
/// frameworks, in order, for `trainlet.env` and CMD's environment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rendered {
    pub files: Vec<File>,
    pub env: Vec<(String, String)>,
}

pub const TORCH_FILE: &str = "torch.env";
pub const JAX_FILE: &str = "jax.env";
pub const MPI_FILE: &str = "mpi.env";
pub const HOSTFILE: &str = "hostfile";

/// Renders every framework's files for this pod, and the variables of the selected
/// ones. `ranks` is [`Ranks::new`] of the same cluster, order and own task; `order` is
/// the job types in their defined order. `tf_env` is TensorFlow's own variables, which
/// always lead the environment.
pub fn render(
    ranks: &Ranks,
    cluster: &Cluster,
    order: &[&str],
    own: &Task,
    cfg: &FrameworkConfig,
    pod: &PodFacts,
    tf_env: Vec<(String, String)>,
) -> Result<Rendered, FrameworkError> {
    let nproc = resolve_nproc(cfg.nproc, pod.gpus)?;
    let slots = match cfg.slots {
        Slots::Auto => pod.gpus.max(1),
        Slots::Gpu if pod.gpus == 0 => {
            return Err(FrameworkError::NoGpus {
                per_gpu: PerGpu::Slots,
            });
        }
        Slots::Gpu => pod.gpus,
        Slots::Count(n) => n,
    };
    let selected = |f| cfg.frameworks.contains(&f);
    let mut out = Rendered::default();
    let add = |out: &mut Rendered, f: Framework, file: &str, vars: Vec<(String, String)>| {
        out.files.push(File {
            name: file.into(),
            contents: envfile::render(file, &vars),
        });
        if selected(f) {
            out.env.extend(vars);
        }
    };
    // TF_CONFIG is always kept, as before other frameworks were written.
    out.env.extend(tf_env);
    // A rank 0 exists only when the first type has a task; without one the
    // rendezvous-based formats are errors when selected and skipped when not.
    match ranks.zero() {
        Some(_) => {
            let torch = torch::vars(ranks, nproc, cfg.elastic, cfg.torch_port, &pod.run_id);
            add(&mut out, Framework::Pytorch, TORCH_FILE, torch);
            add(
                &mut out,
                Framework::Jax,
                JAX_FILE,
                jax::vars(ranks, cfg.jax_port),
            );
        }
        None => {
            if let Some(f) = [Framework::Pytorch, Framework::Jax]
                .into_iter()
                .find(|f| selected(*f))
            {
                return Err(FrameworkError::NoRankZero {
                    framework: f.name(),
                    task_type: order.first().copied().unwrap_or_default().into(),
                });
            }
        }
    }
    add(&mut out, Framework::Mpi, MPI_FILE, mpi::vars(ranks, slots));
    out.files.push(File {
        name: HOSTFILE.into(),
        contents: mpi::hostfile(ranks, slots),
    });
    // Volcano's host lists are framework-neutral and always in the environment, as
    // Volcano's svc and env plugins put them into every container.
    out.env.extend(volcano::vars(cluster, order, own));
    out.files.extend(volcano::host_files(cluster, order));
    Ok(out)
}

/// The processes per pod: a count for WORLD_SIZE ([`Nproc`]), and the value for
/// torchrun.
fn resolve_nproc(n: Nproc, gpus: u32) -> Result<(u32, String), FrameworkError> {
    Ok(match n {
        Nproc::Auto => (1, gpus.max(1).to_string()),
        Nproc::Gpu if gpus == 0 => {
            return Err(FrameworkError::NoGpus {
                per_gpu: PerGpu::Processes,
            });
        }
        Nproc::Gpu => (1, gpus.to_string()),
        Nproc::Cpu => (1, "cpu".into()),
        Nproc::Count(n) => (n, n.to_string()),
    })
}

/// The ports this task's process is about to listen on, as the environment trainlet
/// gives it says: rank 0's `MASTER_PORT` (PyTorch's store, torchrun's rendezvous),
/// process 0's `COORDINATOR_PORT` (JAX's coordinator), and where neither framework was
/// chosen, its own TF_CONFIG server port (`tf_port`). `trainlet exec --report` watches
/// them for a conflict; a PyTorch job's TF_CONFIG port is no port of its.
pub fn listen_ports(env: &[(String, String)], tf_port: Option<u16>) -> Vec<u16> {
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let port = |k: &str| get(k).and_then(|v| v.parse::<u16>().ok());
    let mut ports = Vec::new();
    let torch = get("MASTER_PORT").is_some();
    let jax = get("COORDINATOR_PORT").is_some();
    if torch && (get("RANK") == Some("0") || get("PET_NODE_RANK") == Some("0")) {
        ports.extend(port("MASTER_PORT"));
    }
    if jax && get("PROCESS_ID") == Some("0") {
        ports.extend(port("COORDINATOR_PORT"));
    }
    if !torch && !jax {
        ports.extend(tf_port);
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

#[cfg(test)]
mod tests;
