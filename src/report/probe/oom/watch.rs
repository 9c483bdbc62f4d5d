//! Watching for OOM kills: the cgroups to watch (the own one in exec mode; the training
//! container's through `--cgroup-root` in the sidecar), their notifiers, the counters
//! read after each notification, and in exec mode CMD's process tree, which names the
//! victim. Kills seen in pod status are recorded here too, so the ledger counts each
//! kill once whichever source saw it first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use tracing::{debug, info};

use crate::flags;
use crate::report::Mode;
use crate::report::pod::{self, PodView};
use crate::report::probe::oom::{
    self, Cgroup, CgroupVersion, Notifier, OomCounters, OomKill, OomLedger, ProcStat, SeenProc,
    procs,
};

/// How often an OOM counter is read when no notifier could be set up.
pub const POLL: Duration = Duration::from_millis(250);
/// How long a process of CMD's tree stays a candidate victim after it was last seen.
const RECENT: Duration = Duration::from_secs(5);
/// How often exec mode refreshes its snapshot of CMD's process tree while it polls
/// for OOM kills (no notifier available).
pub const TREE_REFRESH: Duration = Duration::from_secs(1);
/// How often exec mode reads its cgroup's memory usage and process list. A victim is
/// named from the last snapshot of CMD's tree taken while it lived: the OOM
/// notification comes as the kernel kills, and the victim's parent may have reaped it
/// before a snapshot taken then. So a snapshot is also taken whenever memory grows by
/// [`GROWTH_STEP`] of the limit, and whenever a process is in the cgroup that the last
/// snapshot did not see: a process that takes the container to its limit is in one
/// before it is killed, and one that ended before it started is known to be gone. At
/// rest that is two small reads per tick (about 20 µs).
pub const GROWTH_POLL: Duration = Duration::from_millis(250);
/// How the victim of a kill is waited for: see `record_cgroup_kills`.
const VICTIM_POLL: Duration = Duration::from_millis(5);
const VICTIM_TRIES: u32 = 200;
const VICTIM_FIRST_CHOICE_TRIES: u32 = 10;
/// The share of the memory limit by which usage grows before a snapshot: 1/16.
const GROWTH_STEP: u64 = 16;
/// After an OOM notification without a kill counted yet, the counters are read again
/// this often until the kill shows (the kernel notifies as it kills).
pub const RECHECK: Duration = Duration::from_millis(10);

/// A watched cgroup.
struct Watched {
    container: String,
    container_id: String,
    cgroup: Cgroup,
    last: OomCounters,
    notifier: Option<tokio::task::JoinHandle<()>>,
    how: String,
    /// The cgroup's memory limit, and its usage and processes at the last snapshot of
    /// CMD's tree.
    limit: Option<u64>,
    usage_at_snapshot: u64,
    pids_at_snapshot: BTreeSet<u32>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(h) = self.notifier.take() {
            h.abort();
        }
    }
}

pub struct OomWatch {
    mode: Mode,
    proc_root: PathBuf,
    page_size: u64,
    self_pid: u32,
    watched: Vec<Watched>,
    tx: tokio::sync::mpsc::UnboundedSender<usize>,
    rx: tokio::sync::mpsc::UnboundedReceiver<usize>,
    /// Under OOM without a kill yet: look again soon, until then.
    pub recheck_until: Option<Instant>,
    /// The latest snapshot of CMD's process tree.
    pub tree: BTreeMap<u32, ProcStat>,
    pub tree_at: Option<Instant>,
    /// Every process of the tree seen in the last [`RECENT`], with when: the OOM
    /// victim is among them even when a snapshot taken after the kill no longer has it.
    recent: BTreeMap<u32, SeenProc>,
    pub ledger: OomLedger,
    /// Why a cgroup cannot be watched, by `oom` or `oom:<container>`.
    pub errors: BTreeMap<String, String>,
}

