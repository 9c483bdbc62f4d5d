//! OOM kills: from cgroup counters, attributed to a process where possible, and from
//! pod status.
//!
//! - cgroup v2 counts kills in `memory.events` (`oom_kill`, plus `oom_group_kill` when
//!   `memory.oom.group` kills the whole group); cgroup v1 in the `oom_kill` line of
//!   `memory.oom_control`. These counters are the only place where a *child* process
//!   killed inside a container that keeps running shows up: kube-state-metrics and
//!   `kubectl describe` see only containers.
//! - Changes are noticed within about a second: v1 through an eventfd registered in
//!   `cgroup.event_control` (the kernel signals it when the cgroup goes under OOM, before
//!   the kill), v2 through inotify on `memory.events`, and fast polling where neither
//!   can be set up (a read-only cgroup mount has no writable `cgroup.event_control`).
//! - In exec mode a snapshot of CMD's process tree names the victim: the process that
//!   vanished when the counter rose, the largest first.
//! - Pod status counts too: `lastState.terminated.reason == OOMKilled`, once per
//!   terminated container instance.
//!
//! Parsers and bookkeeping are pure and unit-tested on the kernel's exact formats; the
//! file reads and notifiers are at the bottom.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum OomError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} has no {field} line: not a memory cgroup of a supported kernel")]
    Format { path: String, field: &'static str },
    #[error(
        "no memory cgroup found for this process in /proc/self/cgroup and /proc/self/mountinfo (is the cgroup filesystem mounted?)"
    )]
    NoOwnCgroup,
}

/// Which cgroup version a watched cgroup uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The OOM counters of one cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomCounters {
    /// Processes killed by the OOM killer in this cgroup.
    pub oom_kill: u64,
    /// Times the whole group was killed (v2 `memory.oom.group`).
    pub oom_group_kill: u64,
    /// The cgroup is under OOM right now (v1 `under_oom`).
    pub under_oom: bool,
}

fn key_values(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// Parses cgroup v1 `memory.oom_control`:
/// `oom_kill_disable 0\nunder_oom 0\noom_kill 3\n`. Kernels before 4.13 lack the
/// `oom_kill` line; then kills cannot be counted, only `under_oom` seen.
pub fn parse_oom_control_v1(text: &str) -> Option<OomCounters> {
    let kv = key_values(text);
    Some(OomCounters {
        oom_kill: *kv.get("oom_kill")?,
        oom_group_kill: 0,
        under_oom: kv.get("under_oom").is_some_and(|v| *v != 0),
    })
}

/// Parses cgroup v2 `memory.events`:
/// `low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n`.
/// `oom_group_kill` exists since Linux 5.17; older kernels count only `oom_kill`.
pub fn parse_memory_events_v2(text: &str) -> Option<OomCounters> {
    let kv = key_values(text);
    Some(OomCounters {
        oom_kill: *kv.get("oom_kill")?,
        oom_group_kill: kv.get("oom_group_kill").copied().unwrap_or(0),
        under_oom: false,
    })
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-ID:controller-list:cgroup-path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCgroup {
    pub id: u32,
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn parse_proc_cgroup(text: &str) -> Vec<ProcCgroup> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let id = parts.next()?.parse().ok()?;
            let controllers = parts
                .next()?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let path = parts.next()?.to_string();
            Some(ProcCgroup {
                id,
                controllers,
                path,
            })
        })
        .collect()
}

/// One line of `/proc/self/mountinfo`, the fields trainlet needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub root: String,
    pub mount_point: String,
    pub fstype: String,
    pub super_options: Vec<String>,
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let fstype = post.next()?.to_string();
            let _source = post.next()?;
            let super_options = post
                .next()
                .unwrap_or("")
                .split(',')
                .map(String::from)
                .collect();
            Some(Mount {
                root: unescape_mount(pre.get(3)?),
                mount_point: unescape_mount(pre.get(4)?),
                fstype,
                super_options,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v as char);
            i += 4;
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// The directory of this process's memory cgroup: the v1 `memory` hierarchy when one
/// is mounted (hybrid hosts mount v2 too, but without the memory controller), else the
/// v2 unified hierarchy.
pub fn own_memory_cgroup(proc_cgroup: &str, mountinfo: &str) -> Option<(CgroupVersion, PathBuf)> {
    let groups = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    let join = |mount: &Mount, path: &str| -> PathBuf {
        // Inside a cgroup namespace the mount root is the namespace root, and paths
        // are relative to it; outside, the mount root is `/`.
        let rel = path
            .strip_prefix(mount.root.trim_end_matches('/'))
            .unwrap_or(path)
            .trim_start_matches('/');
        Path::new(&mount.mount_point).join(rel)
    };
    if let Some(g) = groups
        .iter()
        .find(|g| g.controllers.iter().any(|c| c == "memory"))
        && let Some(m) = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == "memory"))
    {
        return Some((CgroupVersion::V1, join(m, &g.path)));
    }
    let g = groups
        .iter()
        .find(|g| g.id == 0 && g.controllers.is_empty())?;
    let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    Some((CgroupVersion::V2, join(m, &g.path)))
}

