//! After the start, with the real Job controller: a pod of an Indexed Job is deleted or
//! fails, the controller replaces it at a new IP, and `trainlet exec
//! --on-peer-change` in the other pods restarts CMD with the new cluster (`restart`),
//! only reports it (`report`), or exits so that the pod is replaced (past
//! `--max-restarts`). The test plays the scheduler and the kubelet: it binds the
//! controller's pods, gives them IPs and runs one `trainlet exec` per pod, as the
//! container's main process.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

use crate::report_support::*;
use crate::support::jobs::*;
use crate::support::*;

/// CMD of every test here: one line per start, the time it started and its
/// TF_CONFIG, then it sleeps.
pub(crate) const CMD: [&str; 3] = [
    "sh",
    "-c",
    r#"echo "$(date +%s.%N) $TF_CONFIG" >> "$STARTS"; exec sleep 600"#,
];

/// What a pod's CMD wrote at each start (the file `$STARTS` of [`CMD`]).
pub(crate) struct Starts {
    pod: String,
    pub(crate) path: PathBuf,
}

impl Starts {
    /// (the time it started, its TF_CONFIG), one per start.
    pub(crate) fn read(&self) -> Vec<(f64, String)> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let (t, tf) = l.split_once(' ').unwrap();
                (t.parse().unwrap(), tf.to_string())
            })
            .collect()
    }

    async fn wait(&self, n: usize) -> Vec<(f64, String)> {
        assert!(
            self.reached(n, Duration::from_secs(90)).await,
            "timed out after 90s waiting for {n} starts of CMD in pod {}",
            self.pod
        );
        self.read()
    }

    /// Whether CMD started `n` times within `timeout`.
    pub(crate) async fn reached(&self, n: usize, timeout: Duration) -> bool {
        let start = std::time::Instant::now();
        while start.elapsed() < timeout {
            if self.read().len() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

/// One pod's container: `trainlet exec` and what its CMD wrote at each start.
struct Member {
    pod: String,
    exec: Reporter,
    pub(crate) starts: Starts,
    termination: PathBuf,
    _dir: tempfile::TempDir,
}

/// Starts `trainlet exec` for a pod, as its container would: it resolves (nothing was
/// written yet), then runs CMD.
fn start_member(kc: &Path, ns: &str, pod: &str, port: u16, extra: &[&str]) -> Member {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let starts = dir.path().join("starts");
    let termination = dir.path().join("termination-log");
    std::fs::write(&termination, "").unwrap();
    let port = port.to_string();
    let mut args = vec!["--job", "worker=app=w", "--port", &port];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend(CMD);
    let mut cmd = exec_cmd(kc, ns, pod, &out, &args);
    cmd.env("STARTS", &starts)
        .env("TRAINLET_TERMINATION_LOG", &termination);
    Member {
        pod: pod.to_string(),
        exec: Reporter::start(cmd),
        starts: Starts {
            pod: pod.to_string(),
            path: starts,
        },
        termination,
        _dir: dir,
    }
}

/// SIGKILLs the children of a process (CMD under trainlet exec).
pub(crate) fn kill_children(pid: u32) {
    use trainlet::report::probe::oom::procs;
    let children: Vec<u32> = procs::all_processes(Path::new("/proc"), procs::page_size())
        .into_iter()
        .filter(|p| p.ppid == pid)
        .map(|p| p.pid)
        .collect();
    assert_eq!(children.len(), 1, "CMD of pid {pid}: {children:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(children[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The Warning Events about one pod, as (reason, note), oldest first.
pub(crate) async fn warnings_of(
    client: &kube::Client,
    ns: &str,
    pod: &str,
) -> Vec<(String, String)> {
    let mut v: Vec<_> = events(client, ns)
        .await
        .into_iter()
        .filter(|(t, _, _, regarding)| t == "Warning" && regarding == pod)
        .map(|(_, r, n, _)| (r, n))
        .collect();
    v.sort();
    v
}

/// A 3-pod Indexed Job whose pods run, each with its `trainlet exec`.
async fn job_of_three(
    client: &kube::Client,
    kc: &Path,
    ns: &str,
    extra: &[&str],
) -> (Kubelet, u16, Vec<Member>) {
    indexed_job(client, ns, "w", 3, "app=w", serde_json::json!({})).await;
    let port = free_port();
    let names = run_job_pods(client, ns, "w", 3, |i| format!("10.9.0.{}", 10 + i)).await;
    let members: Vec<Member> = names
        .iter()
        .map(|pod| start_member(kc, ns, pod, port, extra))
        .collect();
    for m in &members {
        let starts = m.starts.wait(1).await;
        assert!(starts[0].1.contains("\"10.9.0.11:"), "{}", starts[0].1);
    }
    (Kubelet::new(client, ns), port, members)
}

/// The kubelet's part when a pod is deleted: the container gets SIGTERM.
async fn delete_pod(client: &kube::Client, ns: &str, m: &mut Member) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(&m.pod, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    m.exec.terminate();
}

#[tokio::test]
async fn a_replaced_pod_restarts_every_peers_command_once_with_its_new_address() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "restart", dir.path()).await;
    let flags = [
        "--on-peer-change",
        "restart",
        "--max-restarts",
        "2",
        "--restart-backoff",
        "1s",
        "--restart-grace",
        "5s",
    ];
    let (kubelet, port, mut members) = job_of_three(&client, &kc, &ns, &flags).await;
    let (p0, p2) = (members[0].pod.clone(), members[2].pod.clone());
    wait_annotation(&client, &ns, &p0, "trainlet.io/cluster", "current").await;

    // Pod 1 is deleted; the real Job controller replaces it, and the test gives the
    // replacement a new IP. Pod 0's CMD dies first, as a framework's broken collective
    // does: exec waits for the peer change that explains it and restarts, not exits.
    let first = members[1].pod.clone();
    kill_children(members[0].exec.pid());
    members[0]
        .exec
        .logged("the command failed; waiting up to")
        .await;
    delete_pod(&client, &ns, &mut members[1]).await;
    let replacement = wait_job_pod(&client, &ns, "w", 1, std::slice::from_ref(&first)).await;
    kubelet.run(&replacement, "10.9.0.21").await;
    members[1] = start_member(&kc, &ns, &replacement, port, &flags);

    for i in [0, 2] {
        let starts = members[i].starts.wait(2).await;
        assert!(starts[1].1.contains("\"10.9.0.21:"), "{}", starts[1].1);
        assert!(!starts[1].1.contains("10.9.0.11"), "{}", starts[1].1);
    }
    assert_eq!(members[1].starts.wait(1).await.len(), 1);
    wait_annotation(&client, &ns, &p0, "trainlet.io/cluster", "current").await;
    for m in [&members[0], &members[2]] {
        let text = m.exec.metrics().await;
        assert_eq!(
            metric(&text, "trainlet_restarts_total"),
            Some(1.0),
            "{}",
            m.pod
        );
        assert_eq!(
            metric(&text, "trainlet_cluster_stale"),
            Some(0.0),
            "{}",
            m.pod
        );
    }
    for pod in [&p0, &p2] {
        let w = warnings_of(&client, &ns, pod).await;
        assert_eq!(
            w.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
            ["PeerLost", "Restarting"],
            "{pod}: {w:?}"
        );
        // Seen while terminating, or once gone: the watch may see either first.
        assert!(
            [
                format!("task worker/1 (10.9.0.11) has no live pod: pod {first} is being deleted; the cluster this pod was given is stale"),
                format!("task worker/1 (10.9.0.11) has no live pod: pod {first} is gone; the cluster this pod was given is stale"),
            ]
            .contains(&w[0].1),
            "{}",
            w[0].1
        );
        assert_eq!(
            w[1].1,
            "restarting sh (1 of 2) in 1s: the cluster changed (stale: worker/1 10.9.0.11 → none)"
        );
    }

    // The replacement keeps failing: the next restart waits twice as long, and the one
    // after --max-restarts 2 ends exec with 7 and says why.
    let failed_at = unix_now();
    kubelet.phase(&replacement, "Failed").await;
    members[1].exec.terminate();
    let second = wait_job_pod(&client, &ns, "w", 1, &[first.clone(), replacement.clone()]).await;
    kubelet.run(&second, "10.9.0.31").await;
    members[1] = start_member(&kc, &ns, &second, port, &flags);
    for i in [0, 2] {
        let starts = members[i].starts.wait(3).await;
        assert!(starts[2].1.contains("\"10.9.0.31:"), "{}", starts[2].1);
        assert!(
            starts[2].0 - failed_at >= 2.0,
            "restart 2 came {:.2}s after the failure, before its 2s backoff",
            starts[2].0 - failed_at
        );
    }
    let notes: Vec<String> = warnings_of(&client, &ns, &p0)
        .await
        .into_iter()
        .filter(|(r, _)| r == "Restarting")
        .map(|(_, n)| n)
        .collect();
    assert_eq!(
        notes,
        [
            "restarting sh (1 of 2) in 1s: the cluster changed (stale: worker/1 10.9.0.11 → none)",
            "restarting sh (2 of 2) in 2s: the cluster changed (stale: worker/1 10.9.0.21 → none)",
        ]
    );

    kubelet.phase(&second, "Failed").await;
    members[1].exec.terminate();
    for i in [0, 2] {
        let (code, _) = members[i].exec.wait(Duration::from_secs(30));
        assert_eq!(code, 7, "{}", members[i].exec.stderr());
        assert_eq!(members[i].starts.read().len(), 3);
        assert_eq!(
            std::fs::read_to_string(&members[i].termination).unwrap(),
            "the cluster changed again (stale: worker/1 10.9.0.31 → none) after 2 restarts (--max-restarts 2); exiting so that the pod is replaced"
        );
    }
    delete_namespace(&client, &ns).await;
}

#[tokio::test]
async fn with_report_nothing_restarts_and_a_replacement_on_the_old_address_is_stale_too() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "report", dir.path()).await;
    let flags = ["--on-peer-change", "report"];
    let (kubelet, port, mut members) = job_of_three(&client, &kc, &ns, &flags).await;
    let p0 = members[0].pod.clone();
    wait_annotation(&client, &ns, &p0, "trainlet.io/cluster", "current").await;
    wait_annotation(&client, &ns, &p0, "trainlet.io/health", "ok").await;

    let first = members[1].pod.clone();
    delete_pod(&client, &ns, &mut members[1]).await;
    wait_annotation(
        &client,
        &ns,
        &p0,
        "trainlet.io/cluster",
        "stale: worker/1 10.9.0.11 → none",
    )
    .await;
    wait_annotation(&client, &ns, &p0, "trainlet.io/health", "degraded").await;
    let replacement = wait_job_pod(&client, &ns, "w", 1, &[first]).await;
    kubelet.run(&replacement, "10.9.0.21").await;
    members[1] = start_member(&kc, &ns, &replacement, port, &flags);
    wait_annotation(
        &client,
        &ns,
        &p0,
        "trainlet.io/cluster",
        "stale: worker/1 10.9.0.11 → 10.9.0.21",
    )
    .await;
    assert_eq!(
        metric(&members[0].exec.metrics().await, "trainlet_cluster_stale"),
        Some(1.0)
    );

    // The replacement at the old address (a hostNetwork pod on the same node): still
    // a new pod, still stale; report restarts nothing.
    kubelet.running(&replacement, "10.9.0.11").await;
    wait_annotation(
        &client,
        &ns,
        &p0,
        "trainlet.io/cluster",
        &format!("stale: worker/1 10.9.0.11 → 10.9.0.11 (new pod {replacement})"),
    )
    .await;
    let text = members[0].exec.metrics().await;
    assert_eq!(metric(&text, "trainlet_cluster_stale"), Some(1.0));
    assert_eq!(metric(&text, "trainlet_restarts_total"), Some(0.0));
    for i in [0, 2] {
        assert_eq!(
            members[i].starts.read().len(),
            1,
            "CMD of {} restarted",
            members[i].pod
        );
        assert!(members[i].exec.alive());
    }
    // Lost; replaced at a new IP; held by the new pod at the old IP (its Event may
    // trail the annotation).
    let reasons: Vec<String> = eventually("the third Warning", Duration::from_secs(30), || async {
        let w = warnings_of(&client, &ns, &p0).await;
        (w.len() >= 3).then(|| w.into_iter().map(|(r, _)| r).collect())
    })
    .await;
    assert_eq!(reasons, ["PeerLost", "PeerReplaced", "PeerReplaced"]);
    delete_namespace(&client, &ns).await;
}

