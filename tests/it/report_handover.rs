//! One reporter per pod: `trainlet exec --report --observations DIR` in the training
//! container, with no API credentials at all, hands what it observes to the
//! `trainlet sidecar --observations DIR`, which is the pod's only writer. The fake NVML
//! shows 4 GPUs to exec and the sidecar has no NVML library, as in a real pod where
//! only the training container requests `nvidia.com/gpu`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::report_support::*;
use crate::support::*;

const NO_NVML: &str = "/nonexistent/libnvidia-ml.so.1";

/// The two directories of the shipped layout: the init container's files (read by
/// exec) and the observation handover (written by exec, read by the sidecar).
struct Layout {
    dir: tempfile::TempDir,
}

impl Layout {
    fn new() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("trainlet")).unwrap();
        std::fs::create_dir(dir.path().join("observed")).unwrap();
        std::fs::create_dir(dir.path().join("home")).unwrap();
        Layout { dir }
    }
    fn files(&self) -> PathBuf {
        self.dir.path().join("trainlet")
    }
    fn observed(&self) -> PathBuf {
        self.dir.path().join("observed")
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `trainlet exec --report --observations` as the training container runs it: no
    /// kubeconfig, no token, no home with a ~/.kube/config; 4 fake GPUs; `--interval
    /// 200ms` unless `extra` sets it.
    fn exec(&self, ns: &str, pod: &str, extra: &[&str], cmd: &[&str]) -> Command {
        let mut c = trainlet();
        c.args(["exec", "--report", "--observations"])
            .arg(self.observed())
            .arg("--output-dir")
            .arg(self.files())
            .args(["--pod-name", pod, "--pod-namespace", ns]);
        if !extra.contains(&"--interval") {
            c.args(["--interval", "200ms"]);
        }
        c.arg("--nvml-lib")
            .arg(fake_nvml())
            .args(extra)
            .arg("--")
            .args(cmd);
        c.env("HOME", self.dir.path().join("home"))
            .env("FAKE_NVML_COUNT", "4")
            .env("FAKE_NVML_NAMES", "Fake GPU");
        c
    }

    /// The sidecar, with no NVML library (no GPU of its own).
    fn sidecar(&self, kc: &Path, ns: &str, pod: &str, extra: &[&str]) -> Command {
        let observed = self.observed();
        let mut args = vec![
            "--observations",
            observed.to_str().unwrap(),
            "--nvml-lib",
            NO_NVML,
        ];
        args.extend(extra);
        sidecar_cmd(kc, ns, pod, &args)
    }
}

/// A namespace with trainlet's RBAC (its ServiceAccount's kubeconfig in the layout's
/// directory) and pod `train-0` of `spec`, running at 10.1.0.5.
async fn running(prefix: &str, spec: PodSpec) -> (kube::Client, Layout, String, PathBuf) {
    let client = admin().await;
    let l = Layout::new();
    let (ns, kc) = rbac_namespace(&client, prefix, l.root()).await;
    spec.create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    (client, l, ns, kc)
}

/// The field managers that own any `trainlet.io/` annotation of the pod, from its
/// managedFields: which of trainlet's agents wrote them, as the API server recorded.
async fn annotation_writers(client: &kube::Client, ns: &str, pod: &str) -> Vec<String> {
    let p: Pod = Api::namespaced(client.clone(), ns).get(pod).await.unwrap();
    let mut v: Vec<String> = p
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                f.0.pointer("/f:metadata/f:annotations")
                    .and_then(|a| a.as_object())
                    .is_some_and(|a| a.keys().any(|k| k.starts_with("f:trainlet.io/")))
            })
        })
        .filter_map(|m| m.manager)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A token of the trainlet ServiceAccount bound to a Secret: deleting the Secret
/// revokes it, as a projected token expires.
async fn bound_token(client: &kube::Client, ns: &str, secret: &str) -> String {
    let s: Secret = Api::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": secret}})).unwrap(),
        )
        .await
        .unwrap();
    let uid = s.metadata.uid.unwrap();
    sa_token(client, ns, "trainlet", Some(("Secret", secret, &uid))).await
}

/// A kubeconfig that reads its token from `token_file`, as the in-cluster config
/// reads the projected token: kube's client re-reads the file about once a minute.
fn token_file_kubeconfig(dir: &Path, ns: &str, token_file: &Path) -> PathBuf {
    user_kubeconfig(
        kubeconfig(),
        ns,
        &format!("tokenFile: {}", token_file.display()),
        &dir.join("rotating.kubeconfig"),
    )
}