impl OomWatch {
    pub fn new(mode: Mode, proc_root: &Path, started: SystemTime) -> OomWatch {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        OomWatch {
            mode,
            proc_root: proc_root.to_path_buf(),
            page_size: procs::page_size(),
            self_pid: std::process::id(),
            watched: Vec::new(),
            tx,
            rx,
            recheck_until: None,
            tree: BTreeMap::new(),
            tree_at: None,
            recent: BTreeMap::new(),
            ledger: OomLedger::new(started),
            errors: BTreeMap::new(),
        }
    }

    /// Waits for a notifier to fire.
    pub async fn notified(&mut self) -> Option<usize> {
        self.rx.recv().await
    }

    /// Whether some cgroup has no notifier and must be polled.
    pub fn any_polled(&self) -> bool {
        self.watched.iter().any(|w| w.notifier.is_none())
    }

    pub fn is_watching(&self) -> bool {
        !self.watched.is_empty()
    }

    /// What is watched, e.g. `cgroup v1 /sys/fs/cgroup/memory/... (eventfd)`.
    pub fn sources(&self) -> Vec<String> {
        self.watched
            .iter()
            .map(|w| {
                format!(
                    "cgroup {} {} ({})",
                    match w.cgroup.version {
                        CgroupVersion::V1 => "v1",
                        CgroupVersion::V2 => "v2",
                    },
                    w.cgroup.path.display(),
                    w.how
                )
            })
            .collect()
    }

    /// Exec mode: names the own cgroup's container once the pod says which it is.
    pub fn name_own(&mut self, container: String) {
        if let Some(w) = self.watched.first_mut()
            && w.container_id.is_empty()
        {
            w.container = container;
        }
    }

    /// Starts watching a cgroup: the baseline counters and a notifier task.
    pub fn watch_cgroup(&mut self, container: String, container_id: String, cgroup: Cgroup) {
        let last = match cgroup.counters() {
            Ok(c) => c,
            Err(e) => {
                self.errors
                    .insert(format!("oom:{container}"), e.to_string());
                return;
            }
        };
        self.errors.remove(&format!("oom:{container}"));
        let idx = self.watched.len();
        let (notifier, how) = match Notifier::new(&cgroup) {
            Ok(mut n) => {
                let kind = n.kind();
                let tx = self.tx.clone();
                let task = tokio::spawn(async move {
                    while n.wait().await.is_ok() {
                        if tx.send(idx).is_err() {
                            return;
                        }
                    }
                });
                (Some(task), kind.to_string())
            }
            Err(why) => {
                debug!("polling {} every {POLL:?}: {why}", cgroup.path.display());
                (None, format!("polled every {}ms", POLL.as_millis()))
            }
        };
        info!(
            container = %container,
            cgroup = %cgroup.path.display(),
            how = %how,
            "watching OOM kills"
        );
        let limit = cgroup.limit();
        let usage_at_snapshot = cgroup.usage().0.unwrap_or(0);
        let pids_at_snapshot = cgroup.pids().unwrap_or_default();
        self.watched.push(Watched {
            container,
            container_id,
            cgroup,
            last,
            notifier,
            how,
            limit,
            usage_at_snapshot,
            pids_at_snapshot,
        });
    }

