//! Scenario 8, on the real node of tests/node/up (root; support::node): a TensorFlow
//! parameter-server job of 1 ps + 3 workers (two Indexed Jobs, applied together in one
//! `kubectl apply`), from the start of that `kubectl apply` to the last pod's TF_CONFIG
//! written, with trainlet's init container (`trainlet inject`, the shipped layout, from
//! the image archive) against the init container users write by hand (image
//! `trainlet.test/kubectl:1`: the machine's static kubectl and busybox), alternating in
//! the same run. The hand-written one does what users' scripts do: it waits until the
//! job's 4 pods exist, then `kubectl wait` for each pod's address (not
//! `--for=condition=Ready`: init containers keep every pod from Ready, so that would
//! wait forever), then `kubectl get pods -o jsonpath` and a shell assembles TF_CONFIG.
//! "Written" is the container runtime's timestamp of the line each init container logs
//! once it wrote the file (`kubectl logs --timestamps`), on this machine's clock, as is
//! the start of `kubectl apply`.
//!
//! Also each container's peak memory as the kubelet's cgroup sees it
//! (`memory.max_usage_in_bytes` on cgroup v1, `memory.peak` on v2), sampled every 25 ms
//! from the host while the container runs (an init container's cgroup goes when it
//! exits).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::support;

/// Runs of each variant, alternating.
pub const ROUNDS: usize = 3;

const WORKERS: usize = 3;

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Trainlet,
    HandWritten,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Trainlet => crate::report::NODE_TRAINLET,
            Variant::HandWritten => crate::report::NODE_HAND_WRITTEN,
        }
    }
    fn init(self) -> &'static str {
        match self {
            Variant::Trainlet => "trainlet-init",
            Variant::HandWritten => "tf-config",
        }
    }
    /// The line the init container logs once the file is written.
    fn written(self) -> &'static str {
        match self {
            Variant::Trainlet => " INFO wrote /etc/trainlet/tf_config.json",
            Variant::HandWritten => "wrote /etc/tf/tf_config.json",
        }
    }
}

/// The hand-written init container's script, as users write it.
const SCRIPT: &str = r#"set -e
sel="bench-run=$RUN"
# The Job controller creates the pods one by one: wait until all 4 exist.
until [ "$(kubectl get pods -l "$sel" -o name | wc -l)" -ge 4 ]; do sleep 1; done
# Init containers keep every pod from Ready: wait for the addresses instead.
kubectl wait --for=jsonpath='{.status.podIP}' pod -l "$sel" --timeout=300s >/dev/null
kubectl get pods -l "$sel" -o jsonpath='{range .items[*]}{.metadata.labels.bench-role} {.metadata.labels.batch\.kubernetes\.io/job-completion-index} {.status.podIP}{"\n"}{end}' | sort >/tmp/pods
ps=$(awk '$1=="ps"{printf "%s\"%s:2222\"", (n++ ? "," : ""), $3}' /tmp/pods)
workers=$(awk '$1=="worker"{printf "%s\"%s:2222\"", (n++ ? "," : ""), $3}' /tmp/pods)
echo "{\"cluster\":{\"ps\":[$ps],\"worker\":[$workers]},\"task\":{\"type\":\"$ROLE\",\"index\":$JOB_COMPLETION_INDEX}}" >/etc/tf/tf_config.json
echo "wrote /etc/tf/tf_config.json""#;

/// A plain Indexed Job of the bench: `role` pods of the test image that print what they
/// were given and exit after 3 s (the sidecar runs meanwhile).
fn plain_job(run: &str, role: &str, n: usize, variant: Variant) -> Value {
    let name = format!("{run}-{role}");
    let show = match variant {
        Variant::Trainlet => "echo \"TF_CONFIG=$TF_CONFIG\"; sleep 3",
        Variant::HandWritten => "echo \"TF_CONFIG=$(cat /etc/tf/tf_config.json)\"; sleep 3",
    };
    let mut job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"bench-run": run, "bench-role": role}},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                    "containers": [{
                        "name": "main",
                        "image": "trainlet.test/trainer:1",
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", show],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                      "limits": {"memory": "32Mi"}}
                    }]
                }
            }
        }
    });
    if variant == Variant::HandWritten {
        let spec = &mut job["spec"]["template"]["spec"];
        spec["serviceAccountName"] = json!("trainlet");
        spec["initContainers"] = json!([{
            "name": "tf-config",
            "image": "trainlet.test/kubectl:1",
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", SCRIPT],
            "env": [
                {"name": "RUN", "value": run},
                {"name": "ROLE", "value": role},
                {"name": "HOME", "value": "/tmp"}
            ],
            "volumeMounts": [
                {"name": "tf", "mountPath": "/etc/tf"},
                {"name": "tmp", "mountPath": "/tmp"}
            ]
        }]);
        spec["containers"][0]["volumeMounts"] = json!([{"name": "tf", "mountPath": "/etc/tf"}]);
        spec["volumes"] = json!([
            {"name": "tf", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}}
        ]);
    }
    job
}

