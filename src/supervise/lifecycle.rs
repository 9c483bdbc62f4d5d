//! `trainlet exec --report`'s life of CMD, as one loop: CMD runs under the reporter
//! until it exits, a stop signal comes, or a peer change (`--on-peer-change`) asks for
//! action; then [`decide`] says what to do: end with CMD's status, stop CMD and
//! exit 7 (8 for a stall), or stop it, wait the backoff and the cluster, and start it
//! again with the new environment ([`Respawner`]: the init workflow again, or the files
//! the sidecar moved, and CMD gets the variables of `trainlet.env` again).
//!
//! The [`Supervisor`] owns CMD; the reporter that runs beside it is behind [`Reporter`],
//! so that this loop is all a reader needs to follow "a peer is replaced → exec restarts
//! CMD with the new address"; what the reporter observes and publishes is the agent's
//! (`src/agent`).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use super::child::command;
use super::child::{Child, SpawnError, read_outputs};
pub use super::decide::Standing;
pub use super::decide::Trigger;
use super::decide::{self, Decision, Facts, Failed, Next};
use super::life::Ended;
use super::life::{Act, Life};
use super::policy::{self, OnFailure, Policy};
use super::stop::{stop_tree, wait_for_stop};
use crate::bootstrap::{self, InitConfig, InitError};
use crate::signal::Signals;
use crate::stall::group;
use crate::{Code, Failure};

/// What the supervisor needs of the reporter that runs beside CMD. One thread runs
/// both (trainlet's runtime is single-threaded), so the futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Reporter {
    /// The restart policy (`--on-peer-change` and its flags).
    fn policy(&self) -> &Policy;
    /// Reports until a signal comes, which it hands back untouched (the supervisor
    /// alone signals and reaps CMD), or the cluster or a stall asks for action
    /// ([`Reporter::standing`]).
    async fn run(&mut self, signals: &mut Signals) -> Handback;
    /// Where the reporter stands now.
    fn standing(&self) -> Standing;
    /// Where CMD's output goes through to be watched for progress, if it is.
    fn output_watch(&self) -> Option<std::sync::Arc<super::output::Watch>>;
    /// CMD failed while the cluster looked current: waits until `until` for the peer
    /// change that explains it (a broken collective fails before the watch sees the
    /// pod go), or a signal, which it hands back.
    async fn settle(&mut self, signals: &mut Signals, until: Instant) -> Handback;
    /// Announces restart `n`: its `Restarting` Event (or, handing over, the sidecar's).
    async fn restarting(&mut self, n: u32, note: String);
    /// Waits until the cluster's files are complete again before CMD starts again
    /// (handing over, the sidecar moves them).
    async fn wait_for_files(&mut self) -> Result<(), Failure>;
    /// The generation of the resolution that showed the change (coordinated jobs).
    fn generation(&self) -> Option<u64>;
    /// This pod in a failure's note: its name, task and rank.
    fn whose(&self) -> String;
    /// When CMD, which `ended` now in failure, began to fail: at an OOM kill in its
    /// tree that came shortly before, which the peers' ranks may have outlived by less.
    fn failure_time(&self, ended: SystemTime) -> SystemTime;
    /// CMD failed and every rank restarts for it (`--on-failure restart`): published,
    /// for the peers to restart once for it.
    async fn failed(&mut self, failed: &Failed);
    /// After [`Reporter::failed`]: waits until `until` for a peer's failure from before
    /// `failed` ([`Reporter::first_failure`]), or a signal, which it hands back.
    async fn await_earlier_failure(
        &mut self,
        signals: &mut Signals,
        failed: &Failed,
        until: Instant,
    ) -> Handback;
    /// The failure a restart for CMD's own `failed` names: a peer's from before it, the
    /// rank that failed first, or `failed` itself.
    fn first_failure(&self, failed: &Failed) -> Failed;
    /// The peers' failures known now are answered without a restart here.
    fn pass(&mut self);
    /// CMD is stopped for a restart that answers a failure at `since`: says so, and
    /// waits until every peer has stopped the CMD of the failed run, or `until`.
    /// Returns the peers that had not.
    async fn barrier(&mut self, since: SystemTime, until: Instant) -> Vec<String>;
    /// CMD started again: the reporter follows the new cluster, and its silence counts
    /// from now.
    fn started_again(&mut self);
    /// CMD is gone for good: the last report; the last OOM kill among CMD's processes.
    /// `cmd`: CMD's pid and how it ended (its exit status, or 128+signal).
    async fn finish(&mut self, code: i32, cmd: (u32, Option<i32>)) -> Option<String>;
}

