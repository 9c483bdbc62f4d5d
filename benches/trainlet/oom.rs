//! Scenario 3: OOM-to-annotation latency, from real kernel OOM kills.
//!
//! `trainlet exec --report` (default flags, the trainlet ServiceAccount) runs in a
//! cgroup v1 memory cgroup with a 96 MiB limit, as a container's main process would.
//! CMD is a bash loop that, 10 times, waits for a go from the harness (a line on a
//! FIFO), starts the memory hog (`memhog 10`: 1 MiB every 10 ms, about a second to
//! reach the limit) as its child, waits for it, and writes `$EPOCHREALTIME` (no fork)
//! and the hog's exit status to a file the moment the exit is seen. The kernel's OOM
//! killer ends each hog; CMD and trainlet survive.
//!
//! The harness watches the pod (a kube watch, not polling) and records when
//! `trainlet.io/oom-kills` becomes 1, 2, ... 10. The latency of kill i is the time it
//! became i minus the time CMD saw hog i's exit. The harness gives the go for hog i+1
//! one second after kill i's annotation was seen, so each kill is published on its
//! own (an urgent publish waits at most 1 s after the previous patch) and its
//! latency is not the previous kill's throttle. CMD exits on one more go, after the
//! last annotation, so the last kill is not published by trainlet's final flush.
//!
//! trainlet's own log (text, with microsecond timestamps) splits each latency: from
//! the exit to trainlet logging the kill (the notification, the counters, naming the
//! victim), from there to the patch being answered, and from there to the watch.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::report_support::{self as rs, MemCgroup, Reporter};
use crate::sidecar::rbac_namespace;
use crate::support::{self, Kubelet, pod};

pub const KILLS: usize = 10;
pub const TARGET_MEDIAN_MS: f64 = 1500.0;
/// Each kill from the victim's exit to the annotation seen through a watch.
pub const TARGET_P99_MS: f64 = 100.0;
const LIMIT: u64 = 96 << 20;
/// From kill i's annotation to the go for hog i+1.
const GAP: Duration = Duration::from_secs(1);
/// How long one kill may take to show, hog included.
const PER_KILL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Default)]
pub struct Outcome {
    /// Why the scenario did not run (no memory cgroups here).
    pub skipped: Option<String>,
    /// What went wrong, if a kill was not seen.
    pub error: Option<String>,
    pub kills: usize,
    pub latency_ms: Vec<f64>,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub target_median_ms: f64,
    /// The 99th percentile of the latency (with 10 kills: the largest), against
    /// [`TARGET_P99_MS`]; and whether every kill named its victim.
    pub p99_ms: f64,
    pub target_p99_ms: f64,
    pub p99_met: bool,
    pub all_named: bool,
    pub memory_limit_mib: u64,
    pub gap_s: f64,
    /// The hogs' exit statuses as CMD saw them (137: SIGKILL).
    pub victim_exit_status: Vec<i32>,
    /// The cgroup's own `oom_kill` counter at the end.
    pub kernel_oom_kills: u64,
    /// `trainlet.io/oom-kills` at the end.
    pub annotation_final: String,
    /// How trainlet watched the cgroup, from its report annotation.
    pub oom_source: String,
    /// Kills among the report's recent ones (it keeps the last few) that name the
    /// victim process `memhog`, and how many it lists.
    pub victims_named: usize,
    pub recent_listed: usize,
    /// The victims' comms as the report lists them, oldest first.
    pub victims: Vec<String>,
    /// Medians of the parts of the latency, from trainlet's log: the exit seen by CMD
    /// to trainlet logging the kill; to trainlet logging the answered patch; to the
    /// watch event. Empty when the log does not line up with the kills.
    pub to_logged_kill_ms: Vec<f64>,
    pub to_patched_ms: Vec<f64>,
    pub to_watch_ms: Vec<f64>,
    pub median_to_logged_kill_ms: f64,
    pub median_to_patched_ms: f64,
    pub median_to_watch_ms: f64,
    /// OOMKill Warning Events for the pod.
    pub oom_events: usize,
    /// trainlet's exit code (CMD's: 0).
    pub exit_code: i32,
}

