//! Which of the two long-running processes this is, decided once from the config: every
//! part of the agent that differs by role asks [`Role`], never the flags again.

use std::path::Path;

use crate::report::Mode;

/// The agent's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `trainlet sidecar`: publishes for the pod. `relays`: the training container's
    /// `trainlet exec` hands over to it (`--observations`), so the sidecar reads exec's
    /// observations and, with `cluster.json`, tells exec where the cluster stands.
    Sidecar { relays: bool },
    /// `trainlet exec --report`, beside CMD.
    Exec(Exec),
}

/// How exec reaches the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// With the pod's credentials: it publishes, watches its peers and resolves again
    /// after a peer change itself.
    Credentials,
    /// Without them (`--observations`): it hands its observations to the sidecar, learns
    /// of peer changes from the sidecar's `peers.json`, and restarts from the files the
    /// sidecar moved.
    HandOver,
}

impl Role {
    /// The one decision: the process, and whether it hands over through a directory.
    pub fn of(mode: Mode, observations: Option<&Path>) -> Role {
        match (mode, observations.is_some()) {
            (Mode::Sidecar, relays) => Role::Sidecar { relays },
            (Mode::Exec, false) => Role::Exec(Exec::Credentials),
            (Mode::Exec, true) => Role::Exec(Exec::HandOver),
        }
    }

    /// exec without credentials.
    pub fn hands_over(self) -> bool {
        self == Role::Exec(Exec::HandOver)
    }

    /// Who watches the peer pods through the API server: the sidecar, or exec with
    /// credentials (exec handing over learns of them from the sidecar).
    pub fn watches_peers(self) -> bool {
        !self.hands_over()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_role_follows_the_process_and_the_handover_directory() {
        let dir = Some(Path::new("/observations"));
        assert_eq!(
            Role::of(Mode::Sidecar, None),
            Role::Sidecar { relays: false }
        );
        assert_eq!(Role::of(Mode::Sidecar, dir), Role::Sidecar { relays: true });
        assert_eq!(Role::of(Mode::Exec, None), Role::Exec(Exec::Credentials));
        assert_eq!(Role::of(Mode::Exec, dir), Role::Exec(Exec::HandOver));
        let all = [
            Role::Sidecar { relays: false },
            Role::Sidecar { relays: true },
            Role::Exec(Exec::Credentials),
            Role::Exec(Exec::HandOver),
        ];
        let watches: Vec<bool> = all.iter().map(|r| r.watches_peers()).collect();
        assert_eq!(watches, [true, true, true, false]);
    }
}