/// Why the reporter's loop handed CMD back to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handback {
    /// A signal came (`None`: the signal stream ended): the supervisor's to handle.
    Signal(Option<i32>),
    /// Where the reporter stands asks for action, or the wait is over.
    Standing,
}

/// Waits out a restart's backoff (after a failure, beside the barrier: the backoff is
/// the user's delay, not one on top of it) and says on which cluster CMD starts again.
async fn resume_after(
    reporter: &mut impl Reporter,
    trigger: &Trigger,
    delay: Duration,
    grace: Duration,
    program: &str,
) -> Resume {
    match trigger {
        Trigger::PeerChange(_) => {
            // The resolution that showed the change, as of the stop.
            let after = reporter.generation();
            tokio::time::sleep(delay).await;
            Resume::PeerChange { after }
        }
        Trigger::Stall(_) => {
            tokio::time::sleep(delay).await;
            Resume::AsItWas
        }
        Trigger::Failure { failed, .. } => {
            let timeout = group::barrier_timeout(grace);
            let (_, left) = tokio::join!(
                tokio::time::sleep(delay),
                reporter.barrier(failed.since, Instant::now() + timeout)
            );
            if !left.is_empty() {
                warn!(
                    "starting {program} again although {} did not say within {} that its command stopped; a rank still in the failed run may hold the rendezvous",
                    left.join(", "),
                    humantime::format_duration(timeout)
                );
            }
            // A peer lost meanwhile (the failure was its pod's going): CMD starts again
            // on the cluster as it is now.
            match reporter.standing().stale {
                Some(_) => Resume::PeerChange {
                    after: reporter.generation(),
                },
                None => Resume::AsItWas,
            }
        }
    }
}

/// Starts CMD (again, after a restart), its output watched through `watch` if given.
pub fn spawn(
    cmd: std::process::Command,
    program: &str,
    watch: Option<&std::sync::Arc<super::output::Watch>>,
) -> Result<Child, SpawnError> {
    let child = Child::spawn(cmd, watch).map_err(|source| SpawnError {
        program: program.to_string(),
        source,
    })?;
    info!(pid = child.pid, "started {program}");
    Ok(child)
}

/// Why CMD starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// A peer changed (`--on-peer-change restart`): wait until the cluster is complete
    /// again and write its files. `after` is, in a coordinated job, the generation of
    /// the resolution that showed the change: resolving again must not take an older
    /// one, which still names the pod that went.
    PeerChange { after: Option<u64> },
    /// A stall (`--on-stall restart`) or a failure (`--on-failure restart`): the
    /// cluster is as it was, and so are its files.
    AsItWas,
}

/// What a restart needs to make CMD again.
pub struct Respawner {
    /// CMD and its arguments.
    pub argv: Vec<String>,
    /// Where init's files are.
    pub dir: PathBuf,
    /// Resolving again after a peer change: init's config, where exec holds
    /// credentials; `None` where it hands over (the sidecar moves the files).
    pub init: Option<InitConfig>,
    /// What CMD gets besides trainlet.env (the heartbeat file, torch's error file),
    /// applied at each start.
    pub prepare: Box<dyn Fn(std::process::Command) -> std::process::Command>,
    /// Init's errors as the user reads them.
    pub explain: fn(&InitError) -> String,
    /// CMD's failure with this exit code, in words (how it ended, its root cause),
    /// when it is worth a retry; `None` when it is permanent.
    pub retried: Box<dyn Fn(i32) -> Option<String>>,
}

impl Respawner {
    /// CMD again, for a restart: after a peer change, from the cluster resolved again
    /// (with credentials) or from the files the sidecar moved; after a stall, from the
    /// files as they were.
    pub async fn command(&self, resume: Resume) -> Result<std::process::Command, Failure> {
        let init = match resume {
            Resume::PeerChange { after } => self.init.clone().map(|mut c| {
                c.min_generation = after;
                c
            }),
            // A stall changed no peer: the files are as they were.
            Resume::AsItWas => None,
        };
        match init {
            Some(init) => {
                let out = bootstrap::run(&init, self.explain)
                    .await
                    .map_err(|e| Failure::new(e.code(), (self.explain)(&e)))?;
                Ok((self.prepare)(command(
                    &self.argv,
                    out.env,
                    &init.output_dir,
                )))
            }
            // The sidecar moved the files, or nothing moved.
            None => {
                let (env, _) = read_outputs(&self.dir)?;
                Ok((self.prepare)(command(&self.argv, env, &self.dir)))
            }
        }
    }
}

/// The supervisor of CMD: it owns the child, and carries out what [`decide`] says
/// when the reporter's loop hands CMD back.
pub struct Supervisor {
    cmd: Child,
    program: String,
    respawner: Respawner,
    life: Life,
}

