//! The outbox: what the pod should carry against what it carries, the Events still to
//! emit, and when the next write may go out.
//!
//! Only the keys that changed are sent, as one merge patch, at most once per
//! `--min-patch-interval` (urgent news at once), with backoff after failures; Events go
//! through a token bucket. A reporter restarted on a pod whose annotations are still
//! right sends nothing: the first view of the pod seeds what it carries. The decisions
//! are pure (`publish::diff`, `Throttle`, `EventBudget`); [`Outbox::send`] is the I/O.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::state::Note;
use crate::metrics::{Metrics, Readiness};
use crate::publish::{self, EventBudget, Publisher, Throttle, keys};

/// Every API call gets at most this long: a server that accepts connections but never
/// answers must not stall the reporter.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the last report may take on the way out (SIGTERM or CMD's exit).
const FINAL_FLUSH: Duration = Duration::from_millis(1500);

/// The annotations the reporters own, read back from the pod at start.
const REPORTED: [&str; 7] = [
    keys::CLUSTER,
    keys::GPU_COUNT,
    keys::GPU_PRODUCT,
    keys::PORT_CONFLICT,
    keys::OOM_KILLS,
    keys::HEALTH,
    keys::REPORT,
];

pub struct Outbox {
    publisher: Option<Publisher>,
    published: BTreeMap<String, String>,
    published_known: bool,
    desired: BTreeMap<String, Option<String>>,
    events: VecDeque<Note>,
    urgent: bool,
    throttle: Throttle,
    budget: EventBudget,
    next: Option<Instant>,
}

impl Outbox {
    pub fn new(min_patch_interval: Duration, now: Instant) -> Outbox {
        Outbox {
            publisher: None,
            published: BTreeMap::new(),
            published_known: false,
            desired: BTreeMap::new(),
            events: VecDeque::new(),
            urgent: false,
            throttle: Throttle::new(min_patch_interval),
            budget: EventBudget::new(now),
            next: None,
        }
    }

    /// Whether there is somewhere to publish to yet.
    pub fn attached(&self) -> bool {
        self.publisher.is_some()
    }

    /// Learns of the own pod. The first time, it also seeds what the pod carries: later
    /// watch events are not used for that, because one may predate trainlet's own last
    /// patch.
    pub fn attach(&mut self, publisher: impl FnOnce() -> Publisher, pod: &Pod) {
        if self.publisher.is_none() {
            self.publisher = Some(publisher());
        }
        if !self.published_known {
            self.published_known = true;
            for k in REPORTED {
                if let Some(v) = pod.metadata.annotations.as_ref().and_then(|a| a.get(k)) {
                    self.published.insert(k.to_string(), v.clone());
                }
            }
        }
    }

    /// The annotations the pod should carry now.
    pub fn want(&mut self, desired: BTreeMap<String, Option<String>>) {
        self.desired = desired;
    }

    /// Queues an Event; `urgent` sends it (and the annotations) at once.
    pub fn push(&mut self, note: Note, urgent: bool) {
        self.events.push_back(note);
        self.urgent |= urgent;
    }

    /// Sends the next write at once rather than at the patch interval.
    pub fn hurry(&mut self) {
        self.urgent = true;
    }

    /// The merge patch that would bring the pod up to date: the changed keys only.
    pub fn changes(&self) -> BTreeMap<String, Option<String>> {
        publish::diff(&self.published, &self.desired)
    }

    /// When the next write may go out, or `None` when there is nothing to write.
    pub fn next(&self) -> Option<Instant> {
        self.next
    }

    /// Plans the next write. Returns whether everything is published (nothing to
    /// write, or nowhere to write it), which is what readiness waits for.
    pub fn schedule(&mut self, now: Instant) -> bool {
        if self.publisher.is_none() {
            self.next = None;
            return false;
        }
        if self.changes().is_empty() && self.events.is_empty() {
            self.next = None;
            self.urgent = false;
            return true;
        }
        self.next = Some(self.throttle.due(now, self.urgent));
        false
    }

    /// Records a patch the API server accepted.
    pub fn patched(&mut self, changes: &BTreeMap<String, Option<String>>, now: Instant) {
        publish::apply(&mut self.published, changes);
        self.throttle.succeeded(now);
        self.urgent = false;
    }

    fn failed(&mut self, what: &str, metrics: &Metrics) {
        metrics.api_errors.inc();
        let delay = self.throttle.failed(Instant::now());
        warn!("{what}; retrying in {delay:?}");
        self.next = Some(Instant::now() + delay);
    }

