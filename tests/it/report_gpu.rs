//! GPU reporting against the fake NVML (the only fake in these tests), the real API
//! server, and the trainlet ServiceAccount's RBAC: `trainlet gpus`, then the sidecar's
//! annotations and Events for 4 of 4 GPUs, 4 of 8, and no NVML at all. Also the patch
//! economy of a steady pod, the admin endpoints, bad flags, and SIGTERM.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use crate::report_support::*;
use crate::support::*;

fn gpus_cmd(lib: &str) -> std::process::Command {
    let mut cmd = trainlet();
    cmd.args(["gpus", "--nvml-lib", lib]);
    cmd
}

#[test]
fn gpus_prints_the_fake_devices_as_json() {
    let mut cmd = gpus_cmd(fake_nvml().to_str().unwrap());
    cmd.env("FAKE_NVML_COUNT", "2")
        .env("FAKE_NVML_NAMES", "NVIDIA A100-SXM4-80GB")
        .env("FAKE_NVML_UUIDS", "GPU-aaaa,GPU-bbbb")
        .env("FAKE_NVML_MEMORY_MIB", "81920");
    let r = run(&mut cmd);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "{\"GPU\":2,\"devices\":[\
{\"index\":0,\"uuid\":\"GPU-aaaa\",\"name\":\"NVIDIA A100-SXM4-80GB\",\"memory_total_bytes\":85899345920},\
{\"index\":1,\"uuid\":\"GPU-bbbb\",\"name\":\"NVIDIA A100-SXM4-80GB\",\"memory_total_bytes\":85899345920}\
],\"driver_version\":\"550.54.15\",\"nvml\":\"ok\"}\n"
    );
}

#[test]
fn gpus_without_nvml_exits_0_and_says_why() {
    let r = run(&mut gpus_cmd("/nonexistent/libnvidia-ml.so.1"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "{\"GPU\":0,\"devices\":[],\"driver_version\":null,\"nvml\":\"unavailable: library /nonexistent/libnvidia-ml.so.1 not found (/nonexistent/libnvidia-ml.so.1: cannot open shared object file: No such file or directory)\"}\n"
    );

    let mut failing = gpus_cmd(fake_nvml().to_str().unwrap());
    failing.env("FAKE_NVML_INIT_FAIL", "9");
    let r = run(&mut failing);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "{\"GPU\":0,\"devices\":[],\"driver_version\":null,\"nvml\":\"unavailable: init failed: NVIDIA driver is not loaded\"}\n"
    );
}

/// A pod with `gpus` GPUs in its limit, running; the sidecar against it with four
/// fake GPUs (or `lib`).
async fn sidecar_with_gpus(
    limit: u32,
    lib: &str,
) -> (kube::Client, String, Reporter, tempfile::TempDir) {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "gpu", dir.path()).await;
    pod("train-0").gpus(limit).create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    let mut cmd = sidecar_cmd(&kc, &ns, "train-0", &["--nvml-lib", lib]);
    cmd.env("FAKE_NVML_COUNT", "4")
        .env("FAKE_NVML_NAMES", "Fake GPU");
    (client, ns, Reporter::start(cmd), dir)
}