impl Supervisor {
    /// CMD, already started (by the agent's setup, once it knows who listened
    /// before), and how to make it again.
    pub fn new(cmd: Child, respawner: Respawner) -> Supervisor {
        Supervisor {
            cmd,
            program: respawner.argv[0].clone(),
            respawner,
            life: Life::default(),
        }
    }

    /// Runs CMD to its end under `reporter`, restarting it on a peer change or a stall
    /// as the policy says. Returns how it ended.
    pub async fn run(
        mut self,
        reporter: &mut impl Reporter,
        signals: &mut Signals,
    ) -> Result<Ended, Failure> {
        loop {
            self.report_while_cmd_runs(reporter, signals).await;
            let Some(trigger) = self.trigger(reporter, signals).await else {
                break;
            };
            let policy = reporter.policy().clone();
            match decide::on(&policy, self.life.restarts(), &trigger) {
                Decision::Report => break,
                Decision::Pass { why } => {
                    warn!("{why}");
                    reporter.pass();
                }
                Decision::Exit { why } => {
                    warn!("{why}");
                    let code = match trigger {
                        Trigger::Stall(_) => Code::Stalled,
                        Trigger::PeerChange(_) | Trigger::Failure { .. } => Code::PeerChanged,
                    };
                    let stopped = self.stop(signals, &policy).await.is_some();
                    self.step(|l| l.exit(why, code));
                    if stopped {
                        self.step(Life::stopped);
                    }
                    break;
                }
                Decision::Restart { n, of, delay } => {
                    let step = Restart { n, of, delay };
                    if !self.restart(reporter, signals, step, &trigger).await? {
                        break;
                    }
                }
            }
        }
        Ok(self.end(reporter, signals).await)
    }

    /// The reporter runs beside CMD until CMD exits, a stop signal ends exec, or the
    /// reporter hands CMD back for action; every signal it hands back goes through
    /// [`Life::on_signal`], and its [`Act`] to CMD is carried out here.
    async fn report_while_cmd_runs(&mut self, reporter: &mut impl Reporter, signals: &mut Signals) {
        while self.cmd.exit.is_none() && !self.life.is_stopped() {
            match reporter.run(signals).await {
                Handback::Signal(sig) => self.on_signal(sig, Life::on_signal),
                Handback::Standing => return,
            }
        }
    }

    /// One step of exec's life.
    fn step(&mut self, step: impl FnOnce(Life) -> Life) {
        self.life = step(std::mem::replace(&mut self.life, Life::Stopped));
    }

    /// A signal the reporter handed back: the step it makes in exec's life, and what
    /// that does to CMD.
    fn on_signal(&mut self, sig: Option<i32>, step: fn(Life, Option<i32>) -> (Life, Act)) {
        let (life, act) = step(std::mem::replace(&mut self.life, Life::Stopped), sig);
        self.life = life;
        match act {
            Act::Reap => self.cmd.reap(),
            Act::Forward(s) => self.cmd.forward(s),
            Act::None => {}
        }
    }

    /// Where the reporter stands, with what only the supervisor knows: whether a stop
    /// signal ended exec or was forwarded to CMD.
    fn standing(&self, reporter: &impl Reporter) -> Standing {
        Standing {
            stopped: self.life.is_stopped(),
            terminating: self.life.is_terminating(),
            ..reporter.standing()
        }
    }

    /// After CMD exited or the reporter returned: the peer change or stall the policy
    /// acts on, or `None` when exec ends with CMD as it is ([`decide::next`]). A
    /// framework often fails at once when a peer dies (a broken collective), before the
    /// watch has seen the pod go: the watch gets a moment to explain the failure before
    /// exec ends with CMD's status.
    async fn trigger(
        &mut self,
        reporter: &mut impl Reporter,
        signals: &mut Signals,
    ) -> Option<Trigger> {
        let mut settled = false;
        let own_failure = match self.cmd.exit {
            Some(code) if code != 0 && reporter.policy().on_failure == OnFailure::Restart => {
                let since = reporter.failure_time(SystemTime::now());
                (self.respawner.retried)(code).map(|how| Failed {
                    why: format!("{} failed: {how}", reporter.whose()),
                    since,
                })
            }
            _ => None,
        };
        loop {
            let facts = Facts {
                standing: self.standing(reporter),
                exit: self.cmd.exit,
                on_change: reporter.policy().on_change,
                settled,
                own_failure: own_failure.clone(),
            };
            match decide::next(&facts) {
                Next::End => return None,
                Next::Act(trigger) => return Some(trigger),
                Next::Settle => {
                    info!(
                        "the command failed; waiting up to {:?} for a peer change to explain it",
                        policy::SETTLE
                    );
                    let until = Instant::now() + policy::SETTLE;
                    while let Handback::Signal(sig) = reporter.settle(signals, until).await {
                        self.on_signal(sig, Life::on_signal_while_settling);
                        if self.life.is_stopped() {
                            break;
                        }
                    }
                    settled = true;
                }
            }
        }
    }

