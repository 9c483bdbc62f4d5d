//! Whether CMD makes progress, from what it already does: each new line it writes (on
//! stdout or stderr, ended by `\n`, or by `\r` as progress bars end theirs), or only
//! the lines `--progress-pattern` matches, whose first capture group, when it is a
//! number, is the step; and the heartbeat file's mtime (`$TRAINLET_HEARTBEAT`) for a
//! trainer that says so itself. A CMD silent for `--stall-after` is stalled, busy or
//! not: CPU use is reported, never taken for progress.
//!
//! Everything here is pure: bytes and times in, lines, progress and transitions out.
//! The copy threads of output.rs feed it from the pipes.

use std::time::{Duration, SystemTime};

use regex::bytes::Regex;

/// The longest part of a line that is kept (for the pattern and the `Stalled` Event's
/// last line): a line without a newline grows no buffer past it.
pub const MAX_LINE: usize = 4096;
/// The longest last line quoted in the `Stalled` Event and the progress annotation.
pub const MAX_QUOTE: usize = 200;

/// The environment variable that names the heartbeat file for CMD.
pub const HEARTBEAT_ENV: &str = "TRAINLET_HEARTBEAT";
/// The heartbeat file's name, in the observation directory (or a temporary one).
pub const HEARTBEAT_FILE: &str = "heartbeat";

/// The progress watch of `exec`, validated.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// `--stall-after`; `None` watches progress for the metrics only.
    pub stall_after: Option<Duration>,
    pub pattern: Pattern,
    /// The file CMD may touch to say it makes progress (`$TRAINLET_HEARTBEAT`).
    pub heartbeat: Option<std::path::PathBuf>,
}

/// Splits a byte stream into lines, keeping at most [`MAX_LINE`] bytes of each.
#[derive(Debug, Default)]
pub struct LineScanner {
    line: Vec<u8>,
    /// Bytes of the current line beyond what is kept.
    dropped: bool,
}

impl LineScanner {
    /// Feeds one chunk; `each` gets every line the chunk completes (without its end).
    pub fn feed(&mut self, mut chunk: &[u8], mut each: impl FnMut(&[u8])) {
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            self.keep(&chunk[..end]);
            // An empty line (`\r\n`'s second half, blank lines) is no news.
            if !self.line.is_empty() || self.dropped {
                each(&self.line);
            }
            self.line.clear();
            self.dropped = false;
            chunk = &chunk[end + 1..];
        }
        self.keep(chunk);
    }

    fn keep(&mut self, part: &[u8]) {
        let room = MAX_LINE - self.line.len();
        if part.len() > room {
            self.dropped = true;
        }
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }
}

/// Which lines are progress: every line, or those a pattern matches.
#[derive(Debug, Clone, Default)]
pub struct Pattern(Option<Regex>);

impl Pattern {
    /// `--progress-pattern`; an invalid one is the user's to fix, with regex's reason.
    pub fn new(pattern: Option<&str>) -> Result<Pattern, String> {
        match pattern {
            None => Ok(Pattern(None)),
            Some(p) => Regex::new(p).map(|r| Pattern(Some(r))).map_err(|e| {
                e.to_string()
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            }),
        }
    }

    /// `None` when the line is no progress; else the step, when the pattern's first
    /// group captured a number.
    pub fn progress(&self, line: &[u8]) -> Option<Option<f64>> {
        let Some(re) = &self.0 else {
            return Some(None);
        };
        let caps = re.captures(line)?;
        Some(
            caps.get(1)
                .and_then(|m| std::str::from_utf8(m.as_bytes()).ok())
                .and_then(|s| s.trim().parse::<f64>().ok())
                .and_then(step),
        )
    }
}

/// The largest step kept: 2^53, past which an `f64` no longer counts one by one. A
/// larger number is no step count (a hash, a timestamp in ns), and would be shown
/// with up to 309 digits.
pub const MAX_STEP: f64 = 9_007_199_254_740_992.0;

/// `n` as a step: a count, so a finite number from 0 to [`MAX_STEP`] (`-0` is 0);
/// anything else (NaN, infinities, negative numbers, giants) is no step.
pub fn step(n: f64) -> Option<f64> {
    (n.is_finite() && (0.0..=MAX_STEP).contains(&n)).then_some(n + 0.0)
}

/// The last progress CMD made.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// When, by the wall clock: what peers and people compare.
    pub at: Option<SystemTime>,
    /// The last step a matching line gave.
    pub step: Option<f64>,
    /// The last line that was progress, at most [`MAX_QUOTE`] characters.
    pub line: String,
    /// Whether `line` gave `step` (a matching line without a number does not).
    pub stepped: bool,
    /// Lines that were progress, all told.
    pub lines: u64,
}

impl Progress {
    /// One complete output line, at `now`.
    pub fn on_line(&mut self, pattern: &Pattern, line: &[u8], now: SystemTime) {
        let Some(step) = pattern.progress(line) else {
            return;
        };
        self.at = Some(now);
        if step.is_some() {
            self.step = step;
        }
        self.stepped = step.is_some();
        self.line = quote(line);
        self.lines += 1;
    }

