//! Scenario 6: the stall watch (`trainlet exec --stall-after`).
//!
//! - **Pass-through.** CMD writes 1 GiB to stdout (`dd if=/dev/zero bs=1M`); the
//!   harness reads it from a pipe in 1 MiB reads and throws it away. Directly, and
//!   through `trainlet exec --report --stall-after 10m` with `--progress-pattern` (every
//!   byte passes through exec and its lines are scanned), [`ROUNDS`] rounds of one run
//!   each, the side that runs first alternating round by round. Throughput is from
//!   the first byte to the end of the stream, so exec's start (the API server, the
//!   first report) is not counted; the ratio is exec's median over the direct median
//!   (target ≥ 0.9). Every run is under
//!   `/usr/bin/time`: exec's added CPU per GiB is the CPU of a run through exec, less
//!   dd's alone and less exec's with a CMD that writes nothing; the peak RSS of the
//!   two shows that the stream does not grow exec's memory.
//! - **Lines.** What trainers print: lines of 64 and of 200 bytes (`step N loss …`),
//!   256 MiB of each from a file (`cat`), directly and through exec with and without
//!   `--progress-pattern 'step (\d+)'` (which every line matches), [`LINE_ROUNDS`] rounds
//!   in which the four kinds take turns (the side that runs first alternating); the
//!   target is the same ratio. exec looks at a chunk's lines from its end
//!   and stops at the last that is progress.
//! - **Hang to group restart.** Three pods, each `trainlet exec --stall-after 5s
//!   --stall-scope pod --on-stall restart --interval 1s --restart-backoff 1s` with
//!   credentials, CMD printing a line every 200 ms. Pod 2's CMD goes silent. From its last line to each
//!   pod's CMD starting again, less the backoff, against `--stall-after`: the target
//!   is within one `--interval` after it and the second each pod waits for the others
//!   to read their stacks (the stall is seen at the first check past
//!   `--stall-after`, and the peers learn of it from the pod's annotation within a
//!   watch event).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use serde::Serialize;

use crate::report::median;
use crate::support::{self, Kubelet, pod};

/// Runs of each way, alternating.
pub const ROUNDS: usize = 7;
/// Rounds of the line streams: a run of 256 MiB takes a fifth of a second, where one
/// busy moment of this shared machine moves it by a tenth; the median of 21 holds
/// still where that of 7 moved a row across the target from one run to the next.
pub const LINE_ROUNDS: usize = 21;
const GIB: u64 = 1 << 30;
pub const TARGET_RATIO: f64 = 0.9;
const STALL_AFTER_S: f64 = 5.0;
const INTERVAL_S: f64 = 1.0;
const BACKOFF_S: f64 = 1.0;
/// exec's wait for the other pods to read their stacks (docs/stall-watch.md, "Where
/// it hangs").
const LOOK_S: f64 = 1.0;

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub bytes: u64,
    /// GiB/s of each run, first byte to end of stream.
    pub direct_gib_s: Vec<f64>,
    pub exec_gib_s: Vec<f64>,
    pub ratio: f64,
    pub target_ratio: f64,
    /// CPU time (user + system, `/usr/bin/time`, medians): dd writing 1 GiB directly;
    /// exec and dd for 1 GiB through exec; exec for a CMD that writes nothing (its
    /// start, the first report, the end). exec's added CPU per GiB is the second less
    /// the other two.
    pub dd_cpu_ms_1gib: f64,
    pub exec_cpu_ms_1gib: f64,
    pub exec_cpu_ms_empty: f64,
    pub exec_added_cpu_ms_per_gib: f64,
    pub exec_peak_rss_kib_1gib: u64,
    pub exec_peak_rss_kib_empty: u64,
    /// Line-structured output, by line length and with or without the pattern.
    pub lines: Vec<Lines>,
    /// Hang to group restart.
    pub stall_after_s: f64,
    pub interval_s: f64,
    pub backoff_s: f64,
    /// By pod: from the silent pod's last line to its CMD's next start, in seconds.
    pub restart_after_hang_s: Vec<f64>,
    /// The slowest of them, less the backoff and `--stall-after`: the target is ≤ one
    /// `--interval`.
    pub beyond_stall_after_s: f64,
    /// How long each pod leaves its ranks where the hang left them after reading its
    /// stacks, before it stops them: the target is one `--interval` beyond it.
    pub look_s: f64,
    pub error: Option<String>,
}