    /// Stops CMD, waits the backoff and the cluster's files, and starts CMD again.
    /// `Ok(true)`: CMD runs again; `Ok(false)`: a stop signal came first, and
    /// `self.life` says how exec ends.
    async fn restart(
        &mut self,
        reporter: &mut impl Reporter,
        signals: &mut Signals,
        step: Restart,
        trigger: &Trigger,
    ) -> Result<bool, Failure> {
        let program = self.program.clone();
        let first;
        let trigger = match trigger {
            Trigger::Failure { failed, own: true } => {
                reporter.failed(failed).await;
                if !self.await_earlier_failure(reporter, signals, failed).await {
                    return Ok(false);
                }
                first = Trigger::Failure {
                    failed: reporter.first_failure(failed),
                    own: true,
                };
                &first
            }
            _ => trigger,
        };
        let (why, after_what) = match trigger {
            Trigger::PeerChange(stale) => {
                (format!("the cluster changed ({stale})"), "a peer change")
            }
            Trigger::Stall(why) => (why.clone(), "a stall"),
            Trigger::Failure { failed, .. } => (failed.why.clone(), "a failure"),
        };
        let note = format!(
            "restarting {program} ({} of {}) in {}: {why}",
            step.n,
            step.of,
            humantime::format_duration(step.delay)
        );
        warn!("{note}");
        reporter.restarting(step.n, note).await;
        let policy = reporter.policy().clone();
        if self.stop(signals, &policy).await.is_some() {
            self.step(Life::stopped);
            return Ok(false);
        }
        let respawner = &self.respawner;
        let next = tokio::select! {
            next = async {
                let resume =
                    resume_after(reporter, trigger, step.delay, policy.grace, &program).await;
                if resume != Resume::AsItWas {
                    reporter.wait_for_files().await?;
                }
                respawner.command(resume).await
            } => next.map_err(|f| Failure::new(f.code, format!("restarting after {after_what}: {}", f.message)))?,
            s = wait_for_stop(signals) => {
                // CMD is not running: say so, not how the stopped CMD ended.
                let what = match trigger {
                    Trigger::PeerChange(stale) => format!("a peer change ({stale})"),
                    Trigger::Stall(why) => format!("a stall ({why})"),
                    Trigger::Failure { failed, .. } => format!("a failure ({})", failed.why),
                };
                self.step(|l| l.interrupted(s, &program, &what));
                return Ok(false);
            }
        };
        let watch = reporter.output_watch();
        self.cmd = spawn(next, &program, watch.as_ref())?;
        reporter.started_again();
        self.step(|l| l.restarted(step.n));
        Ok(true)
    }

    /// CMD failed and its peers were told: waits [`policy::EARLIER_FAILURE`] for a
    /// peer's failure that came first. `false`: a stop signal came, and exec ends.
    async fn await_earlier_failure(
        &mut self,
        reporter: &mut impl Reporter,
        signals: &mut Signals,
        failed: &Failed,
    ) -> bool {
        let until = Instant::now() + policy::EARLIER_FAILURE;
        while let Handback::Signal(sig) =
            reporter.await_earlier_failure(signals, failed, until).await
        {
            self.on_signal(sig, Life::on_signal_while_settling);
            if self.life.is_stopped() {
                return false;
            }
        }
        true
    }

    /// Stops what is left of CMD's tree when exec was asked to stop, and makes the last
    /// report with exec's status.
    async fn end(mut self, reporter: &mut impl Reporter, signals: &mut Signals) -> Ended {
        if self.life.stops_tree() {
            // The kubelet stops the container: nothing of CMD's tree outlives exec.
            let grace = reporter.policy().grace;
            stop_tree(&mut self.cmd, signals, grace).await;
        }
        self.cmd.drain();
        let code = self.life.status(self.cmd.exit);
        let oom = reporter.finish(code, (self.cmd.pid, self.cmd.exit)).await;
        Ended {
            code,
            oom,
            why: self.life.why(),
        }
    }

    /// Stops CMD's tree for a restart or an exit; the stop signal that came meanwhile.
    async fn stop(&mut self, signals: &mut Signals, policy: &Policy) -> Option<i32> {
        stop_tree(&mut self.cmd, signals, policy.grace).await
    }
}

/// Restart `n` of `of`, after `delay`.
struct Restart {
    n: u32,
    of: u32,
    delay: std::time::Duration,
}
