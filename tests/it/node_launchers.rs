//! The corpus: real jobs of the launchers people run (torchrun with static and c10d
//! rendezvous, Accelerate, TensorFlow's MultiWorkerMirroredStrategy, JAX), each a
//! 2-pod Indexed Job on the real node, made as a user makes it (`trainlet inject` with
//! the recipe of docs/stall-watch.md: `--stall-after` and `--on-stall restart`, no
//! pattern, and `--on-peer-change restart` of docs/failure-handling.md), running the
//! real framework from the venv (.ci/frameworks, mounted by hostPath as in
//! node_pods.rs) on a training script of tests/fixtures/launchers/ (a ConfigMap, as
//! users ship one). Only the launcher's own output is what the watch sees: torchrun's
//! start-up warning in every pod, then steps from rank 0 only.
//!
//! Each job lives through what users meet, in one run:
//! 1. it trains for three times `--stall-after` with no restart, although pod 1 prints
//!    nothing after its start-up lines (job-wide rule: a rank quiet while another
//!    progresses waits in no hung collective);
//! 2. a worker process of pod 1 is frozen (`kill -STOP`, through `kubectl exec`):
//!    every rank stops in the next all-reduce; one `Stalled` Event within
//!    `--stall-after` plus 2 s of the job's last output, and every pod's command
//!    restarts once;
//! 3. pod 1 is deleted while the job trains again: the Job controller's replacement
//!    joins, the peers' commands restart once more, and the job completes, every rank
//!    in the last all-reduce.
//!
//! Each run resumes from the job's checkpoint, as real jobs do: the step its rank 0
//! last finished, in a directory every pod mounts.
//!
//! With `--on-failure restart`, the torchrun job also lives through the failures of one
//! rank (a SIGKILLed worker, an exception, an OOM kill), each restarted in place.
//!
//! docs/launchers.md has the outcome tables these tests hold.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::node_pods::{On, plain_job, pod_spec};
use crate::node_two::framework_namespace;
use crate::support::jobs::{index_of, job_pods};
use crate::support::*;

/// The recipe's `--stall-after`: above the longest silent phase of these jobs on a
/// loaded 2-core machine, their start (importing the framework and joining the
/// rendezvous): 5–10 s alone, and over 30 s for the four pods of the ParameterServer
/// job starting beside another job (a run here saw it stalled before its first step).
const STALL_AFTER: u64 = 45;
/// Seconds between steps (each step's all-reduce is quick).
const STEP_TIME: f64 = 0.5;
/// The step at which pod 1 is frozen: twice `--stall-after` of training in one run,
/// with rank 1 silent throughout (the runs after the freeze and after the replacement
/// train on to the job's end).
const FREEZE_AT: u32 = (2 * STALL_AFTER) as u32 * 2;
/// The job's steps. A run resumes from the job's checkpoint ([`with_checkpoint`]), as
/// real jobs do: the first run is still training at [`FREEZE_AT`], the second has about
/// 30 s left (pod 1 is deleted while it trains), and the third finishes what is left.
const STEPS: u32 = FREEZE_AT + 60;
/// How often exec reads the heartbeat file: its `--interval`, by default.
const HEARTBEAT_READ: f64 = 5.0;
/// From `kubectl apply` to the end of a job: three runs of it, a stall and a
/// replacement.
const CORPUS_TIMEOUT: Duration = Duration::from_secs(600);

/// One row of the corpus.
struct Launcher {
    job: &'static str,
    /// The training container's command.
    command: &'static [&'static str],
    /// inject's flags beyond the recipe.
    flags: &'static [&'static str],
    /// Processes in the job: what `done: world=N sum=N` says.
    world: u32,
    /// How many pods log steps: rank 0's alone, or each (Accelerate's
    /// `accelerator.print` prints on each machine's local main process).
    loggers: usize,
    /// What a frozen worker brings.
    on_freeze: Freeze,
    /// The pods serve SSH to the launcher's mpirun ([`with_ssh`]).
    ssh: bool,
    /// A shell test on `$p` (`/proc/<pid>`) that picks the process to freeze in pod 1:
    /// a worker, not the launcher.
    worker: &'static str,
}

