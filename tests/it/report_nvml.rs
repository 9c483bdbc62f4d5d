//! The reporter against the fake NVML where real NVML differs from a healthy node:
//! events from before registration, a registration NVML refuses, one GPU lost or
//! needing a reset while the others work, and MIG devices against
//! `nvidia.com/mig-*` limits. Each asserts exactly what the pod then says: its
//! annotations, its Warning Events, its metrics.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::report_support::*;
use crate::support::*;

/// A sidecar on pod `train-0` (created from `spec`, running) with the fake NVML
/// configured by `env`; its event file, fault file and lost file (absent until a test
/// writes it) are in the returned directory.
struct Nvml {
    client: kube::Client,
    ns: String,
    r: Reporter,
    events: PathBuf,
    faults: PathBuf,
    lost: PathBuf,
    _dir: tempfile::TempDir,
}

async fn sidecar(spec: PodSpec, env: &[(&str, &str)], events_before: &str) -> Nvml {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "nvml", dir.path()).await;
    spec.create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.7").await;
    let events = dir.path().join("nvml-events");
    let faults = dir.path().join("nvml-faults");
    let lost = dir.path().join("nvml-lost");
    std::fs::write(&events, events_before).unwrap();
    std::fs::write(&faults, "").unwrap();
    let lib = fake_nvml();
    let mut cmd = sidecar_cmd(&kc, &ns, "train-0", &["--nvml-lib", lib.to_str().unwrap()]);
    cmd.env("FAKE_NVML_COUNT", "4")
        .env("FAKE_NVML_NAMES", "Fake GPU")
        .env("FAKE_NVML_EVENTS", &events)
        .env("FAKE_NVML_FAULTS", &faults)
        .env("FAKE_NVML_LOST", &lost);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Nvml {
        client,
        ns,
        r: Reporter::start(cmd),
        events,
        faults,
        lost,
        _dir: dir,
    }
}

impl Nvml {
    /// The pod's `trainlet.io/report`; null until the first patch.
    async fn report(&self) -> Value {
        let a = annotations(&self.client, &self.ns, "train-0").await;
        a.get("trainlet.io/report")
            .map_or(Value::Null, |r| serde_json::from_str(r).unwrap())
    }

    /// Waits until the report says which GPUs NVML's event API watches: the event
    /// thread has registered, so what is injected from now on happens after it.
    async fn registered(&self) -> Value {
        eventually(
            "gpu.xid_watch in the report",
            Duration::from_secs(20),
            || async {
                let w = self.report().await["gpu"]["xid_watch"].clone();
                (!w.is_null()).then_some(w)
            },
        )
        .await
    }

    async fn wait_count(&self, count: &str) {
        wait_annotation(
            &self.client,
            &self.ns,
            "train-0",
            "trainlet.io/gpu-count",
            count,
        )
        .await;
    }

    fn fault(&self, line: &str) {
        std::fs::write(&self.faults, line).unwrap();
    }

    /// The `trainlet_gpu_info` series, sorted.
    async fn gpu_info(&self) -> Vec<String> {
        let text = self.r.metrics().await;
        let mut v: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("trainlet_gpu_info{"))
            .map(String::from)
            .collect();
        v.sort();
        v
    }
}

fn uuid(i: u32) -> String {
    format!("GPU-00000000-fake-{i:04}")
}

fn info_line(i: u32, uuid: &str, model: &str) -> String {
    format!("trainlet_gpu_info{{gpu=\"{i}\",uuid=\"{uuid}\",model=\"{model}\"}} 1")
}

