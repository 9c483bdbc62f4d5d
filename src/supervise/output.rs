//! CMD's stdout and stderr, passed through exec while it watches them for progress
//! (`--stall-after`): one thread per stream reads the pipe and writes each chunk at
//! once, unchanged, to exec's own stream with a plain `write(2)` — no buffering added,
//! binary-safe, each stream's order kept, `kubectl logs` as without exec — and only
//! then looks at it for lines ([`super::progress`]). Memory is the read buffer and one
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
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tracing::debug;

use super::progress::{LineScanner, Pattern, Progress};

/// How much is read from a pipe at once (the size of a Linux pipe's buffer is 64 KiB).
const CHUNK: usize = 128 * 1024;

/// What the copy threads share with the reporter.
#[derive(Debug, Default)]
pub struct Watch {
    pub pattern: Pattern,
    pub progress: Mutex<Progress>,
}

impl Watch {
    pub fn new(pattern: Pattern) -> Arc<Watch> {
        Arc::new(Watch {
            pattern,
            progress: Mutex::new(Progress::default()),
        })
    }

    /// The last progress, as of now.
    pub fn progress(&self) -> Progress {
        self.progress.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// The heartbeat file changed, as exec saw at `now`.
    pub fn heartbeat(&self, now: SystemTime) {
        if let Ok(mut p) = self.progress.lock() {
            p.on_heartbeat(now);
        }
    }
}

/// Which of exec's streams a pipe goes to.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The copy threads of one run of CMD.
#[derive(Debug, Default)]
pub struct Copiers(Vec<JoinHandle<()>>);

impl Copiers {
    /// Starts copying the pipes of a just-spawned CMD.
    pub fn start(child: &mut std::process::Child, watch: &Arc<Watch>) -> Copiers {
        let mut threads = Vec::new();
        if let Some(out) = child.stdout.take() {
            threads.push(spawn(out, Stream::Stdout, watch.clone()));
        }
        if let Some(err) = child.stderr.take() {
            threads.push(spawn(err, Stream::Stderr, watch.clone()));
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
    }
}

fn spawn(
    pipe: impl Read + AsFd + Send + 'static,
    to: Stream,
    watch: Arc<Watch>,
) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("trainlet-{to:?}").to_lowercase())
        .spawn(move || copy(pipe, to, &watch))
        .map_err(|e| debug!("cannot start the output thread: {e}"))
        .ok()
}

/// Copies until end of file. A closed output (exec's stdout gone) stops the writing,
/// not the reading: CMD must never block on a full pipe because of exec.
pub fn copy(mut pipe: impl Read + AsFd, to: Stream, watch: &Watch) {
    let mut buf = vec![0u8; CHUNK];
    let mut scanner = LineScanner::default();
    let mut writable = true;
    // tee(2) until it says that exec's stream is no pipe (EINVAL).
    let mut tee = true;
    loop {
        let n = if writable && tee {
            match tee_out(&pipe, to) {
                Ok(0) => return,
                Ok(n) => match read_exactly(&mut pipe, &mut buf[..n]) {
                    Ok(()) => {
                        observe(&mut scanner, &buf[..n], watch);
                        continue;
                    }
                    Err(e) => {
                        debug!("reading CMD's {to:?}: {e}");
                        return;
                    }
                },
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EINVAL) => {
                    tee = false;
                    continue;
                }
                Err(e) => {
                    debug!("passing CMD's {to:?} through: {e}; reading on without writing");
                    writable = false;
                    continue;
                }
            }
        } else {
            match pipe.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!("reading CMD's {to:?}: {e}");
                    return;
                }
            }
        };
        let chunk = &buf[..n];
        if writable && let Err(e) = write_all(to, chunk) {
            debug!("writing CMD's {to:?} through: {e}; reading on without writing");
            writable = false;
        }
        observe(&mut scanner, chunk, watch);
    }
}

/// Duplicates what the pipe holds (up to a chunk) into exec's stream, waiting for it.
fn tee_out(pipe: &impl AsFd, to: Stream) -> nix::Result<usize> {
    let (out, err) = (std::io::stdout(), std::io::stderr());
    let fd = match to {
        Stream::Stdout => out.as_fd(),
        Stream::Stderr => err.as_fd(),
    };
    nix::fcntl::tee(pipe, fd, CHUNK, nix::fcntl::SpliceFFlags::empty())
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

/// The chunk's lines into the shared progress, under one lock per chunk.
fn observe(scanner: &mut LineScanner, chunk: &[u8], watch: &Watch) {
    let mut last: Option<Vec<u8>> = None;
    let mut step = None;
    let mut count = 0u64;
    let mut stepped = false;
    scanner.feed(chunk, |line| {
        if let Some(s) = watch.pattern.progress(line) {
            count += 1;
            step = s.or(step);
            stepped = s.is_some();
            last = Some(line.to_vec());
        }
    });
    let Some(line) = last else {
        return;
    };
    if let Ok(mut p) = watch.progress.lock() {
        let now = SystemTime::now();
        p.at = Some(now);
        if step.is_some() {
            p.step = step;
        }
        p.stepped = stepped;
        p.line = super::progress::quote(&line);
        p.lines += count;
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
