//! Every shipped example (manifests/examples/) on a real node (tests/node/up), applied as
//! a user would: `kubectl apply -k manifests/` for the RBAC, then the example through
//! its kustomization in tests/node/examples/<name>/, which swaps only the training
//! image for the test trainer and the command after `trainlet exec --report --` for
//! one that prints trainlet-init's files and runs the trainer (tests/node/trainer), in
//! a namespace that enforces Pod Security `restricted`, with the guard policy of
//! manifests/guard/ installed. trainlet's own containers run as shipped, from the
//! image archive of `make image`.
//!
//! Each example must reach the end its header promises (its Job Complete, with the
//! reason its successPolicy or completions give), and every pod must have been given
//! exactly the cluster that the pods' real IPs make, have reached every peer at the
//! address it was given (and been reached from the peer's own IP), carry its task
//! annotation and the health its GPUs give (the node advertises nvidia.com/gpu
//! without having GPUs, so trainlet rightly reports them missing).
//!
//! The node, its own control plane and what every node test needs are in
//! support/node.rs.
//!
//! The hostNetwork example (hostnetwork-pytorch) cannot run under `restricted`: its test
//! applies it into a `privileged` namespace, holds ports on the node, checks the node's
//! guard against traffic leaving the machine and replaces a pod (see that test).
//!
//! The JobSet example runs under the real JobSet controller (tests/node/jobset-controller,
//! out of cluster, with its defaulting and validating webhooks), which must report the
//! JobSet Completed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::*;

/// From `kubectl apply` to every Job's end, for one example or for all together.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// How an example's pods become tasks, and what its trainer prints.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    /// TF_CONFIG, every pod a worker; a full mesh on 8470.
    Tf,
    /// TF_CONFIG, indexes 0-2 workers, 3-4 parameter servers (which keep serving).
    TfPsWorker,
    /// torch.env; the overlay starts the trainer once per process, as torchrun would.
    Torch,
    /// jax.env; a star around process 0 on 55527.
    Jax,
    /// The hostfile and mpi.env; a full mesh on 2222; the workers keep serving.
    Mpi,
}

/// One shipped example, as its header describes it.
struct Example {
    /// manifests/examples/<name>.yaml and tests/node/examples/<name>/.
    name: &'static str,
    /// The training container.
    container: &'static str,
    kind: Kind,
    /// Its pods, all at once.
    pods: usize,
    /// The training container's nvidia.com/gpu limit (0: none).
    gpus: u32,
    /// The Jobs that must complete, and the reason of their Complete condition.
    jobs: &'static [&'static str],
    reason: &'static str,
    /// The JobSet whose Jobs these are: it must end Completed.
    jobset: Option<&'static str>,
}

const EXAMPLES: [Example; 8] = [
    Example {
        name: "classic-sidecar-job",
        container: "tensorflow",
        kind: Kind::Tf,
        pods: 2,
        gpus: 0,
        jobs: &["mnist-classic"],
        reason: "CompletionsReached",
        jobset: None,
    },
    Example {
        name: "failure-policy-job",
        container: "tensorflow",
        kind: Kind::Tf,
        pods: 3,
        gpus: 1,
        jobs: &["mnist-failure-policy"],
        reason: "CompletionsReached",
        jobset: None,
    },
    Example {
        name: "jax",
        container: "jax",
        kind: Kind::Jax,
        pods: 4,
        gpus: 1,
        jobs: &["jax"],
        reason: "CompletionsReached",
        jobset: None,
    },
    Example {
        name: "jobset-pytorch",
        container: "pytorch",
        kind: Kind::Torch,
        pods: 4,
        gpus: 8,
        jobs: &["ddp-jobset-workers-0", "ddp-jobset-workers-1"],
        reason: "CompletionsReached",
        jobset: Some("ddp-jobset"),
    },
    Example {
        name: "mpi-hostfile",
        container: "mpi",
        kind: Kind::Mpi,
        pods: 4,
        gpus: 4,
        jobs: &["allreduce"],
        reason: "SuccessPolicy",
        jobset: None,
    },
    Example {
        name: "pytorch-torchrun",
        container: "pytorch",
        kind: Kind::Torch,
        pods: 3,
        gpus: 2,
        jobs: &["ddp-torchrun"],
        reason: "CompletionsReached",
        jobset: None,
    },
    Example {
        name: "tf-multiworker",
        container: "tensorflow",
        kind: Kind::Tf,
        pods: 3,
        gpus: 1,
        jobs: &["mnist-mwms"],
        reason: "CompletionsReached",
        jobset: None,
    },
    Example {
        name: "tf-ps-worker",
        container: "tensorflow",
        kind: Kind::TfPsWorker,
        pods: 5,
        gpus: 0,
        jobs: &["mnist-ps-worker"],
        reason: "SuccessPolicy",
        jobset: None,
    },
];

/// The pod template's spec of an example's workload (the JobSet's replicated job's).
fn pod_spec_mut(doc: &mut Value) -> &mut Value {
    if doc["kind"] == "JobSet" {
        &mut doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    } else {
        &mut doc["spec"]["template"]["spec"]
    }
}

