//! exec's side of the group restart for a failed CMD (`--on-failure restart`; the
//! decisions are [`crate::stall::group`]'s): what it publishes of its run of CMD in
//! `trainlet.io/progress` (when it started, whether it is stopped for a restart, its
//! last failure worth one), the peer failure it acts on, and the barrier's wait.

use std::path::Path;
use std::time::{Instant, SystemTime};

use tracing::info;

use super::Engine;
use crate::stall::group::{self, PeerFailure, PeerRun};
use crate::stall::observation::{FailedObservation, ProgressObservation};
use crate::stall::progress::Scope;
use crate::supervise::decide::Failed;
use crate::supervise::policy::OnFailure;
use crate::time;

/// exec's run of CMD, as the group restart needs it.
pub(super) struct GroupRun {
    /// `--on-failure restart`: the run is published, and peers' failures acted on.
    on: bool,
    /// The job's ranks wait for each other: not TensorFlow's ParameterServer training,
    /// whose workers train alone and whose failed worker restarts alone (the
    /// coordinator retries its work elsewhere meanwhile), as a stalled one does.
    together: bool,
    /// This pod's task and rank, for a failure's note (`worker/1, rank 1`).
    task: Option<String>,
    /// When CMD last started.
    started: SystemTime,
    /// CMD is stopped for a restart and waits at the barrier.
    down: bool,
    /// CMD's last failure that every rank restarted for.
    failed: Option<Failed>,
    /// The peers' failures known when CMD last started, or passed: answered.
    acted: Vec<PeerFailure>,
    /// The first OOM kill in CMD's tree of this run that a failure can be dated by
    /// ([`group::failure_time`]).
    first_kill: Option<SystemTime>,
}

impl GroupRun {
    pub fn new(on_failure: OnFailure, cluster_file: Option<&Path>, now: SystemTime) -> GroupRun {
        let cluster = cluster_file.and_then(|f| crate::render::read_cluster_file(f).ok());
        let types: Vec<&str> = cluster
            .as_ref()
            .map(|c| c.cluster.keys().map(String::as_str).collect())
            .unwrap_or_default();
        GroupRun {
            on: on_failure == OnFailure::Restart,
            together: Scope::of(&types) != Scope::Async,
            task: cluster.as_ref().map(|c| {
                let task = format!("{}/{}", c.task.task_type, c.task.index);
                match c.rank {
                    Some(rank) => format!("{task}, rank {rank}"),
                    None => task,
                }
            }),
            started: now,
            down: false,
            failed: None,
            acted: Vec::new(),
            first_kill: None,
        }
    }

    /// Whether exec publishes its run: `--on-failure restart`.
    pub fn on(&self) -> bool {
        self.on
    }

    /// What `trainlet.io/progress` says of the run.
    pub fn fill(&self, o: &mut ProgressObservation) {
        if !self.on {
            return;
        }
        o.started_ms = Some(time::to_ms(self.started));
        o.down = self.down;
        o.failed = self.failed.as_ref().map(|f| FailedObservation {
            since_ms: time::to_ms(f.since),
            note: crate::publish::truncate(&f.why, crate::stall::peers::MAX_FAILURE_NOTE),
        });
    }
}

impl Engine {
    /// exec with `--on-failure restart`: the peer's failure to restart CMD for, while it
    /// runs ([`group::failure_to_act_on`]).
    pub(super) fn act_on_failure(&self) -> Option<Failed> {
        let g = &self.role.exec()?.group;
        if !g.on || !g.together {
            return None;
        }
        let failures = self.peer_failures();
        group::failure_to_act_on(&failures, self.own_pod(), g.started, &g.acted).map(|f| Failed {
            why: f.note.clone(),
            since: f.since,
        })
    }

    /// Whether a failure restarts every rank (`--on-failure restart`, ranks that wait
    /// for each other).
    pub(super) fn restarts_together(&self) -> bool {
        self.role
            .exec()
            .is_some_and(|e| e.group.on && e.group.together)
    }

    /// A peer's failure of this run from before CMD's own `failed`: its rank failed
    /// first, and its launcher exited after this pod's.
    pub(super) fn earlier_failure(&self, own: &Failed) -> Option<Failed> {
        self.act_on_failure().filter(|f| f.since < own.since)
    }