    /// Sends what changed, then the queued Events, each bounded by [`API_TIMEOUT`]; on
    /// a failure, backs off and keeps the rest for the next time.
    pub async fn send(&mut self, metrics: &Metrics, ready: &Readiness) {
        let Some(publisher) = self.publisher.clone() else {
            return;
        };
        let changes = self.changes();
        if !changes.is_empty() {
            match tokio::time::timeout(API_TIMEOUT, publisher.annotate(&changes)).await {
                Ok(Ok(())) => {
                    self.patched(&changes, Instant::now());
                    metrics.annotation_patches.inc();
                    ready.set();
                    let keys: Vec<&str> = changes.keys().map(String::as_str).collect();
                    info!(
                        health = self
                            .published
                            .get(keys::HEALTH)
                            .map(String::as_str)
                            .unwrap_or(""),
                        "annotated the pod: {}",
                        keys.join(", ")
                    );
                }
                Ok(Err(e)) => {
                    return self.failed(&format!("could not annotate the pod: {e}"), metrics);
                }
                Err(_) => {
                    return self.failed(
                        &format!("could not annotate the pod: no answer within {API_TIMEOUT:?}"),
                        metrics,
                    );
                }
            }
        }
        while let Some((reason, note)) = self.events.front().cloned() {
            if !self.budget.take(Instant::now()) {
                warn!(reason, "too many Events; dropping: {note}");
                self.events.pop_front();
                continue;
            }
            match tokio::time::timeout(API_TIMEOUT, publisher.warning(reason, &note)).await {
                Ok(Ok(())) => {
                    self.events.pop_front();
                }
                Ok(Err(e)) => {
                    return self
                        .failed(&format!("could not emit the {reason} Event: {e}"), metrics);
                }
                Err(_) => {
                    return self.failed(
                        &format!(
                            "could not emit the {reason} Event: no answer within {API_TIMEOUT:?}"
                        ),
                        metrics,
                    );
                }
            }
        }
        if self.schedule(Instant::now()) {
            ready.set();
        }
    }

    /// One last send, bounded in time, when stopping: the interval and any backoff are
    /// skipped, because this is the last chance.
    pub async fn flush(&mut self, metrics: &Metrics, ready: &Readiness) {
        if self.next.is_none() {
            return;
        }
        let _ = tokio::time::timeout(FINAL_FLUSH, async {
            self.throttle = Throttle::new(Duration::ZERO);
            self.send(metrics, ready).await;
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with(annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("trainer-0".into());
        p.metadata.namespace = Some("ml".into());
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    fn publisher(pod: &Pod) -> Publisher {
        // A client that is never used: the outbox's decisions make no request.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        Publisher::new(client, pod, "trainlet-sidecar")
    }

    fn want(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(String::from)))
            .collect()
    }

    #[tokio::test]
    async fn only_changed_keys_are_sent() {
        let now = Instant::now();
        let mut outbox = Outbox::new(Duration::from_secs(10), now);
        let pod = pod_with(&[(keys::GPU_COUNT, "4"), (keys::HEALTH, "ok"), ("other", "x")]);
        outbox.attach(|| publisher(&pod), &pod);
        outbox.want(want(&[
            (keys::GPU_COUNT, Some("4")),
            (keys::HEALTH, Some("degraded")),
            (keys::PORT_CONFLICT, Some("8470")),
            (keys::GPU_PRODUCT, None),
        ]));
        // gpu-count is already right, gpu-product is already absent, "other" is not
        // trainlet's: only health and port-conflict go out.
        assert_eq!(
            outbox.changes(),
            want(&[
                (keys::HEALTH, Some("degraded")),
                (keys::PORT_CONFLICT, Some("8470")),
            ])
        );
        assert!(!outbox.schedule(now));
        assert!(outbox.next().is_some());

        let sent = outbox.changes();
        outbox.patched(&sent, now);
        assert!(outbox.changes().is_empty());
        assert!(outbox.schedule(now), "nothing left to send");
        assert_eq!(outbox.next(), None);

        // The conflict clears: only its removal goes out.
        outbox.want(want(&[
            (keys::GPU_COUNT, Some("4")),
            (keys::HEALTH, Some("degraded")),
            (keys::PORT_CONFLICT, None),
        ]));
        assert_eq!(outbox.changes(), want(&[(keys::PORT_CONFLICT, None)]));
    }

    #[tokio::test]
    async fn a_restarted_reporter_seeds_from_the_pod_once() {
        let now = Instant::now();
        let mut outbox = Outbox::new(Duration::from_secs(10), now);
        let pod = pod_with(&[(keys::HEALTH, "ok")]);
        outbox.attach(|| publisher(&pod), &pod);
        // A later watch event (maybe older than our own last patch) does not reseed.
        let stale = pod_with(&[(keys::HEALTH, "degraded")]);
        outbox.attach(|| publisher(&stale), &stale);
        outbox.want(want(&[(keys::HEALTH, Some("ok"))]));
        assert!(outbox.changes().is_empty());
        assert!(outbox.schedule(now));
    }

    #[tokio::test]
    async fn events_are_sent_even_when_no_annotation_changed() {
        let now = Instant::now();
        let mut outbox = Outbox::new(Duration::from_secs(10), now);
        assert!(!outbox.schedule(now), "nowhere to publish yet");
        let pod = pod_with(&[]);
        outbox.attach(|| publisher(&pod), &pod);
        outbox.push(("OOMKill", "process python was OOM-killed".into()), true);
        assert!(outbox.changes().is_empty());
        assert!(!outbox.schedule(now));
        assert_eq!(outbox.next(), Some(now), "urgent: at once");
    }
}