/// Replaces the token file as the kubelet does: write beside, rename over.
fn rotate(token_file: &Path, token: &str) {
    let tmp = token_file.with_extension("new");
    std::fs::write(&tmp, token).unwrap();
    std::fs::rename(&tmp, token_file).unwrap();
}

/// The shipped layout for 60 s: exec sees 4 GPUs and opens and closes its port; the
/// sidecar sees none. The annotations say 4 and `ok` all along, only the sidecar ever
/// wrote them, and no Warning is emitted. Meanwhile the sidecar's projected token is
/// rotated and the old one revoked: it still publishes the XID that comes after.
#[tokio::test]
async fn the_shipped_layout_has_one_truthful_writer_for_60_seconds() {
    let port = free_port();
    let (client, l, ns, _kc) =
        running("handover", pod("train-0").gpus(4).port("tf", port as i32)).await;
    write_tf_config(&l.files(), port);
    let events = l.root().join("nvml-events");
    std::fs::write(&events, "").unwrap();
    // CMD listens on the task's port for 3 s, closes it, and goes on.
    let script = format!(
        "import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',{port}))\ns.listen()\ntime.sleep(3)\ns.close()\ntime.sleep(600)\n"
    );
    let mut exec_cmd = l.exec(&ns, "train-0", &[], &["python3", "-c", &script]);
    exec_cmd.env("FAKE_NVML_EVENTS", &events);
    let exec = Reporter::start(exec_cmd);

    let token_file = l.root().join("token");
    let token_a = bound_token(&client, &ns, "token-a").await;
    rotate(&token_file, &token_a);
    // Token A alone, in a file nobody rotates: to see that it is really revoked.
    let only_a = l.root().join("only-a");
    std::fs::create_dir(&only_a).unwrap();
    std::fs::write(only_a.join("token"), &token_a).unwrap();
    let kc_a = token_file_kubeconfig(&only_a, &ns, &only_a.join("token"));
    let kc = token_file_kubeconfig(l.root(), &ns, &token_file);
    // The sidecar starts after exec has handed over its first observation, as after
    // a sidecar restart.
    eventually(
        "exec's first observation",
        Duration::from_secs(20),
        || async { l.observed().join("exec.json").is_file().then_some(()) },
    )
    .await;
    let sidecar = Reporter::start(l.sidecar(&kc, &ns, "train-0", &["--interval", "1s"]));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/gpu-count", "4").await;
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    // The kubelet rotates the projected token long before the old one expires.
    rotate(&token_file, &bound_token(&client, &ns, "token-b").await);

    // Sampled for a minute, and once more after it, whatever the machine's load.
    let start = Instant::now();
    loop {
        let a = annotations(&client, &ns, "train-0").await;
        assert_eq!(
            a["trainlet.io/gpu-count"],
            "4",
            "after {:?}: {a:#?}",
            start.elapsed()
        );
        assert_eq!(
            a["trainlet.io/health"],
            "ok",
            "after {:?}: {a:#?}",
            start.elapsed()
        );
        assert_eq!(a["trainlet.io/gpu-product"], "Fake GPU");
        let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
        assert_eq!(report["mode"], "sidecar");
        assert_eq!(report["gpu"]["status"], "ok");
        assert_eq!(report["gpu"]["count"], 4);
        assert_eq!(report["reasons"], serde_json::json!([]));
        if start.elapsed() >= Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        warnings(&client, &ns).await,
        vec![],
        "no Warning on a healthy pod"
    );
    assert_eq!(
        annotation_writers(&client, &ns, "train-0").await,
        ["trainlet-sidecar"],
        "the API server recorded one writer of the trainlet.io/ annotations"
    );
    let text = sidecar.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpus"), Some(4.0));
    assert_eq!(metric(&text, "trainlet_gpus_expected"), Some(4.0));
    assert_eq!(metric(&text, "trainlet_health"), Some(1.0));
    assert!(
        metric(&text, "trainlet_observations_total").unwrap() >= 2.0,
        "{text}"
    );
    assert!(
        !text.contains("trainlet_observations_rejected_total{"),
        "{text}"
    );
    assert!(
        exec.stderr()
            .contains("handing observations to the trainlet sidecar"),
        "{}",
        exec.stderr()
    );
    assert!(!exec.stderr().contains("annotated"), "{}", exec.stderr());

    // The old token is revoked; the client has re-read the file by now.
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("token-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually("token A revoked", Duration::from_secs(20), || async {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc_a)
            .args(["get", "pod", "train-0", "-n", &ns])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr)
            .contains("Unauthorized")
            .then_some(())
    })
    .await;
    inject_xid(&events, "2 79\n");
    let note = wait_warning(&client, &ns, "GPUXidError").await;
    assert_eq!(
        note,
        "GPU 2 (GPU-00000000-fake-0002) reported XID 79 (GPU has fallen off the bus)"
    );
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "degraded").await;
    let text = sidecar.metrics().await;
    assert_eq!(
        metric(
            &text,
            "trainlet_gpu_xid_errors_total{gpu=\"2\",uuid=\"GPU-00000000-fake-0002\",xid=\"79\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "trainlet_api_errors_total"),
        Some(0.0),
        "{}",
        sidecar.stderr()
    );
}

