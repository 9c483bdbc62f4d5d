//! Jobs made by the real Job controller (kube-controller-manager of `up`): the test
//! creates the Job, the controller creates its pods, and the test plays only the
//! scheduler and the kubelet for them.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::eventually;

/// An Indexed Job of `n` pods labelled `labels` (`k=v,…`), `restartPolicy: Never`, one
/// container `main`; `spec` is merged over the Job's spec (e.g. a podFailurePolicy).
pub async fn indexed_job(
    client: &Client,
    ns: &str,
    name: &str,
    n: i32,
    labels: &str,
    spec: Value,
) -> Job {
    let labels: serde_json::Map<String, Value> = labels
        .split(',')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), Value::String(v.to_string()))
        })
        .collect();
    let mut job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "main", "image": "registry.example/train:1"}]
                }
            }
        }
    });
    if let (Some(base), Value::Object(extra)) = (job["spec"].as_object_mut(), spec) {
        base.extend(extra);
    }
    let job: Job = serde_json::from_value(job).unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("create Job {name}: {e}"))
}

/// The pods of a Job, by the controller's label.
pub async fn job_pods(client: &Client, ns: &str, job: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .unwrap()
        .items
}

/// The completion index of a Job's pod.
pub fn index_of(p: &Pod) -> Option<u32> {
    p.metadata
        .labels
        .as_ref()?
        .get("batch.kubernetes.io/job-completion-index")?
        .parse()
        .ok()
}

pub fn name_of(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// Waits until the Job controller has made a live pod for `index` that is none of
/// `not` (names of earlier pods of that index), and returns its name.
pub async fn wait_job_pod(
    client: &Client,
    ns: &str,
    job: &str,
    index: u32,
    not: &[String],
) -> String {
    eventually(
        &format!("the Job controller's pod for index {index} of {job}"),
        Duration::from_secs(30),
        || async {
            job_pods(client, ns, job)
                .await
                .into_iter()
                .filter(|p| index_of(p) == Some(index) && p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                    !matches!(phase, Some("Failed" | "Succeeded"))
                })
                .map(|p| name_of(&p))
                .find(|n| !not.contains(n))
        },
    )
    .await
}

/// Waits until the Job has this condition (`Failed`, `Complete`, …) and returns its
/// reason.
pub async fn wait_job_condition(client: &Client, ns: &str, job: &str, type_: &str) -> String {
    let api = Api::<Job>::namespaced(client.clone(), ns);
    eventually(
        &format!("Job {job} condition {type_}"),
        Duration::from_secs(60),
        || async {
            let j = api.get(job).await.ok()?;
            j.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == type_ && c.status == "True")
                .map(|c| c.reason.unwrap_or_default())
        },
    )
    .await
}

/// Plays the scheduler and the kubelet for the first pod of each of a Job's `n`
/// indexes: bound, Running at `ip(index)`. Returns their names, by index.
pub async fn run_job_pods(
    client: &Client,
    ns: &str,
    job: &str,
    n: u32,
    ip: impl Fn(u32) -> String,
) -> Vec<String> {
    let kubelet = super::Kubelet::new(client, ns);
    let mut names = Vec::new();
    for i in 0..n {
        let name = wait_job_pod(client, ns, job, i, &[]).await;
        kubelet.run(&name, &ip(i)).await;
        names.push(name);
    }
    names
}