/// `trainlet inject` of one plain Job of the bench, both task types named.
fn inject(kc: &Path, plain: &Value, run: &str) -> Value {
    let ps = format!("ps=batch.kubernetes.io/job-name={run}-ps");
    let worker = format!("worker=batch.kubernetes.io/job-name={run}-worker");
    let printed =
        support::inject_printed(plain, &["--wrap", "main", "--job", &ps, "--job", &worker]);
    let mut doc = support::as_json(kc, &printed);
    // `as_json` gives it the kubeconfig's namespace; it goes into the bench's.
    doc["metadata"].as_object_mut().unwrap().remove("namespace");
    doc
}

/// The hand-written job with the resources `trainlet inject` gives its own init
/// container (its CPU limit above all): both sides of the comparison run under the
/// same limits.
fn with_inits_resources(mut plain: Value, injected: &Value) -> Value {
    let resources = injected["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .and_then(|inits| {
            inits.iter().find(|c| {
                c["command"]
                    .as_array()
                    .is_some_and(|a| a.get(1) == Some(&json!("init")))
            })
        })
        .map(|c| c["resources"].clone())
        .expect("trainlet inject gave the job trainlet's init container");
    plain["spec"]["template"]["spec"]["initContainers"][0]["resources"] = resources;
    plain
}

/// The memory cgroups of the node's pods, sampled until stopped: the highest peak seen
/// per (pod UID, container ID).
struct Sampler {
    stop: Arc<AtomicBool>,
    peaks: Arc<Mutex<BTreeMap<(String, String), u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn kubepods() -> (PathBuf, &'static str) {
    let v1 = PathBuf::from("/sys/fs/cgroup/memory/kubepods");
    if v1.is_dir() {
        (v1, "memory.max_usage_in_bytes")
    } else {
        (PathBuf::from("/sys/fs/cgroup/kubepods"), "memory.peak")
    }
}

impl Sampler {
    fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peaks = Arc::new(Mutex::new(BTreeMap::new()));
        let (root, file) = kubepods();
        let thread = {
            let (stop, peaks) = (stop.clone(), peaks.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for qos in ["", "burstable", "besteffort"] {
                        let Ok(dirs) = std::fs::read_dir(root.join(qos)) else {
                            continue;
                        };
                        for pod in dirs.flatten() {
                            let name = pod.file_name().to_string_lossy().to_string();
                            let Some(uid) = name.strip_prefix("pod") else {
                                continue;
                            };
                            let uid = uid.replace('_', "-");
                            let Ok(cs) = std::fs::read_dir(pod.path()) else {
                                continue;
                            };
                            for c in cs.flatten() {
                                let Ok(text) = std::fs::read_to_string(c.path().join(file)) else {
                                    continue;
                                };
                                let Ok(v) = text.trim().parse::<u64>() else {
                                    continue;
                                };
                                let id = c.file_name().to_string_lossy().to_string();
                                let mut p = peaks.lock().unwrap();
                                let e = p.entry((uid.clone(), id)).or_insert(0);
                                *e = (*e).max(v);
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(25));
                }
            })
        };
        Sampler {
            stop,
            peaks,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> BTreeMap<(String, String), u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.peaks.lock().unwrap().clone()
    }
}

pub(crate) fn kubectl_json(kc: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&support::kubectl_on(kc, &a)).unwrap()
}