/// Line-structured output through exec against directly.
#[derive(Debug, Clone, Serialize)]
pub struct Lines {
    pub line_bytes: usize,
    pub pattern: bool,
    pub bytes: u64,
    pub direct_gib_s: Vec<f64>,
    pub exec_gib_s: Vec<f64>,
    pub ratio: f64,
}

/// The size of each line-structured stream.
const LINES_BYTES: u64 = 256 << 20;

/// A file of lines `line_bytes` long, newline included, each a step: as many as fit
/// in `bytes` (so its size is a multiple of `line_bytes`).
fn line_file(line_bytes: usize, bytes: u64) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let mut w = std::io::BufWriter::new(f.as_file_mut());
    let mut written = 0u64;
    let mut step = 0u64;
    while written + line_bytes as u64 <= bytes {
        let mut line = format!("step {step} loss 0.4213 lr 0.0003 ");
        line.truncate(line_bytes - 1);
        while line.len() < line_bytes - 1 {
            line.push('.');
        }
        line.push('\n');
        w.write_all(line.as_bytes()).unwrap();
        written += line_bytes as u64;
        step += 1;
    }
    w.flush().unwrap();
    drop(w);
    f
}

/// `dd` writing `bytes` of zeros in 1 MiB blocks.
fn dd(bytes: u64) -> Vec<String> {
    [
        "dd".to_string(),
        "if=/dev/zero".into(),
        "bs=1M".into(),
        format!("count={}", bytes / (1 << 20)),
        "status=none".into(),
    ]
    .to_vec()
}

/// One run under `/usr/bin/time`: GiB/s from the first byte to the end, the CPU time
/// of everything it ran (user + system, ms) and the largest peak RSS among its
/// processes (KiB): exec's, where it runs (dd's is a few hundred KiB).
fn pass_through(exec: Option<&[String]>, writer: &[String], bytes: u64) -> (f64, f64, u64) {
    let times = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%U %S %M", "-o"]).arg(times.path());
    if let Some(prefix) = exec {
        cmd.arg(env!("CARGO_BIN_EXE_trainlet"))
            .args(prefix)
            .arg("--");
    }
    cmd.args(writer);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn /usr/bin/time");
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    let mut first = None;
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        first.get_or_insert_with(Instant::now);
        got += n as u64;
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let st = child.wait().unwrap();
    assert!(st.success(), "{cmd:?}: {st}");
    assert_eq!(got, bytes, "{cmd:?}");
    let text = std::fs::read_to_string(times.path()).unwrap();
    let v: Vec<f64> = text
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    assert_eq!(v.len(), 3, "/usr/bin/time wrote {text:?}");
    let rate = if secs > 0.0 {
        got as f64 / GIB as f64 / secs
    } else {
        0.0
    };
    (rate, (v[0] + v[1]) * 1000.0, v[2] as u64)
}

/// Whether exec's side runs first or second in a round: second in even rounds, first
/// in odd ones.
fn first_then_second(round: usize) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

/// CMD of the hang scenario: a line every 200 ms; `$STARTS` gets each start's time;
/// once `$HANG` exists (first start only), it writes the time of its last line to
/// `$HANGED` and goes silent.
const TICKING: &str = r#"date +%s.%N >> "$STARTS"
n=$(wc -l < "$STARTS")
while :; do
  if [ "$n" = 1 ] && [ -e "$HANG" ]; then echo "$t" > "$HANGED"; exec sleep 600; fi
  echo tick; t=$(date +%s.%N); sleep 0.2