/// Gives CMD its go: one line on the FIFO, once CMD has it open for reading.
fn go(fifo: &Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let start = Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(mut f) => return f.write_all(b"go\n").map_err(|e| e.to_string()),
            // No reader yet.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
            Err(e) => return Err(e.to_string()),
        }
        if start.elapsed() > PER_KILL {
            return Err("CMD never opened the FIFO".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the watch's values until the annotation reads at least `want`; records in
/// `visible[k]` when it first read `k` or more. False after [`PER_KILL`].
async fn wait_for(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(u64, SystemTime)>,
    want: u64,
    last: &mut Option<u64>,
    visible: &mut [Option<SystemTime>],
) -> bool {
    let deadline = tokio::time::Instant::now() + PER_KILL;
    while last.is_none_or(|l| l < want) {
        let Ok(Some((n, at))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            return false;
        };
        if last.is_some_and(|l| n <= l) {
            continue;
        }
        for k in last.map_or(0, |l| l + 1)..=n {
            if let Some(slot) = visible.get_mut(k as usize) {
                slot.get_or_insert(at);
            }
        }
        *last = Some(n);
    }
    true
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The 99th percentile, nearest rank: of 10 values, the largest.
fn p99(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n => v[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1],
    }
}

fn med(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    median(&v)
}

/// Splits each latency with trainlet's log: for kill i, the time of its "was
/// OOM-killed" line and of the first "annotated the pod" line after it. `exits` and
/// `seen` are unix seconds per kill, in order. Empty where the log does not line up.
fn breakdown(log: &str, exits: &[f64], seen: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let stamp = |l: &str| -> Option<f64> {
        let t = humantime::parse_rfc3339_weak(l.split_whitespace().next()?.trim_end_matches('Z'))
            .ok()?;
        Some(unix_s(t))
    };
    let kills: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("was OOM-killed") && !l.contains("dropping"))
        .filter_map(stamp)
        .collect();
    let patches: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("annotated the pod"))
        .filter_map(stamp)
        .collect();
    if kills.len() != exits.len() || seen.len() != exits.len() {
        return Default::default();
    }
    let mut out: (Vec<f64>, Vec<f64>, Vec<f64>) = Default::default();
    for ((exit, kill), seen) in exits.iter().zip(&kills).zip(seen) {
        let Some(patch) = patches.iter().find(|p| *p >= kill) else {
            return Default::default();
        };
        out.0.push((kill - exit) * 1e3);
        out.1.push((patch - kill) * 1e3);
        out.2.push((seen - patch) * 1e3);
    }
    out
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

pub async fn run(client: &Client, kubeconfig: &Path) -> Outcome {
    let cg = match MemCgroup::new(LIMIT) {
        Ok(cg) => cg,
        Err(missing) => {
            return Outcome {
                skipped: Some(format!(
                    "no cgroup v1 memory cgroup with a limit can be made here: {}",
                    missing.reason
                )),
                ..Default::default()
            };
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(client, kubeconfig, "oom", dir.path()).await;
    pod("train-0").create(client, &ns).await;
    Kubelet::new(client, &ns).run("train-0", "10.1.0.5").await;
    support::write_tf_config(dir.path(), support::free_port());
    let fifo = dir.path().join("go");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success(), "mkfifo");
    let log = dir.path().join("kills.log");
    let script = format!(
        r#"for i in $(seq {KILLS}); do
  read -r _ < "$GO"
  "$HOG" 10 &
  wait $!
  st=$?
  echo "$i $st $EPOCHREALTIME" >> "$LOG"
done
read -r _ < "$GO""#
    );

    // The watch first, so that no value is missed.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, SystemTime)>();
    let watch = tokio::spawn(async move {
        let cfg = watcher::Config::default().fields("metadata.name=train-0");
        let mut events = watcher(api, cfg).applied_objects().boxed();
        while let Some(ev) = events.next().await {
            let at = SystemTime::now();
            if let Ok(p) = ev
                && let Some(n) = p
                    .annotations()
                    .get("trainlet.io/oom-kills")
                    .and_then(|v| v.parse::<u64>().ok())
                && tx.send((n, at)).is_err()
            {
                return;
            }
        }
    });

    let mut cmd = support::trainlet();
    cmd.args(["exec", "--report", "--kubeconfig"])
        .arg(&kc)
        .args(["--pod-name", "train-0", "--pod-namespace", &ns])
        .arg("--output-dir")
        .arg(dir.path())
        .args(["--", "/bin/bash", "-c", &script])
        .env("GO", &fifo)
        .env("LOG", &log)
        .env("HOG", rs::memhog());
    let mut r = Reporter::start(cg.wrap(&cmd));

    // visible[i]: when the annotation first read >= i.
    let mut visible: Vec<Option<SystemTime>> = vec![None; KILLS + 1];
    let mut last: Option<u64> = None;
    let mut error = None;
    // The first report: oom-kills "0".
    if !wait_for(&mut rx, 0, &mut last, &mut visible).await {
        error = Some("no first report (trainlet.io/oom-kills) within 30 s".to_string());
    }
    for i in 1..=KILLS {
        if error.is_some() {
            break;
        }
        tokio::time::sleep(GAP).await;
        let f = fifo.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || go(&f)).await.unwrap() {
            error = Some(format!("kill {i}: {e}"));
            break;
        }
        if !wait_for(&mut rx, i as u64, &mut last, &mut visible).await {
            error = Some(format!(
                "kill {i}: trainlet.io/oom-kills did not reach {i} within {PER_KILL:?}"
            ));
        }
    }
    if error.is_none() {
        let f = fifo.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || go(&f)).await.unwrap() {
            error = Some(format!("the last go: {e}"));
        }
    }
    let exit_code = if error.is_none() {
        tokio::task::block_in_place(|| r.wait(Duration::from_secs(30))).0
    } else {
        eprintln!("bench: oom: {error:?}; trainlet stderr:\n{}", r.stderr());
        -1
    };
    watch.abort();

    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut latency = Vec::new();
    let mut statuses = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(i), Some(st), Some(t)) = (
            f.first().and_then(|v| v.parse::<usize>().ok()),
            f.get(1).and_then(|v| v.parse::<i32>().ok()),
            f.get(2).and_then(|v| v.parse::<f64>().ok()),
        ) else {
            continue;
        };
        statuses.push(st);
        if let Some(Some(seen)) = visible.get(i) {
            latency.push((unix_s(*seen) - t) * 1e3);
        }
    }
    let mut sorted = latency.clone();
    sorted.sort_by(f64::total_cmp);
    let exits: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .collect();
    let seen: Vec<f64> = (1..=KILLS)
        .filter_map(|i| visible.get(i).copied().flatten().map(unix_s))
        .collect();
    let parts = breakdown(&r.stderr(), &exits, &seen);
    let a = rs::annotations(client, &ns, "train-0").await;
    let report: serde_json::Value = a
        .get("trainlet.io/report")
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default();
    let recent = report["oom"]["recent"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let victims: Vec<String> = recent
        .iter()
        .map(|k| k["process"]["comm"].as_str().unwrap_or("?").to_string())
        .collect();
    let victims_named = recent
        .iter()
        .filter(|k| k["process"]["comm"] == "memhog")
        .count();
    let oom_events = rs::warnings(client, &ns)
        .await
        .iter()
        .filter(|(reason, _)| reason == "OOMKill")
        .count();
    let kernel_oom_kills = cg.oom_kills();
    drop(r);
    drop(cg);
    let p99 = p99(&latency);
    Outcome {
        skipped: None,
        p99_ms: p99,
        target_p99_ms: TARGET_P99_MS,
        p99_met: latency.len() == KILLS && p99 <= TARGET_P99_MS,
        all_named: victims_named == KILLS,
        error,
        kills: latency.len(),
        median_ms: median(&sorted),
        min_ms: sorted.first().copied().unwrap_or(f64::NAN),
        max_ms: sorted.last().copied().unwrap_or(f64::NAN),
        latency_ms: latency,
        target_median_ms: TARGET_MEDIAN_MS,
        memory_limit_mib: LIMIT >> 20,
        gap_s: GAP.as_secs_f64(),
        victim_exit_status: statuses,
        kernel_oom_kills,
        annotation_final: a.get("trainlet.io/oom-kills").cloned().unwrap_or_default(),
        oom_source: report["oom"]["sources"][0]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        victims_named,
        recent_listed: recent.len(),
        victims,
        median_to_logged_kill_ms: med(&parts.0),
        median_to_patched_ms: med(&parts.1),
        median_to_watch_ms: med(&parts.2),
        to_logged_kill_ms: parts.0,
        to_patched_ms: parts.1,
        to_watch_ms: parts.2,
        oom_events,
        exit_code,
    }
}
