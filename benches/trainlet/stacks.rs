//! Scenario 12: where CMD is stuck. `trainlet exec --report` runs a CMD of
//! [`PROCESSES`] Python processes (a parent and its children, as torchrun's agent and
//! its workers), each blocked [`DEPTH`] frames deep, with `RANK` in its environment
//! (the parent's the pod's, as a launcher's). A person's `trainlet stacks` asks exec
//! for the dump [`ROUNDS`] times, a second and more apart (exec answers once a second
//! at most): the time from asking to the whole dump printed, against what an engineer
//! runs today, `py-spy dump --pid` of each of the processes one after the other
//! (py-spy's CLI from PyPI, the same version as the library trainlet links: the same
//! reader), by default (each process paused while it is read) and with
//! `--nonblocking` (as exec reads). Memory: exec's peak RSS (`VmHWM`) before the first
//! capture and after the last, the growth against the goal of a few MiB. Writes
//! target/bench/results-stacks.json.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::{Value, json};

use crate::report::{self, median};
use crate::support::{self, Kubelet, pod};

/// Python processes under exec.
pub const PROCESSES: usize = 16;
/// Frames of each process's main thread.
pub const DEPTH: usize = 20;
/// Captures each way.
pub const ROUNDS: usize = 7;
/// The goal: 16 processes read within a second.
pub const TIME_TARGET_S: f64 = 1.0;
/// The goal: exec's peak RSS grows by a few MiB at most.
pub const RSS_TARGET_MIB: f64 = 5.0;
/// py-spy's CLI, the version of the `py-spy` crate in Cargo.lock.
const PY_SPY: &str = "py-spy==0.4.3";

/// CMD: the parent starts the children (`child` as the first argument), each process
/// holds DEPTH frames and says it is ready with a file in $READY named by its pid.
const SCRIPT: &str = r#"import os, subprocess, sys, time

def hold(depth):
    if depth:
        return hold(depth - 1)
    open(os.path.join(os.environ["READY"], str(os.getpid())), "w").close()
    time.sleep(3600)

if len(sys.argv) == 1:
    kids = [subprocess.Popen([sys.executable, __file__, "child"], env=dict(os.environ, RANK=str(r)))
            for r in range(1, int(os.environ["PROCESSES"]))]
hold(int(os.environ["DEPTH"]))
"#;

pub async fn run(client: &Client, kc: &Path, bin: &Path) -> Value {
    let py_spy = install_py_spy();
    let ns = support::namespace(client, "stacks").await;
    pod("st-0").create(client, &ns).await;
    Kubelet::new(client, &ns).run("st-0", "10.1.3.5").await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    std::fs::create_dir(&ready).unwrap();
    let script = dir.path().join("hold.py");
    std::fs::write(&script, SCRIPT).unwrap();
    support::write_tf_config(dir.path(), support::free_port());
    let mut exec = Command::new(bin)
        .args(["exec", "--report", "--kubeconfig"])
        .arg(kc)
        .args(["--pod-name", "st-0", "--pod-namespace", &ns])
        .arg("--output-dir")
        .arg(dir.path())
        .args(["--metrics-addr", "off", "--", "python3"])
        .arg(&script)
        .env("READY", &ready)
        .env("RANK", "0")
        .env("PROCESSES", PROCESSES.to_string())
        .env("DEPTH", DEPTH.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn exec");
    let pids = tokio::task::block_in_place(|| wait_ready(&ready));
    // exec listens once it reports; its first report is done within a second or two.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let hwm_before = vm_hwm(exec.id());
    let (mut asked, mut paused, mut nonblocking) = (Vec::new(), Vec::new(), Vec::new());
    let mut error = None;
    for round in 0..ROUNDS {
        let t = Instant::now();
        let out = Command::new(bin).arg("stacks").output().unwrap();
        asked.push(t.elapsed().as_secs_f64());
        let text = String::from_utf8_lossy(&out.stdout);
        // `process PID (COMMAND), rank N:` or `process PID (COMMAND):` (the parent,
        // which started the ranks); `…: not read: WHY` where it was not read.
        let read = text
            .lines()
            .filter(|l| l.starts_with("process ") && l.ends_with(':'))
            .count();
        if !out.status.success() || read != PROCESSES {
            error.get_or_insert(format!(
                "round {round}: trainlet stacks read {read} of {PROCESSES} processes: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        paused.push(py_spy_all(&py_spy, &pids, false));
        nonblocking.push(py_spy_all(&py_spy, &pids, true));
        // exec answers once a second at most.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let hwm_after = vm_hwm(exec.id());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(exec.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = exec.wait();
    let growth_mib = (hwm_after as f64 - hwm_before as f64) / 1024.0;
    let result = json!({
        "machine": report::machine(),
        "commit": report::commit(),
        "command": report::command(),
        "stacks_processes": PROCESSES,
        "depth": DEPTH,
        "rounds": ROUNDS,
        "trainlet_stacks_s": asked,
        "py_spy_paused_s": paused,
        "py_spy_nonblocking_s": nonblocking,
        "trainlet_median_s": median(&asked),
        "py_spy_paused_median_s": median(&paused),
        "py_spy_nonblocking_median_s": median(&nonblocking),
        "ratio_to_paused": median(&asked) / median(&paused),
        "ratio_to_nonblocking": median(&asked) / median(&nonblocking),
        "time_target_s": TIME_TARGET_S,
        "time_met": asked.iter().all(|t| *t <= TIME_TARGET_S),
        "exec_hwm_before_kib": hwm_before,
        "exec_hwm_after_kib": hwm_after,
        "exec_hwm_growth_mib": growth_mib,
        "rss_target_mib": RSS_TARGET_MIB,
        "rss_met": growth_mib <= RSS_TARGET_MIB,
        "py_spy": PY_SPY,
        "error": error,
    });
    crate::report::write_own("results-stacks.json", &result);
    result
}

/// Waits until every process of CMD said it is ready; their pids.
fn wait_ready(ready: &Path) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pids: Vec<u32> = std::fs::read_dir(ready)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        if pids.len() == PROCESSES {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "bench: {} of {PROCESSES} Python processes ready after 60 s",
            pids.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `py-spy dump --pid P` of every process, one after the other, as a person runs it:
/// the seconds it took.
fn py_spy_all(py_spy: &Path, pids: &[u32], nonblocking: bool) -> f64 {
    let t = Instant::now();
    for pid in pids {
        let mut c = Command::new(py_spy);
        c.args(["dump", "--pid", &pid.to_string()]);
        if nonblocking {
            c.arg("--nonblocking");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "py-spy dump --pid {pid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    t.elapsed().as_secs_f64()
}

/// A process's peak resident set, KiB (`VmHWM`).
fn vm_hwm(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// py-spy's CLI in a venv of its own under ~/.cache/trainlet (made once).
fn install_py_spy() -> PathBuf {
    let home = std::env::var("HOME").unwrap();
    let venv = PathBuf::from(home).join(".cache/trainlet/py-spy-venv");
    let bin = venv.join("bin/py-spy");
    let stamp = venv.join(".stamp");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(PY_SPY) && bin.exists() {
        return bin;
    }
    eprintln!("bench: installing {PY_SPY} into {}", venv.display());
    let _ = std::fs::remove_dir_all(&venv);
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .unwrap()
        .success()
        && Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--only-binary", ":all:", PY_SPY])
            .status()
            .unwrap()
            .success();
    assert!(ok, "bench: cannot install {PY_SPY}");
    std::fs::write(&stamp, PY_SPY).unwrap();
    bin
}