/// A directory with the example, unchanged, next to its kustomization, as
/// docs/examples.md tells a user to make it. Checks that the kustomization changes the
/// training container's image, command and resources and nothing else: trainlet's
/// containers, the volumes and everything outside the pod template stay as shipped.
fn overlay(kc: &Path, ex: &Example) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let shipped = repo().join(format!("manifests/examples/{}.yaml", ex.name));
    std::fs::copy(&shipped, dir.path().join(format!("{}.yaml", ex.name))).unwrap();
    std::fs::copy(
        repo().join(format!(
            "tests/node/examples/{}/kustomization.yaml",
            ex.name
        )),
        dir.path().join("kustomization.yaml"),
    )
    .unwrap();
    let mut got = as_json(
        kc,
        &kubectl_on(kc, &["kustomize", dir.path().to_str().unwrap()]),
    );
    let mut want = as_json(kc, &std::fs::read_to_string(&shipped).unwrap());
    let got_main = pod_spec_mut(&mut got)["containers"][0].clone();
    let main = &mut pod_spec_mut(&mut want)["containers"][0];
    assert_eq!(main["name"], ex.container, "{}", ex.name);
    assert_eq!(got_main["image"], "trainlet.test/trainer:1", "{}", ex.name);
    // The wrapper stays; what runs under it is the trainer.
    assert_eq!(
        got_main["command"].as_array().unwrap()[..6],
        [
            json!("/etc/trainlet/bin/trainlet"),
            json!("exec"),
            json!("--report"),
            json!("--"),
            json!("sh"),
            json!("-c")
        ],
        "{}",
        ex.name
    );
    assert_eq!(
        got_main["resources"]["limits"].get("nvidia.com/gpu"),
        main["resources"]["limits"].get("nvidia.com/gpu"),
        "{}",
        ex.name
    );
    for key in ["image", "command", "resources"] {
        main[key] = got_main[key].clone();
    }
    assert_eq!(
        differences("", &got, &want),
        Vec::<String>::new(),
        "{}: the kustomization changes more than the training container's image, command and resources",
        ex.name
    );
    dir
}

/// Where two JSON values differ, as `path: a != b` lines.
fn differences(path: &str, a: &Value, b: &Value) -> Vec<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .flat_map(|k| {
                    differences(
                        &format!("{path}/{k}"),
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                    )
                })
                .collect()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .flat_map(|(i, (a, b))| differences(&format!("{path}/{i}"), a, b))
            .collect(),
        _ if a == b => vec![],
        _ => vec![format!("{path}: {a} != {b}")],
    }
}

/// What the test saw of one pod while the example ran (a parameter server or an MPI
/// worker is deleted by its Job's successPolicy at the end).
#[derive(Clone, Default, Debug)]
struct Seen {
    ip: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    phase: String,
    /// The training container's log.
    log: String,
    /// Its log was followed to the container's end.
    log_done: bool,
    /// Still there after the end.
    kept: bool,
}

impl Seen {
    fn label(&self, key: &str) -> &str {
        self.labels.get(key).map(String::as_str).unwrap_or_default()
    }
    fn index(&self) -> u32 {
        self.label("batch.kubernetes.io/job-completion-index")
            .parse()
            .unwrap()
    }
    /// Rank order: the JobSet's Job index first (0 outside a JobSet), then the pod's.
    fn order(&self) -> (u32, u32) {
        let global = self
            .label("jobset.sigs.k8s.io/job-global-index")
            .parse()
            .unwrap_or(0);
        (global, self.index())
    }
}

