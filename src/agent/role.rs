//! Which of the two long-running processes this is, and what each owns: decided once
//! ([`Role::new`]), from `--observations` and `cluster.json`. Every part of the agent
//! that differs by role matches on [`Role`] or asks it; no field of the engine stands
//! for a role by being set or not, and no flag is read again.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::config::{ExecConfig, RoleConfig, SidecarConfig};
use super::input::Input;
use super::{Config, Engine, Mode, group, observations};
use crate::cluster::drift::ClusterStatus;
use crate::peerchange::file::{self as peers, PeersState};
use crate::peerchange::protocol::{ExecWait, Relay as PeerRelay};
use crate::peers::drift::{self as peer_watch, PeerWatch};
use crate::stall::group::{PeerFailure, PeerRun};
use crate::stall::peers::PeerStall;
use crate::stall::watching::Watching;
use crate::supervise::policy::{OnFailure, OnPeerChange, OnStall};

/// The agent's role, with the parts only that role has. A process has one, made once
/// and never moved: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Role {
    /// `trainlet sidecar`: publishes for the pod.
    Sidecar(Sidecar),
    /// `trainlet exec --report`, beside CMD.
    Exec(Exec),
}

/// The sidecar's own parts.
pub(super) struct Sidecar {
    /// Its own flags.
    pub cfg: SidecarConfig,
    /// The peers of the resolved cluster (`cluster.json`), watched through the API
    /// server; `None` without a resolved cluster.
    pub peers: Option<PeerWatch>,
    /// Where the training container's exec hands over (`--observations`).
    pub relay: Option<Relay>,
}

/// The sidecar's end of the handover: exec's observations in, and, with `cluster.json`,
/// where the cluster stands out (`peers.json`, and the files moved for a restart).
pub(super) struct Relay {
    pub inbox: observations::Inbox,
    pub peers_out: Option<PeersOut>,
}

/// exec's own parts.
pub(super) struct Exec {
    /// Its own flags.
    pub cfg: ExecConfig,
    /// CMD's progress and stalls (`--stall-after`, `--progress-pattern`).
    pub watching: Option<Watching>,
    /// The run of CMD, published for the group restart of a failed CMD.
    pub group: group::GroupRun,
    /// The restarts of CMD so far, published with its progress.
    pub restarts: u64,
    /// Where CMD's ranks were at the last capture of their stacks, and the socket a
    /// person asks for a capture through.
    pub stacks: super::stall::Stacks,
    /// How exec reaches the API server.
    pub reach: Reach,
}

/// How exec reaches the API server.
pub(super) enum Reach {
    /// With the pod's credentials: it publishes, watches its peers and resolves again
    /// after a peer change itself.
    Credentials { peers: Option<PeerWatch> },
    /// Without them (`--observations`): it hands its observations to the sidecar and,
    /// where a peer's change, stall or failure acts on CMD, learns of its peers from
    /// the sidecar's `peers.json` (`peers_in`).
    HandOver {
        outgoing: observations::Outgoing,
        peers_in: Option<Incoming>,
    },
}

impl Role {
    /// The one decision, and each role's parts made.
    pub fn new(cfg: &Config, own: RoleConfig, started: SystemTime) -> Role {
        let cluster_file = cfg.cluster_file.as_deref();
        let peers = || cluster_file.and_then(PeerWatch::load);
        match own {
            RoleConfig::Sidecar(own) => Role::Sidecar(Sidecar {
                peers: peers(),
                relay: own.observations.clone().map(|dir| Relay {
                    inbox: observations::Inbox::new(dir),
                    peers_out: cluster_file.and_then(PeersOut::new),
                }),
                cfg: own,
            }),
            RoleConfig::Exec(own) => Role::Exec(Exec {
                watching: own
                    .progress
                    .as_ref()
                    .map(|p| Watching::new(p, cluster_file, started)),
                group: group::GroupRun::new(own.restart.on_failure, cluster_file, started),
                restarts: 0,
                stacks: super::stall::Stacks::default(),
                reach: match own.observations.clone() {
                    None => Reach::Credentials { peers: peers() },
                    Some(dir) => Reach::HandOver {
                        outgoing: observations::Outgoing::new(dir, started),
                        peers_in: peers_in(cluster_file, &own),
                    },
                },
                cfg: own,
            }),
        }
    }

