//! CMD's stderr, and with the progress watch (`--stall-after`) its stdout, passed
//! through exec, which then watches them for progress: one thread per stream reads
//! the pipe and writes each chunk at once, unchanged, to exec's own stream with a plain `write(2)` — no buffering added,
//! binary-safe, each stream's order kept, `kubectl logs` as without exec — and only
//! then looks at it for lines (`crate::stall`). Memory is the read buffer and one
//! bounded line per stream, whatever CMD writes.
//!
//! Where exec's own stream is a pipe, as a container's is (the runtime's log FIFO),
//! the chunk goes there with `tee(2)`: the kernel duplicates the pipe's pages into it
//! without a copy through exec, and exec then reads the same bytes once to look at
//! them. Elsewhere (a file, a terminal) it is a read and a `write(2)`.
//!
//! Threads, not the async runtime: a blocking copy per chunk is the fastest, and a
//! slow reader of exec's output (the container runtime's log pipe) then slows CMD
//! exactly as it would without exec, never the reporter.

use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tracing::{debug, warn};

use crate::stall::progress::LineScanner;
pub use crate::stall::watch::Watch;

/// How much is read from a pipe at once: a whole widened pipe ([`PIPE_SIZE`]).
const CHUNK: usize = 128 * 1024;

/// The buffer of the pipes exec reads and writes: as large as an unprivileged process
/// may make one by default (`/proc/sys/fs/pipe-max-size`, 1 MiB). exec sits between
/// CMD and the runtime's log pipe, and each chunk it moves costs a wakeup and two
/// system calls; with sixteen times the default 64 KiB, CMD's output moves in few
/// large chunks, and the runtime's reader gets as much per read as it would from CMD
/// directly.
const PIPE_SIZE: i32 = 1 << 20;

/// Makes a pipe's buffer [`PIPE_SIZE`]; where it is no pipe, or the kernel says no (a
/// user over its pipe quota), it stays as it is.
fn widen(fd: impl AsFd) {
    if let Err(e) = nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE)) {
        debug!("pipe buffer left as it is: {e}");
    }
}

/// Which of exec's streams a pipe goes to.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        })
    }
}

/// The copy threads of one run of CMD.
#[derive(Debug, Default)]
pub struct Copiers(Vec<JoinHandle<()>>);

impl Copiers {
    /// Starts copying the pipes of a just-spawned CMD, watching what passes for
    /// progress where there is a `watch`.
    pub fn start(child: &mut std::process::Child, watch: Option<&Arc<Watch>>) -> Copiers {
        let mut threads = Vec::new();
        // exec's own streams once, not at every restart of CMD.
        static OWN: std::sync::Once = std::sync::Once::new();
        OWN.call_once(|| {
            widen(std::io::stdout());
            widen(std::io::stderr());
        });
        if let Some(out) = child.stdout.take() {
            widen(&out);
            threads.push(spawn(out, Stream::Stdout, watch.cloned()));
        }
        if let Some(err) = child.stderr.take() {
            widen(&err);
            threads.push(spawn(err, Stream::Stderr, watch.cloned()));
        }
        Copiers(threads.into_iter().flatten().collect())
    }

    /// Waits until the pipes are drained (CMD and everything that inherited them
    /// closed them), at most `limit`: what CMD wrote last is written before exec ends.
    pub fn finish(self, limit: Duration) {
        let until = Instant::now() + limit;
        for t in self.0 {
            while !t.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        // A log line of exec's that waited for a line CMD never ended.
        crate::stderr_gate::stderr().flush();
    }
}

fn spawn(
    pipe: impl Read + AsFd + Send + 'static,
    to: Stream,
    watch: Option<Arc<Watch>>,
) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("trainlet-{to:?}").to_lowercase())
        .spawn(move || copy(pipe, to, watch.as_deref()))
        .map_err(|e| debug!("cannot start the output thread: {e}"))
        .ok()
}

