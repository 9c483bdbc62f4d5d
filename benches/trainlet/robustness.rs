//! Scenario 7: what trainlet takes when things go wrong, as figures the tests no longer
//! assert (a test checks the behaviour; how fast or how small is measured here).
//!
//! - **SIGTERM to exit.** The kubelet stops a container with SIGTERM and kills it
//!   after the grace period (30 s by default). `trainlet sidecar` (on a pod whose
//!   training container has ended, as the kubelet stops a native sidecar) and `trainlet
//!   exec --report -- sleep 3600` (which passes the SIGTERM on to CMD) on a running pod, each
//!   [`ROUNDS`] times, alternating: from the signal to the process's exit, with its exit
//!   code (0 for the sidecar, 143 for exec: CMD's).
//! - **API server outage.** Four `trainlet init` agents wait for their pods on a
//!   private control plane (a new one each round); kube-apiserver goes away for 5 s
//!   and comes back on the same etcd; then the pods turn Running. From the last pod's
//!   Running status to the last `tf_config.json`, [`ROUNDS`] rounds. Before the watch's retry was bounded
//!   (100 ms doubling to 500 ms), kube-runtime's default backoff made this 11.6 s.
//! - **500 slow connections.** A sidecar's metrics endpoint gets 500 connections that
//!   each send a 380 KiB request head 4 KiB at a time and never finish it. The
//!   sidecar's peak RSS (VmHWM) before and after, `/metrics` asked three times during
//!   the attack, and the time from the attack's last byte until the server closed
//!   every connection (its request heads must arrive within 5 s).

use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use kube::Client;
use serde::Serialize;

use crate::report_support::{self as rs, Reporter};
use crate::sidecar::{rbac_namespace, status_field};
use crate::support::{self, Kubelet, pod};

/// Runs of each measurement.
pub const ROUNDS: usize = 5;
/// SIGTERM to exit: well inside the kubelet's 30 s grace period.
pub const TARGET_SIGTERM_MS: f64 = 2000.0;
/// After a 5 s outage: the watch's retry tops at 500 ms, then a resolve.
pub const TARGET_OUTAGE_MS: f64 = 1000.0;

#[derive(Debug, Clone, Serialize)]
pub struct Sigterm {
    pub process: String,
    pub exit_ms: Vec<f64>,
    pub exit_codes: Vec<i32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Slow {
    pub connections: usize,
    pub peak_rss_kib_before: u64,
    pub peak_rss_kib_after: u64,
    /// `/metrics` answered with its body, of three asks during the attack.
    pub metrics_answered: usize,
    /// From the attack's last byte until the server had closed every connection.
    pub all_closed_ms: f64,
    pub still_open: usize,
    pub alive: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub sigterm: Vec<Sigterm>,
    pub target_sigterm_ms: f64,
    pub outage_s: f64,
    pub agents: usize,
    /// Per round: from the last pod's Running status to the last agent's file.
    pub after_outage_ms: Vec<f64>,
    pub outage_failures: usize,
    pub target_outage_ms: f64,
    pub slow: Slow,
}

pub async fn run(client: &Client, kubeconfig: &Path) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(client, kubeconfig, "robust", dir.path()).await;
    let kubelet = Kubelet::new(client, &ns);
    pod("train-0").create(client, &ns).await;
    kubelet.run("train-0", "10.1.0.5").await;
    // The kubelet stops a native sidecar once the training container has ended: the
    // sidecar's pod says so (a sidecar stopped while the pod shows it running waits up
    // to 5 s for the pod to say how it ended, its last look).
    pod("ended-0").create(client, &ns).await;
    kubelet.run("ended-0", "10.1.0.6").await;
    let now = support::now();
    kubelet
        .status(
            "ended-0",
            serde_json::json!({"containerStatuses": [{
                "name": "trainer", "image": "registry.example/train:1", "imageID": "",
                "ready": false, "restartCount": 0, "started": false,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
            }]}),
        )
        .await;