/// Waits until the Job has ended, and asserts that it completed (300 s at most).
pub(crate) fn wait_complete(kc: &Path, ns: &str, name: &str) {
    let t = Instant::now();
    loop {
        let job = kubectl_json(kc, &["get", "job", "-n", ns, name]);
        let done = job["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["status"] == "True" && (c["type"] == "Complete" || c["type"] == "Failed"));
        if let Some(c) = done {
            assert_eq!(c["type"], "Complete", "job {name}: {job}");
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "job {name} not done in 300 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The real node and a namespace of a scenario's own there, with trainlet's RBAC; None,
/// said on stderr, where something the node needs is missing (root, the image
/// archive).
pub(crate) async fn namespace_on_node(
    scenario: &str,
    prefix: &str,
) -> Option<(&'static Path, kube::Client, String)> {
    let kc = match support::node() {
        Ok(kc) => kc,
        Err(missing) => {
            eprintln!("bench: {scenario} on the real node: skipped: {missing}");
            return None;
        }
    };
    let client = support::client_from(kc).await;
    let ns = support::namespace_with_labels(&client, prefix, &[]).await;
    let manifests = support::repo().join("manifests");
    support::kubectl_on(kc, &["apply", "-k", manifests.to_str().unwrap(), "-n", &ns]);
    Some((kc, client, ns))
}

pub(crate) fn cri_time(line: &str) -> SystemTime {
    humantime::parse_rfc3339(line.split_whitespace().next().unwrap())
        .unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// One run of one variant: the latency of each pod, by name, and each container's peak
/// memory, by container name, one value per pod.
fn round(
    kc: &Path,
    ns: &str,
    variant: Variant,
    i: usize,
) -> (BTreeMap<String, f64>, BTreeMap<String, Vec<u64>>) {
    let run = format!(
        "{}{i}",
        match variant {
            Variant::Trainlet => "tl",
            Variant::HandWritten => "hw",
        }
    );
    let mut items = Vec::new();
    for (role, n) in [("ps", 1), ("worker", WORKERS)] {
        let plain = plain_job(&run, role, n, variant);
        items.push(match variant {
            Variant::Trainlet => inject(kc, &plain, &run),
            Variant::HandWritten => with_inits_resources(
                plain,
                &inject(kc, &plain_job(&run, role, n, Variant::Trainlet), &run),
            ),
        });
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let sampler = Sampler::start();
    let start = SystemTime::now();
    let mut apply = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .args(["apply", "-n", ns, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        apply
            .stdin
            .take()
            .unwrap()
            .write_all(list.to_string().as_bytes())
            .unwrap();
    }
    assert!(apply.wait().unwrap().success(), "kubectl apply");
    // Both Jobs complete (the training containers exit after 3 s).
    for role in ["ps", "worker"] {
        wait_complete(kc, ns, &format!("{run}-{role}"));
    }
    let peaks = sampler.finish();
    let pods = kubectl_json(
        kc,
        &["get", "pods", "-n", ns, "-l", &format!("bench-run={run}")],
    );
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 1 + WORKERS);
    let mut latency = BTreeMap::new();
    let mut memory: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for p in pods {
        let name = p["metadata"]["name"].as_str().unwrap();
        let uid = p["metadata"]["uid"].as_str().unwrap();
        let log = support::kubectl_on(
            kc,
            &["logs", "-n", ns, name, "-c", variant.init(), "--timestamps"],
        );
        let line = log
            .lines()
            .find(|l| l.contains(variant.written()))
            .unwrap_or_else(|| panic!("{name}: no {:?} in\n{log}", variant.written()));
        let ms = cri_time(line)
            .duration_since(start)
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3;
        latency.insert(name.to_string(), ms);
        let statuses = p["status"]["initContainerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(
                p["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            );
        for c in statuses {
            let id = c["containerID"]
                .as_str()
                .unwrap_or_default()
                .rsplit("://")
                .next()
                .unwrap()
                .to_string();
            if let Some(peak) = peaks.get(&(uid.to_string(), id)) {
                memory
                    .entry(c["name"].as_str().unwrap().to_string())
                    .or_default()
                    .push(*peak);
            }
        }
    }
    for role in ["ps", "worker"] {
        support::kubectl_on(
            kc,
            &[
                "delete",
                "job",
                "-n",
                ns,
                &format!("{run}-{role}"),
                "--cascade=foreground",
                "--wait=true",
            ],
        );
    }
    (latency, memory)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the scenario; None, said on stderr, where something the node needs is missing
/// (root, the image archive).
pub async fn run() -> Option<Value> {
    let (kc, client, ns) = namespace_on_node("trainlet's init container", "bench-node").await?;
    let mut rounds = Vec::new();
    let mut last: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut memory: BTreeMap<(&str, String), Vec<u64>> = BTreeMap::new();
    for i in 0..ROUNDS {
        // Which variant runs first alternates round by round.
        let order = if i % 2 == 0 {
            [Variant::Trainlet, Variant::HandWritten]
        } else {
            [Variant::HandWritten, Variant::Trainlet]
        };
        for variant in order {
            eprintln!(
                "bench: node, 1 ps + {WORKERS} workers, {} (round {})",
                variant.label(),
                i + 1
            );
            let (lat, mem) = round(kc, &ns, variant, i);
            let max = lat.values().copied().fold(0.0, f64::max);
            last.entry(variant.label()).or_default().push(max);
            for (c, v) in &mem {
                memory
                    .entry((variant.label(), c.clone()))
                    .or_default()
                    .extend(v);
            }
            rounds.push(json!({
                "variant": variant.label(),
                "round": i + 1,
                "last_written_ms": max,
                "written_ms_by_pod": lat,
                "peak_memory_bytes_by_container": mem,
            }));
        }
    }
    support::delete_namespace(&client, &ns).await;
    let t = median(last.get_mut(Variant::Trainlet.label()).unwrap());
    let h = median(last.get_mut(Variant::HandWritten.label()).unwrap());
    let peaks: Vec<Value> = memory
        .iter()
        .map(|((variant, container), v)| {
            let mut v = v.clone();
            v.sort_unstable();
            json!({
                "variant": variant,
                "container": container,
                "samples": v.len(),
                "median_bytes": v[v.len() / 2],
                "max_bytes": v[v.len() - 1],
            })
        })
        .collect();
    let (_, file) = kubepods();
    let result = json!({
        "machine": crate::report::machine(),
        "commit": crate::report::commit(),
        "command": crate::report::command(),
        "job": format!("1 ps + {WORKERS} workers (two Indexed Jobs, one kubectl apply)"),
        "rounds": ROUNDS,
        "cgroup_file": file,
        "median_last_written_ms": {
            "trainlet": t,
            "hand_written": h,
            "ratio_hand_written_over_trainlet": h / t,
        },
        "peak_memory": peaks,
        "runs": rounds,
    });
    crate::report::write_own("results-node.json", &result);
    Some(result)
}
