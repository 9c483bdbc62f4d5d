//! `jax.env`: what `jax.distributed.initialize()` needs.
//!
//! JAX reads one of them by itself: `JAX_COORDINATOR_ADDRESS` (`jax/_src/distributed.py`,
//! `State.initialize`). The process count and id it does not read from the
//! environment, so a script passes them:
//!
//! ```python
//! jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
//!                            process_id=int(os.environ["JAX_PROCESS_ID"]))
//! ```
//!
//! Kubeflow's JAXJob names the same facts `COORDINATOR_ADDRESS` (host only),
//! `COORDINATOR_PORT`, `NUM_PROCESSES` and `PROCESS_ID`
//! (`pkg/controller.v1/jax/envvar.go`); both sets are written, so scripts written for
//! either run unchanged.

use super::RendezvousPort;
use super::ranks::Ranks;
use crate::cluster::address;

/// The coordinator port of JAX's own Kubernetes cluster detection
/// (`jax/_src/clusters/k8s_cluster.py`).
pub const DEFAULT_PORT: u16 = 55527;

/// The variables of `jax.env`. Requires a rank 0 (checked by the caller).
pub fn vars(ranks: &Ranks, port: RendezvousPort) -> Vec<(String, String)> {
    let (host, port) = ranks
        .rendezvous(port, DEFAULT_PORT)
        .expect("the caller checked for a rank 0");
    let n = ranks.tasks.len().to_string();
    let id = ranks.own.map(|r| r.to_string()).unwrap_or_default();
    [
        ("JAX_COORDINATOR_ADDRESS", address::join(host, port)),
        ("JAX_NUM_PROCESSES", n.clone()),
        ("JAX_PROCESS_ID", id.clone()),
        ("COORDINATOR_ADDRESS", host.to_string()),
        ("COORDINATOR_PORT", port.to_string()),
        ("NUM_PROCESSES", n),
        ("PROCESS_ID", id),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