/// Whether a cgroup directory name belongs to the pod with this UID: `pod<uid>` with
/// the cgroupfs driver, `kubepods-burstable-pod<uid_with_underscores>.slice` with the
/// systemd driver.
pub fn is_pod_dir(name: &str, pod_uid: &str) -> bool {
    !pod_uid.is_empty()
        && (name.contains(&format!("pod{pod_uid}"))
            || name.contains(&format!("pod{}", pod_uid.replace('-', "_"))))
}

/// Whether a cgroup directory name belongs to this container: the bare ID (cgroupfs
/// driver) or `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`.
pub fn is_container_dir(name: &str, container_id: &str) -> bool {
    let id = container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id);
    !id.is_empty() && (name == id || name.strip_suffix(".scope").is_some_and(|n| n.ends_with(id)))
}

/// Finds a container's cgroup under the node's cgroup mount (`--cgroup-root`): the v1
/// `memory` hierarchy when present, else v2. A breadth-first walk, bounded in depth,
/// that runs only when a container ID changes.
pub fn find_container_cgroup(
    root: &Path,
    pod_uid: &str,
    container_id: &str,
) -> Option<(CgroupVersion, PathBuf)> {
    let (version, top) = if root.join("memory").join("memory.oom_control").exists()
        || root.join("memory").join("cgroup.procs").exists()
    {
        (CgroupVersion::V1, root.join("memory"))
    } else {
        (CgroupVersion::V2, root.to_path_buf())
    };
    let mut level = vec![(top, false)];
    for _depth in 0..8 {
        let mut next = Vec::new();
        for (dir, in_pod) in level {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = e.file_name().to_string_lossy().into_owned();
                if in_pod && is_container_dir(&name, container_id) {
                    return Some((version, e.path()));
                }
                next.push((e.path(), in_pod || is_pod_dir(&name, pod_uid)));
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    None
}

/// One line of `/proc/<pid>/stat`, the fields trainlet needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcStat {
    pub pid: u32,
    pub comm: String,
    #[serde(skip)]
    pub state: char,
    #[serde(skip)]
    pub ppid: u32,
    pub rss_bytes: u64,
}

/// `4242 (python) S 4200 4242 ... ` — comm may hold spaces and parentheses, so it
/// ends at the *last* `)`. RSS (field 24) is in pages.
pub fn parse_stat(text: &str, page_size: u64) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let state = rest.first()?.chars().next()?;
    let ppid = rest.get(1)?.parse().ok()?;
    let rss_pages: u64 = rest.get(21)?.parse().ok()?;
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
        rss_bytes: rss_pages * page_size,
    })
}

/// The descendants of `root` (not `root` itself), by pid.
pub fn descendants(procs: &[ProcStat], root: u32) -> BTreeMap<u32, ProcStat> {
    let mut children: HashMap<u32, Vec<&ProcStat>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = BTreeMap::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for c in children.get(&pid).into_iter().flatten() {
            if c.pid != root && out.insert(c.pid, (*c).clone()).is_none() {
                stack.push(c.pid);
            }
        }
    }
    out
}

/// The likely victims of `n` OOM kills: processes of the snapshot that are gone (or
/// zombies) now, largest RSS first. The OOM killer picks the largest process, so
/// among processes that vanished at the same moment the largest is the best guess.
pub fn victims(before: &BTreeMap<u32, ProcStat>, gone: &BTreeSet<u32>, n: usize) -> Vec<ProcStat> {
    let mut v: Vec<ProcStat> = before
        .values()
        .filter(|p| gone.contains(&p.pid))
        .cloned()
        .collect();
    v.sort_by(|a, b| b.rss_bytes.cmp(&a.rss_bytes).then(a.pid.cmp(&b.pid)));
    v.truncate(n);
    v
}

/// A process of CMD's tree as last seen, and when it vanished from a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenProc {
    pub stat: ProcStat,
    pub seen: std::time::Instant,
    pub vanished: Option<std::time::Instant>,
}

