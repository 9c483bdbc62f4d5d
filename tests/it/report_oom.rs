//! OOM kills, for real: the kernel's OOM killer in a memory cgroup of the test's own
//! kills a *child* of CMD under `trainlet exec --report` while CMD survives; and the
//! kubelet player's `OOMKilled` pod status under `trainlet sidecar`, scraped by a real
//! Prometheus server. Everything runs as the trainlet ServiceAccount.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::report_support::*;
use crate::support::*;

/// CMD starts the memory hog in the background after a second, waits for it, and
/// exits 3: the hog dies by the OOM killer, CMD does not.
#[tokio::test]
async fn exec_reports_a_child_that_the_kernel_oom_killed() {
    let limit: u64 = 96 << 20;
    let cg = require!(MemCgroup::new(limit));
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "oom", dir.path()).await;
    pod("train-0").create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("train-0", "10.1.0.5").await;
    write_tf_config(dir.path(), free_port());
    let pidfile = dir.path().join("memhog.pid");
    let script = format!(
        "sleep 1; {} 10 & echo $! > {}; wait $!; echo memhog-status=$? >&2; sleep 2; exit 3",
        memhog().display(),
        pidfile.display()
    );
    let mut cmd = exec_cmd(
        &kc,
        &ns,
        "train-0",
        dir.path(),
        &["--", "/bin/sh", "-c", &script],
    );
    // The kubelet's empty termination log, as it mounts one into every container.
    let termination = dir.path().join("termination-log");
    std::fs::write(&termination, "").unwrap();
    cmd.env("TRAINLET_TERMINATION_LOG", &termination);
    let mut r = Reporter::start(cg.wrap(&cmd));

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
    assert_eq!(report["mode"], "exec");
    let kill = &report["oom"]["recent"][0];
    assert_eq!(kill["source"], "cgroup");
    assert_eq!(kill["container"], "trainer");
    assert_eq!(kill["process"]["comm"], "memhog");
    assert_eq!(kill["process"]["pid"].to_string(), pid.trim());
    assert_eq!(kill["memory_limit"], "96Mi");
    assert!(kill["memory_peak"].as_u64().unwrap() > (64 << 20), "{kill}");
    let source = report["oom"]["sources"][0].as_str().unwrap();
    assert_eq!(
        source,
        format!("cgroup v1 {} (eventfd)", cg.path.display()),
        "the v1 eventfd notifier is used where cgroup.event_control is writable"
    );
    let text = r.metrics().await;
    assert_eq!(
        metric(&text, "trainlet_oom_kills_total{container=\"trainer\"}"),
        Some(1.0)
    );

    // CMD survived the kill of its child, and its exit code is trainlet's.
    let (code, _) = r.wait(Duration::from_secs(30));
    assert_eq!(code, 3, "{}", r.stderr());
    assert!(r.stderr().contains("memhog-status=137"), "{}", r.stderr());
    // `kubectl describe pod` shows why: CMD's code and the kill of its child.
    assert_eq!(
        std::fs::read_to_string(&termination).unwrap(),
        format!(
            "/bin/sh exited with code 3; process memhog (pid {}) in container trainer was OOM-killed; memory limit 96Mi",
            pid.trim()
        )
    );
    assert_eq!(cg.oom_kills(), 1, "the kernel counted exactly one kill");
    assert_eq!(
        warnings(&client, &ns).await,
        vec![("OOMKill".to_string(), note)],
        "one kill, one Event"
    );
}

/// Sidecar with `--cgroup-root`: the training container's cgroup, laid out as the
/// kubelet's cgroupfs driver does (`kubepods/burstable/pod<uid>/<container id>`), is
/// found by pod UID and container ID; a process in it is OOM-killed while the
/// container keeps running, which pod status never shows.
#[tokio::test]
async fn sidecar_with_cgroup_root_counts_a_kill_inside_the_container() {
    let cg = require!(MemCgroup::new(1 << 30));
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "oomcg", dir.path()).await;
    let created = pod("train-0").create(&client, &ns).await;
    let uid = created.metadata.uid.unwrap();
    let id = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let kubelet = Kubelet::new(&client, &ns);
    kubelet.run("train-0", "10.1.0.5").await;
    kubelet
        .status(
            "train-0",
            running_with_id("trainer", &format!("containerd://{id}")),
        )
        .await;
    let container = cg.child(&format!("kubepods/burstable/pod{uid}/{id}"), 64 << 20);
    let mut r = Reporter::start(sidecar_cmd(
        &kc,
        &ns,
        "train-0",
        &["--cgroup-root", "/sys/fs/cgroup"],
    ));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    let a = annotations(&client, &ns, "train-0").await;
    let report: serde_json::Value = serde_json::from_str(&a["trainlet.io/report"]).unwrap();
    assert_eq!(
        report["oom"]["sources"],
        serde_json::json!([
            format!("cgroup v1 {} (eventfd)", container.display()),
            "pod status"
        ])
    );

    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$1\"")
        .arg(&container)
        .arg(memhog())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "the kernel killed the hog");
    assert_eq!(
        wait_warning(&client, &ns, "OOMKill").await,
        "a process in container trainer was OOM-killed; memory limit 64Mi"
    );
    wait_annotation(&client, &ns, "train-0", "trainlet.io/oom-kills", "1").await;
    assert_eq!(r.terminate().0, 0);
}

