//! `trainlet exec --stall-after`: a silent hang is seen, published and restarted, with a
//! real PyTorch gloo job of three pods on loopback pod IPs against the real API
//! server; and the output that exec now passes through is exactly CMD's.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use crate::frameworks::fixture;
use crate::lifecycle::{
    HandoverPod, handover_dirs, handover_init, restarting, start_handover_with, warnings_of,
};
use crate::report_support::{annotations, http_get, metric};
use crate::support::jobs::{indexed_job, run_job_pods};
use crate::support::*;

/// Three pods, each `trainlet exec --report` with credentials, running
/// `torch_stall.py MARKS HANG` with `flags`; every exec serves its metrics on its own
/// port. Returns the namespace, the metrics addresses and the running execs.
struct Job {
    ns: String,
    metrics: Vec<String>,
    runs: Vec<(String, tokio::task::JoinHandle<Run>)>,
    marks: tempfile::TempDir,
    _dirs: Vec<tempfile::TempDir>,
    _reaper: Reaper,
}

/// On a failed assertion, kills every exec and rank of the job (their command lines
/// carry the marks directory): a rank that hangs forever would otherwise keep the
/// test's blocking threads, and the test binary, alive.
struct Reaper(String);

impl Drop for Reaper {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::process::Command::new("pkill")
                .args(["-KILL", "-f", &self.0])
                .status();
        }
    }
}

async fn start(net: u8, hang: &str, flags: &[&str]) -> Result<Job, Missing> {
    let py = framework_python()?;
    let client = admin().await;
    let ns = namespace(&client, "stall").await;
    let kubelet = Kubelet::new(&client, &ns);
    let marks = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..3).map(|i| format!("w-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        pod(name)
            .labels(&format!(
                "role=w,batch.kubernetes.io/job-completion-index={i}"
            ))
            .port("fw", i32::from(free_port()))
            .create(&client, &ns)
            .await;
    }
    let dirs: Vec<tempfile::TempDir> = names.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let mut metrics = Vec::new();
    let mut runs = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = trainlet();
        cmd.arg("exec")
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args(["--pod-name", name, "--pod-namespace", &ns])
            .arg("--output-dir")
            .arg(dirs[k].path())
            .args(["--job", "w=role=w", "--expect", "w=3", "--port-name", "fw"])
            .args(["--framework", "pytorch", "--timeout", "120s"])
            .args(["--interval", "1s", "--min-patch-interval", "1s"])
            .args(["--metrics-addr", &addr])
            .args(flags)
            .arg("--")
            .arg(py)
            .arg(fixture("torch_stall.py"))
            .arg(marks.path())
            .arg(hang)
            .env("GLOO_SOCKET_IFNAME", "lo");
        metrics.push(addr);
        runs.push((name.clone(), spawn(cmd)));
    }
    for (k, name) in names.iter().enumerate() {
        kubelet.run(name, &format!("127.0.{net}.{}", k + 2)).await;
    }
    Ok(Job {
        ns,
        metrics,
        runs,
        _reaper: Reaper(marks.path().display().to_string()),
        marks,
        _dirs: dirs,
    })
}

impl Job {
    /// Waits until every rank printed its result and waits for the release.
    async fn until_done(&self) {
        eventually("every rank's result", Duration::from_secs(180), || async {
            (0..3)
                .all(|r| self.marks.path().join(format!("done-{r}")).exists())
                .then_some(())
        })
        .await;
    }

    fn metric(&self, k: usize, series: &str) -> f64 {
        let (_, _, body) = http_get(&self.metrics[k], "/metrics").unwrap();
        metric(&body, series).unwrap_or_else(|| panic!("no {series} in\n{body}"))
    }

    /// `trainlet status -o json` of the job's pods.
    fn status(&self) -> serde_json::Value {
        let r = run(trainlet()
            .args([
                "status",
                "--selector",
                "role=w",
                "-o",
                "json",
                "-n",
                &self.ns,
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig()));
        assert_eq!(r.code, 0, "{}", r.stderr);
        serde_json::from_str(&r.stdout).unwrap()
    }

    /// Waits until `trainlet status` says where the pods are, in words that start
    /// with `prefix`, and returns them.
    async fn status_where(&self, prefix: &str, within: Duration) -> String {
        eventually(&format!("status: where: {prefix}…"), within, || async {
            self.status()["where"]
                .as_str()
                .filter(|w| w.starts_with(prefix))
                .map(String::from)
        })
        .await
    }

    /// Releases the ranks and returns how each exec ended.
    async fn finish(self) -> Vec<(String, Run)> {
        std::fs::write(self.marks.path().join("release"), "").unwrap();
        let mut out = Vec::new();
        for (name, r) in self.runs {
            let run = tokio::time::timeout(Duration::from_secs(120), r)
                .await
                .unwrap_or_else(|_| panic!("{name} did not end"))
                .unwrap();
            out.push((name, run));
        }
        out
    }
}

/// The reasons and notes of the Warning and Normal Events, by pod.
async fn events_by_pod(ns: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut by: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (_, reason, note, regarding) in events(&admin().await, ns).await {
        by.entry(regarding).or_default().push((reason, note));
    }
    by
}

/// The notes of the Events with `reason`, of `(reason, note)` pairs.
fn notes<'a>(
    events: impl IntoIterator<Item = &'a (String, String)>,
    reason: &str,
) -> Vec<&'a String> {
    events
        .into_iter()
        .filter(|(r, _)| r == reason)
        .map(|(_, n)| n)
        .collect()
}