#[tokio::test]
async fn four_gpus_with_a_limit_of_four_is_ok() {
    let (client, ns, mut r, _dir) = sidecar_with_gpus(4, fake_nvml().to_str().unwrap()).await;
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    let a = annotations(&client, &ns, "train-0").await;
    assert_eq!(a["trainlet.io/gpu-count"], "4");
    assert_eq!(a["trainlet.io/gpu-product"], "Fake GPU");
    assert_eq!(a["trainlet.io/oom-kills"], "0");
    assert!(!a.contains_key("trainlet.io/port-conflict"), "{a:?}");
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["health"], "ok");
    assert_eq!(report["reasons"], serde_json::json!([]));
    assert_eq!(report["mode"], "sidecar");
    assert_eq!(report["container"], "trainer");
    assert_eq!(report["gpu"]["status"], "ok");
    assert_eq!(report["gpu"]["driver"], "550.54.15");
    assert_eq!(
        report["gpu"]["expected"],
        serde_json::json!({"count": 4, "source": "resources.limits[\"nvidia.com/gpu\"]"})
    );
    assert_eq!(
        report["gpu"]["devices"][3],
        serde_json::json!({"index": 3, "uuid": "GPU-00000000-fake-0003", "name": "Fake GPU", "memory_total_bytes": 17179869184u64})
    );
    assert!(a["trainlet.io/report"].len() <= 16 * 1024);
    assert_eq!(warnings(&client, &ns).await, vec![]);

    r.wait_ready().await;
    let text = r.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpus"), Some(4.0));
    assert_eq!(metric(&text, "trainlet_gpus_expected"), Some(4.0));
    assert_eq!(metric(&text, "trainlet_health"), Some(1.0));
    // A family's series come in no particular order.
    let mut info: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("trainlet_gpu_info{"))
        .collect();
    info.sort();
    assert_eq!(
        info,
        (0..4)
            .map(|i| format!(
                "trainlet_gpu_info{{gpu=\"{i}\",uuid=\"GPU-00000000-fake-000{i}\",model=\"Fake GPU\"}} 1"
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        metric(&text, "trainlet_oom_kills_total{container=\"trainer\"}"),
        Some(0.0)
    );
    let (livez, _, _) = http_get(&r.metrics_addr, "/livez").unwrap();
    assert_eq!(livez, 200);
    assert_eq!(r.terminate().0, 0, "{}", r.stderr());
}

#[tokio::test]
async fn four_gpus_with_a_limit_of_eight_is_a_mismatch() {
    let (client, ns, mut r, _dir) = sidecar_with_gpus(8, fake_nvml().to_str().unwrap()).await;
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "degraded").await;
    let note = wait_warning(&client, &ns, "GPUCountMismatch").await;
    assert_eq!(
        note,
        "container trainer sees 4 GPUs (Fake GPU) but 8 are expected (resources.limits[\"nvidia.com/gpu\"])"
    );
    let a = annotations(&client, &ns, "train-0").await;
    assert_eq!(a["trainlet.io/gpu-count"], "4");
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["gpu"]["status"], "mismatch");
    assert_eq!(report["reasons"], serde_json::json!([note]));
    let text = r.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpus_expected"), Some(8.0));
    assert_eq!(metric(&text, "trainlet_health"), Some(0.0));
    // On the transition only: one Event however many probes ran, counted once the
    // sidecar has stopped and sent everything it held.
    assert_eq!(r.terminate().0, 0);
    assert_eq!(
        warnings(&client, &ns).await,
        vec![("GPUCountMismatch".to_string(), note)]
    );
}

/// exec in the training container, reporting on its own (no sidecar): NVML missing
/// where a GPU is expected is its own view, so it is GPUUnavailable. (A sidecar
/// without GPUs says `unknown` instead: report_handover.rs.)
#[tokio::test]
async fn exec_without_nvml_and_a_limit_of_one_is_unavailable() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "gpu", dir.path()).await;
    pod("train-0").gpus(1).create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    write_tf_config(dir.path(), free_port());
    let lib = "/nonexistent/libnvidia-ml.so.1";
    let mut r = Reporter::start(exec_cmd(
        &kc,
        &ns,
        "train-0",
        dir.path(),
        &["--nvml-lib", lib, "--", "sleep", "60"],
    ));
    let note = wait_warning(&client, &ns, "GPUUnavailable").await;
    assert_eq!(
        note,
        "container trainer expects 1 GPU (resources.limits[\"nvidia.com/gpu\"]) but NVML is unavailable: library /nonexistent/libnvidia-ml.so.1 not found (/nonexistent/libnvidia-ml.so.1: cannot open shared object file: No such file or directory)"
    );
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "degraded").await;
    let a = annotations(&client, &ns, "train-0").await;
    assert_eq!(a["trainlet.io/gpu-count"], "0");
    assert!(!a.contains_key("trainlet.io/gpu-product"));
    assert_eq!(r.terminate().0, 143);
}

