//! `trainlet exec --report`: the agent beside CMD. Set up before CMD starts (who
//! already listens, the own cgroup's OOM baseline), then run for the supervisor
//! ([`crate::supervise::lifecycle`]) through its [`Reporter`] trait: exec's loop, which
//! hands CMD back when its view of the cluster ([`ClusterView`]) is stale or a stall is
//! to be acted on; the restart announced, the wait for the moved files, the new
//! cluster followed.

use std::time::{Instant, SystemTime};

use tracing::{info, warn};

use super::config::{ExecConfig, RoleConfig};
use super::input::Input;
use super::role::Incoming;
use super::{Config, Engine, ReportError};
use crate::cluster::drift::ClusterStatus;
use crate::event::Event;
use crate::peers::drift::PeerWatch;
use crate::reason::Reason;
use crate::report::probe::oom::{self, OomKill};
use crate::signal::{self, Signals};
use crate::stall::group::{PeerFailure, PeerRun};
use crate::stall::peers::PeerStall;
use crate::stall::progress::{Metric, Reported};
use crate::supervise::child::Child;
use crate::supervise::decide::Failed;
use crate::supervise::lifecycle::{self, Handback, Reporter, Standing};
use crate::supervise::policy::{OnPeerChange, Policy};
use crate::{Code, Failure, flags, kubeflow};

/// A report through the Kubeflow endpoint, as the progress watch keeps it (the
/// endpoint took it within `kubeflow::bounds`, which the sidecar checks again).
fn reported(s: kubeflow::request::TrainerStatus) -> Reported {
    Reported {
        percent: s.percent,
        eta_seconds: s.eta_seconds,
        metrics: s
            .metrics
            .into_iter()
            .map(|(name, value)| Metric { name, value })
            .collect(),
    }
}

impl Engine {
    /// exec's own flags. The engine the supervisor drives is only ever made by
    /// [`exec_reporter`], with exec's role.
    fn exec_config(&self) -> &ExecConfig {
        &self
            .role
            .exec()
            .expect("the supervisor drives exec's engine only")
            .cfg
    }

    /// Exec with `--on-peer-change restart|exit`: the stale cluster to act on, while
    /// CMD runs.
    pub(super) fn act_on_stale(&self) -> Option<String> {
        if self.role.exec()?.cfg.restart.on_change == OnPeerChange::Report {
            return None;
        }
        self.cluster_view()?.status()?.stale().map(String::from)
    }
}

/// The reporter of `exec --report`, set up, and CMD started (after the reporter saw who
/// listened before it): ready for [`crate::supervise::lifecycle::Supervisor`], which
/// owns CMD from then on. `own_ports` are the ports CMD is about to listen on
/// (`render::frameworks::listen_ports`).
pub async fn exec_reporter(
    mut cfg: Config,
    own: ExecConfig,
    cmd: std::process::Command,
    program: &str,
    own_ports: Vec<u16>,
    kubeflow: Option<kubeflow::server::Prepared>,
) -> Result<(Engine, Signals, Child), ReportError> {
    cfg.probes.ports.extend(own_ports);
    let mut engine = Engine::new(cfg, RoleConfig::Exec(own));
    let mut wanted = signal::FORWARD.to_vec();
    wanted.push(signal::SIGCHLD);
    let signals = Signals::new(&wanted).map_err(ReportError::Signals)?;
    engine.start_metrics(false)?;

    // Before CMD exists: who already listens (such a port is a conflict), and the
    // own cgroup's OOM counters as the baseline.
    engine.probes.listeners.before_spawn();
    match oom::own_cgroup() {
        Ok(cg) => {
            let name = engine.container_name();
            engine.probes.oom.watch_cgroup(name, String::new(), cg);
        }
        Err(e) => {
            warn!("OOM kills of CMD's processes cannot be watched: {e}");
            engine.probes.oom.errors.insert("oom".into(), e.to_string());
        }
    }
    let watch = engine.output_watch();
    if let (Some(k), Some(w)) = (kubeflow, watch.clone()) {
        tokio::spawn(k.serve(move |s| {
            let step = s.step();
            w.report(reported(s), step, SystemTime::now());
        }));
    }
    let mut child = lifecycle::spawn(cmd, program, watch.as_ref())?;
    // What NVML shows, before anything is handed over: a CMD that ends at once must
    // not leave the sidecar a GPU count of 0 that nothing probed.
    engine.probes.gpus.probe();

    if engine.role.hands_over() {
        // The sidecar publishes: this container needs (and has) no API credentials.
        info!(
            dir = %engine.role.exec().and_then(|e| e.cfg.observations.as_ref()).map(|d| d.display().to_string()).unwrap_or_default(),
            "handing observations to the trainlet sidecar"
        );
    } else if let Err(e) = engine.connect().await {
        warn!("reporting to the pod is off: {e}");
    }
    // The name may have changed now that the pod is known. Handing over, exec knows
    // no pod: its own kills name no container (the sidecar names it).
    let name = match (engine.role.hands_over(), &engine.cfg.probes.container) {
        (true, None) => String::new(),
        _ => engine.container_name(),
    };
    engine.probes.oom.name_own(name);
    engine.listen_for_stacks();
    engine.start_peer_watch();
    if let Some(p) = engine.role.peers_in_mut() {
        p.read();
        p.watch();
    }
    child.reap();
    engine.probes.gpus.watch_events();
    Ok((engine, signals, child))
}

