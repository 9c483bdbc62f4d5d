//! Reading the Python stacks of CMD's processes: the one part of `stacks` that does
//! I/O. exec is the ancestor of every process it reads, which is what lets it read
//! them without `CAP_SYS_PTRACE` (Yama's `ptrace_scope` 1 allows an ancestor, and the
//! runtime's default seccomp profile allows `process_vm_readv`). py-spy (as a library,
//! without its CLI) reads each interpreter's memory without pausing it: no `ptrace`,
//! so a process stopped or stuck in the kernel cannot hold exec up, and training is
//! never paused by a look. A hung rank's stack does not move; a running one's may be
//! read half-way through a change, and is read again.

use std::path::Path;
use std::time::{Duration, Instant};

use super::ranks::Seen;
use super::summary::MAX_PROCESSES;
use super::{Capture, Frame, Process, Thread};

/// The longest a capture goes on: past it, the processes not read yet are named as
/// such. Reading one process takes tens of milliseconds.
pub const BUDGET: Duration = Duration::from_secs(5);
/// The most of `/proc/PID/environ` and `/proc/PID/cmdline` read.
const MAX_PROC_FILE: u64 = 256 * 1024;

/// Reads every process of `pids` (CMD's tree, the oldest first): the Python ones
/// through py-spy, the others named with why. At most [`MAX_PROCESSES`] are read; the
/// count of those cut is returned beside.
pub fn capture(proc_root: &Path, pids: &[u32]) -> (Vec<Capture>, usize) {
    let start = Instant::now();
    let cut = pids.len().saturating_sub(MAX_PROCESSES);
    // One process after the other: reading one is mostly parsing its interpreter's
    // symbols, and several at once would multiply exec's peak memory for little time.
    let mut out: Vec<Capture> = pids
        .iter()
        .take(MAX_PROCESSES)
        .map(|&pid| one(proc_root, pid, start))
        .collect();
    let seen: Vec<Seen> = out
        .iter()
        .filter_map(|c| match c {
            Capture::Read(p) => Some(seen(proc_root, p.pid)),
            Capture::Unreadable { .. } => None,
        })
        .collect();
    let ranks = super::ranks::ranks(&seen);
    for c in &mut out {
        if let Capture::Read(p) = c {
            p.rank = ranks.get(&p.pid).copied();
        }
    }
    (out, cut)
}

/// How many times a process's stacks are read before its error is told: a running
/// interpreter may change them under the read.
const READS: usize = 3;

fn one(proc_root: &Path, pid: u32, start: Instant) -> Capture {
    let command = command_line(proc_root, pid);
    if start.elapsed() > BUDGET {
        return Capture::Unreadable {
            pid,
            command,
            why: format!(
                "not read: the capture took {} already",
                humantime::format_duration(BUDGET)
            ),
        };
    }
    match read(proc_root, pid, &command) {
        Ok(p) => Capture::Read(p),
        Err(why) => Capture::Unreadable { pid, command, why },
    }
}

fn read(proc_root: &Path, pid: u32, command: &str) -> Result<Process, String> {
    if !maps_python(proc_root, pid) {
        return Err(super::summary::NOT_PYTHON.into());
    }
    let config = py_spy::Config {
        blocking: py_spy::config::LockingStrategy::NonBlocking,
        // A rank blocked in a collective or a read holds no GIL: py-spy calls it idle,
        // and it is the very thread to show.
        include_idle: true,
        ..py_spy::Config::default()
    };
    let mut spy = py_spy::PythonSpy::new(pid as py_spy::Pid, &config)
        .map_err(|e| first_line(&format!("{e:#}")))?;
    let mut traces = spy.get_stack_traces();
    for _ in 1..READS {
        if traces.is_ok() {
            break;
        }
        traces = spy.get_stack_traces();
    }
    let traces = traces.map_err(|e| first_line(&format!("{e:#}")))?;
    let threads = traces
        .into_iter()
        .map(|t| Thread {
            id: t.os_thread_id.unwrap_or(t.thread_id),
            main: t.os_thread_id == Some(u64::from(pid))
                || t.thread_name.as_deref() == Some("MainThread"),
            name: t.thread_name,
            active: t.active,
            frames: t
                .frames
                .into_iter()
                .map(|f| Frame {
                    function: f.name,
                    file: f.filename,
                    line: u32::try_from(f.line).unwrap_or(0),
                })
                .collect(),
        })
        .collect();
    Ok(Process {
        pid,
        command: command.to_string(),
        // Which processes are ranks is told from them all ([`capture`]).
        rank: None,
        cwd: std::fs::read_link(proc_root.join(pid.to_string()).join("cwd"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
        threads,
    })
}

/// Whether the process maps a Python interpreter (the `python` binary or
/// `libpython`): the others are not handed to py-spy at all.
fn maps_python(proc_root: &Path, pid: u32) -> bool {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps")).is_ok_and(|m| {
        m.lines().any(|l| {
            l.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("python") || f.starts_with("libpython"))
        })
    })
}

/// `/proc/PID/cmdline` with spaces for its NULs, bounded.
fn command_line(proc_root: &Path, pid: u32) -> String {
    let raw = read_bounded(&proc_root.join(pid.to_string()).join("cmdline"));
    let text = String::from_utf8_lossy(&raw).replace('\0', " ");
    text.trim_end().to_string()
}

/// What tells a rank from a launcher or a helper: the process's parent (from
/// `/proc/PID/stat`), its `RANK` (as torchrun, accelerate and trainlet's own files set
/// it) and whether it has a `LOCAL_RANK`.
fn seen(proc_root: &Path, pid: u32) -> Seen {
    let dir = proc_root.join(pid.to_string());
    let environ = read_bounded(&dir.join("environ"));
    let var = |name: &[u8]| {
        environ
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix(b"="))
    };
    let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
    Seen {
        pid,
        // `PID (COMM) STATE PPID …`: COMM may hold spaces and parentheses.
        parent: stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok()),
        rank: var(b"RANK").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()),
        local_rank: var(b"LOCAL_RANK").is_some(),
    }
}

fn read_bounded(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_PROC_FILE).read_to_end(&mut out);
    }
    out
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}
