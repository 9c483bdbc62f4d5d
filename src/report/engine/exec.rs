//! `trainlet exec --report`: CMD as trainlet's child under the reporter loop, and what
//! a peer change does to it (`--on-peer-change`, [`crate::report::restart`]): stop CMD
//! with a grace period, wait the backoff, have the cluster resolved again (by the init
//! workflow, or by the sidecar moving the files), start CMD again, or end with 7.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::child::{self, Child, SpawnError};
use super::{Config, Engine, Mode, ReportError, peer_watch, peers_file};
use crate::Code;
use crate::report::oom::{self, OomKill};
use crate::report::restart::{self, Decision, OnPeerChange};
use crate::signal::{self, Signals};

impl Engine {
    /// Exec with `--on-peer-change restart|exit`: the stale cluster to act on, while
    /// CMD runs.
    pub(super) fn act_on_stale(&self) -> Option<String> {
        if self.cfg.mode != Mode::Exec || self.cfg.restart.on_change == OnPeerChange::Report {
            return None;
        }
        if let Some(p) = &self.peers_in {
            return p.stale();
        }
        let drift = self.peers.as_ref()?.drift.as_deref()?;
        let text = crate::cluster::drift::annotation(drift);
        (text != "current").then_some(text)
    }

    /// CMD failed while the cluster looked current: waits up to [`restart::SETTLE`] for
    /// the peer watch (or the sidecar) to tell a peer change, which then restarts CMD
    /// instead of ending exec. Nothing to wait for with `--on-peer-change report`.
    async fn settle(&mut self, signals: &mut Signals) {
        if self.cfg.restart.on_change == OnPeerChange::Report {
            return;
        }
        info!(
            "the command failed; waiting up to {:?} for a peer change to explain it",
            restart::SETTLE
        );
        let deadline = Instant::now() + restart::SETTLE;
        while self.act_on_stale().is_none() && Instant::now() < deadline {
            tokio::select! {
                Some((i, ev)) = peer_watch::next_event(&mut self.peers) => self.on_peer_event(i, ev),
                Some(()) = peers_file::next_state(&mut self.peers_in) => self.on_peers_file(),
                // Where inotify is missing, the file is read once more at the end.
                _ = tokio::time::sleep_until(deadline.into()) => self.on_peers_file(),
                sig = signals.recv() => match sig {
                    Some(signal::SIGCHLD) => self.reap(),
                    Some(s) if signal::STOP.contains(&s) => {
                        self.stop = true;
                        return;
                    }
                    _ => {}
                },
            }
        }
    }

