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
    /// `exec --on-peer-change exit` (or `restart` past `--max-restarts`): a peer of the
    /// resolved cluster was lost or replaced; CMD was stopped so that the Job
    /// controller replaces this pod and its init resolves the new cluster. Retryable.
    PeerChanged = 7,
    /// `exec --on-stall exit` (or `restart` past `--max-restarts`): CMD made no progress
    /// for `--stall-after`; it was stopped so that the Job controller replaces this
    /// pod. Retryable.
    Stalled = 8,
    /// `exec --report`: CMD is a launcher (torchrun, `python -m torch.distributed.run`,
    /// mpirun, deepspeed, `accelerate launch`) that exited 1, as it does for any
    /// worker's failure, and the root cause it left names no permanent error; exec
    /// exits 9 instead of 1, so that a failure policy retries the pod. Retryable.
    LauncherFailed = 9,
    /// `init --preflight`: a pod of the job could not reach its neighbour in the ring,
    /// or was not reached by it: the network between the pods does not carry the job's
    /// traffic. Nothing was written. Retryable: a replacement may land where it does.
    PeerUnreachable = 10,
    /// `exec`: the command exists but cannot be executed (as in shells).
    CannotExecute = 126,
    /// `exec`: the command was not found (as in shells).
    CommandNotFound = 127,
}

impl Code {
    /// Every code, in order: `trainlet --help` (and so docs/flags.md) lists them from
    /// here, and a test checks that the README's and docs/failure-handling.md's tables
    /// have a row for each.
    pub const ALL: [Code; 13] = [
        Code::Ok,
        Code::Internal,
        Code::Usage,
        Code::NotReady,
        Code::Api,
        Code::Inconsistent,
        Code::PortConflict,
        Code::PeerChanged,
        Code::Stalled,
        Code::LauncherFailed,
        Code::PeerUnreachable,
        Code::CannotExecute,
        Code::CommandNotFound,
    ];

    /// What the code means, in a few words.
    pub fn meaning(self) -> &'static str {
        match self {
            Code::Ok => "success",
            Code::Internal => "internal failure (a local I/O error)",
            Code::Usage => "invalid flags or configuration (status: no such job)",
            Code::NotReady => "peers not ready",
            Code::Api => "Kubernetes API error",
            Code::Inconsistent => "inconsistent peers",
            Code::PortConflict => "port conflict",
            Code::PeerChanged => {
                "(exec) a peer changed and --on-peer-change exit (or restart past --max-restarts) ended CMD"
            }
            Code::Stalled => {
                "(exec) CMD made no progress for --stall-after and --on-stall exit (or restart past --max-restarts) ended it"
            }
            Code::LauncherFailed => {
                "(exec --report) a launcher (torchrun, mpirun, deepspeed, accelerate) exited 1 and its root cause is not a permanent error"
            }
            Code::PeerUnreachable => {
                "(init --preflight) a peer could not be reached, or did not reach this pod"
            }
            Code::CannotExecute => "(exec) CMD cannot be executed",
            Code::CommandNotFound => "(exec) CMD not found",
        }
    }
}

/// Every exit code and its meaning in one sentence, for `--help`.
pub fn summary() -> String {
    let codes: Vec<String> = Code::ALL
        .iter()
        .map(|c| format!("{} {}", *c as u8, c.meaning()))
        .collect();
    format!(
        "Exit codes: {}. Otherwise exec exits with CMD's code, or 128 + the signal that killed it.",
        codes.join(", ")
    )
}

impl From<Code> for std::process::ExitCode {
    fn from(code: Code) -> Self {
        std::process::ExitCode::from(code as u8)
    }
}

/// trainlet-init's codes that are permanent: invalid flags (2), inconsistent peers (5),
/// an internal failure (1). Its other failures are retryable: peers not ready before
/// the timeout (3), an API error (4), a port taken on this node (6), a peer the
/// pre-flight could not reach (10).
pub const INIT_PERMANENT: [i32; 3] = [
    Code::Internal as i32,
    Code::Usage as i32,
    Code::Inconsistent as i32,
];

/// The training container's permanent codes, as the operators' `ExitCode` policy has
/// them (tf-operator's `IsRetryableExitCode`, the seeds): 1 general error, 2 misuse (also
/// trainlet exec's invalid flags), 126 cannot execute, 127 not found, 128 invalid exit
/// argument, 139 SIGSEGV. Retryable there: 130 (SIGINT), 137 (SIGKILL, an OOM kill),
/// 143 (SIGTERM). Current Kubeflow (`pkg/util/train/train_util.go`) retries every code
/// from 128 up, 128 and 139 included; trainlet keeps the seeds' list, since a segfault
/// repeats on a retry.
pub const CMD_PERMANENT: [i32; 6] = [1, 2, 126, 127, 128, 139];

/// `trainlet exec`'s own retryable codes: a peer changed (7), CMD stalled (8), a
/// launcher's worker failed (9). A Job's podFailurePolicy (`inject --failure-policy`)
/// counts them against backoffLimit, and the controller replaces the pod.
pub const CMD_RETRYABLE: [i32; 3] = [
    Code::PeerChanged as i32,
    Code::Stalled as i32,
    Code::LauncherFailed as i32,
];

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The permanent lists are the operators' `ExitCode` split; everything else, the
    /// signals an operator retries (130, 137, 143) included, is counted, not fatal.
    #[test]
    fn exit_codes_split_as_the_operators_exit_code_policy_does() {
        assert_eq!(CMD_PERMANENT, [1, 2, 126, 127, 128, 139]);
        for c in [130, 137, 143, 3, 42] {
            assert!(!CMD_PERMANENT.contains(&c), "{c}");
        }
        assert_eq!(INIT_PERMANENT, [1, 2, 5]);
        for c in [Code::NotReady, Code::Api, Code::PortConflict] {
            assert!(!INIT_PERMANENT.contains(&(c as i32)), "{c:?}");
        }
        assert!(!INIT_PERMANENT.contains(&137));
        for c in CMD_RETRYABLE {
            assert!(!CMD_PERMANENT.contains(&c), "{c}");
        }
        assert_eq!(CMD_RETRYABLE, [7, 8, 9]);
    }

    #[test]
    fn the_summary_lists_every_code_in_order() {
        let numbers: Vec<u8> = Code::ALL.iter().map(|c| *c as u8).collect();
        assert_eq!(numbers, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 126, 127]);
        assert_eq!(
            summary(),
            "Exit codes: 0 success, 1 internal failure (a local I/O error), 2 invalid flags or configuration (status: no such job), 3 peers not ready, 4 Kubernetes API error, 5 inconsistent peers, 6 port conflict, 7 (exec) a peer changed and --on-peer-change exit (or restart past --max-restarts) ended CMD, 8 (exec) CMD made no progress for --stall-after and --on-stall exit (or restart past --max-restarts) ended it, 9 (exec --report) a launcher (torchrun, mpirun, deepspeed, accelerate) exited 1 and its root cause is not a permanent error, 10 (init --preflight) a peer could not be reached, or did not reach this pod, 126 (exec) CMD cannot be executed, 127 (exec) CMD not found. Otherwise exec exits with CMD's code, or 128 + the signal that killed it."
        );
    }
}
