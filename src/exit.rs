//! Exit codes are a contract with whoever runs trainlet: the kubelet restarts a failed
//! init container, and a person reading `kubectl describe` sees the code. Each kind of
//! failure has its own code, and every error type of the crate maps itself to one.

use std::fmt;

/// The process exit codes of every subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    /// Success.
    Ok = 0,
    /// An unexpected internal failure, such as a local I/O error.
    Internal = 1,
    /// Invalid flags or configuration.
    Usage = 2,
    /// Peers were not ready before the timeout (`resolve`: not ready now).
    NotReady = 3,
    /// A Kubernetes API error: unreachable, forbidden, or a refused request.
    Api = 4,
    /// Inconsistent peers: the own pod matches no job or several, or indexes repeat.
    Inconsistent = 5,
    /// A port is already in use in this pod's network namespace.
    PortConflict = 6,
    /// `exec`: the command exists but cannot be executed (as in shells).
    CannotExecute = 126,
    /// `exec`: the command was not found (as in shells).
    CommandNotFound = 127,
}

impl From<Code> for std::process::ExitCode {
    fn from(code: Code) -> Self {
        std::process::ExitCode::from(code as u8)
    }
}

/// How the process ends: with one of trainlet's codes, or (`exec --report`) with the
/// status of the command it ran, which trainlet passes on as a shell would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(Code),
    /// CMD's exit code, or 128+signal.
    Child(i32),
}

impl Exit {
    pub const OK: Exit = Exit::Code(Code::Ok);
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        match exit {
            Exit::Code(code) => code.into(),
            // The kernel keeps the low 8 bits of an exit status.
            Exit::Child(status) => std::process::ExitCode::from((status & 0xff) as u8),
        }
    }
}

/// An error that ends the process: its one-line message and its exit code.
///
/// Every module's error enum converts into this, so `main` can print one line and exit
/// with the code that the module chose.
#[derive(Debug)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl Failure {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Failure::new(Code::Usage, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line, always: a multi-line error in a container log is hard to grep.
        f.write_str(&self.message.replace('\n', " "))
    }
}

impl std::error::Error for Failure {}
