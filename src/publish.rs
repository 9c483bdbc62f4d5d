//! What trainlet tells the cluster about its own pod: annotations (JSON merge patch of
//! only the keys that changed) and Events (events.k8s.io/v1).
//!
//! Publishing is best effort for `init`: a missing RBAC verb here is logged as a warning,
//! because the TF_CONFIG files are what the job needs, not the annotation.
//!
//! The reporters publish much more often than `init`, so they add economy on top
//! (pure, and unit-tested): [`diff`] sends only the keys that changed, [`Throttle`]
//! allows one patch per `--min-patch-interval` (urgent news at most once a second) and
//! backs off exponentially after failures, and [`EventBudget`] caps Events so that a
//! flapping condition cannot flood the API server. A steady pod costs no writes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use thiserror::Error;

use crate::kube::{KubeError, classify};

/// The annotation keys trainlet writes. They are a contract: dashboards and controllers
/// read them.
pub mod keys {
    pub const TASK: &str = "trainlet.io/task";
    pub const GPU_COUNT: &str = "trainlet.io/gpu-count";
    pub const GPU_PRODUCT: &str = "trainlet.io/gpu-product";
    pub const PORT_CONFLICT: &str = "trainlet.io/port-conflict";
    pub const OOM_KILLS: &str = "trainlet.io/oom-kills";
    pub const HEALTH: &str = "trainlet.io/health";
    pub const REPORT: &str = "trainlet.io/report";
    /// The peer watch: `current`, or `stale: worker/1 10.0.0.7 → 10.0.0.19`.
    pub const CLUSTER: &str = "trainlet.io/cluster";
}

#[derive(Debug, Error)]
pub enum PublishError {
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// Publishes annotations and Events on one pod.
#[derive(Clone)]
pub struct Publisher {
    api: Api<Pod>,
    events: Api<K8sEvent>,
    pod_name: String,
    namespace: String,
    reference: ObjectReference,
    manager: &'static str,
}

impl Publisher {
    /// `manager` is the field manager of the patches (`trainlet-sidecar`, …): the pod's
    /// managedFields then record which of trainlet's agents wrote which annotation.
    pub fn new(client: Client, pod: &Pod, manager: &'static str) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        Publisher {
            api: Api::namespaced(client.clone(), &namespace),
            events: Api::namespaced(client, &namespace),
            reference: pod.object_ref(&()),
            pod_name,
            namespace,
            manager,
        }
    }

