//! Whether CMD makes progress, from what it already does: each new line it writes (on
//! stdout or stderr, ended by `\n`, or by `\r` as progress bars end theirs), or only
//! the lines `--progress-pattern` matches, whose first capture group, when it is a
//! number, is the step; and the heartbeat file's mtime (`$TRAINLET_HEARTBEAT`) for a
//! trainer that says so itself. When silence is a stall is `watching.rs`'s.
//!
//! Everything here is pure: bytes and times in, lines and progress out. The copy
//! threads of `supervise/output.rs` feed it from the pipes.

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
    /// `--stall-scope`: whose silence is a stall; `None` (`auto`) lets the cluster
    /// decide ([`Scope::of`]).
    pub scope: Option<Scope>,
}

/// Whose silence is a stall (`--stall-scope`).
///
/// In synchronous training (DDP, FSDP, DeepSpeed, Horovod, MultiWorkerMirrored, JAX,
/// MPI) a rank that hangs stops every other rank in the next collective, so the job's
/// progress is the one signal: a rank that printed a start-up warning and is quiet
/// since, while another rank prints steps, is healthy. In asynchronous training
/// (TensorFlow's ParameterServerStrategy) the workers do not wait for each other, and
/// one can hang alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// The job is stalled when no pod of it made progress for `--stall-after`; one pod
    /// (rank 0's) says so.
    #[default]
    Job,
    /// Each pod is stalled when its CMD made progress and then none for
    /// `--stall-after`, whatever the other pods do.
    Pod,
    /// What `auto` means with parameter servers: the job's rule, and besides it each
    /// pod is stalled when its CMD gave a *signal* of progress (a heartbeat, a line
    /// `--progress-pattern` matches, a Kubeflow report) and then no progress for
    /// `--stall-after`. Parameter servers, and TensorFlow 2's workers, print
    /// TensorFlow's start-up lines and then serve in silence: a line alone cannot tell
    /// a hung worker from a healthy server, a signal the trainer chose can.
    Async,
}

impl Scope {
    /// The scope `--stall-scope auto` means: [`Scope::Async`] when the cluster has
    /// TensorFlow's parameter servers (`ps`, whose workers train asynchronously), else
    /// the job.
    pub fn of(cluster_types: &[&str]) -> Scope {
        if cluster_types.contains(&PS) {
            Scope::Async
        } else {
            Scope::Job
        }
    }
}

/// TensorFlow's parameter-server task type: a job that has it trains asynchronously.
pub const PS: &str = "ps";

/// Splits a byte stream into lines, keeping at most [`MAX_LINE`] bytes of each.
#[derive(Debug, Default)]
pub struct LineScanner {
    pub(super) line: Vec<u8>,
    /// Bytes of the current line beyond what is kept.
    dropped: bool,
}

impl LineScanner {
    /// Feeds one chunk; `each` gets the lines the chunk completes, the last first,
    /// until it returns `true`: only the last progress of a chunk matters, and with
    /// 64-byte lines a chunk completes two thousand.
    pub fn feed_rev(&mut self, chunk: &[u8], mut each: impl FnMut(&[u8]) -> bool) {
        let Some(last_end) = memchr::memrchr2(b'\n', b'\r', chunk) else {
            self.keep(chunk);
            return;
        };
        let (complete, rest) = (&chunk[..last_end], &chunk[last_end + 1..]);
        let mut end = complete.len();
        loop {
            match memchr::memrchr2(b'\n', b'\r', &complete[..end]) {
                Some(i) => {
                    let line = &complete[i + 1..end];
                    // An empty line (`\r\n`'s second half, blank lines) is no news.
                    if !line.is_empty() && each(&line[..line.len().min(MAX_LINE)]) {
                        break;
                    }
                    end = i;
                }
                None => {
                    // The first line: what the chunks before began of it.
                    self.keep(&complete[..end]);
                    if !self.line.is_empty() || self.dropped {
                        each(&self.line);
                    }
                    break;
                }
            }
        }
        self.line.clear();
        self.dropped = false;
        self.keep(rest);
    }

