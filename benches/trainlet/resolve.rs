//! Scenario 1: N init agents (trainlet, or the shell init container users write today)
//! wait for N pods that the kubelet player then marks Running in random order.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use kube::Client;
use rand::seq::SliceRandom;
use serde::Serialize;

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
}

impl Tool {
    pub fn label(self) -> &'static str {
        match self {
            Tool::Trainlet => "trainlet init",
            Tool::TrainletCoordinated => "trainlet init, coordinated",
            Tool::KubectlWait => "kubectl wait + get",
            Tool::KubectlPoll => "kubectl get, 2 s poll",
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

/// What every agent of one run shares.
struct Setup<'a> {
    tool: Tool,
    bin: &'a Path,
    kubeconfig: &'a Path,
    ns: &'a str,
    sel: &'a str,
    n: usize,
    port: u16,
    types: usize,
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

fn agent_command(s: &Setup, pod_name: &str, out: &Path) -> Command {
    let Setup {
        tool,
        bin,
        kubeconfig: kc,
        ns,
        sel,
        n,
        port,
        types,
    } = *s;
    let rss = out.join("rss");
    let mut cmd = Command::new("/usr/bin/time");
    // Peak RSS in KiB, then user and system CPU seconds.
    cmd.arg("-f").arg("%M %U %S").arg("-o").arg(&rss);
    match tool {
        Tool::Trainlet | Tool::TrainletCoordinated => {
            let (jobs, expect) = if types == 2 {
                let ps = (n / 16).max(1);
                (
                    vec![
                        format!("ps={sel},role=ps"),
                        format!("worker={sel},role=worker"),
                    ],
                    format!("ps={ps},worker={}", n - ps),
                )
            } else {
                (vec![format!("worker={sel}")], format!("worker={n}"))
            };
            cmd.arg(bin).arg("init").arg("--kubeconfig").arg(kc).args([
                "--pod-name",
                pod_name,
                "--pod-namespace",
                ns,
            ]);
            for j in &jobs {
                cmd.args(["--job", j]);
            }
            cmd.args([
                "--expect",
                &expect,
                "--port-name",
                "tf",
                "--port",
                &port.to_string(),
                "--timeout",
                "10m",
                "--log-level",
                "warn",
                "--coordinate",
                if tool == Tool::Trainlet {
                    "never"
                } else {
                    "always"
                },
            ])
            .arg("--output-dir")
            .arg(out);
        }
        Tool::KubectlWait | Tool::KubectlPoll => {
            let wait = if tool == Tool::KubectlWait {
                "kubectl wait --for=jsonpath='{.status.phase}'=Running pod -l \"$SEL\" --timeout=600s >/dev/null".to_string()
            } else {
                format!(
                    "until [ \"$(kubectl get pods -l \"$SEL\" -o jsonpath='{{range .items[*]}}{{.status.phase}}{{\"\\n\"}}{{end}}' | grep -c '^Running$')\" -eq {n} ]; do sleep 2; done"
                )
            };
            // What a user's shell init container does: wait, get the addresses, write
            // TF_CONFIG with the shell (natural order by name, own index by position).
            let script = format!(
                r#"set -eu
{wait}
list=$(kubectl get pods -l "$SEL" -o jsonpath='{{range .items[*]}}{{.metadata.name}}{{" "}}{{.status.podIP}}{{"\n"}}{{end}}' | sort -V)
hosts=$(printf '%s\n' "$list" | awk '{{printf "%s\"%s:{port}\"", (NR>1?",":""), $2}}')
idx=$(printf '%s\n' "$list" | awk -v me="$POD" '$1==me {{print NR-1}}')
printf '{{"cluster":{{"worker":[%s]}},"task":{{"type":"worker","index":%s}}}}\n' "$hosts" "$idx" >"$OUT/.tf_config.json.tmp"
mv "$OUT/.tf_config.json.tmp" "$OUT/tf_config.json"
"#
            );
            cmd.args(["sh", "-c", &script])
                .env("KUBECONFIG", kc)
                .env("SEL", sel)
                .env("POD", pod_name)
                .env("OUT", out)
                // A cold init container has no discovery cache.
                .env("KUBECACHEDIR", out.join("kube-cache"))
                .env("HOME", out);
        }
    }
    // A file, not a pipe: a thousand agents would hold a thousand pipes open here.
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(out.join("stderr")).expect("stderr file"));
    cmd
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

/// One run with a job of `types` types (1 or 2); pods carry their type and their
/// index within it as labels, as Indexed Jobs label theirs.
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
    let names: Vec<String> = (0..n)
        .map(|i| {
            let (t, k) = task_of(i, n, types);
            format!("{t}-{k}")
        })
        .collect();
    let kubelet = Kubelet::new(client, &ns);
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(16, |(i, name)| {
            let (client, ns, sel, kubelet) =
                (client.clone(), ns.clone(), sel.clone(), kubelet.clone());
            let (t, k) = task_of(i, n, types);
            async move {
                pod(name)
                    .labels(&format!(
                        "{sel},role={t},batch.kubernetes.io/job-completion-index={k}"
                    ))
                    .port("tf", i32::from(own_port(i)))
                    .create(&client, &ns)
                    .await;
                kubelet.bind(name, "node-a").await;
            }
        })
        .await;
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

    // Let every agent reach its waiting state: for watchers, until the API server holds
    // their watches; for the polling loop, two polls.
    let settle = Instant::now();
    if tool == Tool::KubectlPoll {
        tokio::time::sleep(Duration::from_secs(3)).await;
    } else {
        loop {
            let w = pod_watches(&scrape(client).await) - watches_before;
            if w >= n as f64 || settle.elapsed() > Duration::from_secs(180) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(delay).await;

    // The kubelet player: Running in random order, spread over about one second.
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

    let mut latency = Vec::new();
    let mut rss = Vec::new();
    let mut cpu_ms = Vec::new();
    let mut failures = 0;
    let mut last_done = t_last;
    for (child, dir) in children.iter_mut().zip(&dirs) {
        let status = tokio::task::block_in_place(|| child.wait()).unwrap();
        if !status.success() {
            failures += 1;
            let err = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
            eprintln!(
                "bench: {} agent in {} failed ({status}): {}",
                tool.label(),
                dir.display(),
                err.trim()
            );
            continue;
        }
        let done = std::fs::metadata(dir.join("tf_config.json"))
            .and_then(|m| m.modified())
            .unwrap();
        last_done = last_done.max(done);
        latency.push(
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
        rss.push(fields.first().and_then(|v| v.parse().ok()).unwrap_or(0));
        cpu_ms.push(
            fields
                .iter()
                .skip(1)
                .filter_map(|v| v.parse::<f64>().ok())
                .sum::<f64>()
                * 1e3,
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = scrape(client).await;
    let (by_kind, bytes) = agent_cost(&before, &after);
    let mut by_kind_per_agent = std::collections::BTreeMap::new();
    for (k, v) in &by_kind {
        by_kind_per_agent.insert(k.clone(), v / n as f64);
    }
    let total: f64 = by_kind.values().sum();

    let mut sorted = latency.clone();
    sorted.sort_by(f64::total_cmp);
    let mut rss_sorted = rss.clone();
    rss_sorted.sort();
    Outcome {
        tool,
        n,
        types,
        egress_kib: bytes / 1024.0,
        delay_s: delay.as_secs_f64(),
        p50_ms: percentile(&sorted, 50.0),
        p99_ms: percentile(&sorted, 99.0),
        max_ms: sorted.last().copied().unwrap_or(f64::NAN),
        all_done_ms: last_done
            .duration_since(t_last)
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0),
        latency_ms: latency,
        rss_median_kib: rss_sorted.get(rss_sorted.len() / 2).copied().unwrap_or(0),
        rss_max_kib: rss_sorted.last().copied().unwrap_or(0),
        rss_kib: rss,
        cpu_median_ms: {
            cpu_ms.sort_by(f64::total_cmp);
            cpu_ms.get(cpu_ms.len() / 2).copied().unwrap_or(f64::NAN)
        },
        requests_per_agent: total / n as f64,
        requests_by_kind: by_kind_per_agent,
        bytes_per_agent: bytes / n as f64,
        failures,
    }
}