/// Picks the victims of `n` OOM kills among recently seen processes. First choice:
/// processes that were alive in the latest snapshot and are gone (or zombies) now;
/// second: those that vanished from a snapshot since the counter was last read (a
/// snapshot taken on the OOM notification may already miss the victim), only with
/// `second_choice`, as the caller gives the first choice a moment to die. A process
/// that exited before that is not a victim. Largest RSS first within each group.
pub fn pick_victims(
    recent: &BTreeMap<u32, SeenProc>,
    gone_now: &BTreeSet<u32>,
    since: std::time::Instant,
    n: usize,
    second_choice: bool,
) -> Vec<ProcStat> {
    let alive_then: BTreeMap<u32, ProcStat> = recent
        .iter()
        .filter(|(_, p)| p.vanished.is_none())
        .map(|(pid, p)| (*pid, p.stat.clone()))
        .collect();
    let mut out = victims(&alive_then, gone_now, n);
    if out.len() < n && second_choice {
        let vanished: BTreeMap<u32, ProcStat> = recent
            .iter()
            .filter(|(_, p)| p.vanished.is_some_and(|v| v >= since))
            .map(|(pid, p)| (*pid, p.stat.clone()))
            .collect();
        let all: BTreeSet<u32> = vanished.keys().copied().collect();
        out.extend(victims(&vanished, &all, n - out.len()));
    }
    out
}

/// A byte count as a Kubernetes quantity, as people write limits: `2Gi`, `1536Mi`,
/// `64Ki`, or plain bytes when nothing divides.
pub fn quantity(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "Ti"),
        (1 << 30, "Gi"),
        (1 << 20, "Mi"),
        (1 << 10, "Ki"),
    ];
    for (size, unit) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// A v1 limit of `PAGE_COUNTER_MAX` pages (9223372036854771712 on x86-64) or v2 `max`
/// means no limit.
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let v: u64 = t.parse().ok()?;
    (v < (1 << 62)).then_some(v)
}

/// One OOM kill, as reported in `trainlet.io/report` and the OOMKill Event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomKill {
    /// RFC 3339 time when trainlet noticed it (cgroup) or the container finished
    /// (pod status).
    pub time: String,
    pub container: String,
    /// `cgroup` or `pod-status`.
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcStat>,
    /// The whole cgroup was killed (v2 `memory.oom.group`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub group: bool,
    /// Memory usage right after the kill (cgroup) and the peak usage (v1
    /// `max_usage_in_bytes`, v2 `memory.peak`), in bytes, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_usage: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_peak: Option<u64>,
    /// The memory limit, as a quantity (`2Gi`), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
    /// Pod status: the container's restart count after this kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

impl OomKill {
    /// The Event message: what was killed, where, and the limit it hit.
    pub fn message(&self) -> String {
        let what = match (&self.process, self.source) {
            (Some(p), _) => format!(
                "process {} (pid {}) in container {} was OOM-killed",
                p.comm, p.pid, self.container
            ),
            (None, "pod-status") => format!(
                "container {} was OOM-killed (exit code {}){}",
                self.container,
                self.exit_code.unwrap_or(137),
                match self.restart_count {
                    Some(n) if n > 0 => format!(" and restarted (restart {n})"),
                    _ => String::new(),
                }
            ),
            (None, _) if self.group => format!(
                "the processes of container {} were OOM-killed as a group",
                self.container
            ),
            (None, _) => format!("a process in container {} was OOM-killed", self.container),
        };
        match &self.memory_limit {
            Some(l) => format!("{what}; memory limit {l}"),
            None => what,
        }
    }
}

/// A container termination with reason `OOMKilled` in pod status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusOom {
    pub container: String,
    /// Identifies this termination across the `state` -> `lastState` move on restart.
    pub key: String,
    pub finished_at: Option<SystemTime>,
    pub restart_count: i32,
    pub exit_code: i32,
}

/// Every OOMKilled termination visible in a pod's status, from `state` (a container
/// that will not restart) and `lastState` (one that did).
pub fn status_ooms(pod: &Pod) -> Vec<StatusOom> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for cs in status.container_statuses.iter().flatten() {
        // Each termination is keyed by the restart it leads to: a container's
        // terminated `state` (restartCount n) becomes its `lastState` once restarted
        // (restartCount n+1). Counting once per restart this way also ignores the
        // kubelet rewriting the same status.
        let terms = [
            (
                cs.state.as_ref().and_then(|s| s.terminated.as_ref()),
                cs.restart_count + 1,
            ),
            (
                cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()),
                cs.restart_count,
            ),
        ];
        for (t, restart) in terms {
            let Some(t) = t else { continue };
            if t.reason.as_deref() != Some("OOMKilled") {
                continue;
            }
            let finished = t.finished_at.as_ref().map(|f| f.0);
            let key = format!("{}|{restart}", cs.name);
            if out.iter().any(|o: &StatusOom| o.key == key) {
                continue;
            }
            out.push(StatusOom {
                container: cs.name.clone(),
                key,
                finished_at: finished.map(SystemTime::from),
                restart_count: cs.restart_count,
                exit_code: t.exit_code,
            });
        }
    }
    out
}

