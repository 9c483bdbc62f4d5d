//! The agent's loop, in two halves: [`Engine::next_input`] waits on everything at once
//! and says what woke it, as one [`Input`]; [`Engine::on_input`] handles it. exec's
//! loop (`exec.rs`) and the sidecar's (`sidecar.rs`) are each these two calls and the
//! condition that ends them.

use std::time::{Duration, Instant, SystemTime};

use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use tracing::{info, warn};

use super::Engine;
use super::link::next_pod;
use crate::peers::drift as peer_watch;
use crate::report::probe::gpu::events::GpuEvent;
use crate::report::probe::oom::watch as oom_watch;
use crate::signal::{self, Signals};

/// What woke the loop.
pub(super) enum Input {
    /// A signal, or `None` when the signal stream ended.
    Signal(Option<i32>),
    /// The own pod's watch: the pod, a watch error, or its end.
    Pod(Option<Result<Pod, watcher::Error>>),
    /// One event of the peer watch.
    Peer(usize, peer_watch::PeerEvent),
    /// exec: the sidecar's `peers.json` changed.
    PeersFile,
    /// The sidecar: exec's observation changed.
    Observations,
    /// exec: a person asks for CMD's Python stacks (`trainlet stacks`).
    StacksAsked(tokio::net::UnixStream),
    /// NVML: an XID error, a lost GPU, the registration.
    Gpu(GpuEvent),
    /// An OOM notifier fired.
    OomNotified,
    /// Every `--interval`; `polled`: the fast poll watches OOM kills, not this.
    Probe { polled: bool },
    /// exec: the moment a stall would begin.
    StallDue,
    /// The fast OOM poll, where no notifier watches (or just after a kill).
    Fast { period: Duration },
    /// The cgroup v2 growth poll.
    Growth,
    /// The outbox's next write is due.
    Publish,
}

/// The loop's own state between inputs: the pod watch and the timers.
pub(super) struct Wake {
    pub(super) pods: Option<BoxStream<'static, Result<Pod, watcher::Error>>>,
    next_probe: Instant,
    next_fast: Instant,
    next_growth: Instant,
}

impl Engine {
    /// The loop's state, from now: every timer due at once.
    pub(super) fn wake(&self) -> Wake {
        let now = Instant::now();
        Wake {
            pods: self.pod_stream(),
            next_probe: now,
            next_fast: now,
            next_growth: now,
        }
    }

    /// Waits for the next input.
    pub(super) async fn next_input(&mut self, wake: &mut Wake, signals: &mut Signals) -> Input {
        let far = || Instant::now() + Duration::from_secs(86400);
        let recheck = self
            .probes
            .oom
            .recheck_until
            .is_some_and(|t| t > Instant::now());
        // With an OOM notifier (v1 eventfd, v2 inotify) exec mode needs no fast tick:
        // the probe refreshes CMD's tree every --interval and a notification refreshes
        // it at once, while the victim is still in /proc. A 1 s tree refresh here cost
        // 0.1-0.2 % of a core at rest.
        let fast_period = (self.probes.oom.any_polled() || recheck).then(|| {
            if self.probes.oom.recheck_until.is_some() {
                oom_watch::RECHECK
            } else {
                oom_watch::POLL
            }
        });
        let growth = self.probes.oom.watches_growth();
        let stall_at = self.stall_check_at();
        let publish = self.outbox.next();
        tokio::select! {
            sig = signals.recv() => Input::Signal(sig),
            ev = next_pod(&mut wake.pods) => Input::Pod(ev),
            input = self.role.next() => input,
            Some(ev) = self.probes.gpus.next_event() => Input::Gpu(ev),
            Some(_idx) = self.probes.oom.notified() => Input::OomNotified,
            _ = tokio::time::sleep_until(wake.next_probe.into()) => Input::Probe {
                polled: fast_period.is_some(),
            },
            _ = tokio::time::sleep_until(stall_at.unwrap_or_else(far).into()), if stall_at.is_some() => Input::StallDue,
            _ = tokio::time::sleep_until(wake.next_fast.into()), if fast_period.is_some() => Input::Fast {
                period: fast_period.unwrap_or(oom_watch::POLL),
            },
            _ = tokio::time::sleep_until(wake.next_growth.into()), if growth => Input::Growth,
            _ = tokio::time::sleep_until(publish.unwrap_or_else(far).into()), if publish.is_some() => Input::Publish,
        }
    }

    /// Handles one input. exec's loop hands signals back to the supervisor before
    /// they get here: only the sidecar's come.
    pub(super) async fn on_input(&mut self, input: Input, wake: &mut Wake) {
        match input {
            Input::Signal(sig) => self.on_signal(sig),
            Input::Pod(Some(Ok(pod))) => {
                self.on_pod(pod);
                self.refresh();
            }
            Input::Pod(Some(Err(e))) => {
                self.metrics.api_errors.inc();
                warn!("watching the own pod: {e}; the watch retries with backoff");
            }
            Input::Pod(None) => wake.pods = None,
            Input::Peer(..) | Input::PeersFile | Input::Observations | Input::StacksAsked(_) => {
                self.on_role_input(input)
            }
            Input::Gpu(ev) => {
                self.on_gpu_event(ev);
                self.refresh();
            }
            Input::OomNotified => {
                self.check_oom(true).await;
                self.refresh();
            }
            Input::Probe { polled } => {
                self.probe();
                if self.probes.oom.is_watching() && !polled {
                    // A safety net under the notifiers.
                    self.check_oom(false).await;
                }
                self.refresh();
                wake.next_probe = Instant::now() + self.cfg.probes.interval;
            }
            Input::StallDue => {
                // The moment a stall would begin: CMD's CPU over it for the note.
                self.probes.oom.refresh_tree();
                self.check_progress(false);
                self.refresh();
            }
            Input::Fast { period } => {
                self.on_fast_tick().await;
                wake.next_fast = Instant::now() + period;
            }
            Input::Growth => {
                self.probes.oom.on_growth_tick();
                wake.next_growth = Instant::now() + oom_watch::GROWTH_POLL;
            }
            Input::Publish => self.outbox.send(&self.metrics, &self.ready).await,
        }
    }

    /// The sidecar's signal (it asks for SIGTERM and SIGINT only): it stops the agent.
    fn on_signal(&mut self, sig: Option<i32>) {
        if let Some(s) = sig {
            info!("{}: stopping", signal::name(s));
        }
        self.stopping = true;
    }

    /// The fast OOM check, while a kill may be on its way: the kill counters, and in
    /// exec CMD's process tree now and then, so that a victim can be named.
    async fn on_fast_tick(&mut self) {
        if self
            .probes
            .oom
            .recheck_until
            .is_some_and(|t| t <= Instant::now())
        {
            self.probes.oom.recheck_until = None;
        }
        let before = self.probes.oom.ledger.total;
        self.check_oom(false).await;
        if self.role.exec().is_some()
            && self
                .probes
                .oom
                .tree_at
                .is_none_or(|t| t.elapsed() >= oom_watch::TREE_REFRESH)
        {
            self.probes.oom.refresh_tree();
        }
        if self.probes.oom.ledger.total != before {
            self.refresh();
        }
    }

    /// Reads the OOM counters and names the victims ([`crate::report::probe::oom`]);
    /// each kill is told once.
    pub(super) async fn check_oom(&mut self, notified: bool) {
        for kill in self.probes.oom.check(notified, &self.view).await {
            self.kill_in_cmd(SystemTime::now());
            self.announce_kill(&kill, true);
        }
    }
}
