//! `trainlet sidecar`: the reporters in their own container.
//!
//! It shares the pod's network namespace, so it sees the pod's sockets; it sees the
//! pod through the API; it sees the training container's cgroups only through a
//! read-only mount of the node's cgroup filesystem (`--cgroup-root`). Run it as a
//! native sidecar (an init container with `restartPolicy: Always`, Kubernetes 1.29+):
//! it starts before the training container, so it also catches ports that were taken
//! before, and it never keeps a Job from completing. As a classic sidecar, pass
//! `--exit-with-main`.

use std::path::PathBuf;

use clap::Args;

use crate::cli::{KubeArgs, ReportArgs};
use crate::report::engine::{self, Config, Mode};
use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct SidecarArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub report: ReportArgs,

    /// A port to watch for conflicts. Repeatable, or comma-separated. Default: the
    /// training container's containerPorts.
    #[arg(
        long = "port",
        env = "TRAINLET_PORT",
        value_name = "N",
        value_delimiter = ','
    )]
    pub ports: Vec<u16>,

    /// The node's cgroup filesystem, mounted read-only into the sidecar (e.g. a
    /// hostPath of /sys/fs/cgroup at /host/sys/fs/cgroup). With it, OOM kills of
    /// processes inside the training container are counted, not only the kills of
    /// the container itself that pod status shows. The pod is found by its UID.
    #[arg(long, env = "TRAINLET_CGROUP_ROOT", value_name = "DIR")]
    pub cgroup_root: Option<PathBuf>,

    /// Exit 0 once the training container has terminated for good, so that a Job
    /// with a classic sidecar can complete. Native sidecars do not need it.
    #[arg(long, env = "TRAINLET_EXIT_WITH_MAIN")]
    pub exit_with_main: bool,
}

pub fn run(args: SidecarArgs) -> Result<Code, Failure> {
    let mut cfg = Config::from_args(Mode::Sidecar, &args.report)?;
    if let Some(p) = args.ports.iter().find(|p| **p == 0) {
        return Err(Failure::usage(format!(
            "invalid --port {p}: give the container port to watch, e.g. 8470"
        )));
    }
    cfg.ports = args.ports.clone();
    if let Some(root) = &args.cgroup_root
        && !root.is_dir()
    {
        return Err(Failure::usage(format!(
            "invalid --cgroup-root {}: not a directory (mount the node's /sys/fs/cgroup there read-only)",
            root.display()
        )));
    }
    cfg.cgroup_root = args.cgroup_root.clone();
    cfg.exit_with_main = args.exit_with_main;
    super::runtime()?.block_on(engine::sidecar(cfg, &args.kube))
}