/// NVML's event set sees only what happens after registration. The XID 79 written
/// before the sidecar starts (it would make the pod degraded) is never reported; the
/// XID 13 after registration is. Events are delivered in the order written, so once
/// the second is reported, the first would have been.
#[tokio::test]
async fn an_xid_from_before_registration_is_not_reported() {
    let n = sidecar(pod("train-0").gpus(4), &[], "1 79\n").await;
    assert_eq!(n.registered().await, json!({"watched": [0, 1, 2, 3]}));
    assert_eq!(
        metric(&n.r.metrics().await, "trainlet_gpu_xid_watched"),
        Some(4.0)
    );
    inject_xid(&n.events, "2 13\n");
    let note = "GPU 2 (GPU-00000000-fake-0002) reported XID 13 (graphics engine exception)";
    assert_eq!(wait_warning(&n.client, &n.ns, "GPUXidError").await, note);
    eventually("the XID in the report", Duration::from_secs(20), || async {
        let x = n.report().await["gpu"]["xid_errors"].clone();
        (!x.is_null()).then_some(())
    })
    .await;
    let report = n.report().await;
    assert_eq!(
        report["gpu"]["xid_errors"],
        json!([{"gpu": 2, "uuid": uuid(2), "xid": 13, "count": 1}])
    );
    assert_eq!(report["health"], "ok");
    assert_eq!(report["reasons"], json!([]));
    assert_eq!(
        warnings(&n.client, &n.ns).await,
        vec![("GPUXidError".to_string(), note.to_string())]
    );
    let text = n.r.metrics().await;
    assert_eq!(
        metric(
            &text,
            "trainlet_gpu_xid_errors_total{gpu=\"2\",uuid=\"GPU-00000000-fake-0002\",xid=\"13\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "trainlet_gpu_xid_errors_total{gpu=\"1\",uuid=\"GPU-00000000-fake-0001\",xid=\"79\"}"
        ),
        None
    );
}

/// How many times the sidecar's log says XIDs are not watched.
fn said_unwatched(r: &Reporter) -> usize {
    r.stderr().matches("XID errors are not watched on").count()
}

/// NVML refuses registration on every GPU (NVML_ERROR_NOT_SUPPORTED): no XID is
/// watched, the log says so once, the report and `trainlet_gpu_xid_watched` say so,
/// and the counts and health still come by polling: the pod stays ok, and a GPU lost
/// later is still announced.
#[tokio::test]
async fn registration_not_supported_leaves_polling_and_says_so_once() {
    let n = sidecar(
        pod("train-0").gpus(4),
        &[("FAKE_NVML_REGISTER_FAIL", "3")],
        "",
    )
    .await;
    let why = "the requested operation is not available on the target device";
    assert_eq!(
        n.registered().await,
        json!({"watched": [], "unwatched": (0..4).map(|i| json!({"gpu": i, "uuid": uuid(i), "why": why})).collect::<Vec<_>>()})
    );
    wait_annotation(&n.client, &n.ns, "train-0", "trainlet.io/health", "ok").await;
    let a = annotations(&n.client, &n.ns, "train-0").await;
    assert_eq!(a["trainlet.io/gpu-count"], "4");
    let text = n.r.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpu_xid_watched"), Some(0.0));
    assert_eq!(metric(&text, "trainlet_gpus"), Some(4.0));
    assert_eq!(metric(&text, "trainlet_health"), Some(1.0));
    assert_eq!(warnings(&n.client, &n.ns).await, vec![]);
    assert_eq!(said_unwatched(&n.r), 1, "{}", n.r.stderr());
    let line = format!(
        "XID errors are not watched on {}; GPU counts and health are still polled",
        (0..4)
            .map(|i| format!("GPU {i} ({}): {why}", uuid(i)))
            .collect::<Vec<_>>()
            .join("; ")
    );
    assert!(n.r.stderr().contains(&line), "{}", n.r.stderr());

    // An XID now reaches nobody; a GPU lost is still seen by polling.
    inject_xid(&n.events, "3 79\n");
    n.fault("3 15\n");
    let note = wait_warning(&n.client, &n.ns, "GPULost").await;
    assert_eq!(
        note,
        "container trainer lost GPU 3 (GPU-00000000-fake-0003): NVML reports the GPU is lost"
    );
    assert_eq!(count_warnings(&n.client, &n.ns, "GPUXidError").await, 0);
    assert_eq!(said_unwatched(&n.r), 1, "{}", n.r.stderr());
}

/// NVML fails as a whole after it worked (the count itself answers "GPU is lost", as
/// "Failed to initialize NVML: Unknown Error" does once a container's device nodes are
/// gone) and no event watch tells it (registration not supported): the sidecar's
/// polling announces the loss, and NVML unavailable against the limit. GPUs it showed
/// are its own, so the count is no `unknown`: before, a probe that showed none made
/// the sidecar say `unknown` and announce nothing, and the same happened with the
/// event watch whenever the probe saw the loss first.
#[tokio::test]
async fn gpus_nvml_stops_answering_for_are_lost_not_unknown() {
    let n = sidecar(
        pod("train-0").gpus(4),
        &[("FAKE_NVML_REGISTER_FAIL", "3")],
        "",
    )
    .await;
    // Registered (none): the event thread has ended, only polling sees what follows.
    n.registered().await;
    wait_annotation(&n.client, &n.ns, "train-0", "trainlet.io/health", "ok").await;
    std::fs::write(&n.lost, "").unwrap();
    let why = "query failed: device fell off the bus or has otherwise become inacessible";
    let lost = format!("container trainer saw 4 GPUs and now sees 0 (NVML: unavailable: {why})");
    let unavailable = format!(
        "container trainer expects 4 GPUs (resources.limits[\"nvidia.com/gpu\"]) but NVML is unavailable: {why}"
    );
    assert_eq!(wait_warning(&n.client, &n.ns, "GPULost").await, lost);
    n.wait_count("0").await;
    let a = annotations(&n.client, &n.ns, "train-0").await;
    assert_eq!(a["trainlet.io/health"], "degraded");
    let report: Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["gpu"]["status"], "unavailable");
    assert_eq!(report["gpu"]["unknown"], Value::Null);
    assert_eq!(report["gpu"]["lost"], lost);
    assert_eq!(report["reasons"], json!([unavailable, lost]));
    let text = n.r.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpus"), Some(0.0));
    assert_eq!(metric(&text, "trainlet_health"), Some(0.0));
    assert_eq!(
        warnings(&n.client, &n.ns).await,
        vec![
            ("GPULost".to_string(), lost),
            ("GPUUnavailable".to_string(), unavailable),
        ]
    );
}

