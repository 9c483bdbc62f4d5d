//! Signals: stopping the reporters, and forwarding to CMD in `exec --report`.
//!
//! Kubernetes stops a container by sending SIGTERM to its PID 1 and SIGKILL after the
//! grace period (30 s by default). The sidecar stops on SIGTERM or SIGINT (Ctrl-C in a
//! terminal) within 2 seconds. Under `exec --report` trainlet is PID 1 and CMD is its
//! child, so trainlet forwards every signal a person or the kubelet may send on
//! purpose (TERM, INT, HUP, QUIT, USR1, USR2) and lets CMD decide; it exits when CMD
//! does.
//!
//! Handlers come from signal-hook: each one writes a byte to a socket pair whose read
//! end the tokio runtime watches, so nothing but a write happens in signal context.

use std::io;
use std::os::unix::net::UnixStream;

use signal_hook::SigId;
use tokio::sync::mpsc;

pub use signal_hook::consts::signal::{
    SIGCHLD, SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2,
};

/// The signals that stop the sidecar.
pub const STOP: [i32; 2] = [SIGTERM, SIGINT];

/// The signals `exec --report` forwards to CMD.
pub const FORWARD: [i32; 6] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// Delivered signals, as numbers, in order of arrival (a burst of one signal may be
/// coalesced into fewer deliveries, as the kernel does too).
pub struct Signals {
    rx: mpsc::UnboundedReceiver<i32>,
    ids: Vec<SigId>,
}

impl Signals {
    /// Installs handlers for these signals. Must run inside the tokio runtime.
    pub fn new(signals: &[i32]) -> io::Result<Signals> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut ids = Vec::new();
        for &sig in signals {
            let (read, write) = UnixStream::pair()?;
            ids.push(signal_hook::low_level::pipe::register(sig, write)?);
            read.set_nonblocking(true)?;
            let read = tokio::net::UnixStream::from_std(read)?;
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                loop {
                    if read.readable().await.is_err() {
                        return;
                    }
                    match read.try_read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => {
                            for _ in 0..n {
                                if tx.send(sig).is_err() {
                                    return;
                                }
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(_) => return,
                    }
                }
            });
        }
        Ok(Signals { rx, ids })
    }

    /// The next delivered signal.
    pub async fn recv(&mut self) -> Option<i32> {
        self.rx.recv().await
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Sends a signal to a process.
pub fn send(pid: u32, sig: i32) -> io::Result<()> {
    let signal = nix::sys::signal::Signal::try_from(sig).map_err(io::Error::from)?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).map_err(io::Error::from)
}

/// `SIGTERM` for 15, or the number.
pub fn name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| sig.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name(SIGTERM), "SIGTERM");
        assert_eq!(name(SIGUSR2), "SIGUSR2");
        assert_eq!(name(200), "200");
    }

    #[tokio::test]
    async fn a_raised_signal_is_delivered() {
        let mut s = Signals::new(&[SIGUSR2]).unwrap();
        signal_hook::low_level::raise(SIGUSR2).unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), s.recv())
            .await
            .unwrap();
        assert_eq!(got, Some(SIGUSR2));
    }
}
