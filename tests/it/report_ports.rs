//! Port conflicts with real sockets, and the faults around them: a foreign process
//! holding the training port (exec and sidecar), CMD's own listener (no conflict),
//! signal forwarding and exit codes under exec, and the API server going away and
//! coming back while the sidecar reports.

use std::net::TcpListener;
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::report_support::*;
use crate::support::{self, *};

fn own_comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .unwrap()
        .trim_end()
        .to_string()
}

/// The test process holds the task's port before trainlet starts CMD: a conflict,
/// with the Event naming the holder. SIGTERM reaches CMD, and CMD's death by it is
/// trainlet's exit status (128+15).
#[tokio::test]
async fn exec_reports_a_foreign_process_on_the_task_port() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "portx", dir.path()).await;
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    pod("train-0").create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    write_tf_config(dir.path(), port);
    let mut r = Reporter::start(exec_cmd(
        &kc,
        &ns,
        "train-0",
        dir.path(),
        &["--", "sleep", "60"],
    ));

    wait_annotation(
        &client,
        &ns,
        "train-0",
        "trainlet.io/port-conflict",
        &port.to_string(),
    )
    .await;
    let want = format!(
        "port {port} is held by process {} (pid {}), which is not part of container trainer; trainer cannot listen on it",
        own_comm(),
        std::process::id()
    );
    assert_eq!(wait_warning(&client, &ns, "PortConflict").await, want);
    let a = annotations(&client, &ns, "train-0").await;
    assert_eq!(a["trainlet.io/health"], "degraded");
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(
        report["ports"],
        json!([{"port": port, "state": "conflict", "reason": "foreign-process",
                "owner": {"pid": std::process::id(), "comm": own_comm()}}])
    );
    assert_eq!(report["reasons"], json!([want]));
    assert_eq!(
        metric(
            &r.metrics().await,
            &format!("trainlet_port_conflict{{port=\"{port}\"}}")
        ),
        Some(1.0)
    );

    r.signal(libc::SIGTERM);
    let (code, _) = r.wait(Duration::from_secs(10));
    assert_eq!(code, 128 + 15, "{}", r.stderr());
    drop(holder);
}

/// A CMD that cannot listen on its port ends at once, usually before exec's first
/// probe; exec still hands the conflict that ended it to the sidecar, in its last
/// observation. Regression: that observation had no ports, so the conflict was never
/// reported (found on the real node: node_pods.rs, the port conflict). Several runs,
/// since whether the first probe came before CMD's exit was a race.
#[test]
fn exec_hands_over_the_conflict_of_a_cmd_that_ends_at_once() {
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    for run in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let (files, observed) = (dir.path().join("trainlet"), dir.path().join("observed"));
        std::fs::create_dir(&files).unwrap();
        std::fs::create_dir(&observed).unwrap();
        write_tf_config(&files, port);
        // As in the training container: no kubeconfig, no token, the sidecar publishes.
        let out = trainlet()
            .args(["exec", "--report", "--observations"])
            .arg(&observed)
            .arg("--output-dir")
            .arg(&files)
            .args(["--pod-name", "train-0", "--pod-namespace", "ml"])
            .args(["--interval", "10s", "--", "sh", "-c", "exit 3"])
            .env("HOME", dir.path())
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let o: serde_json::Value =
            serde_json::from_slice(&std::fs::read(observed.join("exec.json")).unwrap()).unwrap();
        assert_eq!(o["exited"], 3, "run {run}: {o}");
        assert_eq!(
            o["ports"],
            json!([{"port": port, "state": "conflict", "reason": "foreign-process",
                    "owner": {"pid": std::process::id(), "comm": own_comm()}}]),
            "run {run}: {o}"
        );
    }
    drop(holder);
}

/// CMD itself listens on the task port: `listening`, owned by CMD, no conflict. CMD
/// exits 7 and so does trainlet.
#[tokio::test]
async fn exec_accepts_cmds_own_listener_and_passes_its_exit_code() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "portok", dir.path()).await;
    let port = free_port();
    pod("train-0").create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    write_tf_config(dir.path(), port);
    let ready = dir.path().join("listening");
    let stop = dir.path().join("stop");
    let script = format!(
        "import os, socket, sys, time\n\
s = socket.socket(socket.AF_INET6)\n\
s.bind(('::', {port}))\n\
s.listen()\n\
open({ready:?}, 'w').write(str(os.getpid()))\n\
while not os.path.exists({stop:?}):\n    time.sleep(0.05)\n\
sys.exit(7)\n",
        ready = ready.to_str().unwrap(),
        stop = stop.to_str().unwrap()
    );
    let mut r = Reporter::start(exec_cmd(
        &kc,
        &ns,
        "train-0",
        dir.path(),
        &["--", "python3", "-c", &script],
    ));
    let pid: u32 = eventually("CMD listens", Duration::from_secs(20), || async {
        std::fs::read_to_string(&ready).ok()?.trim().parse().ok()
    })
    .await;
    // The report shows the listener with its owner, and nothing is wrong.
    let report = eventually(
        "the listener in the report",
        Duration::from_secs(20),
        || async {
            let a = annotations(&client, &ns, "train-0").await;
            let r: serde_json::Value = serde_json::from_str(a.get("trainlet.io/report")?).ok()?;
            (r["ports"][0]["state"] == "listening").then_some((a, r))
        },
    )
    .await;
    let (a, report) = report;
    assert_eq!(report["ports"][0]["port"], port);
    assert_eq!(report["ports"][0]["owner"]["pid"], pid);
    assert!(
        report["ports"][0]["owner"]["comm"]
            .as_str()
            .unwrap()
            .starts_with("python"),
        "{report}"
    );
    assert_eq!(a["trainlet.io/health"], "ok");
    assert!(!a.contains_key("trainlet.io/port-conflict"));
    assert_eq!(warnings(&client, &ns).await, vec![]);

    std::fs::write(&stop, "").unwrap();
    let (code, _) = r.wait(Duration::from_secs(20));
    assert_eq!(code, 7, "{}", r.stderr());
}

