//! `trainlet status` and `kubectl trainlet status` against the real API server, as a
//! ServiceAccount bound only to manifests/status/role.yaml: the job's pods with what the
//! agents published on them, the newest Event of each, and the verdict.

use std::os::unix::fs::symlink;
use std::process::Command;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

/// What the agents publish on a healthy pod with 4 GPUs.
fn published(task: &str, health: &str, cluster: &str) -> serde_json::Value {
    json!({"metadata": {"annotations": {
        "trainlet.io/task": task,
        "trainlet.io/health": health,
        "trainlet.io/cluster": cluster,
        "trainlet.io/report": json!({
            "health": health,
            "reasons": if health == "ok" { json!([]) } else { json!(["GPU count 2, expected 4"]) },
            "gpu": {"count": if health == "ok" { 4 } else { 2 }, "expected": {"count": 4, "source": "limit"}, "status": "ok"},
            "oom": {"kills": 0, "recent": []}
        }).to_string()
    }}})
}

#[tokio::test]
async fn status_shows_the_job_and_its_verdict_with_read_only_rights() {
    let client = admin().await;
    let ns = namespace(&client, "status").await;
    let dir = tempfile::tempdir().unwrap();
    kubectl(&["create", "serviceaccount", "viewer", "-n", &ns]);
    kubectl(&[
        "apply",
        "-n",
        &ns,
        "-f",
        repo().join("manifests/status/role.yaml").to_str().unwrap(),
    ]);
    kubectl(&[
        "create",
        "rolebinding",
        "viewer",
        "--role",
        "trainlet-status",
        &format!("--serviceaccount={ns}:viewer"),
        "-n",
        &ns,
    ]);
    let viewer = sa_kubeconfig(&client, &ns, "viewer", dir.path()).await;
    let kubelet = Kubelet::new(&client, &ns);
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (i, (health, cluster)) in [("ok", "current"), ("degraded", "current"), ("", "")]
        .iter()
        .enumerate()
    {
        let name = format!("mnist-{i}");
        pod(&name)
            .labels(&format!(
                "batch.kubernetes.io/job-name=mnist,batch.kubernetes.io/job-completion-index={i}"
            ))
            .create(&client, &ns)
            .await;
        if i < 2 {
            kubelet.run(&name, &format!("10.1.0.{}", i + 2)).await;
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(published(&format!("worker/{i}"), health, cluster)),
            )
            .await
            .unwrap();
        }
    }
    // Another job's pod in the namespace is not shown.
    pod("other-0")
        .labels("batch.kubernetes.io/job-name=other")
        .create(&client, &ns)
        .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    events
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "mnist-1.gpu"},
                "eventTime": "2026-11-23T12:00:00.000000Z",
                "reason": "GPUCountMismatch", "type": "Warning", "action": "Report",
                "note": "2 of 4 GPUs visible",
                "regarding": {"kind": "Pod", "name": "mnist-1", "namespace": ns},
                "reportingController": "trainlet.io/sidecar", "reportingInstance": "mnist-1"
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    let want = "\
TASK       POD       IP         PHASE     HEALTH     GPUS   CLUSTER   RESTARTS   PROGRESS   LAST OOM   LAST EVENT
worker/0   mnist-0   10.1.0.2   Running   ok         4/4    current   0          -          -          -
worker/1   mnist-1   10.1.0.3   Running   degraded   2/4    current   0          -          -          GPUCountMismatch
-          mnist-2   -          Pending   -          -      -         0          -          -          -
Job mnist: degraded: mnist-1 (GPU count 2, expected 4)
";
    let r = run(trainlet()
        .args(["status", "job/mnist", "--kubeconfig"])
        .arg(&viewer));
    assert_eq!((r.code, r.stdout.as_str()), (0, want), "{}", r.stderr);
    // A bare name finds the Job; JSON has the same rows and the state.
    let r = run(trainlet()
        .args(["status", "mnist", "-o", "json", "-n", &ns, "--kubeconfig"])
        .arg(&viewer));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["state"], "degraded");
    assert_eq!(
        v["verdict"],
        "Job mnist: degraded: mnist-1 (GPU count 2, expected 4)"
    );
    assert_eq!(v["pods"].as_array().unwrap().len(), 3);
    assert_eq!(v["pods"][1]["last_event"], "GPUCountMismatch");

    // The kubectl plugin: the same binary as `kubectl-trainlet` on PATH.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    symlink(env!("CARGO_BIN_EXE_trainlet"), bin.join("kubectl-trainlet")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = Command::new("kubectl")
        .env("PATH", path)
        .env("KUBECONFIG", &viewer)
        .args([
            "trainlet",
            "status",
            "-l",
            "batch.kubernetes.io/job-name=mnist",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        want.replace("Job mnist:", "pods of batch.kubernetes.io/job-name=mnist:"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without the Role: the verb and resource that are missing, exit 4.
    kubectl(&["create", "serviceaccount", "nobody", "-n", &ns]);
    let nobody = sa_kubeconfig(&client, &ns, "nobody", dir.path()).await;
    let r = run(trainlet()
        .args(["status", "job/mnist", "--kubeconfig"])
        .arg(&nobody));
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        format!(
            "trainlet: error: forbidden: cannot list pods in namespace {ns:?}: bind ServiceAccount {ns}:nobody to the Role of manifests/status/role.yaml, which grants get, list and watch on pods and events (pods is forbidden: User \"system:serviceaccount:{ns}:nobody\" cannot list resource \"pods\" in API group \"\" in the namespace \"{ns}\")\n"
        )
    );
    // Usage errors before any request.
    let r = run(trainlet().args(["status"]));
    assert_eq!(
        (r.code, r.stderr.trim()),
        (
            2,
            "trainlet: error: name the job (job/NAME, jobset/NAME or NAME) or give --selector SELECTOR"
        )
    );
}
