//! Where this process learns how the cluster stands, whichever way its role has: its
//! own peer watch (the sidecar, exec with credentials) or the sidecar's `peers.json`
//! (exec handing over). Everything that acts on the cluster — a peer change, a peer's
//! stall, the job's progress — reads it through one [`ClusterView`].

use std::time::SystemTime;

use super::Engine;
use super::peers_file::Incoming;
use crate::cluster::drift::ClusterStatus;
use crate::peers::drift::PeerWatch;
use crate::stall::peers::PeerStall;

/// The view this process has.
pub(super) enum ClusterView<'a> {
    Watch(&'a PeerWatch),
    File(&'a Incoming),
}

impl ClusterView<'_> {
    /// Where the tasks stand, once known (the watch's first list, the sidecar's first
    /// word).
    pub fn status(&self) -> Option<ClusterStatus> {
        match self {
            ClusterView::Watch(w) => w.drift.as_deref().map(ClusterStatus::of),
            ClusterView::File(f) => f.status(),
        }
    }

    /// The peers that published a stall.
    pub fn stalled(&self) -> Vec<PeerStall> {
        match self {
            ClusterView::Watch(w) => w.stalled(),
            ClusterView::File(f) => f.stalled(),
        }
    }

    /// The latest progress another pod of the job published (`own` is this pod).
    pub fn peer_progress(&self, own: Option<&str>) -> Option<SystemTime> {
        match self {
            ClusterView::Watch(w) => w.latest_progress(own),
            ClusterView::File(f) => f.peer_progress(),
        }
    }
}

impl Engine {
    /// The cluster as this process sees it: `peers.json` handing over, else the own
    /// peer watch; `None` without a resolved cluster.
    pub(super) fn cluster_view(&self) -> Option<ClusterView<'_>> {
        match (&self.peers_in, &self.peers) {
            (Some(f), _) => Some(ClusterView::File(f)),
            (None, Some(w)) => Some(ClusterView::Watch(w)),
            _ => None,
        }
    }
}
