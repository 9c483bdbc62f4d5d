//! The pre-flight against hostile peers: the pods of [`crate::preflight`]'s ring, each
//! `trainlet init --preflight` a process of its own, and the test as what else reaches
//! a task's port over real sockets on loopback: a connection that drips a byte a second,
//! 130 idle connections, a forged hello from a plain `TcpStream`.
//!
//! `--timeout` is a hard deadline: each run must end within it and 2 s more (its last
//! lookups and Event), or the test kills it and fails.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::preflight::{pending_pods, preflight_init, proven};
use crate::support::*;

/// A run started now, whose end the test waits for; killed if the test ends first.
struct Started {
    child: Child,
    start: Instant,
    out: Option<tempfile::TempDir>,
    stderr: tempfile::NamedTempFile,
}

impl Drop for Started {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start(ns: &str, i: usize, timeout: &str) -> Started {
    let out = tempfile::tempdir().unwrap();
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut cmd: Command = preflight_init(ns, i, out.path(), timeout);
    cmd.stdout(Stdio::null()).stderr(stderr.reopen().unwrap());
    let child = cmd.spawn().expect("spawn trainlet");
    Started {
        child,
        start: Instant::now(),
        out: Some(out),
        stderr,
    }
}

impl Started {
    /// Its run and how long it took, once it ended; a run still going after `limit` is
    /// killed, and fails the test.
    async fn end(mut self, limit: Duration) -> (Run, Duration, tempfile::TempDir) {
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if self.start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let log = std::fs::read_to_string(self.stderr.path()).unwrap();
                panic!("init still ran after {limit:?}, killed:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let took = self.start.elapsed();
        let run = Run {
            code: status.code().unwrap_or(-1),
            stdout: String::new(),
            stderr: std::fs::read_to_string(self.stderr.path()).unwrap(),
        };
        (run, took, self.out.take().unwrap())
    }
}

/// A connection to a pod's task port, once its pre-flight listens there (before that
/// the port refuses: init's port check binds without listening).
async fn connected(address: &str) -> TcpStream {
    eventually(
        &format!("the pre-flight to listen on {address}"),
        Duration::from_secs(60),
        || async { TcpStream::connect(address).await.ok() },
    )
    .await
}

/// Writes a byte a second until the pod closes the connection, or the task is aborted.
fn drip(mut s: TcpStream) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while s.write_all(b"t").await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

fn ports() -> [u16; 3] {
    [free_port(), free_port(), free_port()]
}

/// What pf-1 says when worker/0 never reaches it and worker/2 never listens.
fn alone(ips: [&str; 3], ports: [u16; 3]) -> [String; 2] {
    [
        format!(
            "worker/2 (pf-2) at {}:{} refused this pod's connections for ",
            ips[2], ports[2]
        ),
        format!(
            "worker/0 (pf-0, {}) did not reach this pod's port {} within ",
            ips[0], ports[1]
        ),
    ]
}

/// One connection that drips a byte a second to pf-1's port (version 1 waited 5 s per
/// read, one connection at a time: a pod ran 152 s under `--timeout 30s`): pf-1, whose
/// neighbours never run, still ends by its timeout, with exit 10 naming both.
#[tokio::test]
async fn a_dripping_connection_holds_no_pod_past_its_timeout() {
    let ips = ["127.0.43.1", "127.0.43.2", "127.0.43.3"];
    let ports = ports();
    let ns = pending_pods("preflight-drip", ips, ports).await;
    let pf1 = start(&ns, 1, "4s");
    let dripping = drip(connected(&format!("{}:{}", ips[1], ports[1])).await);
    let (r, took, out) = pf1.end(Duration::from_secs(4 + 2)).await;
    dripping.abort();
    assert_eq!(r.code, 10, "{}", r.stderr);
    assert!(took <= Duration::from_secs(6), "{took:?}");
    let last = r.error_line();
    for says in alone(ips, ports) {
        assert!(last.contains(&says), "{last}");
    }
    assert_eq!(
        list_dir(out.path()),
        Vec::<String>::new(),
        "nothing written"
    );
    delete_namespace(&admin().await, &ns).await;
}

/// 130 idle connections on pf-1's port before pf-0 starts (version 1 waited 5 s for each
/// in turn, and pf-0's hello behind them): pf-0 still gets through, and the ring forms.
#[tokio::test]
async fn idle_connections_do_not_keep_the_previous_task_out() {
    let ips = ["127.0.44.1", "127.0.44.2", "127.0.44.3"];
    let ports = ports();
    let ns = pending_pods("preflight-idle", ips, ports).await;
    let (pf1, pf2) = (start(&ns, 1, "20s"), start(&ns, 2, "20s"));
    let address = format!("{}:{}", ips[1], ports[1]);
    let mut idle = vec![connected(&address).await];
    for _ in 1..130 {
        idle.push(TcpStream::connect(&address).await.unwrap());
    }
    let pf0 = start(&ns, 0, "20s");
    let limit = Duration::from_secs(20 + 2);
    let ends = [
        pf0.end(limit).await,
        pf1.end(limit).await,
        pf2.end(limit).await,
    ];
    for (i, (r, _, out)) in ends.iter().enumerate() {
        assert_eq!(r.code, 0, "pf-{i}: {}", r.stderr);
        assert!(proven(&r.stderr), "pf-{i}: {}", r.stderr);
        assert!(out.path().join("tf_config.json").exists(), "pf-{i}");
    }
    drop(idle);
    delete_namespace(&admin().await, &ns).await;
}

/// The split verdict: while a dripping connection held pf-1, pf-0's hello waited
/// in the backlog; pf-0 gave up (exit 10, blaming pf-1), and pf-1 took the abandoned
/// hello once the drip ended and wrote its files (exit 0). Both ends of the path from
/// pf-0 to pf-1 must reach the same verdict: here, both proven.
#[tokio::test]
async fn both_ends_of_a_path_reach_the_same_verdict() {
    let ips = ["127.0.45.1", "127.0.45.2", "127.0.45.3"];
    let ports = ports();
    let ns = pending_pods("preflight-split", ips, ports).await;
    let (pf1, pf2) = (start(&ns, 1, "60s"), start(&ns, 2, "60s"));
    let dripping = drip(connected(&format!("{}:{}", ips[1], ports[1])).await);
    let (r0, _, _) = start(&ns, 0, "8s").end(Duration::from_secs(40)).await;
    // The drip ends only once pf-0 has: what pf-1 may take from its backlog then is a
    // hello whose sender is gone.
    dripping.abort();
    let limit = Duration::from_secs(60 + 2);
    let ((r1, _, _), (r2, _, _)) = (pf1.end(limit).await, pf2.end(limit).await);
    assert_eq!(
        (r0.code, r1.code),
        (0, 0),
        "pf-0 and pf-1 on their path:\npf-0: {}\npf-1: {}",
        r0.stderr,
        r1.stderr
    );
    assert_eq!(r2.code, 0, "{}", r2.stderr);
    for (i, r) in [&r0, &r1, &r2].into_iter().enumerate() {
        assert!(proven(&r.stderr), "pf-{i}: {}", r.stderr);
    }
    delete_namespace(&admin().await, &ns).await;
}

/// Version 1's hello, `trainlet-preflight worker/0`, from a plain socket: it gets no
/// `ok`, and pf-1, whose worker/0 never runs, does not count itself reached by it.
#[tokio::test]
async fn a_forged_hello_gets_no_ok_and_does_not_count() {
    let ips = ["127.0.46.1", "127.0.46.2", "127.0.46.3"];
    let ports = ports();
    let ns = pending_pods("preflight-forged", ips, ports).await;
    let pf1 = start(&ns, 1, "5s");
    let mut forger = connected(&format!("{}:{}", ips[1], ports[1])).await;
    forger
        .write_all(b"trainlet-preflight worker/0\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), forger.read_to_string(&mut answer))
        .await
        .expect("the pod closes the forger's connection")
        .unwrap();
    assert_eq!(answer, "trainlet-preflight/2 refused format\n");
    let (r, took, out) = pf1.end(Duration::from_secs(5 + 2)).await;
    assert_eq!(r.code, 10, "{}", r.stderr);
    assert!(took <= Duration::from_secs(7), "{took:?}");
    let last = r.error_line();
    for says in alone(ips, ports) {
        assert!(last.contains(&says), "{last}");
    }
    assert!(
        last.contains(
            "(the last hello refused: not a pre-flight line of this version: \"trainlet-preflight worker/0\\n\")"
        ),
        "{last}"
    );
    assert_eq!(
        list_dir(out.path()),
        Vec::<String>::new(),
        "nothing written"
    );
    delete_namespace(&admin().await, &ns).await;
}
