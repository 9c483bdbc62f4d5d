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
//!
//! The task's port is open to the network while init runs, so the pre-flight holds up
//! against whatever connects to it: a hello counts only from the previous task, for this
//! task, of this resolution of the cluster ([`hello`]); connections are handled at once,
//! each within a short deadline and a bound on how many ([`inbound`]); and the whole
//! pre-flight ends by its deadline, whatever the peers do.

pub mod hello;
pub mod inbound;
pub mod outbound;
pub mod ring;

use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tracing::info;

use hello::{Key, Nonce, Path};
use inbound::Expect;
use outbound::Target;
use ring::{Inbound, Outbound, Ring, verdict};

/// How long the pre-flight asks the API server whether a neighbour has finished its
/// init, once the deadline has passed: the answer may only excuse a neighbour, and the
/// pre-flight must end close to its deadline.
const LOOKUP: Duration = Duration::from_secs(1);

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

/// Proves the ring around `own` (`type/index`) within `within`: a hard bound, whatever
/// the peers or anything else on the port do. `past_init` says whether a peer's pod (by
/// name) is past its init containers: Running or finished.
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
    let key = Key::new(&ring.resolution);
    let to = Target {
        key: &key,
        path: Path {
            from: own,
            to: &ring.next.task,
        },
        address: &ring.next.address,
        // As resolved: no request to the API server while every pod of the job is in
        // its init, the common case (2N requests at once would cost a large job
        // seconds).
        past_init: ring.next.past_init,
    };
    let expect = Expect {
        key: key.clone(),
        from: ring.previous.task.clone(),
        own: own.to_string(),
    };
    let (out, previous) = tokio::join!(outbound::reach(&to, deadline), async {
        if ring.previous.past_init {
            return Inbound::PastInit;
        }
        inbound::serve(&listener, expect, deadline).await
    });
    drop(listener);
    // A peer that was in its init may have finished it while this pod waited.
    let finished = async |pod: &str| {
        tokio::time::timeout(LOOKUP, past_init(pod))
            .await
            .unwrap_or(false)
    };
    let (previous_finished, next_finished) = tokio::join!(
        async {
            matches!(previous, Inbound::NotReached { .. }) && finished(&ring.previous.pod).await
        },
        async {
            out == Outbound::Refused && !ring.next.past_init && finished(&ring.next.pod).await
        },
    );
    let previous = if previous_finished {
        Inbound::PastInit
    } else {
        previous
    };
    let next_past = ring.next.past_init || next_finished;
    verdict(ring, &out, next_past, &previous, start.elapsed())
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

/// A fresh nonce for one side of one exchange.
fn nonce() -> Nonce {
    use ::ring::rand::SecureRandom;
    let mut n = Nonce::default();
    ::ring::rand::SystemRandom::new()
        .fill(&mut n)
        .expect("the system's random source");
    n
}

#[cfg(test)]
mod tests;