/// Without exec's observations and without a GPU of its own, the sidecar cannot tell
/// the training container's GPU count: it says so, and warns of nothing.
#[tokio::test]
async fn a_sidecar_without_gpus_or_observations_says_the_count_is_unknown() {
    let (client, l, ns, kc) = running("unknown", pod("train-0").gpus(4)).await;
    let mut sidecar = Reporter::start(l.sidecar(&kc, &ns, "train-0", &[]));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/gpu-count", "unknown").await;
    let a = annotations(&client, &ns, "train-0").await;
    assert_eq!(a["trainlet.io/health"], "ok");
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["gpu"]["status"], "unknown");
    assert_eq!(
        report["gpu"]["unknown"],
        format!(
            "no observations from trainlet exec in {} yet, and this sidecar has no GPU of its own (NVML: unavailable: library {NO_NVML} not found ({NO_NVML}: cannot open shared object file: No such file or directory))",
            l.observed().display()
        )
    );
    let text = sidecar.metrics().await;
    assert_eq!(metric(&text, "trainlet_gpus"), Some(-1.0));
    assert_eq!(metric(&text, "trainlet_health"), Some(1.0));
    // No Event, once the sidecar has stopped and sent everything it held.
    assert_eq!(sidecar.terminate().0, 0);
    assert_eq!(warnings(&client, &ns).await, vec![]);
}

/// The training container is less trusted than the sidecar: garbage, a giant, a
/// symlink to the sidecar's secrets and a FIFO are rejected, counted by reason, and
/// never reach the annotations; the sidecar lives on with the last good observation.
#[tokio::test]
async fn bad_observations_are_rejected_counted_and_never_published() {
    let (client, l, ns, kc) = running("badobs", pod("train-0").gpus(2)).await;
    let file = l.observed().join("exec.json");
    // The format as documented, written by hand: 2 GPUs, rewritten every hour.
    let good = r#"{"version":1,"epoch":"42-1763800000000","interval_ms":3600000,"gpu":{"driver":"550.54.15","devices":[{"index":0,"uuid":"GPU-a","name":"Fake GPU","memory_total_bytes":1},{"index":1,"uuid":"GPU-b","name":"Fake GPU","memory_total_bytes":1}],"seen":2}}"#;
    std::fs::write(&file, good).unwrap();
    let mut sidecar = Reporter::start(l.sidecar(&kc, &ns, "train-0", &[]));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/gpu-count", "2").await;
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    let before = annotations(&client, &ns, "train-0").await;

    let secret = l.root().join("token");
    std::fs::write(&secret, "eyJhbGciOi.secret").unwrap();
    let put = |f: &dyn Fn()| {
        let _ = std::fs::remove_file(&file);
        f();
    };
    let rejected =
        |reason: &str| format!("trainlet_observations_rejected_total{{reason=\"{reason}\"}}");
    type Write<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Write)> = vec![
        (
            "malformed",
            Box::new(|| std::fs::write(&file, b"\x00\xff{{{").unwrap()),
        ),
        (
            "invalid",
            Box::new(|| std::fs::write(&file, good.replace("Fake GPU", "Fake\\u0007GPU")).unwrap()),
        ),
        (
            "too-large",
            Box::new(|| std::fs::write(&file, vec![b' '; 70 * 1024]).unwrap()),
        ),
        (
            "not-a-file",
            Box::new(|| std::os::unix::fs::symlink(&secret, &file).unwrap()),
        ),
    ];
    for (reason, write) in &cases {
        put(write.as_ref());
        eventually(
            &format!("a rejection for {reason}"),
            Duration::from_secs(20),
            || async {
                let text = sidecar.metrics().await;
                (metric(&text, &rejected(reason)) >= Some(1.0)).then_some(())
            },
        )
        .await;
    }
    put(&|| {
        assert!(
            Command::new("mkfifo")
                .arg(&file)
                .status()
                .unwrap()
                .success()
        )
    });
    // Read and rejected, not waited on: a FIFO is no file either.
    eventually(
        "a second rejection as not-a-file, the FIFO",
        Duration::from_secs(20),
        || async {
            let text = sidecar.metrics().await;
            (metric(&text, &rejected("not-a-file")) >= Some(2.0)).then_some(())
        },
    )
    .await;
    assert!(sidecar.alive(), "{}", sidecar.stderr());
    assert_eq!(annotations(&client, &ns, "train-0").await, before);
    let log = sidecar.stderr();
    assert!(
        !log.contains("eyJhbGciOi"),
        "the secret must not reach the log:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "rejected an observation from the training container: {} is larger than 65536 bytes; keeping the last good one",
            file.display()
        )),
        "{log}"
    );
    assert_eq!(sidecar.terminate().0, 0);
    assert_eq!(warnings(&client, &ns).await, vec![]);
}