/// A steady pod costs no patch once its report is out. Probes run every 100 ms and the
/// patch interval is 100 ms, so any churn in the report would show. The first report
/// waits up to 1 s for NVML's XID registration; on a busy machine registration can
/// take longer, and its end is a second patch: the window starts once it is done.
#[tokio::test]
async fn a_steady_pod_gets_no_patch_once_its_report_is_out() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "steady", dir.path()).await;
    pod("train-0")
        .gpus(2)
        .port("tf", 2222)
        .create(&client, &ns)
        .await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    let mut cmd = sidecar_cmd(
        &kc,
        &ns,
        "train-0",
        &[
            "--nvml-lib",
            fake_nvml().to_str().unwrap(),
            "--interval",
            "100ms",
            "--min-patch-interval",
            "100ms",
        ],
    );
    cmd.env("FAKE_NVML_COUNT", "2");
    let mut r = Reporter::start(cmd);
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    r.wait_ready().await;
    eventually(
        "the published report to say both GPUs' XIDs are watched",
        Duration::from_secs(30),
        || async {
            let a = annotations(&client, &ns, "train-0").await;
            let report: serde_json::Value =
                serde_json::from_str(a.get("trainlet.io/report")?).ok()?;
            (report["gpu"]["xid_watch"]["watched"] == serde_json::json!([0, 1])).then_some(())
        },
    )
    .await;
    // The loop that sent that patch (and counted it) has moved on.
    r.probed(2.0).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let rv = api.get("train-0").await.unwrap().metadata.resource_version;
    let before = metric(&r.metrics().await, "trainlet_annotation_patches_total").unwrap();
    // 20 probes of 100 ms later.
    r.probed(20.0).await;
    let text = r.metrics().await;
    assert_eq!(
        metric(&text, "trainlet_annotation_patches_total"),
        Some(before),
        "{text}"
    );
    assert_eq!(metric(&text, "trainlet_api_errors_total"), Some(0.0));
    assert_eq!(
        api.get("train-0").await.unwrap().metadata.resource_version,
        rv,
        "the pod must not change in a steady state"
    );
    assert_eq!(r.terminate().0, 0);
    let log = r.stderr();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("annotated the pod"))
            .count() as f64,
        before,
        "{log}"
    );
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    for (flags, want) in [
        (
            vec!["--interval", "soon"],
            "invalid --interval \"soon\": expected number at 0 (use e.g. 30s, 10m or 1h)",
        ),
        (
            vec!["--interval", "10ms"],
            "invalid --interval \"10ms\": use at least 100ms, e.g. 5s",
        ),
        (
            vec!["--metrics-addr", "localhost"],
            "invalid --metrics-addr \"localhost\": use HOST:PORT such as 0.0.0.0:9464, or `off`",
        ),
        (
            vec!["--cgroup-root", "/nonexistent"],
            "invalid --cgroup-root /nonexistent: not a directory (mount the node's /sys/fs/cgroup there read-only)",
        ),
        (
            vec!["--port", "0"],
            "invalid --port 0: give the container port to watch, e.g. 8470",
        ),
    ] {
        let r = run(trainlet().arg("sidecar").args(&flags));
        assert_eq!(r.code, 2, "{flags:?}: {}", r.stderr);
        assert_eq!(r.error_line(), want, "{flags:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{flags:?}: {}", r.stderr);
    }
    let r = run(trainlet().args(["sidecar", "--expect-gpus", "many"]));
    assert_eq!(r.code, 2);
    assert!(
        r.error_line()
            .starts_with("invalid value 'many' for '--expect-gpus <N>'"),
        "{}",
        r.stderr
    );
}

#[test]
fn help_documents_every_reporter_flag() {
    let r = run(trainlet().args(["sidecar", "--help"]));
    assert_eq!(r.code, 0);
    for flag in [
        "--nvml-lib",
        "--expect-gpus",
        "--container",
        "--interval",
        "--min-patch-interval",
        "--metrics-addr",
        "--port",
        "--cgroup-root",
        "--exit-with-main",
        "[env: TRAINLET_CGROUP_ROOT=]",
    ] {
        assert!(r.stdout.contains(flag), "missing {flag} in\n{}", r.stdout);
    }
}

