//! Scenario 5: what the reporters' peer watch costs the API server, for the whole life
//! of a job, in both modes: every sidecar watching every peer (`--coordinate never`),
//! and coordinated (`--coordinate always`), where the resolver pod's sidecar watches
//! every peer and publishes the cluster again, and every other sidecar watches the
//! resolver pod alone.
//!
//! A job of N pods runs (the kubelet player gives them IPs); `trainlet init` resolves
//! for task 0 and [`SAMPLE`] other pods, and their sidecars start with
//! `--cluster-file`. A sidecar's cost does not depend on how many other sidecars run
//! (each watch is its own stream), so a sample of sidecars gives the cost per sidecar,
//! measured from the API server's own counters: the bytes of every watch event it sent
//! on pods (`apiserver_watch_events_sizes`) and of every response to pods and Events
//! requests (`apiserver_response_sizes`).
//! - at start: from the sidecars' start until each has published
//!   `trainlet.io/cluster: current`, plus 2 s;
//! - per peer replacement: a pod outside the sample is deleted and replaced at a new
//!   IP; from the deletion until every sampled sidecar says `stale: … → <new IP>`,
//!   plus 2 s.
//!
//! The API server's counters do not tell one watch from another, so coordinated, two
//! jobs run: in one the resolver's sidecar alone (its start, and one replacement), in
//! the other the followers' too; what its replacement costs beyond the first is the
//! followers'. The job's whole cost follows: N × a sidecar's, or the resolver's plus
//! N − 1 followers'.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::{Api, Client};
use serde::Serialize;

use crate::metrics::{Scrape, scrape};
use crate::report_support as rs;
use crate::support::{self, Kubelet, pod};

/// Followers (or, every peer watched, sidecars) measured besides task 0's.
pub const SAMPLE: usize = 4;

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub n: usize,
    /// `never` or `always`.
    pub coordinate: String,
    /// Bytes the API server sent, per sidecar, at start.
    pub start_bytes_per_sidecar: f64,
    /// Coordinated: the resolver's sidecar alone, at start.
    pub start_bytes_resolver: Option<f64>,
    /// Bytes per sidecar for one peer replaced.
    pub replacement_bytes_per_sidecar: f64,
    pub replacement_bytes_resolver: Option<f64>,
    /// The whole job: at start, and per replacement.
    pub job_start_mib: f64,
    pub job_replacement_mib: f64,
    /// Seconds from the deletion until every sampled sidecar had seen the replacement.
    pub replacement_seen_s: f64,
    pub error: Option<String>,
}

/// What the API server sent about pods and Events: watch events and responses.
fn sent(before: &Scrape, after: &Scrape) -> f64 {
    let sum = |s: &Scrape| -> f64 {
        s.0.iter()
            .filter(|((name, labels), _)| {
                let label = |k: &str| {
                    labels
                        .iter()
                        .find(|(lk, _)| lk == k)
                        .map_or("", |(_, v)| v.as_str())
                };
                match name.as_str() {
                    "apiserver_watch_events_sizes_sum" => label("resource") == "pods",
                    "apiserver_response_sizes_sum" => {
                        matches!(label("resource"), "pods" | "events")
                            && !matches!(label("subresource"), "status" | "binding")
                    }
                    _ => false,
                }
            })
            .map(|(_, v)| v)
            .sum()
    };
    sum(after) - sum(before)
}

