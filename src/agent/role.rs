//! Which of the two long-running processes this is, and what each owns: decided once
//! ([`Role::new`]), from `--observations` and `cluster.json`. Every part of the agent
//! that differs by role matches on [`Role`] or asks it; no field of the engine stands
//! for a role by being set or not, and no flag is read again.

use std::path::Path;
use std::time::SystemTime;

use super::config::{ExecConfig, RoleConfig, SidecarConfig};
use super::input::Input;
use super::{Config, Mode, group, observations, peers_file};
use crate::peers::drift::{self as peer_watch, PeerWatch};
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
    pub peers_out: Option<peers_file::Outgoing>,
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
        peers_in: Option<peers_file::Incoming>,
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
                    peers_out: cluster_file.and_then(peers_file::Outgoing::new),
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
    pub fn peers_in(&self) -> Option<&peers_file::Incoming> {
        match self {
            Role::Exec(Exec {
                reach: Reach::HandOver { peers_in, .. },
                ..
            }) => peers_in.as_ref(),
            _ => None,
        }
    }

    pub fn peers_in_mut(&mut self) -> Option<&mut peers_file::Incoming> {
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
    pub fn peers_out_mut(&mut self) -> Option<&mut peers_file::Outgoing> {
        match self {
            Role::Sidecar(Sidecar { relay: Some(r), .. }) => r.peers_out.as_mut(),
            _ => None,
        }
    }

    /// The next wake-up from what this role owns: a peer event, the sidecar's
    /// `peers.json` (exec handing over), exec's observation (the sidecar relaying).
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
            Role::Exec(Exec {
                reach: Reach::Credentials { peers },
                ..
            }) => match peer_watch::next_event(peers).await {
                Some((i, ev)) => Input::Peer(i, ev),
                None => std::future::pending().await,
            },
            Role::Exec(Exec {
                reach: Reach::HandOver { peers_in, .. },
                ..
            }) => match peers_file::next_state(peers_in).await {
                Some(()) => Input::PeersFile,
                None => std::future::pending().await,
            },
        }
    }
}

/// Where exec, handing over, reads what the sidecar tells of its peers (peers.json):
/// when a peer's change, stall or failure acts on CMD, or the stall rule reads the
/// peers' progress.
fn peers_in(cluster_file: Option<&Path>, own: &ExecConfig) -> Option<peers_file::Incoming> {
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
        .map(|d| peers_file::Incoming::new(d.to_path_buf()))
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