#[test]
fn bad_peer_change_flags_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    let out = dir.path().to_str().unwrap();
    let observed = tempfile::tempdir().unwrap();
    for (flags, want) in [
        (
            vec!["--on-peer-change", "bogus"],
            "invalid value 'bogus' for '--on-peer-change <WHAT>' [possible values: report, restart, exit] (see trainlet --help)".to_string(),
        ),
        (
            vec!["--max-restarts", "-1"],
            "invalid value '-1' for '--max-restarts <N>': -1 is not in 0..=4294967295 (see trainlet --help)".to_string(),
        ),
        (
            vec!["--restart-grace", "soon"],
            "invalid --restart-grace \"soon\": expected number at 0 (use e.g. 30s, 10m or 1h)".to_string(),
        ),
        (
            vec!["--restart-backoff", "1x"],
            "invalid --restart-backoff \"1x\": unknown time unit \"x\", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations) (use e.g. 30s, 10m or 1h)".to_string(),
        ),
        (
            vec!["--on-peer-change", "restart"],
            format!("--on-peer-change restart needs the peers' selectors: there is no cluster.json in --output-dir {out} next to tf_config.json; run trainlet init (or let exec resolve: remove tf_config.json and give --job or --selector)"),
        ),
        (
            vec!["--on-peer-change", "exit", "--observations", observed.path().to_str().unwrap()],
            format!("--on-peer-change exit needs the peers' selectors: there is no cluster.json in --output-dir {out} next to tf_config.json; run trainlet init (or let exec resolve: remove tf_config.json and give --job or --selector)"),
        ),
    ] {
        let r = run(trainlet()
            .args(["exec", "--output-dir", out])
            .args(&flags)
            .args(["--", "true"]));
        assert_eq!(r.code, 2, "{flags:?}: {}", r.stderr);
        assert_eq!(r.error_line(), want, "{flags:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{flags:?}: {}", r.stderr);
    }
    // cluster.json from an older init, without selectors.
    std::fs::write(
        dir.path().join("cluster.json"),
        r#"{"cluster":{"worker":["127.0.0.1:1"]},"task":{"type":"worker","index":0},"master":"","peers":[],"resolved_at":"","waited_seconds":0}"#,
    )
    .unwrap();
    let r = run(trainlet().args([
        "exec",
        "--output-dir",
        out,
        "--on-peer-change",
        "restart",
        "--",
        "true",
    ]));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!(
            "--on-peer-change restart needs the peers' selectors, and {out}/cluster.json names none (written by an older trainlet init): run this version's trainlet init, or let exec resolve (remove tf_config.json and give --job or --selector)"
        )
    );
}

