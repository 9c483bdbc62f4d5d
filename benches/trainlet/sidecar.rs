//! Scenario 2: the reporters at rest. One `trainlet sidecar` and one
//! `trainlet exec --report -- sleep` run at once, each on a steady pod of its own
//! (Running, one container with a containerPort and 2 GPUs in its limit, the fake NVML
//! showing 2 GPUs, so health is ok), at the default `--interval` and
//! `--min-patch-interval`, as the trainlet ServiceAccount of manifests/rbac.yaml.
//! Both see this whole machine: every process in /proc and every socket of the host's
//! network namespace, where a pod's container sees its own. A third process, exec in
//! a PID namespace of its own (`unshare --pid --mount-proc`, as in a container), shows
//! what the process-tree scan of exec mode costs in a pod. A fourth runs exec with the
//! progress watch on (`--stall-after`, `--progress-pattern`) over a CMD that prints a
//! step line a second, all of it passing through exec.
//!
//! Each process is measured over the 60 s after its own first report (its first
//! annotation patch, seen on its `/metrics`):
//! - CPU, as a share of one core: utime + stime from `/proc/<pid>/stat` (10 ms ticks)
//!   and the scheduler's nanoseconds from `/proc/<pid>/task/*/schedstat`, at both
//!   ends; the larger of the two counts;
//! - peak RSS: VmHWM from `/proc/<pid>/status` before it is stopped (the harness is not
//!   its parent's `ru_maxrss`);
//! - API writes: the API server's `/metrics` (PATCH pods + POST events; both
//!   processes together, since the API server does not label requests by client), and
//!   per process its own `trainlet_annotation_patches_total` plus the Events listed
//!   for its pod.
//!
//! The harness then measures what one port probe (/proc/net/tcp and tcp6) and one
//! process-tree pass (every /proc/<pid>/stat) cost in CPU here: where the time goes.
//!
//! Harness requests stay out of the measured window: the Events are listed before the
//! API server's mid scrape and after its end scrape.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube::Client;
use serde::Serialize;

use crate::metrics::{Scrape, agent_cost, scrape};
use crate::report_support::{self as rs, Reporter};
use crate::support::{self, Kubelet, pod};

/// How long each process is measured at rest.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The targets of the issue.
pub const TARGET_CPU_PERCENT: f64 = 0.2;
pub const TARGET_RSS_MIB: f64 = 16.0;
pub const TARGET_WRITES_AFTER_FIRST: f64 = 0.0;

#[derive(Debug, Clone, Serialize)]
pub struct Process {
    /// `trainlet sidecar` or `trainlet exec --report`.
    pub mode: String,
    /// From the spawn to the first annotation patch seen on its /metrics.
    pub first_report_ms: f64,
    /// The measured window, from the first report.
    pub window_s: f64,
    /// CPU time over the window: the larger of `cpu_ms_stat` and `cpu_ms_schedstat`
    /// (the first is truncated to 10 ms ticks at both ends, the second misses threads
    /// that ended within the window), and its share of one core.
    pub cpu_ms: f64,
    pub cpu_percent_of_core: f64,
    /// utime + stime (/proc/<pid>/stat, 10 ms ticks).
    pub cpu_ms_stat: f64,
    /// The scheduler's nanosecond counters of its threads (/proc/<pid>/task/*/schedstat;
    /// exact while its threads live as long as the window, which `threads_at_first`
    /// and `threads` show).
    pub cpu_ms_schedstat: f64,
    pub threads_at_first: u64,
    /// VmHWM at the end of the window.
    pub peak_rss_kib: u64,
    /// VmRSS at the end of the window.
    pub rss_kib: u64,
    pub threads: u64,
    /// `trainlet_annotation_patches_total` at the first report and at the end.
    pub patches_at_first: f64,
    pub patches_total: f64,
    /// Events regarding its pod, at the first report and at the end.
    pub events_at_first: usize,
    pub events_total: usize,
    /// Patches + Events, in all and after the first report (own counters).
    pub writes_total: f64,
    pub writes_after_first: f64,
    /// `trainlet.io/health` at the end.
    pub health: String,
    /// After SIGTERM: 0 for the sidecar, 143 for exec (CMD, `sleep`, got the SIGTERM).
    pub exit_code: i32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub interval: String,
    pub min_patch_interval: String,
    pub window_s: f64,
    pub processes: Vec<Process>,
    /// The API server's counters, both processes together: PATCH pods + POST events
    /// from the spawn to the end, and from both first reports to the end.
    pub api_writes_total: f64,
    pub api_writes_after_first: f64,
    pub api_requests_total: BTreeMap<String, f64>,
    pub api_requests_after_first: BTreeMap<String, f64>,
    /// Processes in this machine's /proc at the end: exec mode reads the stat file of
    /// each once a second to keep CMD's process tree (in a pod, only the container's
    /// own processes are visible).
    pub visible_processes: usize,
    /// Sockets in the host network namespace's /proc/net/tcp and tcp6 at the end,
    /// which every probe reads (a pod has its own network namespace).
    pub visible_sockets: usize,
    /// Where the CPU goes, measured by the harness on one thread of its own: the CPU
    /// time of one read of /proc/net/tcp and tcp6 as the port probe does it (64 KiB
    /// reads), and of one pass over every /proc/<pid>/stat as exec mode's process tree
    /// refresh does it, each the median of 21.
    pub net_tcp_read_ms: f64,
    pub proc_scan_ms: f64,
    /// Why exec did not also run in a PID namespace of its own, if it did not.
    pub pid_namespace_unavailable: Option<String>,
    pub targets: serde_json::Value,
}

