//! Where a hung job is stuck: the Python stacks of CMD's processes, as exec reads them
//! on a stall, said short enough for an Event and compared across the job's pods.
//! Pure: what a stack says ([`summary`]), which pods are somewhere else than the rest
//! ([`odd`]), and the bounds on both; [`capture`] alone reads the processes.

pub mod capture;
pub mod odd;
pub mod ranks;
pub mod summary;

/// The abstract Unix socket (the pod's network namespace: no file, no volume) on which
/// exec beside `container` answers `trainlet stacks` with a dump.
pub fn socket_name(container: &str) -> String {
    format!("{SOCKET_PREFIX}{container}")
}

/// What every exec's socket name starts with.
pub const SOCKET_PREFIX: &str = "trainlet-stacks/";

/// The containers whose exec listens for `trainlet stacks`, from `/proc/net/unix`
/// (the pod's network namespace): each listening abstract socket named
/// `@trainlet-stacks/CONTAINER`.
pub fn listening(proc_net_unix: &str) -> Vec<String> {
    let mut out: Vec<String> = proc_net_unix
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            // Num RefCount Protocol Flags Type St Inode Path; __SO_ACCEPTCON: listening.
            let (flags, path) = (cols.get(3)?, cols.get(7)?);
            let name = path.strip_prefix('@')?.strip_prefix(SOCKET_PREFIX)?;
            (*flags == "00010000").then(|| name.to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

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
    /// Its rank in the job (`RANK` in its environment), where it is one: not a launcher
    /// nor a helper of a rank ([`ranks`]).
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_listening_execs_are_read_from_proc_net_unix() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 27364 @trainlet-stacks/trainer\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 27380 @trainlet-stacks/trainer\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 27390 @trainlet-stacks/eval\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 27391 /run/other.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 27392\n";
        assert_eq!(super::listening(text), ["eval", "trainer"]);
        assert!(super::listening("").is_empty());
    }
}
