//! What a launcher's exit means. torchrun, mpirun, deepspeed and `accelerate launch`
//! exit 1 for any failure of any worker: a syntax error, and just as well one rank's
//! CUDA OOM or an NCCL timeout that a retry fixes. A failure policy sees only the
//! container's exit code, so `exec --report` (CMD's parent, which owns the code it
//! passes on) tells the two apart: it points torch's `TORCHELASTIC_ERROR_FILE` at a
//! file of its own, reads the root cause that torchrun copies there from the first
//! worker that failed, and ends a launcher's exit 1 with [`Code::LauncherFailed`]
//! (retryable) unless that root cause is an error that repeats on a retry.
//!
//! The file is what torch's `ErrorHandler` writes
//! (`torch/distributed/elastic/multiprocessing/errors/error_handler.py`):
//! `{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "…",
//! "timestamp": "1700000000"}}}`, to which torchrun's agent adds `"errorCode"` when it
//! copies a worker's file into its own; or, in the newer format,
//! `{"message": "…", "timestamp": 1700000000}`. A worker writes it only when its entry
//! point is decorated with `@record`; torchrun's own failures (a rendezvous timeout)
//! are always recorded.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::Code;

/// The variable torch's elastic error handler writes its error file to.
pub const ERROR_FILE_ENV: &str = "TORCHELASTIC_ERROR_FILE";
/// exec's own error file, in its private directory.
pub const ERROR_FILE: &str = "torchelastic-error.json";
/// The most of the error file exec reads: a root cause is its first line, and a longer
/// file (a huge traceback) is read as far as the message.
pub const MAX_ERROR_FILE: u64 = 64 * 1024;
/// The most of the root cause's first line the termination message carries.
pub const MAX_CAUSE: usize = 400;
/// An error file older than the last start of CMD by more than this is a previous
/// run's (the file system's clock is coarser than the process's).
pub const STALE_BEFORE_START: Duration = Duration::from_secs(1);

/// Python exceptions that a retry meets again: the code, or its environment, is wrong.
/// Any other root cause (`RuntimeError` of NCCL or CUDA, `OutOfMemoryError`,
/// `DistBackendError`, a rendezvous timeout, a signal) is counted as retryable.
pub const PERMANENT_EXCEPTIONS: [&str; 10] = [
    "SyntaxError",
    "IndentationError",
    "TabError",
    "ImportError",
    "ModuleNotFoundError",
    "NameError",
    "UnboundLocalError",
    "TypeError",
    "AttributeError",
    "NotImplementedError",
];

/// A launcher that exits 1 for any worker's failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `torchrun`, `python -m torch.distributed.run` or `torch.distributed.launch`.
    Torchrun,
    /// `mpirun`, `mpiexec`.
    Mpi,
    /// `deepspeed`.
    Deepspeed,
    /// `accelerate launch`.
    Accelerate,
}

/// The launcher that `argv` starts, if it starts one directly (not through a shell).
pub fn launcher(argv: &[String]) -> Option<Launcher> {
    let program = argv.first()?;
    let base = program.rsplit('/').next().unwrap_or(program);
    match base {
        "torchrun" => Some(Launcher::Torchrun),
        "mpirun" | "mpiexec" => Some(Launcher::Mpi),
        "deepspeed" => Some(Launcher::Deepspeed),
        "accelerate" => {
            (argv.get(1).map(String::as_str) == Some("launch")).then_some(Launcher::Accelerate)
        }
        p if is_python(p) => match python_module(&argv[1..])? {
            "torch.distributed.run" | "torch.distributed.launch" => Some(Launcher::Torchrun),
            _ => None,
        },
        _ => None,
    }
}

