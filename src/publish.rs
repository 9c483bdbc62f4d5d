//! What trainlet tells the cluster about its own pod: annotations (JSON merge patch of
//! only the keys that changed) and Events (events.k8s.io/v1).
//!
//! Publishing is best effort for `init`: a missing RBAC verb here is logged as a warning,
//! because the TF_CONFIG files are what the job needs, not the annotation.
//!
//! The reporters publish much more often than `init`, so they add economy on top
//! (pure, and unit-tested): [`diff`] sends only the keys that changed, [`Throttle`]
//! allows one patch per `--min-patch-interval` (urgent news at most once a second) and
//! backs off exponentially after failures, [`EventBudget`] caps Events so that a
//! flapping condition cannot flood the API server, [`ContainerUrgency`] caps how often
//! the training container's news may hurry a patch, and [`check_total`] keeps a patch
//! within what the API server accepts. A steady pod costs no writes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use thiserror::Error;

use crate::event::Event;
use crate::kube::{KubeError, classify};

/// Every API call of the reporters gets at most this long: a server that accepts
/// connections but never answers must not stall them.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// `trainlet exec --stall-after`: the last progress, the step, whether stalled.
    pub const PROGRESS: &str = "trainlet.io/progress";
}

#[derive(Debug, Error)]
pub enum PublishError {
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// The most all of an object's annotations may hold together, keys and values: the API
/// server refuses a patch that goes over it (`TotalAnnotationSizeLimitB` in
/// k8s.io/apimachinery's `ValidateAnnotationsSize`).
pub const ANNOTATIONS_MAX: usize = 256 * 1024;

/// A patch that would take a pod's annotations over [`ANNOTATIONS_MAX`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "the pod's annotations would take {total} bytes, more than the {ANNOTATIONS_MAX} the API server allows ({own} of them trainlet's, {largest_key} the largest at {largest} bytes)"
)]
pub struct AnnotationsTooLarge {
    pub total: usize,
    /// What the keys being set take.
    pub own: usize,
    pub largest_key: String,
    pub largest: usize,
}

/// Checks, as the API server will, that `current` with `changes` applied fits in
/// [`ANNOTATIONS_MAX`]. Pure.
pub fn check_total(
    current: &BTreeMap<String, String>,
    changes: &BTreeMap<String, Option<String>>,
) -> Result<(), AnnotationsTooLarge> {
    let size = |k: &str, v: &str| k.len() + v.len();
    let mut total = 0;
    let mut largest = (String::new(), 0);
    for (k, v) in current {
        if !changes.contains_key(k) {
            total += size(k, v);
        }
    }
    let mut own = 0;
    for (k, v) in changes {
        if let Some(v) = v {
            own += size(k, v);
            if size(k, v) > largest.1 {
                largest = (k.clone(), size(k, v));
            }
        }
    }
    total += own;
    if total <= ANNOTATIONS_MAX {
        return Ok(());
    }
    for (k, v) in current {
        if !changes.contains_key(k) && size(k, v) > largest.1 {
            largest = (k.clone(), size(k, v));
        }
    }
    Err(AnnotationsTooLarge {
        total,
        own,
        largest_key: largest.0,
        largest: largest.1,
    })
}

