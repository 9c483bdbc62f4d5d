//! `trainlet exec --on-failure restart` in the shipped layout (exec without
//! credentials, the sidecar watching the peers), with the real Job controller and
//! played pods: one rank's CMD is SIGKILLed, every pod's CMD starts again in place with
//! the same cluster, once, and none before every rank has stopped its old one.

use std::time::Duration;

use crate::lifecycle::{
    CMD, handover_dirs, handover_init, kill_children, restarting, start_handover_patching,
    unix_now, warnings_of,
};
use crate::report_support::*;
use crate::support::jobs::*;
use crate::support::*;

/// CMD that ignores SIGTERM (and so does its sleep, which inherits it): it stops only
/// at SIGKILL, --restart-grace (5 s) after exec asked.
const STUBBORN: [&str; 3] = [
    "sh",
    "-c",
    r#"trap '' TERM; echo "$(date +%s.%N) $TF_CONFIG" >> "$STARTS"; exec sleep 600"#,
];

/// Pod 1's CMD is SIGKILLed (137, worth a retry). Its exec publishes the failure, the
/// others' sidecars tell their exec, and every CMD starts again, once. Pod 2's CMD
/// takes its whole grace to stop: the barrier holds pods 0 and 1 until it has, and
/// no longer (the barrier's own timeout is 20 s, the sidecars' patch interval 10 s).
#[tokio::test]
async fn a_killed_rank_restarts_every_pods_command_in_place_after_every_rank_stopped() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "on-failure", dir.path()).await;
    indexed_job(&client, &ns, "w", 3, "app=w", serde_json::json!({})).await;
    let port = free_port();
    let names = run_job_pods(&client, &ns, "w", 3, |i| format!("10.9.8.{}", 10 + i)).await;
    let flags = ["--on-failure", "restart", "--max-restarts", "2"];
    let mut pods = Vec::new();
    for (i, p) in names.iter().enumerate() {
        let dirs = handover_dirs();
        let r = run(&mut handover_init(&kc, &ns, p, &dirs, port, &[]));
        assert_eq!(r.code, 0, "{p}: {}", r.stderr);
        let cmd: &[&str] = if i == 2 { &STUBBORN } else { &CMD };
        // The sidecars' default patch interval: the barrier must not wait on it.
        let pod = start_handover_patching(&kc, &ns, p, dirs, &flags, cmd, "10s");
        pod.wait(1).await;
        pods.push(pod);
    }
    // Every pod's run is published before the failure: the barrier counts them.
    for name in &names {
        eventually(
            &format!("{name}'s run in trainlet.io/progress"),
            Duration::from_secs(30),
            || async {
                let a = annotations(&client, &ns, name).await;
                let p: serde_json::Value =
                    serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
                (p["started"].is_string() && p["down"].is_null()).then_some(())
            },
        )
        .await;
    }

    let failed_at = unix_now();
    kill_children(pods[1].exec.pid());
    for p in &pods {
        p.wait(2).await;
    }
    for (i, p) in pods.iter().enumerate() {
        let starts = p.starts.read();
        assert_eq!(starts[1].1, starts[0].1, "{}: the same cluster", names[i]);
        let after = starts[1].0 - failed_at;
        assert!(
            (5.0..9.5).contains(&after),
            "{}: CMD started again {after:.2}s after the failure; pod 2's CMD stopped 5s after it at the earliest, and its sidecar says so at once, not at its next patch (10s after the last)",
            names[i]
        );
    }
    let note = format!(
        "restarting sh (1 of 2) in 1s: pod {} (worker/1, rank 1) failed: sh was killed by signal 9 (SIGKILL)",
        names[1]
    );
    for (p, name) in pods.iter().zip(&names) {
        let text = p.sidecar.metrics().await;
        assert_eq!(
            metric(&text, "trainlet_restarts_total"),
            Some(1.0),
            "{name}"
        );
        let w = warnings_of(&client, &ns, name).await;
        assert_eq!(restarting(&w), std::slice::from_ref(&note), "{name}: {w:?}");
    }
    // The failure is published on pod 1, and every pod runs again, not down.
    for name in &names {
        eventually(
            &format!("{name} running again, its one restart counted"),
            Duration::from_secs(30),
            || async {
                let a = annotations(&client, &ns, name).await;
                let p: serde_json::Value =
                    serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
                let started = humantime::parse_rfc3339(p["started"].as_str()?).ok()?;
                let started = started
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()?
                    .as_secs_f64();
                (p["down"].is_null() && started > failed_at && p["restarts"] == 1).then_some(p)
            },
        )
        .await;
    }
    let a = annotations(&client, &ns, &names[1]).await;
    let p: serde_json::Value = serde_json::from_str(&a["trainlet.io/progress"]).unwrap();
    assert_eq!(
        p["failed"]["note"],
        format!(
            "pod {} (worker/1, rank 1) failed: sh was killed by signal 9 (SIGKILL)",
            names[1]
        )
    );
    // `trainlet status` counts the restart of each pod's CMD.
    let r = run(trainlet()
        .args([
            "status",
            "-l",
            "app=w",
            "-o",
            "json",
            "-n",
            &ns,
            "--kubeconfig",
        ])
        .arg(kubeconfig()));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let counted: Vec<(&str, u64)> = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pod"].as_str().unwrap(), p["restarts"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        counted,
        names.iter().map(|n| (n.as_str(), 1)).collect::<Vec<_>>(),
        "{}",
        r.stdout
    );
    // One restart for one failure: the published failure restarts nothing again.
    for (p, name) in pods.iter().zip(&names) {
        assert!(
            !p.starts.reached(3, Duration::from_secs(3)).await,
            "{name}: a second restart for the same failure"
        );
    }
    delete_namespace(&client, &ns).await;
}