struct Sidecar {
    pod: String,
    child: Child,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sidecar(kc: &Path, ns: &str, pod: &str, dir: &Path) -> Sidecar {
    let child = support::trainlet()
        .arg("sidecar")
        .arg("--kubeconfig")
        .arg(kc)
        .args(["--pod-name", pod, "--pod-namespace", ns])
        .args(["--metrics-addr", "off", "--log-level", "warn"])
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .arg("--cluster-file")
        .arg(dir.join("cluster.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("sidecar.log")).unwrap())
        .spawn()
        .expect("spawn sidecar");
    Sidecar {
        pod: pod.to_string(),
        child,
    }
}

/// Waits until every sidecar's pod says `trainlet.io/cluster` is `want(pod)`.
async fn wait_cluster(
    client: &Client,
    ns: &str,
    sidecars: &[Sidecar],
    want: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(180);
    for s in sidecars {
        loop {
            let a = rs::annotations(client, ns, &s.pod).await;
            match a.get("trainlet.io/cluster") {
                Some(v) if want(v) => break,
                v if Instant::now() > deadline => {
                    return Err(format!(
                        "pod {} says trainlet.io/cluster {v:?} after 180 s",
                        s.pod
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    Ok(())
}

/// The job under measure.
struct Job<'a> {
    client: &'a Client,
    api: &'a Api<k8s_openapi::api::core::v1::Pod>,
    kubelet: &'a Kubelet,
    names: &'a [String],
    sel: &'a str,
    ns: &'a str,
    n: usize,
}

impl Job<'_> {
    /// Replaces pod `k` at a new IP and waits until every sidecar has seen it: the
    /// bytes the API server sent meanwhile (and 2 s after), and how long it took.
    async fn replace(&self, k: usize, sidecars: &[Sidecar]) -> Result<(f64, f64), String> {
        let index = "batch.kubernetes.io/job-completion-index";
        let before = scrape(self.client).await;
        let start = Instant::now();
        self.api
            .delete(
                &self.names[k],
                &kube::api::DeleteParams::default().grace_period(0),
            )
            .await
            .map_err(|e| e.to_string())?;
        let replacement = format!("w-{k}-b");
        pod(&replacement)
            .labels(&format!(
                "{},batch.kubernetes.io/job-name=w,{index}={k}",
                self.sel
            ))
            .create(self.client, self.ns)
            .await;
        let new_ip = ip(self.n + k);
        self.kubelet.run(&replacement, &new_ip).await;
        // The resolver's own files are never moved here (nothing restarts), so after a
        // first replacement it names both.
        let want = format!("worker/{k} {} → {new_ip}", ip(k));
        wait_cluster(self.client, self.ns, sidecars, |v| {
            v.starts_with("stale: ") && v.contains(&want)
        })
        .await?;
        let seen = start.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok((sent(&before, &scrape(self.client).await), seen))
    }
}

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", 120 + i / 65536, (i / 256) % 256, i % 256)
}

/// Runs `trainlet init` for the sampled pods at once (a follower waits for the
/// resolver's annotation); their directories.
async fn init(
    kc: &Path,
    ns: &str,
    sel: &str,
    n: usize,
    pods: &[String],
    coordinate: &str,
    base: &Path,
) -> Result<Vec<PathBuf>, String> {
    let mut runs = Vec::new();
    for p in pods {
        let dir = base.join(p);
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new(support::trainlet().get_program());
        cmd.arg("init")
            .arg("--kubeconfig")
            .arg(kc)
            .args(["--pod-name", p, "--pod-namespace", ns])
            .args(["--job", &format!("worker={sel}")])
            .args(["--expect", &format!("worker={n}")])
            .args(["--port", "8470", "--coordinate", coordinate])
            .args(["--timeout", "5m", "--log-level", "warn"])
            .arg("--output-dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("init.log")).unwrap());
        runs.push((dir, cmd.spawn().map_err(|e| e.to_string())?));
    }
    let mut dirs = Vec::new();
    for (dir, mut child) in runs {
        let status = tokio::task::block_in_place(|| child.wait()).unwrap();
        if !status.success() {
            return Err(format!(
                "init in {} failed: {}",
                dir.display(),
                std::fs::read_to_string(dir.join("init.log")).unwrap_or_default()
            ));
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

pub async fn run(client: &Client, kc: &Path, n: usize, coordinate: &str) -> Outcome {
    let mut out = Outcome {
        n,
        coordinate: coordinate.to_string(),
        start_bytes_per_sidecar: f64::NAN,
        start_bytes_resolver: None,
        replacement_bytes_per_sidecar: f64::NAN,
        replacement_bytes_resolver: None,
        job_start_mib: f64::NAN,
        job_replacement_mib: f64::NAN,
        replacement_seen_s: f64::NAN,
        error: None,
    };
    if let Err(e) = measure(client, kc, n, coordinate, &mut out).await {
        eprintln!("bench: peer watch N={n} {coordinate}: {e}");
        out.error = Some(e);
    }
    out
}

/// A job of `n` running pods, labelled as an Indexed Job labels its pods: the job name
/// and the index are what a replacement shares with the pod it replaces.
struct Pods {
    ns: String,
    sel: String,
    names: Vec<String>,
    api: Api<k8s_openapi::api::core::v1::Pod>,
    kubelet: Kubelet,
}

async fn pods(client: &Client, n: usize) -> Pods {
    let ns = support::namespace(client, &format!("peers-{n}")).await;
    let sel = format!("peers={}", support::unique());
    let index = "batch.kubernetes.io/job-completion-index";
    let names: Vec<String> = (0..n).map(|i| format!("w-{i}")).collect();
    let kubelet = Kubelet::new(client, &ns);
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(16, |(i, name)| {
            let (client, ns, sel, kubelet) =
                (client.clone(), ns.clone(), sel.clone(), kubelet.clone());
            async move {
                pod(name)
                    .labels(&format!("{sel},batch.kubernetes.io/job-name=w,{index}={i}"))
                    .create(&client, &ns)
                    .await;
                kubelet.run(name, &ip(i)).await;
            }
        })
        .await;
    Pods {
        api: Api::namespaced(client.clone(), &ns),
        ns,
        sel,
        names,
        kubelet,
    }
}

impl Pods {
    fn job<'a>(&'a self, client: &'a Client) -> Job<'a> {
        Job {
            client,
            api: &self.api,
            kubelet: &self.kubelet,
            names: &self.names,
            sel: &self.sel,
            ns: &self.ns,
            n: self.names.len(),
        }
    }

    /// Task 0 and the sample; the pod replaced is the last, outside the sample.
    fn sampled(&self) -> &[String] {
        &self.names[..SAMPLE + 1]
    }
}

async fn measure(
    client: &Client,
    kc: &Path,
    n: usize,
    coordinate: &str,
    out: &mut Outcome,
) -> Result<(), String> {
    let base = tempfile::tempdir().unwrap();
    let current = |v: &str| v == "current";
    let mib = f64::from(1 << 20);
    let dir = |name: &str| base.path().join(name);
    if coordinate == "always" {
        // One job with the resolver's sidecar alone: its start, and one replacement.
        let a = pods(client, n).await;
        let sampled = a.sampled();
        let dirs = init(kc, &a.ns, &a.sel, n, &sampled[..1], coordinate, &dir("a")).await?;
        let before = scrape(client).await;
        let resolver = vec![sidecar(kc, &a.ns, &sampled[0], &dirs[0])];
        wait_cluster(client, &a.ns, &resolver, current).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let resolver_start = sent(&before, &scrape(client).await);
        let (resolver_replacement, _) = a.job(client).replace(n - 1, &resolver).await?;
        drop(resolver);
        // Another, the same, with the followers' sidecars too: what its replacement
        // costs beyond the first is theirs.
        let b = pods(client, n).await;
        let sampled = b.sampled();
        let dirs = init(kc, &b.ns, &b.sel, n, sampled, coordinate, &dir("b")).await?;
        let mut sidecars = vec![sidecar(kc, &b.ns, &sampled[0], &dirs[0])];
        wait_cluster(client, &b.ns, &sidecars, current).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = scrape(client).await;
        for (p, d) in sampled[1..].iter().zip(&dirs[1..]) {
            sidecars.push(sidecar(kc, &b.ns, p, d));
        }
        wait_cluster(client, &b.ns, &sidecars[1..], current).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let follower_start = sent(&before, &scrape(client).await) / SAMPLE as f64;
        let (total, seen) = b.job(client).replace(n - 1, &sidecars).await?;
        let follower_replacement = ((total - resolver_replacement) / SAMPLE as f64).max(0.0);
        out.start_bytes_resolver = Some(resolver_start);
        out.start_bytes_per_sidecar = follower_start;
        out.replacement_bytes_resolver = Some(resolver_replacement);
        out.replacement_bytes_per_sidecar = follower_replacement;
        out.replacement_seen_s = seen;
        out.job_start_mib = (resolver_start + (n - 1) as f64 * follower_start) / mib;
        out.job_replacement_mib =
            (resolver_replacement + (n - 1) as f64 * follower_replacement) / mib;
    } else {
        let a = pods(client, n).await;
        let sampled = a.sampled();
        let dirs = init(kc, &a.ns, &a.sel, n, sampled, coordinate, &dir("a")).await?;
        let before = scrape(client).await;
        let sidecars: Vec<Sidecar> = sampled
            .iter()
            .zip(&dirs)
            .map(|(p, d)| sidecar(kc, &a.ns, p, d))
            .collect();
        wait_cluster(client, &a.ns, &sidecars, current).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let each = sidecars.len() as f64;
        out.start_bytes_per_sidecar = sent(&before, &scrape(client).await) / each;
        let (total, seen) = a.job(client).replace(n - 1, &sidecars).await?;
        out.replacement_bytes_per_sidecar = total / each;
        out.replacement_seen_s = seen;
        out.job_start_mib = n as f64 * out.start_bytes_per_sidecar / mib;
        out.job_replacement_mib = n as f64 * out.replacement_bytes_per_sidecar / mib;
    }
    // The namespaces stay: the bench's control plane runs no namespace controller, and
    // goes away at the end.
    Ok(())
}
