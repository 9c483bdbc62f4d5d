//! `torch.env`: PyTorch's variables, named as Kubeflow's PyTorchJob names them
//! (kubeflow/training-operator, `pkg/controller.v1/pytorch/envvar.go` `setPodEnv`,
//! `master.go` and `elastic.go`), so that both a plain `python train.py` with
//! `init_method="env://"` and a bare `torchrun train.py` need no flags:
//! - `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK` for `env://`. As in Kubeflow,
//!   `WORLD_SIZE` is pods × processes per pod when that is a number, else pods
//!   ([`super::Nproc`]), and `RANK` is the pod's rank: torchrun overwrites both for the
//!   processes it starts.
//! - `PET_*`, which torchrun reads as the defaults of its flags
//!   (`torch/distributed/argparse_util.py`, `env` action: `PET_<FLAG>`); with the
//!   c10d rendezvous, `PET_LOCAL_ADDR` too: this pod's address, as `--local-addr`.
//!
//! Unlike Kubeflow, `MASTER_ADDR` is rank 0's address (its pod IP by default) rather
//! than a Service name, and the default port is torchrun's own, 29500.

use super::ranks::Ranks;
use super::{Elastic, RendezvousPort};
use crate::cluster::address;

/// torchrun's default `--master-port`.
pub const DEFAULT_PORT: u16 = 29500;

/// The variables of `torch.env`. `nproc` is the count for `WORLD_SIZE` and the value
/// for torchrun. Requires a rank 0 (checked by the caller).
pub fn vars(
    ranks: &Ranks,
    nproc: (u32, String),
    elastic: Option<Elastic>,
    port: RendezvousPort,
    run_id: &str,
) -> Vec<(String, String)> {
    let (addr, port) = ranks
        .rendezvous(port, DEFAULT_PORT)
        .expect("the caller checked for a rank 0");
    let addr = addr.to_string();
    let nodes = ranks.tasks.len();
    let (count, nproc) = nproc;
    let mut v: Vec<(&str, String)> = vec![
        ("MASTER_ADDR", addr.clone()),
        ("MASTER_PORT", port.to_string()),
    ];
    match elastic {
        // The c10d rendezvous assigns node ranks and the world size as pods join.
        Some(e) => {
            v.extend([
                ("PET_NNODES", format!("{}:{}", e.min, e.max)),
                ("PET_NPROC_PER_NODE", nproc),
                ("PET_RDZV_BACKEND", "c10d".into()),
                ("PET_RDZV_ENDPOINT", address::join(&addr, port)),
                ("PET_RDZV_ID", run_id.to_string()),
            ]);
            // What each agent publishes in the rendezvous as its node's address, where
            // the node that gets group rank 0 serves its workers' store: without it,
            // torchrun publishes the pod's hostname (`<job>-0` for an Indexed Job),
            // which no DNS resolves without a headless Service, and every worker of
            // the other pods waits for the store until the rendezvous times out.
            if let Some(own) = ranks.own.map(|r| ranks.tasks[r]) {
                v.push(("PET_LOCAL_ADDR", address::host(&own.address).to_string()));
            }
        }
        None => {
            let rank = ranks.own.map(|r| r.to_string()).unwrap_or_default();
            v.extend([
                ("WORLD_SIZE", (nodes as u64 * u64::from(count)).to_string()),
                ("RANK", rank.clone()),
                ("PET_NNODES", nodes.to_string()),
                ("PET_NODE_RANK", rank),
                ("PET_NPROC_PER_NODE", nproc),
                ("PET_MASTER_ADDR", addr),
                ("PET_MASTER_PORT", port.to_string()),
            ]);
        }
    }
    v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
