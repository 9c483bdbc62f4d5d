//! The README's quickstart (README.md, "Quickstart on a kind cluster"), run on the real
//! node of tests/node/up as a user runs it on kind: `make image`, the image into the
//! node, `kubectl create namespace`, `kubectl apply -k manifests/`, then for PyTorch and
//! for TensorFlow `kubectl apply` of the quickstart manifest, `kubectl wait` for the
//! Job, `kubectl logs -l ... --prefix` and `trainlet status`, checked against what the
//! README says they print.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::support::*;

/// One kubectl command as the user types it, with KUBECONFIG set to the node's
/// control plane; its stdout. Fails on an error.
fn kubectl(kc: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kc)
        .stdin(Stdio::null())
        .output()
        .expect("kubectl is installed");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The kustomize overlay that stands in for the public framework image (see the
/// test's comment): the shipped manifest, copied unchanged into `dir` as the overlay's
/// only resource; kustomize `images:` replaces the framework image by the local test
/// image; a JSON patch mounts the framework venv by hostPath and puts its `bin/` first
/// on the training container's PATH, so that the manifest's own `python`/`python3` is
/// the venv's. Nothing else changes: trainlet's containers, the command, the
/// resources and the security contexts are the manifest's.
fn overlay(dir: &Path, manifest: &str, image: &str, python: &Path) {
    let file = Path::new(manifest).file_name().unwrap().to_str().unwrap();
    std::fs::copy(repo().join(manifest), dir.join(file)).unwrap();
    let shipped = std::fs::read_to_string(repo().join(manifest)).unwrap();
    assert!(
        shipped.contains(&format!("image: {image}:")),
        "{manifest} runs {image}"
    );
    let (volumes, mounts) = venv_hostpath(python);
    let bin = python.parent().unwrap().to_str().unwrap();
    let mut ops = vec![json!({
        "op": "add",
        "path": "/spec/template/spec/containers/0/env/-",
        "value": {"name": "PATH", "value": format!("{bin}:/bin:/usr/local/bin:/usr/bin")}
    })];
    for v in volumes.as_array().unwrap() {
        ops.push(json!({"op": "add", "path": "/spec/template/spec/volumes/-", "value": v}));
    }
    for m in mounts.as_array().unwrap() {
        ops.push(json!({
            "op": "add",
            "path": "/spec/template/spec/containers/0/volumeMounts/-",
            "value": m
        }));
    }
    // JSON is YAML: kustomize reads this kustomization.yaml as it is.
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [file],
        "images": [{"name": image, "newName": "trainlet.test/trainer", "newTag": "1"}],
        "patches": [{
            "target": {"group": "batch", "version": "v1", "kind": "Job"},
            "patch": Value::Array(ops).to_string()
        }]
    });
    std::fs::write(
        dir.join("kustomization.yaml"),
        serde_json::to_string_pretty(&kustomization).unwrap(),
    )
    .unwrap();
}

/// The lines of `kubectl logs -l ... --prefix` that start with `start` (the training
/// program's own line, among trainlet exec's and the framework's), as (pod, line),
/// sorted.
fn prefixed(logs: &str, container: &str, start: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = logs
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("[pod/")?;
            let (pod, line) = rest.split_once("] ")?;
            let pod = pod.strip_suffix(&format!("/{container}"))?;
            line.starts_with(start)
                .then(|| (pod.to_string(), line.to_string()))
        })
        .collect();
    v.sort();
    v
}

/// `trainlet status`'s table, as (TASK, POD, PHASE) per pod, and its last line.
fn status(kc: &Path, job: &str, ns: &str) -> (Vec<(String, String, String)>, String) {
    let out = trainlet()
        .args(["status", &format!("job/{job}"), "-n", ns])
        .env("KUBECONFIG", kc)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "trainlet status ({}):\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("TASK "), "{text}");
    let rows = lines[1..lines.len() - 1]
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[1].to_string(), f[3].to_string())
        })
        .collect();
    (rows, lines[lines.len() - 1].to_string())
}