    fn keep(&mut self, part: &[u8]) {
        let room = MAX_LINE - self.line.len();
        if part.len() > room {
            self.dropped = true;
        }
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }
}

/// What one chunk of CMD's output says of its progress: its last progress line and
/// the step, from that line or the last line before it in the chunk that gives one.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkProgress {
    /// The last progress line, quoted ([`quote`]).
    pub line: String,
    pub step: Option<f64>,
    /// Whether the last progress line gave the step itself.
    pub stepped: bool,
}

impl LineScanner {
    /// The chunk's last progress, looking at its lines from the end: it stops at the
    /// last progress line when that gives a step or no line can (no pattern, or one
    /// without a group), else at the line before it that does.
    pub fn last_progress(&mut self, chunk: &[u8], pattern: &Pattern) -> Option<ChunkProgress> {
        let mut last: Option<ChunkProgress> = None;
        let steps = pattern.has_steps();
        self.feed_rev(chunk, |line| {
            let Some(s) = pattern.progress(line) else {
                return false;
            };
            match &mut last {
                None => {
                    last = Some(ChunkProgress {
                        line: quote(line),
                        step: s,
                        stepped: s.is_some(),
                    })
                }
                Some(p) => p.step = s,
            }
            s.is_some() || !steps
        });
        last
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

    /// Whether `--progress-pattern` was given: a matching line is then a signal.
    pub fn is_given(&self) -> bool {
        self.0.is_some()
    }

    /// Whether a line can give a step: the pattern has a group.
    pub fn has_steps(&self) -> bool {
        self.0.as_ref().is_some_and(|re| re.captures_len() > 1)
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
    /// The last progress CMD signalled on purpose: a heartbeat, a line the pattern
    /// matched, a Kubeflow report (not any line, where no pattern is given):
    /// [`Scope::Async`]'s own stalls.
    pub signalled: Option<SystemTime>,
    /// The last step a matching line gave.
    pub step: Option<f64>,
    /// The last line that was progress, at most [`MAX_QUOTE`] characters.
    pub line: String,
    /// Whether `line` gave `step` (a matching line without a number does not).
    pub stepped: bool,
    /// What CMD last reported through the Kubeflow progress endpoint.
    pub reported: Option<Reported>,
}

/// A report through the Kubeflow progress endpoint (`src/kubeflow`), as published
/// (`trainlet.io/progress`) and handed over to the sidecar.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reported {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u32>,
    /// At most [`MAX_REPORTED_METRICS`], in the order sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Metric>,
}

/// One named metric of a report: its value as sent, text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Metric {
    pub name: String,
    pub value: String,
}

/// The most metrics of a report that are published: an annotation is patched and
/// read by every peer, and a metric is a Prometheus series.
pub const MAX_REPORTED_METRICS: usize = 16;

impl Progress {
    /// One complete output line, at `now`.
    pub fn on_line(&mut self, pattern: &Pattern, line: &[u8], now: SystemTime) {
        let Some(step) = pattern.progress(line) else {
            return;
        };
        self.at = Some(now);
        if pattern.is_given() {
            self.signalled = Some(now);
        }
        if step.is_some() {
            self.step = step;
        }
        self.stepped = step.is_some();
        self.line = quote(line);
    }

    /// A report through the Kubeflow endpoint at `now`: progress, with its step
    /// ([`step`]) when it gives one.
    pub fn on_report(&mut self, mut reported: Reported, step_given: Option<f64>, now: SystemTime) {
        self.at = Some(now);
        self.signalled = Some(now);
        if let Some(s) = step_given.and_then(step) {
            self.step = Some(s);
        }
        reported.metrics.truncate(MAX_REPORTED_METRICS);
        self.reported = Some(reported);
    }

    /// The heartbeat file changed ([`Heartbeat::changed`]), as exec saw at `now`: the
    /// time of the progress is exec's, never the mtime CMD set.
    pub fn on_heartbeat(&mut self, now: SystemTime) {
        self.at = Some(now);
        self.signalled = Some(now);
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