    /// Sets (`Some`) or removes (`None`) annotations with one JSON merge patch.
    pub async fn annotate(
        &self,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), PublishError> {
        if changes.is_empty() {
            return Ok(());
        }
        let patch = serde_json::json!({ "metadata": { "annotations": changes } });
        self.api
            .patch(
                &self.pod_name,
                &PatchParams {
                    field_manager: Some(self.manager.into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| classify(&e, "patch", "pods", &self.namespace))?;
        Ok(())
    }

    /// Creates a new Event on the pod, never folded into an earlier one: each OOM kill
    /// or conflict is its own fact with its own message (kube-runtime's recorder folds
    /// Events of one reason into a series that keeps the first note). `reason` is
    /// PascalCase; the note is cut at 1 kB. The reporters rate-limit with
    /// [`EventBudget`]; `init` emits at most two.
    pub async fn event(&self, warning: bool, reason: &str, note: &str) -> Result<(), PublishError> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let ev = K8sEvent {
            action: Some(reason.into()),
            reason: Some(reason.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(self.reference.clone()),
            note: Some(truncate(note, 1024)),
            metadata: ObjectMeta {
                namespace: Some(self.namespace.clone()),
                name: Some(format!("{}.{:x}", self.pod_name, now.as_nanosecond())),
                ..Default::default()
            },
            reporting_controller: Some("trainlet".into()),
            reporting_instance: Some(truncate(&self.pod_name, 128)),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            ..Default::default()
        };
        self.events
            .create(&PostParams::default(), &ev)
            .await
            .map_err(|e| classify(&e, "create", "events", &self.namespace))?;
        Ok(())
    }

    /// A Warning Event: see [`Publisher::event`].
    pub async fn warning(&self, reason: &str, note: &str) -> Result<(), PublishError> {
        self.event(true, reason, note).await
    }
}

/// The merge-patch body that turns `published` into `desired`: only the keys whose
/// value differs, `None` (JSON null, which deletes) for keys to remove. Keys that are
/// absent from `desired` are not trainlet's business and are left alone.
pub fn diff(
    published: &BTreeMap<String, String>,
    desired: &BTreeMap<String, Option<String>>,
) -> BTreeMap<String, Option<String>> {
    desired
        .iter()
        .filter(|(k, v)| published.get(*k) != v.as_ref())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Applies a patch to the record of what the pod carries.
pub fn apply(published: &mut BTreeMap<String, String>, changes: &BTreeMap<String, Option<String>>) {
    for (k, v) in changes {
        match v {
            Some(v) => published.insert(k.clone(), v.clone()),
            None => published.remove(k),
        };
    }
}

/// When the next patch may go out: at most one per `min_interval`, urgent news (an
/// OOM kill, a new conflict) at once but at most once per [`Throttle::URGENT_FLOOR`],
/// and never before the backoff after a failure has passed. Pure: the caller passes
/// the clock.
#[derive(Debug, Clone)]
pub struct Throttle {
    min_interval: Duration,
    last: Option<Instant>,
    failures: u32,
    retry_at: Option<Instant>,
}

impl Throttle {
    pub const URGENT_FLOOR: Duration = Duration::from_secs(1);
    pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
    pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

    pub fn new(min_interval: Duration) -> Self {
        Throttle {
            min_interval,
            last: None,
            failures: 0,
            retry_at: None,
        }
    }

    /// The earliest time pending work may be published.
    pub fn due(&self, now: Instant, urgent: bool) -> Instant {
        let mut t = now;
        if let Some(r) = self.retry_at {
            t = t.max(r);
        }
        if let Some(last) = self.last {
            let gap = if urgent {
                Self::URGENT_FLOOR.min(self.min_interval)
            } else {
                self.min_interval
            };
            t = t.max(last + gap);
        }
        t
    }

    pub fn succeeded(&mut self, now: Instant) {
        self.last = Some(now);
        self.failures = 0;
        self.retry_at = None;
    }

    /// Records a failure; returns the delay before the next try (doubling from
    /// [`Throttle::FIRST_BACKOFF`] up to [`Throttle::MAX_BACKOFF`]).
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = Self::FIRST_BACKOFF
            .saturating_mul(1u32 << (self.failures - 1).min(16))
            .min(Self::MAX_BACKOFF);
        self.retry_at = Some(now + delay);
        delay
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// A token bucket for Events: a burst of [`EventBudget::BURST`], then one per
/// [`EventBudget::REFILL`]. Events beyond it are dropped (and logged): the annotations
/// and metrics still count everything.
#[derive(Debug, Clone)]
pub struct EventBudget {
    tokens: f64,
    at: Instant,
}

impl EventBudget {
    pub const BURST: f64 = 10.0;
    pub const REFILL: Duration = Duration::from_secs(6);

    pub fn new(now: Instant) -> Self {
        EventBudget {
            tokens: Self::BURST,
            at: now,
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let refill =
            now.saturating_duration_since(self.at).as_secs_f64() / Self::REFILL.as_secs_f64();
        self.tokens = (self.tokens + refill).min(Self::BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Cuts at a character boundary, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_sends_only_changed_keys_and_null_for_removed() {
        let published = BTreeMap::from([
            (keys::HEALTH.to_string(), "ok".to_string()),
            (keys::PORT_CONFLICT.to_string(), "8470".to_string()),
            ("other.io/key".to_string(), "x".to_string()),
        ]);
        let desired = BTreeMap::from([
            (keys::HEALTH.to_string(), Some("ok".to_string())),
            (keys::PORT_CONFLICT.to_string(), None),
            (keys::OOM_KILLS.to_string(), Some("1".to_string())),
            (keys::GPU_PRODUCT.to_string(), None),
        ]);
        let d = diff(&published, &desired);
        assert_eq!(
            d,
            BTreeMap::from([
                (keys::OOM_KILLS.to_string(), Some("1".to_string())),
                (keys::PORT_CONFLICT.to_string(), None),
            ])
        );
        assert_eq!(
            serde_json::json!({"metadata": {"annotations": d}}).to_string(),
            r#"{"metadata":{"annotations":{"trainlet.io/oom-kills":"1","trainlet.io/port-conflict":null}}}"#
        );
        let mut p = published.clone();
        apply(&mut p, &d);
        assert!(
            diff(&p, &desired).is_empty(),
            "a steady state sends nothing"
        );
    }

    #[test]
    fn throttle_spaces_patches_and_backs_off() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = Throttle::new(s(10));
        assert_eq!(t.due(t0, false), t0, "the first patch goes at once");
        t.succeeded(t0);
        assert_eq!(t.due(t0 + s(2), false), t0 + s(10));
        assert_eq!(
            t.due(t0 + s(2), true),
            t0 + s(2),
            "urgent news skips the interval"
        );
        assert_eq!(t.due(t0, true), t0 + s(1), "but not the one-second floor");
        assert_eq!(t.failed(t0 + s(20)), Duration::from_millis(500));
        assert_eq!(t.failed(t0 + s(20)), s(1));
        assert_eq!(t.failed(t0 + s(20)), s(2));
        assert_eq!(
            t.due(t0 + s(20), true),
            t0 + s(22),
            "backoff applies to urgent news"
        );
        for _ in 0..20 {
            t.failed(t0);
        }
        assert_eq!(t.due(t0, true), t0 + Throttle::MAX_BACKOFF);
        t.succeeded(t0 + s(100));
        assert_eq!(t.failures(), 0);
        assert_eq!(t.due(t0 + s(105), false), t0 + s(110));
    }

    #[test]
    fn event_budget_allows_a_burst_then_a_trickle() {
        let t0 = Instant::now();
        let mut b = EventBudget::new(t0);
        for _ in 0..10 {
            assert!(b.take(t0));
        }
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_secs(5)));
        assert!(b.take(t0 + Duration::from_secs(7)));
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(super::truncate("abc", 10), "abc");
        assert_eq!(super::truncate("ééééé", 6), "é...");
    }
}
