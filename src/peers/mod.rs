//! The peer pods on the API server: where they are looked for ([`Scope`]), the distinct
//! selectors that find them, one list for `resolve` ([`list`]), the wait until the
//! cluster is complete for `init` ([`wait`]), a follower's wait for the resolver pod's
//! published cluster ([`follow`]), the reporters' watch of where each task stands
//! after the start ([`drift`]), one store that every watch keeps its pods in
//! ([`store`]), and the expected counts read from the controllers that own them
//! ([`owners`]).
//!
//! The pure decisions (which pods are peers, their order and addresses, what is still
//! missing) are `cluster`'s; this module only brings the pods.

pub mod drift;
pub mod follow;
pub mod list;
mod owners;
pub mod store;
pub mod wait;

use futures::{Stream, StreamExt};
use kube::{Api, Client};

use crate::cluster::PeerPod;
use crate::cluster::{Namespaces, Resolver};
use crate::kube::KubeError;

pub use list::resolve_now;
pub use wait::{Resolved, WaitError, wait_for_peers};

/// Where peers are looked for, once the own namespace is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Namespace(String),
    All,
}

impl Scope {
    /// The scope the configuration asks for: a named namespace, every namespace, or
    /// the pod's own.
    pub fn of(namespaces: &Namespaces, own_namespace: &str) -> Scope {
        match namespaces {
            Namespaces::Own => Scope::Namespace(own_namespace.to_string()),
            Namespaces::Named(ns) => Scope::Namespace(ns.clone()),
            Namespaces::All => Scope::All,
        }
    }

    pub(crate) fn api(&self, client: &Client) -> Api<PeerPod> {
        match self {
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
            Scope::All => Api::all(client.clone()),
        }
    }

    /// For messages: the namespace, or `(all namespaces)`.
    pub fn label(&self) -> &str {
        match self {
            Scope::Namespace(ns) => ns,
            Scope::All => "(all namespaces)",
        }
    }
}

/// The distinct selectors of every job type, in the order first given: each is listed
/// or watched once, however many types share it.
pub fn selectors(resolver: &Resolver) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for job in &resolver.jobs {
        for s in &job.selectors {
            let s = s.to_string();
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// The next batch of a watch, or `None` once `deadline` has passed. The watchers never
/// end on their own, so a stream that does is treated as a broken connection.
async fn next_batch<S: Stream + Unpin>(
    events: &mut S,
    deadline: Option<tokio::time::Instant>,
) -> Result<Option<S::Item>, KubeError> {
    let next = match deadline {
        Some(d) => tokio::select! {
            b = events.next() => b,
            _ = tokio::time::sleep_until(d) => return Ok(None),
        },
        None => events.next().await,
    };
    next.map(Some).ok_or_else(|| KubeError::Unreachable {
        verb: "watch".into(),
        resource: "pods".into(),
        message: "watch stream ended".into(),
    })
}