/// One pod of the shipped layout (`inject --wrap`): init's files, the sidecar with the
/// token, and exec without any credentials, handing over.
pub(crate) struct HandoverPod {
    pub(crate) sidecar: Reporter,
    pub(crate) exec: Reporter,
    files: PathBuf,
    pub(crate) starts: Starts,
    _dir: tempfile::TempDir,
}

impl HandoverPod {
    /// Waits for `n` starts of CMD; on a timeout, fails with what exec and the
    /// sidecar logged, which is what tells why.
    pub(crate) async fn wait(&self, n: usize) {
        if !self.starts.reached(n, Duration::from_secs(90)).await {
            panic!(
                "timed out after 90s waiting for {n} starts of CMD in pod {} (started {}); exec logged:\n{}\nthe sidecar logged:\n{}",
                self.starts.pod,
                self.starts.read().len(),
                self.exec.stderr(),
                self.sidecar.stderr()
            );
        }
    }
}

/// The directories of one pod of the shipped layout: init's volume, the observation
/// handover and the training container's home.
pub(crate) struct HandoverDirs {
    pub(crate) dir: tempfile::TempDir,
    files: PathBuf,
    observed: PathBuf,
    home: PathBuf,
}

pub(crate) fn handover_dirs() -> HandoverDirs {
    let dir = tempfile::tempdir().unwrap();
    let (files, observed, home) = (
        dir.path().join("trainlet"),
        dir.path().join("observed"),
        dir.path().join("home"),
    );
    for d in [&files, &observed, &home] {
        std::fs::create_dir(d).unwrap();
    }
    HandoverDirs {
        dir,
        files,
        observed,
        home,
    }
}

/// The pod's `trainlet init`, into `dirs.files`.
pub(crate) fn handover_init(
    kc: &Path,
    ns: &str,
    pod: &str,
    dirs: &HandoverDirs,
    port: u16,
    extra: &[&str],
) -> std::process::Command {
    let port = port.to_string();
    let mut args = vec!["--job", "worker=app=w", "--port", &port];
    args.extend_from_slice(extra);
    init_cmd(kc, ns, pod, &dirs.files, &args)
}

fn start_handover_pod(kc: &Path, ns: &str, pod: &str, port: u16, policy: &str) -> HandoverPod {
    let dirs = handover_dirs();
    let r = run(&mut handover_init(kc, ns, pod, &dirs, port, &[]));
    assert_eq!(r.code, 0, "{pod}: {}", r.stderr);
    start_handover_containers(kc, ns, pod, dirs, policy)
}

/// The sidecar and the training container's exec, once init has written the files.
fn start_handover_containers(
    kc: &Path,
    ns: &str,
    pod: &str,
    dirs: HandoverDirs,
    policy: &str,
) -> HandoverPod {
    start_handover_with(kc, ns, pod, dirs, &["--on-peer-change", policy], &CMD)
}

/// [`start_handover_containers`] with exec's lifecycle flags and CMD given. CMD's
/// environment has `$STARTS` and `$HANG` (a file beside it, which no one makes unless a
/// test does).
pub(crate) fn start_handover_with(
    kc: &Path,
    ns: &str,
    pod: &str,
    dirs: HandoverDirs,
    flags: &[&str],
    cmd: &[&str],
) -> HandoverPod {
    start_handover_patching(kc, ns, pod, dirs, flags, cmd, "1s")
}