    /// Stops CMD for a restart or an exit: SIGTERM, then SIGKILL after `grace`, to CMD
    /// and to whatever of its tree is left (orphans are trainlet's children, as it is
    /// their subreaper), so that nothing of the old CMD holds a port or a GPU when the
    /// new one starts. A stop signal meanwhile is forwarded and ends exec afterwards.
    pub(super) async fn stop_child(&mut self, signals: &mut Signals, grace: Duration) {
        let Some(child) = &self.child else { return };
        child.forward(signal::SIGTERM);
        info!(pid = child.pid, "stopping the command: SIGTERM");
        let deadline = Instant::now() + grace;
        let mut killed = false;
        loop {
            self.reap();
            let left = child::descendants();
            let cmd_done = self.child.as_ref().is_none_or(|c| c.exit.is_some());
            if cmd_done && left.is_empty() {
                return;
            }
            if Instant::now() >= deadline && !killed {
                info!(
                    pids = ?left,
                    "the command did not stop within --restart-grace {grace:?}; sending SIGKILL"
                );
                for pid in &left {
                    let _ = signal::send(*pid, signal::SIGKILL);
                }
                killed = true;
            }
            tokio::select! {
                sig = signals.recv() => match sig {
                    Some(signal::SIGCHLD) | None => {}
                    Some(s) => {
                        for pid in &left {
                            let _ = signal::send(*pid, s);
                        }
                        if signal::STOP.contains(&s) {
                            self.stop = true;
                        }
                    }
                },
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// exec handing over: says in its observation that it waits, then waits until the
    /// sidecar has moved the files to the replacements and says `current` with a
    /// higher generation. With credentials, nothing: the init workflow waits itself.
    pub(super) async fn wait_for_moved_files(&mut self) -> Result<(), crate::Failure> {
        let Some(before) = self.peers_in.as_ref().map(peers_file::Incoming::generation) else {
            return Ok(());
        };
        let deadline = self.cfg.restart.wait.map(|w| Instant::now() + w);
        if let Some(r) = self.restart_obs.as_mut() {
            r.waiting = true;
        }
        self.hand_over(None);
        info!("waiting for the trainlet sidecar to see every task live again and move the files");
        // Every --interval: the observation stays fresh for the sidecar, and the file is
        // read where inotify is missing.
        let every = self.cfg.interval;
        let mut tick = tokio::time::interval_at((Instant::now() + every).into(), every);
        loop {
            if let Some(p) = self.peers_in.as_mut() {
                p.read();
                if p.generation() > before && p.stale().is_none() {
                    return Ok(());
                }
            }
            if let Some(d) = deadline
                && Instant::now() >= d
            {
                let wait = self.cfg.restart.wait.unwrap_or_default();
                let stale = self.act_on_stale().unwrap_or_default();
                return Err(crate::Failure::new(
                    Code::NotReady,
                    format!(
                        "the trainlet sidecar did not see the cluster complete again within --timeout {} ({stale}); is the sidecar running with --observations and --cluster-file, and is the replacement up?",
                        humantime::format_duration(wait)
                    ),
                ));
            }
            tokio::select! {
                _ = peers_file::next_state(&mut self.peers_in) => {}
                _ = tick.tick() => self.hand_over(None),
            }
        }
    }

    /// Starts CMD (again, after a restart).
    pub(super) fn spawn(
        &mut self,
        cmd: std::process::Command,
        program: &str,
    ) -> Result<(), SpawnError> {
        let child = Child::spawn(cmd).map_err(|source| SpawnError {
            program: program.to_string(),
            source,
        })?;
        info!(pid = child.pid, "started {program}");
        self.child = Some(child);
        Ok(())
    }
}

/// exec `--on-peer-change restart`: waits until the cluster is complete again, writes
/// the files and returns CMD with its new environment. The command layer makes it (it
/// is the init workflow), so that the engine knows nothing of resolving.
pub type Respawn = Box<
    dyn FnMut() -> futures::future::LocalBoxFuture<
        'static,
        Result<std::process::Command, crate::Failure>,
    >,
>;

/// `trainlet exec --report`: runs CMD as a child and reports until it exits. Returns
/// CMD's exit code, or 128+signal. `own_port` is the task's server port from TF_CONFIG,
/// the port CMD is about to listen on. With `--on-peer-change restart|exit`, a peer lost
/// or replaced stops CMD: `respawn` starts it again.
pub async fn exec(
    mut cfg: Config,
    cmd: std::process::Command,
    program: &str,
    own_port: Option<u16>,
    mut respawn: Respawn,
) -> Result<Ended, ReportError> {
    cfg.ports.extend(own_port);
    let mut engine = Engine::new(cfg);
    let mut wanted = signal::FORWARD.to_vec();
    wanted.push(signal::SIGCHLD);
    let mut signals = Signals::new(&wanted).map_err(ReportError::Signals)?;
    engine.start_metrics(false)?;

    // Before CMD exists: who already listens (such a port is a conflict), and the
    // own cgroup's OOM counters as the baseline.
    engine.listeners.before_spawn();
    match oom::own_cgroup() {
        Ok(cg) => {
            let name = engine.container_name();
            engine.oom.watch_cgroup(name, String::new(), cg);
        }
        Err(e) => {
            warn!("OOM kills of CMD's processes cannot be watched: {e}");
            engine.oom.errors.insert("oom".into(), e.to_string());
        }
    }

    engine.spawn(cmd, program)?;

    if engine.outgoing.is_some() {
        // The sidecar publishes: this container needs (and has) no API credentials.
        info!(
            dir = %engine.cfg.observations.as_ref().map(|d| d.display().to_string()).unwrap_or_default(),
            "handing observations to the trainlet sidecar"
        );
    } else if let Err(e) = engine.connect().await {
        warn!("reporting to the pod is off: {e}");
    }
    // The name may have changed now that the pod is known. Handing over, exec knows
    // no pod: its own kills name no container (the sidecar names it).
    let name = match (&engine.outgoing, &engine.cfg.container) {
        (Some(_), None) => String::new(),
        _ => engine.container_name(),
    };
    engine.oom.name_own(name);
    engine.start_peer_watch();
    if let Some(p) = engine.peers_in.as_mut() {
        p.read();
        p.watch();
    }
    engine.reap();
    engine.watch_gpu_events();
    let mut restarts = 0;
    let mut why = None;
    loop {
        if engine.child.as_ref().is_some_and(|c| c.exit.is_none()) {
            engine.run_loop(&mut signals).await;
        }
        if engine.stop {
            break;
        }
        // A framework often fails at once when a peer dies (a broken collective), before
        // the watch has seen the pod go: give the watch a moment before ending with
        // CMD's status.
        let failed = engine
            .child
            .as_ref()
            .and_then(|c| c.exit)
            .is_some_and(|code| code != 0);
        if failed && !engine.terminating && engine.act_on_stale().is_none() {
            engine.settle(&mut signals).await;
        }
        let Some(stale) = engine.act_on_stale() else {
            break;
        };
        if engine.terminating {
            let grace = engine.cfg.restart.grace;
            engine.stop_child(&mut signals, grace).await;
            break;
        }
        // CMD ended well: the job's work is done, whatever its peers do now.
        if engine.child.as_ref().and_then(|c| c.exit) == Some(0) {
            break;
        }
        let policy = engine.cfg.restart.clone();
        match restart::decide(&policy, restarts, &stale) {
            Decision::Report => break,
            Decision::Exit { why: w } => {
                warn!("{w}");
                engine.stop_child(&mut signals, policy.grace).await;
                why = Some(w);
                break;
            }
            Decision::Restart { n, of, delay } => {
                let note = format!(
                    "restarting {program} ({n} of {of}) in {}: the cluster changed ({stale})",
                    humantime::format_duration(delay)
                );
                warn!("{note}");
                engine.metrics.restarts.inc();
                if engine.outgoing.is_some() {
                    // The sidecar announces it.
                    engine.restart_obs = Some(crate::report::handover::RestartObservation {
                        restarts: n,
                        note: crate::publish::truncate(&note, crate::report::handover::MAX_TEXT),
                        waiting: false,
                    });
                    engine.hand_over(None);
                } else {
                    engine.outbox.push(("Restarting", note.clone()), true);
                    engine.outbox.flush(&engine.metrics, &engine.ready).await;
                }
                engine.stop_child(&mut signals, policy.grace).await;
                if engine.stop {
                    break;
                }
                let next = tokio::select! {
                    next = async {
                        tokio::time::sleep(delay).await;
                        engine.wait_for_moved_files().await?;
                        respawn().await
                    } => next,
                    _ = wait_for_stop(&mut signals) => break,
                };
                let cmd = next.map_err(ReportError::Respawn)?;
                restarts = n;
                engine.spawn(cmd, program)?;
                if let Some(r) = engine.restart_obs.as_mut() {
                    r.waiting = false;
                }
                // The new cluster is the one to watch from now on, from a fresh list:
                // the old watches were not read while CMD was down, and what they
                // buffered would first show the new cluster stale again.
                engine.peers = engine
                    .cfg
                    .cluster_file
                    .as_deref()
                    .and_then(peer_watch::PeerWatch::load);
                engine.start_peer_watch();
                engine.evaluate();
            }
        }
    }
    engine.stop_gpu_events();
    // CMD is gone: one last look at the counters (CMD itself may have been the
    // victim), then the last report.
    engine.check_oom(false).await;
    if engine.evaluated || engine.link.is_some() {
        engine.evaluate();
    }
    engine.outbox.flush(&engine.metrics, &engine.ready).await;
    let oom = engine.oom.ledger.kills.last().map(OomKill::message);
    let code = match &why {
        Some(_) => Code::PeerChanged as i32,
        None => engine
            .child
            .as_ref()
            .and_then(|c| c.exit)
            .unwrap_or(Code::Internal as i32),
    };
    engine.hand_over(Some(code));
    Ok(Ended { code, oom, why })
}

/// Resolves on the first stop signal (SIGTERM, SIGINT) while CMD is not running.
async fn wait_for_stop(signals: &mut Signals) {
    loop {
        match signals.recv().await {
            Some(s) if signal::STOP.contains(&s) => {
                info!("{}: stopping", signal::name(s));
                return;
            }
            None => return,
            Some(_) => {}
        }
    }
}

/// How CMD ended under `exec --report`.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// CMD's exit code, or 128+signal; [`Code::PeerChanged`] when exec stopped it.
    pub code: i32,
    /// The last OOM kill among CMD's processes, if there was one.
    pub oom: Option<String>,
    /// Why exec stopped CMD and exits, if it did.
    pub why: Option<String>,
}

impl Ended {
    /// Why CMD ended, for the termination message; `None` when it succeeded.
    pub fn reason(&self, program: &str) -> Option<String> {
        if let Some(why) = &self.why {
            return Some(why.clone());
        }
        if self.code == 0 {
            return None;
        }
        let how = match self.code {
            c if c > 128 => format!(
                "{program} was killed by signal {} ({})",
                c - 128,
                signal::name(c - 128)
            ),
            c => format!("{program} exited with code {c}"),
        };
        Some(match &self.oom {
            Some(kill) => format!("{how}; {kill}"),
            None => how,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Ended;

    #[test]
    fn the_termination_reason_names_the_code_the_signal_and_an_oom_kill() {
        let ended = |code, oom: Option<&str>| Ended {
            code,
            oom: oom.map(String::from),
            why: None,
        };
        assert_eq!(ended(0, None).reason("python"), None);
        assert_eq!(
            ended(3, None).reason("python").as_deref(),
            Some("python exited with code 3")
        );
        assert_eq!(
            ended(
                137,
                Some(
                    "process python (pid 812) in container trainer was OOM-killed; memory limit 4Gi"
                )
            )
            .reason("torchrun")
            .as_deref(),
            Some(
                "torchrun was killed by signal 9 (SIGKILL); process python (pid 812) in container trainer was OOM-killed; memory limit 4Gi"
            )
        );
    }
}