/// What a frozen worker brings about.
#[derive(Clone, Copy)]
enum Freeze {
    /// The stall watch's: one `Stalled` Event, the group restarts.
    Stalled,
    /// The framework's own: rank 0's command fails saying this, before `--stall-after`.
    Aborts(&'static str),
}

/// torchrun's workers have `LOCAL_RANK` in their environment; its agent has not.
const TORCH_WORKER: &str = r#"tr '\0' '\n' <"$p/environ" | grep -qx LOCAL_RANK=1"#;
/// A plain `python SCRIPT`: the process whose second word is the script.
const PYTHON_SCRIPT: &str = r#"tr '\0' '\n' <"$p/cmdline" | sed -n 2p | grep -q '^/scripts/'"#;

/// An MPI rank that orted started: the program itself.
const MPI_RANK: &str = r#"tr '\0' '\n' <"$p/cmdline" | head -n 1 | grep -qx /scripts/mpi_train"#;

/// docs/stall-watch.md's recipe with docs/failure-handling.md's group restart on a
/// replaced peer; a restart's grace of 5 s (a frozen process ends only by SIGKILL).
const RECIPE: [&str; 5] = [
    "--stall-after=45s",
    "--on-stall=restart",
    "--on-peer-change=restart",
    "--max-restarts=3",
    "--restart-grace=5s",
];

/// The freeze, as a person does it: `kubectl exec` into the training container,
/// `kill -STOP` to the worker. Returns the pids frozen.
fn freeze(on: &On, pod: &str, worker: &str) -> String {
    let script = format!(
        "for p in /proc/[0-9]*; do if {worker}; then kill -STOP \"${{p#/proc/}}\" && echo \"${{p#/proc/}}\"; fi; done"
    );
    kubectl_on(
        on.kc,
        &[
            "exec", "-n", &on.ns, pod, "-c", "main", "--", "sh", "-c", &script,
        ],
    )
}

/// A privileged namespace (the venv is mounted by hostPath) with trainlet's RBAC and
/// the training scripts in ConfigMap `scripts`.
async fn corpus_namespace(prefix: &str) -> Result<On, Missing> {
    let on = framework_namespace(node()?, prefix).await;
    let dir = repo().join("tests/fixtures/launchers");
    let (mut data, mut binary) = (BTreeMap::new(), BTreeMap::new());
    let built = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        data.insert(name.clone(), std::fs::read_to_string(&path).unwrap());
        // A C program goes in built, under its name without `.c` (mpicc: .ci/frameworks).
        if let Some(program) = name.strip_suffix(".c") {
            let out = built.path().join(program);
            let r = run(std::process::Command::new("mpicc")
                .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
                .arg(&out)
                .arg(&path));
            assert_eq!(r.code, 0, "mpicc {name}: {}", r.stderr);
            binary.insert(
                program.to_string(),
                k8s_openapi::ByteString(std::fs::read(&out).unwrap()),
            );
        }
    }
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("scripts".into()),
            ..Default::default()
        },
        data: Some(data),
        binary_data: Some(binary),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(on.client.clone(), &on.ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    Ok(on)
}

/// The training container: the venv's launcher on a script of the ConfigMap.
pub(crate) fn training_container(py: &std::path::Path, command: &[&str], steps: u32) -> Value {
    let (_, mut mounts) = venv_hostpath(py);
    mounts
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "scripts", "mountPath": "/scripts", "readOnly": true}));
    let bin = py.parent().unwrap().to_str().unwrap();
    json!({
        "name": "main",
        "image": "trainlet.test/trainer:1",
        "imagePullPolicy": "Never",
        "command": command,
        "env": [
            {"name": "PATH", "value": format!("{bin}:/bin:/usr/bin")},
            {"name": "HOME", "value": "/tmp"},
            {"name": "STEPS", "value": steps.to_string()},
            {"name": "STEP_TIME", "value": STEP_TIME.to_string()},
            {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"},
            {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"},
            // exec's --restart-backoff, as a user may set it: the default's 10 s and
            // 20 s are only waiting here.
            {"name": "TRAINLET_RESTART_BACKOFF", "value": "1s"}
        ],
        "resources": {
            "requests": {"cpu": "10m", "memory": "256Mi"},
            "limits": {"memory": "4Gi"}
        },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}
        },
        "volumeMounts": mounts
    })
}

/// A plain Indexed Job of `n` pods running `command` in the training container, with
/// the venv's and the scripts' volumes; a replaced pod is one of its failures.
fn corpus_job(py: &std::path::Path, job: &str, n: usize, command: &[&str], steps: u32) -> Value {
    let mut plain = plain_job(job, n, training_container(py, command, steps));
    plain["spec"]["backoffLimit"] = json!(3);
    let (mut volumes, _) = venv_hostpath(py);
    volumes
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "scripts", "configMap": {"name": "scripts", "defaultMode": 0o755}}));
    pod_spec(&mut plain)["volumes"] = volumes;
    plain
}