/// The Job's pods by completion index: their names.
fn pods_by_index(kc: &Path, job: &str, ns: &str) -> Vec<String> {
    let out = kubectl(
        kc,
        &[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            &format!("batch.kubernetes.io/job-name={job}"),
            "-o",
            "json",
        ],
    );
    let list: Value = serde_json::from_str(&out).unwrap();
    let mut pods: Vec<(String, String)> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                p["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    pods.sort();
    assert_eq!(
        pods.iter().map(|(i, _)| i.as_str()).collect::<Vec<_>>(),
        ["0", "1"],
        "one pod per index, none replaced: {pods:?}"
    );
    pods.into_iter().map(|(_, name)| name).collect()
}

/// The README's quickstart on the real node, command by command, with only what this
/// machine cannot do substituted:
/// - `kind create cluster`: the node of tests/node/up (support::node) instead.
/// - `kind load image-archive target/image/trainlet-0.1.0.tar`: tests/node/up imports
///   that same archive into the node's containerd (support::node, after `make image`).
/// - The public framework images (`docker.io/pytorch/pytorch:2.5.1-...`,
///   `docker.io/tensorflow/tensorflow:2.17.0`) cannot be pulled here (no registry): a
///   kustomize overlay over the shipped manifests/quickstart/*.yaml (see [`overlay`])
///   replaces them by the local test image `trainlet.test/trainer:1` and mounts the
///   framework venv of `.ci/frameworks` (PyTorch, TensorFlow, CPU) read-only by hostPath
///   with its bin/ first on PATH, so the manifests' `python -c` and `python3 -c` run
///   unchanged; `kubectl apply -f FILE` becomes `kubectl apply -k OVERLAY`.
/// - Namespace `ml` is a fresh `ml-quickstart-…` (runs must not collide), and the waits
///   are 5 minutes, not 15 (nothing is pulled).
///
/// Everything else is the README's: trainlet's containers as shipped, from the archive;
/// the RBAC by `kubectl apply -k manifests/`; the Job names, the log selectors and
/// containers, and `trainlet status job/NAME`. Checked: each Job completes; `kubectl
/// logs --prefix` shows `rank=0 world=2 sum=3 ok` from pod 0 and `rank=1 ...` from
/// pod 1, then `worker/0 replicas=2 sum=2 ok` and `worker/1 ...` (the lines the README
/// and the manifests' headers promise); `trainlet status` lists both pods of each job
/// `Succeeded` under their tasks and ends with `Job NAME: completed: 2 pods succeeded`.
#[tokio::test]
async fn the_readme_quickstart_runs_on_a_real_node() {
    let py = require!(framework_python());
    // `make image`: up to date, it rebuilds nothing and writes the same archive.
    let make = Command::new("make")
        .arg("image")
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .expect("make is installed");
    assert!(
        make.status.success(),
        "make image ({}):\n{}",
        make.status,
        String::from_utf8_lossy(&make.stderr)
    );
    let kc = require!(node());
    let ns = format!("ml-quickstart-{}", unique());
    kubectl(kc, &["create", "namespace", &ns]);
    let manifests = repo().join("manifests");
    kubectl(kc, &["apply", "-k", manifests.to_str().unwrap(), "-n", &ns]);

    let frameworks = [
        (
            "manifests/quickstart/pytorch.yaml",
            "docker.io/pytorch/pytorch",
            "pytorch-quickstart",
            "pytorch",
            "rank=",
            ["rank=0 world=2 sum=3 ok", "rank=1 world=2 sum=3 ok"],
        ),
        (
            "manifests/quickstart/tensorflow.yaml",
            "docker.io/tensorflow/tensorflow",
            "tensorflow-quickstart",
            "tensorflow",
            "worker/",
            [
                "worker/0 replicas=2 sum=2 ok",
                "worker/1 replicas=2 sum=2 ok",
            ],
        ),
    ];
    for (manifest, image, job, container, start, want) in frameworks {
        let dir = tempfile::tempdir().unwrap();
        overlay(dir.path(), manifest, image, py);
        kubectl(
            kc,
            &["apply", "-n", &ns, "-k", dir.path().to_str().unwrap()],
        );
        let waited = Command::new("kubectl")
            .args(["wait", "--for=condition=complete", &format!("job/{job}")])
            .args(["-n", &ns, "--timeout=5m"])
            .env("KUBECONFIG", kc)
            .output()
            .unwrap();
        if !waited.status.success() {
            let client = client_from(kc).await;
            let pods = kube::Api::namespaced(client, &ns);
            panic!(
                "kubectl wait for job/{job}: {}\n{}",
                String::from_utf8_lossy(&waited.stderr),
                describe_pods(&pods).await
            );
        }
        let pods = pods_by_index(kc, job, &ns);
        let logs = kubectl(
            kc,
            &[
                "logs",
                "-n",
                &ns,
                "-l",
                &format!("batch.kubernetes.io/job-name={job}"),
                "-c",
                container,
                "--prefix",
            ],
        );
        assert_eq!(
            prefixed(&logs, container, start),
            [
                (pods[0].clone(), want[0].to_string()),
                (pods[1].clone(), want[1].to_string())
            ],
            "{logs}"
        );
        let (rows, verdict) = status(kc, job, &ns);
        assert_eq!(
            rows,
            [
                ("worker/0".into(), pods[0].clone(), "Succeeded".into()),
                ("worker/1".into(), pods[1].clone(), "Succeeded".into())
            ]
        );
        assert_eq!(verdict, format!("Job {job}: completed: 2 pods succeeded"));
    }
    delete_namespace(&client_from(kc).await, &ns).await;
}
