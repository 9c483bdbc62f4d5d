//! exec's stall watch, as the agent runs it ([`crate::stall`] holds the rule).
//!
//! exec: every `--interval`, and at the moment a stall would begin
//! ([`Engine::stall_check_at`], which the loop wakes at), it looks at the heartbeat
//! file, what CMD printed and CMD's CPU time, checks for a stall, and on one records
//! the `Stalled` Event (its note: what CMD did over the window, CPU, GPU utilization)
//! through [`Engine::record`]. It acts on a stall, its own or a peer's from the peer
//! watch or `peers.json` ([`Engine::act_on_stall`]): the supervisor then restarts or
//! stops CMD. Handing over, the stall goes to the sidecar in exec's observations, and
//! the sidecar publishes it. Either publishes `trainlet.io/progress`, which every
//! peer's watch reads, and the progress metrics.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::path::Path;

use tracing::{info, warn};

use super::Engine;
use crate::event::Event;
use crate::handover::observation::{MAX_TEXT, ProgressObservation};
use crate::metrics::ContainerLabel;
use crate::reason::Reason;
use crate::stacks::{self, summary};
use crate::stall::peers::{PeerStall, annotation};
use crate::stall::progress::{Progress, Reported};
use crate::stall::watching::News;
use crate::stall::watching::Watching;
use crate::supervise::policy::OnStall;

impl Engine {
    /// `standing` (stalled, silent): `None` without `--stall-after`, when nothing is
    /// ever called stalled and `trainlet_stalled` and `trainlet_silent` have no series.
    pub(super) fn set_progress_metrics(&self, p: &Progress, standing: Option<(bool, bool)>) {
        let label = ContainerLabel {
            container: self.container_name(),
        };
        if let Some((stalled, silent)) = standing {
            self.metrics
                .progress
                .stalled
                .get_or_create(&label)
                .set(i64::from(stalled));
            self.metrics
                .progress
                .silent
                .get_or_create(&label)
                .set(i64::from(silent));
        }
        if let Some(at) = p.at {
            let secs = at
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.metrics
                .progress
                .last_progress
                .get_or_create(&label)
                .set(secs);
        }
        if let Some(step) = p.step {
            self.metrics
                .progress
                .progress_step
                .get_or_create(&label)
                .set(step);
        }
        self.set_reported_metrics(&label, p.reported.as_ref());
    }

    /// The last report through the Kubeflow endpoint: its percentage, ETA and numeric
    /// metrics (a value that is no number has no series), in place of the report
    /// before; none before the first (a restarted exec's sidecar keeps no old ones).
    fn set_reported_metrics(&self, label: &ContainerLabel, r: Option<&Reported>) {
        let none = Reported::default();
        let r = r.unwrap_or(&none);
        let numbers: Vec<(&str, f64)> = r
            .metrics
            .iter()
            .filter_map(|m| {
                let v = m.value.trim().parse::<f64>().ok()?;
                v.is_finite().then_some((m.name.as_str(), v))
            })
            .collect();
        self.metrics
            .progress
            .set_reported(&label.container, r.percent, r.eta_seconds, &numbers);
    }

    /// `trainlet.io/progress` as of now, for the annotations: exec's own progress
    /// where it publishes, else (the sidecar) what exec handed over, whose metrics it
    /// serves too.
    pub(super) fn progress_annotation(&mut self) -> Option<String> {
        let o = match (self.own_progress(), self.role.inbox()) {
            (Some(o), _) if !self.role.hands_over() => o,
            (_, Some(inbox)) => {
                let o = inbox.fresh(SystemTime::now())?.progress.clone()?;
                let p = Progress {
                    at: o.at_ms.map(crate::time::from_ms),
                    step: o.step,
                    reported: o.reported.clone(),
                    ..Progress::default()
                };
                self.set_progress_metrics(&p, o.after_ms.map(|_| (o.stalled, o.silent)));
                o
            }
            _ => return None,
        };
        let after = o.after_ms.map(Duration::from_millis);
        let own = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref());
        let relayed = self
            .role
            .peers()
            .map(|p| p.to_relay(own))
            .unwrap_or_default();
        let a = annotation(&o, self.progress.as_ref(), after, &relayed);
        let text = serde_json::to_string(&a).expect("plain data");
        self.progress = Some(a);
        Some(text)
    }
}

