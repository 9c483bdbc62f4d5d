//! `trainlet status` and `kubectl trainlet status` against the real API server, as a
//! ServiceAccount bound only to manifests/status/role.yaml: the Job or JobSet, the
//! job's pods with what the agents published on them, the newest Event of each, and
//! the verdict.

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::process::Command;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::json;
use trainlet::event::Event;
use trainlet::publish::{Publisher, keys};
use trainlet::reason::Reason;

use crate::support::*;

/// A Job `name` whose controller makes no pod (parallelism 0), so that the test makes
/// them; suspended (as Kueue creates it) or not, with `labels`.
async fn job(client: &Client, ns: &str, name: &str, suspend: bool, labels: serde_json::Value) {
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "parallelism": 0,
            "suspend": suspend,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.example/train:1"}]
            }}
        }
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap_or_else(|e| panic!("create Job {name}: {e}"));
}

/// A ServiceAccount `viewer` in `ns` bound to manifests/status/role.yaml, and its
/// kubeconfig.
async fn viewer(client: &Client, ns: &str, dir: &std::path::Path) -> std::path::PathBuf {
    kubectl(&["create", "serviceaccount", "viewer", "-n", ns]);
    kubectl(&[
        "apply",
        "-n",
        ns,
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
        ns,
    ]);
    sa_kubeconfig(client, ns, "viewer", dir).await
}

/// What trainlet publishes on a pod whose training container `main` sees `seen` of
/// the 4 GPUs its limit asks for, in a cluster that is current: the task, as init
/// writes it, and the sidecar's annotations and Events, made by the sidecar's own code
/// (`State::step` over what its probes would observe), so in exactly its shape: the
/// step's annotations, with the task, and its Events.
fn published(task: &str, seen: u32) -> trainlet::report::state::Step {
    use trainlet::cluster::drift::{Drift, Held};
    use trainlet::report::probe::gpu::xid::XidLedger;
    use trainlet::report::probe::gpu::{Expected, GpuDevice, GpuInfo};
    use trainlet::report::state::{Observed, State};
    let gpu = GpuInfo {
        devices: (0..seen)
            .map(|i| GpuDevice {
                index: i,
                uuid: format!("GPU-{i}"),
                name: "Fake GPU".into(),
                memory_total_bytes: 16 << 30,
                mig: None,
            })
            .collect(),
        driver: Some("550.54.15".into()),
        nvml: Ok(()),
        faulty: Default::default(),
    };
    let expected = Expected {
        count: 4,
        source: "resources.limits[\"nvidia.com/gpu\"]".into(),
    };
    let cluster = [Drift {
        task: task.into(),
        was: "10.1.0.2".into(),
        held: Held::Current,
    }];
    let step = State::default().step(Observed {
        mode: "sidecar",
        container: "main",
        since: "2026-11-23T11:00:00Z",
        gpu: &gpu,
        expected: Some(&expected),
        ports: &BTreeMap::new(),
        oom_total: 0,
        oom_by_container: &BTreeMap::new(),
        oom_recent: &[],
        oom_sources: vec!["pod status".into()],
        errors: BTreeMap::new(),
        gpus_seen: seen,
        gpu_lost: None,
        xids: &XidLedger::default(),
        xid_watch: None,
        gpu_unknown: None,
        exec: None,
        cluster: Some(&cluster),
        unpublished: None,
    });
    let mut step = step;
    step.annotations
        .insert(keys::TASK.into(), Some(task.into()));
    step
}