done"#;

pub async fn run(client: &Client, kubeconfig: &Path) -> Outcome {
    let ns = support::namespace(client, "stall").await;
    let kubelet = Kubelet::new(client, &ns);

    // Pass-through.
    pod("pt-0").create(client, &ns).await;
    kubelet.run("pt-0", "10.1.2.5").await;
    let dir = tempfile::tempdir().unwrap();
    support::write_tf_config(dir.path(), support::free_port());
    let prefix: Vec<String> = [
        "exec",
        "--report",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--pod-name",
        "pt-0",
        "--pod-namespace",
        &ns,
        "--output-dir",
        dir.path().to_str().unwrap(),
        "--metrics-addr",
        "off",
        "--stall-after",
        "10m",
        "--progress-pattern",
        r"step (\d+)",
    ]
    .map(String::from)
    .to_vec();
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    let (mut dd_cpu, mut exec_cpu, mut hwm) = (Vec::new(), Vec::new(), 0);
    for round in 0..ROUNDS {
        // Which side runs first alternates: neither gets the warmer caches every time.
        for exec_side in first_then_second(round) {
            if exec_side {
                let (r, c, h) =
                    tokio::task::block_in_place(|| pass_through(Some(&prefix), &dd(GIB), GIB));
                through.push(r);
                exec_cpu.push(c);
                hwm = hwm.max(h);
            } else {
                let (r, c, _) = tokio::task::block_in_place(|| pass_through(None, &dd(GIB), GIB));
                direct.push(r);
                dd_cpu.push(c);
            }
        }
    }
    let mut empty_cpu = Vec::new();
    let mut empty_hwm = 0;
    for _ in 0..ROUNDS {
        let (_, c, h) = tokio::task::block_in_place(|| pass_through(Some(&prefix), &dd(0), 0));
        empty_cpu.push(c);
        empty_hwm = empty_hwm.max(h);
    }
    let ratio = median(&through) / median(&direct);

    // Lines, with and without the pattern: every round runs the four kinds in turn,
    // so a burst of load elsewhere on the machine falls on all of them alike, not on
    // the seven rounds of one kind.
    let without: Vec<String> = prefix[..prefix.len() - 2].to_vec();
    let kinds: Vec<(usize, bool)> = [64, 200]
        .into_iter()
        .flat_map(|b| [(b, true), (b, false)])
        .collect();
    let files: Vec<tempfile::NamedTempFile> = [64, 200]
        .into_iter()
        .map(|b| line_file(b, LINES_BYTES))
        .collect();
    let mut runs = vec![(Vec::new(), Vec::new()); kinds.len()];
    for round in 0..LINE_ROUNDS {
        for (k, &(line_bytes, pattern)) in kinds.iter().enumerate() {
            let file = &files[usize::from(line_bytes == 200)];
            let size = file.as_file().metadata().unwrap().len();
            let cat = ["cat".to_string(), file.path().display().to_string()];
            let exec = if pattern { &prefix } else { &without };
            for exec_side in first_then_second(round + k) {
                let (d, e) = &mut runs[k];
                if exec_side {
                    e.push(tokio::task::block_in_place(|| pass_through(Some(exec), &cat, size)).0);
                } else {
                    d.push(tokio::task::block_in_place(|| pass_through(None, &cat, size)).0);
                }
            }
        }
    }
    let lines: Vec<Lines> = kinds
        .iter()
        .zip(runs)
        .map(|(&(line_bytes, pattern), (d, e))| Lines {
            line_bytes,
            pattern,
            bytes: files[usize::from(line_bytes == 200)]
                .as_file()
                .metadata()
                .unwrap()
                .len(),
            ratio: median(&e) / median(&d),
            direct_gib_s: d,
            exec_gib_s: e,
        })
        .collect();

    // Hang to group restart.
    let (restart_after_hang_s, error) = group_restart(client, kubeconfig, &ns, &kubelet).await;
    let slowest = restart_after_hang_s.iter().copied().fold(0.0, f64::max);
    Outcome {
        bytes: GIB,
        direct_gib_s: direct,
        exec_gib_s: through,
        ratio,
        target_ratio: TARGET_RATIO,
        dd_cpu_ms_1gib: median(&dd_cpu),
        exec_cpu_ms_1gib: median(&exec_cpu),
        exec_cpu_ms_empty: median(&empty_cpu),
        exec_added_cpu_ms_per_gib: median(&exec_cpu) - median(&dd_cpu) - median(&empty_cpu),
        exec_peak_rss_kib_1gib: hwm,
        exec_peak_rss_kib_empty: empty_hwm,
        lines,
        stall_after_s: STALL_AFTER_S,
        interval_s: INTERVAL_S,
        backoff_s: BACKOFF_S,
        beyond_stall_after_s: slowest - BACKOFF_S - STALL_AFTER_S,
        look_s: LOOK_S,
        restart_after_hang_s,
        error,
    }
}