/// Either side restarts while the other runs: nothing is announced twice, and the
/// report is right again within an interval.
///
/// exec probes only at its start (`--interval 10m`): its probe sees the GPUs' loss
/// too, and whichever of the probe and NVML's event thread tells first gives the Event
/// its note (the probe's is "saw 4 GPUs and now sees 0"); the one asserted is the
/// event thread's.
#[tokio::test]
async fn restarts_of_either_side_lose_nothing_and_repeat_nothing() {
    let (client, l, ns, kc) = running("restarts", pod("train-0").gpus(4)).await;
    write_tf_config(&l.files(), free_port());
    let events = l.root().join("nvml-events");
    std::fs::write(&events, "").unwrap();
    let lost = l.root().join("nvml-lost");
    let start_exec = || {
        let mut c = l.exec(&ns, "train-0", &["--interval", "10m"], &["sleep", "600"]);
        c.env("FAKE_NVML_EVENTS", &events)
            .env("FAKE_NVML_LOST", &lost);
        Reporter::start(c)
    };
    let mut exec = start_exec();
    let sidecar = Reporter::start(l.sidecar(&kc, &ns, "train-0", &[]));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/gpu-count", "4").await;
    inject_xid(&events, "1 48\n");
    wait_warning(&client, &ns, "GPUXidError").await;
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "degraded").await;
    let series =
        "trainlet_gpu_xid_errors_total{gpu=\"1\",uuid=\"GPU-00000000-fake-0001\",xid=\"48\"}";

    // The sidecar is killed and comes back: nothing announced again, the count goes on.
    drop(sidecar);
    let mut sidecar = Reporter::start(l.sidecar(&kc, &ns, "train-0", &[]));
    eventually(
        "the new sidecar's first read",
        Duration::from_secs(20),
        || async {
            let text = sidecar.metrics().await;
            (metric(&text, "trainlet_observations_total") >= Some(1.0)).then_some(())
        },
    )
    .await;
    assert_eq!(metric(&sidecar.metrics().await, series), Some(1.0));
    inject_xid(&events, "1 48\n");
    eventually("the second XID 48", Duration::from_secs(20), || async {
        (metric(&sidecar.metrics().await, series) == Some(2.0)).then_some(())
    })
    .await;
    // The Event may trail the metric on a loaded machine. That no third one comes is
    // checked at the end, once the sidecar has sent everything it holds.
    eventually(
        "the second GPUXidError Event",
        Duration::from_secs(20),
        || async { (count_warnings(&client, &ns, "GPUXidError").await >= 2).then_some(()) },
    )
    .await;
    let a = annotations(&client, &ns, "train-0").await;
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["gpu"]["xid_errors"][0]["count"], 2, "{report}");
    assert_eq!(a["trainlet.io/gpu-count"], "4");

    // exec restarts (a new epoch; NVML does not replay old events to a new process).
    assert_eq!(exec.terminate().0, 143);
    std::fs::write(&events, "").unwrap();
    let exec2 = start_exec();
    eventually("the new epoch", Duration::from_secs(20), || async {
        let a = annotations(&client, &ns, "train-0").await;
        let r: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).ok()?;
        let epoch = r["exec"]["epoch"].as_str()?.to_string();
        epoch
            .starts_with(&format!("{}-", exec2.pid()))
            .then_some(())
    })
    .await;
    assert_eq!(metric(&sidecar.metrics().await, series), Some(2.0));
    assert_eq!(
        annotations(&client, &ns, "train-0").await["trainlet.io/gpu-count"],
        "4"
    );

    // The training container loses its GPUs: the sidecar announces it, once.
    std::fs::write(&lost, "").unwrap();
    let note = wait_warning(&client, &ns, "GPULost").await;
    assert_eq!(
        note,
        "container trainer lost its GPUs: NVML reports the GPU is lost"
    );
    // Stopped, the sidecar sends what it still holds: then every Event it decided on
    // is out. Nothing was announced twice, across both restarts.
    assert_eq!(sidecar.terminate().0, 0, "{}", sidecar.stderr());
    let xid = "GPU 1 (GPU-00000000-fake-0001) reported XID 48 (double-bit ECC error)";
    let mut said = warnings(&client, &ns).await;
    said.retain(|(r, _)| r == "GPULost" || r == "GPUXidError");
    assert_eq!(
        said,
        [
            ("GPULost".to_string(), note.clone()),
            ("GPUXidError".to_string(), xid.to_string()),
            ("GPUXidError".to_string(), xid.to_string()),
        ]
    );
    let report: serde_json::Value =
        serde_json::from_str(&annotations(&client, &ns, "train-0").await["trainlet.io/report"])
            .unwrap();
    assert_eq!(report["gpu"]["lost"], note, "{report}");
}

