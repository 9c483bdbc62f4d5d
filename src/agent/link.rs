//! The reporter's link to its own pod: the pre-flight GET, the watch that follows the
//! pod, and what each version of the pod changes (the outbox's target, OOM kills in
//! pod status, the containers' cgroups, `--exit-with-main`).

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use super::{Engine, Mode};
use crate::flags;
use crate::kube::{self as k8s, Identity, KubeError};
use crate::publish::API_TIMEOUT;
use crate::publish::Publisher;

/// The connection to the API server.
pub(super) struct Link {
    pub client: Client,
    pub id: Identity,
}

impl Engine {
    /// Connects: the client, the identity, and the pre-flight GET of the own pod.
    /// A transient failure leaves the watch to catch up; any other is returned.
    pub(super) async fn connect(&mut self) -> Result<(), KubeError> {
        let (client, id) = k8s::connect(&self.cfg.kube).await?;
        let pod = match tokio::time::timeout(API_TIMEOUT, k8s::get_own_pod(&client, &id)).await {
            Ok(Ok(p)) => Some(p),
            Ok(Err(e)) if e.is_transient() => {
                self.metrics.api_errors.inc();
                warn!("{e}; reporting locally and retrying in the background");
                None
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                self.metrics.api_errors.inc();
                warn!(
                    "the API server did not answer the GET of pod {} within {API_TIMEOUT:?}; retrying in the background",
                    id.pod_name
                );
                None
            }
        };
        info!(pod = %id.pod_name, namespace = %id.namespace, "reporting on the own pod");
        self.link = Some(Link { client, id });
        if let Some(p) = pod {
            self.on_pod(p);
        }
        Ok(())
    }

    pub(super) fn pod_stream(&self) -> Option<BoxStream<'static, Result<Pod, watcher::Error>>> {
        let link = self.link.as_ref()?;
        let api: Api<Pod> = Api::namespaced(link.client.clone(), &link.id.namespace);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", link.id.pod_name));
        Some(
            watcher(api, cfg)
                .default_backoff()
                .applied_objects()
                .boxed(),
        )
    }

    pub(super) fn on_pod(&mut self, mut pod: Pod) {
        pod.metadata.managed_fields = None;
        if self.role.mode() == Mode::Sidecar && !self.once.seeded {
            self.seed_from(&pod);
            self.once.seeded = true;
        }
        if let Some(link) = &self.link {
            let manager = match self.role.mode() {
                Mode::Sidecar => "trainlet-sidecar",
                Mode::Exec => "trainlet-exec",
            };
            self.outbox
                .attach(|| Publisher::new(link.client.clone(), &pod, manager), &pod);
        }
        let started_before = self.view.started_at(&self.container_name());
        self.view.pod = Some(pod);
        let started = self.view.started_at(&self.container_name());
        // What changes how a port is judged: from here on, a new listener is the
        // container's own, not one that was there before it.
        if self.role.mode() == Mode::Sidecar
            && let Some(at) = started.filter(|_| started != started_before)
        {
            info!(
                container = %self.container_name(),
                started_at = %crate::time::rfc3339_seconds(at),
                "the training container started"
            );
            // Judge the listeners again against the start just learned, now: the next
            // probe may come only after a short run ended (its listeners gone), and the
            // report must not keep what was judged while the start was unknown.
            self.probe_ports();
        }
        if self.training().is_none() && !self.once.warned_no_container {
            let containers: Vec<String> = self
                .view
                .pod
                .iter()
                .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
                .map(|c| c.name.clone())
                .collect();
            warn!(
                "no training container {} in the pod (containers: {}); GPU limits and ports come from flags only (pass --{})",
                self.cfg
                    .probes
                    .container
                    .as_deref()
                    .unwrap_or("that is not trainlet's"),
                containers.join(", "),
                flags::CONTAINER
            );
            self.once.warned_no_container = true;
        }
        for kill in self
            .probes
            .oom
            .record_status(&self.view, self.cfg.probes.container.as_deref())
        {
            self.announce_kill(&kill, true);
        }
        let sidecar = self.role.sidecar().map(|s| &s.cfg);
        if let Some(root) = sidecar.and_then(|s| s.cgroup_root.as_ref()) {
            self.probes.oom.resolve_container_cgroups(root, &self.view);
        }
        if sidecar.is_some_and(|s| s.exit_with_main) && self.view.finished(&self.container_name()) {
            info!(
                container = %self.container_name(),
                "the training container has terminated; exiting (--{})",
                flags::EXIT_WITH_MAIN
            );
            self.stopping = true;
        }
    }
}

pub(super) async fn next_pod(
    s: &mut Option<BoxStream<'static, Result<Pod, watcher::Error>>>,
) -> Option<Result<Pod, watcher::Error>> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}