/// XID errors through NVML's event API: each injected XID 79 is one GPUXidError
/// Warning Event naming the GPU, its UUID and what 79 means, one count on
/// `trainlet_gpu_xid_errors_total`, and `degraded`. Then the GPUs are lost: one
/// GPULost Event, with the note of NVML's event thread.
///
/// The sidecar probes only at its start (`--interval 10m`): a probe sees the loss
/// too, and whichever tells first gives the Event its note; at `--interval 200ms` the
/// probe told first in 1 run in 30 under load ("saw 4 GPUs and now sees 0", the note
/// report_nvml::gpus_nvml_stops_answering_for_are_lost_not_unknown asserts).
#[tokio::test]
async fn xid_errors_are_counted_and_a_lost_gpu_is_announced() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "xid", dir.path()).await;
    pod("train-0").gpus(4).create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.6").await;
    let events = dir.path().join("nvml-events");
    let lost = dir.path().join("nvml-lost");
    std::fs::write(&events, "").unwrap();
    let lib = fake_nvml();
    let mut cmd = sidecar_cmd(
        &kc,
        &ns,
        "train-0",
        &["--nvml-lib", lib.to_str().unwrap(), "--interval", "10m"],
    );
    cmd.env("FAKE_NVML_COUNT", "4")
        .env("FAKE_NVML_NAMES", "Fake GPU")
        .env("FAKE_NVML_EVENTS", &events)
        .env("FAKE_NVML_LOST", &lost);
    let mut r = Reporter::start(cmd);
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    r.wait_ready().await;
    // NVML's event set sees only what happens after registration.
    eventually("the 4 GPUs registered", Duration::from_secs(20), || async {
        (metric(&r.metrics().await, "trainlet_gpu_xid_watched") == Some(4.0)).then_some(())
    })
    .await;

    let series =
        "trainlet_gpu_xid_errors_total{gpu=\"2\",uuid=\"GPU-00000000-fake-0002\",xid=\"79\"}";
    let note = "GPU 2 (GPU-00000000-fake-0002) reported XID 79 (GPU has fallen off the bus)";
    inject_xid(&events, "2 79\n");
    assert_eq!(wait_warning(&client, &ns, "GPUXidError").await, note);
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "degraded").await;
    assert_eq!(metric(&r.metrics().await, series), Some(1.0));
    let report: serde_json::Value =
        serde_json::from_str(&annotations(&client, &ns, "train-0").await["trainlet.io/report"])
            .unwrap();
    assert_eq!(report["reasons"], serde_json::json!([note]));

    inject_xid(&events, "2 79\n");
    eventually("the second XID 79", Duration::from_secs(20), || async {
        (metric(&r.metrics().await, series) == Some(2.0)).then_some(())
    })
    .await;
    eventually(
        "two GPUXidError Events",
        Duration::from_secs(20),
        || async {
            let n = warnings(&client, &ns)
                .await
                .iter()
                .filter(|(r, n)| r == "GPUXidError" && n == note)
                .count();
            (n == 2).then_some(())
        },
    )
    .await;

    std::fs::write(&lost, "").unwrap();
    let lost_note = wait_warning(&client, &ns, "GPULost").await;
    let lost_note_want = "container trainer lost its GPUs: NVML reports the GPU is lost";
    assert_eq!(lost_note, lost_note_want);
    // Stopped, the sidecar sends what it still holds: then every Event it decided on
    // is out, and there is exactly one of each.
    assert_eq!(r.terminate().0, 0, "{}", r.stderr());
    let mut said = warnings(&client, &ns).await;
    said.retain(|(r, _)| r == "GPULost" || r == "GPUXidError");
    assert_eq!(
        said,
        [
            ("GPULost".to_string(), lost_note_want.to_string()),
            ("GPUXidError".to_string(), note.to_string()),
            ("GPUXidError".to_string(), note.to_string()),
        ]
    );
}
