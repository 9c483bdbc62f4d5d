//! The handover's other direction: the sidecar tells `trainlet exec`, which holds no API
//! credentials, where the cluster stands.
//!
//! The sidecar watches the peers ([`crate::cluster::drift`]) and writes `peers.json`
//! next to the cluster files it shares with the training container (init's output
//! directory, which the training container only reads): the `trainlet.io/cluster` text
//! and a generation. When exec (`--on-peer-change restart`) has stopped CMD and waits
//! (its observation says so) and every task has a live pod again, the sidecar moves the
//! files to the replacements' addresses ([`crate::render::rehost`]), then writes a
//! higher generation, `current`: exec starts CMD again from the new files.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cluster::drift::{ANNOTATION_MAX, ClusterStatus};
use crate::handover::file;
use crate::render::{self, OutputError};
use crate::stall::group::{PeerFailure, PeerRun};
use crate::stall::peers::PeerStall;

/// The file's name, in init's output directory.
pub const FILE: &str = render::PEERS_FILE;
/// The format's version.
pub const VERSION: u32 = 1;
/// The largest file read: `cluster` holds what `trainlet.io/cluster` does, at most
/// [`ANNOTATION_MAX`] bytes, JSON-escaped; the failures' notes and the runs, their
/// names of at most 253 bytes.
const MAX_BYTES: usize =
    4 * ANNOTATION_MAX + MAX_STALLED * 2 * crate::stall::peers::MAX_FAILURE_NOTE + MAX_RUNS * 320;

/// Where the cluster stands, as the sidecar's peer watch sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeersState {
    pub version: u32,
    /// Raised each time the sidecar has moved the files for a waiting exec.
    pub generation: u64,
    /// `current`, or `stale: …`, as `trainlet.io/cluster`.
    pub cluster: ClusterStatus,
    /// The peers that publish a stall (`trainlet.io/progress`), for exec's
    /// `--on-stall restart`: at most [`MAX_STALLED`], the earliest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stalled: Vec<StalledPeer>,
    /// The latest progress another pod of the job published (ms since the epoch), for
    /// the stall rule of the pod that speaks for the job's silence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_ms: Option<u64>,
    /// The peers that publish a failure that asks for a restart, for exec's
    /// `--on-failure restart`: at most [`MAX_STALLED`], the earliest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedPeer>,
    /// The peers' runs of CMD, for the restart barrier: at most [`MAX_RUNS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<PeerRunState>,
}

/// The most runs `peers.json` lists: the barrier of a larger job waits out its timeout
/// for the peers past them (a coordinated job's followers see the resolver pod alone).
pub const MAX_RUNS: usize = 256;

/// A peer's failure: since when (ms since the epoch), and its note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedPeer {
    pub pod: String,
    pub since_ms: u64,
    pub note: String,
}

/// A peer's run of CMD: when it started (ms since the epoch), and whether it is
/// stopped for a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRunState {
    pub pod: String,
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub down: bool,
}

/// The most stalled peers `peers.json` lists: exec acts on the earliest.
pub const MAX_STALLED: usize = 16;

/// A peer that made no progress, since when (ms since the epoch), and whether it still
/// makes none (a stall that ended is listed too: exec restarts once for it even if it
/// saw only the end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StalledPeer {
    pub pod: String,
    pub since_ms: u64,
    #[serde(default)]
    pub ongoing: bool,
}

impl PeersState {
    pub fn is_current(&self) -> bool {
        self.cluster.is_current()
    }

    /// The peers the sidecar reports stalled.
    pub fn stalled(&self) -> Vec<PeerStall> {
        self.stalled
            .iter()
            .map(|p| PeerStall {
                pod: p.pod.clone(),
                since: crate::time::from_ms(p.since_ms),
                ongoing: p.ongoing,
            })
            .collect()
    }

    /// The peers the sidecar reports failed, asking for a restart.
    pub fn failures(&self) -> Vec<PeerFailure> {
        self.failed
            .iter()
            .map(|p| PeerFailure {
                pod: p.pod.clone(),
                since: crate::time::from_ms(p.since_ms),
                note: crate::publish::truncate(&p.note, crate::stall::peers::MAX_FAILURE_NOTE),
            })
            .collect()
    }

    /// The peers' runs of CMD, as the sidecar sees them.
    pub fn runs(&self) -> Vec<PeerRun> {
        self.runs
            .iter()
            .map(|p| PeerRun {
                pod: p.pod.clone(),
                started: crate::time::from_ms(p.started_ms),
                down: p.down,
            })
            .collect()
    }

    /// The latest progress another pod published, as the sidecar sees it.
    pub fn peer_progress(&self) -> Option<std::time::SystemTime> {
        Some(crate::time::from_ms(self.progress_ms?))
    }
}

/// Writes the state atomically.
pub fn write(dir: &Path, s: &PeersState) -> Result<(), OutputError> {
    let json = serde_json::to_vec(s).expect("plain data");
    file::write(dir, FILE, &json)
}

/// Reads the state, bounded and guarded as the other handover file
/// ([`file::read_bounded`]); `None` when there is none (yet) or it is not one, which
/// exec treats as "nothing known": it keeps CMD running.
pub fn read(dir: &Path) -> Option<PeersState> {
    let (bytes, _) = file::read_bounded(&dir.join(FILE), MAX_BYTES).ok()??;
    serde_json::from_slice::<PeersState>(&bytes)
        .ok()
        .filter(|s| s.version == VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_round_trips_and_anything_else_is_nothing_known() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        let s = PeersState {
            version: VERSION,
            generation: 2,
            cluster: ClusterStatus::Stale("stale: worker/1 10.0.0.7 → none".into()),
            stalled: vec![StalledPeer {
                pod: "w-2".into(),
                since_ms: 1_000,
                ongoing: true,
            }],
            progress_ms: Some(900),
            failed: vec![FailedPeer {
                pod: "w-1".into(),
                since_ms: 950,
                note: "pod w-1 (worker/1, rank 1): python exited with code 3".into(),
            }],
            runs: vec![PeerRunState {
                pod: "w-1".into(),
                started_ms: 500,
                down: true,
            }],
        };
        write(dir.path(), &s).unwrap();
        assert_eq!(read(dir.path()), Some(s.clone()));
        assert!(!s.is_current());
        std::fs::write(
            dir.path().join(FILE),
            r#"{"version":2,"generation":1,"cluster":"current"}"#,
        )
        .unwrap();
        assert_eq!(read(dir.path()), None);
    }
}
