//! A stack said short: for each rank, where its main thread is — the innermost frame,
//! and the innermost frame in the user's own code where that is another —
//! `all_reduce (torch/distributed/distributed_c10d.py:2501) ← train_step (train.py:88)`;
//! and the whole capture as exec logs it, bounded. Every text read from a process is
//! escaped ([`crate::text::escape`]): a hostile frame name can neither rewrite a log line
//! nor hide in an Event.

use super::{Capture, Frame, Process, Thread};
use crate::text::{bound, escape};

/// The most processes one capture reads; a larger tree is cut, with a note.
pub const MAX_PROCESSES: usize = 64;
/// The most threads of one process, and frames of one thread, the dump shows.
pub const MAX_THREADS: usize = 64;
pub const MAX_FRAMES: usize = 128;
/// The longest name of a function or file shown, in characters.
pub const MAX_NAME: usize = 120;
/// The most places a pod publishes, and the longest, in bytes: a place is two frames
/// of at most [`MAX_NAME`]-character names, escaped.
pub const MAX_PLACES: usize = 8;
pub const MAX_PLACE: usize = 1024;

/// `file` as a person reads it: a library's path from its package
/// (`torch/distributed/distributed_c10d.py`), the standard library's from its top
/// (`threading.py`), a user's file relative to the process's working directory, or by
/// its name where it lies elsewhere.
pub fn short_path(file: &str, cwd: Option<&str>) -> String {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            return file[i + marker.len()..].to_string();
        }
    }
    if let Some(rest) = stdlib_rest(file) {
        return rest.to_string();
    }
    if let Some(rest) = cwd
        .map(|c| c.trim_end_matches('/'))
        .filter(|c| !c.is_empty())
        .and_then(|c| file.strip_prefix(c))
        .and_then(|r| r.strip_prefix('/'))
    {
        return rest.to_string();
    }
    file.rsplit('/').next().unwrap_or(file).to_string()
}

/// The part of `file` after `/lib/pythonX.Y/`, where it is in the standard library.
fn stdlib_rest(file: &str) -> Option<&str> {
    let i = file.rfind("/lib/python")?;
    let rest = &file[i + "/lib/python".len()..];
    let slash = rest.find('/')?;
    let version = &rest[..slash];
    version
        .chars()
        .all(|c| c.is_ascii_digit() || c == '.')
        .then_some(&rest[slash + 1..])
        .filter(|_| !version.is_empty())
}

/// A frame of the user's own code: not an installed package, not the standard
/// library, not the interpreter's own (`<frozen importlib._bootstrap>`, `<string>`).
pub fn is_user(frame: &Frame) -> bool {
    let f = &frame.file;
    !(f.starts_with('<')
        || f.is_empty()
        || f.contains("/site-packages/")
        || f.contains("/dist-packages/")
        || stdlib_rest(f).is_some())
}

/// `function (path:line)`, escaped and bounded.
pub fn frame_text(frame: &Frame, cwd: Option<&str>) -> String {
    let name = bound(&escape(&frame.function), MAX_NAME);
    let path = bound(&escape(&short_path(&frame.file, cwd)), MAX_NAME);
    match frame.line {
        0 => format!("{name} ({path})"),
        line => format!("{name} ({path}:{line})"),
    }
}

/// Where `thread` is: its innermost frame, and, where that is not the user's own code,
/// ` ← ` the innermost frame that is. `None` for a thread without frames.
pub fn place(thread: &Thread, cwd: Option<&str>) -> Option<String> {
    let inner = thread.frames.first()?;
    let text = frame_text(inner, cwd);
    match thread.frames.iter().find(|f| is_user(f)) {
        Some(user) if user != inner => Some(format!("{text} ← {}", frame_text(user, cwd))),
        _ => Some(text),
    }
}

/// The thread a process's place is told by: the interpreter's main thread, else the
/// first with frames.
pub fn main_thread(p: &Process) -> Option<&Thread> {
    p.threads
        .iter()
        .find(|t| t.main && !t.frames.is_empty())
        .or_else(|| p.threads.iter().find(|t| !t.frames.is_empty()))
}

