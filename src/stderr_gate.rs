//! The stderr that `trainlet exec` shares with CMD: exec's own log lines are written
//! between CMD's lines, never inside one.
//!
//! exec passes CMD's stderr through chunk by chunk as it comes (supervise/output.rs),
//! and a chunk may end in the middle of a line (`trainer: error:` now, the rest a moment
//! later). A log line of exec's written then would land inside CMD's line, in
//! `kubectl logs` and in every log collector that splits at newlines. So every write to
//! stderr goes through one gate: CMD's chunks are written under it and say whether they
//! ended a line; exec's lines are written at once when CMD's output stands at a line
//! boundary, and otherwise held until it does.
//!
//! A CMD that stays in the middle of a line (a prompt, a progress bar that never ends
//! its line) must not silence exec: a line held for [`HOLD`] is written after a newline
//! of exec's own. What is held is bounded ([`MAX_HELD`]); past it, it is written too.
//!
//! exec always passes CMD's stderr through (its stdout only with the progress watch).
//! Where nothing passes through (every other subcommand), every log line is written
//! at once: one uncontended lock per line.

use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long an exec line may wait for CMD to end its line.
pub const HOLD: Duration = Duration::from_secs(5);
/// The most bytes of exec's lines held at once.
pub const MAX_HELD: usize = 64 * 1024;

/// What the gate decided for one write of exec's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Write these bytes now (empty: nothing to write yet).
    Now(Vec<u8>),
    /// Held until CMD's line ends.
    Held,
}

/// The pure state of the shared stream: whether CMD's output stands inside a line, and
/// exec's lines that wait for its end.
#[derive(Debug, Default)]
pub struct Lines {
    mid_line: bool,
    held: Vec<u8>,
    since: Option<Instant>,
}

impl Lines {
    /// exec wants to write `line` (whole lines) at `now`.
    pub fn exec_line(&mut self, line: &[u8], now: Instant) -> Release {
        if !self.mid_line && self.held.is_empty() {
            return Release::Now(line.to_vec());
        }
        self.held.extend_from_slice(line);
        self.since.get_or_insert(now);
        if self.held.len() > MAX_HELD {
            return Release::Now(self.release(true));
        }
        Release::Held
    }

    /// CMD's chunk, ending in `last`, was written; what exec held is written after it
    /// if the chunk ended a line.
    pub fn cmd_chunk(&mut self, last: u8) -> Vec<u8> {
        self.mid_line = !matches!(last, b'\n' | b'\r');
        if self.mid_line || self.held.is_empty() {
            return Vec::new();
        }
        self.release(false)
    }

    /// At `now`: what has been held for [`HOLD`] or longer, after a newline (or
    /// everything, `force`, when CMD's output has ended).
    pub fn overdue(&mut self, now: Instant, force: bool) -> Vec<u8> {
        let due = self
            .since
            .is_some_and(|s| now.saturating_duration_since(s) >= HOLD);
        if self.held.is_empty() || !(due || force) {
            return Vec::new();
        }
        self.release(self.mid_line)
    }

    /// When the held lines are due.
    pub fn deadline(&self) -> Option<Instant> {
        self.since.map(|s| s + HOLD)
    }

    fn release(&mut self, newline_first: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.held.len() + 1);
        if newline_first {
            out.push(b'\n');
            self.mid_line = false;
        }
        out.append(&mut self.held);
        self.since = None;
        out
    }
}

/// The process's stderr gate.
pub struct Gate {
    lines: Mutex<Lines>,
    changed: Condvar,
}

/// The one gate of this process's stderr.
pub fn stderr() -> &'static Gate {
    static GATE: OnceLock<Gate> = OnceLock::new();
    GATE.get_or_init(|| Gate {
        lines: Mutex::new(Lines::default()),
        changed: Condvar::new(),
    })
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, Lines> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes one of exec's log lines, now or once CMD's line has ended.
    pub fn write_exec(&self, line: &[u8]) {
        let mut lines = self.lock();
        match lines.exec_line(line, Instant::now()) {
            Release::Now(bytes) => write_stderr(&bytes),
            Release::Held => {
                drop(lines);
                self.changed.notify_all();
                flusher();
            }
        }
    }

    /// Writes CMD's chunk with `write` under the gate, then what exec held if the
    /// chunk ended a line. `write` gets exclusive use of stderr, and returns the last
    /// byte it wrote.
    pub fn write_cmd<T>(&self, write: impl FnOnce() -> (T, Option<u8>)) -> T {
        let mut lines = self.lock();
        let (out, last) = write();
        if let Some(last) = last {
            let held = lines.cmd_chunk(last);
            write_stderr(&held);
        }
        out
    }

    /// CMD's output has ended: what exec held is written now.
    pub fn flush(&self) {
        let bytes = self.lock().overdue(Instant::now(), true);
        write_stderr(&bytes);
    }
}