/// CMD's child is OOM-killed in a training container without a token: the sidecar
/// announces it, once, and exec's termination message says why CMD ended.
#[tokio::test]
async fn an_oom_kill_without_a_token_is_published_by_the_sidecar() {
    let limit: u64 = 96 << 20;
    let cg = require!(MemCgroup::new(limit));
    let (client, l, ns, kc) = running("oomhand", pod("train-0")).await;
    write_tf_config(&l.files(), free_port());
    let pidfile = l.root().join("memhog.pid");
    let script = format!(
        "sleep 1; {} 10 & echo $! > {}; wait $!; sleep 2; exit 3",
        memhog().display(),
        pidfile.display()
    );
    let termination = l.root().join("termination-log");
    std::fs::write(&termination, "").unwrap();
    let mut cmd = l.exec(&ns, "train-0", &[], &["/bin/sh", "-c", &script]);
    cmd.env("TRAINLET_TERMINATION_LOG", &termination);
    let mut exec = Reporter::start(cg.wrap(&cmd));
    let sidecar = Reporter::start(l.sidecar(&kc, &ns, "train-0", &[]));

    let note = wait_warning(&client, &ns, "OOMKill").await;
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    assert_eq!(
        note,
        format!(
            "process memhog (pid {}) in container trainer was OOM-killed; memory limit 96Mi",
            pid.trim()
        )
    );
    wait_annotation(&client, &ns, "train-0", "trainlet.io/oom-kills", "1").await;
    let a = annotations(&client, &ns, "train-0").await;
    assert_eq!(a["trainlet.io/health"], "degraded");
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(report["mode"], "sidecar");
    assert_eq!(report["oom"]["recent"][0]["process"]["comm"], "memhog");
    assert_eq!(report["exec"]["kills"], 1);
    let (code, _) = exec.wait(Duration::from_secs(30));
    assert_eq!(code, 3, "{}", exec.stderr());
    assert_eq!(
        std::fs::read_to_string(&termination).unwrap(),
        format!(
            "/bin/sh exited with code 3; process memhog (pid {}) was OOM-killed; memory limit 96Mi",
            pid.trim()
        )
    );
    // The sidecar read exec's last observation (written before it exited) and probed
    // twice since.
    sidecar.probed(2.0).await;
    assert_eq!(
        warnings(&client, &ns).await,
        vec![("OOMKill".to_string(), note)],
        "one kill, one Event"
    );
    assert_eq!(
        annotation_writers(&client, &ns, "train-0").await,
        ["trainlet-sidecar"]
    );
}