impl Engine {
    /// exec's progress as it publishes it or hands it over: the stall watch's, and its
    /// run of CMD for the group restart (`--on-failure restart`); `None` with neither.
    pub(super) fn own_progress(&self) -> Option<ProgressObservation> {
        let e = self.role.exec()?;
        let mut o = match &e.watching {
            Some(w) => observation(w),
            None if e.group.on() => ProgressObservation::default(),
            None => return None,
        };
        e.group.fill(&mut o);
        o.restarts = e.restarts;
        o.stuck_at = e.stacks.places.clone();
        Some(o)
    }
}

/// exec's progress as it hands it over, its note bounded.
pub(super) fn observation(w: &Watching) -> ProgressObservation {
    let mut o = w.observation();
    o.note = crate::publish::truncate(&o.note, MAX_TEXT);
    o
}

impl Engine {
    /// exec, every `--interval`: the heartbeat, a CPU sample, and the stall check.
    /// `ended`: CMD has exited, and only an end of a stall is news.
    pub(super) fn check_progress(&mut self, ended: bool) {
        let now = SystemTime::now();
        let ticks: u64 = self.probes.oom.tree.values().map(|p| p.cpu_ticks).sum();
        let Some(mut w) = self.role.exec_mut().and_then(|e| e.watching.take()) else {
            return;
        };
        let progress = w.sample(now, ticks, self.cfg.probes.interval);
        let news = if w.judges(ended) {
            let peers = self.peer_progress();
            w.check(&progress, peers, now, || self.probes.gpus.utilization())
        } else {
            None
        };
        let standing = w.standing();
        // Where CMD is stuck, before anything restarts or stops it: in the Event's note,
        // and in what exec hands over, which the sidecar's Event takes its note from.
        let news = match news {
            Some(News::Stalled { n, .. }) => {
                let at = self.capture_stacks(&format!("at stall {n}"), now);
                Some(News::Stalled {
                    n,
                    note: w.note_where(&at),
                })
            }
            other => other,
        };
        if let Some(e) = self.role.exec_mut() {
            e.watching = Some(w);
        }
        match news {
            Some(News::Stalled { n, note }) => {
                warn!(stall = n, "{note}");
                self.record(Event::warning(Reason::Stalled, note), true);
            }
            Some(News::Resumed) => {
                info!("{} makes progress again", self.container_name());
                self.forget_stacks();
            }
            None => self.capture_for_peers(standing, now),
        }
        self.set_progress_metrics(&progress, standing);
    }

    /// exec: when to check for a stall besides every `--interval`: the moment one would
    /// begin ([`crate::stall::watching::StallWatch::due`]), while no check judged it
    /// (a moment passed without a stall, a rank only silent, waits for the probes).
    pub(super) fn stall_check_at(&self) -> Option<std::time::Instant> {
        let look = self.look_until().filter(|t| *t > SystemTime::now());
        let due = match (self.role.exec()?.watching.as_ref()?.due(), look) {
            (Some(d), Some(l)) => d.min(l),
            (d, l) => d.or(l)?,
        };
        // Past already (exec got to it late): at once.
        let left = due.duration_since(SystemTime::now()).unwrap_or_default();
        // A millisecond past it, so that the check's own clock reads it as passed.
        Some(std::time::Instant::now() + left + Duration::from_millis(1))
    }

