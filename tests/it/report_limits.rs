//! The reporter under oversized or hostile input: its HTTP endpoint stays within its
//! memory limit under slow connections, and its report always fits the annotation
//! budget while keeping as much as fits.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::report_support::*;
use crate::support::*;

/// A pod whose sidecar can run: created, bound and Running with a container ID.
async fn running_pod(client: &kube::Client, ns: &str, name: &str, ports: &[u16]) {
    let mut spec = pod(name);
    for (i, p) in ports.iter().enumerate() {
        spec = spec.port(&format!("p{i}"), i32::from(*p));
    }
    spec.create(client, ns).await;
    let kubelet = Kubelet::new(client, ns);
    kubelet.run(name, "10.1.0.5").await;
    kubelet
        .status(
            name,
            running_with_id(
                "trainer",
                "containerd://8f2c3a9e0d1b4c5a6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5",
            ),
        )
        .await;
}

/// Found by adversarial testing: 500 connections that each send an unfinished request with a 380 KiB
/// header drove the sidecar to 206 MB and an OOM kill under its 128 MiB limit, and idle
/// connections stayed open forever. Now each connection's buffer is bounded, a request
/// head must arrive within 5 s, and `/metrics` answers during and after the attack.
#[tokio::test]
async fn metrics_survives_500_slow_connections_in_128_mib() {
    let cg = require!(MemCgroup::new(128 << 20));
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "slowloris", dir.path()).await;
    running_pod(&client, &ns, "train-0", &[]).await;
    let mut r = Reporter::start(cg.wrap(&sidecar_cmd(&kc, &ns, "train-0", &[])));
    r.wait_ready().await;

    let rounds = Arc::new(AtomicUsize::new(0));
    let attack = slow_burst(r.metrics_addr.clone(), rounds.clone());
    // During the attack: once the 500 connections are open and have sent their first
    // 4 KiB, a third and two thirds of the way through its 95 rounds.
    let mut during = Vec::new();
    for at in [1, 32, 64] {
        eventually(
            &format!("round {at} of the attack"),
            Duration::from_secs(60),
            || async { (rounds.load(Ordering::SeqCst) >= at).then_some(()) },
        )
        .await;
        let got = http_get(&r.metrics_addr, "/metrics");
        during.push(matches!(got, Ok((200, _, ref body)) if body.contains("trainlet_health")));
    }
    let conns = attack.join().unwrap();
    assert!(r.alive(), "the sidecar died: {}", r.stderr());
    assert_eq!(cg.oom_kills(), 0);
    assert_eq!(during, [true, true, true], "/metrics during the attack");

    // Every slow connection is closed by the server once its 5 s header timeout
    // passes: waited for, with a deadline well past it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let still_open = conns
        .into_iter()
        .filter(|s| !closed_by_server(&mut s.try_clone().unwrap(), deadline))
        .count();
    assert_eq!(still_open, 0, "connections the server kept open");
    // Idle connections that never send a byte are closed too.
    let idle: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(&r.metrics_addr).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for mut s in idle {
        assert!(
            closed_by_server(&mut s, deadline),
            "an idle connection is still open"
        );
    }
    let text = r.metrics().await;
    assert!(text.contains("trainlet_health"), "{text}");
    // A second burst, once the first is over, is survived as well.
    drop(
        slow_burst(r.metrics_addr.clone(), Arc::new(AtomicUsize::new(0)))
            .join()
            .unwrap(),
    );
    assert!(r.alive(), "the sidecar died: {}", r.stderr());
    assert_eq!(cg.oom_kills(), 0);
    assert_eq!(r.terminate().0, 0);
}

