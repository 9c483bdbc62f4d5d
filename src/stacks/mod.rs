//! Where a hung job is stuck: the Python stacks of CMD's processes, as exec reads them
//! on a stall, said short enough for an Event and compared across the job's pods.
//! Pure: what a stack says ([`summary`]), which pods are somewhere else than the rest
//! ([`odd`]), and the bounds on both.

pub mod odd;
pub mod summary;

/// One frame of a Python stack, as read from the interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The function's name (`<module>` for a module's top level).
    pub function: String,
    /// The file as the interpreter knows it, usually absolute.
    pub file: String,
    /// The line being run; 0 where the interpreter gives none.
    pub line: u32,
}

/// One thread of a Python process: its frames, the innermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    /// The OS thread id.
    pub id: u64,
    /// Its Python name, where it has one (`MainThread`, `pt_autograd_0`, …).
    pub name: Option<String>,
    /// The interpreter's main thread: the one a training loop runs in.
    pub main: bool,
    /// Whether the interpreter saw it run Python code rather than wait.
    pub active: bool,
    pub frames: Vec<Frame>,
}

/// One Python process under CMD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// Its command line, as `/proc/PID/cmdline` says it.
    pub command: String,
    /// Its rank in the job (`RANK` in its environment), where it has one.
    pub rank: Option<u32>,
    /// Its working directory: a user's file under it is named relative to it.
    pub cwd: Option<String>,
    pub threads: Vec<Thread>,
}

/// What reading one process under CMD gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capture {
    Read(Process),
    /// Not Python, gone, or denied: named with why, never a failure of the capture.
    Unreadable {
        pid: u32,
        command: String,
        why: String,
    },
}