    /// Sidecar with `--cgroup-root`: finds the cgroups of the pod's (non-trainlet)
    /// containers by pod UID and container ID, again whenever a container restarts.
    pub fn resolve_container_cgroups(&mut self, root: &Path, view: &PodView) {
        let Some(pod) = view.pod.as_ref() else {
            return;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let wanted: Vec<(String, String)> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter(|c| !pod::is_trainlet_container(c))
            .filter_map(|c| {
                let id = view.status(&c.name)?.container_id.clone()?;
                Some((c.name.clone(), id))
            })
            .collect();
        let before = self.watched.len();
        self.watched.retain(|w| {
            wanted
                .iter()
                .any(|(n, id)| *n == w.container && *id == w.container_id)
        });
        if self.watched.len() != before {
            // Indexes changed: restart every notifier with its new index.
            let old: Vec<Watched> = std::mem::take(&mut self.watched);
            for mut w in old {
                let (c, id, cg) = (
                    w.container.clone(),
                    w.container_id.clone(),
                    w.cgroup.clone(),
                );
                if let Some(h) = w.notifier.take() {
                    h.abort();
                }
                self.watch_cgroup(c, id, cg);
            }
        }
        for (name, id) in wanted {
            if self.watched.iter().any(|w| w.container == name) {
                continue;
            }
            match oom::find_container_cgroup(root, &uid, &id) {
                Some((version, path)) => {
                    self.watch_cgroup(name, id, Cgroup { version, path });
                }
                None => {
                    self.errors.insert(
                        format!("oom:{name}"),
                        format!(
                            "no cgroup of container {name} ({id}) for pod UID {uid} under --{} {}",
                            flags::CGROUP_ROOT,
                            root.display()
                        ),
                    );
                }
            }
        }
    }

    /// Exec mode with a memory limit: whether usage is watched for growth.
    pub fn watches_growth(&self) -> bool {
        self.mode == Mode::Exec && self.watched.iter().any(|w| w.limit.is_some())
    }

    /// Exec mode, every [`GROWTH_POLL`]: a snapshot of CMD's tree when memory has grown
    /// by [`GROWTH_STEP`] of the limit since the last one, or a process has come.
    pub fn on_growth_tick(&mut self) {
        let mut due = false;
        for w in &mut self.watched {
            let (Some(limit), (Some(usage), _)) = (w.limit, w.cgroup.usage()) else {
                continue;
            };
            if usage >= w.usage_at_snapshot.saturating_add(limit / GROWTH_STEP) {
                due = true;
            } else if usage < w.usage_at_snapshot {
                w.usage_at_snapshot = usage;
            }
            if w.cgroup
                .pids()
                .is_some_and(|pids| !pids.is_subset(&w.pids_at_snapshot))
            {
                due = true;
            }
        }
        if due {
            self.refresh_tree();
        }
    }

    /// Exec mode: the snapshot of CMD's process tree (every descendant of trainlet).
    pub fn refresh_tree(&mut self) {
        for w in &mut self.watched {
            if let (Some(usage), _) = w.cgroup.usage() {
                w.usage_at_snapshot = usage;
            }
            w.pids_at_snapshot = w.cgroup.pids().unwrap_or_default();
        }
        let all = procs::all_processes(&self.proc_root, self.page_size);
        self.tree = procs::descendants(&all, self.self_pid);
        let now = Instant::now();
        self.tree_at = Some(now);
        // Read after the scan: a process the scan missed while the count was still
        // this low was gone before any kill it could be the victim of.
        let kills = self
            .watched
            .first()
            .and_then(|w| w.cgroup.counters().ok())
            .map_or(0, |c| c.oom_kill);
        for (pid, seen) in self.recent.iter_mut() {
            if seen.vanished.is_none() && !self.tree.contains_key(pid) {
                seen.vanished = Some(kills);
            }
        }
        for (pid, p) in &self.tree {
            self.recent.insert(
                *pid,
                SeenProc {
                    stat: p.clone(),
                    seen: now,
                    vanished: None,
                },
            );
        }
        self.recent
            .retain(|_, p| now.duration_since(p.seen) <= RECENT);
    }

    /// Exec mode: a process of the tree that was reaped with a status other than a
    /// SIGKILL's is no OOM victim, even if a kill the counters show later finds it gone.
    pub fn ended_by_itself(&mut self, pid: u32) {
        self.recent.remove(&pid);
    }

    /// Kills that pod status shows (OOMKilled terminations), not yet in the ledger.
    pub fn record_status(&mut self, view: &PodView, training: Option<&str>) -> Vec<OomKill> {
        let Some(pod) = view.pod.as_ref() else {
            return Vec::new();
        };
        let limit = view.container(training).and_then(pod::memory_limit);
        let mut out = Vec::new();
        for s in oom::status_ooms(pod) {
            let limit = pod::training_container(pod, Some(&s.container))
                .and_then(pod::memory_limit)
                .or_else(|| limit.clone());
            if let Some(kill) = self.ledger.record_status(&s, limit) {
                out.push(kill);
            }
        }
        out
    }

    /// Reads the counters; each increase becomes OOM kills, attributed to processes in
    /// exec mode. Returns the new kills.
    pub async fn check(&mut self, notified: bool, view: &PodView) -> Vec<OomKill> {
        if notified && self.mode == Mode::Exec {
            // v1 signals before the kill: the victim may still be in /proc now.
            self.refresh_tree();
        }
        let mut kills = Vec::new();
        for i in 0..self.watched.len() {
            let now = match self.watched[i].cgroup.counters() {
                Ok(c) => c,
                Err(e) => {
                    debug!("{e}");
                    continue;
                }
            };
            let last = self.watched[i].last;
            self.watched[i].last = now;
            let n = now.oom_kill.saturating_sub(last.oom_kill);
            let group = now.oom_group_kill > last.oom_group_kill;
            if n == 0 {
                if now.under_oom || notified {
                    // Under OOM, the kill is about to happen: look again soon.
                    self.recheck_until = Some(Instant::now() + Duration::from_secs(2));
                }
                continue;
            }
            kills.extend(
                self.record_cgroup_kills(i, n, group, last.oom_kill, view)
                    .await,
            );
        }
        if !kills.is_empty() {
            self.recheck_until = None;
            if self.mode == Mode::Exec {
                self.refresh_tree();
            }
        }
        kills
    }

    async fn record_cgroup_kills(
        &mut self,
        i: usize,
        kills: u64,
        group: bool,
        kills_before: u64,
        view: &PodView,
    ) -> Vec<OomKill> {
        let container = self.watched[i].container.clone();
        let cg = self.watched[i].cgroup.clone();
        let victims = if self.mode == Mode::Exec {
            // The counter rises as the victim is sent SIGKILL; give it a moment to die:
            // looked at every 5 ms for up to a second. A process that dies takes a few
            // ms; one that a snapshot first missed once the count had risen (its parent
            // reaped it before the notification was handled) is taken after 50 ms,
            // when no process alive in the last snapshot has died instead.
            let mut picked = Vec::new();
            let mut gone = BTreeSet::new();
            for attempt in 0..VICTIM_TRIES {
                gone = self
                    .recent
                    .keys()
                    .copied()
                    .filter(|pid| procs::is_gone(&self.proc_root, *pid, self.page_size))
                    .collect();
                // A zombie that exited (CMD failing at once when its worker was
                // killed) is gone, but no victim.
                let victims: BTreeSet<u32> = gone
                    .iter()
                    .copied()
                    .filter(|pid| !procs::ended_by_itself(&self.proc_root, *pid))
                    .collect();
                picked = procs::pick_victims(
                    &self.recent,
                    &victims,
                    kills_before,
                    kills as usize,
                    attempt >= VICTIM_FIRST_CHOICE_TRIES,
                );
                if picked.len() >= kills as usize {
                    break;
                }
                tokio::time::sleep(VICTIM_POLL).await;
            }
            // Whatever vanished is accounted for now, victim or not.
            self.recent
                .retain(|pid, p| !gone.contains(pid) && p.vanished.is_none());
            picked
        } else {
            Vec::new()
        };
        let (usage, peak) = cg.usage();
        let limit = cg
            .limit()
            .map(oom::quantity)
            .or_else(|| view.container(Some(&container)).and_then(pod::memory_limit));
        let now = SystemTime::now();
        let mut out = Vec::new();
        for k in 0..kills as usize {
            let kill = OomKill {
                time: crate::time::rfc3339_seconds(now),
                container: container.clone(),
                source: "cgroup",
                process: victims.get(k).cloned(),
                group,
                memory_usage: usage,
                memory_peak: peak,
                memory_limit: limit.clone(),
                restart_count: None,
                exit_code: None,
            };
            self.ledger.record_cgroup(kill.clone(), now);
            out.push(kill);
        }
        out
    }
}
