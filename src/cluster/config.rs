//! The validated definition of what to resolve: built by the CLI from its flags (or by
//! `inject` for the agents it adds), read by `bootstrap`, `peers` and the reporters.

use std::collections::BTreeMap;

use super::{Resolver, Task};

/// Where the peers are looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// The own pod's namespace, known only once the own identity is.
    Own,
    /// One named namespace.
    Named(String),
    /// Every namespace (TensorFlow's behaviour; needs a ClusterRole).
    All,
}

/// Everything needed to resolve a cluster and this pod's place in it.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub resolver: Resolver,
    /// Expected pods per type, where given; the rest come from the owning controllers.
    pub expected: BTreeMap<String, usize>,
    /// An explicit own task (TensorFlow's settable `task_type`/`task_id`).
    pub task_override: Option<Task>,
    /// The scheme of `master` addresses, e.g. `grpc`.
    pub rpc_layer: String,
    /// `environment` in TF_CONFIG, e.g. `cloud`.
    pub environment: Option<String>,
    pub namespaces: Namespaces,
}