#[tokio::test]
async fn status_shows_the_job_and_its_verdict_with_read_only_rights() {
    let client = admin().await;
    let ns = namespace(&client, "status").await;
    let dir = tempfile::tempdir().unwrap();
    let viewer = viewer(&client, &ns, dir.path()).await;
    job(&client, &ns, "mnist", false, json!({})).await;
    let kubelet = Kubelet::new(&client, &ns);
    // mnist-0 sees its 4 GPUs, mnist-1 only 2 (a GPUCountMismatch Event), mnist-2 is
    // pending and has published nothing.
    let mut mismatch = Vec::new();
    for (i, seen) in [(0, Some(4)), (1, Some(2)), (2, None)] {
        let name = format!("mnist-{i}");
        let created = pod(&name)
            .labels(&format!(
                "batch.kubernetes.io/job-name=mnist,batch.kubernetes.io/job-completion-index={i}"
            ))
            .create(&client, &ns)
            .await;
        if let Some(seen) = seen {
            kubelet.run(&name, &format!("10.1.0.{}", i + 2)).await;
            let step = published(&format!("worker/{i}"), seen);
            let sidecar = Publisher::new(client.clone(), &created, "trainlet-sidecar");
            sidecar.annotate(&step.annotations).await.unwrap();
            for event in &step.events {
                sidecar.event(event).await.unwrap();
            }
            if seen == 2 {
                mismatch = step.events;
            }
        }
    }
    assert_eq!(
        mismatch,
        [Event::warning(
            Reason::GpuCountMismatch,
            "container main sees 2 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"])"
        )]
    );
    // Another job's pod in the namespace is not shown.
    let other = pod("other-0")
        .labels("batch.kubernetes.io/job-name=other")
        .create(&client, &ns)
        .await;

    let want = "\
TASK       POD       IP         PHASE     HEALTH     GPUS   CLUSTER   RESTARTS   PROGRESS   ETA   LAST OOM   LAST EVENT
worker/0   mnist-0   10.1.0.2   Running   ok         4/4    current   0          -          -     -          -
worker/1   mnist-1   10.1.0.3   Running   degraded   2/4    current   0          -          -     -          GPUCountMismatch
-          mnist-2   -          Pending   -          -      -         0          -          -     -          -
Job mnist: degraded: mnist-1 (container main sees 2 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"]))
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
        "Job mnist: degraded: mnist-1 (container main sees 2 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"]))"
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

    // Another pod's Event, newer than the job's, is not the job's.
    Publisher::new(client.clone(), &other, "trainlet-sidecar")
        .event(&Event::warning(
            Reason::OomKill,
            "container main was OOM-killed (exit code 137) and restarted (restart 1)",
        ))
        .await
        .unwrap();
    let r = run(trainlet()
        .args(["status", "job/mnist", "--kubeconfig"])
        .arg(&viewer));
    assert_eq!((r.code, r.stdout.as_str()), (0, want), "{}", r.stderr);

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
            "trainlet: error: forbidden: cannot get jobs.batch in namespace {ns:?}: bind ServiceAccount {ns}:nobody to the Role of manifests/status/role.yaml, which grants get and list on pods and events and get on jobs and jobsets (jobs.batch \"mnist\" is forbidden: User \"system:serviceaccount:{ns}:nobody\" cannot get resource \"jobs\" in API group \"batch\" in the namespace \"{ns}\")\n"
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

