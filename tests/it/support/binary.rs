//! The built `trainlet` binary as a subprocess: its command line, its output, and
//! agents started before their peers exist.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use kube::Client;

use super::pods::pod;

/// How the tests run trainlet instead of the binary cargo built for them: a command line,
/// split at whitespace, whose last word is the binary. `make test` sets it to run the
/// aarch64 portable binary under QEMU's user-mode emulation for a subset of the tests
/// (`qemu-aarch64 -L /usr/aarch64-linux-gnu target/aarch64-unknown-linux-gnu/release/trainlet`).
const TEST_BINARY_VAR: &str = "TRAINLET_TEST_BINARY";

/// The built trainlet binary (or the one `TRAINLET_TEST_BINARY` names), with a clean
/// environment: no TRAINLET_* or downward API variables leak in from the developer's
/// shell.
pub fn trainlet() -> Command {
    let mut cmd = match std::env::var(TEST_BINARY_VAR) {
        Ok(line) if !line.trim().is_empty() => {
            let mut words = line.split_whitespace();
            let mut cmd = Command::new(words.next().unwrap());
            cmd.args(words);
            cmd
        }
        _ => Command::new(env!("CARGO_BIN_EXE_trainlet")),
    };
    for (k, _) in std::env::vars() {
        if k.starts_with("TRAINLET_")
            || k.starts_with("POD_")
            || k == "KUBECONFIG"
            || k == "HOSTNAME"
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("TRAINLET_LOG_LEVEL", "info");
    cmd.stdin(Stdio::null());
    cmd
}

/// The result of a trainlet run, with convenient accessors.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from_output(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
    /// The one-line error trainlet printed last.
    pub fn error_line(&self) -> &str {
        self.stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("trainlet: error: "))
            .map(|l| &l["trainlet: error: ".len()..])
            .unwrap_or_else(|| panic!("no error line in stderr:\n{}", self.stderr))
    }
}

/// Runs `cmd` to completion with `input` on its stdin, stdout and stderr captured.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    // Written beside the reads: a child that answers as it reads (kubectl) would fill
    // its stdout pipe and stop reading while this still wrote.
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    // A child may rightly exit before reading its input (a usage error): the pipe is then
    // closed under the writer, and what the test judges is the exit code and output.
    match writer.join().unwrap() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("{cmd:?}: stdin: {e}"),
        _ => out,
    }
}

/// Runs a tool that must succeed (a missing one fails the test too); its stdout.
pub fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs trainlet to completion (blocking), returning code and output.
pub fn run(cmd: &mut Command) -> Run {
    Run::from_output(cmd.output().expect("spawn trainlet"))
}

/// Runs trainlet on a blocking thread, so an async test can play the kubelet meanwhile.
pub fn spawn(mut cmd: Command) -> tokio::task::JoinHandle<Run> {
    tokio::task::spawn_blocking(move || run(&mut cmd))
}

/// A trainlet run on a blocking thread, like [`spawn`], whose stderr goes to a file the
/// test reads while it runs: to wait for a sign that the run got somewhere (it watches,
/// it waits) instead of sleeping for as long as that usually takes.
pub struct Logged {
    pub run: tokio::task::JoinHandle<Run>,
    log: std::sync::Arc<tempfile::TempPath>,
}

pub fn spawn_logged(mut cmd: Command) -> Logged {
    let file = tempfile::NamedTempFile::new().unwrap();
    cmd.stderr(file.reopen().unwrap());
    // The file lives until both the run and the test are done with it.
    let log = std::sync::Arc::new(file.into_temp_path());
    let kept = log.clone();
    let run = tokio::task::spawn_blocking(move || {
        let mut run = Run::from_output(cmd.output().expect("spawn trainlet"));
        run.stderr = std::fs::read_to_string(&*kept).unwrap();
        run
    });
    Logged { run, log }
}

impl Logged {
    /// Waits until a line of stderr contains `sign`; fails if the run ends first, or
    /// after 60 s.
    pub async fn logged(&self, sign: &str) {
        super::eventually(
            &format!("trainlet to log {sign:?}"),
            std::time::Duration::from_secs(60),
            || async {
                let ended = self.run.is_finished();
                let text = std::fs::read_to_string(&*self.log).unwrap();
                if text.lines().any(|l| l.contains(sign)) {
                    return Some(());
                }
                assert!(!ended, "trainlet ended before it logged {sign:?}:\n{text}");
                None
            },
        )
        .await
    }
}