/// [`start_handover_with`], the sidecar patching at most every `min_patch_interval`
/// unless news hurries it.
pub(crate) fn start_handover_patching(
    kc: &Path,
    ns: &str,
    pod: &str,
    dirs: HandoverDirs,
    flags: &[&str],
    cmd: &[&str],
    min_patch_interval: &str,
) -> HandoverPod {
    let HandoverDirs {
        dir,
        files,
        observed,
        home,
    } = dirs;
    let cluster_file = files.join("cluster.json");
    let sidecar = Reporter::start(sidecar_cmd(
        kc,
        ns,
        pod,
        &[
            "--observations",
            observed.to_str().unwrap(),
            "--cluster-file",
            cluster_file.to_str().unwrap(),
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
            "--min-patch-interval",
            min_patch_interval,
        ],
    ));
    let starts = dir.path().join("starts");
    let mut exec = trainlet();
    exec.args(["exec", "--report", "--observations"])
        .arg(&observed)
        .arg("--output-dir")
        .arg(&files)
        .args([
            "--pod-name",
            pod,
            "--pod-namespace",
            ns,
            "--interval",
            "200ms",
        ])
        .args(flags)
        .args(["--restart-backoff", "1s", "--restart-grace", "5s"])
        .arg("--")
        .args(cmd)
        .env("HOME", &home)
        .env("STARTS", &starts)
        .env("HANG", dir.path().join("hang"))
        .env("SILENT", dir.path().join("silent"))
        .env(
            "TRAINLET_TERMINATION_LOG",
            dir.path().join("termination-log"),
        );
    std::fs::write(dir.path().join("termination-log"), "").unwrap();
    HandoverPod {
        sidecar,
        exec: Reporter::start(exec),
        files,
        starts: Starts {
            pod: pod.to_string(),
            path: starts,
        },
        _dir: dir,
    }
}

/// The shipped layout, where the training container holds no API credentials: the
/// sidecar watches the peers and writes where the cluster stands to peers.json; exec
/// stops CMD, says in its observation that it waits, and the sidecar, once the
/// replacement is up, moves the files to its address; exec starts CMD from them.
#[tokio::test]
async fn without_credentials_exec_restarts_from_the_files_the_sidecar_moved() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "handover-restart", dir.path()).await;
    indexed_job(&client, &ns, "w", 3, "app=w", serde_json::json!({})).await;
    let kubelet = Kubelet::new(&client, &ns);
    let port = free_port();
    let names = run_job_pods(&client, &ns, "w", 3, |i| format!("10.9.1.{}", 10 + i)).await;
    let mut pods: Vec<HandoverPod> = names
        .iter()
        .map(|p| start_handover_pod(&kc, &ns, p, port, "restart"))
        .collect();
    for p in &pods {
        assert!(p.starts.wait(1).await[0].1.contains("\"10.9.1.11:"));
    }
    let p0 = names[0].clone();
    wait_annotation(&client, &ns, &p0, "trainlet.io/cluster", "current").await;

    let first = names[1].clone();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete(&first, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pods[1].exec.terminate();
    pods[1].sidecar.terminate();
    let note = wait_warning(&client, &ns, "Restarting").await;
    assert_eq!(
        note,
        "restarting sh (1 of 3) in 1s: the cluster changed (stale: worker/1 10.9.1.11 → none)"
    );
    let replacement = wait_job_pod(&client, &ns, "w", 1, std::slice::from_ref(&first)).await;
    // The replacement gets its address once each exec waits and its sidecar knows:
    // then the sidecar moves the files the moment it sees the address, and the task
    // is never announced as replaced (PeerReplaced) in between.
    kubelet.run(&replacement, "10.9.1.21").await;
    pods[1] = start_handover_pod(&kc, &ns, &replacement, port, "restart");

    for i in [0, 2] {
        let starts = pods[i].starts.wait(2).await;
        assert!(starts[1].1.contains("\"10.9.1.21:"), "{}", starts[1].1);
        assert!(!starts[1].1.contains("10.9.1.11"), "{}", starts[1].1);
        let tf = std::fs::read_to_string(pods[i].files.join("tf_config.json")).unwrap();
        assert!(tf.contains("\"10.9.1.21:"), "{tf}");
        let cluster: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(pods[i].files.join("cluster.json")).unwrap(),
        )
        .unwrap();
        let moved = cluster["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["index"] == 1)
            .unwrap()
            .clone();
        assert_eq!(moved["name"], replacement.as_str());
        assert_eq!(moved["address"], format!("10.9.1.21:{port}"));
        let peers: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(pods[i].files.join("peers.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            peers,
            serde_json::json!({"version": 1, "generation": 1, "cluster": "current"})
        );
    }
    assert_eq!(pods[1].starts.wait(1).await.len(), 1);
    wait_annotation(&client, &ns, &p0, "trainlet.io/cluster", "current").await;
    let text = pods[0].sidecar.metrics().await;
    assert_eq!(metric(&text, "trainlet_restarts_total"), Some(1.0));
    assert_eq!(metric(&text, "trainlet_cluster_stale"), Some(0.0));
    // The replacement came while exec waited: the sidecar announces it before it moves
    // the files to it (and the task is current again). The loss before it is announced
    // once, as the watch first saw it. The Events follow the log lines through the
    // sidecar's outbox.
    for pod in [&names[0], &names[2]] {
        let w = eventually(
            &format!("{pod}: its PeerLost and PeerReplaced Events"),
            Duration::from_secs(30),
            || async {
                let mut w = warnings_of(&client, &ns, pod).await;
                w.retain(|(r, _)| r != "Restarting");
                (w.len() >= 2).then_some(w)
            },
        )
        .await;
        let stale = "the cluster this pod was given is stale";
        let lost: Vec<String> = [
            format!("pod {first} is being deleted"),
            format!("pod {first} is gone"),
            format!("its replacement {replacement} has no address yet"),
        ]
        .iter()
        .map(|why| format!("task worker/1 (10.9.1.11) has no live pod: {why}; {stale}"))
        .collect();
        assert_eq!(w.len(), 2, "{pod}: {w:?}");
        assert!(
            w[0].0 == "PeerLost" && lost.contains(&w[0].1),
            "{pod}: {w:?}"
        );
        assert_eq!(
            w[1],
            (
                "PeerReplaced".to_string(),
                format!("task worker/1 moved: 10.9.1.11 → 10.9.1.21 (pod {replacement}); {stale}")
            ),
            "{pod}"
        );
    }
    delete_namespace(&client, &ns).await;
}

/// `exit` in the shipped layout: exec learns of the lost peer from the sidecar's
/// peers.json, stops CMD and exits 7 with the reason as its termination message, so
/// that the Job controller replaces the pod.
#[tokio::test]
async fn with_exit_exec_stops_cmd_and_exits_7_on_the_sidecars_word() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "handover-exit", dir.path()).await;
    indexed_job(&client, &ns, "w", 2, "app=w", serde_json::json!({})).await;
    let port = free_port();
    let pods = run_job_pods(&client, &ns, "w", 2, |i| format!("10.9.2.{}", 10 + i)).await;
    let mut members: Vec<HandoverPod> = pods
        .iter()
        .map(|p| start_handover_pod(&kc, &ns, p, port, "exit"))
        .collect();
    for m in &members {
        m.starts.wait(1).await;
    }
    wait_annotation(&client, &ns, &pods[0], "trainlet.io/cluster", "current").await;
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete(&pods[1], &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    members[1].exec.terminate();
    let (code, _) = members[0].exec.wait(Duration::from_secs(30));
    assert_eq!(code, 7, "{}", members[0].exec.stderr());
    let termination = members[0].starts.path.with_file_name("termination-log");
    assert_eq!(
        std::fs::read_to_string(termination).unwrap(),
        "the cluster changed (stale: worker/1 10.9.2.11 → none); exiting so that the pod is replaced"
    );
    assert_eq!(members[0].starts.wait(1).await.len(), 1);
    delete_namespace(&client, &ns).await;
}