/// Where each rank is: `(rank N | pid P, place)`, the ranks in order, the processes
/// without a rank (a launcher, a data loader's worker) left out where any has one.
fn ranked(captures: &[Capture]) -> Vec<(String, String)> {
    let read: Vec<&Process> = captures
        .iter()
        .filter_map(|c| match c {
            Capture::Read(p) => Some(p),
            Capture::Unreadable { .. } => None,
        })
        .collect();
    let any_rank = read.iter().any(|p| p.rank.is_some());
    let mut shown: Vec<&Process> = read
        .into_iter()
        .filter(|p| !any_rank || p.rank.is_some())
        .collect();
    shown.sort_by_key(|p| (p.rank, p.pid));
    shown
        .iter()
        .filter_map(|p| {
            let at = place(main_thread(p)?, p.cwd.as_deref())?;
            let who = match p.rank {
                Some(r) => format!("rank {r}"),
                None => format!("pid {}", p.pid),
            };
            Some((who, at))
        })
        .collect()
}

/// Where each rank is, one line each (`rank 3: load_batch (data.py:41)`);
/// `no Python process` where none was read, or why a Python process could not be.
pub fn summary(captures: &[Capture]) -> String {
    let lines: Vec<String> = ranked(captures)
        .into_iter()
        .map(|(who, at)| format!("{who}: {at}"))
        .collect();
    if !lines.is_empty() {
        return lines.join("; ");
    }
    // A Python process that could not be read is told, not taken for none.
    captures
        .iter()
        .find_map(|c| match c {
            Capture::Unreadable { pid, why, .. } if why != NOT_PYTHON => Some(format!(
                "no stack read: pid {pid}: {}",
                bound(&escape(why), MAX_NAME)
            )),
            _ => None,
        })
        .unwrap_or_else(|| NO_PYTHON.to_string())
}

/// Why a process that maps no Python interpreter is not read.
pub const NOT_PYTHON: &str = "not a Python process";
/// The summary where no process under CMD is Python.
pub const NO_PYTHON: &str = "no Python process";

/// The places of the ranks' main threads, each once, in rank order, at most
/// [`MAX_PLACES`]: what the pods of a job are compared by (`odd.rs`).
pub fn places(captures: &[Capture]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, at) in ranked(captures) {
        if !out.contains(&at) && out.len() < MAX_PLACES {
            out.push(at);
        }
    }
    out
}

/// The whole capture as exec logs it: every thread of every process, its frames the
/// innermost first, cut at the bounds with a note; `cut` processes were past
/// [`MAX_PROCESSES`] and not read.
pub fn dump(captures: &[Capture], cut: usize) -> String {
    let mut out = String::new();
    for c in captures {
        match c {
            Capture::Unreadable { pid, command, why } => {
                out.push_str(&format!(
                    "process {pid} ({}): not read: {}\n",
                    bound(&escape(command), MAX_NAME),
                    escape(why)
                ));
            }
            Capture::Read(p) => process_dump(&mut out, p),
        }
    }
    if cut > 0 {
        out.push_str(&format!(
            "… {cut} more processes not read (at most {MAX_PROCESSES})\n"
        ));
    }
    out
}

fn process_dump(out: &mut String, p: &Process) {
    let rank = p.rank.map(|r| format!(", rank {r}")).unwrap_or_default();
    out.push_str(&format!(
        "process {} ({}){rank}:\n",
        p.pid,
        bound(&escape(&p.command), MAX_NAME)
    ));
    for t in p.threads.iter().take(MAX_THREADS) {
        let name = t
            .name
            .as_deref()
            .map(|n| format!(" {:?}", bound(&escape(n), MAX_NAME)))
            .unwrap_or_default();
        let state = if t.active { "active" } else { "idle" };
        out.push_str(&format!("  thread {:#x}{name} ({state}):\n", t.id));
        for f in t.frames.iter().take(MAX_FRAMES) {
            out.push_str(&format!("    {}\n", frame_text(f, p.cwd.as_deref())));
        }
        if t.frames.len() > MAX_FRAMES {
            out.push_str(&format!(
                "    … {} more frames\n",
                t.frames.len() - MAX_FRAMES
            ));
        }
    }
    if p.threads.len() > MAX_THREADS {
        out.push_str(&format!(
            "  … {} more threads\n",
            p.threads.len() - MAX_THREADS
        ));
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
