//! The outbox: what the pod should carry against what it carries, the Events still to
//! emit, and when the next write may go out.
//!
//! Only the keys that changed are sent, as one merge patch, at most once per
//! `--min-patch-interval` (urgent news at once), with backoff after failures; Events go
//! through a token bucket. A reporter restarted on a pod whose annotations are still
//! right sends nothing: the first view of the pod seeds what it carries. The decisions
//! are pure (`publish::diff`, `Throttle`, `EventBudget`); [`Outbox::send`] is the I/O.
//!
//! What the pod should carry is kept within what the API server accepts of all of a
//! pod's annotations together ([`publish::ANNOTATIONS_MAX`], the user's own included):
//! a patch over it would be refused, and every key in it with it. So before anything
//! is planned, the report shrinks into the room that is left ([`super::budget`]); where
//! that is not enough, a new resolution is held back (`ClusterTooLarge`); where even
//! that is not enough, nothing changes on the pod and an `AnnotationsTooLarge` Warning
//! says why.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::budget;
use super::recorder::Recorder;
use crate::cluster::published::ANNOTATION as RESOLUTION;
use crate::event::Event;
use crate::metrics::{Metrics, Readiness};
use crate::publish::{self, API_TIMEOUT, Publisher, Throttle, keys};
use crate::reason::Reason;

/// How long the last report may take on the way out (SIGTERM or CMD's exit).
const FINAL_FLUSH: Duration = Duration::from_millis(1500);
/// The same, while an Event is still to go out (an OOM kill seen just before the
/// kubelet stopped the pod): worth more of the grace period (30 s by default) than
/// annotations alone.
const FINAL_FLUSH_NEWS: Duration = Duration::from_secs(5);

/// The annotations the reporters own, read back from the pod at start.
const REPORTED: [&str; 8] = [
    RESOLUTION,
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
    /// The pod's other annotations (the user's, other agents'): they share the budget.
    others: BTreeMap<String, String>,
    desired: BTreeMap<String, Option<String>>,
    /// Every Event the agent sends.
    events: Recorder,
    urgent: bool,
    throttle: Throttle,
    next: Option<Instant>,
    /// Why the last plan did not fit, once announced.
    over: Option<Event>,
}

impl Outbox {
    pub fn new(min_patch_interval: Duration, now: Instant) -> Outbox {
        Outbox {
            publisher: None,
            published: BTreeMap::new(),
            published_known: false,
            others: BTreeMap::new(),
            desired: BTreeMap::new(),
            events: Recorder::new(now),
            urgent: false,
            throttle: Throttle::new(min_patch_interval),
            next: None,
            over: None,
        }
    }

    /// Whether there is somewhere to publish to yet.
    pub fn attached(&self) -> bool {
        self.publisher.is_some()
    }

    /// Learns of the own pod. The first time, it also seeds what the pod carries: later
    /// watch events are not used for that, because one may predate trainlet's own last
    /// patch. Every time, it learns the pod's other annotations.
    pub fn attach(&mut self, publisher: impl FnOnce() -> Publisher, pod: &Pod) {
        if self.publisher.is_none() {
            self.publisher = Some(publisher());
        }
        self.others = pod
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| !REPORTED.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !self.published_known {
            self.published_known = true;
            for k in REPORTED {
                if let Some(v) = pod.metadata.annotations.as_ref().and_then(|a| a.get(k)) {
                    self.published.insert(k.to_string(), v.clone());
                }
            }
        }
    }

    /// What the last plan could not publish, and why.
    pub fn unpublished(&self) -> Option<&str> {
        self.over.as_ref().map(|e| e.note.as_str())
    }

    /// What the pod carries of one of the reporters' keys, as far as the outbox knows.
    pub fn carried(&self, key: &str) -> Option<&str> {
        self.published.get(key).map(String::as_str)
    }

    /// The annotations the pod should carry now, fitted into what is left of the
    /// pod's annotation budget.
    pub fn want(&mut self, desired: BTreeMap<String, Option<String>>) {
        self.desired = desired;
        self.fit_total();
    }

    /// Keeps the planned annotations within [`publish::ANNOTATIONS_MAX`] (see the
    /// module header).
    fn fit_total(&mut self) {
        let mut current = self.others.clone();
        current.extend(self.published.clone());
        let fits = |desired: &BTreeMap<String, Option<String>>| {
            publish::check_total(&current, &publish::diff(&self.published, desired))
        };
        let Err(first) = fits(&self.desired) else {
            self.over = None;
            return;
        };
        if let Some(Some(report)) = self.desired.get(keys::REPORT).cloned() {
            let room = publish::ANNOTATIONS_MAX.saturating_sub(first.total - report.len());
            self.desired
                .insert(keys::REPORT.into(), Some(budget::refit(&report, room)));
        }
        if fits(&self.desired).is_ok() {
            self.over = None;
            return;
        }
        let mut why = None;
        if self.desired.contains_key(RESOLUTION) {
            let carried = self.published.get(RESOLUTION).cloned();
            if self.desired.get(RESOLUTION) != Some(&carried) {
                self.desired.insert(RESOLUTION.into(), carried);
                why = Some(Event::warning(
                    Reason::ClusterTooLarge,
                    format!(
                        "cannot publish the cluster again for the other pods: {first}; they keep the cluster published before"
                    ),
                ));
            }
        }
        if let Err(e) = fits(&self.desired) {
            // Nothing of it fits: the pod keeps what it carries.
            let keep: BTreeMap<String, Option<String>> = self
                .desired
                .keys()
                .map(|k| (k.clone(), self.published.get(k).cloned()))
                .collect();
            self.desired = keep;
            why = Some(Event::warning(
                Reason::AnnotationsTooLarge,
                format!("cannot update trainlet's annotations on this pod: {e}"),
            ));
        }
        if let Some(event) = why
            && self.over.as_ref().map(|e| e.reason) != Some(event.reason)
        {
            warn!(reason = event.reason.as_str(), "{}", event.note);
            self.over = Some(event.clone());
            self.record(event, true);
        }
    }

