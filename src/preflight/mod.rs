//! The pre-flight (`init --preflight`): before any file is written, the pod proves that
//! the network carries its job's traffic. A job whose pods cannot reach each other (a
//! NetworkPolicy, a firewall between nodes, a broken route on one node) otherwise
//! starts, and the framework hangs in its rendezvous for its own timeout (30 minutes in
//! PyTorch) naming no peer.
//!
//! Each pod listens on its own task's port (free: init checked it) and connects to the
//! next task's address, the very address the files give the framework, while the
//! previous task's pod connects to it ([`ring`]); both ends say who failed. A peer
//! already past its init (a replacement joining a running job) is not waited for, and
//! its refusal counts as an answer: its training process need not listen on the task's
//! port.

pub mod ring;

use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use ring::{ACK, HELLO_MAX, Outbound, Ring, hello, parse_hello, verdict};

/// Between connection attempts while the next pod's init is not listening yet: a
/// refusal costs a round trip, and the last pod to resolve should be reached at once.
const RETRY: Duration = Duration::from_millis(50);
/// How long one attempt may take, and an accepted connection may take to say who it is.
const ATTEMPT: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum PreflightError {
    /// A path of the ring is not proven: each problem names the peer and the side.
    #[error("the network between the job's pods is not proven: {}", .0.join("; "))]
    Unreachable(Vec<String>),
    #[error("cannot listen on the task's port {port} for the pre-flight: {why}")]
    Listen { port: u16, why: String },
}

/// What the pre-flight proved, for the log.
#[derive(Debug)]
pub struct Proven {
    pub took: Duration,
}

/// Proves the ring around `own` (`type/index`) within `within`. `past_init` says
/// whether a peer's pod (by name) is past its init containers: Running or finished.
pub async fn prove(
    ring: &Ring,
    own: &str,
    bind: std::net::IpAddr,
    within: Duration,
    past_init: impl AsyncFn(&str) -> bool,
) -> Result<Proven, PreflightError> {
    let start = Instant::now();
    let deadline = start + within;
    let listener = listen(bind, ring.port).await?;
    // As resolved: no request to the API server while every pod of the job is in its
    // init, the common case (2N requests at once would cost a large job seconds).
    let previous_past = ring.previous.past_init;
    let next_past = ring.next.past_init;
    let (out, reached) = tokio::join!(
        connect(&ring.next.address, own, deadline, next_past),
        accept(&listener, &ring.previous.task, deadline, previous_past),
    );
    drop(listener);
    // A peer that was in its init may have finished it while this pod waited.
    let previous_past = reached || previous_past || past_init(&ring.previous.pod).await;
    let next_past = next_past || (out == Outbound::Refused && past_init(&ring.next.pod).await);
    verdict(
        ring,
        &out,
        next_past,
        reached,
        previous_past,
        start.elapsed(),
    )
    .map_err(PreflightError::Unreachable)?;
    let took = start.elapsed();
    info!(next = %ring.next.task, previous = %ring.previous.task, took = ?took, "pre-flight: the network to the ring's neighbours is proven");
    Ok(Proven { took })
}

/// The task's port on the pod's address (pods that share a network namespace, such
/// as hostNetwork pods of one node, each have their own port then).
async fn listen(ip: std::net::IpAddr, port: u16) -> Result<TcpListener, PreflightError> {
    TcpListener::bind((ip, port))
        .await
        .map_err(|e| PreflightError::Listen {
            port,
            why: e.to_string(),
        })
}

/// Connects to the next task until it answers or the deadline passes; says who this
/// pod is once connected.
async fn connect(address: &str, own: &str, deadline: Instant, next_past: bool) -> Outbound {
    let mut last = Outbound::NoAnswer;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return last;
        }
        match tokio::time::timeout(left.min(ATTEMPT), TcpStream::connect(address)).await {
            Ok(Ok(mut s)) => {
                let _ = tokio::time::timeout(ATTEMPT, s.write_all(hello(own).as_bytes())).await;
                // A running pod's training process answers what it likes: the
                // connection proved the path. A pod in its init answers the hello.
                if next_past || acknowledged(&mut s).await {
                    return Outbound::Connected;
                }
                last = Outbound::Failed(
                    "its port took the connection, but its trainlet-init did not answer".into(),
                );
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if next_past {
                    return Outbound::Refused;
                }
                last = Outbound::Refused;
            }
            Ok(Err(e)) => last = Outbound::Failed(e.to_string()),
            Err(_) => {
                last =
                    Outbound::Failed(format!("no answer within {}s", left.min(ATTEMPT).as_secs()));
            }
        }
        debug!(%address, ?last, "pre-flight: the next task does not answer yet");
        tokio::time::sleep(RETRY.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// Whether the peer's trainlet-init acknowledged the hello ([`ACK`]).
async fn acknowledged(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; ACK.len()];
    matches!(
        tokio::time::timeout(ATTEMPT, s.read_exact(&mut buf)).await,
        Ok(Ok(_)) if buf == ACK.as_bytes()
    )
}

/// Accepts connections until the previous task's pod says hello (and is answered), or
/// the deadline.
async fn accept(
    listener: &TcpListener,
    previous: &str,
    deadline: Instant,
    previous_past: bool,
) -> bool {
    if previous_past {
        return false;
    }
    loop {
        let accepted = tokio::time::timeout_at(deadline.into(), listener.accept()).await;
        let Ok(Ok((mut s, from))) = accepted else {
            if matches!(accepted, Ok(Err(_))) {
                continue;
            }
            return false;
        };
        let mut buf = vec![0u8; HELLO_MAX + 32];
        let mut got = 0;
        let line = loop {
            let read = tokio::time::timeout(ATTEMPT, s.read(&mut buf[got..])).await;
            match read {
                Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break None,
                Ok(Ok(n)) => {
                    got += n;
                    if buf[..got].contains(&b'\n') || got == buf.len() {
                        break Some(String::from_utf8_lossy(&buf[..got]).into_owned());
                    }
                }
            }
        };
        match line.as_deref().and_then(parse_hello) {
            Some(task) if task == previous => {
                let _ = tokio::time::timeout(ATTEMPT, s.write_all(ACK.as_bytes())).await;
                return true;
            }
            other => {
                debug!(%from, hello = ?other, "pre-flight: a connection that is not the previous task's")
            }
        }
    }
}
