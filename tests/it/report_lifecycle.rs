//! The reporters' lifecycle: a classic sidecar that exits with the training container
//! (`--exit-with-main`), a sidecar without RBAC rights that fails fast naming the
//! missing verb, `exec --report` with a command that does not exist, and the cost of a
//! sidecar at rest.

use std::time::Duration;

use serde_json::json;

use crate::report_support::*;
use crate::support::{self, *};

#[tokio::test]
async fn exit_with_main_ends_a_classic_sidecar_when_the_job_is_done() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "exitmain", dir.path()).await;
    pod("train-0").create(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    kubelet.run("train-0", "10.1.0.5").await;
    let mut r = Reporter::start(sidecar_cmd(&kc, &ns, "train-0", &["--exit-with-main"]));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    assert!(r.alive());
    // The training container finishes (restartPolicy Never): the sidecar exits 0.
    kubelet
        .status(
            "train-0",
            json!({"containerStatuses": [{
                "name": "trainer", "image": "registry.example/train:1", "imageID": "",
                "ready": false, "restartCount": 0, "started": false,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now(), "finishedAt": now()}}
            }]}),
        )
        .await;
    let (code, _) = r.wait(Duration::from_secs(10));
    assert_eq!(code, 0, "{}", r.stderr());
    assert!(
        r.stderr()
            .contains("the training container has terminated; exiting (--exit-with-main)"),
        "{}",
        r.stderr()
    );
}

#[tokio::test]
async fn a_sidecar_without_rbac_exits_4_naming_the_verb() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let ns = namespace(&client, "norbac").await;
    pod("train-0").create(&client, &ns).await;
    // The default ServiceAccount exists but has no Role.
    let kc = sa_kubeconfig(&client, &ns, "default", dir.path()).await;
    let r = run(&mut sidecar_cmd(
        &kc,
        &ns,
        "train-0",
        &["--metrics-addr", "off"],
    ));
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!(
            "forbidden: cannot get pods in namespace \"{ns}\": the Role bound to ServiceAccount {ns}:default lacks verb \"get\" on \"pods\"; apply manifests/rbac.yaml (pods \"train-0\" is forbidden: User \"system:serviceaccount:{ns}:default\" cannot get resource \"pods\" in API group \"\" in the namespace \"{ns}\")"
        ),
        "{}",
        r.stderr
    );
}

#[tokio::test]
async fn exec_report_with_a_missing_command_exits_127() {
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    let r = run(trainlet()
        .args(["exec", "--report", "--metrics-addr", "off", "--output-dir"])
        .arg(dir.path())
        .args(["--", "/nonexistent/train.py"]));
    assert_eq!(r.code, 127, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        "cannot run \"/nonexistent/train.py\": No such file or directory (os error 2)"
    );
}

/// Outside a pod (no identity, no kubeconfig) exec mode still runs CMD and reports
/// through /metrics; CMD's exit code comes back.
#[tokio::test]
async fn exec_report_outside_a_pod_runs_the_command_anyway() {
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    // CMD runs until the test has looked at the metrics, however slow exec's start.
    let release = dir.path().join("release");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit 42",
        release.display()
    );
    let mut cmd = trainlet();
    cmd.args(["exec", "--report", "--output-dir"])
        .arg(dir.path())
        .args(["--", "sh", "-c", &script])
        .env("KUBECONFIG", "/nonexistent/kubeconfig");
    let mut r = Reporter::start(cmd);
    r.wait_ready().await;
    let text = r.metrics().await;
    assert_eq!(metric(&text, "trainlet_health"), Some(1.0));
    assert_eq!(
        metric(&text, "trainlet_oom_kills_total{container=\"main\"}"),
        Some(0.0)
    );
    std::fs::write(&release, "").unwrap();
    assert_eq!(r.wait(Duration::from_secs(10)).0, 42, "{}", r.stderr());
    assert!(
        r.stderr().contains("reporting to the pod is off"),
        "{}",
        r.stderr()
    );
}

/// The kubelet stops the container: exec forwards SIGTERM to CMD, and once CMD has
/// ended, nothing of its tree outlives exec, not even a grandchild that ignores SIGTERM
/// (it gets SIGTERM, then SIGKILL after --restart-grace).
#[tokio::test]
async fn a_stopped_exec_leaves_no_process_of_cmd_behind() {
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    let pidfile = dir.path().join("stubborn.pid");
    let script = format!(
        "sh -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 1; done' & wait",
        pidfile.display()
    );
    let mut cmd = trainlet();
    cmd.args(["exec", "--report", "--restart-grace", "1s", "--output-dir"])
        .arg(dir.path())
        .args(["--", "sh", "-c", &script])
        .env("KUBECONFIG", "/nonexistent/kubeconfig");
    let mut r = Reporter::start(cmd);
    let pid: i32 = eventually("the grandchild's pid", Duration::from_secs(10), || async {
        std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
    })
    .await;
    let (code, _) = r.terminate();
    // sh ends on SIGTERM at once; the stubborn grandchild gets SIGKILL after 1 s.
    assert_eq!(code, 143, "{}", r.stderr());
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    assert!(!alive, "pid {pid} outlived exec: {}", r.stderr());
    assert!(
        r.stderr()
            .contains("the command did not stop within --restart-grace 1s; sending SIGKILL"),
        "{}",
        r.stderr()
    );
}