/// Coordinated, in the shipped layout: only the resolver pod's sidecar watches every
/// peer; the others watch the resolver pod. A deleted pod's replacement finds itself in
/// the cluster the resolver's sidecar publishes again, within seconds (well before a
/// follower would give up on it and watch every peer), and every other pod's exec
/// restarts CMD exactly once, with the replacement's address.
#[tokio::test]
async fn coordinated_the_resolvers_sidecar_publishes_the_replacement_and_every_peer_restarts_once()
{
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "coord-restart", dir.path()).await;
    indexed_job(&client, &ns, "w", 3, "app=w", serde_json::json!({})).await;
    let kubelet = Kubelet::new(&client, &ns);
    let port = free_port();
    let names = run_job_pods(&client, &ns, "w", 3, |i| format!("10.9.4.{}", 10 + i)).await;
    let coordinate = ["--coordinate", "always"];
    let inits: Vec<_> = names
        .iter()
        .map(|p| {
            let dirs = handover_dirs();
            let h = spawn(handover_init(&kc, &ns, p, &dirs, port, &coordinate));
            (dirs, h)
        })
        .collect();
    let mut pods = Vec::new();
    for (name, (dirs, h)) in names.iter().zip(inits) {
        let r = h.await.unwrap();
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        pods.push(start_handover_containers(&kc, &ns, name, dirs, "restart"));
    }
    for p in &pods {
        assert!(p.starts.wait(1).await[0].1.contains("\"10.9.4.11:"));
    }
    for (i, name) in names.iter().enumerate() {
        wait_annotation(&client, &ns, name, "trainlet.io/cluster", "current").await;
        let log = pods[i].sidecar.stderr();
        let follows = log.contains("watching the resolver pod, which watches the peers");
        assert_eq!(follows, i != 0, "{name}: {log}");
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let resolution = |p: Pod| {
        let text = p.metadata.annotations.unwrap()["trainlet.io/resolution"].clone();
        trainlet::cluster::published::decode(&text, &ns).unwrap()
    };
    let first_published = resolution(api.get(&names[0]).await.unwrap());

    let first = names[1].clone();
    api.delete(&first, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pods[1].exec.terminate();
    pods[1].sidecar.terminate();
    let replacement = wait_job_pod(&client, &ns, "w", 1, std::slice::from_ref(&first)).await;
    kubelet.run(&replacement, "10.9.4.21").await;
    // Well under the 15 s after which it would watch every peer itself: the 12 s
    // timeout would fail it, and it would say so.
    let dirs = handover_dirs();
    let r = run(&mut handover_init(
        &kc,
        &ns,
        &replacement,
        &dirs,
        port,
        &["--coordinate", "always", "--timeout", "12s"],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        !r.stderr.contains("watching every peer instead"),
        "{}",
        r.stderr
    );
    pods[1] = start_handover_containers(&kc, &ns, &replacement, dirs, "restart");

    for i in [0, 2] {
        let starts = pods[i].starts.wait(2).await;
        assert!(starts[1].1.contains("\"10.9.4.21:"), "{}", starts[1].1);
        assert!(!starts[1].1.contains("10.9.4.11"), "{}", starts[1].1);
    }
    for name in &names {
        if *name != first {
            wait_annotation(&client, &ns, name, "trainlet.io/cluster", "current").await;
        }
    }
    // The resolver published the replacement, and nothing older than before.
    let now = resolution(api.get(&names[0]).await.unwrap());
    assert!(now.generation > first_published.generation);
    assert!(now.is_complete());
    let w1 = now.cluster.task("worker", 1).unwrap();
    assert_eq!(
        (w1.name.as_str(), w1.address.clone()),
        (replacement.as_str(), format!("10.9.4.21:{port}"))
    );
    // One restart each, no more; the replacement started once. Each exec is then
    // stopped as the kubelet would: what it says it was doing (running CMD, not waiting
    // to restart it again) is its own word that no other restart was under way.
    for i in [0, 2] {
        let text = pods[i].sidecar.metrics().await;
        assert_eq!(metric(&text, "trainlet_restarts_total"), Some(1.0));
        assert_eq!(metric(&text, "trainlet_cluster_stale"), Some(0.0));
        let (code, _) = pods[i].exec.terminate();
        assert_eq!(code, 143, "{}", pods[i].exec.stderr());
        assert_eq!(
            std::fs::read_to_string(pods[i].starts.path.with_file_name("termination-log")).unwrap(),
            "sh was killed by signal 15 (SIGTERM)"
        );
        assert_eq!(pods[i].starts.read().len(), 2, "{}", names[i]);
        let w = warnings_of(&client, &ns, &names[i]).await;
        let count = |r: &str| w.iter().filter(|(wr, _)| wr == r).count();
        assert_eq!(count("Restarting"), 1, "{}: {w:?}", names[i]);
    }
    assert_eq!(pods[1].starts.read().len(), 1);
    delete_namespace(&client, &ns).await;
}

/// Coordinated, with exec holding credentials (no sidecar): the resolver pod's exec
/// publishes again; a follower's exec resolves again only from a resolution newer than
/// the one that showed the change, so it restarts CMD once, with the new address, not
/// with the deleted pod's.
#[tokio::test]
async fn coordinated_exec_restarts_once_with_the_new_address() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "coord-exec", dir.path()).await;
    let flags = [
        "--coordinate",
        "always",
        "--on-peer-change",
        "restart",
        "--max-restarts",
        "2",
        "--restart-backoff",
        "1s",
        "--restart-grace",
        "5s",
    ];
    let (kubelet, port, mut members) = job_of_three(&client, &kc, &ns, &flags).await;
    let (p0, p2) = (members[0].pod.clone(), members[2].pod.clone());
    wait_annotation(&client, &ns, &p2, "trainlet.io/cluster", "current").await;

    let first = members[1].pod.clone();
    delete_pod(&client, &ns, &mut members[1]).await;
    let replacement = wait_job_pod(&client, &ns, "w", 1, std::slice::from_ref(&first)).await;
    kubelet.run(&replacement, "10.9.0.21").await;
    members[1] = start_member(&kc, &ns, &replacement, port, &flags);
    for i in [0, 2] {
        let starts = members[i].starts.wait(2).await;
        assert!(starts[1].1.contains("\"10.9.0.21:"), "{}", starts[1].1);
    }
    assert_eq!(members[1].starts.wait(1).await.len(), 1);
    for pod in [&p0, &p2] {
        wait_annotation(&client, &ns, pod, "trainlet.io/cluster", "current").await;
    }
    // Each exec is then stopped as the kubelet would: what it says it was doing
    // (running CMD, not waiting to restart it again) is its own word that no other
    // restart was under way.
    for i in [0, 2] {
        let text = members[i].exec.metrics().await;
        assert_eq!(metric(&text, "trainlet_restarts_total"), Some(1.0));
        let (code, _) = members[i].exec.terminate();
        assert_eq!(code, 143, "{}", members[i].exec.stderr());
        assert_eq!(
            std::fs::read_to_string(&members[i].termination).unwrap(),
            "sh was killed by signal 15 (SIGTERM)"
        );
        let starts = members[i].starts.read();
        assert_eq!(starts.len(), 2, "{}: {starts:?}", members[i].pod);
    }
    delete_namespace(&client, &ns).await;
}

