//! Test support shared by every integration test: a real kube-apiserver, etcd and
//! kube-controller-manager on 127.0.0.1 (started by `tests/control-plane/up`), a fresh
//! namespace per test, pods
//! from short specs, a kubelet player that writes pod status, the manifests' RBAC with a
//! minted ServiceAccount token, and the built `trainlet` binary as a subprocess.
//!
//! Nothing here is a mock: the API server enforces RBAC, admission, validation and
//! watch semantics exactly as in a cluster, and the Job, StatefulSet, namespace and
//! ServiceAccount controllers act as in one ([`jobs`]). There is no kubelet and no
//! scheduler, so the tests play those parts, except on the real node ([`node`]:
//! `tests/node/up`'s kubelet, scheduler, containerd and CNI, on a control plane of its
//! own), where pods really run.
#![allow(dead_code)]

pub mod binary;
pub mod cluster;
pub mod dns;
pub mod identity;
pub mod init_container;
pub mod jobs;
pub mod node;
pub mod pods;
pub mod skip;
pub mod venv;

pub use binary::*;
pub use cluster::*;
pub use identity::*;
pub use init_container::*;
pub use node::*;
pub use pods::*;
pub use skip::*;
pub use venv::*;

use std::time::{Duration, Instant};

use kube::{Api, Client};

/// A unique suffix for names, so tests and reruns never collide.
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!(
        "{:x}{}{}",
        t % 0xffffff,
        std::process::id() % 1000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Lists the Events (events.k8s.io/v1) in a namespace as (type, reason, note, regarding).
pub async fn events(client: &Client, ns: &str) -> Vec<(String, String, String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits until `check` returns Some, polling every 50 ms, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
