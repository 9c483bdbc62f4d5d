//! Scenario 9 (`TRAINLET_BENCH_ONLY=recovery`), on the real node of tests/node/up (root):
//! recovery from a failed rank. A job of 3 pods trains (a loop that prints a step and
//! the TF_CONFIG it was given every 100 ms, from step 0 at each start); rank 1's command
//! is `SIGKILL`ed (`kubectl exec … kill -KILL`, exit 137: a failure worth a retry); the
//! figure is the time from the kill until every rank has printed step 0 of a new run
//! with the cluster of the job's live pods, for
//!
//! - (a) **in place on failure**: `trainlet inject --on-failure restart`, the restart
//!   backoff 1 s (`TRAINLET_RESTART_BACKOFF` in the training container's environment).
//!   Every pod's `trainlet exec` restarts its command in place, behind the barrier;
//! - (b) **in place after a replaced pod**: `trainlet inject --on-peer-change restart`.
//!   Rank 1's exec exits 137, its pod fails, the Job controller makes a replacement
//!   after its backoff, and the other pods' execs restart their commands with its
//!   address;
//! - (c) **recreate**: what a user (or an operator) without either does: at the failure
//!   every pod of the job is deleted at once, so that the Job controller makes them all
//!   again and each runs trainlet-init afresh;
//! - (d) **JobSet restart**: the same job as a JobSet's one replicated Job
//!   (`backoffLimit: 0`, `failurePolicy.maxRestarts`) under the real JobSet controller:
//!   the failed pod fails its Job, and the JobSet controller recreates every Job.
//!
//! The four alternate, [`ROUNDS`] runs each. Each run also records when the new pods (if
//! any) all reached phase Running, polled every 100 ms. A step's time is the container
//! runtime's timestamp of its line (`kubectl logs --timestamps`), on this machine's
//! clock, as is the kill's (taken just before `kubectl exec`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::support;

/// Runs of each variant, alternating.
pub const ROUNDS: usize = 3;

const PODS: usize = 3;

/// The failed rank.
const FAILED: usize = 1;

/// The training loop: a step every 100 ms, with the cluster it was given.
const TRAIN: &str = r#"i=0; while :; do echo "step $i $TF_CONFIG"; i=$((i+1)); sleep 0.1; done"#;

/// Kills the training loop (`$1`) in the container: the process whose command is it.
const KILL: &str = r#"for p in /proc/[0-9]*; do if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | sed -n 3p | grep -qxF "$1"; then kill -KILL "${p#/proc/}" && echo "${p#/proc/}"; fi; done"#;

/// From the kill to the end of a run, at most.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    OnFailure,
    Replaced,
    Recreate,
    JobSet,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::OnFailure,
        Variant::Replaced,
        Variant::Recreate,
        Variant::JobSet,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::OnFailure => {
                "in place on failure (--on-failure restart, --restart-backoff 1s)"
            }
            Variant::Replaced => "in place after a replaced pod (--on-peer-change restart)",
            Variant::Recreate => {
                "recreate (at the failure every pod deleted, the Job makes them again)"
            }
            Variant::JobSet => {
                "JobSet restart (failurePolicy.maxRestarts: the JobSet controller recreates every Job)"
            }
        }
    }
    fn key(self) -> &'static str {
        match self {
            Variant::OnFailure => "on_failure",
            Variant::Replaced => "replaced",
            Variant::Recreate => "recreate",
            Variant::JobSet => "jobset",
        }
    }
    /// The label that selects the job's pods.
    fn selector(self, name: &str) -> String {
        match self {
            Variant::JobSet => format!("jobset.sigs.k8s.io/jobset-name={name}"),
            _ => format!("batch.kubernetes.io/job-name={name}"),
        }
    }
}

