//! The recorder: every Event the agent sends, whichever role sends it, goes through
//! [`Recorder::record`] (the agent's one entry is `Engine::record`, which also counts
//! it and, in exec handing over, leaves it to the sidecar). It queues the Event, holds
//! the rate ([`EventBudget`]: a burst, then a trickle) when sending, and sums up what
//! the rate dropped, by reason, in the log and in `trainlet_events_dropped_total`.
//! Repeats are kept out before an Event gets here: a report's transitions
//! (`transitions.rs`) announce each change of what the annotations say once.
//!
//! kube-runtime's own recorder is not used: it folds Events of one reason into a series
//! that keeps the first note, where each OOM kill or conflict is a fact of its own.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::event::Event;
use crate::metrics::{Metrics, ReasonLabel};
use crate::publish::{self, API_TIMEOUT, EventBudget, Publisher, TokenBucket};
use crate::reason::Reason;

/// How often a summary of the Events dropped is logged.
const DROP_LOG_EVERY: Duration = Duration::from_secs(60);

/// The Events still to send, and the rate they go out at.
pub struct Recorder {
    queue: VecDeque<Event>,
    budget: TokenBucket,
    /// Events dropped since the last summary, by reason.
    dropped: BTreeMap<Reason, u64>,
    dropped_since: Instant,
}

impl Recorder {
    pub fn new(now: Instant) -> Recorder {
        Recorder {
            queue: VecDeque::new(),
            budget: EventBudget::bucket(now),
            dropped: BTreeMap::new(),
            dropped_since: now,
        }
    }

    /// Queues an Event.
    pub fn record(&mut self, event: Event) {
        self.queue.push_back(event);
    }

    /// The Events not sent yet, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = &Event> {
        self.queue.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Sends the queued Events in order, each bounded by [`API_TIMEOUT`]; beyond the
    /// rate, an Event is dropped and counted. On a failure the rest stay queued, and
    /// the error says which Event failed.
    pub async fn send(&mut self, publisher: &Publisher, metrics: &Metrics) -> Result<(), String> {
        while let Some(event) = self.queue.front().cloned() {
            if !self.budget.take(Instant::now()) {
                self.drop_event(&event, metrics);
                self.queue.pop_front();
                continue;
            }
            let reason = event.reason;
            match tokio::time::timeout(API_TIMEOUT, publisher.event(&event)).await {
                Ok(Ok(())) => {
                    self.queue.pop_front();
                }
                Ok(Err(e)) => return Err(format!("could not emit the {reason} Event: {e}")),
                Err(_) => {
                    return Err(format!(
                        "could not emit the {reason} Event: no answer within {API_TIMEOUT:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Counts a dropped Event. The log says so once per reason and minute, with the
    /// note cut short, and then sums up: the notes may come from the training container,
    /// which must not be able to fill the log through them.
    fn drop_event(&mut self, event: &Event, metrics: &Metrics) {
        let reason = event.reason.as_str();
        metrics
            .events_dropped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
        let now = Instant::now();
        if now.duration_since(self.dropped_since) >= DROP_LOG_EVERY {
            self.log_dropped();
            self.dropped_since = now;
        }
        let n = self.dropped.entry(event.reason).or_insert(0);
        *n += 1;
        if *n == 1 {
            warn!(
                reason,
                "too many Events; dropping this one and, for a while, others: {}",
                publish::truncate(&event.note, 160)
            );
        }
    }

    fn log_dropped(&mut self) {
        if self.dropped.values().sum::<u64>() > 1 {
            let by: Vec<String> = self
                .dropped
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            warn!("dropped Events in the last minute: {}", by.join(", "));
        }
        self.dropped.clear();
    }
}