/// The kubelet reports a container OOMKilled and restarted: counted once, in sidecar
/// mode, however often the kubelet rewrites it; a real Prometheus scrapes the counter;
/// promtool accepts /metrics.
#[tokio::test]
async fn sidecar_counts_an_oomkilled_restart_and_prometheus_sees_it() {
    require!(on_path(Group::Deps, "prometheus", PROMETHEUS_PACKAGE));
    require!(on_path(Group::Deps, "promtool", PROMETHEUS_PACKAGE));
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "oomst", dir.path()).await;
    pod("train-0").create(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    kubelet.run("train-0", "10.1.0.5").await;
    let mut r = Reporter::start(sidecar_cmd(&kc, &ns, "train-0", &[]));
    wait_annotation(&client, &ns, "train-0", "trainlet.io/health", "ok").await;
    assert_eq!(
        annotations(&client, &ns, "train-0").await["trainlet.io/oom-kills"],
        "0"
    );

    let prom = Prometheus::start(&r.metrics_addr, dir.path());
    let first = std::time::SystemTime::now();
    kubelet.oom_killed_at("train-0", "trainer", 1, first).await;
    wait_annotation(&client, &ns, "train-0", "trainlet.io/oom-kills", "1").await;
    let note = wait_warning(&client, &ns, "OOMKill").await;
    assert_eq!(
        note,
        "container trainer was OOM-killed (exit code 137) and restarted (restart 1)"
    );
    // The kubelet writing the status again (a new finishedAt, the same restart) is
    // the same kill. The next restart is the next kill: the pod watch delivers the
    // writes in order, so once its Event is out the sidecar has seen the rewrite too,
    // and counted it or not.
    kubelet
        .oom_killed_at("train-0", "trainer", 1, first + Duration::from_secs(1))
        .await;
    kubelet
        .oom_killed_at("train-0", "trainer", 2, first + Duration::from_secs(2))
        .await;
    let second = "container trainer was OOM-killed (exit code 137) and restarted (restart 2)";
    eventually(
        "the OOMKill Event of restart 2",
        Duration::from_secs(30),
        || async { (count_warnings(&client, &ns, "OOMKill").await == 2).then_some(()) },
    )
    .await;
    assert_eq!(
        warnings(&client, &ns).await,
        vec![
            ("OOMKill".to_string(), note),
            ("OOMKill".to_string(), second.to_string())
        ],
        "two kills, two Events: the rewrite is no kill"
    );
    assert_eq!(
        metric(
            &r.metrics().await,
            "trainlet_oom_kills_total{container=\"trainer\"}"
        ),
        Some(2.0)
    );
    wait_annotation(&client, &ns, "train-0", "trainlet.io/oom-kills", "2").await;

    // Prometheus scrapes every second; asking more often than that gains nothing.
    let start = std::time::Instant::now();
    let series = loop {
        let v = prom.query("trainlet_oom_kills_total");
        if let Some(first) = v.as_ref().and_then(|v| v["data"]["result"].get(0))
            && first["value"][1] == "2"
        {
            break first.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus never saw trainlet_oom_kills_total 2: {v:?}; targets: {:?}",
            http_get(&prom.addr, "/api/v1/targets")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        series["metric"],
        serde_json::json!({
            "__name__": "trainlet_oom_kills_total",
            "container": "trainer",
            "instance": r.metrics_addr,
            "job": "trainlet"
        })
    );

    // Prometheus asked for OpenMetrics; promtool, like curl, gets the classic format.
    let (status, ctype, om) =
        http_get_accept(&r.metrics_addr, "/metrics", "application/openmetrics-text").unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        ctype,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    let (_, ctype, classic) = http_get(&r.metrics_addr, "/metrics").unwrap();
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    assert_eq!(
        metric(&classic, "trainlet_oom_kills_total{container=\"trainer\"}"),
        Some(2.0)
    );
    promtool_check(&classic);
    assert_eq!(r.terminate().0, 0);
}

/// Where promtool and prometheus come from (the test requires both up front).
const PROMETHEUS_PACKAGE: &str = "make deps installs Debian's prometheus";

fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "",
        "promtool has lint complaints"
    );
}

/// A Prometheus server on loopback scraping one target every second.
struct Prometheus {
    child: std::process::Child,
    addr: String,
}

impl Prometheus {
    fn start(target: &str, dir: &std::path::Path) -> Prometheus {
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: trainlet\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus runs");
        Prometheus { child, addr }
    }

    /// The answer to a query, once the server answers.
    fn query(&self, q: &str) -> Option<serde_json::Value> {
        let (status, _, body) = http_get(&self.addr, &format!("/api/v1/query?query={q}")).ok()?;
        (status == 200).then(|| serde_json::from_str(&body).ok())?
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
