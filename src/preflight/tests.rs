//! The pre-flight over real sockets on loopback, in-process, against hostile peers:
//! a connection that drips a byte at a time, many idle ones, a forged hello, a pod of
//! another resolution and a hello abandoned before its confirm.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::hello::{self, Key, Path};
use super::inbound::{CONCURRENT, read_line};
use super::ring::{Ring, ring};
use super::{PreflightError, prove};
use crate::cluster::{Cluster, Peer};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `n` workers on loopback, each on a port of its own; `uid` names the resolution.
fn cluster(n: usize, uid: &str) -> Cluster {
    let mut c = Cluster::default();
    let peers = (0..n)
        .map(|i| Peer {
            name: format!("pf-{i}"),
            task_type: "worker".into(),
            index: i,
            address: format!("127.0.0.1:{}", free_port()),
            node: Some("node-a".into()),
            uid: format!("{uid}-{i}"),
            namespace: "ns".into(),
            pod_ip: None,
            slot: String::new(),
            past_init: false,
        })
        .collect();
    c.tasks.insert("worker".into(), peers);
    c
}

fn of(c: &Cluster, i: usize) -> Ring {
    ring(c, &format!("worker/{i}")).unwrap()
}

/// A pod's pre-flight within `within`, with no neighbour past its init; how long it took.
async fn pod(r: Ring, own: &str, within: Duration) -> (Result<(), String>, Duration) {
    let start = Instant::now();
    let r = prove(&r, own, LOOPBACK, within, async |_: &str| false).await;
    let r = r.map(|_| ()).map_err(|e| match e {
        PreflightError::Unreachable(p) => p.join("; "),
        e => e.to_string(),
    });
    (r, start.elapsed())
}

/// Connects to `address` once its pre-flight listens (before, the port refuses).
async fn connected(address: &str) -> TcpStream {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = TcpStream::connect(address).await {
            return s;
        }
        assert!(Instant::now() < until, "{address} never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What pod 1 of 3 says when worker/0 never reaches it and worker/2 never listens.
fn alone(c: &Cluster, secs: u64, refused: &str) -> String {
    let w2 = &c.tasks["worker"][2];
    let own = c.tasks["worker"][1].address.rsplit_once(':').unwrap().1;
    format!(
        "worker/2 (pf-2) at {} refused this pod's connections for {secs}s: its trainlet-init never listened; worker/0 (pf-0, 127.0.0.1) did not reach this pod's port {own} within {secs}s{refused}",
        w2.address
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_of_one_resolution_prove_their_ring() {
    let c = cluster(3, "u");
    let within = Duration::from_secs(20);
    let (a, b, d) = tokio::join!(
        pod(of(&c, 0), "worker/0", within),
        pod(of(&c, 1), "worker/1", within),
        pod(of(&c, 2), "worker/2", within)
    );
    assert_eq!((a.0, b.0, d.0), (Ok(()), Ok(()), Ok(())));
}

/// A connection that drips a byte a second (the version-1 accept loop waited 5 s per
/// read, one connection at a time): the pod still ends by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dripping_connection_holds_no_pod_past_its_deadline() {
    let c = cluster(3, "u");
    let me = tokio::spawn(pod(of(&c, 1), "worker/1", Duration::from_secs(3)));
    let mut drip = connected(&c.tasks["worker"][1].address).await;
    let dripping = tokio::spawn(async move {
        while drip.write_all(b"t").await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let (r, took) = me.await.unwrap();
    dripping.abort();
    assert_eq!(r, Err(alone(&c, 3, "")));
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Many idle connections: the previous task's pod still gets through, and both end by
/// their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_keep_the_previous_task_out() {
    let c = cluster(2, "u");
    let within = Duration::from_secs(10);
    let first = tokio::spawn(pod(of(&c, 1), "worker/1", within));
    let address = &c.tasks["worker"][1].address;
    let mut idle = vec![connected(address).await];
    for _ in 0..130 {
        idle.push(TcpStream::connect(address).await.unwrap());
    }
    assert!(idle.len() > CONCURRENT);
    let second = pod(of(&c, 0), "worker/0", within).await;
    assert_eq!(second.0, Ok(()));
    let (r, took) = first.await.unwrap();
    assert_eq!(r, Ok(()));
    assert!(took < within, "{took:?}");
}

/// Version 1's hello, which any process could send: no `ok`, and it does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_hello_gets_no_ok_and_does_not_count() {
    let c = cluster(3, "u");
    let me = tokio::spawn(pod(of(&c, 1), "worker/1", Duration::from_secs(3)));
    let mut forger = connected(&c.tasks["worker"][1].address).await;
    forger
        .write_all(b"trainlet-preflight worker/0\n")
        .await
        .unwrap();
    let mut answer = String::new();
    forger.read_to_string(&mut answer).await.unwrap();
    assert_eq!(answer, "trainlet-preflight/2 refused format\n");
    let (r, _) = me.await.unwrap();
    let why = " (the last hello refused: not a pre-flight line of this version: \"trainlet-preflight worker/0\\n\")";
    assert_eq!(r, Err(alone(&c, 3, why)));
}

/// A pod that resolved another cluster (a pod of the job replaced since): neither end
/// counts the path, and each says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_of_another_resolution_is_refused() {
    let c = cluster(2, "u");
    let mut other = c.clone();
    other.tasks.get_mut("worker").unwrap()[1].uid = "replaced".into();
    let within = Duration::from_secs(3);
    let (a, b) = tokio::join!(
        pod(of(&c, 0), "worker/0", within),
        pod(of(&other, 1), "worker/1", within)
    );
    let (w0, w1) = (&c.tasks["worker"][0].address, &c.tasks["worker"][1].address);
    let port = |a: &str| a.rsplit_once(':').unwrap().1.to_string();
    let said = |other: &str, at: &str, own: &str| {
        format!(
            "this pod cannot reach {other} (pf-{}) at {at}: its trainlet-init refused this pod's hello: it resolved another cluster than this pod; {other} (pf-{}, 127.0.0.1) did not reach this pod's port {} within 3s (the last hello refused: it did not resolve the same cluster as this pod (or forged its line))",
            &other[7..],
            &other[7..],
            port(own)
        )
    };
    assert_eq!(a.0, Err(said("worker/1", w1, w0)));
    assert_eq!(b.0, Err(said("worker/0", w0, w1)));
}

/// The previous task's hello, acknowledged, but never confirmed (its pod gave up, or
/// it sat in the backlog after its pod left): it does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_hello_counts_for_neither_end() {
    let c = cluster(3, "u");
    let r = of(&c, 1);
    let key = Key::new(&r.resolution);
    let me = tokio::spawn(pod(r, "worker/1", Duration::from_secs(3)));
    let mut s = connected(&c.tasks["worker"][1].address).await;
    let path = Path {
        from: "worker/0",
        to: "worker/1",
    };
    let nonce = [5; hello::NONCE_LEN];
    let (read, mut write) = s.split();
    write
        .write_all(hello::hello(&key, path, &nonce).as_bytes())
        .await
        .unwrap();
    let ack = read_line(&mut BufReader::new(read)).await.unwrap();
    assert!(
        hello::check_answer(&key, &ack, path, &nonce).is_ok(),
        "{ack}"
    );
    drop(s);
    let (r, _) = me.await.unwrap();
    assert_eq!(r, Err(alone(&c, 3, "")));
}