    /// The heartbeat file changed ([`Heartbeat::changed`]), as exec saw at `now`: the
    /// time of the progress is exec's, never the mtime CMD set.
    pub fn on_heartbeat(&mut self, now: SystemTime) {
        self.at = Some(now);
    }
}

/// The heartbeat file's mtime as exec last saw it. CMD sets the mtime to whatever it
/// likes (`touch`, or `os.utime` with its own clock: the past, the future, year
/// 10000), so only a change of it, in either direction, is news, and it is progress at
/// the moment exec sees it ([`Progress::on_heartbeat`]). Silence then never depends on
/// the value CMD wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Heartbeat {
    seen: Option<SystemTime>,
}

impl Heartbeat {
    /// From the file's mtime as exec created it, before CMD started (`None`: unread).
    pub fn new(mtime: Option<SystemTime>) -> Heartbeat {
        Heartbeat { seen: mtime }
    }

    /// Whether `mtime`, read now, differs from the last one seen: then CMD touched the
    /// file since. A file that cannot be read (`None`) is no news, and no change.
    pub fn changed(&mut self, mtime: Option<SystemTime>) -> bool {
        let Some(mtime) = mtime else {
            return false;
        };
        let changed = self.seen != Some(mtime);
        self.seen = Some(mtime);
        changed
    }
}

/// A line as text for an Event: lossy UTF-8, control characters dropped, cut to
/// [`MAX_QUOTE`] characters with an ellipsis.
pub fn quote(line: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(line)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    let text = text.trim();
    match text.char_indices().nth(MAX_QUOTE) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// A change of the stall state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// No progress for `--stall-after`: the `n`th stall since exec started.
    Stalled { n: u64 },
    /// Progress again after a stall.
    Resumed,
}

/// The stall state of one run of CMD.
#[derive(Debug, Clone, PartialEq)]
pub struct StallWatch {
    pub after: Duration,
    /// When the watch (re)started: a CMD that never writes anything is stalled
    /// `after` this.
    pub since: SystemTime,
    pub stalled: bool,
    /// Stalls since exec started, over every run of CMD.
    pub stalls: u64,
}

impl StallWatch {
    pub fn new(after: Duration, now: SystemTime) -> StallWatch {
        StallWatch {
            after,
            since: now,
            stalled: false,
            stalls: 0,
        }
    }

    /// CMD started again: its silence counts from now.
    pub fn restart(&mut self, now: SystemTime) {
        self.since = now;
        self.stalled = false;
    }

    /// The last progress, or the start when there was none yet.
    pub fn anchor(&self, progress: &Progress) -> SystemTime {
        progress
            .at
            .filter(|at| *at > self.since)
            .unwrap_or(self.since)
    }

    /// What changed at `now`.
    pub fn check(&mut self, progress: &Progress, now: SystemTime) -> Option<Transition> {
        let silent = now
            .duration_since(self.anchor(progress))
            .unwrap_or_default();
        match (self.stalled, silent >= self.after) {
            (false, true) => {
                self.stalled = true;
                self.stalls += 1;
                Some(Transition::Stalled { n: self.stalls })
            }
            (true, false) => {
                self.stalled = false;
                Some(Transition::Resumed)
            }
            _ => None,
        }
    }
}

/// The `Stalled` Event's text: how long, the last progress, and what CMD did
/// meanwhile: its CPU use over the window, and the GPUs' utilization where NVML sees
/// them. What was seen, not a guess at why.
pub fn stalled_note(
    silent: Duration,
    progress: &Progress,
    cpu_percent: Option<f64>,
    gpu_percent: &[u32],
) -> String {
    let mut note = format!("no progress for {}", for_people(silent));
    match (progress.step, progress.line.is_empty()) {
        (Some(step), false) if progress.stepped => {
            note.push_str(&format!("; last step {step} in {:?}", progress.line));
        }
        (Some(step), false) => {
            note.push_str(&format!(
                "; last step {step}; last output {:?}",
                progress.line
            ));
        }
        (None, false) => note.push_str(&format!("; last output {:?}", progress.line)),
        (_, true) => note.push_str("; no progress output yet"),
    }
    if let Some(cpu) = cpu_percent {
        note.push_str(&format!("; CMD used {cpu:.0}% of a core over the window"));
    }
    if !gpu_percent.is_empty() {
        let each: Vec<String> = gpu_percent.iter().map(|p| format!("{p}%")).collect();
        note.push_str(&format!("; GPU utilization {}", each.join(" ")));
    }
    note
}

/// A duration as the notes say it: whole seconds (`5s`, `10m 3s`), or milliseconds
/// under a second (`800ms`), never `0s` for a silence that was there.
pub fn for_people(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

#[cfg(test)]
mod tests;