    /// exec with `--on-stall restart|exit`: the stall to act on, while CMD runs: its
    /// own, or a peer's ([`crate::stall::peers::to_act_on`]).
    pub(super) fn act_on_stall(&self) -> Option<String> {
        let e = self.role.exec()?;
        if e.cfg.restart.on_stall == OnStall::Report {
            return None;
        }
        if self.look_until().is_some_and(|t| SystemTime::now() < t) {
            return None;
        }
        let w = e.watching.as_ref()?;
        let peers = self.peer_stalls();
        let own = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref());
        w.to_act_on(|| self.container_name(), &peers, own)
    }

    /// Until when a stall waits before exec stops CMD for it: [`PEERS_LOOK`] after this
    /// pod read its stacks for it, where it has peers. They learn of the stall from the
    /// teller's annotation within a watch event (a tenth of a second on a node) and
    /// read their own stacks then; a pod that stopped its ranks at once would break the
    /// others' collectives, whose stacks would then show the error instead of the hang.
    fn look_until(&self) -> Option<SystemTime> {
        let looked = self.role.exec()?.stacks.looked?;
        self.cluster_view().map(|_| looked + PEERS_LOOK)
    }

    /// The latest progress another pod of the job published, where exec sees its
    /// peers: from `peers.json` handing over, else from its own peer watch.
    fn peer_progress(&self) -> Option<SystemTime> {
        let own = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref());
        self.cluster_view()?.peer_progress(own)
    }

    /// The peers' stalls exec knows of: from `peers.json` handing over, else from its
    /// own peer watch.
    fn peer_stalls(&self) -> Vec<PeerStall> {
        self.cluster_view().map(|v| v.stalled()).unwrap_or_default()
    }

    /// CMD started again: its silence counts from now, and the peers' stalls known now
    /// were answered by this restart. Called before the peer watch is made anew.
    pub(super) fn progress_restarted(&mut self) {
        let known = self.peer_stalls();
        if let Some(e) = self.role.exec_mut() {
            e.restarts += 1;
            e.stacks.places.clear();
            e.stacks.looked = None;
            if let Some(w) = e.watching.as_mut() {
                w.restarted(SystemTime::now(), known);
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Where CMD is stuck: its Python stacks, captured at its own stall, at a peer's (the
// job's stall is in every pod's stacks, and the answer is in comparing them), and
// when a person asks (`trainlet stacks`, through an abstract socket of the pod).

/// exec's captures of CMD's stacks.
#[derive(Default)]
pub(super) struct Stacks {
    /// Where each rank was at the last capture, for `trainlet.io/progress`.
    pub places: Vec<String>,
    /// The peer's stall (its start) the last capture was for: each is captured once.
    pub captured_for: Option<SystemTime>,
    /// When the last capture for a stall (this pod's or a peer's) was made: exec acts
    /// on the stall [`PEERS_LOOK`] later.
    pub looked: Option<SystemTime>,
    /// The socket `trainlet stacks` asks through.
    pub asked: Option<tokio::net::UnixListener>,
    /// When a person last asked: one capture a second at most.
    pub last_asked: Option<std::time::Instant>,
}

/// How long every pod of a job leaves its ranks where a stall left them after reading
/// its stacks for it, before it stops them: the other pods read theirs meanwhile.
const PEERS_LOOK: Duration = Duration::from_secs(1);
/// The least time between two captures a person asks for.
const ASK_EVERY: Duration = Duration::from_secs(1);
/// How long exec waits for `trainlet stacks` to take the dump.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The next connection to exec's stacks socket; pending for ever without one.
pub(super) async fn next_ask(
    listener: &mut Option<tokio::net::UnixListener>,
) -> tokio::net::UnixStream {
    let Some(l) = listener.as_ref() else {
        return std::future::pending().await;
    };
    match l.accept().await {
        Ok((stream, _)) => stream,
        Err(e) => {
            warn!("the stacks socket failed: {e}; no longer answering trainlet stacks");
            *listener = None;
            std::future::pending().await
        }
    }
}

impl Engine {
    /// Captures the Python stacks of CMD's processes (`why`: at a stall, for a peer's,
    /// asked): logs the whole dump, keeps where each rank is for `trainlet.io/progress`,
    /// and returns where the ranks are, short. Blocks the loop for the capture, at most
    /// [`crate::stacks::capture::BUDGET`].
    pub(super) fn capture_stacks(&mut self, why: &str, now: SystemTime) -> String {
        let (captures, _) = self.read_stacks(why);
        let at = summary::summary(&captures);
        if let Some(e) = self.role.exec_mut() {
            e.stacks.places = summary::places(&captures);
            e.stacks.captured_for.get_or_insert(now);
            e.stacks.looked = Some(SystemTime::now());
        }
        at
    }

    /// Reads the stacks of CMD's tree as it is now and logs the whole dump, which it
    /// returns beside them.
    fn read_stacks(&mut self, why: &str) -> (Vec<stacks::Capture>, String) {
        self.probes.oom.refresh_tree();
        let pids: Vec<u32> = self.probes.oom.tree.keys().copied().collect();
        let (captures, cut) = stacks::capture::capture(Path::new("/proc"), &pids);
        let dump = summary::dump(&captures, cut);
        info!(
            "Python stacks of the processes of {}, {why}:\n{dump}",
            self.container_name()
        );
        (captures, dump)
    }

    /// A peer stalls while this pod does not: this pod's stacks are half of the
    /// answer, captured once per peer's stall, and forgotten when it is over.
    fn capture_for_peers(&mut self, standing: Option<(bool, bool)>, now: SystemTime) {
        if standing.is_some_and(|(stalled, _)| stalled) {
            return;
        }
        let ongoing = self
            .peer_stalls()
            .iter()
            .filter(|s| s.ongoing)
            .map(|s| s.since)
            .max();
        let Some(since) = ongoing else {
            self.forget_stacks();
            return;
        };
        if self
            .role
            .exec()
            .is_some_and(|e| e.stacks.captured_for >= Some(since))
        {
            return;
        }
        self.capture_stacks("as a peer stalls", now);
        if let Some(e) = self.role.exec_mut() {
            e.stacks.captured_for = Some(since.max(now));
        }
    }

    /// A stall is to be acted on (restart or exit): a peer's, whose stacks this pod has
    /// not captured yet when the peer's word came before the next check.
    pub(super) fn stacks_before_acting(&mut self) {
        let standing = self
            .role
            .exec()
            .and_then(|e| e.watching.as_ref())
            .and_then(Watching::standing);
        self.capture_for_peers(standing, SystemTime::now());
    }

    /// CMD makes progress again: where it was stuck is no longer where it is.
    fn forget_stacks(&mut self) {
        if let Some(e) = self.role.exec_mut() {
            e.stacks.places.clear();
        }
    }

    /// Listens on the pod's abstract socket for `trainlet stacks`
    /// ([`stacks::socket_name`]); where another process holds the name, exec goes on
    /// without it.
    pub(super) fn listen_for_stacks(&mut self) {
        let name = stacks::socket_name(&self.container_name());
        match bind_abstract(&name) {
            Ok(l) => {
                if let Some(e) = self.role.exec_mut() {
                    e.stacks.asked = Some(l);
                }
            }
            Err(e) => warn!("cannot listen on @{name} for trainlet stacks: {e}"),
        }
    }

    /// A person asks: the dump goes back on the connection (and into exec's log), from
    /// a process of this user only, one capture a second at most.
    pub(super) fn answer_stacks(&mut self, stream: tokio::net::UnixStream) {
        // /proc/self belongs to this process's effective user.
        let own_uid = std::os::unix::fs::MetadataExt::uid;
        let ours = match (stream.peer_cred(), std::fs::metadata("/proc/self")) {
            (Ok(c), Ok(m)) => c.uid() == own_uid(&m),
            _ => false,
        };
        let Ok(mut stream) = stream.into_std() else {
            return;
        };
        let now = std::time::Instant::now();
        let text = if !ours {
            "trainlet exec answers only processes of its own user\n".to_string()
        } else if self
            .role
            .exec()
            .and_then(|e| e.stacks.last_asked)
            .is_some_and(|t| now.duration_since(t) < ASK_EVERY)
        {
            "trainlet exec captured the stacks less than a second ago; ask again\n".to_string()
        } else {
            if let Some(e) = self.role.exec_mut() {
                e.stacks.last_asked = Some(now);
            }
            let (captures, dump) = self.read_stacks("as asked");
            format!("{}\n{dump}", summary::summary(&captures))
        };
        use std::io::Write;
        let _ = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_write_timeout(Some(ANSWER_TIMEOUT)))
            .and_then(|()| stream.write_all(text.as_bytes()));
    }
}

/// A listener on the abstract Unix socket `name`, for tokio.
fn bind_abstract(name: &str) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(l)
}