/// The Job or JobSet itself: one that Kueue holds suspended is "not admitted", a bare
/// name falls back to a JobSet, and a job that does not exist is one line and exit 2
/// (it used to print "no pods match" and exit 0).
#[tokio::test]
async fn status_reads_the_job_itself_not_admitted_jobsets_and_missing_jobs() {
    jobset_crd();
    let client = admin().await;
    let ns = namespace(&client, "status-job").await;
    let dir = tempfile::tempdir().unwrap();
    let viewer = viewer(&client, &ns, dir.path()).await;
    job(
        &client,
        &ns,
        "queued",
        true,
        json!({"kueue.x-k8s.io/queue-name": "gpu"}),
    )
    .await;
    let r = run(trainlet()
        .args(["status", "job/queued", "--kubeconfig"])
        .arg(&viewer));
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (
            0,
            "\
TASK   POD   IP   PHASE   HEALTH   GPUS   CLUSTER   RESTARTS   PROGRESS   ETA   LAST OOM   LAST EVENT
Job queued: not admitted: suspended in Kueue queue gpu (spec.suspend: true)
"
        ),
        "{}",
        r.stderr
    );
    let r = run(trainlet()
        .args(["status", "queued", "-o", "json", "--kubeconfig"])
        .arg(&viewer));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["state"], "not_admitted");

    // A JobSet, by a bare name (no Job of that name) and as jobset/NAME.
    let gvk = GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "jobsets");
    let js: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {"suspend": true, "replicatedJobs": [{"name": "workers", "replicas": 1,
            "template": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.example/train:1"}]}}}}}]}
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar)
        .create(&PostParams::default(), &js)
        .await
        .expect("the JobSet passes the CRD's schema");
    for name in ["js", "jobset/js"] {
        let r = run(trainlet()
            .args(["status", name, "--kubeconfig"])
            .arg(&viewer));
        assert_eq!(
            (r.code, r.stdout.lines().last()),
            (
                0,
                Some("JobSet js: not admitted: suspended (spec.suspend: true)")
            ),
            "{name}: {}",
            r.stderr
        );
    }

    // No such job: one line on stderr, nothing on stdout, exit 2.
    for (name, what) in [
        ("gone", "Job or JobSet"),
        ("job/gone", "Job"),
        ("jobset/gone", "JobSet"),
        ("job/js", "Job"),
    ] {
        let r = run(trainlet()
            .args(["status", name, "--kubeconfig"])
            .arg(&viewer));
        let bare = name.rsplit('/').next().unwrap();
        assert_eq!(
            (r.code, r.stdout.as_str(), r.stderr),
            (
                2,
                "",
                format!(
                    "trainlet: error: no {what} {bare:?} in namespace {ns:?}: check the name and --namespace\n"
                )
            ),
            "{name}"
        );
    }
}

/// `trainlet status` from what real reporters published, not from hand-written
/// annotations: pod `mnist-0` runs `trainlet exec --report --stall-after 2s` (its CMD
/// prints `step 7` and hangs: stalled) on four fake GPUs, pod `mnist-1` runs the
/// sidecar against a fake NVML on which GPU 2 is lost. The HEALTH, GPUS and PROGRESS
/// columns and the degraded verdict are what those annotations say.
#[tokio::test]
async fn status_reads_what_a_real_sidecar_and_exec_published() {
    use crate::report_support::{Reporter, fake_nvml, wait_annotation};

    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "status-real", dir.path()).await;
    let viewer = viewer(&client, &ns, dir.path()).await;
    job(&client, &ns, "mnist", false, json!({})).await;
    let kubelet = Kubelet::new(&client, &ns);
    for i in 0..2 {
        let name = format!("mnist-{i}");
        pod(&name)
            .labels(&format!(
                "batch.kubernetes.io/job-name=mnist,batch.kubernetes.io/job-completion-index={i}"
            ))
            .gpus(4)
            .annotation("trainlet.io/task", &format!("worker/{i}"))
            .create(&client, &ns)
            .await;
        kubelet.run(&name, &format!("10.1.0.{}", i + 2)).await;
    }
    let lib = fake_nvml().to_str().unwrap();
    let exec_dir = dir.path().join("exec");
    std::fs::create_dir(&exec_dir).unwrap();
    write_tf_config(&exec_dir, free_port());
    let mut exec = exec_cmd(
        &kc,
        &ns,
        "mnist-0",
        &exec_dir,
        &[
            "--nvml-lib",
            lib,
            "--stall-after",
            "2s",
            "--on-stall",
            "report",
            "--progress-pattern",
            r"step (\d+)",
            "--",
            "sh",
            "-c",
            "echo step 7; sleep 600",
        ],
    );
    exec.env("FAKE_NVML_COUNT", "4");
    let _exec = Reporter::start(exec);
    let faults = dir.path().join("nvml-faults");
    std::fs::write(&faults, "2 15\n").unwrap();
    let mut sidecar = sidecar_cmd(&kc, &ns, "mnist-1", &["--nvml-lib", lib]);
    sidecar
        .env("FAKE_NVML_COUNT", "4")
        .env("FAKE_NVML_FAULTS", &faults);
    let _sidecar = Reporter::start(sidecar);

    wait_annotation(&client, &ns, "mnist-1", "trainlet.io/health", "degraded").await;
    wait_annotation(&client, &ns, "mnist-1", "trainlet.io/gpu-count", "3").await;
    let progress = eventually(
        "mnist-0 stalled",
        std::time::Duration::from_secs(30),
        || async {
            let p: Pod = Api::namespaced(client.clone(), &ns)
                .get("mnist-0")
                .await
                .unwrap();
            let a = p.metadata.annotations.unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
            (v["stalled"] == true
                && a.get("trainlet.io/gpu-count").map(String::as_str) == Some("4"))
            .then_some(v)
        },
    )
    .await;
    assert_eq!(
        (&progress["step"], &progress["stalls"]),
        (&json!(7.0), &json!(1))
    );
    // The clock as status shows it: the time of day when it is today.
    let since = progress["since"].as_str().unwrap();
    let (date, time) = since.split_once('T').unwrap();
    let time = format!("{}Z", time.split(['.', 'Z']).next().unwrap());
    let today = k8s_openapi::jiff::Timestamp::now().to_string();
    let clock = if today.starts_with(date) {
        time
    } else {
        format!("{date} {time}")
    };
    let stalled = format!("stalled since {clock} (step 7)");
    let mismatch = "container trainer sees 3 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"])";
    let lost = "container trainer lost GPU 2: NVML reports the GPU is lost";
    let r = run(trainlet()
        .args(["status", "job/mnist", "--kubeconfig"])
        .arg(&viewer));
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Columns are as wide as their widest cell, and three spaces apart.
    let w = stalled.len();
    let want = format!(
        "\
TASK       POD       IP         PHASE     HEALTH     GPUS   CLUSTER   RESTARTS   {:w$}   ETA   LAST OOM   LAST EVENT
worker/0   mnist-0   10.1.0.2   Running   ok         4/4    -         0          {stalled}   -     -          Stalled
worker/1   mnist-1   10.1.0.3   Running   degraded   3/4    -         0          {:w$}   -     -          GPULost
Job mnist: degraded: mnist-0 ({stalled}), mnist-1 ({mismatch}; {lost})
",
        "PROGRESS", "-"
    );
    assert_eq!(r.stdout, want);
}