/// Where the job's pods resume from (tests/fixtures/launchers/checkpoint.py and
/// mpi_train.c): a directory of this machine, the node's, that every pod mounts at
/// `/ckpt` by hostPath, as pods of a real job mount shared storage, writable by the
/// training container's user. Removed when the returned guard is dropped.
fn with_checkpoint(plain: &mut Value) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let spec = pod_spec(plain);
    spec["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "ckpt", "hostPath": {"path": dir.path(), "type": "Directory"}}));
    let main = &mut spec["containers"][0];
    main["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "ckpt", "mountPath": "/ckpt"}));
    main["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "CKPT_DIR", "value": "/ckpt"}));
    dir
}

/// What the MPI job's pods need beyond the others' (tests/fixtures/launchers/
/// mpi_launch.sh): the launcher's key and the workers' authorized_keys in Secret `ssh`
/// (made here with ssh-keygen), an /etc/passwd naming the user (ssh and sshd look it
/// up), Debian's sshd, unpacked by .ci/frameworks, at /opt/sshd, and the host's
/// /etc/alternatives, through which its `mpirun` is linked.
async fn with_ssh(on: &On, plain: &mut Value) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id");
    let r = run(std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "launcher", "-f"])
        .arg(&key));
    assert_eq!(r.code, 0, "ssh-keygen: {}", r.stderr);
    let mut data = BTreeMap::new();
    for (name, file) in [("id", "id"), ("authorized_keys", "id.pub")] {
        data.insert(
            name.to_string(),
            k8s_openapi::ByteString(std::fs::read(dir.path().join(file)).unwrap()),
        );
    }
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("ssh".into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(on.client.clone(), &on.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let sshd = std::env::var("TRAINLET_SSHD_DIR")
        .unwrap_or_else(|_| format!("{}/.cache/trainlet/sshd", std::env::var("HOME").unwrap()));
    let spec = pod_spec(plain);
    let volumes = spec["volumes"].as_array_mut().unwrap();
    volumes.push(json!({"name": "ssh", "secret": {"secretName": "ssh", "defaultMode": 0o444}}));
    volumes.push(json!({"name": "sshd", "hostPath": {"path": sshd, "type": "Directory"}}));
    // Debian's `mpirun` is a link through /etc/alternatives, as in a Debian-based image.
    volumes.push(json!({"name": "alternatives", "hostPath": {"path": "/etc/alternatives", "type": "Directory"}}));
    let mounts = spec["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap();
    mounts.push(json!({"name": "ssh", "mountPath": "/ssh", "readOnly": true}));
    mounts.push(json!({"name": "sshd", "mountPath": "/opt/sshd", "readOnly": true}));
    mounts
        .push(json!({"name": "alternatives", "mountPath": "/etc/alternatives", "readOnly": true}));
    mounts.push(json!({"name": "scripts", "mountPath": "/etc/passwd", "subPath": "passwd", "readOnly": true}));
}

/// The job's live pods (not being deleted), by index.
pub(crate) async fn live_pods(on: &On, job: &str) -> Vec<Pod> {
    let mut pods: Vec<Pod> = job_pods(&on.client, &on.ns, job)
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(index_of);
    pods
}

/// What CMD printed in every live pod, as (time, line), in time order: the
/// timestamps of `kubectl logs --timestamps`, trainlet's own lines left out.
async fn cmd_output(on: &On, job: &str) -> Vec<(String, String)> {
    let mut all = Vec::new();
    for p in live_pods(on, job).await {
        for l in on.log(&p.name_any(), "main", true).await.lines() {
            let Some((t, line)) = l.split_once(' ') else {
                continue;
            };
            if !crate::node_pods::is_trainlet_line(line) {
                all.push((t.to_string(), line.to_string()));
            }
        }
    }
    all.sort();
    all
}

/// How many times `line` begins a line of CMD's output in the job's live pods.
async fn count(on: &On, job: &str, prefix: &str) -> usize {
    cmd_output(on, job)
        .await
        .iter()
        .filter(|(_, l)| l.starts_with(prefix))
        .count()
}

/// Whether the Job has failed (its `Failed` condition).
async fn job_failed(on: &On, job: &str) -> bool {
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(on.client.clone(), &on.ns);
    jobs.get(job)
        .await
        .unwrap()
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Failed" && c.status == "True")
}

/// The Events of a reason with their times (eventTime), as (time, note, pod).
pub(crate) async fn timed_events(on: &On, reason: &str) -> Vec<(String, String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(on.client.clone(), &on.ns);
    let mut v: Vec<_> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            (
                e.event_time.map(|t| t.0.to_string()).unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Seconds between two RFC 3339 UTC times (`2026-11-28T09:00:30.396611Z`).
fn seconds(from: &str, to: &str) -> f64 {
    let t = |s: &str| {
        humantime::parse_rfc3339(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    t(to) - t(from)
}

async fn synchronous(l: &Launcher) {
    let py = require!(framework_python());
    let on = require!(corpus_namespace(l.job).await);
    let mut plain = corpus_job(py, l.job, 2, l.command, STEPS);
    let _checkpoint = with_checkpoint(&mut plain);
    if l.ssh {
        with_ssh(&on, &mut plain).await;
        // The workers' sshd serves forever: the job is done when mpirun is (pod 0).
        plain["spec"]["successPolicy"] = json!({"rules": [{"succeededIndexes": "0"}]});
    }
    let mut flags: Vec<&str> = RECIPE.to_vec();
    flags.extend(l.flags);
    on.inject_and_apply(&plain, &flags, |_| {});
    let job = l.job;
    let died = || async { describe_pods(&on.pods()).await };

    // 1. Twice --stall-after of training, pod 1 silent, and no restart.
    let freeze_line = format!("step {FREEZE_AT} ");
    let failed = format!("{job}: the Job failed before step {FREEZE_AT}");
    eventually(
        &format!("{job}: step {FREEZE_AT}"),
        CORPUS_TIMEOUT,
        || async {
            assert!(!job_failed(&on, job).await, "{failed}:\n{}", died().await);
            (count(&on, job, &freeze_line).await >= 1).then_some(())
        },
    )
    .await;
    let pods = live_pods(&on, job).await;
    assert_eq!(pods.len(), 2, "{}", died().await);
    assert_eq!(
        timed_events(&on, "Stalled").await,
        vec![],
        "{}",
        died().await
    );
    assert_eq!(timed_events(&on, "Restarting").await, vec![]);
    let first = pods[1].name_any();
    let mut logging = 0;
    for p in &pods {
        let log = on.log(&p.name_any(), "main", false).await;
        logging += usize::from(log.lines().any(|line| line.starts_with("step ")));
    }
    assert_eq!(logging, l.loggers, "{job}: the pods that log steps");

    // 2. A worker of pod 1 frozen.
    let frozen = freeze(&on, &first, l.worker);
    assert_eq!(
        frozen.lines().count(),
        1,
        "{job}: one worker frozen: {frozen}"
    );
    match l.on_freeze {
        Freeze::Stalled => stalled_and_restarted(&on, job, &pods).await,
        Freeze::Aborts(says) => aborted_and_replaced(&on, job, &pods, says).await,
    }

    // 3. Pod 1 deleted while the job trains again: replaced, restarted, completed.
    eventually(
        &format!("{job}: training again"),
        CORPUS_TIMEOUT,
        || async {
            let out = cmd_output(&on, job).await;
            let second = out
                .iter()
                .filter(|(_, line)| line.starts_with("training: "))
                .nth(l.loggers)?
                .0
                .clone();
            out.iter()
                .any(|(t, line)| *t > second && line.starts_with("step "))
                .then_some(())
        },
    )
    .await;
    on.pods()
        .delete(&first, &DeleteParams::default())
        .await
        .unwrap();
    let (kind, _, message) = on.job_end_within(job, CORPUS_TIMEOUT).await;
    assert_eq!(kind, "Complete", "{job}: {message}\n{}", died().await);
    // Pod 1's replacement, as the peers were told of it (with a successPolicy, the Job
    // controller removes it once the job is done), and the last pod of index 0.
    let moved = timed_events(&on, "PeerReplaced").await;
    let replacement = moved
        .iter()
        .rev()
        .find_map(|(_, note, _)| {
            let rest = note.strip_prefix("task worker/1 moved: ")?;
            Some(rest.split_once("(pod ")?.1.split_once(')')?.0.to_string())
        })
        .unwrap_or_else(|| panic!("{job}: no PeerReplaced of worker/1: {moved:?}"));
    assert_ne!(replacement, first, "{job}: pod 1 was replaced");
    let zero = live_pods(&on, job)
        .await
        .into_iter()
        .filter(|p| index_of(p) == Some(0))
        .max_by_key(|p| p.metadata.creation_timestamp.clone())
        .unwrap();
    assert_eq!(
        zero.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded"),
        "{job}"
    );
    // The last run's output ends with every rank in the last all-reduce.
    let out = cmd_output(&on, job).await;
    let last_run = out
        .iter()
        .rposition(|(_, line)| line.starts_with("training: "))
        .unwrap();
    let done = format!("done: world={0} sum={0}", l.world);
    assert!(
        out[last_run..].iter().any(|(_, line)| *line == done),
        "{job}: no {done:?} in the last run: {:?}",
        &out[last_run..]
    );
    let stalls = match l.on_freeze {
        Freeze::Stalled => 1,
        Freeze::Aborts(_) => 0,
    };
    assert_eq!(
        timed_events(&on, "Stalled").await.len(),
        stalls,
        "{job}: Stalled Events"
    );
    // Pod 0's command restarted for the replacement of pod 1, and for the stall unless
    // pod 0 itself was replaced then; pod 1's for the freeze; its replacement's never.
    let restarts = timed_events(&on, "Restarting").await;
    let of = |pod: &str| restarts.iter().filter(|(_, _, p)| p == pod).count();
    assert_eq!(
        (of(&zero.name_any()), of(&first), of(&replacement)),
        (stalls + 1, 1, 0),
        "{job}: {restarts:?}"
    );
    on.done().await;
}

/// The recipe's outcome of a frozen rank: one `Stalled` Event from rank 0's pod within
/// `--stall-after` plus 2 s of the job's last output, and every pod's command restarted
/// once.
async fn stalled_and_restarted(on: &On, job: &str, pods: &[Pod]) {
    let stalled = eventually(&format!("{job}: Stalled"), CORPUS_TIMEOUT, || async {
        let v = timed_events(on, "Stalled").await;
        (!v.is_empty()).then_some(v)
    })
    .await;
    let (at, note, teller) = &stalled[0];
    assert_eq!(
        teller,
        &pods[0].name_any(),
        "{job}: rank 0's pod tells the stall"
    );
    // Where its ranks are: exec read their Python stacks in the restricted pod. mpirun
    // starts its ranks through ssh, under each pod's sshd: none is under exec, which
    // says so.
    let (_, at_stall) = note
        .split_once("; where: ")
        .unwrap_or_else(|| panic!("{job}: {note}"));
    if job == "mpi" {
        assert_eq!(at_stall, "no Python process", "{job}: {note}");
    } else {
        assert!(
            at_stall != "no Python process" && !at_stall.starts_with("no stack read"),
            "{job}: {note}"
        );
    }
    // The job's last output before the stall; what the launcher prints as exec stops
    // it (torchrun's "Sending process … closing signal SIGTERM") comes with the Event.
    let last = cmd_output(on, job)
        .await
        .into_iter()
        .rfind(|(t, _)| seconds(t, at) > 2.0)
        .unwrap();
    let late = seconds(&last.0, at);
    // The teller knows its own output at once, another pod's as that pod publishes its
    // progress: up to half of --stall-after, plus an --interval, late
    // (docs/stall-watch.md). With c10d's rendezvous the rank that logs (rank 0 of the
    // group) may be in the other pod.
    let own = on.log(&pods[0].name_any(), "main", false).await;
    let early = if own.lines().any(|l| l.starts_with("step ")) {
        1.0
    } else {
        STALL_AFTER as f64 / 2.0 + HEARTBEAT_READ
    };
    assert!(
        (STALL_AFTER as f64 - early..=STALL_AFTER as f64 + 2.0).contains(&late),
        "{job}: Stalled {late:.1}s after the job's last output {last:?}: {note}"
    );
    assert!(
        note.starts_with(&format!("no progress for {STALL_AFTER}s"))
            || note.starts_with(&format!("no progress for {}s", STALL_AFTER + 1)),
        "{job}: {note}"
    );
    let restarted = eventually(
        &format!("{job}: both commands restarted"),
        CORPUS_TIMEOUT,
        || async {
            let v = timed_events(on, "Restarting").await;
            (v.len() >= 2).then_some(v)
        },
    )
    .await;
    let mut who: Vec<&str> = restarted.iter().map(|(_, _, p)| p.as_str()).collect();
    who.sort();
    let mut names: Vec<String> = pods.iter().map(ResourceExt::name_any).collect();
    names.sort();
    assert_eq!(who, names, "{job}: {restarted:?}");
}

/// A framework that watches its peers itself aborts rank 0's collective before
/// `--stall-after`: rank 0's command fails saying `says`, no peer change explains it,
/// so its pod fails and the Job replaces it; the frozen pod's command restarts once, on
/// that peer change; no `Stalled` Event.
async fn aborted_and_replaced(on: &On, job: &str, pods: &[Pod], says: &str) {
    let zero = pods[0].name_any();
    eventually(&format!("{job}: pod 0 failed"), CORPUS_TIMEOUT, || async {
        let p = on.pods().get(&zero).await.ok()?;
        (p.status?.phase.as_deref() == Some("Failed")).then_some(())
    })
    .await;
    let log = on.log(&zero, "main", false).await;
    assert!(
        log.contains(says),
        "{job}: pod 0's command says {says:?}:\n{log}"
    );
    let first = pods[1].name_any();
    let restarted = eventually(
        &format!("{job}: pod 1's command restarted"),
        CORPUS_TIMEOUT,
        || async {
            let v = timed_events(on, "Restarting").await;
            (!v.is_empty()).then_some(v)
        },
    )
    .await;
    assert_eq!(restarted.len(), 1, "{job}: {restarted:?}");
    assert_eq!(restarted[0].2, first, "{job}: {restarted:?}");
    assert!(
        restarted[0]
            .1
            .contains(": the cluster changed (stale: worker/0 "),
        "{job}: {restarted:?}"
    );
    assert_eq!(timed_events(on, "Stalled").await, vec![]);
}

#[tokio::test]
async fn torchrun_static_rendezvous_trains_through_a_frozen_rank_and_a_deleted_pod() {
    synchronous(&Launcher {
        job: "ddp",
        command: &["torchrun", "--nproc-per-node", "2", "/scripts/ddp_train.py"],
        flags: &["--nproc-per-node=2"],
        world: 4,
        loggers: 1,
        on_freeze: Freeze::Stalled,
        ssh: false,
        worker: TORCH_WORKER,
    })
    .await;
}

/// c10d: `--nnodes 2:2` makes inject write torchrun's rendezvous (`PET_RDZV_*`), and the
/// rendezvous hands out the ranks.
#[tokio::test]
async fn torchrun_c10d_rendezvous_trains_through_a_frozen_rank_and_a_deleted_pod() {
    synchronous(&Launcher {
        job: "c10d",
        command: &["torchrun", "--nproc-per-node", "2", "/scripts/ddp_train.py"],
        flags: &["--nproc-per-node=2", "--nnodes=2:2"],
        world: 4,
        loggers: 1,
        on_freeze: Freeze::Stalled,
        ssh: false,
        worker: TORCH_WORKER,
    })
    .await;
}

/// `accelerate launch --multi_gpu` starts torchrun's agent in each pod (its `--cpu`
/// multi-machine path is mpirun's); its flags take trainlet's variables through a
/// shell, as docs/frameworks.md shows.
#[tokio::test]
async fn accelerate_trains_through_a_frozen_rank_and_a_deleted_pod() {
    synchronous(&Launcher {
        job: "accelerate",
        command: &[
            "sh",
            "-c",
            "exec accelerate launch --multi_gpu --num_machines \"$PET_NNODES\" --num_processes \"$WORLD_SIZE\" --machine_rank \"$PET_NODE_RANK\" --main_process_ip \"$MASTER_ADDR\" --main_process_port \"$MASTER_PORT\" /scripts/accelerate_train.py",
        ],
        flags: &["--nproc-per-node=2"],
        world: 4,
        loggers: 2,
        on_freeze: Freeze::Stalled,
        ssh: false,
        worker: TORCH_WORKER,
    })
    .await;
}

/// TensorFlow's MultiWorkerMirroredStrategy from a plain `python` and the TF_CONFIG of
/// inject's default framework. TensorFlow's coordination service sees the frozen
/// worker stop its heartbeats (in about 10 s) and aborts the chief's collective, before
/// `--stall-after`: the chief's pod fails and is replaced.
#[tokio::test]
async fn tensorflow_multiworker_trains_through_a_frozen_worker_and_a_deleted_pod() {
    synchronous(&Launcher {
        job: "mwms",
        command: &["python", "/scripts/mwms_train.py"],
        flags: &[],
        world: 2,
        loggers: 1,
        on_freeze: Freeze::Aborts(
            "The following tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1",
        ),
        ssh: false,
        worker: PYTHON_SCRIPT,
    })
    .await;
}

#[tokio::test]
async fn jax_trains_through_a_frozen_process_and_a_deleted_pod() {
    synchronous(&Launcher {
        job: "jax",
        command: &["python", "/scripts/jax_train.py"],
        flags: &["--framework=jax"],
        world: 2,
        loggers: 1,
        on_freeze: Freeze::Stalled,
        ssh: false,
        worker: PYTHON_SCRIPT,
    })
    .await;
}

/// MPI as mpi-operator runs it, without it: `mpirun` in pod 0 (the launcher, rank 0
/// too) over SSH to pod 1's sshd, on the hostfile of `--framework mpi`. The sshd pod
/// prints its start and the launcher's login, then nothing: silent, never stalled.
#[tokio::test]
async fn mpirun_over_ssh_trains_through_a_frozen_rank_and_a_deleted_pod() {
    synchronous(&Launcher {
        job: "mpi",
        command: &["sh", "/scripts/mpi_launch.sh"],
        flags: &["--framework=mpi"],
        world: 2,
        loggers: 1,
        on_freeze: Freeze::Stalled,
        ssh: true,
        worker: MPI_RANK,
    })
    .await;
}

/// TensorFlow's ParameterServerStrategy: chief (index 0), one parameter server (1) and
/// two workers (2, 3) of one Indexed Job, which succeeds with its chief. With a `ps`
/// type (`--stall-scope auto`) a pod that signalled progress is stalled alone: worker
/// 1 frozen, its heartbeat stops, and it is stalled within `--stall-after` plus the
/// interval at which exec reads the heartbeat plus 4 s (its sidecar publishes it, on a
/// loaded machine); only its command restarts, while the chief schedules on and the
/// other worker trains; the parameter server, which printed TensorFlow's start-up
/// lines and then serves in silence, is never stalled. The coordinator runs the frozen worker's step
/// again once it is back, and the job completes.
#[tokio::test]
async fn tensorflow_parameter_servers_stall_a_frozen_worker_alone() {
    let py = require!(framework_python());
    let on = require!(corpus_namespace("ps").await);
    // The chief schedules for a minute past the freeze: the stall, the restart's grace
    // and backoff, and the worker's return fit in it.
    let steps = FREEZE_AT + 120;
    let mut plain = corpus_job(py, "ps", 4, &["python", "/scripts/ps_train.py"], steps);
    plain["spec"]["successPolicy"] = json!({"rules": [{"succeededIndexes": "0"}]});
    let of = |i: &str| {
        format!("batch.kubernetes.io/job-name=ps,batch.kubernetes.io/job-completion-index{i}")
    };
    let (chief, ps, worker) = (
        format!("--job=chief={}", of("=0")),
        format!("--job=ps={}", of("=1")),
        format!("--job=worker={}", of(" in (2,3)")),
    );
    // One Job holds the three types: each type's count is told (else each would
    // expect the Job's 4 completions).
    let mut args = vec![
        chief.as_str(),
        ps.as_str(),
        worker.as_str(),
        "--wrap",
        "main",
    ];
    args.extend(["--expect=chief=1,ps=1,worker=2"]);
    args.extend(RECIPE);
    let doc = as_json(on.kc, &inject_printed(&plain, &args));
    apply_clean(on.kc, &on.ns, &doc);
    let died = || async { describe_pods(&on.pods()).await };

    let freeze_line = format!("step {FREEZE_AT} ");
    eventually("ps: the chief's step", CORPUS_TIMEOUT, || async {
        (count(&on, "ps", &freeze_line).await >= 1).then_some(())
    })
    .await;
    let pods = live_pods(&on, "ps").await;
    assert_eq!(pods.len(), 4, "{}", died().await);
    assert_eq!(
        timed_events(&on, "Stalled").await,
        vec![],
        "{}",
        died().await
    );
    let names: Vec<String> = pods.iter().map(ResourceExt::name_any).collect();
    let frozen = freeze(&on, &names[3], PYTHON_SCRIPT);
    let at_freeze = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
    assert_eq!(frozen.lines().count(), 1, "ps: one worker frozen: {frozen}");
    let (kind, _, message) = on.job_end_within("ps", CORPUS_TIMEOUT).await;
    assert_eq!(kind, "Complete", "ps: {message}\n{}", died().await);
    let stalled = timed_events(&on, "Stalled").await;
    assert_eq!(stalled.len(), 1, "ps: {stalled:?}");
    let (at, note, pod) = &stalled[0];
    assert_eq!(pod, &names[3], "ps: the frozen worker's pod");
    // exec reads the heartbeat file every --interval (5 s) and at a due stall, and a
    // touch counts from when exec saw it (docs/stall-watch.md, Timing): the stall
    // comes up to one interval later than a printed line's would.
    let late = seconds(&at_freeze, at);
    assert!(
        (STALL_AFTER as f64 - 1.5..=STALL_AFTER as f64 + HEARTBEAT_READ + 4.0).contains(&late),
        "ps: Stalled {late:.1}s after the freeze: {note}"
    );
    // While the job trained (until the chief's last line), only the frozen worker's
    // command restarted. Once the chief has succeeded, the Job controller deletes the
    // other pods (its successPolicy), and their execs may see one another go first.
    let done_at = cmd_output(&on, "ps")
        .await
        .into_iter()
        .find(|(_, line)| line.starts_with("done: "))
        .unwrap()
        .0;
    let restarts = timed_events(&on, "Restarting").await;
    assert_eq!(
        restarts
            .iter()
            .filter(|(t, _, _)| seconds(t, &done_at) > 0.0)
            .map(|(_, _, p)| p.as_str())
            .collect::<Vec<_>>(),
        [names[3].as_str()],
        "ps: only the frozen worker's command restarted: {restarts:?}"
    );
    assert_eq!(
        on.cmd_lines(&names[0], "main")
            .await
            .last()
            .map(String::as_str),
        Some(format!("done: steps={steps}").as_str()),
    );
    on.done().await;
}

/// Steps per run of the faults' job: each fault comes at step [`FAULT_AT`] of its run,
/// and the last run trains to the end.
const FAULT_STEPS: u32 = 30;
/// The step of each run at which its fault comes.
const FAULT_AT: u32 = 10;

/// docs/failure-handling.md's `--on-failure restart` on the corpus' torchrun job
/// (`--nproc-per-node 2` in each of 2 pods), through the three failures of one rank
/// that leave its peers stuck in the next all-reduce, one per run:
/// 1. a worker process of pod 1 `SIGKILL`ed (`kubectl exec`, as a person does it);
/// 2. a Python exception on global rank 3 (pod 1's second worker);
/// 3. global rank 2 (pod 1's first worker) OOM-killed by the kernel, in the
///    container's memory cgroup.
///
/// Each time every pod's command restarts in place, once; no container restarts, no
/// pod is replaced, and the job completes, every rank in the last all-reduce.
#[tokio::test]
async fn torchrun_restarts_in_place_for_a_killed_worker_an_exception_and_an_oom_kill() {
    let py = require!(framework_python());
    let on = require!(corpus_namespace("fault").await);
    let job = "fault";
    let command = ["torchrun", "--nproc-per-node", "2", "/scripts/ddp_train.py"];
    let mut plain = corpus_job(py, job, 2, &command, FAULT_STEPS);
    {
        let main = &mut pod_spec(&mut plain)["containers"][0];
        let env = main["env"].as_array_mut().unwrap();
        env.push(
            json!({"name": "FAULT", "value": format!("2:3:raise@{FAULT_AT},3:2:oom@{FAULT_AT}")}),
        );
        // Room for torchrun and its two workers, not for the third fault's allocation.
        main["resources"]["limits"]["memory"] = json!("1536Mi");
    }
    let flags = [
        "--nproc-per-node=2",
        "--on-failure=restart",
        "--max-restarts=3",
        "--restart-grace=5s",
    ];
    on.inject_and_apply(&plain, &flags, |_| {});
    let died = || async { describe_pods(&on.pods()).await };
    let fault_line = format!("step {FAULT_AT} ");
    let runs_at = |n: usize| {
        let fault_line = fault_line.clone();
        let on = &on;
        async move {
            eventually(
                &format!("{job}: run {n} at step {FAULT_AT}"),
                CORPUS_TIMEOUT,
                || async {
                    assert!(!job_failed(on, job).await, "{job}: the Job failed");
                    (count(on, job, &fault_line).await >= n).then_some(())
                },
            )
            .await
        }
    };
    runs_at(1).await;
    let pods = live_pods(&on, job).await;
    assert_eq!(pods.len(), 2, "{}", died().await);
    let names: Vec<String> = pods.iter().map(ResourceExt::name_any).collect();
    // 1. A worker of pod 1 SIGKILLed.
    let script = format!(
        "for p in /proc/[0-9]*; do if {TORCH_WORKER}; then kill -KILL \"${{p#/proc/}}\" && echo \"${{p#/proc/}}\"; fi; done"
    );
    let killed = kubectl_on(
        on.kc,
        &[
            "exec", "-n", &on.ns, &names[1], "-c", "main", "--", "sh", "-c", &script,
        ],
    );
    assert_eq!(
        killed.lines().count(),
        1,
        "{job}: one worker killed: {killed}"
    );
    // 2. and 3. come in the next runs by themselves.
    let (kind, _, message) = on.job_end_within(job, CORPUS_TIMEOUT).await;
    assert_eq!(kind, "Complete", "{job}: {message}\n{}", died().await);

    let after = job_pods(&on.client, &on.ns, job).await;
    let mut seen: Vec<String> = after.iter().map(ResourceExt::name_any).collect();
    seen.sort();
    assert_eq!(seen, names, "{job}: no pod replaced");
    for p in &after {
        let s = p.status.as_ref().unwrap();
        let restarted: Vec<(String, i32)> = s
            .container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .map(|c| (c.name.clone(), c.restart_count))
            .filter(|(_, n)| *n != 0)
            .collect();
        assert_eq!(
            restarted,
            vec![],
            "{job}: {}: no container restarted",
            p.name_any()
        );
    }
    let restarts = timed_events(&on, "Restarting").await;
    let of = |pod: &str| restarts.iter().filter(|(_, _, p)| p == pod).count();
    assert_eq!(
        (of(&names[0]), of(&names[1])),
        (3, 3),
        "{job}: every pod's command restarted once per fault: {restarts:#?}"
    );
    // Every pod's notes name pod 1's failures, in order: the root cause where the
    // failed worker wrote one (the exception, through `@record`); a worker killed by a
    // signal leaves none.
    let notes = |pod: &str| -> Vec<String> {
        restarts
            .iter()
            .filter(|(_, _, p)| p == pod)
            .map(|(_, note, _)| note.clone())
            .collect()
    };
    let failed = |k: u32, backoff: &str, cause: &str| {
        format!(
            "restarting torchrun ({k} of 3) in {backoff}: pod {} (worker/1, rank 1) failed: torchrun exited with code 1{cause}",
            names[1]
        )
    };
    let expected = [
        failed(1, "1s", ""),
        failed(
            2,
            "2s",
            &format!("; root cause: RuntimeError: injected fault at step {FAULT_AT}"),
        ),
        failed(3, "4s", ""),
    ];
    assert_eq!(notes(&names[1]), expected, "{job}: pod 1");
    assert_eq!(notes(&names[0]), expected, "{job}: pod 0");
    // The kernel's kill, once: not again when the container ends and containerd says
    // `OOMKilled` of it (exit code 0).
    let kills = timed_events(&on, "OOMKill").await;
    assert_eq!(kills.len(), 1, "{job}: {kills:#?}");
    let (_, note, pod) = &kills[0];
    assert!(
        note.starts_with("process python (pid ")
            && note.ends_with(") in container main was OOM-killed; memory limit 1536Mi")
            && *pod == names[1],
        "{job}: {kills:#?}"
    );
    let out = cmd_output(&on, job).await;
    let last_run = out
        .iter()
        .rposition(|(_, line)| line.starts_with("training: "))
        .unwrap();
    assert_eq!(
        out[last_run..].last().map(|(_, l)| l.as_str()),
        Some("done: world=4 sum=4"),
        "{job}: {:?}",
        &out[last_run..]
    );
    assert_eq!(
        out.iter()
            .filter(|(_, l)| l.starts_with("training: "))
            .count(),
        4
    );
    on.done().await;
}