    /// Queues an Event in the recorder; `urgent` sends it (and the annotations) at
    /// once.
    pub fn record(&mut self, event: Event, urgent: bool) {
        self.events.record(event);
        self.urgent |= urgent;
    }

    /// The Events not sent yet, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = &Event> {
        self.events.queued()
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
        if let Err(e) = self.events.send(&publisher, metrics).await {
            return self.failed(&e, metrics);
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
        let within = if self.events.is_empty() {
            FINAL_FLUSH
        } else {
            FINAL_FLUSH_NEWS
        };
        let sent = tokio::time::timeout(within, async {
            self.throttle = Throttle::new(Duration::ZERO);
            self.send(metrics, ready).await;
        })
        .await;
        if sent.is_err() {
            warn!(
                events = self.events.queued().count(),
                "the last report did not go out within {}s",
                within.as_secs_f64()
            );
        }
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
        outbox.record(
            Event::warning(Reason::OomKill, "process python was OOM-killed"),
            true,
        );
        assert!(outbox.changes().is_empty());
        assert!(!outbox.schedule(now));
        assert_eq!(outbox.next(), Some(now), "urgent: at once");
    }

    /// The user's annotations leave little room: the report shrinks into it, a new
    /// resolution is held back, and when nothing fits the pod keeps what it carries;
    /// each with one Warning.
    #[tokio::test]
    async fn what_the_pod_should_carry_fits_beside_its_other_annotations() {
        let now = Instant::now();
        let mut outbox = Outbox::new(Duration::from_secs(10), now);
        let big = "x".repeat(publish::ANNOTATIONS_MAX - 4000);
        let pod = pod_with(&[("example.com/notes", &big)]);
        outbox.attach(|| publisher(&pod), &pod);
        let ports: Vec<serde_json::Value> = (0..400)
            .map(|p| serde_json::json!({"port": 1000 + p, "state": "free"}))
            .collect();
        let report =
            serde_json::json!({"health": "ok", "mode": "sidecar", "ports": ports}).to_string();
        assert!(report.len() > 4000);
        outbox.want(want(&[
            (keys::HEALTH, Some("ok")),
            (keys::REPORT, Some(&report)),
        ]));
        let sent = outbox.changes();
        let fitted = sent[keys::REPORT].clone().unwrap();
        assert!(
            fitted.len() < 4000 && fitted.contains("\"truncated\":true"),
            "{fitted}"
        );
        let mut all = BTreeMap::from([("example.com/notes".to_string(), big.clone())]);
        publish::apply(&mut all, &sent);
        assert_eq!(publish::check_total(&all, &BTreeMap::new()), Ok(()));
        assert!(outbox.events.is_empty(), "a smaller report is no news");

        // A resolution that cannot fit is held back, once announced.
        let resolution = "r".repeat(10_000);
        outbox.want(want(&[
            (keys::HEALTH, Some("ok")),
            (RESOLUTION, Some(&resolution)),
        ]));
        assert!(!outbox.changes().contains_key(RESOLUTION));
        let reasons = |o: &Outbox| o.queued().map(|e| e.reason.as_str()).collect::<Vec<_>>();
        assert_eq!(reasons(&outbox), ["ClusterTooLarge"]);
        outbox.want(want(&[
            (keys::HEALTH, Some("ok")),
            (RESOLUTION, Some(&resolution)),
        ]));
        assert_eq!(reasons(&outbox), ["ClusterTooLarge"], "announced once");

        // Nothing of it fits: nothing changes on the pod.
        let full = pod_with(&[(
            "example.com/notes",
            &"x".repeat(publish::ANNOTATIONS_MAX - 20),
        )]);
        let mut outbox = Outbox::new(Duration::from_secs(10), now);
        outbox.attach(|| publisher(&full), &full);
        outbox.want(want(&[
            (keys::HEALTH, Some("degraded")),
            (keys::GPU_COUNT, Some("4")),
        ]));
        assert!(outbox.changes().is_empty());
        assert_eq!(reasons(&outbox), ["AnnotationsTooLarge"]);
        let note = &outbox.queued().next().unwrap().note;
        assert!(
            note.starts_with(
                "cannot update trainlet's annotations on this pod: the pod's annotations would take"
            ),
            "{note}"
        );
    }
}