/// The name of a new Event on `pod`: `<pod>.<nanoseconds in hex>`, as kubectl's Events
/// are named, with the pod's part cut so that the whole stays a valid name (at most 253
/// characters, no `.` or `-` before the separator).
pub fn event_name(pod: &str, nanos: i128) -> String {
    let suffix = format!("{nanos:x}");
    let room = 253 - 1 - suffix.len();
    let mut head = &pod[..pod.len().min(room)];
    head = head.trim_end_matches(['.', '-']);
    format!("{head}.{suffix}")
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
    /// Events of one reason into a series that keeps the first note). The note is cut
    /// at 1 kB. The reporters rate-limit through their recorder
    /// (the agent's recorder); `init` emits at most two.
    pub async fn event(&self, event: &Event) -> Result<(), PublishError> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let reason = event.reason.as_str();
        let ev = K8sEvent {
            action: Some(reason.into()),
            reason: Some(reason.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(self.reference.clone()),
            note: Some(truncate(&event.note, 1024)),
            metadata: ObjectMeta {
                namespace: Some(self.namespace.clone()),
                name: Some(event_name(&self.pod_name, now.as_nanosecond())),
                ..Default::default()
            },
            reporting_controller: Some("trainlet".into()),
            reporting_instance: Some(truncate(&self.pod_name, 128)),
            type_: Some(event.type_.as_str().into()),
            ..Default::default()
        };
        self.events
            .create(&PostParams::default(), &ev)
            .await
            .map_err(|e| classify(&e, "create", "events", &self.namespace))?;
        Ok(())
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

/// A token bucket: a burst of `burst`, then one per `refill`. Pure: the caller passes
/// the clock.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    burst: f64,
    refill: Duration,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(burst: u32, refill: Duration, now: Instant) -> Self {
        TokenBucket {
            burst: f64::from(burst),
            refill,
            tokens: f64::from(burst),
            at: now,
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64()
            / self.refill.as_secs_f64().max(f64::MIN_POSITIVE);
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The Events' budget: a burst of [`EventBudget::BURST`], then one per
/// [`EventBudget::REFILL`]. Events beyond it are dropped (and counted): the annotations
/// and metrics still count everything.
pub struct EventBudget;

impl EventBudget {
    pub const BURST: u32 = 10;
    pub const REFILL: Duration = Duration::from_secs(6);

    pub fn bucket(now: Instant) -> TokenBucket {
        TokenBucket::new(Self::BURST, Self::REFILL, now)
    }
}

/// How often news from the training container (an observation handed over by its
/// `trainlet exec`) may hurry a patch: a burst of [`ContainerUrgency::BURST`], then one
/// per [`ContainerUrgency::REFILL`]; beyond that it waits for the patch interval like
/// everything else. The training container is less trusted than the sidecar, and a
/// forged stream of OOM kills must not turn into a patch a second.
pub struct ContainerUrgency;

impl ContainerUrgency {
    pub const BURST: u32 = 5;
    pub const REFILL: Duration = Duration::from_secs(10);

    pub fn bucket(now: Instant) -> TokenBucket {
        TokenBucket::new(Self::BURST, Self::REFILL, now)
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
        let mut b = EventBudget::bucket(t0);
        for _ in 0..10 {
            assert!(b.take(t0));
        }
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_secs(5)));
        assert!(b.take(t0 + Duration::from_secs(7)));
    }

    #[test]
    fn the_total_of_a_pods_annotations_is_checked_as_the_api_server_does() {
        let current = BTreeMap::from([
            ("user.io/big".to_string(), "x".repeat(200 * 1024)),
            (keys::REPORT.to_string(), "old".to_string()),
        ]);
        let mut changes = BTreeMap::from([(keys::REPORT.to_string(), Some("y".repeat(1000)))]);
        assert_eq!(check_total(&current, &changes), Ok(()));
        // Exactly at the limit fits; one byte more does not.
        let at = ANNOTATIONS_MAX - "user.io/big".len() - 200 * 1024 - keys::REPORT.len();
        changes.insert(keys::REPORT.to_string(), Some("y".repeat(at)));
        assert_eq!(check_total(&current, &changes), Ok(()));
        changes.insert(keys::REPORT.to_string(), Some("y".repeat(at + 1)));
        let e = check_total(&current, &changes).unwrap_err();
        assert_eq!(e.total, ANNOTATIONS_MAX + 1);
        assert_eq!(e.largest_key, "user.io/big");
        assert!(e.to_string().starts_with("the pod's annotations would take 262145 bytes, more than the 262144 the API server allows"), "{e}");
        // Removing a key frees its room.
        changes.insert("user.io/big".to_string(), None);
        assert_eq!(check_total(&current, &changes), Ok(()));
    }

    #[test]
    fn an_event_name_stays_a_valid_name_for_the_longest_pod_names() {
        assert_eq!(event_name("trainer-0", 0x1f), "trainer-0.1f");
        let nanos = 1_700_000_000_000_000_000i128;
        for len in [200, 236, 237, 252, 253] {
            let pod = format!("{}-{}", "a".repeat(len - 2), "b");
            let name = event_name(&pod, nanos);
            assert!(name.len() <= 253, "{len}: {}", name.len());
            assert!(name.ends_with(&format!(".{nanos:x}")));
            assert!(!name.contains("-.") && !name.contains(".."), "{name}");
        }
        // A cut that ends on a '-' or '.' drops it (16 hex digits leave 236 characters).
        assert_eq!(format!("{nanos:x}").len(), 16);
        let pod = format!("{}-xyz", "a".repeat(235));
        assert_eq!(
            event_name(&pod, nanos),
            format!("{}.{nanos:x}", "a".repeat(235))
        );
    }

    #[test]
    fn the_training_containers_news_hurries_a_patch_only_so_often() {
        let t0 = Instant::now();
        let mut b = ContainerUrgency::bucket(t0);
        for _ in 0..ContainerUrgency::BURST {
            assert!(b.take(t0));
        }
        assert!(!b.take(t0 + Duration::from_secs(9)));
        assert!(b.take(t0 + Duration::from_secs(10)));
        assert!(!b.take(t0 + Duration::from_secs(11)));
        // A forged kill every 200 ms for a minute hurries 5 + 5 patches, not 300.
        let mut b = ContainerUrgency::bucket(t0);
        let hurried = (0..300)
            .filter(|i| b.take(t0 + Duration::from_millis(200 * i)))
            .count();
        assert_eq!(hurried, 5 + 5);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(super::truncate("abc", 10), "abc");
        assert_eq!(super::truncate("ééééé", 6), "é...");
    }
}
