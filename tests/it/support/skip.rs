//! Prerequisites a test needs from the machine, and the one place where a test may be
//! skipped for lack of one.
//!
//! A helper that provides a prerequisite (root, the real node, a memory cgroup, the
//! framework venv, a tool of `.ci/deps`, the portable binary) returns it or a
//! [`Missing`] that names its [`Group`]; a test takes it with [`require!`]. A missing
//! prerequisite fails the test, unless `TRAINLET_TEST_SKIP` (a comma list of group
//! names, e.g. `TRAINLET_TEST_SKIP=node,root`) names its group: then the test passes
//! after printing exactly one line to stderr, `SKIPPED <test>: <group> (<reason>)`,
//! which `make test` counts. Nothing else in the tests returns early for a missing
//! prerequisite.

use std::io::Write;

/// The groups of prerequisites, as `TRAINLET_TEST_SKIP` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// The real node of `tests/node/up` (root, Linux, the image archive of `make image`).
    Node,
    /// Root on this machine: chroot into a rootfs, a PID namespace with `unshare`.
    Root,
    /// A writable cgroup v1 memory controller, to put a memory limit on a test's process.
    Cgroup,
    /// The CPU framework venv (PyTorch, JAX, TensorFlow) that `.ci/frameworks` builds.
    Frameworks,
    /// A tool that `.ci/deps` installs: promtool and prometheus, hadolint.
    Deps,
    /// The portable binary of `make portable`.
    Portable,
}

impl Group {
    pub const ALL: [Group; 6] = [
        Group::Node,
        Group::Root,
        Group::Cgroup,
        Group::Frameworks,
        Group::Deps,
        Group::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::Node => "node",
            Group::Root => "root",
            Group::Cgroup => "cgroup",
            Group::Frameworks => "frameworks",
            Group::Deps => "deps",
            Group::Portable => "portable",
        }
    }
}

/// A prerequisite this machine lacks: its group, and what is missing in one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub group: Group,
    pub reason: String,
}

impl Missing {
    /// The reason is kept to one line (a tool's stderr may span several).
    pub fn new(group: Group, reason: impl Into<String>) -> Missing {
        let reason: String = reason.into();
        let reason = reason
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" / ");
        Missing { group, reason }
    }
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.group.name(), self.reason)
    }
}

/// Root, or the group's prerequisite is missing.
pub fn root(group: Group, what: &str) -> Result<(), Missing> {
    let uid = std::process::Command::new("id")
        .arg("-u")
        .output()
        .expect("id runs");
    if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        Ok(())
    } else {
        Err(Missing::new(group, format!("not root: {what} needs root")))
    }
}

/// `program` found on PATH, or the group's prerequisite is missing; `hint` says where it
/// comes from.
pub fn on_path(group: Group, program: &str, hint: &str) -> Result<(), Missing> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|d| {
        std::fs::metadata(d.join(program))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    if found {
        Ok(())
    } else {
        Err(Missing::new(
            group,
            format!("{program} is not on PATH ({hint})"),
        ))
    }
}

/// The groups a `TRAINLET_TEST_SKIP` value names; an unknown name is an error, so that
/// a typo does not turn into failures that look like missing prerequisites. Pure.
pub fn parse_skip(value: &str) -> Result<Vec<Group>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Group::ALL
                .into_iter()
                .find(|g| g.name() == s)
                .ok_or_else(|| {
                    let names: Vec<&str> = Group::ALL.iter().map(|g| g.name()).collect();
                    format!(
                        "TRAINLET_TEST_SKIP names {s:?}, which is no group of prerequisites ({})",
                        names.join(", ")
                    )
                })
        })
        .collect()
}

/// The line a skipped test prints. Pure.
pub fn skipped_line(test: &str, missing: &Missing) -> String {
    format!("SKIPPED {test}: {missing}\n")
}

/// The test running on this thread: libtest names each test's thread after it.
fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string()
}

/// What [`require!`] does with a missing prerequisite: fails the test, unless
/// `TRAINLET_TEST_SKIP` names its group; then prints the one SKIPPED line and returns,
/// and the test returns at once.
#[track_caller]
pub fn skip(missing: &Missing) {
    let value = std::env::var("TRAINLET_TEST_SKIP").unwrap_or_default();
    let skipped = parse_skip(&value).unwrap_or_else(|e| panic!("{e}"));
    if !skipped.contains(&missing.group) {
        panic!(
            "missing prerequisite: {missing}; provide it, or set TRAINLET_TEST_SKIP={} to skip the tests that need it",
            missing.group.name()
        );
    }
    // Straight to the process's stderr, past libtest's capture, so that `make test`
    // sees and counts the line of a test that passed.
    let line = skipped_line(&current_test(), missing);
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The prerequisite that `$e` (a `Result<T, Missing>`) provides; if it is missing, the
/// test fails, or is skipped where `TRAINLET_TEST_SKIP` names its group ([`skip`]).
/// The only early return for a missing prerequisite in the tests. (The benchmark
/// compiles this file too, and needs no test to skip.)
#[allow(unused_macros)]
macro_rules! require {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(missing) => {
                $crate::support::skip(&missing);
                return;
            }
        }
    };
}
pub(crate) use require;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_lists_name_groups_and_unknown_names_are_refused() {
        assert_eq!(parse_skip(""), Ok(vec![]));
        assert_eq!(
            parse_skip("node, root,,frameworks"),
            Ok(vec![Group::Node, Group::Root, Group::Frameworks])
        );
        assert_eq!(
            parse_skip("node,gpus"),
            Err("TRAINLET_TEST_SKIP names \"gpus\", which is no group of prerequisites (node, root, cgroup, frameworks, deps, portable)".to_string())
        );
    }

    #[test]
    fn a_skip_is_one_line() {
        let m = Missing::new(Group::Frameworks, "pip failed:\n  no network\n\n");
        assert_eq!(
            skipped_line("frameworks::x", &m),
            "SKIPPED frameworks::x: frameworks (pip failed: / no network)\n"
        );
    }
}