/// NVML refuses one GPU (NVML_ERROR_NO_PERMISSION): the others are still watched.
#[tokio::test]
async fn registration_refused_on_one_gpu_watches_the_others() {
    let n = sidecar(
        pod("train-0").gpus(4),
        &[("FAKE_NVML_REGISTER_FAIL", "1:4")],
        "",
    )
    .await;
    assert_eq!(
        n.registered().await,
        json!({"watched": [0, 2, 3], "unwatched": [{"gpu": 1, "uuid": uuid(1),
            "why": "the current user does not have permission to perform this operation"}]})
    );
    assert_eq!(
        metric(&n.r.metrics().await, "trainlet_gpu_xid_watched"),
        Some(3.0)
    );
    assert_eq!(said_unwatched(&n.r), 1, "{}", n.r.stderr());
    inject_xid(&n.events, "1 13\n");
    inject_xid(&n.events, "2 13\n");
    let note = "GPU 2 (GPU-00000000-fake-0002) reported XID 13 (graphics engine exception)";
    assert_eq!(wait_warning(&n.client, &n.ns, "GPUXidError").await, note);
    // GPU 1's came first and was not delivered.
    assert_eq!(count_warnings(&n.client, &n.ns, "GPUXidError").await, 1);
}

/// One GPU answers NVML_ERROR_GPU_IS_LOST while the other three work: the pod names
/// it (GPULost), counts the other three (GPUCountMismatch against the limit of 4) and
/// lists them; before, the probe failed as a whole and the pod said 0 GPUs and NVML
/// unavailable.
#[tokio::test]
async fn one_lost_gpu_is_named_and_the_others_still_count() {
    let n = sidecar(pod("train-0").gpus(4), &[], "").await;
    wait_annotation(&n.client, &n.ns, "train-0", "trainlet.io/health", "ok").await;
    n.registered().await;
    n.fault("2 15\n");
    let lost =
        "container trainer lost GPU 2 (GPU-00000000-fake-0002): NVML reports the GPU is lost";
    let mismatch = "container trainer sees 3 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"])";
    assert_eq!(wait_warning(&n.client, &n.ns, "GPULost").await, lost);
    n.wait_count("3").await;
    let a = annotations(&n.client, &n.ns, "train-0").await;
    assert_eq!(a["trainlet.io/health"], "degraded");
    assert_eq!(a["trainlet.io/gpu-product"], "Fake GPU");
    let report: Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["reasons"], json!([mismatch, lost]));
    assert_eq!(report["gpu"]["nvml"], "ok");
    assert_eq!(report["gpu"]["status"], "mismatch");
    assert_eq!(report["gpu"]["lost"], lost);
    assert_eq!(
        report["gpu"]["faulty"],
        json!([{"index": 2, "uuid": uuid(2), "fault": "lost",
            "why": "device fell off the bus or has otherwise become inacessible"}])
    );
    let indices: Vec<u64> = report["gpu"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 3]);
    let text = n.r.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpus"), Some(3.0));
    assert_eq!(metric(&text, "trainlet_health"), Some(0.0));
    assert_eq!(
        n.gpu_info().await,
        [0, 1, 3]
            .map(|i| info_line(i, &uuid(i), "Fake GPU"))
            .to_vec()
    );
    let mut w = warnings(&n.client, &n.ns).await;
    w.sort();
    assert_eq!(
        w,
        vec![
            ("GPUCountMismatch".to_string(), mismatch.to_string()),
            ("GPULost".to_string(), lost.to_string()),
        ]
    );
}

