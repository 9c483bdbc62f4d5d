//! The endpoint's connections, at most [`Connections::new`]'s `max` at once, so that
//! no one connection waits for another and what is connected cannot starve the
//! trainer: each connection is served by a task of its own, and when all places are
//! taken a new connection takes the place of the oldest one that has not shown the
//! token yet (idle, in its handshake, or sending its headers). Only a caller with the
//! token holds its place; it spends the rate limit too, so there are never many.
//! Any process that can reach loopback (on a `hostNetwork` pod, any on the node) can
//! connect: whatever it holds open is what a new connection evicts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The places, oldest first.
pub struct Connections {
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    live: VecDeque<Live>,
}

struct Live {
    id: u64,
    trusted: Arc<AtomicBool>,
    /// Dropped to evict: the connection's [`Slot::evicted`] then resolves.
    _evict: oneshot::Sender<()>,
}

/// One connection's place: it frees the place when dropped.
pub struct Slot {
    id: u64,
    trusted: Arc<AtomicBool>,
    connections: Arc<Connections>,
    /// Resolves when a newer connection took the place: the connection ends.
    pub evicted: oneshot::Receiver<()>,
}

impl Connections {
    pub fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// A place for a new connection: free, or the oldest untrusted one's, which is
    /// told to end. `None` when every place is held by a caller with the token.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut inner = self.inner.lock().ok()?;
        if inner.live.len() >= self.max {
            let oldest = inner
                .live
                .iter()
                .position(|l| !l.trusted.load(Ordering::Relaxed))?;
            inner.live.remove(oldest);
        }
        let (tx, rx) = oneshot::channel();
        let trusted = Arc::new(AtomicBool::new(false));
        let id = inner.next;
        inner.next += 1;
        inner.live.push_back(Live {
            id,
            trusted: trusted.clone(),
            _evict: tx,
        });
        Some(Slot {
            id,
            trusted,
            connections: self.clone(),
            evicted: rx,
        })
    }

    /// Connections that hold a place now.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.live.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Slot {
    /// What marks the connection's caller as one with the token: it holds its place.
    pub fn trust(&self) -> Trust {
        Trust(self.trusted.clone())
    }
}

/// Marks one connection as trusted ([`Slot::trust`]).
#[derive(Clone)]
pub struct Trust(Arc<AtomicBool>);

impl Trust {
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.connections.inner.lock() {
            inner.live.retain(|l| l.id != self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot::error::TryRecvError;

    fn evicted(s: &mut Slot) -> bool {
        s.evicted.try_recv() == Err(TryRecvError::Closed)
    }

    #[test]
    fn a_new_connection_takes_the_oldest_untrusted_place() {
        let c = Connections::new(3);
        let mut a = c.admit().unwrap();
        let mut b = c.admit().unwrap();
        let mut d = c.admit().unwrap();
        a.trust().set();
        assert_eq!(c.len(), 3);
        let mut e = c.admit().unwrap();
        assert_eq!(
            [evicted(&mut a), evicted(&mut b), evicted(&mut d)],
            [false, true, false]
        );
        assert_eq!(c.len(), 3);
        let mut f = c.admit().unwrap();
        assert_eq!(
            [evicted(&mut a), evicted(&mut d), evicted(&mut e)],
            [false, true, false]
        );
        drop((b, d));
        assert_eq!(c.len(), 3, "an evicted slot's drop frees no other place");
        assert!(!evicted(&mut f));
    }

    #[test]
    fn trusted_callers_keep_their_places_and_a_dropped_slot_frees_one() {
        let c = Connections::new(2);
        let a = c.admit().unwrap();
        let b = c.admit().unwrap();
        a.trust().set();
        b.trust().set();
        assert!(c.admit().is_none());
        drop(a);
        assert_eq!(c.len(), 1);
        let _g = c.admit().unwrap();
        assert_eq!(c.len(), 2);
        drop(b);
        assert_eq!(c.len(), 1);
    }
}
