//! `trainlet sidecar`: the reporter of the pod, its peer watch, and, where the training
//! container's exec hands over, the relay to it: exec's observations in, where the
//! cluster stands (and the files moved for a restart) out.

use std::path::Path;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use super::config::{RoleConfig, SidecarConfig};
use super::input::{Input, Wake};
use super::link::next_pod;
use super::role::{Relay, Role, Sidecar as SidecarParts};
use super::{Config, Engine, ReportError};
use crate::cluster::drift::{self, ClusterStatus};
use crate::flags;
use crate::peerchange::file::{
    self as peers, FailedPeer, MAX_RUNS, MAX_STALLED, PeerRunState, PeersState, StalledPeer,
    VERSION,
};
use crate::peerchange::protocol::Waiting;
use crate::peers::drift as peer_watch;
use crate::render;
use crate::signal::{self, Signals};

/// `trainlet sidecar`.
pub async fn sidecar(cfg: Config, own: SidecarConfig) -> Result<(), ReportError> {
    let cgroup_root = own.cgroup_root.clone();
    let mut engine = Engine::new(cfg, RoleConfig::Sidecar(own));
    let mut signals = Signals::new(&signal::STOP).map_err(ReportError::Signals)?;
    if engine.role.peers_out_mut().is_some()
        && let Some(dir) = engine.cfg.cluster_file.as_deref().and_then(Path::parent)
    {
        // A sidecar killed while it moved the files left a temporary file behind.
        for f in crate::render::remove_leftovers(dir) {
            info!("removed {}, left by an earlier run", f.display());
        }
    }
    engine.start_metrics(true)?;
    engine.connect().await?;
    if let Some(root) = &cgroup_root {
        engine
            .probes
            .oom
            .resolve_container_cgroups(root, &engine.view);
    }
    // What NVML shows, before the first report: a pod event or the event thread's
    // registration can bring an evaluation before the loop's first probe, and the pod
    // must not be told a count that nothing probed.
    engine.probes.gpus.probe();
    engine.probes.gpus.watch_events();
    engine.watch_observations();
    engine.start_peer_watch();
    engine.run(&mut signals).await;
    engine.probes.gpus.stop_events();
    engine.outbox.flush(&engine.metrics, &engine.ready).await;
    Ok(())
}

/// How long a stopping sidecar waits for the pod to say how the training container
/// ended.
const LAST_LOOK: Duration = Duration::from_secs(5);

impl Engine {
    /// The sidecar's loop: until a stop signal or `--exit-with-main`; then, if the pod
    /// still shows the training container running, its last look.
    async fn run(&mut self, signals: &mut Signals) {
        let mut wake = self.wake();
        while !self.stopping {
            let input = self.next_input(&mut wake, signals).await;
            self.on_input(input, &mut wake).await;
        }
        self.last_look(&mut wake).await;
    }

    /// The kubelet stops a native sidecar once the training container has ended, and
    /// writes how it ended to the pod on its own schedule, which may come after the
    /// SIGTERM. When everything in the training container died at once (the kubelet's
    /// default on cgroup v2 kills a container's every process on an OOM kill, `trainlet
    /// exec` with them) only the pod status tells of it: so the pod is watched up to
    /// [`LAST_LOOK`] for the container's end before the last report goes out.
    async fn last_look(&mut self, wake: &mut Wake) {
        let container = self.container_name();
        let ended = |e: &Engine| {
            e.view.finished(&container)
                || e.view
                    .status(&container)
                    .is_none_or(|s| s.state.as_ref().is_some_and(|st| st.terminated.is_some()))
        };
        if ended(self) {
            return;
        }
        let deadline = tokio::time::Instant::now() + LAST_LOOK;
        while !ended(self) {
            tokio::select! {
                ev = next_pod(&mut wake.pods) => {
                    let Some(ev) = ev else { return };
                    self.on_input(Input::Pod(Some(ev)), wake).await;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    warn!(container = %container, "stopping before the pod says how the training container ended");
                    return;
                }
            }
        }
    }
}

impl Engine {
    /// When exec waits for the cluster after stopping CMD and every task has a live pod
    /// again: moves the cluster files to the replacements (the watch still sees them as
    /// replacements) and answers exec's wait. True when files moved and the watch must
    /// reload them.
    fn move_for_restart(&mut self) -> bool {
        let Role::Sidecar(SidecarParts {
            peers: Some(watch),
            relay: Some(relay),
            ..
        }) = &mut self.role
        else {
            return false;
        };
        let Relay {
            inbox,
            peers_out: Some(out),
        } = relay
        else {
            return false;
        };
        let Some(drift) = watch.drift.as_deref() else {
            return false;
        };
        let waiting = inbox.fresh(SystemTime::now()).and_then(|o| {
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
                (self.role.peers_mut(), self.cfg.cluster_file.as_deref())
            {
                watch.reload(cluster_file);
            }
        }
        let Role::Sidecar(SidecarParts {
            peers: Some(watch),
            relay: Some(relay),
            ..
        }) = &mut self.role
        else {
            return;
        };
        let Some(out) = relay.peers_out.as_mut() else {
            return;
        };
        if watch.drift.is_none() {
            return;
        }
        // The own pod's stall is exec's own to see: only the others' are passed on.
        let own = self.view.pod.as_ref().and_then(|p| p.metadata.name.clone());
        let (stalled, failed, runs) = others_news(watch, own.as_deref());
        // A restart exec makes for a peer's stall is one this sidecar told it of.
        out.relay
            .told(false, !stalled.is_empty() || !failed.is_empty());
        let state = PeersState {
            version: VERSION,
            generation: out.relay.generation,
            cluster: ClusterStatus::of(watch.drift.as_deref().unwrap_or_default()),
            stalled,
            progress_ms: watch
                .latest_progress(own.as_deref())
                .map(crate::time::to_ms),
            failed,
            runs,
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

/// What exec hears of its peers (not of its own pod, whose state is its own to see):
/// those stalled, those whose command failed (oldest first), and where each run stands;
/// at most [`MAX_STALLED`] and [`MAX_RUNS`] of them.
fn others_news(
    watch: &peer_watch::PeerWatch,
    own: Option<&str>,
) -> (Vec<StalledPeer>, Vec<FailedPeer>, Vec<PeerRunState>) {
    let others = |pod: &String| Some(pod.as_str()) != own;
    let stalled = watch
        .stalled()
        .into_iter()
        .filter(|s| others(&s.pod))
        .take(MAX_STALLED)
        .map(|s| StalledPeer {
            since_ms: crate::time::to_ms(s.since),
            pod: s.pod,
            ongoing: s.ongoing,
        })
        .collect();
    let mut failures = watch.failures();
    failures.sort_by_key(|f| f.since);
    let failed = failures
        .into_iter()
        .filter(|f| others(&f.pod))
        .take(MAX_STALLED)
        .map(|f| FailedPeer {
            since_ms: crate::time::to_ms(f.since),
            pod: f.pod,
            note: f.note,
        })
        .collect();
    let runs = watch
        .runs()
        .into_iter()
        .filter(|r| others(&r.pod))
        .take(MAX_RUNS)
        .map(|r| PeerRunState {
            started_ms: crate::time::to_ms(r.started),
            pod: r.pod,
            down: r.down,
        })
        .collect();
    (stalled, failed, runs)
}
