//! One Event as trainlet sends it: its type, its [`Reason`] (a contract, spelled once in
//! `reason.rs`) and its note. Every part of trainlet that tells of something builds
//! this value, never a `(reason, note)` pair of strings, so that what is sent and what
//! the tests assert are the same typed thing; the agent sends each through one
//! recorder (`report::recorder`), the init workflow through its publisher.

use crate::reason::Reason;

/// `type` of a Kubernetes Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    /// The type as the API server stores it.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One Event. Its `action` on the API server is its reason: what trainlet did is to
/// tell of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    pub reason: Reason,
    pub note: String,
}

impl Event {
    /// A Warning: something a person or an alert should look at.
    pub fn warning(reason: Reason, note: impl Into<String>) -> Event {
        Event {
            type_: EventType::Warning,
            reason,
            note: note.into(),
        }
    }

    /// A Normal Event: the job's progress (the cluster resolved).
    pub fn normal(reason: Reason, note: impl Into<String>) -> Event {
        Event {
            type_: EventType::Normal,
            reason,
            note: note.into(),
        }
    }
}

/// In tests, an Event compares with `(reason, note)` as the API server stores them:
/// what a test asserts is what a person reads in `kubectl get events`.
#[cfg(test)]
impl PartialEq<(&str, String)> for Event {
    fn eq(&self, (reason, note): &(&str, String)) -> bool {
        self.reason.as_str() == *reason && self.note == *note
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_carries_its_type_reason_and_note() {
        let e = Event::warning(Reason::OomKill, "process python was OOM-killed");
        assert_eq!(
            (e.type_.as_str(), e.reason.as_str(), e.note.as_str()),
            ("Warning", "OOMKill", "process python was OOM-killed")
        );
        let r = Event::normal(Reason::PeersResolved, "worker-0 of 2");
        assert_eq!(r.type_.as_str(), "Normal");
    }
}