    // SIGTERM to exit.
    let mut sigterm = vec![
        Sigterm {
            process: "trainlet sidecar".into(),
            exit_ms: Vec::new(),
            exit_codes: Vec::new(),
        },
        Sigterm {
            process: "trainlet exec --report -- sleep 3600".into(),
            exit_ms: Vec::new(),
            exit_codes: Vec::new(),
        },
    ];
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let out = tempfile::tempdir().unwrap();
            let cmd = if which == 0 {
                support::sidecar_cmd(&kc, &ns, "ended-0", &[])
            } else {
                support::write_tf_config(out.path(), support::free_port());
                support::exec_cmd(&kc, &ns, "train-0", out.path(), &["--", "sleep", "3600"])
            };
            let mut r = Reporter::start(cmd);
            r.wait_ready().await;
            let (code, took) = tokio::task::block_in_place(|| r.terminate());
            sigterm[which].exit_ms.push(took.as_secs_f64() * 1e3);
            sigterm[which].exit_codes.push(code);
        }
    }

    // The outage, on a control plane of its own.
    let (agents, after_outage_ms, outage_failures) = outage().await;

    // 500 slow connections.
    let mut r = Reporter::start(support::sidecar_cmd(&kc, &ns, "train-0", &[]));
    r.wait_ready().await;
    let before = status_field(r.pid(), "VmHWM:");
    let rounds = Arc::new(AtomicUsize::new(0));
    let attack = rs::slow_burst(r.metrics_addr.clone(), rounds.clone());
    let mut metrics_answered = 0;
    for at in [1, 32, 64] {
        support::eventually(
            &format!("round {at} of the attack"),
            Duration::from_secs(120),
            || async { (rounds.load(Ordering::SeqCst) >= at).then_some(()) },
        )
        .await;
        if matches!(rs::http_get(&r.metrics_addr, "/metrics"), Ok((200, _, ref b)) if b.contains("trainlet_health"))
        {
            metrics_answered += 1;
        }
    }
    let conns: Vec<TcpStream> = tokio::task::block_in_place(|| attack.join().unwrap());
    let sent = Instant::now();
    let connections = conns.len();
    let deadline = sent + Duration::from_secs(60);
    let still_open = tokio::task::block_in_place(|| {
        conns
            .into_iter()
            .filter(|s| !rs::closed_by_server(&mut s.try_clone().unwrap(), deadline))
            .count()
    });
    let all_closed_ms = sent.elapsed().as_secs_f64() * 1e3;
    let slow = Slow {
        connections,
        peak_rss_kib_before: before,
        peak_rss_kib_after: status_field(r.pid(), "VmHWM:"),
        metrics_answered,
        all_closed_ms,
        still_open,
        alive: r.alive(),
    };
    let _ = tokio::task::block_in_place(|| r.terminate());

    Outcome {
        sigterm,
        target_sigterm_ms: TARGET_SIGTERM_MS,
        outage_s: 5.0,
        agents,
        after_outage_ms,
        outage_failures,
        target_outage_ms: TARGET_OUTAGE_MS,
        slow,
    }
}

/// [`ROUNDS`] outages of 5 s under four waiting agents: the agents, the time from the
/// last pod's Running status to the last file, per round, and the agents that failed.
async fn outage() -> (usize, Vec<f64>, usize) {
    const AGENTS: usize = 4;
    let mut after = Vec::new();
    let mut failures = 0;
    for round in 0..ROUNDS {
        // A control plane per round: after an outage, its kube-controller-manager's
        // informers are still in their backoff, and a new namespace may wait half a
        // minute for its default ServiceAccount.
        let cp = support::PrivateControlPlane::start("bench-outage");
        let client = support::client_from(&cp.kubeconfig).await;
        let ns = support::namespace(&client, &format!("outage-{round}")).await;
        let port = support::free_port().to_string();
        let (names, dirs, agents) =
            support::waiting_agents(&cp.kubeconfig, &client, &ns, AGENTS, &port).await;
        eprintln!("bench: API server outage {} of {ROUNDS}", round + 1);
        tokio::task::block_in_place(|| cp.restart_apiserver(Duration::from_secs(5)));
        let client = support::client_from(&cp.kubeconfig).await;
        let kubelet = Kubelet::new(&client, &ns);
        let mut last_running = SystemTime::now();
        for (i, n) in names.iter().enumerate() {
            kubelet.run(n, &format!("10.22.0.{i}")).await;
            last_running = SystemTime::now();
        }
        let mut last_written = None;
        for (agent, dir) in agents.into_iter().zip(&dirs) {
            let r = agent.await.unwrap();
            if r.code != 0 {
                failures += 1;
                eprintln!("bench: an agent failed after the outage: {}", r.stderr);
                continue;
            }
            let t = std::fs::metadata(dir.path().join("tf_config.json"))
                .and_then(|m| m.modified())
                .unwrap();
            last_written = last_written.max(Some(t));
        }
        if let Some(t) = last_written {
            let ms = t
                .duration_since(last_running)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3);
            after.push(ms);
        }
    }
    (AGENTS, after, failures)
}