    /// This pod in a failure's note: `pod w-1-x7k2p (worker/1, rank 1)`.
    pub(super) fn whose(&self) -> String {
        // Handing over, exec has no pod object: the name it was given (--pod-name,
        // $POD_NAME, which inject sets from the downward API).
        let pod = match self.own_pod() {
            Some(p) => p.to_string(),
            None => self
                .cfg
                .kube
                .pod_name()
                .unwrap_or_else(|| "this pod".into()),
        };
        match self.role.exec().and_then(|e| e.group.task.as_ref()) {
            Some(task) => format!("pod {pod} ({task})"),
            None => format!("pod {pod}"),
        }
    }

    /// CMD failed and every rank restarts for it: published at once.
    pub(super) async fn publish_failure(&mut self, failed: &Failed) {
        if let Some(e) = self.role.exec_mut() {
            e.group.failed = Some(failed.clone());
        }
        self.publish_run().await;
    }

    /// The peers' failures known now are answered without a restart.
    pub(super) fn pass_failures(&mut self) {
        let acted = self.peer_failures();
        if let Some(e) = self.role.exec_mut() {
            e.group.acted = acted;
        }
    }

    /// CMD started again: the peers' failures known now were answered by this restart.
    pub(super) fn group_restarted(&mut self, now: SystemTime) {
        let acted = self.peer_failures();
        if let Some(e) = self.role.exec_mut() {
            e.group.started = now;
            e.group.down = false;
            e.group.acted = acted;
            e.group.first_kill = None;
        }
    }

    /// exec saw an OOM kill in its cgroup, so in CMD's tree: a failure of CMD that
    /// follows is dated by it.
    pub(super) fn kill_in_cmd(&mut self, now: SystemTime) {
        if let Some(e) = self.role.exec_mut() {
            e.group.first_kill = Some(group::first_kill(e.group.first_kill, now));
        }
    }

    /// When CMD, which `ended` now in failure, began to fail.
    pub(super) fn failure_time(&self, ended: SystemTime) -> SystemTime {
        let first_kill = self.role.exec().and_then(|e| e.group.first_kill);
        group::failure_time(ended, first_kill)
    }

    /// The barrier: says that CMD is stopped, and waits until every peer has stopped
    /// the CMD of the run that failed at `since`, or `until`; returns the peers that
    /// had not. In ParameterServer training nothing waits.
    pub(super) async fn barrier(&mut self, since: SystemTime, until: Instant) -> Vec<String> {
        let Some(e) = self.role.exec_mut().filter(|e| e.group.together) else {
            return Vec::new();
        };
        e.group.down = true;
        self.publish_run().await;
        let every = self.cfg.probes.interval;
        let mut tick = tokio::time::interval_at((Instant::now() + every).into(), every);
        let mut said = false;
        loop {
            let left = group::not_stopped(&self.peer_runs(), self.own_pod(), since);
            if left.is_empty() || Instant::now() >= until {
                return left;
            }
            if !said {
                info!(
                    "waiting for {} to stop the command of the run that failed",
                    left.join(", ")
                );
                said = true;
            }
            tokio::select! {
                input = self.role.next() => self.on_role_input(input),
                // Where inotify is missing, the file is read every --interval; the
                // observation stays fresh for the sidecar.
                _ = tick.tick() => {
                    self.on_peers_file();
                    self.hand_over(None);
                }
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }

    /// The run as it is now, out at once: handed over to the sidecar, or patched.
    async fn publish_run(&mut self) {
        if self.role.hands_over() {
            self.hand_over(None);
        } else {
            self.evaluate();
            self.outbox.hurry();
            self.outbox.flush(&self.metrics, &self.ready).await;
        }
    }

    fn own_pod(&self) -> Option<&str> {
        self.view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref())
    }

    fn peer_failures(&self) -> Vec<PeerFailure> {
        self.cluster_view()
            .map(|v| v.failures())
            .unwrap_or_default()
    }

    fn peer_runs(&self) -> Vec<PeerRun> {
        self.cluster_view().map(|v| v.runs()).unwrap_or_default()
    }
}
