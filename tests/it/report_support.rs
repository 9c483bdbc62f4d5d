//! Helpers for the reporter tests (`tests/it/report_*.rs`), on top of
//! `tests/it/support`: the fake NVML and a memory hog built from C with the system
//! compiler, a running reporter with its admin endpoint, annotations and Warning Events
//! of a pod, and a memory cgroup of the test's own.
//!
//! Declared next to `support` at the crate root, in tests/it/main.rs and (through
//! `#[path]`) in benches/trainlet/main.rs, so `crate::support` resolves in both; each
//! reporter test module says `use crate::support::*; use crate::report_support::*;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use crate::support::{self, repo};

/// Compiles a C file from tests/fixtures into target/test-fixtures once per test
/// binary; concurrent test binaries each build to a temporary name and rename, so a
/// reader never sees a half-written file.
fn build_c(source: &str, output: &str, shared: bool) -> PathBuf {
    let dir = repo().join("target/test-fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(output);
    let tmp = dir.join(format!("{output}.{}.tmp", std::process::id()));
    let mut cc = Command::new("cc");
    if shared {
        cc.args(["-shared", "-fPIC"]);
    }
    let status = cc
        .args(["-O1", "-Wall", "-o"])
        .arg(&tmp)
        .arg(repo().join("tests/fixtures").join(source))
        .status()
        .unwrap_or_else(|e| panic!("cannot run cc to build {source}: {e} (install gcc)"));
    assert!(status.success(), "cc failed to build {source}");
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// The fake NVML library, `libnvidia-ml.so.1`.
pub fn fake_nvml() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| build_c("fake_nvml.c", "libnvidia-ml.so.1", true))
}

/// A program that allocates and touches memory until it is killed: comm `memhog`.
pub fn memhog() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_c("memhog.c", "memhog", false))
}

/// The annotations of a pod.
pub async fn annotations(client: &Client, ns: &str, pod: &str) -> BTreeMap<String, String> {
    let p: Pod = Api::namespaced(client.clone(), ns).get(pod).await.unwrap();
    p.metadata.annotations.unwrap_or_default()
}

/// Waits until a pod carries an annotation with this value; on a timeout the panic
/// shows the annotations it had.
pub async fn wait_annotation(client: &Client, ns: &str, pod: &str, key: &str, want: &str) {
    let start = Instant::now();
    loop {
        let a = annotations(client, ns, pod).await;
        if a.get(key).map(String::as_str) == Some(want) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for annotation {key}={want:?} on {ns}/{pod}; it has {a:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Warning Events of a namespace as (reason, note), oldest first.
pub async fn warnings(client: &Client, ns: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = support::events(client, ns)
        .await
        .into_iter()
        .filter(|(t, ..)| t == "Warning")
        .map(|(_, r, n, _)| (r, n))
        .collect();
    v.sort();
    v
}

/// How many Warning Events of this reason the namespace has.
pub async fn count_warnings(client: &Client, ns: &str, reason: &str) -> usize {
    warnings(client, ns)
        .await
        .iter()
        .filter(|(r, _)| r == reason)
        .count()
}

/// Appends one `index xid` line to the fake NVML's event file (FAKE_NVML_EVENTS):
/// an XID error on that GPU, as NVML's event API reports it.
pub fn inject_xid(events: &Path, line: &str) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(events)
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
}

/// Waits for a Warning Event with this reason and returns its note.
pub async fn wait_warning(client: &Client, ns: &str, reason: &str) -> String {
    support::eventually(
        &format!("a Warning Event {reason} in {ns}"),
        Duration::from_secs(20),
        || async {
            warnings(client, ns)
                .await
                .into_iter()
                .find(|(r, _)| r == reason)
                .map(|(_, n)| n)
        },
    )
    .await
}

/// A plain HTTP/1.0 GET on loopback (1.0: no chunked answers to decode):
/// (status, content-type, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String, String)> {
    http_get_accept(addr, path, "*/*")
}

pub fn http_get_accept(
    addr: &str,
    path: &str,
    accept: &str,
) -> std::io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(String::from)
        })
        .unwrap_or_default();
    Ok((status, ctype, body.to_string()))
}

