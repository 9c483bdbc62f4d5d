//! Scenario 1: N init agents (trainlet, or the shell init container users write today)
//! wait for N pods that the kubelet player then marks Running in random order.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use kube::Client;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::agents::{Setup, agent_command};
use crate::metrics::{agent_cost, pod_watches, scrape};
use crate::support::{self, Kubelet, pod};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Tool {
    /// `trainlet init`, every agent watching every peer (`--coordinate never`).
    Trainlet,
    /// `trainlet init --coordinate always`: task 0 resolves and publishes, the others
    /// watch only its pod.
    TrainletCoordinated,
    /// `kubectl wait` + `kubectl get` + shell.
    KubectlWait,
    /// `kubectl get` every 2 s (k8s-wait-for), then `kubectl get` + shell.
    KubectlPoll,
    /// The floor (benches/floor/floor.rs): a bare kube-rs watch of the job's pods that
    /// exits when the last one is Running with an address, built like trainlet; the
    /// run's `bin` is its executable.
    Floor,
}

impl Tool {
    pub fn label(self) -> &'static str {
        match self {
            Tool::Trainlet => "trainlet init",
            Tool::TrainletCoordinated => "trainlet init, coordinated",
            Tool::KubectlWait => "kubectl wait + get",
            Tool::KubectlPoll => "kubectl get, 2 s poll",
            Tool::Floor => "floor: bare kube-rs watch",
        }
    }

    /// The file in an agent's output directory whose mtime is its end: trainlet's and
    /// the shell's `tf_config.json`, or the empty file the floor creates as it exits.
    pub fn done_file(self) -> &'static str {
        match self {
            Tool::Floor => "done",
            _ => "tf_config.json",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub tool: Tool,
    pub n: usize,
    /// Job types: 1 (`worker`), or 2 (`ps`, one pod in sixteen, and `worker`).
    pub types: usize,
    /// What the API server sent for the whole job (every agent), KiB.
    pub egress_kib: f64,
    /// Seconds between the agents' start and the first Running status.
    pub delay_s: f64,
    pub latency_ms: Vec<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// From the last Running status until the last agent's file existed.
    pub all_done_ms: f64,
    pub rss_kib: Vec<u64>,
    pub rss_median_kib: u64,
    pub rss_max_kib: u64,
    /// CPU time (user + system) per agent, median.
    pub cpu_median_ms: f64,
    pub requests_per_agent: f64,
    pub requests_by_kind: std::collections::BTreeMap<String, f64>,
    pub bytes_per_agent: f64,
    pub failures: usize,
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The server port of pod `i`, named `tf`. On this one host every agent shares a
/// network namespace, and agents that bind-test one port at the same moment would see
/// each other's test as a conflict (in a cluster each pod has its own namespace): so
/// each pod gets a port of its own, below the ephemeral range.
pub fn own_port(i: usize) -> u16 {
    21000 + i as u16
}

/// The type and the index within it of pod `i` of `n`: with two types, the first
/// n/16 (at least one) are `ps`.
pub fn task_of(i: usize, n: usize, types: usize) -> (&'static str, usize) {
    let ps = if types == 2 { (n / 16).max(1) } else { 0 };
    if i < ps {
        ("ps", i)
    } else {
        ("worker", i - ps)
    }
}

/// What a run's agents left: each one's latency, peak RSS and CPU, and the failures.
struct Gathered {
    latency: Vec<f64>,
    rss: Vec<u64>,
    cpu_ms: Vec<f64>,
    failures: usize,
    /// When the last agent's file existed (`t_last` if none did).
    last_done: SystemTime,
}

impl Gathered {
    /// The run's [`Outcome`] from its agents: the percentiles, medians and failures.
    /// What the API server sent them is the caller's to fill in (zero here).
    fn outcome(
        self,
        tool: Tool,
        n: usize,
        types: usize,
        delay: Duration,
        t_last: SystemTime,
    ) -> Outcome {
        let mut sorted = self.latency.clone();
        sorted.sort_by(f64::total_cmp);
        let mut rss_sorted = self.rss.clone();
        rss_sorted.sort();
        let mut cpu_ms = self.cpu_ms;
        cpu_ms.sort_by(f64::total_cmp);
        Outcome {
            tool,
            n,
            types,
            egress_kib: 0.0,
            delay_s: delay.as_secs_f64(),
            p50_ms: percentile(&sorted, 50.0),
            p99_ms: percentile(&sorted, 99.0),
            max_ms: sorted.last().copied().unwrap_or(f64::NAN),
            all_done_ms: self
                .last_done
                .duration_since(t_last)
                .map(|d| d.as_secs_f64() * 1e3)
                .unwrap_or(0.0),
            latency_ms: self.latency,
            rss_median_kib: rss_sorted.get(rss_sorted.len() / 2).copied().unwrap_or(0),
            rss_max_kib: rss_sorted.last().copied().unwrap_or(0),
            rss_kib: self.rss,
            cpu_median_ms: cpu_ms.get(cpu_ms.len() / 2).copied().unwrap_or(f64::NAN),
            requests_per_agent: 0.0,
            requests_by_kind: Default::default(),
            bytes_per_agent: 0.0,
            failures: self.failures,
        }
    }
}

/// Waits for every agent and reads what it left: the mtime of its [`Tool::done_file`]
/// from `t_last`, and its `/usr/bin/time` line. Failed agents are counted and logged.
fn gather(tool: Tool, children: &mut [Child], dirs: &[PathBuf], t_last: SystemTime) -> Gathered {
    let mut g = Gathered {
        latency: Vec::new(),
        rss: Vec::new(),
        cpu_ms: Vec::new(),
        failures: 0,
        last_done: t_last,
    };
    for (child, dir) in children.iter_mut().zip(dirs) {
        let status = tokio::task::block_in_place(|| child.wait()).unwrap();
        if !status.success() {
            g.failures += 1;
            let err = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
            eprintln!(
                "bench: {} agent in {} failed ({status}): {}",
                tool.label(),
                dir.display(),
                err.trim()
            );
            continue;
        }
        let done = std::fs::metadata(dir.join(tool.done_file()))
            .and_then(|m| m.modified())
            .unwrap();
        g.last_done = g.last_done.max(done);
        g.latency.push(
            done.duration_since(t_last)
                .map(|d| d.as_secs_f64() * 1e3)
                .unwrap_or(0.0),
        );
        let line = std::fs::read_to_string(dir.join("rss")).unwrap_or_default();
        let fields: Vec<&str> = line
            .trim()
            .lines()
            .last()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        g.rss
            .push(fields.first().and_then(|v| v.parse().ok()).unwrap_or(0));
        g.cpu_ms.push(
            fields
                .iter()
                .skip(1)
                .filter_map(|v| v.parse::<f64>().ok())
                .sum::<f64>()
                * 1e3,
        );
    }
    g
}

pub async fn run(
    client: &Client,
    kc: &Path,
    bin: &Path,
    tool: Tool,
    n: usize,
    delay: Duration,
) -> Outcome {
    run_shaped(client, kc, bin, tool, n, 1, delay).await
}

/// The job's `n` pods in `ns`, labelled with `sel`, their type and their index within
/// it, each with a port of its own, bound to a node; their names.
async fn create_pods(
    client: &Client,
    kubelet: &Kubelet,
    ns: &str,
    sel: &str,
    n: usize,
    types: usize,
) -> Vec<String> {
    let names: Vec<String> = (0..n)
        .map(|i| {
            let (t, k) = task_of(i, n, types);
            format!("{t}-{k}")
        })
        .collect();
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(16, |(i, name)| {
            let (t, k) = task_of(i, n, types);
            async move {
                pod(name)
                    .labels(&format!(
                        "{sel},role={t},batch.kubernetes.io/job-completion-index={k}"
                    ))
                    .port("tf", i32::from(own_port(i)))
                    .create(client, ns)
                    .await;
                kubelet.bind(name, "node-a").await;
            }
        })
        .await;
    names
}

/// Lets every agent reach its waiting state: for watchers, until the API server holds
/// their `n` watches (at most 180 s); for the polling loop, two polls.
async fn settle(client: &Client, tool: Tool, n: usize, watches_before: f64) {
    let settle = Instant::now();
    if tool == Tool::KubectlPoll {
        tokio::time::sleep(Duration::from_secs(3)).await;
        return;
    }
    loop {
        let w = pod_watches(&scrape(client).await) - watches_before;
        if w >= n as f64 || settle.elapsed() > Duration::from_secs(180) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The kubelet player: Running in random order, spread over about one second. Returns
/// when the last Running status was sent.
async fn play_running(kubelet: &Kubelet, names: &[String]) -> SystemTime {
    let n = names.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rng());
    let gap = Duration::from_secs_f64(1.0 / n as f64);
    let mut t_last = SystemTime::now();
    for (k, i) in order.iter().enumerate() {
        let ip = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        if k == n - 1 {
            t_last = SystemTime::now();
        }
        kubelet.running_as(&names[*i], &ip, "trainer").await;
        tokio::time::sleep(gap).await;
    }
    t_last
}

/// One run with a job of `types` types (1 or 2); pods carry their type and their
/// index within it as labels, as Indexed Jobs label theirs. `bin` is the tool's
/// executable: trainlet's, or the floor's for [`Tool::Floor`] (kubectl is on the PATH).
pub async fn run_shaped(
    client: &Client,
    kc: &Path,
    bin: &Path,
    tool: Tool,
    n: usize,
    types: usize,
    delay: Duration,
) -> Outcome {
    let ns = support::namespace(client, &format!("bench-{n}")).await;
    let sel = format!("bench={}", support::unique());
    let kubelet = Kubelet::new(client, &ns);
    let names = create_pods(client, &kubelet, &ns, &sel, n, types).await;
    let base = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = names
        .iter()
        .map(|n| {
            let d = base.path().join(n);
            std::fs::create_dir_all(&d).unwrap();
            d
        })
        .collect();
    let port = support::free_port();
    // kubectl takes its namespace from the kubeconfig context: write one per namespace.
    let kc_ns = base.path().join("kubeconfig");
    let text = std::fs::read_to_string(kc)
        .unwrap()
        .replace("namespace: default", &format!("namespace: {ns}"));
    std::fs::write(&kc_ns, text).unwrap();

    let setup = Setup {
        tool,
        bin,
        kubeconfig: &kc_ns,
        ns: &ns,
        sel: &sel,
        n,
        port,
        types,
    };
    let watches_before = pod_watches(&scrape(client).await);
    let before = scrape(client).await;
    let mut children: Vec<Child> = names
        .iter()
        .zip(&dirs)
        .map(|(name, dir)| {
            agent_command(&setup, name, dir)
                .spawn()
                .expect("spawn agent")
        })
        .collect();
    settle(client, tool, n, watches_before).await;
    tokio::time::sleep(delay).await;
    let t_last = play_running(&kubelet, &names).await;

    let g = gather(tool, &mut children, &dirs, t_last);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = scrape(client).await;
    let (by_kind, bytes) = agent_cost(&before, &after);
    let mut by_kind_per_agent = std::collections::BTreeMap::new();
    for (k, v) in &by_kind {
        by_kind_per_agent.insert(k.clone(), v / n as f64);
    }
    let total: f64 = by_kind.values().sum();
    Outcome {
        egress_kib: bytes / 1024.0,
        requests_per_agent: total / n as f64,
        requests_by_kind: by_kind_per_agent,
        bytes_per_agent: bytes / n as f64,
        ..g.outcome(tool, n, types, delay, t_last)
    }
}
