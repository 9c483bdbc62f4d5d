//! `trainlet sidecar`: the reporters in their own container.
//!
//! It shares the pod's network namespace, so it sees the pod's sockets; it sees the
//! pod through the API; it sees the training container's cgroups only through a
//! read-only mount of the node's cgroup filesystem (`--cgroup-root`). Run it as a
//! native sidecar (an init container with `restartPolicy: Always`, Kubernetes 1.29+):
//! it starts before the training container, so it also catches ports that were taken
//! before, and it never keeps a Job from completing. As a classic sidecar, pass
//! `--exit-with-main`.

use crate::agent;
use crate::cli::args::SidecarArgs;
use crate::cli::lower;
use crate::{Exit, Failure};

pub fn run(args: SidecarArgs) -> Result<Exit, Failure> {
    let (cfg, own) = lower::sidecar_config(&args)?;
    super::runtime()?.block_on(agent::sidecar(cfg, own))?;
    Ok(Exit::OK)
}