/// The value of one sample line of an OpenMetrics text, e.g.
/// `metric(text, "trainlet_oom_kills_total{container=\"trainer\"}")`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A running reporter (`trainlet sidecar` or `trainlet exec --report`), its stderr
/// in a file, and its admin endpoint on a free loopback port.
pub struct Reporter {
    pub child: Child,
    pub metrics_addr: String,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Reporter {
    /// Starts `cmd` (a `support::trainlet()` command with its subcommand and flags)
    /// with `--metrics-addr` on a free port.
    pub fn start(mut cmd: Command) -> Reporter {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr.log");
        let port = support::free_port();
        let metrics_addr = format!("127.0.0.1:{port}");
        cmd.env("TRAINLET_METRICS_ADDR", &metrics_addr)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawn trainlet");
        Reporter {
            child,
            metrics_addr,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until a line of stderr contains `sign`, at most 60 s.
    pub async fn logged(&self, sign: &str) {
        support::eventually(
            &format!("trainlet to log {sign:?}"),
            Duration::from_secs(60),
            || async {
                self.stderr()
                    .lines()
                    .any(|l| l.contains(sign))
                    .then_some(())
            },
        )
        .await
    }

    /// Waits until the reporter has probed `n` more times than it had when called
    /// (`trainlet_probes_total`): the sign that it moved on, for checks that nothing
    /// more happened meanwhile.
    pub async fn probed(&self, n: f64) {
        let probes = |text: &str| metric(text, "trainlet_probes_total").unwrap_or(0.0);
        let from = probes(&self.metrics().await);
        support::eventually(
            &format!("{n} more probes than {from}"),
            Duration::from_secs(120),
            || async { (probes(&self.metrics().await) >= from + n).then_some(()) },
        )
        .await
    }

    /// `/metrics`, waiting for the server to come up.
    pub async fn metrics(&self) -> String {
        support::eventually("the metrics endpoint", Duration::from_secs(20), || async {
            match http_get(&self.metrics_addr, "/metrics") {
                Ok((200, _, body)) => Some(body),
                _ => None,
            }
        })
        .await
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        support::eventually("/readyz 200", Duration::from_secs(20), || async {
            matches!(http_get(&self.metrics_addr, "/readyz"), Ok((200, ..))).then_some(())
        })
        .await
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn signal(&self, sig: i32) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::try_from(sig).unwrap(),
        )
        .unwrap();
    }

    /// Waits for the exit: (exit code, time it took).
    pub fn wait(&mut self, timeout: Duration) -> (i32, Duration) {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let code = st.code().unwrap_or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    128 + st.signal().unwrap_or(0)
                });
                return (code, start.elapsed());
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                panic!(
                    "trainlet did not exit within {timeout:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit code and how long the exit took.
    pub fn terminate(&mut self) -> (i32, Duration) {
        self.signal(libc::SIGTERM);
        self.wait(Duration::from_secs(10))
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A cgroup v1 memory cgroup with a limit, made under the test process's own memory
/// cgroup, removed on drop; or what is missing to make one (group `cgroup`).
pub struct MemCgroup {
    pub path: PathBuf,
}

impl MemCgroup {
    pub fn new(limit_bytes: u64) -> Result<MemCgroup, support::Missing> {
        let missing = |why: String| support::Missing::new(support::Group::Cgroup, why);
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let rel = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
            .ok_or_else(|| missing("no cgroup v1 memory controller in /proc/self/cgroup".into()))?;
        let parent = Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'));
        let path = parent.join(format!("trainlet-test-{}", support::unique()));
        std::fs::create_dir(&path).map_err(|e| {
            missing(format!(
                "cannot create memory cgroup {}: {e}",
                path.display()
            ))
        })?;
        let cg = MemCgroup { path };
        // No swap for the hog to escape into; the kernel may lack memsw.
        let _ = std::fs::write(cg.path.join("memory.swappiness"), "0");
        std::fs::write(
            cg.path.join("memory.limit_in_bytes"),
            limit_bytes.to_string(),
        )
        .map_err(|e| missing(format!("cannot set a memory limit: {e}")))?;
        Ok(cg)
    }

    /// Wraps a command so that it runs inside this cgroup (it joins, then execs).
    pub fn wrap(&self, cmd: &Command) -> Command {
        let mut w = Command::new("/bin/sh");
        w.arg("-c")
            .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
            .arg(&self.path)
            .arg(cmd.get_program())
            .args(cmd.get_args());
        w.env_clear();
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                w.env(k, v);
            }
        }
        for k in ["PATH", "HOME"] {
            if let Ok(v) = std::env::var(k) {
                w.env(k, v);
            }
        }
        w.stdin(Stdio::null());
        w
    }

    /// A child cgroup at `rel` (e.g. `kubepods/pod<uid>/<id>`), with a limit: the
    /// layout a node's cgroupfs driver makes for a container.
    pub fn child(&self, rel: &str, limit_bytes: u64) -> PathBuf {
        let mut p = self.path.clone();
        for part in rel.split('/') {
            p = p.join(part);
            if !p.exists() {
                std::fs::create_dir(&p).unwrap();
            }
        }
        std::fs::write(p.join("memory.limit_in_bytes"), limit_bytes.to_string()).unwrap();
        p
    }

    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.path.join("memory.oom_control"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Children first, deepest first.
        let mut dirs = Vec::new();
        let mut stack = vec![self.path.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(e.path());
                    stack.push(e.path());
                }
            }
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            kill_all(&d);
            let _ = std::fs::remove_dir(&d);
        }
        kill_all(&self.path);
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Kills every process of a cgroup and waits until it is empty.
fn kill_all(cg: &Path) {
    for _ in 0..50 {
        let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
        if procs.trim().is_empty() {
            break;
        }
        for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pod status of a running container with a container ID, as the kubelet writes it.
pub fn running_with_id(container: &str, id: &str) -> serde_json::Value {
    serde_json::json!({"containerStatuses": [{
        "name": container, "image": "registry.example/train:1", "imageID": "",
        "containerID": id, "ready": true, "restartCount": 0, "started": true,
        "state": {"running": {"startedAt": support::now()}}
    }]})
}

/// Waits until the server closes a connection (end of file or a reset, after any
/// answer such as a 431 or 408), for at most `deadline`; false if it is still open.
pub fn closed_by_server(s: &mut TcpStream, deadline: std::time::Instant) -> bool {
    s.set_nonblocking(false).unwrap();
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Opens 500 connections that each send the start of a request and then a 380 KiB
/// header, 4 KiB at a time, never finishing it (95 rounds, 20 ms apart; `rounds`
/// counts those done). Returns them when all is sent.
pub fn slow_burst(
    addr: String,
    rounds: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<Vec<TcpStream>> {
    std::thread::spawn(move || {
        let mut conns: Vec<TcpStream> = Vec::new();
        for _ in 0..500 {
            if let Ok(mut s) = TcpStream::connect(&addr) {
                s.set_nonblocking(true).unwrap();
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ");
                conns.push(s);
            }
        }
        let chunk = [b'a'; 4096];
        for _ in 0..95 {
            for s in &mut conns {
                let _ = s.write(&chunk);
            }
            rounds.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
        }
        conns
    })
}
