//! Scenario 10: what `init --preflight` adds to a job's start. N `trainlet init` agents
//! wait for N pods; the kubelet player then puts each pod where every pod of a job sits
//! while its init runs (Pending, its trainlet-init running, a pod IP), in random order
//! over about a second. Each pod has a loopback address of its own (127.77.x.y) and a
//! port of its own (`resolve::own_port`: the agents share this host's network
//! namespace), so the pre-flight's connections are real sockets. Measured: from the
//! last pod's status sent until the last agent's `tf_config.json` existed, with and
//! without `--preflight`, alternating, [`ROUNDS`] runs each: the difference of the
//! medians is what the pre-flight adds beyond the slowest peer's start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use kube::Client;
use rand::seq::SliceRandom;
use serde_json::{Value, json};

use crate::metrics::{pod_watches, scrape};
use crate::resolve::own_port;
use crate::support::{self, Kubelet, pod};

pub const ROUNDS: usize = 3;

fn ip(i: usize) -> String {
    format!("127.77.{}.{}", i / 250, i % 250 + 1)
}

/// One run: the time from the last pod's status to the last file, ms; the failures.
async fn once(client: &Client, kc: &Path, bin: &Path, n: usize, preflight: bool) -> (f64, usize) {
    let ns = support::namespace(client, &format!("preflight-{n}")).await;
    let sel = format!("bench={}", support::unique());
    let kubelet = Kubelet::new(client, &ns);
    let names: Vec<String> = (0..n).map(|i| format!("worker-{i}")).collect();
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(16, |(i, name)| {
            let (client, ns, sel, kubelet) =
                (client.clone(), ns.clone(), sel.clone(), kubelet.clone());
            async move {
                pod(name)
                    .labels(&format!(
                        "{sel},batch.kubernetes.io/job-completion-index={i}"
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
    let watches_before = pod_watches(&scrape(client).await);
    let mut children: Vec<Child> = names
        .iter()
        .zip(&dirs)
        .map(|(name, dir)| {
            let mut cmd = Command::new(bin);
            cmd.arg("init")
                .arg("--kubeconfig")
                .arg(kc)
                .args(["--pod-name", name, "--pod-namespace", &ns])
                .arg("--output-dir")
                .arg(dir)
                .args(["--job", &format!("worker={sel}")])
                .args(["--expect", &format!("worker={n}")])
                .args([
                    "--port-name",
                    "tf",
                    "--timeout",
                    "300s",
                    "--coordinate",
                    "never",
                ])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
            if preflight {
                cmd.arg("--preflight");
            }
            cmd.spawn().expect("spawn init")
        })
        .collect();
    let settle = Instant::now();
    while pod_watches(&scrape(client).await) - watches_before < n as f64
        && settle.elapsed() < Duration::from_secs(180)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rng());
    let gap = Duration::from_secs_f64(1.0 / n as f64);
    let mut t_last = SystemTime::now();
    for (k, i) in order.iter().enumerate() {
        if k == n - 1 {
            t_last = SystemTime::now();
        }
        let now = support::now();
        kubelet
            .status(
                &names[*i],
                json!({"phase": "Pending", "podIP": ip(*i), "podIPs": [{"ip": ip(*i)}],
                    "initContainerStatuses": [{"name": "trainlet-init", "image": "ghcr.io/trainlet/trainlet:0.1.0",
                        "imageID": "", "ready": false, "restartCount": 0, "started": true,
                        "state": {"running": {"startedAt": now}}}]}),
            )
            .await;
        tokio::time::sleep(gap).await;
    }
    let mut failures = 0;
    let mut last = t_last;
    for (child, dir) in children.iter_mut().zip(&dirs) {
        let status = tokio::task::block_in_place(|| child.wait()).unwrap();
        if !status.success() {
            failures += 1;
            eprintln!(
                "bench: preflight={preflight} agent in {} failed ({status}): {}",
                dir.display(),
                std::fs::read_to_string(dir.join("stderr"))
                    .unwrap_or_default()
                    .lines()
                    .last()
                    .unwrap_or_default()
            );
            continue;
        }
        let done = std::fs::metadata(dir.join("tf_config.json"))
            .and_then(|m| m.modified())
            .unwrap();
        last = last.max(done);
    }
    // The bench's control plane runs no namespace controller: the pods go, at once,
    // and the namespace stays until the control plane does.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), &ns);
    pods.delete_collection(
        &kube::api::DeleteParams::default().grace_period(0),
        &Default::default(),
    )
    .await
    .expect("delete the run's pods");
    let ms = last
        .duration_since(t_last)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0);
    (ms, failures)
}

/// Without, then with `--preflight`, in even rounds; the other way in odd ones.
fn alternating(round: usize) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Every size, with and without `--preflight`, alternating; writes
/// target/bench/results-preflight.json.
pub async fn run(client: &Client, kc: &Path, bin: &Path, sizes: &[usize]) -> Value {
    let mut runs = Vec::new();
    let mut medians = serde_json::Map::new();
    for &n in sizes {
        let (mut without, mut with) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            for preflight in alternating(round) {
                eprintln!("bench: preflight N={n} round {round} --preflight={preflight}");
                let (ms, failures) = once(client, kc, bin, n, preflight).await;
                runs.push(json!({"n": n, "preflight": preflight, "all_done_ms": ms, "failures": failures}));
                if preflight {
                    with.push(ms)
                } else {
                    without.push(ms)
                }
            }
        }
        let (a, b) = (median(without), median(with));
        medians.insert(
            n.to_string(),
            json!({"without_ms": a, "with_ms": b, "added_ms": b - a}),
        );
    }
    eprintln!("bench: preflight on the real node, N=3");
    let node = node_run().await;
    let result = json!({
        "machine": crate::report::machine(),
        "commit": crate::report::commit(),
        "command": crate::report::command(),
        "rounds": ROUNDS,
        "median_added_ms": medians,
        "runs": runs,
        "node": node,
    });
    crate::report::write_own("results-preflight.json", &result);
    result
}

/// On the real node, N = 3: a plain Indexed Job of 3 pods through `trainlet inject`
/// (the shipped layout), with and without `--preflight`, alternating, [`ROUNDS`] runs
/// each; from the start of `kubectl apply` until the last trainlet-init logged that it
/// wrote `tf_config.json` (the container runtime's timestamps). None, said on stderr,
/// where the node cannot start.
pub async fn node_run() -> Option<Value> {
    let (kc, client, ns) = crate::node::namespace_on_node("pre-flight", "bench-preflight").await?;
    let mut runs = Vec::new();
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for preflight in alternating(round) {
            eprintln!("bench: preflight on the node, N=3, round {round} --preflight={preflight}");
            let ms = node_once(
                kc,
                &ns,
                &format!("pf{round}{}", u8::from(preflight)),
                preflight,
            );
            runs.push(json!({"n": 3, "preflight": preflight, "all_done_ms": ms}));
            if preflight {
                with.push(ms)
            } else {
                without.push(ms)
            }
        }
    }
    support::delete_namespace(&client, &ns).await;
    let (a, b) = (median(without), median(with));
    Some(json!({"without_ms": a, "with_ms": b, "added_ms": b - a, "runs": runs}))
}

fn node_once(kc: &Path, ns: &str, name: &str, preflight: bool) -> f64 {
    let plain = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 3,
            "parallelism": 3,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                    "containers": [{
                        "name": "main",
                        "image": "trainlet.test/trainer:1",
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "echo \"TF_CONFIG=$TF_CONFIG\""],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                      "limits": {"memory": "32Mi"}}
                    }]
                }
            }
        }
    });
    let job = format!("worker=batch.kubernetes.io/job-name={name}");
    let mut flags = vec!["--wrap", "main", "--job", &job];
    if preflight {
        flags.push("--preflight");
    }
    let doc = support::as_json(kc, &support::inject_printed(&plain, &flags));
    let start = SystemTime::now();
    support::apply_clean(kc, ns, &doc);
    crate::node::wait_complete(kc, ns, name);
    let pods = crate::node::kubectl_json(
        kc,
        &[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            &format!("batch.kubernetes.io/job-name={name}"),
        ],
    );
    let mut last = start;
    for p in pods["items"].as_array().unwrap() {
        let pod = p["metadata"]["name"].as_str().unwrap();
        let log = support::kubectl_on(
            kc,
            &["logs", "-n", ns, pod, "-c", "trainlet-init", "--timestamps"],
        );
        let line = log
            .lines()
            .find(|l| l.contains(" INFO wrote /etc/trainlet/tf_config.json"))
            .unwrap_or_else(|| panic!("{pod}: no file written in\n{log}"));
        last = last.max(crate::node::cri_time(line));
    }
    support::kubectl_on(
        kc,
        &[
            "delete",
            "job",
            "-n",
            ns,
            name,
            "--cascade=foreground",
            "--wait=true",
        ],
    );
    last.duration_since(start).unwrap_or_default().as_secs_f64() * 1e3
}
