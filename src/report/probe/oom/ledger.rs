//! The OOM ledger: every kill counted once, whether the cgroup counter or pod status
//! (`lastState.terminated.reason == OOMKilled`, once per terminated container instance)
//! saw it first, with the most recent kills kept for the report.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::procs::ProcStat;

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
        // exec handing over to the sidecar knows no pod, so no container name.
        let within = match self.container.as_str() {
            "" => String::new(),
            c => format!(" in container {c}"),
        };
        let what = match (&self.process, self.source) {
            (Some(p), _) => format!("process {} (pid {}){within} was OOM-killed", p.comm, p.pid),
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
            (None, _) => format!("a process{within} was OOM-killed"),
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
/// A container that ends by itself, with any code but 137, after a child of its was
/// OOM-killed is `OOMKilled` in pod status too (containerd's record of the kill, on
/// cgroup v1): the same kill as that earlier one.
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

    /// Kills that an earlier reporter of this pod counted and that no source shows any
    /// more (the training container's `trainlet exec` started again since, and its
    /// observations with it): they stay counted, without their details, which their
    /// Events keep.
    pub fn carry(&mut self, container: &str, n: u64) {
        if n > 0 {
            *self.by_container.entry(container.to_string()).or_default() += n;
            self.total += n;
        }
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
        // A container that exited by itself (not 137) was not killed: containerd
        // marks `OOMKilled` a container in whose cgroup any process was OOM-killed,
        // however long before its end. Its twin is such an earlier kill.
        let twin = |t: SystemTime| match s.exit_code {
            137 => abs_diff(t, at) <= MERGE_WINDOW,
            _ => t <= at + MERGE_WINDOW,
        };
        if let Some(c) = self
            .cgroup_kills
            .iter_mut()
            .find(|(c, t, merged)| !*merged && *c == s.container && twin(*t))
        {
            c.2 = true;
            return None;
        }
        let kill = OomKill {
            time: crate::time::rfc3339_seconds(at),
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

// ---------------------------------------------------------------------------------
// I/O: reading cgroup files and /proc, and the change notifiers.

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::probe::oom::procs::tests::ps;

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
        let at = |s: u64| crate::time::rfc3339_seconds(t0 + Duration::from_secs(s));
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
    fn carried_kills_stay_counted_and_new_ones_add() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut ledger = OomLedger::new(t0);
        ledger.carry("trainer", 0);
        assert_eq!((ledger.total, ledger.by_container.len()), (0, 0));
        ledger.carry("trainer", 2);
        let s = StatusOom {
            container: "trainer".into(),
            key: "k1".into(),
            finished_at: Some(t0 + Duration::from_secs(3)),
            restart_count: 1,
            exit_code: 137,
        };
        assert!(ledger.record_status(&s, None).is_some());
        assert_eq!((ledger.total, ledger.by_container["trainer"]), (3, 3));
        assert_eq!(ledger.kills.len(), 1, "a carried kill has no details");
    }

    /// A kill the cgroup counter saw in `container`, without details.
    fn cgroup_kill(container: &str, at: SystemTime) -> OomKill {
        OomKill {
            time: crate::time::rfc3339_seconds(at),
            container: container.into(),
            source: "cgroup",
            process: None,
            group: false,
            memory_usage: None,
            memory_peak: None,
            memory_limit: None,
            restart_count: None,
            exit_code: None,
        }
    }

    #[test]
    fn a_cgroup_kill_and_its_pod_status_twin_count_once() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut ledger = OomLedger::new(t0);
        ledger.record_cgroup(cgroup_kill("trainer", t0), t0 + Duration::from_secs(2));
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

    /// A child OOM-killed, the container running on; at its end, minutes later, it exits
    /// 0 and the runtime says `OOMKilled`: one kill. A container killed (137) long after
    /// a child's kill is a second one.
    #[test]
    fn a_childs_kill_and_the_runtimes_oomkilled_at_the_containers_end_count_once() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let child = |ledger: &mut OomLedger| {
            ledger.record_cgroup(cgroup_kill("main", t0), t0 + Duration::from_secs(1));
        };
        let ended = |key: &str, exit_code: i32| StatusOom {
            container: "main".into(),
            key: key.into(),
            finished_at: Some(t0 + Duration::from_secs(240)),
            restart_count: 0,
            exit_code,
        };
        let mut ledger = OomLedger::new(t0);
        child(&mut ledger);
        assert_eq!(ledger.record_status(&ended("k1", 0), None), None);
        assert_eq!(ledger.total, 1);
        let mut ledger = OomLedger::new(t0);
        child(&mut ledger);
        assert!(ledger.record_status(&ended("k1", 137), None).is_some());
        assert_eq!(ledger.total, 2);
    }
}
