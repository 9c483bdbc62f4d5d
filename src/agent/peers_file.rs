//! The engine's two ends of `peers.json` ([`crate::peerchange::file`]): the
//! sidecar says where the cluster stands and moves the files for a waiting exec; exec,
//! without API credentials, learns of a peer change from it and restarts from the moved
//! files.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tracing::{info, warn};

use super::Engine;
use crate::cluster::drift::{self, ClusterStatus};
use crate::flags;
use crate::peerchange::file::{self as peers, MAX_STALLED, PeersState, StalledPeer, VERSION};
use crate::peerchange::protocol::{ExecWait, Relay, Waiting};
use crate::render;
use crate::stall::peers::PeerStall;

/// The sidecar's end.
pub(super) struct Outgoing {
    dir: PathBuf,
    written: Option<PeersState>,
    /// The sidecar's side of the exchange ([`crate::peerchange::protocol`]).
    pub relay: Relay,
    /// The last write failed (logged once).
    failed: bool,
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

impl Engine {
    /// When exec waits for the cluster after stopping CMD and every task has a live pod
    /// again: moves the cluster files to the replacements (the watch still sees them as
    /// replacements) and answers exec's wait. True when files moved and the watch must
    /// reload them.
    fn move_for_restart(&mut self) -> bool {
        let (Some(out), Some(watch), Some(_)) = (
            self.peers_out.as_mut(),
            self.peers.as_mut(),
            self.cfg.cluster_file.as_deref(),
        ) else {
            return false;
        };
        let Some(drift) = watch.drift.as_deref() else {
            return false;
        };
        let waiting = self
            .inbox
            .as_ref()
            .and_then(|i| i.fresh(SystemTime::now()))
            .and_then(|o| {
                let r = o.restart.as_ref().filter(|r| r.waiting)?;
                Some(Waiting {
                    epoch: o.epoch.clone(),
                    restart: r.restarts,
                })
            });
        let Some(answer) = out.relay.to_answer(waiting, drift::moves(drift)) else {
            return false;
        };
        let moved = &answer.moves;
        if !moved.is_empty() {
            if let Err(e) = render::rehost_outputs(&out.dir, moved, watch.generation) {
                warn!("cannot move the cluster files to the replacements: {e}");
                return false;
            }
            let tasks: Vec<String> = moved
                .iter()
                .map(|m| format!("{} {} → {}", m.task, m.host.from, m.host.to))
                .collect();
            info!(moved = ?tasks, dir = %out.dir.display(), "moved the cluster files to the replacements for trainlet exec's restart");
        }
        let any = !moved.is_empty();
        out.relay.answered(answer);
        any
    }

    /// Sidecar: tells exec where the cluster stands; when exec has stopped CMD and
    /// waits, and every task has a live pod again, first moves the files to the
    /// replacements and reloads the watch, then says `current` with a higher generation.
    /// The replacements are evaluated (announced: PeerReplaced) before the reload makes
    /// them current, also when they came while exec was already waiting.
    pub(super) fn tell_exec(&mut self) {
        if self.move_for_restart() {
            self.evaluate();
            if let (Some(watch), Some(cluster_file)) =
                (self.peers.as_mut(), self.cfg.cluster_file.as_deref())
            {
                watch.reload(cluster_file);
            }
        }
        let (Some(out), Some(watch)) = (self.peers_out.as_mut(), self.peers.as_mut()) else {
            return;
        };
        if self.cfg.cluster_file.is_none() || watch.drift.is_none() {
            return;
        }
        // The own pod's stall is exec's own to see: only the others' are passed on.
        let own = self.view.pod.as_ref().and_then(|p| p.metadata.name.clone());
        let stalled: Vec<StalledPeer> = watch
            .stalled()
            .into_iter()
            .filter(|s| Some(&s.pod) != own.as_ref())
            .take(MAX_STALLED)
            .map(|s| StalledPeer {
                since_ms: crate::time::to_ms(s.since),
                pod: s.pod,
                ongoing: s.ongoing,
            })
            .collect();
        // A restart exec makes for a peer's stall is one this sidecar told it of.
        out.relay.told(false, !stalled.is_empty());
        let state = PeersState {
            version: VERSION,
            generation: out.relay.generation,
            cluster: drift::ClusterStatus::of(watch.drift.as_deref().unwrap_or_default()),
            stalled,
            progress_ms: watch
                .latest_progress(own.as_deref())
                .map(crate::time::to_ms),
        };
        if out.written.as_ref() != Some(&state) {
            match peers::write(&out.dir, &state) {
                Ok(()) => {
                    // exec's next restart answers this.
                    out.relay.told(!state.is_current(), false);
                    out.written = Some(state);
                    out.failed = false;
                }
                Err(e) if !out.failed => {
                    warn!(
                        "cannot tell trainlet exec where the cluster stands: {e} (mount init's volume writable in the sidecar, as inject --{} does)",
                        flags::WRAP
                    );
                    out.failed = true;
                }
                Err(_) => {}
            }
        }
    }
}