fn progress(a: &BTreeMap<String, String>) -> serde_json::Value {
    serde_json::from_str(&a["trainlet.io/progress"]).unwrap()
}

/// Rank 2 hangs in its first run; the others wait for it in the all-reduce but look
/// alive (their heartbeat goes on, from a process apart from the training loop).
/// Job-wide that is progress of the job; per pod (`--stall-scope pod`) rank 2's exec
/// sees no progress for 5 s, publishes the stall and restarts its CMD; the others
/// learn of it from rank 2's `trainlet.io/progress` and restart theirs once, so the
/// three form the group again and the second run completes.
#[tokio::test]
async fn a_stalled_rank_restarts_every_pods_command_once() {
    let flags = [
        "--stall-after",
        "5s",
        "--stall-scope",
        "pod",
        "--on-stall",
        "restart",
        "--progress-pattern",
        r"step (\d+)",
        "--restart-backoff",
        "1s",
        "--restart-grace",
        "2s",
    ];
    let job = require!(start(21, "forever", &flags).await);
    job.until_done().await;
    let client = admin().await;
    let seen = events_by_pod(&job.ns).await;
    for (k, name) in ["w-0", "w-1", "w-2"].iter().enumerate() {
        assert_eq!(
            job.metric(k, "trainlet_restarts_total"),
            1.0,
            "{name}: {seen:?}"
        );
        let stalls = if *name == "w-2" { 1.0 } else { 0.0 };
        assert_eq!(job.metric(k, "trainlet_stalls_total"), stalls, "{name}");
        // The metric follows within an --interval of the line.
        eventually(
            &format!("{name} at step 5"),
            Duration::from_secs(10),
            || async {
                (job.metric(k, r#"trainlet_progress_step{container="trainer"}"#) == 5.0)
                    .then_some(())
            },
        )
        .await;
        // Not stalled again; the stall count stays with the pod that stalled.
        let want = serde_json::json!(if *name == "w-2" { 1 } else { 0 });
        eventually(
            &format!("{name} not stalled"),
            Duration::from_secs(30),
            || async {
                let p = progress(&annotations(&client, &job.ns, name).await);
                (p["stalled"] == false && p["stalls"] == want && p["step"] == 5.0).then_some(())
            },
        )
        .await;
    }
    let events = events_by_pod(&job.ns).await;
    let stalled: Vec<&(String, String)> = events
        .values()
        .flatten()
        .filter(|(r, _)| r == "Stalled")
        .collect();
    assert_eq!(stalled.len(), 1, "{events:?}");
    let w2 = &events["w-2"];
    let note = &w2.iter().find(|(r, _)| r == "Stalled").unwrap().1;
    assert!(
        note.starts_with("no progress for 5s; last step 2 in \"step 2\"; CMD used "),
        "{note}"
    );
    assert_eq!(
        w2.iter()
            .filter(|(r, _)| r == "Restarting")
            .map(|(_, n)| n.as_str())
            .collect::<Vec<_>>(),
        [format!(
            "restarting {} (1 of 3) in 1s: trainer made no progress for 5s",
            framework_python().expect("start found it").display()
        )]
    );
    for name in ["w-0", "w-1"] {
        let notes: Vec<&str> = events[name]
            .iter()
            .filter(|(r, _)| r == "Restarting")
            .map(|(_, n)| n.as_str())
            .collect();
        assert_eq!(notes.len(), 1, "{name}: {notes:?}");
        assert!(
            notes[0].starts_with(&format!(
                "restarting {} (1 of 3) in 1s: pod w-2 made no progress since ",
                framework_python().expect("start found it").display()
            )),
            "{name}: {}",
            notes[0]
        );
    }
    for (name, run) in job.finish().await {
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        let result = run
            .stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("rank="))
            .unwrap();
        assert!(result.ends_with("world=3 sum=3 runs=2"), "{name}: {result}");
    }
}

/// Where rank 2 of torch_stall.py hangs: its innermost frame, in the test's own code,
/// named relative to the rank's working directory (the repository's).
const HUNG: &str = "load_batch (tests/fixtures/frameworks/torch_stall.py:79)";

/// `--on-stall report`, per pod (the others' heartbeat goes on): rank 2 hangs for 20 s
/// once; its stall is published and cleared again when it goes on, and nothing
/// restarts. While it hangs, every pod's exec has read its ranks' Python stacks: the
/// `Stalled` Event and `trainlet.io/progress` say where rank 2 is, and `trainlet
/// status` names w-2 as the pod that is somewhere else than the two in the all-reduce.
#[tokio::test]
async fn with_report_a_stall_is_published_and_cleared_and_nothing_restarts() {
    let flags = [
        "--stall-after",
        "5s",
        "--stall-scope",
        "pod",
        "--progress-pattern",
        r"step (\d+)",
    ];
    let job = require!(start(22, "20", &flags).await);
    let client = admin().await;
    eventually("w-2 stalled", Duration::from_secs(120), || async {
        let a = annotations(&client, &job.ns, "w-2").await;
        a.get("trainlet.io/progress")
            .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
            .filter(|p| p["stalled"] == true)
            .map(|p| {
                assert_eq!(p["step"], 2.0);
                assert_eq!(p["stalls"], 1);
                assert_eq!(p["where"], serde_json::json!([HUNG]), "{p}");
            })
    })
    .await;
    // The two others wait in the all-reduce, as their own stacks say.
    let at = job
        .status_where("2 pods in ", Duration::from_secs(60))
        .await;
    let rest = at
        .strip_prefix("2 pods in all_reduce (torch/distributed/distributed_c10d.py:")
        .unwrap_or_else(|| panic!("{at}"));
    assert!(
        rest.ends_with(&format!(
            ") ← train_step (tests/fixtures/frameworks/torch_stall.py:87); w-2 in {HUNG}"
        )),
        "{at}"
    );
    job.until_done().await;
    eventually("w-2 not stalled", Duration::from_secs(30), || async {
        let p = progress(&annotations(&client, &job.ns, "w-2").await);
        (p["stalled"] == false && p["step"] == 5.0).then_some(())
    })
    .await;
    assert_eq!(job.metric(2, "trainlet_stalls_total"), 1.0);
    for k in 0..3 {
        assert_eq!(job.metric(k, "trainlet_restarts_total"), 0.0);
    }
    let events = events_by_pod(&job.ns).await;
    let stalled = notes(events.values().flatten(), "Stalled");
    assert_eq!(stalled.len(), 1, "{events:?}");
    assert!(
        stalled[0].ends_with(&format!("; where: rank 2: {HUNG}")),
        "{}",
        stalled[0]
    );
    // Its stall over, no pod says where it was stuck.
    eventually("status forgets where", Duration::from_secs(30), || async {
        job.status().get("where").is_none().then_some(())
    })
    .await;
    for (name, run) in job.finish().await {
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        assert!(
            run.stdout.contains("world=3 sum=3 runs=1"),
            "{name}: {}",
            run.stdout
        );
        // The whole dump in exec's log: every thread of the rank's process.
        assert!(
            run.stderr
                .contains("Python stacks of the processes of trainer, "),
            "{name}: {}",
            run.stderr
        );
        assert!(run.stderr.contains("\"MainThread\" (idle):\n"), "{name}");
    }
}

/// A hang in a collective (torch_stall.py `collective`: every rank all-reduces with a
/// group that waits for another, a cycle): each pod's exec sees its own stall
/// (`--stall-scope pod`, no heartbeat left) and reads its rank's stack, and `trainlet
/// status` says that every pod is in the same place. (`--on-stall report`: a rank
/// stopped by its exec would break the others' all-reduce, and they would no longer be
/// where the hang left them.)
#[tokio::test]
async fn a_hang_in_a_collective_has_every_pod_in_the_same_place() {
    let flags = [
        "--stall-after",
        "5s",
        "--stall-scope",
        "pod",
        "--progress-pattern",
        r"step (\d+)",
    ];
    let job = require!(start(23, "collective", &flags).await);
    let at = job
        .status_where("all 3 pods", Duration::from_secs(180))
        .await;
    let rest = at
        .strip_prefix(
            "all 3 pods in the same place: all_reduce (torch/distributed/distributed_c10d.py:",
        )
        .unwrap_or_else(|| panic!("{at}"));
    assert!(
        rest.ends_with(") ← train_step (tests/fixtures/frameworks/torch_stall.py:87)"),
        "{at}"
    );
    let events = events_by_pod(&job.ns).await;
    for (k, name) in ["w-0", "w-1", "w-2"].iter().enumerate() {
        let stalled = notes(&events[*name], "Stalled");
        assert_eq!(stalled.len(), 1, "{name}: {events:?}");
        assert!(
            stalled[0].contains(&format!("; where: rank {k}: all_reduce (")),
            "{name}: {}",
            stalled[0]
        );
    }
    // The hang is for ever: end the execs and their ranks (their command lines name
    // the marks directory).
    let _ = std::process::Command::new("pkill")
        .args(["-KILL", "-f", &job.marks.path().display().to_string()])
        .status();
    for (name, r) in job.runs {
        tokio::time::timeout(Duration::from_secs(60), r)
            .await
            .unwrap_or_else(|_| panic!("{name} did not end"))
            .unwrap();
    }
}

/// A CMD that computes without printing is stalled all the same: CPU use is reported,
/// never taken for progress, and the note says no Python process was there to read.
/// Its next line clears the stall.
#[tokio::test]
async fn a_busy_silent_command_is_stalled_and_its_cpu_use_is_reported() {
    let client = admin().await;
    let ns = namespace(&client, "busy").await;
    pod("b-0").labels("role=b").create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("b-0", "10.0.0.2").await;
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    let mut cmd = trainlet();
    cmd.arg("exec")
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["--pod-name", "b-0", "--pod-namespace", &ns])
        .arg("--output-dir")
        .arg(dir.path())
        .args([
            "--stall-after",
            "3s",
            "--interval",
            "1s",
            "--min-patch-interval",
            "1s",
        ])
        .args(["--metrics-addr", "off", "--"])
        .args([
            "sh",
            "-c",
            "echo start; timeout 7 sh -c 'while :; do :; done'; echo busy-done",
        ]);
    let r = run(&mut cmd);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "start\nbusy-done\n");
    let events = events_by_pod(&ns).await;
    let stalled = notes(&events["b-0"], "Stalled");
    assert_eq!(stalled.len(), 1, "{events:?}");
    let note = stalled[0];
    let cpu: f64 = note
        .strip_prefix("no progress for 3s; last output \"start\"; CMD used ")
        .and_then(|rest| rest.strip_suffix("% of a core over the window; where: no Python process"))
        .unwrap_or_else(|| panic!("{note}"))
        .parse()
        .unwrap();
    // Some CPU, however busy the machine: an idle CMD's is 0. (How much is
    // make bench's to measure.)
    assert!(cpu > 0.0, "a busy loop used {cpu}%: {note}");
    let p = progress(&annotations(&client, &ns, "b-0").await);
    assert_eq!(p["stalled"], false, "{p}");
    assert_eq!(p["stalls"], 1, "{p}");
}