impl Reporter for Engine {
    fn policy(&self) -> &Policy {
        &self.exec_config().restart
    }

    async fn run(&mut self, signals: &mut Signals) -> Handback {
        // The loop's timers and pod watch go on from one call to the next: a signal
        // handed back is no reason to list the pod again.
        let mut wake = self.wake.take().unwrap_or_else(|| self.wake());
        let back = loop {
            match self.next_input(&mut wake, signals).await {
                Input::Signal(sig) => break Handback::Signal(sig),
                input => self.on_input(input, &mut wake).await,
            }
            if self.act_on_stall().is_some() {
                // Where CMD is, before the supervisor stops it for a peer's stall; the
                // stall then waits for the other pods to look too (`look_until`).
                self.stacks_before_acting();
            }
            let stall = self.act_on_stall().is_some();
            if stall || self.act_on_stale().is_some() || self.act_on_failure().is_some() {
                break Handback::Standing;
            }
        };
        self.wake = Some(wake);
        back
    }

    fn standing(&self) -> Standing {
        Standing {
            stale: self.act_on_stale(),
            stalled: self.act_on_stall(),
            failed: self.act_on_failure(),
            ..Standing::default()
        }
    }

    fn output_watch(&self) -> Option<std::sync::Arc<crate::supervise::output::Watch>> {
        Engine::output_watch(self)
    }

    async fn settle(&mut self, signals: &mut Signals, until: Instant) -> Handback {
        self.follow_peers_until(signals, until, |e| e.act_on_stale().is_some())
            .await
    }

    async fn restarting(&mut self, n: u32, note: String) {
        self.record(Event::warning(Reason::Restarting, note.clone()), true);
        if let Some(out) = self.role.outgoing_mut() {
            // The sidecar announces it.
            out.restart = Some(crate::handover::observation::RestartObservation {
                restarts: n,
                note: crate::publish::truncate(&note, crate::handover::observation::MAX_TEXT),
                waiting: false,
            });
            self.hand_over(None);
        } else {
            self.outbox.flush(&self.metrics, &self.ready).await;
        }
    }

    /// exec handing over: says in its observation that it waits, then waits until the
    /// sidecar has moved the files to the replacements and says `current` with a
    /// higher generation. With credentials, nothing: the init workflow waits itself.
    async fn wait_for_files(&mut self) -> Result<(), Failure> {
        let Some(wait) = self.role.peers_in().map(Incoming::wait) else {
            return Ok(());
        };
        let limit = self.exec_config().restart.wait;
        let deadline = limit.map(|w| Instant::now() + w);
        if let Some(r) = self.role.outgoing_mut().and_then(|o| o.restart.as_mut()) {
            r.waiting = true;
        }
        self.hand_over(None);
        info!("waiting for the trainlet sidecar to see every task live again and move the files");
        // Every --interval: the observation stays fresh for the sidecar, and the file is
        // read where inotify is missing.
        let every = self.cfg.probes.interval;
        let mut tick = tokio::time::interval_at((Instant::now() + every).into(), every);
        loop {
            if let Some(p) = self.role.peers_in_mut() {
                p.read();
                if p.over(&wait) {
                    return Ok(());
                }
            }
            if let Some(d) = deadline
                && Instant::now() >= d
            {
                let wait = limit.unwrap_or_default();
                let stale = self.act_on_stale().unwrap_or_default();
                return Err(Failure::new(
                    Code::NotReady,
                    format!(
                        "the trainlet sidecar did not see the cluster complete again within {} {} ({stale}); is the sidecar running with {} and {}, and is the replacement up?",
                        flags::long(flags::TIMEOUT),
                        humantime::format_duration(wait),
                        flags::long(flags::OBSERVATIONS),
                        flags::long(flags::CLUSTER_FILE),
                    ),
                ));
            }
            tokio::select! {
                _ = self.role.next() => {}
                _ = tick.tick() => self.hand_over(None),
            }
        }
    }