/// The `--job TYPE=SELECTOR` flags of an example's trainlet-init, as applied.
fn selectors(applied: &Value) -> Vec<(String, String)> {
    let mut doc = applied.clone();
    let spec = pod_spec_mut(&mut doc);
    let init = spec["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "trainlet-init")
        .unwrap();
    init["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str().unwrap().strip_prefix("--job="))
        .map(|j| {
            let (t, s) = j.split_once('=').unwrap();
            (t.to_string(), s.to_string())
        })
        .collect()
}

/// What one run of examples left: every pod seen, by name, and for every example's
/// `--job` selectors (example, type, selector) the pods the API server matched with it
/// at any time while they ran.
struct Outcome {
    pods: BTreeMap<String, Seen>,
    matched: Matched,
}

/// (example, task type, selector) → the pods it matched.
type Matched = BTreeMap<(&'static str, String, String), BTreeSet<String>>;

/// Applies the examples (their kustomizations) into `ns` on the node and follows them
/// until every Job has completed. Watches, not polls, so that no pod goes unseen on a
/// busy machine: every pod's address, labels and annotations as they change, the
/// training container's log followed from its start to its end (a parameter server or
/// an MPI worker is deleted at the end, its log with it), and for every `--job`
/// selector the pods the API server matches with it. Fails at once, with what the pods
/// say, when a Job fails.
async fn run_examples(kc: &Path, client: &Client, ns: &str, examples: &[&Example]) -> Outcome {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    use std::sync::{Arc, Mutex};

    let dirs: Vec<tempfile::TempDir> = examples.iter().map(|ex| overlay(kc, ex)).collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
    let containers: BTreeMap<&'static str, &'static str> = examples
        .iter()
        .flat_map(|ex| ex.jobs.iter().map(|j| (*j, ex.container)))
        .collect();
    let followers: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
    let mut watches = Vec::new();
    let watch = {
        let (pods, seen, followers) = (pods.clone(), seen.clone(), followers.clone());
        async move {
            let mut following = BTreeSet::new();
            let mut events = watcher(pods.clone(), watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(p)) = events.next().await {
                let name = p.name_any();
                let status = p.status.clone().unwrap_or_default();
                let mut all = seen.lock().unwrap();
                let s = all.entry(name.clone()).or_default();
                s.ip = status.pod_ip.clone().unwrap_or_default();
                s.labels = p.labels().clone();
                s.annotations = p.annotations().clone();
                s.phase = status.phase.clone().unwrap_or_default();
                let job = s.label("batch.kubernetes.io/job-name");
                let Some(container) = containers.get(job).copied() else {
                    continue;
                };
                let started = status.container_statuses.iter().flatten().any(|c| {
                    c.name == container
                        && c.state
                            .as_ref()
                            .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
                });
                if started && following.insert(name.clone()) {
                    let follow = follow_log(pods.clone(), name, container, seen.clone());
                    followers.lock().unwrap().push(tokio::spawn(follow));
                }
            }
        }
    };
    watches.push(tokio::spawn(watch));
    let matched: Arc<Mutex<Matched>> = Arc::default();
    for (ex, dir) in examples.iter().zip(&dirs) {
        let applied = kubectl_on(
            kc,
            &[
                "apply",
                "-k",
                dir.path().to_str().unwrap(),
                "-n",
                ns,
                "-o",
                "json",
            ],
        );
        let applied: Value = serde_json::from_str(&applied).unwrap();
        for (t, sel) in selectors(&applied) {
            let key = (ex.name, t, sel.clone());
            matched.lock().unwrap().insert(key.clone(), BTreeSet::new());
            let (pods, matched) = (pods.clone(), matched.clone());
            watches.push(tokio::spawn(async move {
                let mut events = watcher(pods, watcher::Config::default().labels(&sel))
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(Ok(p)) = events.next().await {
                    let mut m = matched.lock().unwrap();
                    m.get_mut(&key).unwrap().insert(p.name_any());
                }
            }));
        }
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let want: Vec<&str> = examples
        .iter()
        .flat_map(|ex| ex.jobs.iter().copied())
        .collect();
    let snapshot = |seen: &Arc<Mutex<BTreeMap<String, Seen>>>| seen.lock().unwrap().clone();
    let start = Instant::now();
    loop {
        let mut done = true;
        for name in &want {
            let Some(job) = jobs.get_opt(name).await.unwrap() else {
                done = false;
                continue;
            };
            let conds = job.status.and_then(|s| s.conditions).unwrap_or_default();
            if let Some(f) = conds
                .iter()
                .find(|c| c.type_ == "Failed" && c.status == "True")
            {
                panic!(
                    "Job {name} failed ({}: {}); its pods:\n{}",
                    f.reason.clone().unwrap_or_default(),
                    f.message.clone().unwrap_or_default(),
                    diagnose(&pods, &snapshot(&seen)).await
                );
            }
            done &= conds
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True");
        }
        if done {
            break;
        }
        assert!(
            start.elapsed() < RUN_TIMEOUT,
            "not every Job of {want:?} completed within {RUN_TIMEOUT:?}; the pods:\n{}",
            diagnose(&pods, &snapshot(&seen)).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The logs of the pods that the successPolicy stops end when they are gone.
    let pending: Vec<_> = std::mem::take(&mut *followers.lock().unwrap());
    for f in pending {
        tokio::time::timeout(Duration::from_secs(90), f)
            .await
            .expect("a training container's log did not end within 90 s of its Job's end")
            .unwrap();
    }
    for w in watches {
        w.abort();
    }
    let mut seen = snapshot(&seen);
    // What is left: the pods of Jobs that completed keep their final annotations.
    for p in pods.list(&ListParams::default()).await.unwrap() {
        let s = seen.get_mut(&p.name_any()).unwrap();
        s.kept = true;
        s.annotations = p.annotations().clone();
        s.phase = p.status.and_then(|s| s.phase).unwrap_or_default();
    }
    drop(dirs);
    let matched = matched.lock().unwrap().clone();
    Outcome {
        pods: seen,
        matched,
    }
}

/// Follows the training container's log from its start to its end, into `seen`.
async fn follow_log(
    pods: Api<Pod>,
    name: String,
    container: &'static str,
    seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Seen>>>,
) {
    use futures::{AsyncBufReadExt, TryStreamExt};
    let lp = LogParams {
        container: Some(container.to_string()),
        follow: true,
        ..Default::default()
    };
    let Ok(stream) = pods.log_stream(&name, &lp).await else {
        return;
    };
    let mut lines = stream.lines();
    loop {
        match lines.try_next().await {
            Ok(Some(line)) => {
                let mut all = seen.lock().unwrap();
                let log = &mut all.get_mut(&name).unwrap().log;
                log.push_str(&line);
                log.push('\n');
            }
            // The container ended (or the kubelet dropped the stream: log_done stays
            // false, and the checks say so).
            Ok(None) => break,
            Err(_) => return,
        }
    }
    seen.lock().unwrap().get_mut(&name).unwrap().log_done = true;
}

/// What the pods say (`describe_pods`) and what the test saw of each training
/// container's log, for a failure message.
async fn diagnose(pods: &Api<Pod>, seen: &BTreeMap<String, Seen>) -> String {
    let mut out = describe_pods(pods).await;
    for (name, s) in seen {
        if !s.log.is_empty() {
            out += &format!("seen {name} ({}):\n{}\n", s.ip, s.log);
        }
    }
    out
}

/// A task of the resolved cluster: its TF_CONFIG-style name (`worker:1`, `rank 3`,
/// `process 0`) is the trainer's.
struct Task<'a> {
    pod: &'a str,
    ip: &'a str,
}

/// Checks one example's outcome: its Jobs' end, every pod's files, trainer lines and
/// annotations, and that each of its selectors matched exactly its own pods of that
/// type.
async fn check_example(client: &Client, ns: &str, ex: &Example, out: &Outcome) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    for name in ex.jobs {
        let job = jobs.get(name).await.unwrap();
        let status = job.status.unwrap();
        let complete = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Complete")
            .unwrap();
        assert_eq!(
            (complete.status.as_str(), complete.reason.as_deref()),
            ("True", Some(ex.reason)),
            "{name}"
        );
        assert_eq!(status.failed.unwrap_or(0), 0, "{name}: failed pods");
    }
    if let Some(js) = ex.jobset {
        let gvk = GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet");
        let ar = ApiResource::from_gvk_with_plural(&gvk, "jobsets");
        let status = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
            .get(js)
            .await
            .unwrap()
            .data["status"]
            .clone();
        assert_eq!(status["terminalState"], "Completed", "{js}: {status}");
        assert_eq!(
            status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c["type"].clone(), c["status"].clone(), c["reason"].clone()))
                .collect::<Vec<_>>(),
            [(json!("Completed"), json!("True"), json!("AllJobsCompleted"))],
            "{js}: {status}"
        );
    }
    // The example's pods, in rank order.
    let mut pods: Vec<(&String, &Seen)> = out
        .pods
        .iter()
        .filter(|(_, s)| ex.jobs.contains(&s.label("batch.kubernetes.io/job-name")))
        .collect();
    pods.sort_by_key(|(_, s)| s.order());
    assert_eq!(
        pods.len(),
        ex.pods,
        "{}: one pod per index, none replaced: {:?}",
        ex.name,
        pods.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let tasks: Vec<Task> = pods
        .iter()
        .map(|(n, s)| Task {
            pod: n.as_str(),
            ip: s.ip.as_str(),
        })
        .collect();
    for t in &tasks {
        assert!(t.ip.starts_with("10.244.0."), "{}: IP {:?}", t.pod, t.ip);
    }
    // (task type, index) of each pod, in rank order.
    let task_of = |rank: usize| -> (&'static str, usize) {
        match ex.kind {
            Kind::TfPsWorker if rank >= 3 => ("ps", rank - 3),
            _ => ("worker", rank),
        }
    };
    let n = tasks.len();
    let mut succeeded = 0;
    for (rank, ((name, s), t)) in pods.iter().zip(&tasks).enumerate() {
        assert!(
            s.log_done,
            "{name}: the training container's log was never complete:\n{}",
            s.log
        );
        let (task_type, index) = task_of(rank);
        assert_eq!(
            s.annotations.get("trainlet.io/task").map(String::as_str),
            Some(format!("{task_type}/{index}").as_str()),
            "{name}"
        );
        let (want_files, want_trainer) = match ex.kind {
            Kind::Tf | Kind::TfPsWorker => {
                let addr = |i: usize| format!("{}:8470", tasks[i].ip);
                let list = |r: std::ops::Range<usize>| {
                    r.map(|i| format!("\"{}\"", addr(i)))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let cluster = if ex.kind == Kind::Tf {
                    format!("{{\"worker\":[{}]}}", list(0..n))
                } else {
                    format!("{{\"ps\":[{}],\"worker\":[{}]}}", list(3..5), list(0..3))
                };
                let tf = format!(
                    "{{\"cluster\":{cluster},\"task\":{{\"type\":\"{task_type}\",\"index\":{index}}}}}"
                );
                let files = vec![format!("tf_config.json: {tf}"), format!("TF_CONFIG: {tf}")];
                let name_of = |i: usize| {
                    let (ty, ix) = task_of(i);
                    format!("{ty}:{ix}")
                };
                let peers: Vec<(String, String, String)> = (0..n)
                    .filter(|&i| i != rank)
                    .map(|i| (name_of(i), addr(i), tasks[i].ip.to_string()))
                    .collect();
                (files, mesh_lines(&name_of(rank), &addr(rank), &peers))
            }
            Kind::Mpi => {
                let addr = |i: usize| format!("{}:2222", tasks[i].ip);
                let mut files: Vec<String> = tasks
                    .iter()
                    .map(|t| format!("hostfile: {} slots={}", t.ip, ex.gpus))
                    .collect();
                files.push("mpi.env: # Written by trainlet init. Source it: . mpi.env".into());
                files.push(format!(
                    "mpi.env: export TRAINLET_HOSTS='{}'",
                    tasks
                        .iter()
                        .map(|t| format!("{}:{}", t.ip, ex.gpus))
                        .collect::<Vec<_>>()
                        .join(",")
                ));
                let peers: Vec<(String, String, String)> = (0..n)
                    .filter(|&i| i != rank)
                    .map(|i| (format!("rank {i}"), addr(i), tasks[i].ip.to_string()))
                    .collect();
                (
                    files,
                    mesh_lines(&format!("rank {rank}"), &addr(rank), &peers),
                )
            }
            Kind::Torch => {
                let nproc = ex.gpus as usize;
                // torchrun's world: nproc processes per pod. torch.env's WORLD_SIZE
                // counts pods (--nproc-per-node auto, Kubeflow's rule), for a plain
                // python; torchrun sets its own.
                let world = n * nproc;
                let master = tasks[0].ip;
                let files = [
                    "# Written by trainlet init. Source it: . torch.env".to_string(),
                    format!("export MASTER_ADDR='{master}'"),
                    "export MASTER_PORT='29500'".into(),
                    format!("export WORLD_SIZE='{n}'"),
                    format!("export RANK='{rank}'"),
                    format!("export PET_NNODES='{n}'"),
                    format!("export PET_NODE_RANK='{rank}'"),
                    format!("export PET_NPROC_PER_NODE='{nproc}'"),
                    format!("export PET_MASTER_ADDR='{master}'"),
                    "export PET_MASTER_PORT='29500'".into(),
                ]
                .into_iter()
                .map(|l| format!("torch.env: {l}"))
                .collect();
                let ips: Vec<String> = (0..world)
                    .map(|r| tasks[r / nproc].ip.to_string())
                    .collect();
                let mine = rank * nproc..(rank + 1) * nproc;
                (
                    files,
                    star_lines("rank", mine, &format!("{master}:29500"), &ips),
                )
            }
            Kind::Jax => {
                let coord = tasks[0].ip;
                let files = [
                    "# Written by trainlet init. Source it: . jax.env".to_string(),
                    format!("export JAX_COORDINATOR_ADDRESS='{coord}:55527'"),
                    format!("export JAX_NUM_PROCESSES='{n}'"),
                    format!("export JAX_PROCESS_ID='{rank}'"),
                    format!("export COORDINATOR_ADDRESS='{coord}'"),
                    "export COORDINATOR_PORT='55527'".into(),
                    format!("export NUM_PROCESSES='{n}'"),
                    format!("export PROCESS_ID='{rank}'"),
                ]
                .into_iter()
                .map(|l| format!("jax.env: {l}"))
                .collect();
                let ips: Vec<String> = tasks.iter().map(|t| t.ip.to_string()).collect();
                (
                    files,
                    star_lines("process", rank..rank + 1, &format!("{coord}:55527"), &ips),
                )
            }
        };
        let prefixes = [
            "tf_config.json: ",
            "TF_CONFIG: ",
            "hostfile: ",
            "mpi.env: ",
            "torch.env: ",
            "jax.env: ",
        ];
        let got_files: Vec<String> = s
            .log
            .lines()
            .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
            .map(str::to_string)
            .collect();
        assert_eq!(
            got_files, want_files,
            "{name} ({}): the files trainlet-init wrote",
            t.ip
        );
        let mut want_trainer = want_trainer;
        want_trainer.sort();
        assert_eq!(
            trainer_lines(&s.log),
            want_trainer,
            "{name} ({}): the trainer",
            t.ip
        );
        // The sidecar's last verdict, on a pod that ended by itself. (A parameter server
        // or an MPI worker that the successPolicy stops sees its peers go first.)
        if s.kept && s.phase == "Succeeded" {
            succeeded += 1;
            let health = s.annotations.get("trainlet.io/health").map(String::as_str);
            let report: Value = serde_json::from_str(&s.annotations["trainlet.io/report"]).unwrap();
            if ex.gpus == 0 {
                assert_eq!(health, Some("ok"), "{name}: {report}");
                assert_eq!(report["reasons"], json!([]), "{name}");
            } else {
                let gpus = if ex.gpus == 1 {
                    "1 GPU".to_string()
                } else {
                    format!("{} GPUs", ex.gpus)
                };
                assert_eq!(health, Some("degraded"), "{name}: {report}");
                assert_eq!(
                    report["reasons"],
                    json!([format!(
                        "container {} expects {gpus} (resources.limits[\"nvidia.com/gpu\"]) but NVML is unavailable: library libnvidia-ml.so.1 not found (libnvidia-ml.so.1: cannot open shared object file: No such file or directory)",
                        ex.container
                    )]),
                    "{name}"
                );
            }
            assert_eq!(
                s.annotations.get("trainlet.io/cluster").map(String::as_str),
                Some("current"),
                "{name}"
            );
        }
    }
    // Every pod that ends by itself succeeded; the successPolicy stopped the others
    // (the parameter servers, the MPI workers).
    let ends = match ex.kind {
        Kind::TfPsWorker => 3,
        Kind::Mpi => 1,
        _ => ex.pods,
    };
    assert_eq!(succeeded, ends, "{}: pods Succeeded", ex.name);
    // Each selector matched this example's pods of its type, and nothing else.
    let types: Vec<&String> = out
        .matched
        .keys()
        .filter(|(e, _, _)| *e == ex.name)
        .map(|(_, t, _)| t)
        .collect();
    assert_eq!(
        types,
        if ex.kind == Kind::TfPsWorker {
            vec!["ps", "worker"]
        } else {
            vec!["worker"]
        },
        "{}: the --job flags",
        ex.name
    );
    for ((_, t, sel), got) in out.matched.iter().filter(|((e, _, _), _)| *e == ex.name) {
        let own: BTreeSet<String> = pods
            .iter()
            .enumerate()
            .filter(|(rank, _)| task_of(*rank).0 == t)
            .map(|(_, (n, _))| (*n).clone())
            .collect();
        assert_eq!(got, &own, "--job {t}={sel} of {}", ex.name);
    }
}

/// The lines of the star topologies (torch, JAX) for the processes `mine` of one pod:
/// rank 0 listens at `master` and is reached by every other rank, from the IP of that
/// rank's pod (`ips[r]`); every other rank reaches it.
fn star_lines(
    label: &str,
    mine: std::ops::Range<usize>,
    master: &str,
    ips: &[String],
) -> Vec<String> {
    let world = ips.len();
    let mut v = Vec::new();
    for r in mine {
        if r == 0 {
            v.push(format!(
                "trainer: {label} 0 listening on {master}, waiting for {} peers",
                world - 1
            ));
            for (q, ip) in ips.iter().enumerate().skip(1) {
                v.push(format!(
                    "trainer: {label} 0: accepted {label} {q} from {ip}"
                ));
            }
            v.push(format!(
                "trainer: ok: {label} 0 reached 0 peers and was reached by {}",
                world - 1
            ));
        } else {
            v.push(format!(
                "trainer: {label} {r}: connected to {label} 0 at {master}"
            ));
            v.push(format!(
                "trainer: ok: {label} {r} reached 1 peers and was reached by 0"
            ));
        }
    }
    v
}

/// Every example in one namespace: the shipped files pass a server-side dry run
/// together, and run together to their ends, each checked by [`check_example`] as it
/// would be alone (a failure names the example's Job or pod), each selector matching
/// only its own example's pods. One run of all, not one per example: on the 2-core
/// machine of CI they run side by side in the time of the longest.
#[tokio::test]
async fn all_examples_run_together_in_one_namespace() {
    let kc = require!(node());
    let client = client_from(kc).await;
    let ns = restricted_namespace(kc, &client, "all-examples").await;
    let dir = repo().join("manifests/examples");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    // The hostNetwork example cannot run in a `restricted` namespace: it has a test of
    // its own (hostnetwork_pytorch_...), in a `privileged` one.
    let mut want: Vec<String> = EXAMPLES
        .iter()
        .map(|e| format!("{}.yaml", e.name))
        .chain([format!("{HOSTNET}.yaml")])
        .collect();
    want.sort();
    assert_eq!(files, want, "a test for every example");
    let mut args = vec!["apply", "--dry-run=server", "-n", &ns];
    let paths: Vec<String> = EXAMPLES
        .iter()
        .map(|e| dir.join(format!("{}.yaml", e.name)).display().to_string())
        .collect();
    for p in &paths {
        args.extend(["-f", p.as_str()]);
    }
    let dry = kubectl_clean(kc, &args);
    let mut objects: Vec<&str> = dry.lines().collect();
    objects.sort();
    assert_eq!(
        objects,
        [
            "job.batch/allreduce created (server dry run)",
            "job.batch/ddp-torchrun created (server dry run)",
            "job.batch/jax created (server dry run)",
            "job.batch/mnist-classic created (server dry run)",
            "job.batch/mnist-failure-policy created (server dry run)",
            "job.batch/mnist-mwms created (server dry run)",
            "job.batch/mnist-ps-worker created (server dry run)",
            "jobset.jobset.x-k8s.io/ddp-jobset created (server dry run)",
        ]
    );
    let all: Vec<&Example> = EXAMPLES.iter().collect();
    let out = run_examples(kc, &client, &ns, &all).await;
    for ex in &all {
        check_example(&client, &ns, ex, &out).await;
    }
    assert_eq!(
        out.pods.len(),
        EXAMPLES.iter().map(|e| e.pods).sum::<usize>(),
        "{:?}",
        out.pods.keys()
    );
    delete_namespace(&client, &ns).await;
}

/// manifests/examples/hostnetwork-pytorch.yaml and tests/node/examples/<it>/.
const HOSTNET: &str = "hostnetwork-pytorch";
/// Its Job, its rendezvous port (trainlet-init's --master-port) and the node's address,
/// which every hostNetwork pod has.
const HOSTNET_JOB: &str = "ddp-hostnet";
const HOSTNET_PORT: u16 = 29501;
const NODE_IP: &str = "10.244.0.1";

/// The hostNetwork example next to its kustomization, as [`overlay`] makes the others:
/// the kustomization changes the training container's image, command (after
/// `trainlet exec --report --on-peer-change=restart --`) and resources, nothing else.
fn hostnet_overlay(kc: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let shipped = repo().join(format!("manifests/examples/{HOSTNET}.yaml"));
    std::fs::copy(&shipped, dir.path().join(format!("{HOSTNET}.yaml"))).unwrap();
    std::fs::copy(
        repo().join(format!("tests/node/examples/{HOSTNET}/kustomization.yaml")),
        dir.path().join("kustomization.yaml"),
    )
    .unwrap();
    let mut got = as_json(
        kc,
        &kubectl_on(kc, &["kustomize", dir.path().to_str().unwrap()]),
    );
    let mut want = as_json(kc, &std::fs::read_to_string(&shipped).unwrap());
    let got_main = pod_spec_mut(&mut got)["containers"][0].clone();
    let main = &mut pod_spec_mut(&mut want)["containers"][0];
    assert_eq!(main["name"], "pytorch");
    assert_eq!(got_main["image"], "trainlet.test/trainer:1");
    assert_eq!(
        got_main["command"].as_array().unwrap()[..7],
        [
            json!("/etc/trainlet/bin/trainlet"),
            json!("exec"),
            json!("--report"),
            json!("--on-peer-change=restart"),
            json!("--"),
            json!("sh"),
            json!("-c")
        ]
    );
    for key in ["image", "command", "resources"] {
        main[key] = got_main[key].clone();
    }
    assert_eq!(
        differences("", &got, &want),
        Vec::<String>::new(),
        "the kustomization changes more than the training container's image, command and resources"
    );
    let spec = pod_spec_mut(&mut got);
    assert_eq!(
        (&spec["hostNetwork"], &spec["dnsPolicy"]),
        (&json!(true), &json!("ClusterFirstWithHostNet"))
    );
    dir
}

/// The Job's pods that still run (not being deleted, not ended), by index.
async fn live_pods(client: &Client, ns: &str, job: &str) -> Vec<Pod> {
    let mut live: Vec<Pod> = crate::support::jobs::job_pods(client, ns, job)
        .await
        .into_iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            p.metadata.deletion_timestamp.is_none()
                && !matches!(phase, Some("Failed" | "Succeeded"))
        })
        .collect();
    live.sort_by_key(crate::support::jobs::index_of);
    live
}

/// What the overlay's command printed in a container's log (trainlet's own lines left
/// out), one entry per run of the command, each starting at its first torch.env line.
fn cmd_runs(log: &str) -> Vec<Vec<String>> {
    let mut runs: Vec<Vec<String>> = Vec::new();
    for l in log.lines() {
        if l.starts_with("torch.env: # Written by trainlet init") {
            runs.push(Vec::new());
        }
        if l.starts_with("torch.env: ") || l.starts_with("trainer: ") || l == "done" {
            runs.last_mut()
                .unwrap_or_else(|| panic!("a line before torch.env: {l}\n{log}"))
                .push(l.to_string());
        }
    }
    runs
}

/// One run of the overlay's command in rank `rank` of the 2: torch.env, then the
/// trainer's lines (comparable, as [`trainer_lines`] makes them), all on the node's
/// address and the example's port.
fn hostnet_run(rank: usize) -> (Vec<String>, Vec<String>) {
    let files = [
        "# Written by trainlet init. Source it: . torch.env".to_string(),
        format!("export MASTER_ADDR='{NODE_IP}'"),
        format!("export MASTER_PORT='{HOSTNET_PORT}'"),
        "export WORLD_SIZE='2'".into(),
        format!("export RANK='{rank}'"),
        "export PET_NNODES='2'".into(),
        format!("export PET_NODE_RANK='{rank}'"),
        "export PET_NPROC_PER_NODE='1'".into(),
        format!("export PET_MASTER_ADDR='{NODE_IP}'"),
        format!("export PET_MASTER_PORT='{HOSTNET_PORT}'"),
    ]
    .into_iter()
    .map(|l| format!("torch.env: {l}"))
    .collect();
    let mut trainer = star_lines(
        "rank",
        rank..rank + 1,
        &format!("{NODE_IP}:{HOSTNET_PORT}"),
        &[NODE_IP.to_string(), NODE_IP.to_string()],
    );
    trainer.sort();
    (files, trainer)
}

/// Splits a run into its torch.env lines and its trainer lines (comparable).
fn split_run(run: &[String]) -> (Vec<String>, Vec<String>) {
    let files = run
        .iter()
        .filter(|l| l.starts_with("torch.env: "))
        .cloned()
        .collect();
    (files, trainer_lines(&run.join("\n")))
}

/// The REJECT counter of the node's hostNetwork guard (tests/node/up: TRAINLET-HOSTNET,
/// filter OUTPUT), in packets.
fn hostnet_guard_rejects() -> u64 {
    let out = std::process::Command::new("iptables")
        .args(["-L", "TRAINLET-HOSTNET", "-v", "-x", "-n"])
        .output()
        .expect("iptables is installed");
    assert!(
        out.status.success(),
        "no chain TRAINLET-HOSTNET (tests/node/up makes it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("REJECT"))
        .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The hostNetwork example on the real node, in a namespace that enforces Pod Security
/// `privileged` (hostNetwork is forbidden by `baseline` and `restricted`): both pods on
/// the one node, both at the node's address.
///
/// - Ports, per framework: the test holds 29501 (the example's --master-port) and 8470
///   (TensorFlow's) on the node before the pods start. Rank 0's trainlet-init exits 6
///   with a PortConflict Event naming 29501; 8470 fails nothing (the job is PyTorch).
///   Once 29501 is free, the kubelet's restart of trainlet-init gets through.
/// - The job: rank 0 listens on 10.244.0.1:29501 and rank 1 reaches it there.
/// - Nothing leaves the machine: from the pod (the host's network namespace, UID 1000)
///   a connection to 1.1.1.1 is refused by the node's guard at once.
/// - A replaced pod: rank 1 is deleted; the Job controller's replacement lands on the
///   same node at the same address. Rank 0's sidecar announces it (PeerReplaced, the
///   new pod named) and its `trainlet exec --on-peer-change restart` restarts the
///   command once; the two trainers meet again.
/// - The end: the test lets both commands finish; the Job completes.
#[tokio::test]
async fn hostnetwork_pytorch_shares_the_node_checks_its_port_and_restarts_for_a_replaced_pod() {
    use crate::support::jobs::{index_of, name_of};
    let kc = require!(node());
    let client = client_from(kc).await;
    let ns = namespace_with_labels(
        &client,
        "hostnet",
        &[("pod-security.kubernetes.io/enforce", "privileged")],
    )
    .await;
    let manifests = repo().join("manifests");
    kubectl_clean(kc, &["apply", "-k", manifests.to_str().unwrap(), "-n", &ns]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let log = |name: String| {
        let pods = pods.clone();
        async move {
            let lp = LogParams {
                container: Some("pytorch".into()),
                ..Default::default()
            };
            pods.logs(&name, &lp).await.unwrap_or_default()
        }
    };
    let oks = |log: &str| {
        log.lines()
            .filter(|l| l.starts_with("trainer: ok: "))
            .count()
    };
    let events_of = |reason: &'static str| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let mut v: Vec<(String, String, String)> = events(&client, &ns)
                .await
                .into_iter()
                .filter(|(_, r, _, _)| r == reason)
                .map(|(t, _, note, pod)| (t, note, pod))
                .collect();
            v.sort();
            v
        }
    };

    // The test runs in the node's network namespace, which the pods share.
    let held_master = std::net::TcpListener::bind(("0.0.0.0", HOSTNET_PORT))
        .unwrap_or_else(|e| panic!("hold port {HOSTNET_PORT} on the node: {e}"));
    let held_tf = std::net::TcpListener::bind(("0.0.0.0", 8470))
        .unwrap_or_else(|e| panic!("hold port 8470 on the node: {e}"));
    let dir = hostnet_overlay(kc);
    kubectl_clean(
        kc,
        &["apply", "-k", dir.path().to_str().unwrap(), "-n", &ns],
    );

    // 1. Rank 0's init: exit 6, PortConflict naming 29501.
    let exit6 = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
        s.as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code)
            == Some(6)
    };
    let rank0 = eventually("rank 0's trainlet-init to exit 6", RUN_TIMEOUT, || async {
        let p = live_pods(&client, &ns, HOSTNET_JOB)
            .await
            .into_iter()
            .find(|p| index_of(p) == Some(0))?;
        let init = p
            .status
            .as_ref()?
            .init_container_statuses
            .as_ref()?
            .iter()
            .find(|c| c.name == "trainlet-init")?
            .clone();
        (exit6(&init.state) || exit6(&init.last_state)).then_some(name_of(&p))
    })
    .await;
    drop(held_master);
    let conflict = eventually("the PortConflict Event", RUN_TIMEOUT, || async {
        let v = events_of("PortConflict").await;
        (!v.is_empty()).then_some(v)
    })
    .await;
    assert_eq!(
        conflict,
        [(
            "Warning".to_string(),
            format!("port {HOSTNET_PORT} is already in use in this pod's network namespace"),
            rank0.clone()
        )]
    );

    // 2. The job, on the node's address; 8470 still held.
    let before = eventually("both trainers ok", RUN_TIMEOUT, || async {
        let live = live_pods(&client, &ns, HOSTNET_JOB).await;
        if live.len() != 2 {
            return None;
        }
        for p in &live {
            if oks(&log(name_of(p)).await) < 1 {
                return None;
            }
        }
        Some(live)
    })
    .await;
    drop(held_tf);
    assert_eq!(name_of(&before[0]), rank0);
    for (rank, p) in before.iter().enumerate() {
        let spec = p.spec.as_ref().unwrap();
        let st = p.status.as_ref().unwrap();
        assert_eq!(
            (
                spec.host_network,
                spec.node_name.as_deref(),
                st.pod_ip.as_deref(),
                st.host_ip.as_deref()
            ),
            (
                Some(true),
                Some("trainlet-node"),
                Some(NODE_IP),
                Some(NODE_IP)
            ),
            "{}",
            name_of(p)
        );
        let runs = cmd_runs(&log(name_of(p)).await);
        assert_eq!(runs.len(), 1, "{}: {runs:?}", name_of(p));
        assert_eq!(split_run(&runs[0]), hostnet_run(rank), "{}", name_of(p));
    }
    // PyTorch's rank 0 checked its own port only: 8470, held all along, failed nothing.
    assert_eq!(events_of("PortConflict").await.len(), 1);

    // 3. Nothing leaves the machine: the guard rejects the pod user's connection.
    let rejects = hostnet_guard_rejects();
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .args(["exec", "-n", &ns, &rank0, "-c", "pytorch", "--"])
        .args(["sh", "-c", "id -u; nc -w 5 1.1.1.1 80 </dev/null"])
        .output()
        .unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned()
        ),
        (
            Some(1),
            "1000\n".to_string(),
            "nc: can't connect to remote host (1.1.1.1): Connection refused\ncommand terminated with exit code 1\n".to_string()
        )
    );
    assert!(
        hostnet_guard_rejects() > rejects,
        "TRAINLET-HOSTNET rejected nothing ({rejects} before)"
    );

    // 4. Rank 1 replaced on the same node, at the same address.
    let old = name_of(&before[1]);
    pods.delete(&old, &Default::default()).await.unwrap();
    let after = eventually(
        "the replacement's run and rank 0's second",
        RUN_TIMEOUT,
        || {
            let old = old.clone();
            let (client, ns) = (client.clone(), ns.clone());
            let log = &log;
            async move {
                let live = live_pods(&client, &ns, HOSTNET_JOB).await;
                if live.len() != 2 || name_of(&live[1]) == old {
                    return None;
                }
                if oks(&log(name_of(&live[0])).await) < 2 || oks(&log(name_of(&live[1])).await) < 1
                {
                    return None;
                }
                Some(live)
            }
        },
    )
    .await;
    let new = name_of(&after[1]);
    assert_eq!(name_of(&after[0]), rank0);
    assert_eq!(
        (
            after[1].spec.as_ref().unwrap().node_name.as_deref(),
            after[1].status.as_ref().unwrap().pod_ip.as_deref()
        ),
        (Some("trainlet-node"), Some(NODE_IP))
    );
    // The sidecar publishes what its watch saw on its own schedule.
    let replaced = eventually("the PeerReplaced Event", RUN_TIMEOUT, || async {
        let v = events_of("PeerReplaced").await;
        (!v.is_empty()).then_some(v)
    })
    .await;
    assert_eq!(
        replaced,
        [(
            "Warning".to_string(),
            format!(
                "task worker/1 ({NODE_IP}) is held by a new pod, {new}, at the same address; the cluster this pod was given is stale"
            ),
            rank0.clone()
        )]
    );
    // The restart: announced once, by rank 0; whether its watch saw the old pod go
    // before the new one came is a matter of timing.
    let restarting = events_of("Restarting").await;
    assert_eq!(restarting.len(), 1, "{restarting:?}");
    let (t, note, by) = &restarting[0];
    assert_eq!((t.as_str(), by.as_str()), ("Warning", rank0.as_str()));
    let lost = format!(
        "restarting sh (1 of 3) in 10s: the cluster changed (stale: worker/1 {NODE_IP} → none)"
    );
    let replaced = format!(
        "restarting sh (1 of 3) in 10s: the cluster changed (stale: worker/1 {NODE_IP} → {NODE_IP} (new pod {new}))"
    );
    assert!(*note == lost || *note == replaced, "Restarting: {note:?}");
    let runs0 = cmd_runs(&log(rank0.clone()).await);
    assert_eq!(runs0.len(), 2, "{rank0}: {runs0:?}");
    for run in &runs0 {
        assert_eq!(split_run(run), hostnet_run(0), "{rank0}");
    }
    let runs1 = cmd_runs(&log(new.clone()).await);
    assert_eq!(runs1.len(), 1, "{new}: {runs1:?}");
    assert_eq!(split_run(&runs1[0]), hostnet_run(1), "{new}");
    // Current again (published within the sidecar's patch interval).
    eventually(
        "rank 0's trainlet.io/cluster current again",
        RUN_TIMEOUT,
        || async {
            let now = pods.get(&rank0).await.unwrap();
            (now.annotations()
                .get("trainlet.io/cluster")
                .map(String::as_str)
                == Some("current"))
            .then_some(())
        },
    )
    .await;

    // 5. The end: both commands finish; the Job completes.
    for p in [&rank0, &new] {
        kubectl_on(
            kc,
            &[
                "exec",
                "-n",
                &ns,
                p,
                "-c",
                "pytorch",
                "--",
                "touch",
                "/dev/shm/done",
            ],
        );
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let status = eventually("Job ddp-hostnet Complete", RUN_TIMEOUT, || async {
        let st = jobs.get(HOSTNET_JOB).await.unwrap().status?;
        st.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(st)
    })
    .await;
    let complete = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Complete")
        .unwrap();
    assert_eq!(
        (complete.reason.as_deref(), status.succeeded, status.failed),
        (Some("CompletionsReached"), Some(2), Some(1))
    );
    for p in [&rank0, &new] {
        let runs = cmd_runs(&log(p.to_string()).await);
        assert_eq!(runs.last().unwrap().last().unwrap(), "done", "{p}");
    }
    delete_namespace(&client, &ns).await;
}