/// A namespace with manifests/rbac.yaml applied and a kubeconfig of the `trainlet`
/// ServiceAccount, on the control plane of `kubeconfig` (tests/it/support's helpers
/// use the shared one).
pub async fn rbac_namespace(
    client: &Client,
    kubeconfig: &Path,
    prefix: &str,
    dir: &Path,
) -> (String, PathBuf) {
    let ns = support::namespace(client, prefix).await;
    support::apply_rbac_on(kubeconfig, &ns);
    let path = support::sa_kubeconfig_on(kubeconfig, client, &ns, "trainlet", dir).await;
    (ns, path)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_s() -> f64 {
    use nix::unistd::{SysconfVar, sysconf};
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// Nanoseconds on a CPU, summed over the live threads of a process.
fn schedstat_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The CPU time of the calling thread, in nanoseconds.
fn thread_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The median CPU time of `f` on this thread, in ms, over 21 runs.
fn cpu_cost_ms(mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..21)
        .map(|_| {
            let t = thread_ns();
            f();
            thread_ns().saturating_sub(t) as f64 / 1e6
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What one port probe reads: /proc/net/tcp and tcp6, in 64 KiB reads.
fn read_net_tcp() {
    use std::io::Read;
    let mut buf = vec![0u8; 64 << 10];
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(mut fh) = std::fs::File::open(f) {
            while fh.read(&mut buf).is_ok_and(|n| n > 0) {}
        }
    }
}

/// What one process-tree refresh reads: every /proc/<pid>/stat.
fn scan_proc() {
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if e.file_name()
            .to_str()
            .is_some_and(|s| s.parse::<u32>().is_ok())
        {
            let _ = std::fs::read_to_string(e.path().join("stat"));
        }
    }
}

/// The pid of the (first) child of `pid`: trainlet under `unshare --fork`.
fn child_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A `VmHWM:`-style field of /proc/<pid>/status (KiB, or a plain count).
pub fn status_field(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn own_patches(r: &Reporter) -> Option<f64> {
    match rs::http_get(&r.metrics_addr, "/metrics") {
        Ok((200, _, body)) => rs::metric(&body, "trainlet_annotation_patches_total"),
        _ => None,
    }
}

async fn pod_events(client: &Client, ns: &str, pod: &str) -> usize {
    support::events(client, ns)
        .await
        .iter()
        .filter(|e| e.3 == pod)
        .count()
}

fn writes(before: &Scrape, after: &Scrape) -> (f64, BTreeMap<String, f64>) {
    let (by_kind, _) = agent_cost(before, after);
    let w = ["PATCH pods", "POST events"]
        .iter()
        .filter_map(|k| by_kind.get(*k))
        .fold(0.0, |a, b| a + b);
    (w, by_kind)
}

/// At the start or the end of a window.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    ticks: u64,
    sched_ns: u64,
    threads: u64,
}

impl Mark {
    fn now(pid: u32) -> Mark {
        Mark {
            at: Instant::now(),
            ticks: cpu_ticks(pid),
            sched_ns: schedstat_ns(pid),
            threads: status_field(pid, "Threads:"),
        }
    }
}

const SIDECAR: &str = "trainlet sidecar";
const EXEC: &str = "trainlet exec --report";
const EXEC_PIDNS: &str = "trainlet exec --report, own PID namespace";
/// The progress watch on: CMD prints a line a second, which passes through exec.
const EXEC_WATCH: &str =
    "trainlet exec --report --stall-after 10m --progress-pattern (a line a second)";
/// The shipped layout: the two on one pod, exec without credentials handing its
/// observations to the sidecar, which has no GPU of its own.
const HANDOVER_SIDECAR: &str =
    "trainlet sidecar --observations --cluster-file (shipped layout, peer watch)";
const HANDOVER_EXEC: &str = "trainlet exec --report --observations (shipped layout)";

struct Running {
    mode: &'static str,
    pod: String,
    r: Reporter,
    /// trainlet's pid: the Reporter's child, or its child under unshare.
    pid: Option<u32>,
    spawned: Instant,
    /// The first report: the mark, patches and Events then.
    first: Option<(Mark, f64, usize)>,
    /// The end of the window: the mark, VmHWM, VmRSS.
    end: Option<(Mark, u64, u64)>,
    _dir: Option<tempfile::TempDir>,
    /// exec handing over: its first report is its first observation file here.
    observed: Option<PathBuf>,
}

pub async fn run(client: &Client, kubeconfig: &Path) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(client, kubeconfig, "rest", dir.path()).await;
    let kubelet = Kubelet::new(client, &ns);
    let nvml = rs::fake_nvml().to_str().unwrap().to_string();
    // A PID namespace needs root (or user namespaces); without one, that row is left
    // out and the report says why.
    let pidns = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stdin(std::process::Stdio::null())
        .output();
    let pid_namespace_unavailable = match pidns {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "unshare --pid --mount-proc failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run unshare: {e}")),
    };
    if let Some(why) = &pid_namespace_unavailable {
        eprintln!("bench: no exec --report in a PID namespace of its own: {why}");
    }
    let modes = [SIDECAR, EXEC, EXEC_WATCH, EXEC_PIDNS]
        .into_iter()
        .filter(|m| *m != EXEC_PIDNS || pid_namespace_unavailable.is_none());
    let mut procs = Vec::new();
    for (i, mode) in modes.enumerate() {
        let name = format!("train-{i}");
        let port = support::free_port();
        pod(&name)
            .gpus(2)
            .port("tf", i32::from(port))
            .create(client, &ns)
            .await;
        kubelet.run(&name, &format!("10.1.0.{}", 5 + i)).await;
        let mut cmd = support::trainlet();
        let out = if mode == SIDECAR {
            cmd.arg("sidecar");
            None
        } else {
            let out = tempfile::tempdir().unwrap();
            support::write_tf_config(out.path(), port);
            cmd.args(["exec", "--report", "--output-dir"])
                .arg(out.path());
            Some(out)
        };
        cmd.arg("--kubeconfig")
            .arg(&kc)
            .args(["--pod-name", &name, "--pod-namespace", &ns])
            .args(["--nvml-lib", &nvml])
            .env("FAKE_NVML_COUNT", "2");
        if mode == EXEC_WATCH {
            cmd.args(["--stall-after", "10m", "--progress-pattern", r"step (\d+)"])
                .args(["--", "sh", "-c"])
                .arg(r#"i=0; while :; do i=$((i+1)); echo "step $i"; sleep 1; done"#);
        } else if out.is_some() {
            cmd.args(["--", "sleep", "3600"]);
        }
        if mode == EXEC_PIDNS {
            // PID 1 of a new PID namespace with its own /proc, as in a container.
            let mut w = Command::new("unshare");
            w.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
                .arg(cmd.get_program())
                .args(cmd.get_args());
            for (k, v) in cmd.get_envs() {
                match v {
                    Some(v) => w.env(k, v),
                    None => w.env_remove(k),
                };
            }
            w.stdin(std::process::Stdio::null());
            cmd = w;
        }
        procs.push((mode, name, cmd, out, None));
    }
    // The shipped layout, on one pod.
    {
        let name = "train-handover".to_string();
        let port = support::free_port();
        let created = pod(&name)
            .labels("app=handover")
            .gpus(2)
            .port("tf", i32::from(port))
            .create(client, &ns)
            .await;
        kubelet.run(&name, "10.1.0.9").await;
        let out = tempfile::tempdir().unwrap();
        let observed = out.path().join("observed");
        std::fs::create_dir(&observed).unwrap();
        support::write_tf_config(out.path(), port);
        // The cluster.json init would write, so the sidecar's peer watch runs too.
        let cluster_file = out.path().join("cluster.json");
        std::fs::write(
            &cluster_file,
            serde_json::json!({
                "cluster": {"worker": [format!("10.1.0.9:{port}")]},
                "task": {"type": "worker", "index": 0},
                "master": format!("grpc://10.1.0.9:{port}"),
                "peers": [{"name": name, "type": "worker", "index": 0,
                    "address": format!("10.1.0.9:{port}"), "node": "node-a",
                    "uid": created.metadata.uid.clone().unwrap()}],
                "ranks": ["worker/0"],
                "rank": 0,
                "selectors": {"worker": ["app=handover"]},
                "resolved_at": "2026-11-22T10:00:00Z",
                "waited_seconds": 0.0
            })
            .to_string(),
        )
        .unwrap();
        let mut exec = support::trainlet();
        exec.args(["exec", "--report", "--output-dir"])
            .arg(out.path())
            .arg("--observations")
            .arg(&observed)
            .args(["--pod-name", &name, "--pod-namespace", &ns])
            .args(["--nvml-lib", &nvml, "--", "sleep", "3600"])
            .env("FAKE_NVML_COUNT", "2");
        let mut sidecar = support::trainlet();
        sidecar
            .args(["sidecar", "--observations"])
            .arg(&observed)
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["--pod-name", &name, "--pod-namespace", &ns])
            .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
            .arg("--cluster-file")
            .arg(&cluster_file);
        procs.push((
            HANDOVER_EXEC,
            name.clone(),
            exec,
            None,
            Some(observed.join("exec.json")),
        ));
        procs.push((HANDOVER_SIDECAR, name, sidecar, Some(out), None));
    }

    let before = scrape(client).await;
    let mut running: Vec<Running> = procs
        .into_iter()
        .map(|(mode, pod, cmd, out, observed)| Running {
            mode,
            pod,
            spawned: Instant::now(),
            r: Reporter::start(cmd),
            pid: None,
            first: None,
            end: None,
            _dir: out,
            observed,
        })
        .collect();

    // The first report of each: its first annotation patch.
    let deadline = Instant::now() + Duration::from_secs(60);
    while running.iter().any(|p| p.first.is_none()) {
        for p in running.iter_mut().filter(|p| p.first.is_none()) {
            if p.pid.is_none() {
                p.pid = if p.mode == EXEC_PIDNS {
                    child_of(p.r.pid())
                } else {
                    Some(p.r.pid())
                };
            }
            let reported = match &p.observed {
                Some(file) => file.exists().then_some(0.0),
                None => own_patches(&p.r).filter(|n| *n >= 1.0),
            };
            if let Some(pid) = p.pid
                && let Some(n) = reported
            {
                let mark = Mark::now(pid);
                let events = if p.observed.is_some() {
                    0
                } else {
                    pod_events(client, &ns, &p.pod).await
                };
                p.first = Some((mark, n, events));
            }
        }
        if Instant::now() > deadline {
            for p in &running {
                eprintln!("bench: {} stderr:\n{}", p.mode, p.r.stderr());
            }
            panic!("a reporter did not report within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mid = scrape(client).await;

    // The window of each, from its own first report; nothing is asked of the
    // processes meanwhile.
    let mut order: Vec<usize> = (0..running.len()).collect();
    order.sort_by_key(|i| running[*i].first.unwrap().0.at);
    for i in order {
        let p = &mut running[i];
        let pid = p.pid.unwrap();
        tokio::time::sleep_until((p.first.unwrap().0.at + WINDOW).into()).await;
        p.end = Some((
            Mark::now(pid),
            status_field(pid, "VmHWM:"),
            status_field(pid, "VmRSS:"),
        ));
    }
    let visible_processes = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|s| s.parse::<u32>().is_ok())
                })
                .count()
        })
        .unwrap_or(0);
    let visible_sockets = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .map(|t| t.lines().count().saturating_sub(1))
                .unwrap_or(0)
        })
        .sum();
    let after = scrape(client).await;
    let (net_tcp_read_ms, proc_scan_ms) =
        tokio::task::spawn_blocking(|| (cpu_cost_ms(read_net_tcp), cpu_cost_ms(scan_proc)))
            .await
            .unwrap();

    let hz = clock_ticks_per_s();
    let mut out = Vec::new();
    for p in running.iter_mut() {
        let (m0, patches_at_first, events_at_first) = p.first.unwrap();
        let (m1, hwm, rss) = p.end.unwrap();
        let patches_total = own_patches(&p.r).unwrap_or(f64::NAN);
        // exec handing over publishes nothing; the pod's Events are the sidecar's.
        let patches_total = if p.observed.is_some() {
            0.0
        } else {
            patches_total
        };
        let events_total = if p.observed.is_some() {
            events_at_first
        } else {
            pod_events(client, &ns, &p.pod).await
        };
        let health = rs::annotations(client, &ns, &p.pod)
            .await
            .get("trainlet.io/health")
            .cloned()
            .unwrap_or_default();
        let window = m1.at.duration_since(m0.at).as_secs_f64();
        let cpu_ms_stat = (m1.ticks - m0.ticks) as f64 / hz * 1e3;
        let cpu_ms_schedstat = m1.sched_ns.saturating_sub(m0.sched_ns) as f64 / 1e6;
        let cpu_ms = cpu_ms_stat.max(cpu_ms_schedstat);
        // SIGTERM to trainlet itself (under unshare, not to unshare).
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p.pid.unwrap() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let (code, _) = tokio::task::block_in_place(|| p.r.wait(Duration::from_secs(10)));
        out.push(Process {
            mode: p.mode.to_string(),
            first_report_ms: m0.at.duration_since(p.spawned).as_secs_f64() * 1e3,
            window_s: window,
            cpu_ms,
            cpu_percent_of_core: cpu_ms / 1e3 / window * 100.0,
            cpu_ms_stat,
            cpu_ms_schedstat,
            threads_at_first: m0.threads,
            peak_rss_kib: hwm,
            rss_kib: rss,
            threads: m1.threads,
            patches_at_first,
            patches_total,
            events_at_first,
            events_total,
            writes_total: patches_total + events_total as f64,
            writes_after_first: patches_total - patches_at_first
                + (events_total - events_at_first) as f64,
            health,
            exit_code: code,
        });
    }
    let (api_writes_total, api_requests_total) = writes(&before, &after);
    let (api_writes_after_first, api_requests_after_first) = writes(&mid, &after);
    Outcome {
        interval: "5s (default)".into(),
        min_patch_interval: "10s (default)".into(),
        window_s: WINDOW.as_secs_f64(),
        processes: out,
        api_writes_total,
        api_writes_after_first,
        api_requests_total,
        api_requests_after_first,
        visible_processes,
        visible_sockets,
        net_tcp_read_ms,
        proc_scan_ms,
        pid_namespace_unavailable,
        targets: serde_json::json!({
            "cpu_percent_of_core": TARGET_CPU_PERCENT,
            "peak_rss_mib": TARGET_RSS_MIB,
            "writes_after_first": TARGET_WRITES_AFTER_FIRST,
        }),
    }
}