    /// The sidecar's own parts.
    pub fn sidecar(&self) -> Option<&Sidecar> {
        match self {
            Role::Sidecar(s) => Some(s),
            Role::Exec(_) => None,
        }
    }

    pub fn mode(&self) -> Mode {
        match self {
            Role::Sidecar(_) => Mode::Sidecar,
            Role::Exec(_) => Mode::Exec,
        }
    }

    pub fn exec(&self) -> Option<&Exec> {
        match self {
            Role::Exec(e) => Some(e),
            Role::Sidecar(_) => None,
        }
    }

    pub fn exec_mut(&mut self) -> Option<&mut Exec> {
        match self {
            Role::Exec(e) => Some(e),
            Role::Sidecar(_) => None,
        }
    }

    /// The peer watch of the sidecar, or of exec with credentials.
    pub fn peers(&self) -> Option<&PeerWatch> {
        match self {
            Role::Sidecar(s) => s.peers.as_ref(),
            Role::Exec(Exec {
                reach: Reach::Credentials { peers },
                ..
            }) => peers.as_ref(),
            Role::Exec(_) => None,
        }
    }

    pub fn peers_mut(&mut self) -> Option<&mut PeerWatch> {
        self.peers_slot().and_then(Option::as_mut)
    }

    /// Where the peer watch is kept, in the roles that watch the peers.
    fn peers_slot(&mut self) -> Option<&mut Option<PeerWatch>> {
        match self {
            Role::Sidecar(s) => Some(&mut s.peers),
            Role::Exec(Exec {
                reach: Reach::Credentials { peers },
                ..
            }) => Some(peers),
            Role::Exec(_) => None,
        }
    }

    /// The new cluster is the one to watch from now on, from a fresh list.
    pub fn reload_peers(&mut self, cluster_file: Option<&Path>) {
        if let Some(slot) = self.peers_slot() {
            *slot = cluster_file.and_then(PeerWatch::load);
        }
    }

    /// exec handing over: what it hands to the sidecar.
    pub fn outgoing(&self) -> Option<&observations::Outgoing> {
        match self {
            Role::Exec(Exec {
                reach: Reach::HandOver { outgoing, .. },
                ..
            }) => Some(outgoing),
            _ => None,
        }
    }

    pub fn outgoing_mut(&mut self) -> Option<&mut observations::Outgoing> {
        match self {
            Role::Exec(Exec {
                reach: Reach::HandOver { outgoing, .. },
                ..
            }) => Some(outgoing),
            _ => None,
        }
    }

    /// exec without credentials.
    pub fn hands_over(&self) -> bool {
        self.outgoing().is_some()
    }

    /// exec handing over: what the sidecar tells of the peers.
    pub fn peers_in(&self) -> Option<&Incoming> {
        match self {
            Role::Exec(Exec {
                reach: Reach::HandOver { peers_in, .. },
                ..
            }) => peers_in.as_ref(),
            _ => None,
        }
    }

    pub fn peers_in_mut(&mut self) -> Option<&mut Incoming> {
        match self {
            Role::Exec(Exec {
                reach: Reach::HandOver { peers_in, .. },
                ..
            }) => peers_in.as_mut(),
            _ => None,
        }
    }

    /// The sidecar of an exec that hands over: exec's observations.
    pub fn inbox(&self) -> Option<&observations::Inbox> {
        match self {
            Role::Sidecar(Sidecar { relay: Some(r), .. }) => Some(&r.inbox),
            _ => None,
        }
    }

    pub fn inbox_mut(&mut self) -> Option<&mut observations::Inbox> {
        match self {
            Role::Sidecar(Sidecar { relay: Some(r), .. }) => Some(&mut r.inbox),
            _ => None,
        }
    }

    /// The sidecar of an exec that hands over, with `cluster.json`: its `peers.json`.
    pub fn peers_out_mut(&mut self) -> Option<&mut PeersOut> {
        match self {
            Role::Sidecar(Sidecar { relay: Some(r), .. }) => r.peers_out.as_mut(),
            _ => None,
        }
    }

