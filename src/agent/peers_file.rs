//! The engine's two ends of `peers.json` ([`crate::peerchange::file`]): the
//! sidecar says where the cluster stands and moves the files for a waiting exec; exec,
//! without API credentials, learns of a peer change from it and restarts from the moved
//! files.

use std::path::{Path, PathBuf};

use crate::cluster::drift::ClusterStatus;
use crate::peerchange::file::{self as peers, PeersState};
use crate::peerchange::protocol::{ExecWait, Relay};
use crate::stall::group::{PeerFailure, PeerRun};
use crate::stall::peers::PeerStall;

/// The sidecar's end.
pub(super) struct Outgoing {
    pub dir: PathBuf,
    /// What was written last.
    pub written: Option<PeersState>,
    /// The sidecar's side of the exchange ([`crate::peerchange::protocol`]).
    pub relay: Relay,
    /// The last write failed (logged once).
    pub failed: bool,
}

impl Outgoing {
    /// Next to `cluster.json`; the generation goes on from the file a sidecar before
    /// this one left.
    pub fn new(cluster_file: &Path) -> Option<Outgoing> {
        let dir = cluster_file.parent()?.to_path_buf();
        let generation = peers::read(&dir).map_or(0, |s| s.generation);
        Some(Outgoing {
            dir,
            written: None,
            relay: Relay::new(generation),
            failed: false,
        })
    }
}

/// exec's end.
pub(super) struct Incoming {
    dir: PathBuf,
    watch: Option<crate::watch::FileWatch>,
    pub state: Option<PeersState>,
}

impl Incoming {
    pub fn new(dir: PathBuf) -> Incoming {
        Incoming {
            dir,
            watch: None,
            state: None,
        }
    }

    /// Reads the file again; returns whether the state changed.
    pub fn read(&mut self) -> bool {
        let state = peers::read(&self.dir);
        let changed = state != self.state;
        self.state = state;
        changed
    }

    /// Where the cluster stands, as the sidecar last said.
    pub fn status(&self) -> Option<ClusterStatus> {
        self.state.as_ref().map(|s| s.cluster.clone())
    }

    /// A wait for the moved files, from the state exec sees now.
    pub fn wait(&self) -> ExecWait {
        ExecWait {
            before: self.state.as_ref().map_or(0, |s| s.generation),
        }
    }

    /// The sidecar answered `wait`.
    pub fn over(&self, wait: &ExecWait) -> bool {
        self.state
            .as_ref()
            .is_some_and(|s| wait.over(s.generation, s.is_current()))
    }

    /// The peers the sidecar reports stalled.
    pub fn stalled(&self) -> Vec<PeerStall> {
        self.state
            .iter()
            .flat_map(|s| &s.stalled)
            .map(|p| PeerStall {
                pod: p.pod.clone(),
                since: crate::time::from_ms(p.since_ms),
                ongoing: p.ongoing,
            })
            .collect()
    }

    /// The peers the sidecar reports failed, asking for a restart.
    pub fn failures(&self) -> Vec<PeerFailure> {
        self.state
            .iter()
            .flat_map(|s| &s.failed)
            .map(|p| PeerFailure {
                pod: p.pod.clone(),
                since: crate::time::from_ms(p.since_ms),
                note: crate::publish::truncate(&p.note, crate::stall::peers::MAX_FAILURE_NOTE),
            })
            .collect()
    }

    /// The peers' runs of CMD, as the sidecar sees them.
    pub fn runs(&self) -> Vec<PeerRun> {
        self.state
            .iter()
            .flat_map(|s| &s.runs)
            .map(|p| PeerRun {
                pod: p.pod.clone(),
                started: crate::time::from_ms(p.started_ms),
                down: p.down,
            })
            .collect()
    }

    /// The latest progress another pod published, as the sidecar sees it.
    pub fn peer_progress(&self) -> Option<std::time::SystemTime> {
        let ms = self.state.as_ref()?.progress_ms?;
        Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
    }

    /// Wakes on a new version of the file; without inotify, exec reads it every
    /// `--interval`.
    pub fn watch(&mut self) {
        self.watch = crate::watch::entry_or_poll(&self.dir, peers::FILE);
    }
}

/// The next new version of `peers.json`, or never without a watch.
pub(super) async fn next_state(incoming: &mut Option<Incoming>) -> Option<()> {
    match incoming.as_mut() {
        Some(i) => crate::watch::woken(&mut i.watch).await,
        None => std::future::pending().await,
    }
}