/// Counts OOM kills once each, from both sources, since trainlet started.
///
/// In sidecar mode with `--cgroup-root`, a container whose main process is OOM-killed
/// shows up twice: in its cgroup's counter, then as `OOMKilled` in pod status. A status
/// kill within [`MERGE_WINDOW`] of a cgroup kill of the same container is the same kill.
#[derive(Debug, Clone)]
pub struct OomLedger {
    started: SystemTime,
    seen_status: BTreeSet<String>,
    /// (container, when noticed, already merged with a status kill)
    cgroup_kills: Vec<(String, SystemTime, bool)>,
    pub kills: Vec<OomKill>,
    pub by_container: BTreeMap<String, u64>,
    pub total: u64,
}

/// How close a cgroup kill and a pod-status kill must be to count as one.
pub const MERGE_WINDOW: Duration = Duration::from_secs(30);
/// At most this many kills are kept in the report (the counters keep counting).
pub const KEEP_KILLS: usize = 20;

impl OomLedger {
    pub fn new(started: SystemTime) -> Self {
        OomLedger {
            started,
            seen_status: BTreeSet::new(),
            cgroup_kills: Vec::new(),
            kills: Vec::new(),
            by_container: BTreeMap::new(),
            total: 0,
        }
    }

    fn push(&mut self, kill: OomKill) {
        *self.by_container.entry(kill.container.clone()).or_default() += 1;
        self.total += 1;
        self.kills.push(kill);
        if self.kills.len() > KEEP_KILLS {
            self.kills.remove(0);
        }
    }

    /// A kill seen in a cgroup counter.
    pub fn record_cgroup(&mut self, kill: OomKill, now: SystemTime) {
        self.cgroup_kills.push((kill.container.clone(), now, false));
        self.push(kill);
    }

    /// A kill seen in pod status. Returns the new kill, or `None` when it was counted
    /// already, happened before trainlet started, or matches a cgroup kill.
    pub fn record_status(
        &mut self,
        s: &StatusOom,
        memory_limit: Option<String>,
    ) -> Option<OomKill> {
        if !self.seen_status.insert(s.key.clone()) {
            return None;
        }
        // Whole seconds: pod status times have no fraction.
        let started = floor_secs(self.started);
        if s.finished_at.is_some_and(|f| f < started) {
            return None;
        }
        let at = s.finished_at.unwrap_or(started);
        if let Some(c) = self.cgroup_kills.iter_mut().find(|(c, t, merged)| {
            !*merged && *c == s.container && abs_diff(*t, at) <= MERGE_WINDOW
        }) {
            c.2 = true;
            return None;
        }
        let kill = OomKill {
            time: rfc3339(at),
            container: s.container.clone(),
            source: "pod-status",
            process: None,
            group: false,
            memory_usage: None,
            memory_peak: None,
            memory_limit,
            restart_count: Some(s.restart_count),
            exit_code: Some(s.exit_code),
        };
        self.push(kill.clone());
        Some(kill)
    }
}

fn floor_secs(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn abs_diff(a: SystemTime, b: SystemTime) -> Duration {
    a.duration_since(b)
        .or_else(|_| b.duration_since(a))
        .unwrap_or_default()
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

// ---------------------------------------------------------------------------------
// I/O: reading cgroup files and /proc, and the change notifiers.

/// A watched memory cgroup.
#[derive(Debug, Clone)]
pub struct Cgroup {
    pub version: CgroupVersion,
    pub path: PathBuf,
}

impl Cgroup {
    fn counters_file(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.path.join("memory.oom_control"),
            CgroupVersion::V2 => self.path.join("memory.events"),
        }
    }

    pub fn counters(&self) -> Result<OomCounters, OomError> {
        let path = self.counters_file();
        let text = std::fs::read_to_string(&path).map_err(|source| OomError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let parsed = match self.version {
            CgroupVersion::V1 => parse_oom_control_v1(&text),
            CgroupVersion::V2 => parse_memory_events_v2(&text),
        };
        parsed.ok_or(OomError::Format {
            path: path.display().to_string(),
            field: "oom_kill",
        })
    }

    fn read_u64(&self, name: &str) -> Option<u64> {
        parse_limit(&std::fs::read_to_string(self.path.join(name)).ok()?)
    }

    /// The memory limit in bytes, `None` when unlimited or unreadable.
    pub fn limit(&self) -> Option<u64> {
        match self.version {
            CgroupVersion::V1 => self.read_u64("memory.limit_in_bytes"),
            CgroupVersion::V2 => self.read_u64("memory.max"),
        }
    }

    /// Current and peak usage in bytes.
    pub fn usage(&self) -> (Option<u64>, Option<u64>) {
        match self.version {
            CgroupVersion::V1 => (
                self.read_u64("memory.usage_in_bytes"),
                self.read_u64("memory.max_usage_in_bytes"),
            ),
            CgroupVersion::V2 => (
                self.read_u64("memory.current"),
                self.read_u64("memory.peak"),
            ),
        }
    }
}

/// The memory cgroup of this process (exec mode).
pub fn own_cgroup() -> Result<Cgroup, OomError> {
    let read = |p: &str| {
        std::fs::read_to_string(p).map_err(|source| OomError::Read {
            path: p.into(),
            source,
        })
    };
    let (version, path) =
        own_memory_cgroup(&read("/proc/self/cgroup")?, &read("/proc/self/mountinfo")?)
            .ok_or(OomError::NoOwnCgroup)?;
    let cg = Cgroup { version, path };
    cg.counters()?;
    Ok(cg)
}

/// The page size, for RSS in `/proc/<pid>/stat`.
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |v| v as u64)
}