    /// The next wake-up from what this role owns: a peer event, the sidecar's
    /// `peers.json` (exec handing over), exec's observation (the sidecar relaying), a
    /// person asking exec for CMD's stacks (`trainlet stacks`).
    /// Pending for ever where the role owns none of them.
    pub async fn next(&mut self) -> Input {
        match self {
            Role::Sidecar(Sidecar { peers, relay, .. }) => {
                let inbox = &mut relay.as_mut().map(|r| &mut r.inbox);
                tokio::select! {
                    Some((i, ev)) = peer_watch::next_event(peers) => Input::Peer(i, ev),
                    Some(()) = observations::next_version(inbox) => Input::Observations,
                    else => std::future::pending().await,
                }
            }
            Role::Exec(Exec { reach, stacks, .. }) => {
                let asked = super::stall::next_ask(&mut stacks.asked);
                match reach {
                    Reach::Credentials { peers } => tokio::select! {
                        Some((i, ev)) = peer_watch::next_event(peers) => Input::Peer(i, ev),
                        stream = asked => Input::StacksAsked(stream),
                    },
                    Reach::HandOver { peers_in, .. } => tokio::select! {
                        Some(()) = next_state(peers_in) => Input::PeersFile,
                        stream = asked => Input::StacksAsked(stream),
                    },
                }
            }
        }
    }
}

/// Where exec, handing over, reads what the sidecar tells of its peers (peers.json):
/// when a peer's change, stall or failure acts on CMD, or the stall rule reads the
/// peers' progress.
fn peers_in(cluster_file: Option<&Path>, own: &ExecConfig) -> Option<Incoming> {
    let f = cluster_file?;
    let hears = own.restart.on_change != OnPeerChange::Report
        || own.restart.on_stall != OnStall::Report
        || own.restart.on_failure == OnFailure::Restart
        || own
            .progress
            .as_ref()
            .is_some_and(|p| p.stall_after.is_some());
    hears
        .then(|| f.parent())
        .flatten()
        .map(|d| Incoming::new(d.to_path_buf()))
}

// ---------------------------------------------------------------------------------
// What the role's own inputs do: a peer's event (the peer watch), a new `peers.json`
// (exec handing over), new observations (the sidecar). A change refreshes the pod's
// view: the sidecar tells exec, the report is evaluated again, exec hands over.

impl Engine {
    /// A wake-up from what the role owns (`Role::next`): a peer event, the
    /// sidecar's peers.json, exec's observation; a new report when it changed where
    /// the tasks stand or what exec observed.
    pub(super) fn on_role_input(&mut self, input: Input) {
        let changed = match input {
            Input::Peer(i, ev) => self.role.peers_mut().is_some_and(|p| p.on_event(i, ev)),
            Input::PeersFile => self.role.peers_in_mut().is_some_and(|p| p.read()),
            Input::Observations => self.read_observations(),
            Input::StacksAsked(stream) => {
                self.answer_stacks(stream);
                false
            }
            _ => false,
        };
        if changed {
            self.refresh();
        }
    }

    /// exec: reads the sidecar's peers.json; a new report when it changed.
    pub(super) fn on_peers_file(&mut self) {
        self.on_role_input(Input::PeersFile);
    }

    /// After anything changed, in this order: the sidecar tells exec where the cluster
    /// stands (and, when exec waits for the replacements, first moves the cluster files
    /// to them); the report is computed from the observations, which touches no file;
    /// exec hands its observations to the sidecar.
    pub(super) fn refresh(&mut self) {
        if self.role.mode() == Mode::Sidecar {
            self.tell_exec();
        }
        self.evaluate();
        self.hand_over(None);
    }
}

/// The sidecar's end of `peers.json` ([`crate::peerchange::file`]): it says where the
/// cluster stands and moves the files for a waiting exec.
pub(super) struct PeersOut {
    pub dir: PathBuf,
    /// What was written last.
    pub written: Option<PeersState>,
    /// The sidecar's side of the exchange ([`crate::peerchange::protocol`]).
    pub relay: PeerRelay,
    /// The last write failed (logged once).
    pub failed: bool,
}