/// A free TCP port for servers a test starts, below the kernel's ephemeral range.
///
/// A port the kernel picked (`bind(…:0)`) is free only until the probe closes: the
/// kernel may hand it out again to any other `bind(…:0)` or outgoing connection on
/// this shared machine, and a test that watches its port for a minute then sees a
/// stranger on it. Ports below `net.ipv4.ip_local_port_range` are never handed out;
/// this process takes each at most once, from an offset of its pid.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let below: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    const FLOOR: u32 = 10000;
    assert!(
        below > FLOOR + 1000,
        "the ephemeral range starts at {below}"
    );
    let span = below - FLOOR;
    let offset = (u64::from(std::process::id()) * 7919 % u64::from(span)) as u32 + 1;
    let _ = NEXT.compare_exchange(0, offset, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..span {
        let port = (FLOOR + NEXT.fetch_add(1, Ordering::SeqCst) % span) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FLOOR}..{below}");
}

/// The files in a directory, sorted, for "nothing was written" checks.
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every file `trainlet init` writes for a job of one type, `worker`, in `list_dir`'s
/// order.
pub const WORKER_JOB_FILES: [&str; 8] = [
    "cluster.json",
    "hostfile",
    "jax.env",
    "mpi.env",
    "tf_config.json",
    "torch.env",
    "trainlet.env",
    "worker.host",
];

/// `trainlet init` against a namespace as pod `pod`, writing to `out`.
pub fn init_cmd(kubeconfig: &Path, ns: &str, pod: &str, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = trainlet();
    cmd.arg("init")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--pod-name", pod, "--pod-namespace", ns])
        .arg("--output-dir")
        .arg(out)
        .args(extra);
    cmd
}

/// `n` pods `w-0`… labelled `role=w`, and a `trainlet init` agent for each on
/// `kubeconfig` (`--job worker=role=w --expect worker=n`), returned once every agent
/// has listed the pods and logged what it waits for: the pod names, the agents' output
/// directories and their runs.
pub async fn waiting_agents(
    kubeconfig: &Path,
    client: &Client,
    ns: &str,
    n: usize,
    port: &str,
) -> (
    Vec<String>,
    Vec<tempfile::TempDir>,
    Vec<tokio::task::JoinHandle<Run>>,
) {
    let names: Vec<String> = (0..n).map(|i| format!("w-{i}")).collect();
    for name in &names {
        pod(name).labels("role=w").create(client, ns).await;
    }
    let dirs: Vec<tempfile::TempDir> = names.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let expect = format!("worker={n}");
    let agents: Vec<Logged> = names
        .iter()
        .zip(&dirs)
        .map(|(name, d)| {
            spawn_logged(init_cmd(
                kubeconfig,
                ns,
                name,
                d.path(),
                &[
                    "--job",
                    "worker=role=w",
                    "--expect",
                    &expect,
                    "--port",
                    port,
                    "--timeout",
                    "90s",
                ],
            ))
        })
        .collect();
    for a in &agents {
        a.logged("waiting for peers: ").await;
    }
    (names, dirs, agents.into_iter().map(|a| a.run).collect())
}

/// `trainlet sidecar` for a pod, with exactly the RBAC rights of manifests/rbac.yaml
/// (a token of the trainlet ServiceAccount), a short probe interval, and `extra`
/// flags.
pub fn sidecar_cmd(kubeconfig: &Path, ns: &str, pod: &str, extra: &[&str]) -> Command {
    let mut cmd = trainlet();
    cmd.arg("sidecar")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--pod-name", pod, "--pod-namespace", ns])
        .args(defaults(extra))
        .args(extra);
    cmd
}

/// A short probe interval and a 1 s patch interval, unless `extra` sets them.
fn defaults(extra: &[&str]) -> Vec<&'static str> {
    let mut v = Vec::new();
    if !extra.contains(&"--interval") {
        v.extend(["--interval", "200ms"]);
    }
    if !extra.contains(&"--min-patch-interval") {
        v.extend(["--min-patch-interval", "1s"]);
    }
    v
}

/// Writes `tf_config.json` for a one-worker cluster at 127.0.0.1:`port` into `dir`,
/// as `trainlet init` would, so `exec` skips init.
pub fn write_tf_config(dir: &Path, port: u16) {
    std::fs::write(
        dir.join("tf_config.json"),
        format!(
            "{{\"cluster\":{{\"worker\":[\"127.0.0.1:{port}\"]}},\"task\":{{\"type\":\"worker\",\"index\":0}}}}\n"
        ),
    )
    .unwrap();
}

/// `trainlet exec --report` for a pod, with `dir` holding tf_config.json.
pub fn exec_cmd(kubeconfig: &Path, ns: &str, pod: &str, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = trainlet();
    cmd.args(["exec", "--report"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--pod-name", pod, "--pod-namespace", ns])
        .arg("--output-dir")
        .arg(dir)
        .args(defaults(extra))
        .args(extra);
    cmd
}