/// The kubelet stops the container while exec waits out the restart backoff: exec
/// ends with 143 and says so, not how the CMD it had stopped ended.
#[tokio::test]
async fn a_stop_during_the_restart_backoff_says_so() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "backoff-stop", dir.path()).await;
    let flags = [
        "--on-peer-change",
        "restart",
        "--restart-backoff",
        "60s",
        "--restart-grace",
        "5s",
    ];
    let (_kubelet, _port, mut members) = job_of_three(&client, &kc, &ns, &flags).await;
    wait_annotation(
        &client,
        &ns,
        &members[0].pod,
        "trainlet.io/cluster",
        "current",
    )
    .await;
    delete_pod(&client, &ns, &mut members[1]).await;
    // Both are in their backoff once each has announced its restart.
    for i in [0, 2] {
        let note = eventually(
            &format!("{}'s Restarting Event", members[i].pod),
            Duration::from_secs(30),
            || async {
                restarting(&warnings_of(&client, &ns, &members[i].pod).await)
                    .into_iter()
                    .next()
            },
        )
        .await;
        assert_eq!(
            note,
            "restarting sh (1 of 3) in 1m: the cluster changed (stale: worker/1 10.9.0.11 → none)"
        );
    }
    for i in [0, 2] {
        let (code, _) = members[i].exec.terminate();
        assert_eq!(code, 143, "{}", members[i].exec.stderr());
        assert_eq!(
            std::fs::read_to_string(&members[i].termination).unwrap(),
            "stopped by SIGTERM while waiting to restart sh after a peer change (stale: worker/1 10.9.0.11 → none)"
        );
    }
    delete_namespace(&client, &ns).await;
}

/// A CMD that prints a line every 200 ms, until the file `$HANG` appears: then it
/// removes it and hangs silently (its next start runs normally). Where `$SILENT`
/// exists it never prints at all, as the ranks of a job whose rank 0 alone logs.
const TICKING: [&str; 3] = [
    "sh",
    "-c",
    r#"echo "$(date +%s.%N) $TF_CONFIG" >> "$STARTS"
if [ -e "$SILENT" ]; then exec sleep 600; fi
while :; do
  if [ -e "$HANG" ]; then rm "$HANG"; exec sleep 600; fi
  echo tick; sleep 0.2
done"#,
];

/// A Job of 3 pods in the shipped layout, each running [`TICKING`] under
/// `--stall-after stall_after --on-stall restart` and `extra`, in a new namespace
/// `prefix-…` with pod IPs 10.9.`subnet`.10-12; each pod's CMD starts after the one
/// before it is up. The pods `hung` hang from their first moment (in their first run);
/// the pods `silent` never print.
async fn stall_restart_job(
    client: &kube::Client,
    prefix: &str,
    subnet: u8,
    (hung, silent): (&[usize], &[usize]),
    stall_after: &str,
    extra: &[&str],
) -> (String, Vec<String>, Vec<HandoverPod>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(client, prefix, dir.path()).await;
    indexed_job(client, &ns, "w", 3, "app=w", serde_json::json!({})).await;
    let port = free_port();
    let names = run_job_pods(client, &ns, "w", 3, |i| format!("10.9.{subnet}.{}", 10 + i)).await;
    let mut flags = vec!["--stall-after", stall_after, "--on-stall", "restart"];
    flags.extend_from_slice(extra);
    let mut pods = Vec::new();
    for (i, p) in names.iter().enumerate() {
        let dirs = handover_dirs();
        let r = run(&mut handover_init(&kc, &ns, p, &dirs, port, &[]));
        assert_eq!(r.code, 0, "{p}: {}", r.stderr);
        if hung.contains(&i) {
            std::fs::write(dirs.dir.path().join("hang"), "").unwrap();
        }
        if silent.contains(&i) {
            std::fs::write(dirs.dir.path().join("silent"), "").unwrap();
        }
        let pod = start_handover_with(&kc, &ns, p, dirs, &flags, &TICKING);
        pod.wait(1).await;
        pods.push(pod);
    }
    (ns, names, pods, dir)
}

/// Waits until each pod's sidecar has published (`trainlet.io/progress`) progress of
/// its CMD's second run made `window` or more after that run started, not stalled:
/// the job has moved on past the point where the stall could restart anything again,
/// as the pods themselves say it.
async fn progress_past_the_restart(
    client: &kube::Client,
    ns: &str,
    names: &[String],
    pods: &[HandoverPod],
    window: Duration,
) {
    for (p, name) in pods.iter().zip(names) {
        let restarted = p.starts.read()[1].0;
        eventually(
            &format!("{name}'s progress {window:?} after its restart"),
            Duration::from_secs(60),
            || async {
                let a = annotations(client, ns, name).await;
                let p: serde_json::Value =
                    serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
                let at = humantime::parse_rfc3339(p["at"].as_str()?).ok()?;
                let at = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
                (p["stalled"] == false && at >= restarted + window.as_secs_f64()).then_some(())
            },
        )
        .await;
    }
}