/// The sidecar knows the training container by its ID; the test process's socket is
/// in another cgroup, so it is foreign. When it closes, the conflict clears and the
/// annotation key goes away.
#[tokio::test]
async fn sidecar_reports_a_foreign_listener_and_clears_it() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "ports", dir.path()).await;
    let holder = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    pod("train-0")
        .port("tf", port as i32)
        .create(&client, &ns)
        .await;
    let kubelet = Kubelet::new(&client, &ns);
    kubelet.run("train-0", "10.1.0.5").await;
    kubelet
        .status(
            "train-0",
            running_with_id(
                "trainer",
                "containerd://8f2c3a9e0d1b4c5a6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5",
            ),
        )
        .await;
    let mut r = Reporter::start(sidecar_cmd(&kc, &ns, "train-0", &[]));
    wait_annotation(
        &client,
        &ns,
        "train-0",
        "trainlet.io/port-conflict",
        &port.to_string(),
    )
    .await;
    assert_eq!(
        wait_warning(&client, &ns, "PortConflict").await,
        format!(
            "port {port} is held by process {} (pid {}), which is not part of container trainer; trainer cannot listen on it",
            own_comm(),
            std::process::id()
        )
    );
    drop(holder);
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    let a = annotations(&client, &ns, "train-0").await;
    assert!(!a.contains_key("trainlet.io/port-conflict"), "{a:?}");
    let text = r.metrics().await;
    assert_eq!(
        metric(&text, &format!("trainlet_port_conflict{{port=\"{port}\"}}")),
        Some(0.0)
    );
    assert_eq!(r.terminate().0, 0);
}

/// The API server stops for a few seconds while a conflict appears: the sidecar keeps
/// running, counts the failed calls, backs off, and the annotation appears once the
/// API server is back. A control plane of the test's own, because stopping the
/// shared one would disturb every other test.
#[tokio::test]
async fn the_sidecar_survives_an_api_server_restart_and_catches_up() {
    let cp = std::sync::Arc::new(PrivateControlPlane::start("report-restart"));
    let client = client_from(&cp.kubeconfig).await;
    let ns = namespace(&client, "restart").await;
    let port = free_port();
    pod("train-0").create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    let mut r = Reporter::start(sidecar_cmd(
        &cp.kubeconfig,
        &ns,
        "train-0",
        &["--port", &port.to_string()],
    ));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    r.wait_ready().await;

    let restart = {
        let cp = cp.clone();
        tokio::task::spawn_blocking(move || cp.restart_apiserver(Duration::from_secs(4)))
    };
    // The conflict appears while the API server is down.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), &ns);
    eventually("the API server down", Duration::from_secs(20), || async {
        pods.get("train-0").await.is_err().then_some(())
    })
    .await;
    let holder = TcpListener::bind(("127.0.0.1", port)).unwrap();
    eventually(
        "a failed API call counted",
        Duration::from_secs(20),
        || async {
            (metric(&r.metrics().await, "trainlet_api_errors_total") >= Some(1.0)).then_some(())
        },
    )
    .await;
    assert!(r.alive(), "the sidecar died: {}", r.stderr());
    restart.await.unwrap();

    let client = client_from(&cp.kubeconfig).await;
    support::eventually(
        "the conflict annotation after the restart",
        Duration::from_secs(45),
        || async {
            let a = annotations(&client, &ns, "train-0").await;
            (a.get("trainlet.io/port-conflict") == Some(&port.to_string())).then_some(())
        },
    )
    .await;
    assert!(r.alive());
    assert_eq!(r.terminate().0, 0, "{}", r.stderr());
    drop(holder);
}