/// Every process visible in `/proc`.
pub fn all_processes(proc_root: &Path, page_size: u64) -> Vec<ProcStat> {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s, page_size))
        .collect()
}

/// Whether a pid is gone or a zombie: both mean the process was killed or exited.
pub fn is_gone(proc_root: &Path, pid: u32, page_size: u64) -> bool {
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) {
        Ok(s) => parse_stat(&s, page_size).is_none_or(|p| p.state == 'Z' || p.state == 'X'),
        Err(_) => true,
    }
}

/// Wakes the reporter when a cgroup's OOM state changes.
pub enum Notifier {
    /// cgroup v1: an eventfd registered with `cgroup.event_control` for
    /// `memory.oom_control`. The kernel signals it when the cgroup goes under OOM,
    /// before the victim dies.
    EventFd {
        fd: tokio::io::unix::AsyncFd<nix::sys::eventfd::EventFd>,
        _oom_control: std::fs::File,
    },
    /// cgroup v2: inotify on `memory.events`, which the kernel touches on every event.
    Inotify(tokio::io::unix::AsyncFd<inotify::Inotify>),
}

/// Registers a file descriptor with tokio's reactor.
#[allow(unsafe_code)]
fn register<T: std::os::fd::AsRawFd>(inner: T) -> Result<tokio::io::unix::AsyncFd<T>, String> {
    // SAFETY: `inner` (an EventFd or an Inotify) owns its descriptor and closes it only
    // when dropped, which happens after the AsyncFd that holds it deregisters it.
    unsafe { tokio::io::unix::AsyncFd::register(inner) }.map_err(|e| e.to_string())
}

impl Notifier {
    /// Sets up the best notifier for a cgroup; the error says why polling is used.
    /// Must run inside the tokio runtime.
    pub fn new(cg: &Cgroup) -> Result<Notifier, String> {
        match cg.version {
            CgroupVersion::V1 => {
                use nix::sys::eventfd::{EfdFlags, EventFd};
                use std::os::fd::AsRawFd;
                let efd = EventFd::from_value_and_flags(
                    0,
                    EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
                )
                .map_err(|e| format!("eventfd: {e}"))?;
                let oc_path = cg.path.join("memory.oom_control");
                let oc = std::fs::File::open(&oc_path)
                    .map_err(|e| format!("{}: {e}", oc_path.display()))?;
                let ctl = cg.path.join("cgroup.event_control");
                std::fs::write(&ctl, format!("{} {}", efd.as_raw_fd(), oc.as_raw_fd()))
                    .map_err(|e| format!("{}: {e}", ctl.display()))?;
                let fd = register(efd)?;
                Ok(Notifier::EventFd {
                    fd,
                    _oom_control: oc,
                })
            }
            CgroupVersion::V2 => {
                let ino = inotify::Inotify::init().map_err(|e| format!("inotify: {e}"))?;
                let events = cg.path.join("memory.events");
                ino.watches()
                    .add(&events, inotify::WatchMask::MODIFY)
                    .map_err(|e| format!("inotify on {}: {e}", events.display()))?;
                let fd = register(ino)?;
                Ok(Notifier::Inotify(fd))
            }
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Notifier::EventFd { .. } => "eventfd",
            Notifier::Inotify(_) => "inotify",
        }
    }