/// The bench's job, injected as a user does it.
fn job(kc: &Path, name: &str, variant: Variant) -> Value {
    let mut main = json!({
        "name": "main",
        "image": "trainlet.test/trainer:1",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", TRAIN],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {"memory": "32Mi"}}
    });
    if variant == Variant::OnFailure {
        main["env"] = json!([{"name": "TRAINLET_RESTART_BACKOFF", "value": "1s"}]);
    }
    let spec = json!({
        "completionMode": "Indexed",
        "completions": PODS,
        "parallelism": PODS,
        // Every failed or deleted pod counts as a failure; a JobSet's Job fails at the
        // first, and the JobSet restarts.
        "backoffLimit": if variant == Variant::JobSet { 0 } else { 20 },
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                "containers": [main]
            }
        }
    });
    let plain = match variant {
        Variant::JobSet => json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": {"maxRestarts": 10},
                "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": spec}}]
            }
        }),
        _ => json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": spec
        }),
    };
    let job = format!("worker={}", variant.selector(name));
    let mut args = vec!["--wrap", "main", "--job", &job];
    match variant {
        Variant::OnFailure => args.extend(["--on-failure", "restart"]),
        Variant::Replaced => args.extend(["--on-peer-change", "restart"]),
        Variant::Recreate | Variant::JobSet => {}
    }
    support::as_json(kc, &support::inject_printed(&plain, &args))
}

fn index(p: &Pod) -> usize {
    p.labels()["batch.kubernetes.io/job-completion-index"]
        .parse()
        .unwrap()
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The job's live pods (not being deleted, not failed), by index.
async fn live(pods: &Api<Pod>, selector: &str) -> BTreeMap<usize, Pod> {
    let lp = ListParams::default().labels(selector);
    pods.list(&lp)
        .await
        .unwrap()
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Failed")
        })
        .map(|p| (index(&p), p))
        .collect()
}

/// The steps CMD printed in a pod: (runtime time, step, the cluster's worker list).
async fn steps(pods: &Api<Pod>, pod: &str) -> Vec<(SystemTime, u64, Value)> {
    let lp = LogParams {
        container: Some("main".into()),
        timestamps: true,
        ..Default::default()
    };
    let log = pods.logs(pod, &lp).await.unwrap_or_default();
    log.lines()
        .filter_map(|l| {
            let (ts, rest) = l.split_once(' ')?;
            let rest = rest.strip_prefix("step ")?;
            let (step, tf) = rest.split_once(' ')?;
            let tf: Value = serde_json::from_str(tf).ok()?;
            Some((
                humantime::parse_rfc3339(ts).ok()?,
                step.parse().ok()?,
                tf["cluster"]["worker"].clone(),
            ))
        })
        .collect()
}

fn ms_since(t: SystemTime, since: SystemTime) -> f64 {
    t.duration_since(since).unwrap_or_default().as_secs_f64() * 1e3
}