/// The sidecar in a PID namespace of its own with its own /proc, as a container
/// without `shareProcessNamespace`: it sees the pod's sockets but not their owners.
fn isolated_sidecar(
    kubeconfig: &std::path::Path,
    ns: &str,
    pod: &str,
) -> Result<Reporter, Missing> {
    let ok = std::process::Command::new("unshare")
        .args(["-p", "-f", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err(Missing::new(
            Group::Root,
            "cannot make a PID namespace with `unshare -p -f --mount-proc` (needs root)",
        ));
    }
    let inner = sidecar_cmd(kubeconfig, ns, pod, &[]);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-p", "-f", "--mount-proc", "--kill-child=SIGTERM"])
        .arg(inner.get_program())
        .args(inner.get_args());
    cmd.env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
    Ok(Reporter::start(cmd))
}

/// A native sidecar starts before the training container. A port that is already
/// listening then, by a process it cannot see, is a conflict (case 2) once the pod says
/// when the container started (before that, its view of the pod may lag the kubelet,
/// and nothing is judged), and stays one; a port that starts listening after the
/// container started is the container's own.
#[tokio::test]
async fn a_native_sidecar_flags_a_port_taken_before_the_container_started() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "early", dir.path()).await;
    let early = TcpListener::bind("127.0.0.1:0").unwrap();
    let early_port = early.local_addr().unwrap().port();
    let late_port = free_port();
    pod("train-0")
        .port("tf", early_port as i32)
        .port("late", late_port as i32)
        .create(&client, &ns)
        .await;
    let r = require!(isolated_sidecar(&kc, &ns, "train-0"));
    // Not started yet: the early port only listens.
    eventually(
        "the early port listening",
        Duration::from_secs(20),
        || async {
            let a = annotations(&client, &ns, "train-0").await;
            let r: serde_json::Value = serde_json::from_str(a.get("trainlet.io/report")?).ok()?;
            r["ports"]
                .as_array()?
                .iter()
                .any(|p| p["port"] == early_port && p["state"] == "listening")
                .then_some(())
        },
    )
    .await;
    assert!(warnings(&client, &ns).await.is_empty());
    // The container starts, to the second (the API's precision) after the second in
    // which the sidecar saw the early port: that port was there before it.
    let seen = SystemTime::now();
    eventually("the next second", Duration::from_secs(5), || async {
        (whole_seconds(SystemTime::now()) > whole_seconds(seen)).then_some(())
    })
    .await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    r.logged("the training container started").await;
    wait_annotation(
        &client,
        &ns,
        "train-0",
        "trainlet.io/port-conflict",
        &early_port.to_string(),
    )
    .await;
    assert_eq!(
        wait_warning(&client, &ns, "PortConflict").await,
        format!(
            "port {early_port} was already listening before container trainer started; trainer cannot listen on it"
        )
    );
    // Then it listens on its other port: its own.
    let late = TcpListener::bind(("127.0.0.1", late_port)).unwrap();
    let report = eventually(
        "the late port listening",
        Duration::from_secs(20),
        || async {
            let a = annotations(&client, &ns, "train-0").await;
            let r: serde_json::Value = serde_json::from_str(a.get("trainlet.io/report")?).ok()?;
            let late = r["ports"]
                .as_array()?
                .iter()
                .find(|p| p["port"] == late_port)?
                .clone();
            (late["state"] == "listening").then_some((a, r))
        },
    )
    .await;
    let (a, report) = report;
    assert_eq!(a["trainlet.io/port-conflict"], early_port.to_string());
    assert_eq!(
        report["ports"],
        if early_port < late_port {
            json!([
                {"port": early_port, "state": "conflict", "reason": "before-start"},
                {"port": late_port, "state": "listening"}
            ])
        } else {
            json!([
                {"port": late_port, "state": "listening"},
                {"port": early_port, "state": "conflict", "reason": "before-start"}
            ])
        }
    );
    assert_eq!(warnings(&client, &ns).await.len(), 1);
    drop(r);
    drop((early, late));
}

/// With `hostNetwork: true`, an invisible process that held the port before the
/// container started is something else on the node (case 3), said once the pod gives
/// the container's start.
#[tokio::test]
async fn with_host_network_an_early_invisible_holder_is_on_the_node() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "hostnet", dir.path()).await;
    let holder = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    pod("train-0")
        .host_network()
        .port("tf", port as i32)
        .create(&client, &ns)
        .await;
    let mut r = require!(isolated_sidecar(&kc, &ns, "train-0"));
    r.logged("report: ").await;
    let seen = SystemTime::now();
    eventually("the next second", Duration::from_secs(5), || async {
        (whole_seconds(SystemTime::now()) > whole_seconds(seen)).then_some(())
    })
    .await;
    assert!(warnings(&client, &ns).await.is_empty());
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    assert_eq!(
        wait_warning(&client, &ns, "PortConflict").await,
        format!(
            "port {port} is already in use on the node (hostNetwork: true) by a process outside this pod, since before container trainer started"
        )
    );
    let a = annotations(&client, &ns, "train-0").await;
    assert_eq!(a["trainlet.io/port-conflict"], port.to_string());
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(
        report["ports"],
        json!([{"port": port, "state": "conflict", "reason": "host-network"}])
    );
    assert!(r.alive());
    drop(holder);
}

/// Seconds since the epoch, as the API gives a container's start.
fn whole_seconds(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()
}