/// One GPU answers NVML_ERROR_RESET_REQUIRED: a GPUResetRequired Event names it, it
/// is not called lost, and the others are counted.
#[tokio::test]
async fn a_gpu_that_requires_a_reset_is_reported_as_such() {
    let n = sidecar(pod("train-0").gpus(4), &[], "").await;
    wait_annotation(&n.client, &n.ns, "train-0", "trainlet.io/health", "ok").await;
    n.fault("1 16\n");
    let reset = "container trainer cannot use GPU 1 (GPU-00000000-fake-0001): NVML says it requires a reset (device requires a reset before it can be used again); reset the GPU or reboot the node";
    let mismatch = "container trainer sees 3 GPUs (Fake GPU) but 4 are expected (resources.limits[\"nvidia.com/gpu\"])";
    assert_eq!(
        wait_warning(&n.client, &n.ns, "GPUResetRequired").await,
        reset
    );
    n.wait_count("3").await;
    let report = n.report().await;
    assert_eq!(report["health"], "degraded");
    assert_eq!(report["reasons"], json!([mismatch, reset]));
    assert_eq!(report["gpu"]["lost"], Value::Null);
    assert_eq!(
        report["gpu"]["faulty"],
        json!([{"index": 1, "uuid": uuid(1), "fault": "reset-required",
            "why": "device requires a reset before it can be used again"}])
    );
    assert_eq!(
        n.gpu_info().await,
        [0, 2, 3]
            .map(|i| info_line(i, &uuid(i), "Fake GPU"))
            .to_vec()
    );
    let mut w = warnings(&n.client, &n.ns).await;
    w.sort();
    assert_eq!(
        w,
        vec![
            ("GPUCountMismatch".to_string(), mismatch.to_string()),
            ("GPUResetRequired".to_string(), reset.to_string()),
        ]
    );
    // Reset: healthy again.
    n.fault("");
    wait_annotation(&n.client, &n.ns, "train-0", "trainlet.io/health", "ok").await;
    n.wait_count("4").await;
}

const A100: &str = "NVIDIA A100-SXM4-80GB";
const MIG_1G: &str = "NVIDIA A100-SXM4-80GB MIG 1g.10gb";

/// One A100 in MIG mode showing two 1g.10gb MIG devices to a container whose limit
/// is `nvidia.com/mig-1g.10gb: <limit>`.
async fn mig_sidecar(limit: &str) -> Nvml {
    sidecar(
        pod("train-0").limit("nvidia.com/mig-1g.10gb", limit),
        &[
            ("FAKE_NVML_COUNT", "1"),
            ("FAKE_NVML_NAMES", A100),
            ("FAKE_NVML_MIG", "2"),
        ],
        "",
    )
    .await
}

/// Two MIG devices against `nvidia.com/mig-1g.10gb: 2`: 2 of 2, ok, the devices are
/// the MIG devices with their `MIG-` UUIDs. Before, the limit was not an expectation
/// at all and the pod said 1 GPU (the parent).
#[tokio::test]
async fn mig_devices_are_counted_against_the_mig_limit() {
    let n = mig_sidecar("2").await;
    wait_annotation(&n.client, &n.ns, "train-0", "trainlet.io/health", "ok").await;
    let a = annotations(&n.client, &n.ns, "train-0").await;
    assert_eq!(a["trainlet.io/gpu-count"], "2");
    assert_eq!(a["trainlet.io/gpu-product"], MIG_1G);
    let report: Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["gpu"]["status"], "ok");
    assert_eq!(
        report["gpu"]["expected"],
        json!({"count": 2, "source": "resources.limits[\"nvidia.com/mig-1g.10gb\"]"})
    );
    assert_eq!(
        report["gpu"]["devices"],
        json!([
            {"index": 0, "uuid": "MIG-00000000-fake-0000-0000", "name": MIG_1G, "memory_total_bytes": 9728u64 << 20, "mig": 0},
            {"index": 0, "uuid": "MIG-00000000-fake-0000-0001", "name": MIG_1G, "memory_total_bytes": 9728u64 << 20, "mig": 1},
        ])
    );
    let text = n.r.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpus"), Some(2.0));
    assert_eq!(metric(&text, "trainlet_gpus_expected"), Some(2.0));
    assert_eq!(
        n.gpu_info().await,
        vec![
            info_line(0, "MIG-00000000-fake-0000-0000", MIG_1G),
            info_line(0, "MIG-00000000-fake-0000-0001", MIG_1G),
        ]
    );
    assert_eq!(warnings(&n.client, &n.ns).await, vec![]);
}

/// Two MIG devices against `nvidia.com/mig-1g.10gb: 3`: GPUCountMismatch.
#[tokio::test]
async fn fewer_mig_devices_than_the_mig_limit_is_a_mismatch() {
    let n = mig_sidecar("3").await;
    let note = wait_warning(&n.client, &n.ns, "GPUCountMismatch").await;
    assert_eq!(
        note,
        format!(
            "container trainer sees 2 GPUs ({MIG_1G}) but 3 are expected (resources.limits[\"nvidia.com/mig-1g.10gb\"])"
        )
    );
    wait_annotation(
        &n.client,
        &n.ns,
        "train-0",
        "trainlet.io/health",
        "degraded",
    )
    .await;
    let a = annotations(&n.client, &n.ns, "train-0").await;
    assert_eq!(a["trainlet.io/gpu-count"], "2");
    assert_eq!(
        metric(&n.r.metrics().await, "trainlet_gpus_expected"),
        Some(3.0)
    );
}