async fn group_restart(
    client: &Client,
    kubeconfig: &Path,
    ns: &str,
    kubelet: &Kubelet,
) -> (Vec<f64>, Option<String>) {
    let marks = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..3).map(|i| format!("w-{i}")).collect();
    let port = support::free_port();
    for (i, name) in names.iter().enumerate() {
        pod(name)
            .labels(&format!(
                "role=w,batch.kubernetes.io/job-completion-index={i}"
            ))
            .port("fw", i32::from(port))
            .create(client, ns)
            .await;
    }
    let dirs: Vec<tempfile::TempDir> = names.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let mut children = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let mut cmd = support::trainlet();
        cmd.args(["exec", "--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--pod-name", name, "--pod-namespace", ns])
            .arg("--output-dir")
            .arg(dirs[k].path())
            .args(["--job", "w=role=w", "--expect", "w=3", "--port-name", "fw"])
            .args(["--timeout", "60s", "--metrics-addr", "off"])
            .args(["--interval", "1s", "--min-patch-interval", "1s"])
            // The other pods tick on: job-wide, that is progress of the job.
            .args(["--stall-after", "5s", "--stall-scope", "pod"])
            .args(["--on-stall", "restart"])
            .args(["--restart-backoff", "1s", "--restart-grace", "2s"])
            .args(["--", "sh", "-c", TICKING])
            .env("STARTS", marks.path().join(format!("starts-{k}")))
            .env("HANGED", marks.path().join("hanged"))
            .env(
                "HANG",
                if k == 2 {
                    marks.path().join("hang")
                } else {
                    marks.path().join("never")
                },
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        children.push(cmd.spawn().expect("spawn exec"));
    }
    for (k, name) in names.iter().enumerate() {
        kubelet.run(name, &format!("127.0.30.{}", k + 2)).await;
    }
    let starts = |k: usize| -> Vec<f64> {
        std::fs::read_to_string(marks.path().join(format!("starts-{k}")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let wait = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if (0..3).all(|k| starts(k).len() >= n) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut error = None;
    let mut out = Vec::new();
    if !tokio::task::block_in_place(|| wait(1)) {
        error = Some("not every CMD started within 60 s".to_string());
    } else {
        // Let the peer watches settle, then hang pod 2.
        tokio::time::sleep(Duration::from_secs(3)).await;
        std::fs::write(marks.path().join("hang"), "").unwrap();
        if !tokio::task::block_in_place(|| wait(2)) {
            error = Some("not every CMD restarted within 60 s of the hang".to_string());
        } else {
            let hanged: f64 = std::fs::read_to_string(marks.path().join("hanged"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            out = (0..3).map(|k| starts(k)[1] - hanged).collect();
        }
    }
    // SIGTERM: exec stops CMD's tree and exits.
    for mut c in children {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = c.wait();
    }
    (out, error)
}
