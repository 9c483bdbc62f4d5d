//! Scenario 9 (`TRAINLET_BENCH_ONLY=recovery`), on the real node of tests/node/up (root):
//! recovery from a replaced pod. A job of 3 pods trains (a loop that prints a step and
//! the TF_CONFIG it was given every 100 ms); one pod is deleted (`kubectl delete pod`);
//! the figure is the time from that deletion until every rank has printed a step with
//! the new cluster, for
//!
//! - (a) **in place**: `trainlet inject --on-peer-change restart`, every other setting
//!   its default. The Job controller replaces the pod, the replacement's trainlet-init
//!   resolves the new cluster, the other pods' sidecars move their files and their
//!   `trainlet exec` restart CMD;
//! - (b) **recreate**: what a user without it does: every pod of the job deleted at once
//!   (`kubectl delete pods -l batch.kubernetes.io/job-name=…`), so that the Job
//!   controller makes them all again and each runs trainlet-init afresh (`trainlet
//!   inject` without `--on-peer-change`, so nothing restarts in place).
//!
//! The two alternate, [`ROUNDS`] runs each. Each run also records when the replacement
//! (in (b), the last of the new pods) reached phase Running, polled every 100 ms, which
//! splits (a) into the replacement's own start and what trainlet adds after it. A step's
//! time is the container runtime's timestamp of its line (`kubectl logs --timestamps`),
//! on this machine's clock, as is the deletion's.

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

/// The replaced rank in (a).
const REPLACED: usize = 1;

/// The training loop: a step every 100 ms, with the cluster it was given.
const TRAIN: &str = r#"i=0; while :; do echo "step $i $TF_CONFIG"; i=$((i+1)); sleep 0.1; done"#;

/// From the deletion to the end of a run, at most.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    InPlace,
    Recreate,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::InPlace => "in place (--on-peer-change restart)",
            Variant::Recreate => "recreate (every pod deleted, the Job makes them again)",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Variant::InPlace => "in_place",
            Variant::Recreate => "recreate",
        }
    }
}

/// The bench's Job, injected as a user does it.
fn job(kc: &Path, name: &str, variant: Variant) -> Value {
    let plain = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": PODS,
            "parallelism": PODS,
            // Every deleted pod counts as a failure.
            "backoffLimit": 20,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                    "containers": [{
                        "name": "main",
                        "image": "trainlet.test/trainer:1",
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", TRAIN],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                      "limits": {"memory": "32Mi"}}
                    }]
                }
            }
        }
    });
    let job = format!("worker=batch.kubernetes.io/job-name={name}");
    let mut args = vec!["--wrap", "main", "--job", &job];
    if variant == Variant::InPlace {
        args.extend(["--on-peer-change", "restart"]);
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

/// The job's live pods (not being deleted), by index.
async fn live(pods: &Api<Pod>, name: &str) -> BTreeMap<usize, Pod> {
    let lp = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}"));
    pods.list(&lp)
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (index(&p), p))
        .collect()
}

/// The steps CMD printed in a pod: (runtime time, the cluster's worker list).
async fn steps(pods: &Api<Pod>, pod: &str) -> Vec<(SystemTime, Value)> {
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
            let (_, tf) = rest.split_once(' ')?;
            let tf: Value = serde_json::from_str(tf).ok()?;
            Some((
                humantime::parse_rfc3339(ts).ok()?,
                tf["cluster"]["worker"].clone(),
            ))
        })
        .collect()
}

fn ms_since(t: SystemTime, since: SystemTime) -> f64 {
    t.duration_since(since).unwrap_or_default().as_secs_f64() * 1e3
}

/// One run: (until every rank stepped with the new cluster, until the replacement ran),
/// both in ms from the deletion, and each rank's first new step.
async fn round(kc: &Path, client: &Client, ns: &str, variant: Variant, i: usize) -> Value {
    let name = format!(
        "{}{i}",
        match variant {
            Variant::InPlace => "inplace",
            Variant::Recreate => "recreate",
        }
    );
    let doc = job(kc, &name, variant);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    support::apply_clean(kc, ns, &doc);
    // Training: every rank running and stepping.
    let t = Instant::now();
    let before = loop {
        let l = live(&pods, &name).await;
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
    let deleted = SystemTime::now();
    let doomed: Vec<String> = match variant {
        Variant::InPlace => vec![before[&REPLACED].name_any()],
        Variant::Recreate => before.values().map(|p| p.name_any()).collect(),
    };
    for pod in &doomed {
        pods.delete(pod, &DeleteParams::default()).await.unwrap();
    }
    let t = Instant::now();
    let mut started: Option<SystemTime> = None;
    let mut firsts: BTreeMap<usize, f64> = BTreeMap::new();
    let mut last_logs = Instant::now() - Duration::from_secs(1);
    loop {
        let l = live(&pods, &name).await;
        let new: Vec<&Pod> = l
            .values()
            .filter(|p| !old.contains(&p.uid().unwrap()))
            .collect();
        if started.is_none() && new.len() == doomed.len() && new.iter().all(|p| running(p)) {
            started = Some(SystemTime::now());
        }
        if started.is_some() && last_logs.elapsed() >= Duration::from_millis(250) {
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
                if let Some((ts, _)) = steps(&pods, &p.name_any())
                    .await
                    .into_iter()
                    .find(|(ts, c)| *ts >= deleted && *c == cluster)
                {
                    firsts.insert(*idx, ms_since(ts, deleted));
                }
            }
            if firsts.len() == PODS {
                break;
            }
        }
        assert!(
            t.elapsed() < RUN_TIMEOUT,
            "{name}: the ranks did not all step with the new cluster within {RUN_TIMEOUT:?} (stepped: {firsts:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = firsts.values().copied().fold(0.0, f64::max);
    let running_ms = ms_since(started.unwrap(), deleted);
    support::kubectl_on(
        kc,
        &[
            "delete",
            "job",
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
        "replacement_running_ms": running_ms,
        "beyond_running_ms": recovered - running_ms,
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
        let order = if i % 2 == 0 {
            [Variant::InPlace, Variant::Recreate]
        } else {
            [Variant::Recreate, Variant::InPlace]
        };
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
            .map(|r| r[k].as_f64().unwrap())
            .collect()
    };
    let a = median(of(Variant::InPlace, "recovered_ms"));
    let b = median(of(Variant::Recreate, "recovered_ms"));
    let result = json!({
        "machine": crate::report::machine(),
        "commit": crate::report::commit(),
        "command": crate::report::command(),
        "kubernetes": kubernetes_version(kc),
        "job": format!("{PODS} pods of an Indexed Job, a step every 100 ms; rank {REPLACED} deleted"),
        "rounds": ROUNDS,
        "median_recovered_ms": {
            "in_place": a,
            "recreate": b,
            "ratio_in_place_over_recreate": a / b,
        },
        "median_replacement_running_ms": {
            "in_place": median(of(Variant::InPlace, "replacement_running_ms")),
            "recreate": median(of(Variant::Recreate, "replacement_running_ms")),
        },
        "median_in_place_beyond_running_ms": median(of(Variant::InPlace, "beyond_running_ms")),
        "runs": runs,
    });
    let dir = support::repo().join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("results-recovery.json"),
        serde_json::to_string_pretty(&result).unwrap(),
    )
    .unwrap();
    eprintln!("bench: wrote {}/results-recovery.json", dir.display());
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