/// One run: (until every rank stepped again, until the new pods ran), both in ms from
/// the kill, and each rank's first new step.
async fn round(kc: &Path, client: &Client, ns: &str, variant: Variant, i: usize) -> Value {
    let name = format!("{}{i}", variant.key().replace('_', ""));
    let selector = variant.selector(&name);
    let doc = job(kc, &name, variant);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    support::apply_clean(kc, ns, &doc);
    // Training: every rank running and stepping.
    let t = Instant::now();
    let before = loop {
        let l = live(&pods, &selector).await;
        if l.len() == PODS && l.values().all(running) {
            let mut all = true;
            for p in l.values() {
                all &= !steps(&pods, &p.name_any()).await.is_empty();
            }
            if all {
                break l;
            }
        }
        assert!(t.elapsed() < RUN_TIMEOUT, "{name}: not training in time");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let old: BTreeSet<String> = before.values().map(|p| p.uid().unwrap()).collect();
    let failed = SystemTime::now();
    let killed = support::kubectl_on(
        kc,
        &[
            "exec",
            "-n",
            ns,
            &before[&FAILED].name_any(),
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            KILL,
            "sh",
            TRAIN,
        ],
    );
    assert_eq!(
        killed.lines().count(),
        1,
        "{name}: one command killed: {killed:?}"
    );
    if variant == Variant::Recreate {
        for p in before.values() {
            pods.delete(&p.name_any(), &DeleteParams::default())
                .await
                .unwrap();
        }
    }
    let t = Instant::now();
    let mut started: Option<SystemTime> = None;
    let mut firsts: BTreeMap<usize, f64> = BTreeMap::new();
    let mut last_logs = Instant::now() - Duration::from_secs(1);
    loop {
        let l = live(&pods, &selector).await;
        let new: Vec<&Pod> = l
            .values()
            .filter(|p| !old.contains(&p.uid().unwrap()))
            .collect();
        if started.is_none() && !new.is_empty() && l.len() == PODS && new.iter().all(|p| running(p))
        {
            started = Some(SystemTime::now());
        }
        if l.len() == PODS
            && l.values().all(running)
            && last_logs.elapsed() >= Duration::from_millis(250)
        {
            last_logs = Instant::now();
            let cluster: Value = l
                .values()
                .map(|p| {
                    let ip = p.status.as_ref().unwrap().pod_ip.clone().unwrap();
                    json!(format!("{ip}:8470"))
                })
                .collect();
            for (idx, p) in &l {
                if firsts.contains_key(idx) {
                    continue;
                }
                if let Some((ts, _, _)) = steps(&pods, &p.name_any())
                    .await
                    .into_iter()
                    .find(|(ts, step, c)| *ts >= failed && *step == 0 && *c == cluster)
                {
                    firsts.insert(*idx, ms_since(ts, failed));
                }
            }
            if firsts.len() == PODS {
                break;
            }
        }
        assert!(
            t.elapsed() < RUN_TIMEOUT,
            "{name}: the ranks did not all start again within {RUN_TIMEOUT:?} (stepped: {firsts:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = firsts.values().copied().fold(0.0, f64::max);
    let kind = match variant {
        Variant::JobSet => "jobset",
        _ => "job",
    };
    support::kubectl_on(
        kc,
        &[
            "delete",
            kind,
            "-n",
            ns,
            &name,
            "--cascade=foreground",
            "--wait=true",
        ],
    );
    json!({
        "variant": variant.key(),
        "round": i + 1,
        "recovered_ms": recovered,
        "new_pods_running_ms": started.map(|s| ms_since(s, failed)),
        "first_new_step_ms_by_rank": firsts,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the scenario; None, said on stderr, where something the node needs is missing
/// (root, the image archive).
pub async fn run() -> Option<Value> {
    let (kc, client, ns) = crate::node::namespace_on_node("recovery", "bench-recovery").await?;
    let mut runs = Vec::new();
    for i in 0..ROUNDS {
        // Which variant runs first turns round by round.
        let mut order = Variant::ALL;
        order.rotate_left(i % Variant::ALL.len());
        for variant in order {
            eprintln!(
                "bench: recovery, {PODS} pods, {} (round {})",
                variant.label(),
                i + 1
            );
            let r = round(kc, &client, &ns, variant, i).await;
            eprintln!("bench: {r}");
            runs.push(r);
        }
    }
    support::delete_namespace(&client, &ns).await;
    let of = |v: Variant, k: &str| -> Vec<f64> {
        runs.iter()
            .filter(|r| r["variant"] == v.key())
            .filter_map(|r| r[k].as_f64())
            .collect()
    };
    let mut recovered = serde_json::Map::new();
    let mut new_running = serde_json::Map::new();
    for v in Variant::ALL {
        recovered.insert(v.key().into(), json!(median(of(v, "recovered_ms"))));
        let running = of(v, "new_pods_running_ms");
        if !running.is_empty() {
            new_running.insert(v.key().into(), json!(median(running)));
        }
    }
    let on_failure = median(of(Variant::OnFailure, "recovered_ms"));
    let replaced = median(of(Variant::Replaced, "recovered_ms"));
    recovered.insert(
        "ratio_on_failure_over_replaced".into(),
        json!(on_failure / replaced),
    );
    let result = json!({
        "machine": crate::report::machine(),
        "commit": crate::report::commit(),
        "command": crate::report::command(),
        "kubernetes": kubernetes_version(kc),
        "job": format!("{PODS} pods of an Indexed Job, a step every 100 ms; rank {FAILED}'s command SIGKILLed"),
        "rounds": ROUNDS,
        "variants": Variant::ALL.iter().map(|v| json!({"key": v.key(), "label": v.label()})).collect::<Vec<_>>(),
        "median_recovered_ms": recovered,
        "median_new_pods_running_ms": new_running,
        "runs": runs,
    });
    crate::report::write_own("results-recovery.json", &result);
    Some(result)
}

/// The API server's version, as `kubectl version` reports it.
fn kubernetes_version(kc: &Path) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .args(["version", "-o", "json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