/// A hostile training container writes a new, valid observation every 100 ms for 20 s:
/// a new epoch each time (so every kill is new again), 20 kills, 200 XIDs of GPUs with
/// fresh UUIDs, and a restart count that only grows. What that may cost the sidecar
/// and the API server is bounded: at most 64 XID series (the rest in `other`), patches
/// hurried 5 times and then once per 10 s, Events within their budget, a log that
/// says a drop once, and no restart counted that the sidecar never asked for.
#[tokio::test]
async fn a_hostile_training_container_costs_a_bounded_sidecar() {
    let (client, l, ns, kc) = running("hostile", pod("train-0").gpus(2)).await;
    // The default patch interval (the tests' other sidecars use 1 s).
    let mut sidecar =
        Reporter::start(l.sidecar(&kc, &ns, "train-0", &["--min-patch-interval", "10s"]));
    let dir = l.observed();
    let write = |v: u64| {
        let xids: Vec<serde_json::Value> = (0..200)
            .map(|i| {
                serde_json::json!({"error": {"gpu": i % 8, "uuid": format!("GPU-{v:08x}-{i:04x}"), "xid": 79}, "count": 1})
            })
            .collect();
        let kills: Vec<serde_json::Value> = (1..=20)
            .map(|seq| serde_json::json!({"seq": seq, "time": "2026-11-23T10:00:00Z", "process": {"pid": seq, "comm": "memhog"}}))
            .collect();
        let o = serde_json::json!({
            "version": 1,
            "epoch": format!("{v}-1763800000000"),
            "interval_ms": 1000,
            "gpu": {"devices": [], "seen": 0},
            "xids": xids,
            "kills": kills,
            "restart": {"restarts": v as u32 + 1, "note": format!("restarting sh ({v})"), "waiting": false},
        });
        let tmp = dir.join(".exec.json.tmp");
        std::fs::write(&tmp, o.to_string()).unwrap();
        std::fs::rename(&tmp, dir.join("exec.json")).unwrap();
    };
    write(0);
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "degraded").await;
    let before = metric(
        &sidecar.metrics().await,
        "trainlet_annotation_patches_total",
    )
    .unwrap();
    let start = Instant::now();
    let mut v = 1;
    while start.elapsed() < Duration::from_secs(20) {
        write(v);
        v += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sidecar.probed(2.0).await;
    assert!(sidecar.alive(), "{}", sidecar.stderr());
    let text = sidecar.metrics().await;
    let xid_series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("trainlet_gpu_xid_errors_total{"))
        .collect();
    assert_eq!(xid_series.len(), 65, "{xid_series:?}");
    // Every XID of every version the sidecar read is counted: the first 64 pairs on
    // their own, the rest together. (Under load it may skip versions written between
    // two reads; it counts what it read.)
    let read = metric(&text, "trainlet_observations_total").unwrap();
    assert_eq!(
        metric(
            &text,
            "trainlet_gpu_xid_errors_total{gpu=\"other\",uuid=\"other\",xid=\"other\"}"
        ),
        Some(200.0 * read - 64.0),
        "{read} versions read of {v}"
    );
    let patches = metric(&text, "trainlet_annotation_patches_total").unwrap() - before;
    // Hurried 5 times, then once per 10 s (twice in 20 s), plus the patch interval's.
    assert!(
        patches <= 10.0,
        "{patches} patches in 20 s: {}",
        sidecar
            .stderr()
            .lines()
            .filter(|l| l.contains("annotated"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let warnings = warnings(&client, &ns).await.len();
    assert!(warnings <= 10 + 4 + 2, "{warnings} Events");
    assert!(metric(&text, "trainlet_events_dropped_total{reason=\"OOMKill\"}") > Some(100.0));
    assert_eq!(metric(&text, "trainlet_restarts_total"), Some(0.0));
    assert!(
        metric(
            &text,
            "trainlet_observations_rejected_total{reason=\"restart-unexplained\"}"
        ) >= Some(1.0)
    );
    assert_eq!(count_warnings(&client, &ns, "Restarting").await, 0);
    let log = sidecar.stderr();
    assert!(log.len() < 64 * 1024, "{} bytes of log", log.len());
    // A drop is said once per reason in the minute (OOMKill, GPUXidError, and the
    // GPUCountMismatch of the first observations, if its Event is dropped too).
    let mut said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("too many Events; dropping this one"))
        .filter_map(|l| l.split("reason=").nth(1)?.split_whitespace().next())
        .collect();
    let n = said.len();
    said.sort_unstable();
    said.dedup();
    assert_eq!(said.len(), n, "{said:?}");
    assert!(
        said.contains(&"\"OOMKill\"") && said.contains(&"\"GPUXidError\""),
        "{said:?}"
    );
}