/// Found by adversarial testing: a 20,000-character `--nvml-lib` produced a 40,633-byte report, and a
/// 120,000-character one 240,633 bytes; the API server took both. Now every string is
/// capped and the report is never more than 16 KiB.
#[tokio::test]
async fn the_report_stays_within_16_kib_whatever_the_flags_say() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "bigreport", dir.path()).await;
    for (i, len) in [20_000usize, 120_000].into_iter().enumerate() {
        let name = format!("train-{i}");
        running_pod(&client, &ns, &name, &[]).await;
        let lib = "/x".repeat(len / 2);
        let container = "c".repeat(len);
        let mut r = Reporter::start(sidecar_cmd(
            &kc,
            &ns,
            &name,
            &[
                "--nvml-lib",
                &lib,
                "--expect-gpus",
                "1",
                "--container",
                &container,
            ],
        ));
        // No NVML and no observations from exec: the count is unknown, and the
        // report carries the why, with the giant library path in it.
        wait_annotation(&client, &ns, &name, "trainlet.io/gpu-count", "unknown").await;
        let report = annotations(&client, &ns, &name).await["trainlet.io/report"].clone();
        assert!(report.len() <= 16 * 1024, "{} bytes", report.len());
        let v: Value = serde_json::from_str(&report).unwrap();
        assert_eq!(v["truncated"], true);
        assert_eq!(v["health"], "ok");
        assert_eq!(v["gpu"]["status"], "unknown");
        assert_eq!(v["gpu"]["expected"]["count"], 1);
        // Each string cut to 512 bytes, by the sidecar's own rule (what follows the
        // path in NVML's message is cut away).
        let cut = |s: String| trainlet::publish::truncate(&s, trainlet::report::budget::TEXT_MAX);
        assert_eq!(v["gpu"]["nvml"], cut(format!("unavailable: library {lib}")));
        assert_eq!(
            v["gpu"]["unknown"],
            cut(format!(
                "this sidecar has no GPU of its own (NVML: unavailable: library {lib}"
            ))
        );
        eprintln!(
            "--nvml-lib of {len} characters: report of {} bytes",
            report.len()
        );
        assert_eq!(r.terminate().0, 0);
    }
}

/// Found by adversarial testing (the other way): with 200 conflicting ports the report was cut to 1,372
/// bytes, dropping every port entry while 15 KiB were unused. Now as many conflicts and
/// reasons as fit are kept.
#[tokio::test]
async fn two_hundred_conflicts_fill_the_report_instead_of_emptying_it() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "conflicts", dir.path()).await;
    let holders: Vec<TcpListener> = (0..200)
        .map(|_| TcpListener::bind("0.0.0.0:0").unwrap())
        .collect();
    let ports: Vec<u16> = holders
        .iter()
        .map(|h| h.local_addr().unwrap().port())
        .collect();
    running_pod(&client, &ns, "train-0", &[]).await;
    let list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut r = Reporter::start(sidecar_cmd(&kc, &ns, "train-0", &["--port", &list]));
    let conflicts = eventually("200 conflicts", Duration::from_secs(30), || async {
        let a = annotations(&client, &ns, "train-0").await;
        a.get("trainlet.io/port-conflict")
            .filter(|v| v.split(',').count() == 200)
            .cloned()
    })
    .await;
    assert_eq!(conflicts.split(',').count(), 200);
    let report = annotations(&client, &ns, "train-0").await["trainlet.io/report"].clone();
    let v: Value = serde_json::from_str(&report).unwrap();
    let kept_ports = v["ports"].as_array().unwrap().len();
    let kept_reasons = v["reasons"].as_array().unwrap().len();
    eprintln!(
        "200 conflicts: report of {} bytes, {kept_ports} port entries, {kept_reasons} reasons",
        report.len()
    );
    assert!(report.len() <= 16 * 1024, "{}", report.len());
    assert!(
        report.len() > 15 * 1024,
        "budget left unused: {}",
        report.len()
    );
    assert!(kept_ports >= 40, "{kept_ports}");
    assert!(kept_reasons >= 40, "{kept_reasons}");
    assert!(
        v["ports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["state"] == "conflict")
    );
    assert_eq!(v["truncated"], true);
    drop(holders);
    assert_eq!(r.terminate().0, 0);
}