    fn generation(&self) -> Option<u64> {
        self.role.peers().and_then(|p| p.generation)
    }

    fn whose(&self) -> String {
        Engine::whose(self)
    }

    fn failure_time(&self, ended: SystemTime) -> SystemTime {
        Engine::failure_time(self, ended)
    }

    async fn failed(&mut self, failed: &Failed) {
        self.publish_failure(failed).await;
    }

    async fn await_earlier_failure(
        &mut self,
        signals: &mut Signals,
        failed: &Failed,
        until: Instant,
    ) -> Handback {
        if !self.restarts_together() {
            return Handback::Standing;
        }
        self.follow_peers_until(signals, until, |e| e.earlier_failure(failed).is_some())
            .await
    }

    fn first_failure(&self, failed: &Failed) -> Failed {
        self.earlier_failure(failed)
            .unwrap_or_else(|| failed.clone())
    }

    fn pass(&mut self) {
        self.pass_failures();
    }

    async fn barrier(&mut self, since: SystemTime, until: Instant) -> Vec<String> {
        Engine::barrier(self, since, until).await
    }

    fn started_again(&mut self) {
        if let Some(r) = self.role.outgoing_mut().and_then(|o| o.restart.as_mut()) {
            r.waiting = false;
        }
        self.progress_restarted();
        self.group_restarted(SystemTime::now());
        // CMD's new run begins with every timer due at once, as its first did.
        self.wake = None;
        // The new cluster is the one to watch from now on, from a fresh list: the old
        // watches were not read while CMD was down, and what they buffered would first
        // show the new cluster stale again.
        self.role.reload_peers(self.cfg.cluster_file.as_deref());
        self.start_peer_watch();
        self.refresh();
    }

    async fn finish(
        &mut self,
        code: i32,
        (cmd_pid, cmd_exit): (u32, Option<i32>),
    ) -> Option<String> {
        self.probes.gpus.stop_events();
        // CMD is gone: one last look at the counters (CMD itself may have been the
        // victim), then the last report. A CMD that ended by itself (a DataLoader
        // worker's kill makes the training script fail at once) was not the victim of
        // the kill the counters show: only SIGKILL is.
        if cmd_exit.is_some_and(|c| c != 128 + crate::signal::SIGKILL) {
            self.probes.oom.ended_by_itself(cmd_pid);
        }
        self.check_oom(false).await;
        // What CMD printed last may have ended a stall.
        self.check_progress(true);
        // A CMD that could not listen on its port ends at once, often before the first
        // probe: then look now, while the holder still holds it, or the conflict that
        // ended CMD is never reported.
        if self.probes.listeners.states.is_empty() {
            self.probe_ports();
        }
        if self.once.evaluated || self.link.is_some() {
            self.evaluate();
        }
        self.outbox.flush(&self.metrics, &self.ready).await;
        self.hand_over(Some(code));
        self.probes.oom.ledger.kills.last().map(OomKill::message)
    }
}

impl Engine {
    /// Follows the peers (their files, their failures) until `done` or `until`, or a
    /// signal, which it hands back.
    async fn follow_peers_until(
        &mut self,
        signals: &mut Signals,
        until: Instant,
        done: impl Fn(&Engine) -> bool,
    ) -> Handback {
        while !done(self) && Instant::now() < until {
            tokio::select! {
                input = self.role.next() => self.on_role_input(input),
                // Where inotify is missing, the file is read once more at the end.
                _ = tokio::time::sleep_until(until.into()) => self.on_peers_file(),
                sig = signals.recv() => return Handback::Signal(sig),
            }
        }
        Handback::Standing
    }
}

// ---------------------------------------------------------------------------------
// Where this process learns how the cluster stands, whichever way its role has: its
// own peer watch (exec with credentials) or the sidecar's `peers.json` (exec handing
// over). Everything exec acts on — a peer change, a peer's stall, the job's progress —
// reads it through one `ClusterView`.

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

    /// The peers that published a failure that asks for a restart.
    pub fn failures(&self) -> Vec<PeerFailure> {
        match self {
            ClusterView::Watch(w) => w.failures(),
            ClusterView::File(f) => f.failures(),
        }
    }

    /// The peers' runs of CMD.
    pub fn runs(&self) -> Vec<PeerRun> {
        match self {
            ClusterView::Watch(w) => w.runs(),
            ClusterView::File(f) => f.runs(),
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
        match (self.role.peers_in(), self.role.peers()) {
            (Some(f), _) => Some(ClusterView::File(f)),
            (None, Some(w)) => Some(ClusterView::Watch(w)),
            _ => None,
        }
    }
}