/// The notes of the `Restarting` Events among `warnings`.
pub(crate) fn restarting(warnings: &[(String, String)]) -> Vec<String> {
    warnings
        .iter()
        .filter(|(r, _)| r == "Restarting")
        .map(|(_, n)| n.clone())
        .collect()
}

/// The stall watch in the shipped layout (exec without credentials), per pod
/// (`--stall-scope pod`: the pods print on their own and wait for no collective): pod
/// 1's CMD goes silent while the others print; its exec hands the stall to its
/// sidecar, which publishes it (`trainlet.io/progress`, the `Stalled` Event); the
/// other pods' sidecars see it on the peer pod and tell their exec through
/// peers.json; every pod's CMD restarts exactly once.
#[tokio::test]
async fn without_credentials_a_stall_in_one_pod_restarts_every_pods_command_once() {
    let client = admin().await;
    let (ns, names, pods, _dir) = stall_restart_job(
        &client,
        "handover-stall",
        6,
        (&[], &[]),
        "2s",
        &["--stall-scope", "pod"],
    )
    .await;
    // Published, not stalled, by every sidecar.
    for name in &names {
        eventually(
            &format!("{name}'s progress"),
            Duration::from_secs(30),
            || async {
                let a = annotations(&client, &ns, name).await;
                let p: serde_json::Value =
                    serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
                (p["stalled"] == false && p["stalls"] == 0 && p["at"].is_string()).then_some(())
            },
        )
        .await;
    }
    std::fs::write(pods[1].starts.path.with_file_name("hang"), "").unwrap();
    for p in &pods {
        p.wait(2).await;
    }
    // Once: no second restart for the same stall, once every pod has run a whole
    // --stall-after window past its restart.
    progress_past_the_restart(&client, &ns, &names, &pods, Duration::from_secs(2)).await;
    for (p, name) in pods.iter().zip(&names) {
        assert_eq!(p.starts.read().len(), 2, "{name}");
        let text = p.sidecar.metrics().await;
        assert_eq!(
            metric(&text, "trainlet_restarts_total"),
            Some(1.0),
            "{name}"
        );
        let stalls = if name == &names[1] { 1.0 } else { 0.0 };
        assert_eq!(
            metric(&text, "trainlet_stalls_total"),
            Some(stalls),
            "{name}"
        );
        assert_eq!(
            metric(&text, r#"trainlet_stalled{container="main"}"#),
            Some(0.0),
            "{name}"
        );
    }
    eventually(
        "pod 1 not stalled again",
        Duration::from_secs(30),
        || async {
            let a = annotations(&client, &ns, &names[1]).await;
            let p: serde_json::Value = serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
            (p["stalled"] == false && p["stalls"] == 1).then_some(())
        },
    )
    .await;
    let stalled = warnings_of(&client, &ns, &names[1]).await;
    let notes: Vec<&str> = stalled
        .iter()
        .filter(|(r, _)| r == "Stalled")
        .map(|(_, n)| n.as_str())
        .collect();
    assert_eq!(notes.len(), 1, "{stalled:?}");
    assert!(
        notes[0].starts_with("no progress for 2s; last output \"tick\"; CMD used "),
        "{}",
        notes[0]
    );
    assert_eq!(
        restarting(&stalled),
        ["restarting sh (1 of 3) in 1s: main made no progress for 2s"]
    );
    for name in [&names[0], &names[2]] {
        let w = warnings_of(&client, &ns, name).await;
        assert!(w.iter().all(|(r, _)| r != "Stalled"), "{name}: {w:?}");
        let notes = restarting(&w);
        assert_eq!(notes.len(), 1, "{name}: {w:?}");
        let want = format!(
            "restarting sh (1 of 3) in 1s: pod {} made no progress since ",
            names[1]
        );
        assert!(notes[0].starts_with(&want), "{name}: {}", notes[0]);
    }
    delete_namespace(&client, &ns).await;
}

/// Rank 0's pod (`names[0]`) published exactly one `Stalled` Event, whose note
/// `stalled` accepts, and restarted once with `own_restart`; every other pod published
/// no stall and restarted once for rank 0's.
async fn rank_0s_stall_restarted_the_group(
    client: &kube::Client,
    ns: &str,
    names: &[String],
    stalled: impl Fn(&str) -> bool,
    own_restart: &str,
) {
    let w0 = warnings_of(client, ns, &names[0]).await;
    let notes: Vec<&str> = w0
        .iter()
        .filter(|(r, _)| r == "Stalled")
        .map(|(_, n)| n.as_str())
        .collect();
    assert!(notes.len() == 1 && stalled(notes[0]), "{w0:?}");
    assert_eq!(restarting(&w0), [own_restart]);
    let want = format!(
        "restarting sh (1 of 3) in 1s: pod {} made no progress since ",
        names[0]
    );
    for name in &names[1..] {
        let w = warnings_of(client, ns, name).await;
        assert!(w.iter().all(|(r, _)| r != "Stalled"), "{name}: {w:?}");
        let notes = restarting(&w);
        assert!(
            notes.len() == 1 && notes[0].starts_with(&want),
            "{name}: {notes:?}"
        );
    }
}

/// Every rank hangs from its start (the usual hang at the rendezvous), before the later
/// pods have even started: no pod of the job makes progress, so rank 0's pod says the
/// job is stalled, once, and every pod's CMD restarts once for it; the stall began
/// before the later pods' CMDs started, yet it is still going on, so they restart too.
#[tokio::test]
async fn without_credentials_a_job_hung_from_its_start_restarts_every_pods_command_once() {
    let client = admin().await;
    let (ns, names, pods, _dir) =
        // 5 s: every pod's CMD has started before rank 0's stall (each starts after
        // the one before it is up).
        stall_restart_job(&client, "handover-early-stall", 7, (&[0, 1, 2], &[]), "5s", &[]).await;
    for p in &pods {
        p.wait(2).await;
    }
    progress_past_the_restart(&client, &ns, &names, &pods, Duration::from_secs(5)).await;
    for (p, name) in pods.iter().zip(&names) {
        assert_eq!(p.starts.read().len(), 2, "{name}");
        let text = p.sidecar.metrics().await;
        assert_eq!(
            metric(&text, "trainlet_restarts_total"),
            Some(1.0),
            "{name}"
        );
        let stalls = if name == &names[0] { 1.0 } else { 0.0 };
        assert_eq!(
            metric(&text, "trainlet_stalls_total"),
            Some(stalls),
            "{name}"
        );
    }
    rank_0s_stall_restarted_the_group(
        &client,
        &ns,
        &names,
        |note| {
            note.starts_with("no progress for 5s; no progress output yet; CMD used ")
                && note.ends_with(
                    "% of a core over the window; no pod of the job made progress either; where: no Python process",
                )
        },
        "restarting sh (1 of 3) in 1s: no pod of the job made progress for 5s",
    )
    .await;
    delete_namespace(&client, &ns).await;
}

/// Only rank 0 logs, as in DDP, torchrun and DeepSpeed scripts: the other pods' CMDs
/// never print. They are silent (published, never stalled) and nothing restarts while
/// rank 0 logs, for three times `--stall-after` (before, every pod restarted every
/// `--stall-after`); when rank 0 stops printing, its stall restarts every pod's CMD
/// once.
#[tokio::test]
async fn without_credentials_ranks_that_never_print_are_silent_and_rank_0s_stall_restarts_all_once()
{
    let client = admin().await;
    let (ns, names, pods, _dir) =
        stall_restart_job(&client, "handover-silent", 8, (&[], &[1, 2]), "2s", &[]).await;
    let last_start = std::time::SystemTime::now();
    // Rank 0 logs on, three windows of --stall-after past the last pod's start.
    let progressed_until = |until: std::time::SystemTime| {
        let (client, ns, name) = (client.clone(), ns.clone(), names[0].clone());
        async move {
            let a = annotations(&client, &ns, &name).await;
            let p: serde_json::Value = serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
            let at = humantime::parse_rfc3339(p["at"].as_str()?).ok()?;
            (at >= until).then_some(())
        }
    };
    eventually(
        "rank 0 logging for 6 s past the last start",
        Duration::from_secs(60),
        || progressed_until(last_start + Duration::from_secs(7)),
    )
    .await;
    for (i, (p, name)) in pods.iter().zip(&names).enumerate() {
        assert_eq!(p.starts.read().len(), 1, "{name}");
        let w = warnings_of(&client, &ns, name).await;
        assert_eq!(restarting(&w), Vec::<String>::new(), "{name}");
        assert!(w.iter().all(|(r, _)| r != "Stalled"), "{name}: {w:?}");
        let text = p.sidecar.metrics().await;
        let silent = if i == 0 { 0.0 } else { 1.0 };
        assert_eq!(
            metric(&text, r#"trainlet_silent{container="main"}"#),
            Some(silent),
            "{name}"
        );
        assert_eq!(metric(&text, "trainlet_stalls_total"), Some(0.0), "{name}");
        let a = annotations(&client, &ns, name).await;
        let p: serde_json::Value = serde_json::from_str(&a["trainlet.io/progress"]).unwrap();
        // Published only while true.
        let want = if i == 0 {
            serde_json::Value::Null
        } else {
            serde_json::json!(true)
        };
        assert_eq!(p["silent"], want, "{name}: {p}");
        assert_eq!(p["stalled"], false, "{name}: {p}");
    }
    // Rank 0 stops printing: its stall, the group restarts once.
    std::fs::write(pods[0].starts.path.with_file_name("hang"), "").unwrap();
    for p in &pods {
        p.wait(2).await;
    }
    let restarted = std::time::SystemTime::now();
    eventually(
        "rank 0 logging for 6 s past the restart",
        Duration::from_secs(60),
        || progressed_until(restarted + Duration::from_secs(6)),
    )
    .await;
    for (p, name) in pods.iter().zip(&names) {
        assert_eq!(p.starts.read().len(), 2, "{name}");
    }
    rank_0s_stall_restarted_the_group(
        &client,
        &ns,
        &names,
        |note| note.starts_with("no progress for 2s; last output \"tick\"; CMD used "),
        "restarting sh (1 of 3) in 1s: main made no progress for 2s",
    )
    .await;
    delete_namespace(&client, &ns).await;
}

/// `--on-stall exit` in the shipped layout: exec stops the silent CMD and exits 8,
/// with the stall in the termination message; the sidecar publishes the stall.
#[tokio::test]
async fn without_credentials_on_stall_exit_exits_8_and_the_sidecar_publishes_the_stall() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "handover-stall-exit", dir.path()).await;
    indexed_job(&client, &ns, "w", 1, "app=w", serde_json::json!({})).await;
    let port = free_port();
    let names = run_job_pods(&client, &ns, "w", 1, |_| "10.9.7.10".to_string()).await;
    let dirs = handover_dirs();
    let r = run(&mut handover_init(&kc, &ns, &names[0], &dirs, port, &[]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let cmd = [
        "sh",
        "-c",
        r#"echo "$(date +%s.%N) $TF_CONFIG" >> "$STARTS"; echo loading; exec sleep 600"#,
    ];
    let mut pod = start_handover_with(
        &kc,
        &ns,
        &names[0],
        dirs,
        &["--stall-after", "2s", "--on-stall", "exit"],
        &cmd,
    );
    let (code, _) = pod.exec.wait(Duration::from_secs(30));
    assert_eq!(code, 8, "{}", pod.exec.stderr());
    let termination = pod.starts.path.with_file_name("termination-log");
    assert_eq!(
        std::fs::read_to_string(termination).unwrap(),
        "main made no progress for 2s; exiting so that the pod is replaced"
    );
    assert_eq!(pod.starts.read().len(), 1);
    let note = wait_warning(&client, &ns, "Stalled").await;
    assert!(
        note.starts_with("no progress for 2s; last output \"loading\"; CMD used "),
        "{note}"
    );
    eventually("the stall published", Duration::from_secs(30), || async {
        let a = annotations(&client, &ns, &names[0]).await;
        let p: serde_json::Value = serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
        (p["stalled"] == true && p["stalls"] == 1 && p["since"].is_string()).then_some(())
    })
    .await;
    let text = pod.sidecar.metrics().await;
    assert_eq!(metric(&text, "trainlet_stalls_total"), Some(1.0));
    delete_namespace(&client, &ns).await;
}