/// Copies until end of file. exec's stream closed by its reader (EPIPE, as `| head`
/// does) closes CMD's pipe too, so CMD sees the broken pipe as it would without exec.
/// Any other failed write is a warning once, and the reading goes on without writing:
/// CMD must never block on a full pipe because of exec.
pub fn copy(mut pipe: impl Read + AsFd, to: Stream, watch: Option<&Watch>) {
    let mut buf = vec![0u8; CHUNK];
    let mut scanner = LineScanner::default();
    let mut writable = true;
    // tee(2) until it says that exec's stream is no pipe (EINVAL).
    let mut tee = true;
    loop {
        if writable && tee {
            // stderr goes through the gate, which a tee waiting for CMD must not hold:
            // wait first, then tee what is there without waiting. stdout tees and
            // waits in one call.
            let gated = matches!(to, Stream::Stderr);
            if gated && let Err(e) = readable(&pipe) {
                debug!("waiting for CMD's {to:?}: {e}");
                return;
            }
            let teed = through(to, || match tee_out(&pipe, to, gated) {
                Ok(0) => (Ok(0), None),
                Ok(n) => match read_exactly(&mut pipe, &mut buf[..n]) {
                    Ok(()) => (Ok(n), Some(buf[n - 1])),
                    Err(e) => (Err(Teed::Read(e)), None),
                },
                Err(e) => (Err(Teed::Write(e)), None),
            });
            match teed {
                Ok(0) => return,
                Ok(n) => observe(&mut scanner, &buf[..n], watch),
                Err(Teed::Read(e)) => {
                    debug!("reading CMD's {to:?}: {e}");
                    return;
                }
                Err(Teed::Write(nix::errno::Errno::EINTR)) => {}
                // exec's stream is full (its reader is slow): wait for room, as a
                // blocking write would, but outside the gate.
                Err(Teed::Write(nix::errno::Errno::EAGAIN)) => {
                    if let Err(e) = writable_out(to) {
                        debug!("waiting for room in exec's {to}: {e}");
                    }
                }
                Err(Teed::Write(nix::errno::Errno::EINVAL)) => tee = false,
                Err(Teed::Write(nix::errno::Errno::EPIPE)) => return closed(to),
                Err(Teed::Write(e)) => {
                    warn!(
                        "cannot pass CMD's {to} through: {e}; what it writes there is lost from now on"
                    );
                    writable = false;
                }
            }
            continue;
        }
        let n = match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                debug!("reading CMD's {to:?}: {e}");
                return;
            }
        };
        let chunk = &buf[..n];
        if writable {
            match through(to, || (write_all(to, chunk), chunk.last().copied())) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => return closed(to),
                Err(e) => {
                    warn!(
                        "cannot pass CMD's {to} through: {e}; what it writes there is lost from now on"
                    );
                    writable = false;
                }
            }
        }
        observe(&mut scanner, chunk, watch);
    }
}

/// Why a tee of CMD's output failed.
enum Teed {
    Read(std::io::Error),
    Write(nix::errno::Errno),
}

/// exec's stream has no reader any more: CMD's pipe is closed (by returning, which
/// drops it), and CMD's next write there fails with EPIPE as it would without exec.
fn closed(to: Stream) {
    warn!("exec's {to} was closed by its reader; closing CMD's {to} too");
}

/// Writes CMD's chunk: stderr through the gate that keeps exec's own log lines between
/// CMD's lines ([`crate::stderr_gate`]), stdout directly. `write` returns the chunk's
/// last byte, where it wrote one.
fn through<T>(to: Stream, write: impl FnOnce() -> (T, Option<u8>)) -> T {
    match to {
        Stream::Stderr => crate::stderr_gate::stderr().write_cmd(write),
        Stream::Stdout => write().0,
    }
}

/// Waits until the pipe has data or is closed, so that the tee under the gate never
/// blocks the gate.
fn readable(pipe: &impl AsFd) -> nix::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Waits until exec's stream has room.
fn writable_out(to: Stream) -> nix::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let (out, err) = (std::io::stdout(), std::io::stderr());
    let fd = match to {
        Stream::Stdout => out.as_fd(),
        Stream::Stderr => err.as_fd(),
    };
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Duplicates what the pipe holds (up to a chunk) into exec's stream: waiting for CMD
/// and for room, or (`nonblock`, after [`readable`]) neither.
fn tee_out(pipe: &impl AsFd, to: Stream, nonblock: bool) -> nix::Result<usize> {
    let (out, err) = (std::io::stdout(), std::io::stderr());
    let fd = match to {
        Stream::Stdout => out.as_fd(),
        Stream::Stderr => err.as_fd(),
    };
    let flags = if nonblock {
        nix::fcntl::SpliceFFlags::SPLICE_F_NONBLOCK
    } else {
        nix::fcntl::SpliceFFlags::empty()
    };
    nix::fcntl::tee(pipe, fd, CHUNK, flags)
}

/// The bytes tee(2) just duplicated: they are in the pipe, and exec is its only
/// reader.
fn read_exactly(pipe: &mut impl Read, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match pipe.read(buf) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The chunk's last progress ([`LineScanner::last_progress`]) into the shared
/// progress, under one lock per chunk; nothing where no one watches.
fn observe(scanner: &mut LineScanner, chunk: &[u8], watch: Option<&Watch>) {
    let Some(watch) = watch else {
        return;
    };
    let Some(last) = scanner.last_progress(chunk, &watch.pattern) else {
        return;
    };
    if let Ok(mut p) = watch.progress.lock() {
        p.at = Some(SystemTime::now());
        if last.step.is_some() {
            p.step = last.step;
        }
        p.stepped = last.stepped;
        p.line = last.line;
    }
}

fn write_all(to: Stream, mut data: &[u8]) -> std::io::Result<()> {
    let (out, err) = (std::io::stdout(), std::io::stderr());
    let fd = match to {
        Stream::Stdout => out.as_fd(),
        Stream::Stderr => err.as_fd(),
    };
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