impl PeersOut {
    /// Next to `cluster.json`; the generation goes on from the file a sidecar before
    /// this one left.
    pub fn new(cluster_file: &Path) -> Option<PeersOut> {
        let dir = cluster_file.parent()?.to_path_buf();
        let generation = peers::read(&dir).map_or(0, |s| s.generation);
        Some(PeersOut {
            dir,
            written: None,
            relay: PeerRelay::new(generation),
            failed: false,
        })
    }
}

/// exec's end of `peers.json` ([`crate::peerchange::file`]): exec, without API
/// credentials, learns of a peer change from it and restarts from the moved files.
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
            .as_ref()
            .map(PeersState::stalled)
            .unwrap_or_default()
    }

    /// The peers the sidecar reports failed, asking for a restart.
    pub fn failures(&self) -> Vec<PeerFailure> {
        self.state
            .as_ref()
            .map(PeersState::failures)
            .unwrap_or_default()
    }

    /// The peers' runs of CMD, as the sidecar sees them.
    pub fn runs(&self) -> Vec<PeerRun> {
        self.state
            .as_ref()
            .map(PeersState::runs)
            .unwrap_or_default()
    }

    /// The latest progress another pod published, as the sidecar sees it.
    pub fn peer_progress(&self) -> Option<std::time::SystemTime> {
        self.state.as_ref()?.peer_progress()
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::supervise::policy::Policy;

    fn config(dir: &Path) -> Config {
        Config {
            kube: Default::default(),
            probes: super::super::config::ProbeConfig {
                nvml_lib: None,
                expect_gpus: None,
                container: None,
                interval: Duration::from_secs(10),
                ports: Vec::new(),
            },
            publish: super::super::config::PublishConfig {
                min_patch_interval: Duration::from_secs(10),
                metrics_addr: None,
            },
            cluster_file: Some(dir.join("cluster.json")),
        }
    }

    fn own(mode: Mode, observations: Option<&Path>, on_change: OnPeerChange) -> RoleConfig {
        let observations = observations.map(Path::to_path_buf);
        match mode {
            Mode::Sidecar => RoleConfig::Sidecar(SidecarConfig {
                observations,
                ..SidecarConfig::default()
            }),
            Mode::Exec => RoleConfig::Exec(ExecConfig {
                observations,
                restart: Policy {
                    on_change,
                    on_stall: Default::default(),
                    on_failure: Default::default(),
                    max_restarts: 3,
                    grace: Duration::from_secs(10),
                    backoff: Duration::from_secs(1),
                    wait: None,
                },
                progress: None,
            }),
        }
    }

    /// (the mode, hands over, watches its peers, reads exec's observations, tells exec
    /// of its peers, hears of its peers from the sidecar)
    fn shape(role: &Role) -> (Mode, bool, bool, bool, bool, bool) {
        let watches = match role {
            Role::Sidecar(_) => true,
            Role::Exec(e) => matches!(e.reach, Reach::Credentials { .. }),
        };
        let tells = role
            .sidecar()
            .and_then(|s| s.relay.as_ref())
            .is_some_and(|r| r.peers_out.is_some());
        (
            role.mode(),
            role.hands_over(),
            watches,
            role.inbox().is_some(),
            tells,
            role.peers_in().is_some(),
        )
    }

    #[test]
    fn the_role_follows_the_process_and_the_handover_directory() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let now = SystemTime::now();
        let role = |mode, obs: bool, change| {
            Role::new(&cfg, own(mode, obs.then_some(dir.path()), change), now)
        };
        let report = OnPeerChange::Report;
        let restart = OnPeerChange::Restart;
        assert_eq!(
            shape(&role(Mode::Sidecar, false, report)),
            (Mode::Sidecar, false, true, false, false, false)
        );
        assert_eq!(
            shape(&role(Mode::Sidecar, true, report)),
            (Mode::Sidecar, false, true, true, true, false)
        );
        assert_eq!(
            shape(&role(Mode::Exec, false, restart)),
            (Mode::Exec, false, true, false, false, false)
        );
        assert_eq!(
            shape(&role(Mode::Exec, true, report)),
            (Mode::Exec, true, false, false, false, false)
        );
        assert_eq!(
            shape(&role(Mode::Exec, true, restart)),
            (Mode::Exec, true, false, false, false, true)
        );
    }
}
