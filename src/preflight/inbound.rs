//! The accepting side of the pre-flight: waits for the previous task's pod on the task's
//! port, whatever else connects to it.
//!
//! The port is the task's, on the pod's address: anything on the network may connect to
//! it, say nothing, or drip a byte at a time. So each connection is handled in a task
//! of its own with its own short deadline ([`CONNECTION`], never past the pre-flight's),
//! at most [`CONCURRENT`] at once (one more is closed at once: the previous task's pod
//! retries 50 ms later), and the wait ends at the pre-flight's deadline whatever the
//! connections do.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};
use tracing::debug;

use super::hello::{self, Key, LINE_MAX, Nonce, Path, Refused};
use super::ring::Inbound;

/// How long one connection may take for its whole exchange: a peer's trainlet-init
/// answers in a round trip or two; a connection still silent by then is not one.
pub const CONNECTION: Duration = Duration::from_secs(2);
/// How many connections are handled at once: the previous task's pod needs one; more
/// come only from what is not a peer, and must not cost the pod its memory or files.
pub const CONCURRENT: usize = 16;
/// After a failed accept (out of file descriptors): the moment before the next.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Why one connection did not count.
#[derive(Debug, Error)]
enum Dropped {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("no full line within {}s", CONNECTION.as_secs())]
    Late,
    #[error("closed: {0}")]
    Io(#[from] std::io::Error),
}

/// What the accepting pod checks each connection against.
#[derive(Debug, Clone)]
pub struct Expect {
    pub key: Key,
    /// The previous task (`worker/0`), the only one whose hello counts.
    pub from: String,
    /// This pod's own task.
    pub own: String,
}

/// Accepts connections until the previous task's pod has proven its path, or the
/// deadline.
pub async fn serve(listener: &TcpListener, expect: Expect, deadline: Instant) -> Inbound {
    let expect = Arc::new(expect);
    let slots = Arc::new(Semaphore::new(CONCURRENT));
    let mut handling = JoinSet::new();
    let mut refused = None;
    loop {
        // Biased: a connection that proved the path counts even at the deadline (its
        // peer counts it already), and nothing is accepted past it.
        tokio::select! {
            biased;
            Some(done) = handling.join_next() => match done {
                Ok(Ok(())) => return Inbound::Reached,
                Ok(Err(Dropped::Refused(why))) => refused = Some(why.to_string()),
                Ok(Err(_)) | Err(_) => {}
            },
            () = tokio::time::sleep_until(deadline) => return Inbound::NotReached { refused },
            accepted = listener.accept() => match accepted {
                Ok((s, from)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let expect = expect.clone();
                        let until = deadline.min(Instant::now() + CONNECTION);
                        handling.spawn(handle(s, from, expect, until, slot));
                    }
                    Err(_) => debug!(%from, "pre-flight: {CONCURRENT} connections at once; closed another"),
                },
                Err(e) => {
                    debug!("pre-flight: accept: {e}");
                    tokio::time::sleep_until(deadline.min(Instant::now() + ACCEPT_PAUSE)).await;
                }
            },
        }
    }
}

/// One connection, within `until`; the slot is held until it ends.
async fn handle(
    s: TcpStream,
    from: std::net::SocketAddr,
    expect: Arc<Expect>,
    until: Instant,
    _slot: OwnedSemaphorePermit,
) -> Result<(), Dropped> {
    let r = match timeout_at(until, exchange(s, &expect)).await {
        Ok(r) => r,
        Err(_) => Err(Dropped::Late),
    };
    match &r {
        Ok(()) => debug!(%from, task = %expect.from, "pre-flight: reached by the previous task"),
        Err(why) => debug!(%from, "pre-flight: a connection that does not count: {why}"),
    }
    r
}

/// The accepting half of [`hello`]'s exchange: a hello that counts gets an ack, and the
/// path counts once the peer confirms it holds it; anything else gets a refusal.
async fn exchange(mut s: TcpStream, expect: &Expect) -> Result<(), Dropped> {
    let path = Path {
        from: &expect.from,
        to: &expect.own,
    };
    let (read, mut write) = s.split();
    let mut read = BufReader::new(read);
    let line = read_line(&mut read).await?;
    let said = match hello::check_hello(&expect.key, &line, path) {
        Ok(nonce) => nonce,
        Err(why) => {
            let _ = write.write_all(hello::refusal(&why).as_bytes()).await;
            return Err(why.into());
        }
    };
    let own: Nonce = super::nonce();
    let ack = hello::ack(&expect.key, path, &said, &own);
    write.write_all(ack.as_bytes()).await?;
    let line = read_line(&mut read).await?;
    hello::check_confirm(&expect.key, &line, path, &said, &own)?;
    Ok(())
}

/// One line of at most [`LINE_MAX`] bytes, with its newline: a peer that says more, or
/// closes first, is not one.
pub async fn read_line<R: tokio::io::AsyncRead + Unpin>(
    r: &mut BufReader<R>,
) -> Result<String, std::io::Error> {
    let mut line = String::new();
    (&mut *r).take(LINE_MAX as u64).read_line(&mut line).await?;
    if !line.ends_with('\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{} bytes without a newline", line.len()),
        ));
    }
    Ok(line)
}