/// A sidecar killed while it moved the cluster files left a temporary file; the next
/// sidecar removes it at its start, as init does.
#[tokio::test]
async fn a_sidecar_removes_what_a_killed_one_left_half_written() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "leftovers", dir.path()).await;
    pod("train-0").create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    let files = dir.path().join("trainlet");
    let observed = dir.path().join("observed");
    std::fs::create_dir(&files).unwrap();
    std::fs::create_dir(&observed).unwrap();
    write_tf_config(&files, free_port());
    std::fs::write(
        files.join("cluster.json"),
        r#"{"cluster":{"worker":["127.0.0.1:1"]},"task":{"type":"worker","index":0},"master":"","peers":[],"selectors":{"worker":["app=w"]},"resolved_at":"","waited_seconds":0}"#,
    )
    .unwrap();
    std::fs::write(files.join(".trainlet.env.a1B2c3"), "export TF_").unwrap();
    std::fs::write(files.join("notes.txt"), "mine").unwrap();
    let cluster_file = files.join("cluster.json");
    let r = Reporter::start(sidecar_cmd(
        &kc,
        &ns,
        "train-0",
        &[
            "--observations",
            observed.to_str().unwrap(),
            "--cluster-file",
            cluster_file.to_str().unwrap(),
        ],
    ));
    r.wait_ready().await;
    assert_eq!(
        support::list_dir(&files),
        ["cluster.json", "notes.txt", "peers.json", "tf_config.json"]
    );
    assert!(
        r.stderr().contains(&format!(
            "removed {}, left by an earlier run",
            files.join(".trainlet.env.a1B2c3").display()
        )),
        "{}",
        r.stderr()
    );
}

/// Flag help is documentation: no Rust intra-doc links leak into `--help`.
#[test]
fn help_shows_no_rustdoc_links() {
    for sub in [
        "init", "exec", "sidecar", "resolve", "master", "gpus", "inject",
    ] {
        let r = run(trainlet().args([sub, "--help"]));
        assert_eq!(r.code, 0, "{sub}");
        assert!(
            !r.stdout.contains("[`") && !r.stdout.contains("`]"),
            "{sub} --help: {}",
            r.stdout
        );
    }
    let r = run(trainlet().args(["init", "--help"]));
    assert!(r.stdout.contains("From 384 pods on"), "{}", r.stdout);
}

/// A sidecar at rest with the default 5 s interval (four probes in 20 s) writes
/// nothing after its first report. What it costs in CPU and memory at rest is
/// `make bench`'s to measure (benches/trainlet/sidecar.rs), not a test's.
#[tokio::test]
async fn a_sidecar_at_rest_writes_nothing_after_its_first_report() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "rest", dir.path()).await;
    pod("train-0")
        .gpus(2)
        .port("tf", 2222)
        .create(&client, &ns)
        .await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    let mut cmd = support::trainlet();
    cmd.arg("sidecar")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["--pod-name", "train-0", "--pod-namespace", &ns])
        .args(["--nvml-lib", fake_nvml().to_str().unwrap()])
        .env("FAKE_NVML_COUNT", "2");
    let mut r = Reporter::start(cmd);
    r.wait_ready().await;
    // The window at rest is what this test is about: four probes of the default 5 s.
    r.probed(4.0).await;
    let text = r.metrics().await;
    assert_eq!(
        metric(&text, "trainlet_annotation_patches_total"),
        Some(1.0)
    );
    assert_eq!(r.terminate().0, 0);
}

/// Every signal a person or the kubelet sends on purpose reaches CMD: HUP and USR1
/// are trapped and logged by CMD, USR2 makes it exit 9, which is trainlet's exit code.
#[tokio::test]
async fn exec_report_forwards_signals_to_the_command() {
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    let log = dir.path().join("signals.log");
    let armed = dir.path().join("armed");
    let script = format!(
        "trap 'echo hup >> {log}' HUP; trap 'echo usr1 >> {log}' USR1; trap 'echo quit >> {log}' QUIT; trap 'exit 9' USR2; touch {armed}; while :; do sleep 0.05; done",
        log = log.display(),
        armed = armed.display()
    );
    let mut cmd = trainlet();
    cmd.args(["exec", "--report", "--output-dir"])
        .arg(dir.path())
        .args(["--", "sh", "-c", &script]);
    let mut r = Reporter::start(cmd);
    eventually("CMD's traps", Duration::from_secs(20), || async {
        armed.exists().then_some(())
    })
    .await;
    for (sig, line) in [
        (libc::SIGHUP, "hup"),
        (libc::SIGUSR1, "usr1"),
        (libc::SIGQUIT, "quit"),
    ] {
        r.signal(sig);
        eventually(
            &format!("CMD logs {line}"),
            Duration::from_secs(10),
            || async {
                std::fs::read_to_string(&log)
                    .ok()?
                    .lines()
                    .any(|l| l == line)
                    .then_some(())
            },
        )
        .await;
    }
    assert!(r.alive(), "trainlet must not stop on a forwarded signal");
    r.signal(libc::SIGUSR2);
    assert_eq!(r.wait(Duration::from_secs(10)).0, 9, "{}", r.stderr());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "hup\nusr1\nquit\n");
}