    /// Waits for the next notification.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match self {
            Notifier::EventFd { fd, .. } => loop {
                let mut guard = fd.readable().await?;
                match guard.try_io(|inner| inner.get_ref().read().map_err(std::io::Error::from)) {
                    Ok(r) => return r.map(|_| ()),
                    Err(_would_block) => continue,
                }
            },
            Notifier::Inotify(fd) => loop {
                let mut guard = fd.readable_mut().await?;
                let mut buf = [0u8; 1024];
                match guard.try_io(|inner| inner.get_mut().read_events(&mut buf).map(|_| ())) {
                    Ok(r) => return r,
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_oom_control_in_the_kernels_format() {
        // Linux 4.13+ (memcontrol.c mem_cgroup_oom_control_read).
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(
            parse_oom_control_v1(text),
            Some(OomCounters {
                oom_kill: 3,
                oom_group_kill: 0,
                under_oom: false
            })
        );
        let under = "oom_kill_disable 1\nunder_oom 1\noom_kill 0\n";
        assert!(parse_oom_control_v1(under).unwrap().under_oom);
        // Before 4.13 there is no oom_kill line: nothing can be counted.
        assert_eq!(
            parse_oom_control_v1("oom_kill_disable 0\nunder_oom 0\n"),
            None
        );
    }

    #[test]
    fn v2_memory_events_in_the_kernels_format() {
        // Linux 5.17+ (memory_events_show), with oom_group_kill.
        let text = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 1\n";
        assert_eq!(
            parse_memory_events_v2(text),
            Some(OomCounters {
                oom_kill: 2,
                oom_group_kill: 1,
                under_oom: false
            })
        );
        // Older kernels: no oom_group_kill.
        let old = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n";
        assert_eq!(parse_memory_events_v2(old).unwrap().oom_kill, 0);
        // memory.events.local and garbage.
        assert_eq!(parse_memory_events_v2("low 0\nhigh 0\n"), None);
        assert_eq!(parse_memory_events_v2(""), None);
    }

    const HYBRID_CGROUP: &str =
        "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/45c2\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTINFO: &str =
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn own_cgroup_on_a_hybrid_host_is_the_v1_memory_hierarchy() {
        assert_eq!(
            own_memory_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO),
            Some((
                CgroupVersion::V1,
                PathBuf::from("/sys/fs/cgroup/memory/process_api/45c2")
            ))
        );
    }

    #[test]
    fn own_cgroup_on_a_v2_host_and_in_a_cgroup_namespace() {
        let mountinfo = "25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            own_memory_cgroup(
                "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n",
                mountinfo
            ),
            Some((
                CgroupVersion::V2,
                PathBuf::from(
                    "/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope"
                )
            ))
        );
        // In a container's cgroup namespace, the own cgroup is the mount's root.
        let ns =
            "1310 1301 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n";
        assert_eq!(
            own_memory_cgroup("0::/\n", ns),
            Some((CgroupVersion::V2, PathBuf::from("/sys/fs/cgroup")))
        );
        assert_eq!(own_memory_cgroup("", ""), None);
    }

    #[test]
    fn mountinfo_unescapes_octal() {
        let m = parse_mountinfo("36 35 98:0 /a\\040b /mnt/x\\040y rw - ext4 /dev/sda1 rw\n");
        assert_eq!(m[0].root, "/a b");
        assert_eq!(m[0].mount_point, "/mnt/x y");
    }

    #[test]
    fn pod_and_container_dirs_of_both_cgroup_drivers() {
        let uid = "7d3a1f0e-2b4c-4d5e-8f90-a1b2c3d4e5f6";
        assert!(is_pod_dir(&format!("pod{uid}"), uid));
        assert!(is_pod_dir(
            "kubepods-burstable-pod7d3a1f0e_2b4c_4d5e_8f90_a1b2c3d4e5f6.slice",
            uid
        ));
        assert!(!is_pod_dir("kubepods-burstable.slice", uid));
        assert!(!is_pod_dir("anything", ""));
        let id = "containerd://0123abcd";
        assert!(is_container_dir("0123abcd", id));
        assert!(is_container_dir("cri-containerd-0123abcd.scope", id));
        assert!(is_container_dir("crio-0123abcd.scope", "cri-o://0123abcd"));
        assert!(!is_container_dir("0123abcde", id));
        assert!(!is_container_dir("x", ""));
    }

    #[test]
    fn stat_lines_with_awkward_comms() {
        let line = "4242 (python) S 4200 4242 4200 0 -1 4194560 2400 0 0 0 12 3 0 0 20 0 4 0 9001 1234567 2048 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 1 0 0 0 0 0\n";
        let p = parse_stat(line, 4096).unwrap();
        assert_eq!(
            (p.pid, p.comm.as_str(), p.state, p.ppid, p.rss_bytes),
            (4242, "python", 'S', 4200, 2048 * 4096)
        );
        let odd = "77 (pt_data (1) w) R 1 77 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 100 10 0";
        let p = parse_stat(odd, 4096).unwrap();
        assert_eq!(
            (p.comm.as_str(), p.ppid, p.rss_bytes),
            ("pt_data (1) w", 1, 40960)
        );
        assert_eq!(parse_stat("garbage", 4096), None);
    }

    fn ps(pid: u32, ppid: u32, comm: &str, rss: u64) -> ProcStat {
        ProcStat {
            pid,
            comm: comm.into(),
            state: 'S',
            ppid,
            rss_bytes: rss,
        }
    }

    #[test]
    fn tree_and_victims() {
        let procs = vec![
            ps(1, 0, "trainlet", 10),
            ps(10, 1, "sh", 1),
            ps(11, 10, "python", 500),
            ps(12, 11, "pt_data_worker", 900),
            ps(13, 11, "pt_data_worker", 800),
            ps(99, 0, "other", 5000),
        ];
        let tree = descendants(&procs, 1);
        assert_eq!(
            tree.keys().copied().collect::<Vec<_>>(),
            vec![10, 11, 12, 13]
        );
        let gone = BTreeSet::from([12, 13, 99]);
        let v = victims(&tree, &gone, 1);
        assert_eq!((v[0].pid, v[0].comm.as_str()), (12, "pt_data_worker"));
        assert_eq!(victims(&tree, &gone, 5).len(), 2);
        assert!(victims(&tree, &BTreeSet::new(), 1).is_empty());
    }

    #[test]
    fn a_process_that_exited_before_the_oom_is_not_its_victim() {
        let t0 = std::time::Instant::now();
        let s = |x: u64| t0 + Duration::from_millis(x);
        let seen = |p: ProcStat, vanished: Option<std::time::Instant>| SeenProc {
            stat: p,
            seen: t0,
            vanished,
        };
        let mut recent = BTreeMap::from([
            // `sleep 1` exited normally and vanished from the snapshot at 1000 ms.
            (20, seen(ps(20, 10, "sleep", 900 << 10), Some(s(1000)))),
            // The hog was alive in the latest snapshot, with less RSS than it has now.
            (21, seen(ps(21, 10, "memhog", 800 << 10), None)),
            (10, seen(ps(10, 1, "sh", 700 << 10), None)),
        ]);
        // The counter was last read at 1000 ms; both are gone now.
        let gone = BTreeSet::from([20, 21]);
        let v = pick_victims(&recent, &gone, s(1000), 1, true);
        assert_eq!(v[0].comm, "memhog");
        // The hog is still dying: no first choice yet, and the sleep is no answer.
        let only_sleep = BTreeSet::from([20]);
        assert!(pick_victims(&recent, &only_sleep, s(1000), 1, false).is_empty());
        // The notification's snapshot already missed the hog (reaped at once): it
        // vanished after the last read, the sleep before it.
        recent.get_mut(&21).unwrap().vanished = Some(s(1500));
        let v = pick_victims(&recent, &BTreeSet::new(), s(1200), 1, true);
        assert_eq!(v[0].comm, "memhog");
        assert!(pick_victims(&recent, &BTreeSet::new(), s(2000), 1, true).is_empty());
    }

    /// The v2 notifier is inotify on `memory.events`; on a plain file the plumbing is
    /// the same (kernfs adds only the kernel's own writes).
    #[tokio::test]
    async fn the_v2_notifier_wakes_on_a_change_of_memory_events() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("memory.events");
        std::fs::write(&events, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let cg = Cgroup {
            version: CgroupVersion::V2,
            path: dir.path().to_path_buf(),
        };
        let mut n = Notifier::new(&cg).unwrap();
        assert_eq!(n.kind(), "inotify");
        std::fs::write(&events, "low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n").unwrap();
        tokio::time::timeout(Duration::from_secs(5), n.wait())
            .await
            .expect("a notification within 5 s")
            .unwrap();
        assert_eq!(cg.counters().unwrap().oom_kill, 1);
        // v1 without a writable cgroup.event_control: no notifier, so polling.
        let v1 = Cgroup {
            version: CgroupVersion::V1,
            path: dir.path().to_path_buf(),
        };
        assert!(Notifier::new(&v1).is_err());
    }

    #[test]
    fn quantities_and_limits() {
        assert_eq!(quantity(2 << 30), "2Gi");
        assert_eq!(quantity(1536 << 20), "1536Mi");
        assert_eq!(quantity(64 << 20), "64Mi");
        assert_eq!(quantity(1000), "1000");
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("67108864\n"), Some(64 << 20));
    }

    #[test]
    fn oom_messages() {
        let k = OomKill {
            time: "2026-11-21T10:00:00Z".into(),
            container: "trainer".into(),
            source: "cgroup",
            process: Some(ps(4242, 1, "python", 0)),
            group: false,
            memory_usage: None,
            memory_peak: None,
            memory_limit: Some("2Gi".into()),
            restart_count: None,
            exit_code: None,
        };
        assert_eq!(
            k.message(),
            "process python (pid 4242) in container trainer was OOM-killed; memory limit 2Gi"
        );
        let s = OomKill {
            source: "pod-status",
            process: None,
            restart_count: Some(1),
            exit_code: Some(137),
            ..k.clone()
        };
        assert_eq!(
            s.message(),
            "container trainer was OOM-killed (exit code 137) and restarted (restart 1); memory limit 2Gi"
        );
        let anon = OomKill {
            process: None,
            memory_limit: None,
            ..k
        };
        assert_eq!(
            anon.message(),
            "a process in container trainer was OOM-killed"
        );
    }

    fn pod_with(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
            .unwrap()
    }

    #[test]
    fn status_kills_count_once_per_termination_and_only_after_start() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |s: u64| rfc3339(t0 + Duration::from_secs(s));
        let mut ledger = OomLedger::new(t0 + Duration::from_millis(700));
        // Terminated in state (same second as the start: counted), then moved to
        // lastState by the restart: the same termination, counted once.
        let term = serde_json::json!({"exitCode": 137, "reason": "OOMKilled", "finishedAt": at(0), "containerID": "containerd://a"});
        let p1 = pod_with(
            serde_json::json!({"containerStatuses": [{"name": "trainer", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": term}}]}),
        );
        let p2 = pod_with(
            serde_json::json!({"containerStatuses": [{"name": "trainer", "image": "i", "imageID": "", "ready": true, "restartCount": 1, "state": {"running": {}}, "lastState": {"terminated": term}}]}),
        );
        let new: Vec<_> = status_ooms(&p1)
            .iter()
            .filter_map(|s| ledger.record_status(s, Some("1Gi".into())))
            .collect();
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].container, "trainer");
        assert_eq!(new[0].restart_count, Some(0));
        for s in status_ooms(&p2) {
            assert_eq!(ledger.record_status(&s, None), None);
        }
        assert_eq!(ledger.total, 1);
        // The kubelet rewriting the status with another finishedAt: the same restart.
        let rewritten =
            serde_json::json!({"exitCode": 137, "reason": "OOMKilled", "finishedAt": at(2)});
        let p2b = pod_with(
            serde_json::json!({"containerStatuses": [{"name": "trainer", "image": "i", "imageID": "", "ready": true, "restartCount": 1, "state": {"running": {}}, "lastState": {"terminated": rewritten}}]}),
        );
        for s in status_ooms(&p2b) {
            assert_eq!(ledger.record_status(&s, None), None);
        }
        assert_eq!(ledger.total, 1);
        // A kill that finished before trainlet started is history, not news.
        let old = serde_json::json!({"exitCode": 137, "reason": "OOMKilled", "finishedAt": at(0), "containerID": "containerd://old"});
        let mut late = OomLedger::new(t0 + Duration::from_secs(5));
        let p3 = pod_with(
            serde_json::json!({"containerStatuses": [{"name": "trainer", "image": "i", "imageID": "", "ready": true, "restartCount": 1, "state": {"running": {}}, "lastState": {"terminated": old}}]}),
        );
        for s in status_ooms(&p3) {
            assert_eq!(late.record_status(&s, None), None);
        }
        assert_eq!(late.total, 0);
        // Other reasons are not OOM kills.
        let err = pod_with(
            serde_json::json!({"containerStatuses": [{"name": "trainer", "image": "i", "imageID": "", "ready": true, "restartCount": 1, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
        );
        assert!(status_ooms(&err).is_empty());
    }

    #[test]
    fn a_cgroup_kill_and_its_pod_status_twin_count_once() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut ledger = OomLedger::new(t0);
        let kill = OomKill {
            time: rfc3339(t0),
            container: "trainer".into(),
            source: "cgroup",
            process: None,
            group: false,
            memory_usage: None,
            memory_peak: None,
            memory_limit: None,
            restart_count: None,
            exit_code: None,
        };
        ledger.record_cgroup(kill, t0 + Duration::from_secs(2));
        let s = StatusOom {
            container: "trainer".into(),
            key: "k1".into(),
            finished_at: Some(t0 + Duration::from_secs(3)),
            restart_count: 1,
            exit_code: 137,
        };
        assert_eq!(ledger.record_status(&s, None), None);
        assert_eq!((ledger.total, ledger.by_container["trainer"]), (1, 1));
        // A second status kill much later is a new kill.
        let s2 = StatusOom {
            key: "k2".into(),
            finished_at: Some(t0 + Duration::from_secs(300)),
            restart_count: 2,
            ..s
        };
        assert!(ledger.record_status(&s2, None).is_some());
        assert_eq!(ledger.total, 2);
    }

    #[test]
    fn find_container_cgroup_walks_both_drivers() {
        let root = tempfile::tempdir().unwrap();
        let uid = "7d3a1f0e-2b4c";
        let v2 = root
            .path()
            .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d3a1f0e_2b4c.slice/cri-containerd-abc.scope");
        std::fs::create_dir_all(&v2).unwrap();
        assert_eq!(
            find_container_cgroup(root.path(), uid, "containerd://abc"),
            Some((CgroupVersion::V2, v2))
        );
        assert_eq!(
            find_container_cgroup(root.path(), uid, "containerd://zzz"),
            None
        );
        // A container ID outside the pod's directory is not this pod's.
        let stray = root.path().join("kubepods.slice/abc2");
        std::fs::create_dir_all(&stray).unwrap();
        assert_eq!(
            find_container_cgroup(root.path(), "other", "containerd://abc2"),
            None
        );
    }
}
