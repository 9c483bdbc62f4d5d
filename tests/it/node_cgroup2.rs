//! trainlet on a pure cgroup v2 kernel: the machine of tests/node/cgroup2/ (Debian's
//! kernel under QEMU's emulation, booted with `cgroup_no_v1=all`; this host is cgroup
//! v1). Its root is the host's, so this build of trainlet and the test's memory hog run
//! there at the same paths. `trainlet exec --report` watches OOM kills through the
//! cgroup's `memory.events` there, which no other test reaches: CMD's child allocates
//! past a 96 MiB `memory.max`, with `memory.oom.group` 0 (what the kubelet sets with
//! `singleProcessOOMKill: true`) and 1 (its default on cgroup v2 since 1.28).

use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::report_support::memhog;
use crate::support::*;

/// The machine, started once per test run (tests/node/cgroup2/up; `make down` stops
/// it); or what is missing.
fn machine() -> Result<(), Missing> {
    static UP: OnceLock<Result<(), Missing>> = OnceLock::new();
    UP.get_or_init(|| {
        root(
            Group::Node,
            "tests/node/cgroup2/up (a network namespace, a tap, iptables)",
        )?;
        let out = Command::new(repo().join("tests/node/cgroup2/up"))
            .output()
            .expect("tests/node/cgroup2/up runs");
        assert!(
            out.status.success(),
            "tests/node/cgroup2/up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    })
    .clone()
}

/// Runs a shell script in the machine; its output, once it exited 0.
fn in_machine(script: &str) -> String {
    let out = output_with_stdin(
        Command::new(repo().join("tests/node/cgroup2/exec")).args(["-t", "300"]),
        script.as_bytes(),
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    text
}

/// `trainlet exec --report --observations` in a new cgroup with `memory.max` 96 MiB and
/// `memory.oom.group` `group`, CMD starting the memory hog in the background and
/// exiting 3 as soon as it ended (exec looks at the counters once more when CMD ends).
/// Prints, each after a marker line: exec's status, the hog's pid, what exec handed
/// over, `memory.events`, and the kernel's lines.
fn run_oom(group: u8) -> String {
    // One at a time: the machine has one kernel log, which each run clears and reads.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let trainlet = env!("CARGO_BIN_EXE_trainlet");
    let hog = memhog().display().to_string();
    in_machine(&format!(
        r#"set -e
cg=/sys/fs/cgroup/trainlet-oom-{group}
t=/tmp/trainlet-oom-{group}
rmdir $cg 2>/dev/null || true
rm -rf $t && mkdir -p $t/files $t/observed
# Copies, read anew: the machine caches the pages of the programs it ran from the host
# (9p, cache=mmap), and a rebuilt binary at the same path would mix old and new pages.
cp {trainlet} $t/trainlet
cp {hog} $t/memhog
mkdir $cg
echo 96M >$cg/memory.max
echo 0 >$cg/memory.swap.max
echo {group} >$cg/memory.oom.group
printf '%s\n' '{{"cluster":{{"worker":["127.0.0.1:8470"]}},"task":{{"type":"worker","index":0}}}}' >$t/files/tf_config.json
dmesg -C
set +e
sh -c 'echo $$ >'$cg'/cgroup.procs; exec '$t'/trainlet exec --report --observations '$t'/observed --output-dir '$t'/files --pod-name train-0 --pod-namespace ml --interval 200ms -- sh -c "'$t'/memhog 10 & echo \$! >'$t'/hog.pid; wait \$!; echo hog-status=\$? >&2; exit 3"' 2>$t/exec.log
echo "=== exec $?"
echo "=== hog $(cat $t/hog.pid)"
echo "=== observed"; cat $t/observed/exec.json; echo
echo "=== events"; cat $cg/memory.events
echo "=== kernel"; dmesg | grep -E 'Killed process|memory.oom.group' | sed 's/^\[[ 0-9.]*\] //; s/ total-vm:.*//'
echo "=== log"; cat $t/exec.log
rmdir $cg
"#
    ))
}

/// The text after `=== name` up to the next marker.
fn part<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out
        .find(&format!("=== {name}"))
        .unwrap_or_else(|| panic!("no {name} in {out}"));
    let rest = &out[start..];
    let rest = &rest[rest.find('\n').map_or(rest.len(), |i| i + 1)..];
    &rest[..rest.find("=== ").unwrap_or(rest.len())]
}

fn head<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out.find(&format!("=== {name} ")).unwrap() + name.len() + 5;
    out[start..].lines().next().unwrap()
}

/// `memory.oom.group` 0: the kernel kills the hog alone; exec, still alive, names it
/// with its pid as the kernel does, from the `oom_kill` count of `memory.events`, and
/// CMD's own exit code is exec's.
#[test]
fn a_child_oom_killed_on_cgroup_v2_is_named_by_exec() {
    require!(machine());
    let out = run_oom(0);
    let pid = head(&out, "hog");
    assert_eq!(head(&out, "exec"), "3", "{out}");
    assert!(part(&out, "log").contains("hog-status=137"), "{out}");
    // (`oom` counts the times the cgroup hit its limit, which may be more.)
    assert_eq!(
        part(&out, "events")
            .lines()
            .filter(|l| l.starts_with("oom_"))
            .collect::<Vec<_>>(),
        ["oom_kill 1", "oom_group_kill 0"],
        "{out}"
    );
    assert!(
        part(&out, "kernel").starts_with(&format!(
            "Memory cgroup out of memory: Killed process {pid} (memhog)"
        )),
        "{out}"
    );
    let o: Value = serde_json::from_str(part(&out, "observed").trim()).unwrap();
    let kills = o["kills"].as_array().unwrap_or_else(|| panic!("{o}"));
    assert_eq!(kills.len(), 1, "{o}");
    assert_eq!(kills[0]["process"]["comm"], "memhog", "{o}");
    assert_eq!(kills[0]["process"]["pid"].to_string(), pid, "{o}");
    assert_eq!(kills[0]["memory_limit"], "96Mi", "{o}");
}

/// `memory.oom.group` 1: the kernel kills every process of the cgroup, exec with CMD,
/// and `memory.events` counts a group kill. exec hands nothing over: on cgroup v2 with
/// the kubelet's default, the kill is the kubelet's `OOMKilled` of the whole container,
/// and only the kernel's log (not readable in a pod) names the process that set it off.
#[test]
fn a_group_oom_kill_on_cgroup_v2_takes_exec_with_it() {
    require!(machine());
    let out = run_oom(1);
    let pid = head(&out, "hog");
    assert_eq!(head(&out, "exec"), "137", "{out}");
    let events = part(&out, "events");
    assert!(events.contains("oom_group_kill 1\n"), "{out}");
    // The kernel names the process that set the kill off, then kills the group.
    let kernel: Vec<&str> = part(&out, "kernel").lines().collect();
    assert_eq!(
        kernel[..2],
        [
            format!("Memory cgroup out of memory: Killed process {pid} (memhog)").as_str(),
            "Tasks in /trainlet-oom-1 are going to be killed due to memory.oom.group set"
        ],
        "{out}"
    );
    assert!(kernel.iter().any(|l| l.ends_with(" (trainlet)")), "{out}");
    let o: Value = serde_json::from_str(part(&out, "observed").trim()).unwrap();
    assert!(o.get("kills").is_none(), "{o}");
}