/// `python`, `python3`, `python3.11`.
fn is_python(base: &str) -> bool {
    base.strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The module of `python [options] -m MODULE`: options come before it, `-c` or a
/// script ends the search.
fn python_module(args: &[String]) -> Option<&str> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let flags = arg.strip_prefix('-').filter(|f| !f.is_empty())?;
        if flags.starts_with('-') {
            // `--`, or a long option such as `--version`: no module follows.
            return None;
        }
        for (i, c) in flags.char_indices() {
            let rest = &flags[i + c.len_utf8()..];
            match c {
                'm' if rest.is_empty() => return args.next().map(String::as_str),
                'm' => return Some(rest),
                'c' => return None,
                // Options that take a value: joined, or the next argument.
                'W' | 'X' => {
                    if rest.is_empty() {
                        args.next();
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    None
}

/// What the error file says failed first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootCause {
    /// The first line of the message, e.g. `ValueError: boom`, at most [`MAX_CAUSE`]
    /// bytes.
    pub message: String,
}

impl RootCause {
    fn new(message: &str) -> Option<RootCause> {
        let line = message.lines().map(str::trim).find(|l| !l.is_empty())?;
        let mut end = line.len().min(MAX_CAUSE);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let message = if end < line.len() {
            format!("{}…", &line[..end])
        } else {
            line.to_string()
        };
        Some(RootCause { message })
    }

    /// The exception's type, without its module: `ModuleNotFoundError` of
    /// `ModuleNotFoundError: No module named 'x'`.
    pub fn exception(&self) -> Option<&str> {
        let (name, _) = self.message.split_once(':')?;
        let ok = !name.is_empty()
            && name.split('.').all(|part| {
                part.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        ok.then(|| name.rsplit('.').next().unwrap_or(name))
    }

    /// Whether a retry meets the same error ([`PERMANENT_EXCEPTIONS`]).
    pub fn permanent(&self) -> bool {
        self.exception()
            .is_some_and(|e| PERMANENT_EXCEPTIONS.contains(&e))
    }
}

/// The root cause in the text of an error file, either format; `None` for anything
/// else. A file cut at [`MAX_ERROR_FILE`] still gives its message, which comes first.
pub fn parse_error_file(text: &str) -> Option<RootCause> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => match v.get("message")? {
            serde_json::Value::String(m) => RootCause::new(m),
            m => RootCause::new(m.get("message")?.as_str()?),
        },
        Err(_) => {
            // Cut: `{"message": {"message": "…"`, as json.dump writes it.
            let rest = text.trim_start().strip_prefix('{')?.trim_start();
            let rest = rest
                .strip_prefix("\"message\"")?
                .trim_start()
                .strip_prefix(':')?;
            let rest = rest.trim_start();
            let rest = rest
                .strip_prefix('{')
                .map(str::trim_start)
                .map_or(Some(rest), |r| {
                    r.strip_prefix("\"message\"")?
                        .trim_start()
                        .strip_prefix(':')
                        .map(str::trim_start)
                })?;
            let message = serde_json::Deserializer::from_str(rest)
                .into_iter::<String>()
                .next()?
                .ok()?;
            RootCause::new(&message)
        }
    }
}

/// What exec does with the code CMD ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it on: CMD is no launcher, or did not exit 1.
    PassOn,
    /// A launcher's exit 1 whose root cause repeats on a retry: exit 1, permanent.
    Permanent,
    /// A launcher's exit 1 for any other failure: exit [`Code::LauncherFailed`].
    Retry,
}

impl Verdict {
    /// The code exec exits with for CMD's `code`.
    pub fn code(self, code: i32) -> i32 {
        match self {
            Verdict::Retry => Code::LauncherFailed as i32,
            Verdict::PassOn | Verdict::Permanent => code,
        }
    }
}

/// Classifies CMD's exit `code`: a launcher's exit 1 is retryable unless its root
/// cause is permanent; everything else passes on as it is.
pub fn classify(launcher: Option<Launcher>, code: i32, cause: Option<&RootCause>) -> Verdict {
    if launcher.is_none() || code != 1 {
        return Verdict::PassOn;
    }
    if cause.is_some_and(RootCause::permanent) {
        Verdict::Permanent
    } else {
        Verdict::Retry
    }
}

/// The termination message: how CMD ended (`torchrun exited with code 1`), its root
/// cause, and what exec made of it.
pub fn reason(how: &str, cause: Option<&RootCause>, verdict: Verdict) -> String {
    let mut s = how.to_string();
    if let Some(c) = cause {
        s.push_str("; root cause: ");
        s.push_str(&c.message);
    }
    match verdict {
        Verdict::PassOn => {}
        Verdict::Permanent => s.push_str(&format!(
            "; exit 1 (permanent): a {} repeats on a retry",
            cause.and_then(RootCause::exception).unwrap_or("failure")
        )),
        Verdict::Retry => s.push_str(&format!(
            "; exit {} (retryable): a launcher exits 1 for any worker's failure",
            Code::LauncherFailed as i32
        )),
    }
    s
}

/// Reads the root cause from the error file at `path`, if CMD's last run wrote it: at
/// most [`MAX_ERROR_FILE`] bytes, and none from a file older than `started` by more
/// than [`STALE_BEFORE_START`]. Nothing here fails: no file, or no root cause, is
/// `None`.
pub fn read_root_cause(path: &Path, started: SystemTime) -> Option<RootCause> {
    let file = std::fs::File::open(path).ok()?;
    let modified = file.metadata().ok()?.modified().ok()?;
    if modified + STALE_BEFORE_START < started {
        return None;
    }
    let mut buf = Vec::new();
    file.take(MAX_ERROR_FILE).read_to_end(&mut buf).ok()?;
    parse_error_file(&String::from_utf8_lossy(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn knows_the_launchers_by_their_command_line() {
        for (cmd, l) in [
            (
                "torchrun --nproc-per-node 8 train.py",
                Some(Launcher::Torchrun),
            ),
            ("/opt/venv/bin/torchrun train.py", Some(Launcher::Torchrun)),
            (
                "python -m torch.distributed.run train.py",
                Some(Launcher::Torchrun),
            ),
            (
                "python3.11 -u -m torch.distributed.launch train.py",
                Some(Launcher::Torchrun),
            ),
            (
                "python3 -W ignore -X dev -mtorch.distributed.run t.py",
                Some(Launcher::Torchrun),
            ),
            (
                "python -um torch.distributed.run train.py",
                Some(Launcher::Torchrun),
            ),
            ("mpirun -np 4 python train.py", Some(Launcher::Mpi)),
            ("/usr/bin/mpiexec -n 2 ./a.out", Some(Launcher::Mpi)),
            ("deepspeed --num_gpus 8 train.py", Some(Launcher::Deepspeed)),
            ("accelerate launch train.py", Some(Launcher::Accelerate)),
            ("accelerate config", None),
            ("python train.py -m torch.distributed.run", None),
            ("python -c import torch", None),
            ("python -m pytest", None),
            ("python --version", None),
            ("pythonista -m torch.distributed.run", None),
            ("sh -c torchrun train.py", None),
            ("torchrunner train.py", None),
        ] {
            assert_eq!(launcher(&argv(cmd)), l, "{cmd}");
        }
        assert_eq!(launcher(&[]), None);
    }

    /// The two formats of torch's `ErrorHandler`, as written: the dict that
    /// `record_exception` writes (with the `errorCode` torchrun's `dump_error_file`
    /// adds), and the newer string message.
    #[test]
    fn reads_the_root_cause_of_both_error_file_formats() {
        let dict = r#"{"message": {"message": "ModuleNotFoundError: No module named 'tansformers'", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 1\nModuleNotFoundError: No module named 'tansformers'\n", "timestamp": "1764080000"}, "errorCode": 1}}"#;
        let cause = parse_error_file(dict).unwrap();
        assert_eq!(
            cause.message,
            "ModuleNotFoundError: No module named 'tansformers'"
        );
        assert_eq!(cause.exception(), Some("ModuleNotFoundError"));
        assert!(cause.permanent());
        let string = r#"{"message": "RuntimeError: NCCL communicator was aborted on rank 3.\nmore", "timestamp": 1764080000}"#;
        let cause = parse_error_file(string).unwrap();
        assert_eq!(
            cause.message,
            "RuntimeError: NCCL communicator was aborted on rank 3."
        );
        assert_eq!(cause.exception(), Some("RuntimeError"));
        assert!(!cause.permanent());
    }

    #[test]
    fn a_bad_or_cut_error_file_is_no_root_cause_and_no_crash() {
        for bad in [
            "",
            "not json",
            "[]",
            "{}",
            r#"{"message": 3}"#,
            r#"{"message": {"extraInfo": {}}}"#,
            r#"{"message": "   \n  "}"#,
            r#"{"message": {"message": "#,
            "\u{0}\u{1}",
        ] {
            assert_eq!(parse_error_file(bad), None, "{bad:?}");
        }
        // Cut after the message, within the traceback: the message is still there.
        let cut = r#"{"message": {"message": "TypeError: forward() got an unexpected keyword argument 'x'", "extraInfo": {"py_callstack": "Traceback (most rec"#;
        assert_eq!(
            parse_error_file(cut).unwrap().message,
            "TypeError: forward() got an unexpected keyword argument 'x'"
        );
        let long = format!(r#"{{"message": "ValueError: {}"}}"#, "é".repeat(MAX_CAUSE));
        let cause = parse_error_file(&long).unwrap();
        assert!(cause.message.ends_with('…'));
        assert!(cause.message.len() <= MAX_CAUSE + '…'.len_utf8());
    }

    #[test]
    fn the_exception_is_a_dotted_python_name_before_the_colon() {
        let cause = |m: &str| RootCause {
            message: m.to_string(),
        };
        assert_eq!(
            cause("torch.OutOfMemoryError: CUDA out of memory.").exception(),
            Some("OutOfMemoryError")
        );
        assert_eq!(
            cause("torch.distributed.DistBackendError: NCCL error").exception(),
            Some("DistBackendError")
        );
        assert_eq!(
            cause("Signal 9 (SIGKILL) received by PID 12").exception(),
            None
        );
        assert_eq!(cause("a b: c").exception(), None);
        assert_eq!(cause(": c").exception(), None);
        assert_eq!(cause("SyntaxError").exception(), None);
        assert!(cause("foo.SyntaxError: invalid syntax").permanent());
        assert!(!cause("SignalException: Process 7 got signal: 15").permanent());
    }

    #[test]
    fn a_launchers_exit_1_is_retryable_unless_its_root_cause_is_permanent() {
        let permanent = RootCause {
            message: "ImportError: cannot import name 'x'".into(),
        };
        let transient = RootCause {
            message: "torch.OutOfMemoryError: CUDA out of memory.".into(),
        };
        let t = Some(Launcher::Torchrun);
        assert_eq!(classify(t, 1, None), Verdict::Retry);
        assert_eq!(classify(t, 1, Some(&transient)), Verdict::Retry);
        assert_eq!(classify(t, 1, Some(&permanent)), Verdict::Permanent);
        assert_eq!(classify(Some(Launcher::Mpi), 1, None), Verdict::Retry);
        for code in [0, 2, 137, 139] {
            assert_eq!(classify(t, code, None), Verdict::PassOn, "{code}");
        }
        assert_eq!(classify(None, 1, Some(&transient)), Verdict::PassOn);
        assert_eq!(Verdict::Retry.code(1), 9);
        assert_eq!(Verdict::Permanent.code(1), 1);
        assert_eq!(Verdict::PassOn.code(42), 42);
    }

    #[test]
    fn the_reason_names_the_root_cause_and_the_verdict() {
        let cause = RootCause {
            message: "ModuleNotFoundError: No module named 'x'".into(),
        };
        assert_eq!(
            reason(
                "torchrun exited with code 1",
                Some(&cause),
                Verdict::Permanent
            ),
            "torchrun exited with code 1; root cause: ModuleNotFoundError: No module named 'x'; exit 1 (permanent): a ModuleNotFoundError repeats on a retry"
        );
        assert_eq!(
            reason("mpirun exited with code 1", None, Verdict::Retry),
            "mpirun exited with code 1; exit 9 (retryable): a launcher exits 1 for any worker's failure"
        );
        assert_eq!(
            reason("python exited with code 1", Some(&cause), Verdict::PassOn),
            "python exited with code 1; root cause: ModuleNotFoundError: No module named 'x'"
        );
    }

    #[test]
    fn reads_only_a_file_of_this_run_and_at_most_64_kib() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(ERROR_FILE);
        assert_eq!(read_root_cause(&p, SystemTime::now()), None);
        std::fs::write(&p, r#"{"message": "ValueError: boom"}"#).unwrap();
        let before = SystemTime::now() - Duration::from_secs(60);
        assert_eq!(
            read_root_cause(&p, before).map(|c| c.message).as_deref(),
            Some("ValueError: boom")
        );
        let later = SystemTime::now() + Duration::from_secs(60);
        assert_eq!(read_root_cause(&p, later), None);
        let huge = format!(
            r#"{{"message": {{"message": "KeyError: 'lr'", "extraInfo": {{"py_callstack": "{}"}}}}}}"#,
            "x".repeat(2 * MAX_ERROR_FILE as usize)
        );
        std::fs::write(&p, huge).unwrap();
        assert_eq!(
            read_root_cause(&p, before).map(|c| c.message).as_deref(),
            Some("KeyError: 'lr'")
        );
    }
}