/// The thread that writes held lines once they are overdue: started the first time a
/// line is held, then asleep until one is.
fn flusher() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("trainlet-log-gate".into())
            .spawn(|| {
                let gate = stderr();
                let mut lines = gate.lock();
                loop {
                    let wait = lines
                        .deadline()
                        .map(|d| d.saturating_duration_since(Instant::now()));
                    lines = match wait {
                        None => gate.changed.wait(lines).unwrap_or_else(|p| p.into_inner()),
                        Some(w) if !w.is_zero() => {
                            gate.changed
                                .wait_timeout(lines, w)
                                .unwrap_or_else(|p| p.into_inner())
                                .0
                        }
                        Some(_) => {
                            let bytes = lines.overdue(Instant::now(), false);
                            write_stderr(&bytes);
                            lines
                        }
                    };
                }
            });
    });
}

fn write_stderr(bytes: &[u8]) {
    if !bytes.is_empty() {
        let _ = std::io::stderr().lock().write_all(bytes);
    }
}

/// The writer the log subscriber formats each event into: the whole event goes
/// through the gate once formatted.
#[derive(Default)]
pub struct LogWriter(Vec<u8>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            stderr().write_exec(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_line_waits_for_cmds_line_to_end() {
        let t0 = Instant::now();
        let mut l = Lines::default();
        assert_eq!(l.exec_line(b"a\n", t0), Release::Now(b"a\n".to_vec()));
        assert_eq!(l.cmd_chunk(b':'), b"");
        assert_eq!(l.exec_line(b"WARN x\n", t0), Release::Held);
        assert_eq!(l.exec_line(b"WARN y\n", t0), Release::Held);
        // Still inside the line.
        assert_eq!(l.cmd_chunk(b'k'), b"");
        assert_eq!(l.overdue(t0 + HOLD / 2, false), b"");
        // CMD ends its line: the held lines follow it.
        assert_eq!(l.cmd_chunk(b'\n'), b"WARN x\nWARN y\n");
        assert_eq!(l.exec_line(b"b\n", t0), Release::Now(b"b\n".to_vec()));
        // A progress bar's carriage return ends a line too.
        assert_eq!(l.cmd_chunk(b'\r'), b"");
        assert_eq!(l.exec_line(b"c\n", t0), Release::Now(b"c\n".to_vec()));
    }

    #[test]
    fn a_line_cmd_never_ends_releases_exec_after_hold_on_a_line_of_its_own() {
        let t0 = Instant::now();
        let mut l = Lines::default();
        l.cmd_chunk(b'.');
        assert_eq!(l.exec_line(b"WARN x\n", t0), Release::Held);
        assert_eq!(l.deadline(), Some(t0 + HOLD));
        assert_eq!(l.overdue(t0 + HOLD, false), b"\nWARN x\n");
        // The newline ended the line: the next exec line goes at once.
        assert_eq!(l.exec_line(b"y\n", t0), Release::Now(b"y\n".to_vec()));
        assert_eq!(l.deadline(), None);
        // CMD's output ended inside a line: forced out.
        l.cmd_chunk(b'l');
        assert_eq!(l.exec_line(b"z\n", t0), Release::Held);
        assert_eq!(l.overdue(t0, true), b"\nz\n");
    }

    #[test]
    fn what_is_held_is_bounded() {
        let t0 = Instant::now();
        let mut l = Lines::default();
        l.cmd_chunk(b'd');
        let line = vec![b'x'; 1024];
        let mut released = None;
        for _ in 0..=MAX_HELD / 1024 {
            if let Release::Now(b) = l.exec_line(&line, t0) {
                released = Some(b);
                break;
            }
        }
        let b = released.expect("released past MAX_HELD");
        assert_eq!(b.len(), MAX_HELD + 1024 + 1);
        assert_eq!(b[0], b'\n');
    }
}