/// exec passes CMD's output through unchanged: 256 MiB of random bytes identical (into
/// a file and into a pipe, the two ways exec copies), each
/// stream's order kept, a 10 MiB line without a newline in bounded memory, and
/// CMD's exit code and SIGTERM as without the watch.
#[test]
fn output_passes_through_unchanged_and_as_it_comes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let status = std::process::Command::new("head")
        .args(["-c", "268435456", "/dev/urandom"])
        .stdout(std::fs::File::create(&data).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let exec = |args: &[&str]| {
        let mut cmd = trainlet();
        cmd.args([
            "exec",
            "--stall-after",
            "1h",
            "--metrics-addr",
            "off",
            "--output-dir",
        ])
        .arg(tmp.path())
        .arg("--")
        .args(args);
        cmd
    };
    write_tf_config(tmp.path(), free_port());
    let out = tmp.path().join("out");
    let st = exec(&["cat", data.to_str().unwrap()])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(&data).unwrap(),
        "the 256 MiB came out changed (into a file: read and write)"
    );
    // Into a pipe, as a container's stdout is: tee(2).
    let mut child = exec(&["cat", data.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut piped = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut piped).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(
        piped == std::fs::read(&data).unwrap(),
        "the 256 MiB came out changed (into a pipe: tee)"
    );

    // Interleaved streams: each keeps its order.
    let r = run(&mut exec(&[
        "sh",
        "-c",
        "i=0; while [ $i -lt 2000 ]; do echo out $i; echo err $i >&2; i=$((i+1)); done",
    ]));
    assert_eq!(r.code, 0);
    let want = |s: &str| (0..2000).map(|i| format!("{s} {i}\n")).collect::<String>();
    assert_eq!(r.stdout, want("out"));
    let err: String = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("err "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(err, want("err"));

    // A 10 MiB line without a newline comes out whole, while CMD still runs: exec
    // passes it on as it comes and does not wait for the line to end. (What it costs
    // exec in memory is make bench's to measure.)
    let done = tmp.path().join("line-done");
    let script = format!(
        "head -c {} /dev/zero | tr '\\0' x; while [ ! -e {} ]; do sleep 0.05; done",
        10 << 20,
        done.display()
    );
    let mut child = exec(&["sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = vec![0u8; 10 << 20];
        let read = std::io::Read::read_exact(&mut stdout, &mut line);
        let _ = tx.send((read.map(|()| line), stdout));
    });
    let got = rx.recv_timeout(Duration::from_secs(60));
    let still_running = child.try_wait().unwrap().is_none();
    std::fs::write(&done, "").unwrap();
    let (line, _stdout) = got.expect("the 10 MiB line did not come out within 60 s while CMD ran");
    assert!(
        line.unwrap().iter().all(|&b| b == b'x'),
        "the line came out changed"
    );
    assert!(still_running, "CMD ended before its line came out");
    assert_eq!(child.wait().unwrap().code(), Some(0));

    // Exit codes and SIGTERM as without the watch.
    assert_eq!(run(&mut exec(&["sh", "-c", "exit 3"])).code, 3);
    let mut child = exec(&[
        "sh",
        "-c",
        "trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.1; done",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert_eq!(&first, b"ready\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "got TERM\n");
    assert_eq!(child.wait().unwrap().code(), Some(42));
}

/// `trainlet exec` alone (no API server, no peers) with the stall watch: `flags`, then
/// CMD.
fn exec_alone(dir: &std::path::Path, flags: &[&str], cmd: &[&str]) -> std::process::Command {
    write_tf_config(dir, free_port());
    let mut exec = trainlet();
    exec.args(["exec", "--metrics-addr", "off", "--interval", "200ms"])
        .arg("--output-dir")
        .arg(dir)
        .args(flags)
        .arg("--")
        .args(cmd)
        .env_remove("PYTHONUNBUFFERED");
    exec
}

/// A Python trainer whose stdout is a pipe buffers what it prints: exec sets
/// PYTHONUNBUFFERED, so a line a second is progress under `--stall-after 3s` (without
/// it, the first line came after the stall and exec exited 8), and what CMD printed
/// before exec stops it is in the output.
#[test]
fn a_python_trainer_writing_to_a_pipe_is_unbuffered_and_nothing_it_printed_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let flags = ["--stall-after", "3s", "--on-stall", "exit"];
    let r = run(&mut exec_alone(
        tmp.path(),
        &flags,
        &[
            "python3",
            "-c",
            "import time\nfor i in range(8):\n    print(i)\n    time.sleep(1)",
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "0\n1\n2\n3\n4\n5\n6\n7\n");
    // Stopped for a stall: the line it printed before is there.
    let r = run(&mut exec_alone(
        tmp.path(),
        // Long enough for Python to start on a loaded machine: a CMD silent since its
        // start is the job's stall, and this one is to stall after its line.
        &["--stall-after", "5s", "--on-stall", "exit"],
        &[
            "python3",
            "-c",
            "import time\nprint('loaded')\ntime.sleep(600)",
        ],
    ));
    assert_eq!(r.code, 8, "{}", r.stderr);
    assert_eq!(r.stdout, "loaded\n");
    // The container's own setting stands.
    let r = run(exec_alone(
        tmp.path(),
        &["--stall-after", "1h"],
        &[
            "python3",
            "-c",
            "import os; print(os.environ['PYTHONUNBUFFERED'])",
        ],
    )
    .env("PYTHONUNBUFFERED", "x"));
    assert_eq!((r.code, r.stdout.as_str()), (0, "x\n"), "{}", r.stderr);
}

/// `trainlet exec --stall-after 1h -- yes | head -1` ends as `yes | head -1` does: when
/// exec's stdout loses its reader, CMD's pipe is closed too and `yes` dies of SIGPIPE
/// (before, exec read on without writing and it never ended); the lost output is a
/// warning.
#[test]
fn a_closed_stdout_closes_cmds_so_it_ends_by_sigpipe() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = exec_alone(tmp.path(), &["--stall-after", "1h"], &["yes"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 2];
    std::io::Read::read_exact(&mut child.stdout.take().unwrap(), &mut first).unwrap();
    assert_eq!(&first, b"y\n");
    // The reader is gone (dropped above): exec must end, with yes's status.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("exec did not end within 30 s after its stdout was closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(128 + 13), "yes ends by SIGPIPE");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("exec's stdout was closed by its reader; closing CMD's stdout too"),
        "{err}"
    );
}

/// exec's own log line never lands inside a line of CMD's stderr: a stall is logged
/// while CMD is in the middle of `trainer: error: disk full`, and waits for its end
/// (before, the stderr read `trainer: error:<exec's WARN line> disk full`).
#[test]
fn execs_log_lines_land_between_cmds_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let r = run(&mut exec_alone(
        tmp.path(),
        &["--stall-after", "1s"],
        &[
            "sh",
            "-c",
            "echo step 1; printf 'trainer: error:' >&2; sleep 3; printf ' disk full\\n' >&2",
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert!(lines.contains(&"trainer: error: disk full"), "{}", r.stderr);
    let warn = lines
        .iter()
        .position(|l| l.contains("no progress for 1s; last output \"step 1\""))
        .unwrap_or_else(|| panic!("no stall logged: {}", r.stderr));
    let cmd = lines
        .iter()
        .position(|l| *l == "trainer: error: disk full")
        .unwrap();
    // Logged while CMD was inside that line: written after it.
    assert!(warn > cmd, "{}", r.stderr);
}

/// [`exec_alone`] without its `--interval`, for the flags' own checks.
fn local_exec(dir: &std::path::Path, flags: &[&str], cmd: &[&str]) -> std::process::Command {
    write_tf_config(dir, free_port());
    let mut c = trainlet();
    c.args(["exec", "--metrics-addr", "off", "--output-dir"])
        .arg(dir)
        .args(flags)
        .arg("--")
        .args(cmd);
    c
}

/// Durations near u64::MAX seconds passed validation and aborted exec with an overflow,
/// leaving CMD without a parent; `--stall-after 1ms` was accepted. Each exits 2 with
/// one line naming the flag, before CMD starts.
#[test]
fn absurd_durations_exit_2_before_cmd_starts() {
    let max = "18446744073709551615s";
    let at_most = |flag: &str| {
        format!("invalid --{flag} \"{max}\": use at most 365d (a year), e.g. 30s, 10m or 1h")
    };
    for (flags, want) in [
        (vec!["--stall-after", max], at_most("stall-after")),
        (vec!["--interval", max], at_most("interval")),
        (vec!["--restart-grace", max], at_most("restart-grace")),
        (
            vec!["--stall-after", "1ms"],
            "invalid --stall-after \"1ms\": use at least 1s, e.g. 10m".to_string(),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("started");
        let r = run(&mut local_exec(
            dir.path(),
            &flags,
            &["touch", marker.to_str().unwrap()],
        ));
        assert_eq!(r.code, 2, "{flags:?}: {}", r.stderr);
        assert_eq!(r.error_line(), want, "{flags:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{flags:?}: {}", r.stderr);
        assert!(!marker.exists(), "{flags:?}: CMD started");
    }
}

/// A heartbeat's mtime set into the future (a trainer's `os.utime` with its own
/// numbers) turned the watch off: CMD silent for 4 s under `--stall-after 1s` exited
/// 0; set to the year 10000 on a tmpfs volume it also crashed the reporter that wrote
/// it. The change is progress once, when exec sees it; the silence after it is a stall.
#[test]
fn a_heartbeat_set_into_the_future_is_progress_once_then_silence_is_a_stall() {
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "the test needs a tmpfs at /dev/shm");
    let observations = tempfile::tempdir_in(shm).unwrap();
    let obs = observations.path().to_str().unwrap();
    // The year 10000 in the observation volume (tmpfs); the year 2100 in the private
    // directory of exec's own, without one.
    for (flags, when) in [
        (vec!["--observations", obs], "@253402300800"),
        (vec![], "@4102444800"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("finished");
        let script = format!(
            "echo start; touch -d {when} \"$TRAINLET_HEARTBEAT\"; sleep 4; touch {}",
            marker.display()
        );
        let mut all = vec!["--stall-after", "1s", "--on-stall", "exit"];
        all.extend(&flags);
        let r = run(&mut exec_alone(dir.path(), &all, &["sh", "-c", &script]));
        assert_eq!(r.code, 8, "{flags:?}: {}", r.stderr);
        assert!(!marker.exists(), "{flags:?}: CMD ran to its end");
        assert!(
            r.stderr
                .contains("no progress for 1s; last output \"start\""),
            "{flags:?}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("panicked"), "{flags:?}: {}", r.stderr);
    }
    // What exec handed over is an observation the sidecar takes, with a time of this
    // century.
    let text = std::fs::read(observations.path().join("exec.json")).unwrap();
    let o = trainlet::handover::observation::parse(&text, "exec.json").unwrap();
    let at = o.progress.unwrap().at_ms.unwrap();
    let now = trainlet::time::to_ms(std::time::SystemTime::now());
    assert!(at <= now && now - at < 60_000, "at_ms {at}, now {now}");
}

/// Without `--observations` the heartbeat is in a new directory of random name and
/// mode 0700 in $TMPDIR, removed when exec exits (it was `trainlet-<pid>`, predictable
/// and never removed).
#[test]
fn the_private_heartbeat_directory_is_0700_and_removed_when_exec_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"echo "$TRAINLET_HEARTBEAT"; stat -c %a "$(dirname "$TRAINLET_HEARTBEAT")""#;
    let r = run(
        exec_alone(dir.path(), &["--stall-after", "1h"], &["sh", "-c", script])
            .env("TMPDIR", tmp.path()),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    let beat = std::path::Path::new(lines[0]);
    assert_eq!(beat.file_name().unwrap(), "heartbeat");
    let private = beat.parent().unwrap();
    assert_eq!(private.parent(), Some(tmp.path()));
    let name = private.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("trainlet-") && name.len() > "trainlet-".len() + 4,
        "{name}"
    );
    assert_eq!(lines[1], "700");
    assert_eq!(list_dir(tmp.path()), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------
// The stall scope in the shipped layout (exec without credentials, a sidecar with
// them), on a Job of two pods: a rank quiet while another progresses is no stall
// (job-wide, the default); a hang of every rank is one.

/// What torchrun prints in every pod when `--nproc-per-node` is above 1.
const OMP_WARNING: &str = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed.";

/// Rank 0's CMD: its start in `$STARTS`, a line every 0.5 s until pod 1 has printed
/// its warning (the file `warned`, however late pod 1 starts), then `steps` lines
/// `step N` 0.5 s apart; in its first run, where `$HANG` exists, it then hangs
/// silently; else it ends (0).
fn rank_0_cmd(steps: u32, warned: &std::path::Path) -> String {
    format!(
        r#"echo "$(date +%s.%N) $TF_CONFIG" >> "$STARTS"
while [ ! -e '{}' ]; do echo "warming up"; sleep 0.5; done
i=0; while [ $i -lt {steps} ]; do echo "step $i"; i=$((i+1)); sleep 0.5; done
if [ "$(wc -l < "$STARTS")" -eq 1 ] && [ -e "$HANG" ]; then exec sleep 600; fi"#,
        warned.display()
    )
}

/// Pod 1's CMD: its start, torchrun's warning on stderr (then the file `warned`), then
/// `quiet` seconds of silence and the end (0); in its first run, where `$HANG` exists,
/// silence for good.
fn quiet_cmd(quiet: u32, warned: &std::path::Path) -> String {
    format!(
        r#"echo "$(date +%s.%N) $TF_CONFIG" >> "$STARTS"
echo '{OMP_WARNING}' >&2
touch '{}'
if [ "$(wc -l < "$STARTS")" -eq 1 ] && [ -e "$HANG" ]; then exec sleep 600; fi
exec sleep {quiet}"#,
        warned.display()
    )
}

/// A Job of two pods in the shipped layout under `--stall-after 3s --on-stall restart`
/// (the default scope): pod 0 runs [`rank_0_cmd`] with `steps`, pod 1 [`quiet_cmd`]
/// with `quiet`, with `$HANG` made where `hang`; pod 1's CMD starts once pod 0's is up.
async fn two_pods(
    client: &kube::Client,
    prefix: &str,
    subnet: u8,
    (steps, quiet): (u32, u32),
    hang: bool,
) -> (String, Vec<String>, Vec<HandoverPod>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let warned = dir.path().join("warned");
    let cmds = [rank_0_cmd(steps, &warned), quiet_cmd(quiet, &warned)];
    let (ns, kc) = rbac_namespace(client, prefix, dir.path()).await;
    indexed_job(client, &ns, "w", 2, "app=w", serde_json::json!({})).await;
    let port = free_port();
    let names = run_job_pods(client, &ns, "w", 2, |i| format!("10.9.{subnet}.{}", 10 + i)).await;
    let flags = ["--stall-after", "3s", "--on-stall", "restart"];
    let mut pods = Vec::new();
    for (name, cmd) in names.iter().zip(&cmds) {
        let dirs = handover_dirs();
        let r = run(&mut handover_init(&kc, &ns, name, &dirs, port, &[]));
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        if hang {
            std::fs::write(dirs.dir.path().join("hang"), "").unwrap();
        }
        let mut pod = start_handover_with(&kc, &ns, name, dirs, &flags, &["sh", "-c", cmd]);
        pod.wait(1).await;
        // A CMD that ended before the test looked would say nothing of the window.
        assert!(pod.exec.alive(), "{name}: {}", pod.exec.stderr());
        pods.push(pod);
    }
    (ns, names, pods, dir)
}

/// The sidecar's counter `series` of exec's, once it reads `want`.
async fn sidecar_counts(pod: &HandoverPod, name: &str, series: &str, want: f64) {
    eventually(
        &format!("{name}'s {series} {want}"),
        Duration::from_secs(30),
        || async { (metric(&pod.sidecar.metrics().await, series) == Some(want)).then_some(()) },
    )
    .await;
}

/// The issue's healthy torchrun job: pod 1 prints torchrun's start-up warning and is
/// quiet for 10 s while rank 0 prints a step every 0.5 s for 10 s after it. Pod 1 is silent
/// (published), never stalled; nothing restarts and both commands end 0. (Before,
/// pod 1 was stalled 3 s after its warning and the group restarted for it, up to
/// exit 8.)
#[tokio::test]
async fn without_credentials_a_pod_quiet_after_a_warning_is_silent_while_rank_0_progresses() {
    let client = admin().await;
    let (ns, names, mut pods, _dir) = two_pods(&client, "scope-quiet", 11, (20, 10), false).await;
    // Quiet for --stall-after while rank 0 goes on: silent, not stalled.
    eventually("pod 1 silent", Duration::from_secs(30), || async {
        let a = annotations(&client, &ns, &names[1]).await;
        let p: serde_json::Value = serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
        (p["silent"] == true && p["stalled"] == false).then_some(())
    })
    .await;
    for (p, name) in pods.iter_mut().zip(&names) {
        let (code, _) = p.exec.wait(Duration::from_secs(60));
        assert_eq!(code, 0, "{name}: {}", p.exec.stderr());
        assert_eq!(p.starts.read().len(), 1, "{name}");
        sidecar_counts(p, name, "trainlet_stalls_total", 0.0).await;
        sidecar_counts(p, name, "trainlet_restarts_total", 0.0).await;
        let w = warnings_of(&client, &ns, name).await;
        assert_eq!(w, Vec::<(String, String)>::new(), "{name}");
        let a = progress(&annotations(&client, &ns, name).await);
        assert_eq!(
            (&a["stalled"], &a["stalls"]),
            (&false.into(), &0.into()),
            "{name}: {a}"
        );
    }
    delete_namespace(&client, &ns).await;
}

/// The same job hangs as a whole in its first run: rank 0 stops after `step 7`, pod 1
/// is quiet since its warning. Rank 0's pod tells the stall once (its own: its step
/// was the job's last progress), every pod's CMD restarts once for it, and the second
/// run ends 0 in both.
#[tokio::test]
async fn without_credentials_a_job_wide_hang_restarts_every_pods_command_once() {
    let client = admin().await;
    let (ns, names, mut pods, _dir) = two_pods(&client, "scope-hang", 12, (8, 6), true).await;
    for (p, name) in pods.iter_mut().zip(&names) {
        let (code, _) = p.exec.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{name}: {}", p.exec.stderr());
        assert_eq!(p.starts.read().len(), 2, "{name}");
        sidecar_counts(p, name, "trainlet_restarts_total", 1.0).await;
        let stalls = if name == &names[0] { 1.0 } else { 0.0 };
        sidecar_counts(p, name, "trainlet_stalls_total", stalls).await;
    }
    let w0 = eventually("rank 0's Restarting", Duration::from_secs(30), || async {
        let w = warnings_of(&client, &ns, &names[0]).await;
        (!restarting(&w).is_empty()).then_some(w)
    })
    .await;
    let stalled: Vec<&str> = w0
        .iter()
        .filter(|(r, _)| r == "Stalled")
        .map(|(_, n)| n.as_str())
        .collect();
    assert_eq!(stalled.len(), 1, "{w0:?}");
    let cpu = stalled[0]
        .strip_prefix("no progress for 3s; last output \"step 7\"; CMD used ")
        .and_then(|rest| rest.strip_suffix("% of a core over the window; where: no Python process"))
        .unwrap_or_else(|| panic!("{}", stalled[0]));
    assert!(cpu.parse::<f64>().is_ok(), "{}", stalled[0]);
    assert_eq!(
        restarting(&w0),
        ["restarting sh (1 of 3) in 1s: main made no progress for 3s"]
    );
    let w1 = eventually("pod 1's Restarting", Duration::from_secs(30), || async {
        let w = warnings_of(&client, &ns, &names[1]).await;
        (!restarting(&w).is_empty()).then_some(w)
    })
    .await;
    assert!(w1.iter().all(|(r, _)| r != "Stalled"), "{w1:?}");
    let notes = restarting(&w1);
    let want = format!(
        "restarting sh (1 of 3) in 1s: pod {} made no progress since ",
        names[0]
    );
    assert!(notes.len() == 1 && notes[0].starts_with(&want), "{notes:?}");
    delete_namespace(&client, &ns).await;
}
