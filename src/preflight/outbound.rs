//! The connecting side of the pre-flight: reaches the next task's pod at its address,
//! the very address the files give the framework, until its trainlet-init acknowledges
//! this pod's hello or the deadline passes.

use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tracing::debug;

use super::hello::{self, Key, Path};
use super::inbound::{CONNECTION, read_line};
use super::ring::Outbound;

/// Between connection attempts while the next pod's init is not listening yet: a
/// refusal costs a round trip, and the last pod to resolve should be reached at once.
const RETRY: Duration = Duration::from_millis(50);
/// How long one connection attempt may wait for the peer's SYN-ACK: a dropped packet is
/// sent again within it, and a lost attempt is not the last.
const CONNECT: Duration = Duration::from_secs(5);

/// What the connecting pod needs to know of the path.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub key: &'a Key,
    /// This pod's task and the next one's.
    pub path: Path<'a>,
    pub address: &'a str,
    /// The next task's pod is past its init: its training process holds the port, and
    /// a completed connection (or a refusal) proves the path.
    pub past_init: bool,
}

/// Connects to the next task until the path is proven or the deadline passes. What the
/// peer's trainlet-init answered, a refusal of this pod's hello, outlives the attempts
/// after it: near the deadline the peer gives up too, and an attempt that then lands in
/// its backlog unanswered says less about the path.
pub async fn reach(to: &Target<'_>, deadline: Instant) -> Outbound {
    let mut last = Outbound::NoAnswer;
    let mut answered: Option<String> = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return answered.map_or(last, Outbound::Failed);
        }
        match timeout_at(deadline.min(now + CONNECT), TcpStream::connect(to.address)).await {
            // A running pod's training process answers what it likes: the connection
            // proved the path.
            Ok(Ok(_)) if to.past_init => return Outbound::Connected,
            Ok(Ok(s)) => {
                let until = deadline.min(Instant::now() + CONNECTION);
                match timeout_at(until, exchange(s, to)).await {
                    Ok(Ok(())) => return Outbound::Connected,
                    Ok(Err(Exchange::Closed(why))) => last = Outbound::Failed(why),
                    Ok(Err(Exchange::Refused(why))) => {
                        last = Outbound::Failed(why.clone());
                        answered = Some(why);
                    }
                    Err(_) => {
                        last = Outbound::Failed(format!(
                            "its port took the connection, but its trainlet-init did not answer within {}s",
                            CONNECTION.as_secs()
                        ))
                    }
                }
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if to.past_init {
                    return Outbound::Refused;
                }
                last = Outbound::Refused;
            }
            Ok(Err(e)) => last = Outbound::Failed(e.to_string()),
            Err(_) => last = Outbound::NoAnswer,
        }
        debug!(address = %to.address, ?last, "pre-flight: the next task does not answer yet");
        tokio::time::sleep_until(deadline.min(Instant::now() + RETRY)).await;
    }
}

/// Why an exchange did not prove the path.
enum Exchange {
    /// The connection ended before an answer.
    Closed(String),
    /// The peer's answer did not check out: it refused this pod's hello.
    Refused(String),
}

/// The connecting half of [`hello`]'s exchange: the path is proven once the ack checks
/// out and the confirm is sent.
async fn exchange(mut s: TcpStream, to: &Target<'_>) -> Result<(), Exchange> {
    let closed = |e: std::io::Error| {
        Exchange::Closed(format!(
            "its port took the connection, but its trainlet-init did not answer ({e})"
        ))
    };
    let own = super::nonce();
    let (read, mut write) = s.split();
    let mut read = BufReader::new(read);
    let said = hello::hello(to.key, to.path, &own);
    write.write_all(said.as_bytes()).await.map_err(closed)?;
    let line = read_line(&mut read).await.map_err(closed)?;
    let acked = hello::check_answer(to.key, &line, to.path, &own)
        .map_err(|e| Exchange::Refused(e.to_string()))?;
    let confirm = hello::confirm(to.key, to.path, &own, &acked);
    write.write_all(confirm.as_bytes()).await.map_err(closed)?;
    write.flush().await.map_err(closed)?;
    Ok(())
}
