//! The stall rule's scopes ([`Scope`]), transition by transition: the job's
//! silence (the default), each pod's, and the asynchronous jobs' (`ps`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::progress::*;
use super::rule::*;
use super::watching::*;

fn t(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000) + Duration::from_millis(ms)
}

const AFTER: Duration = Duration::from_secs(3);

fn view(scope: Scope, speaks_for_job: bool, peer_ms: Option<u64>) -> JobView {
    JobView {
        scope,
        speaks_for_job,
        peer_progress: peer_ms.map(t),
    }
}

fn line(p: &mut Progress, text: &str, at_ms: u64) {
    p.on_line(&Pattern::default(), text.as_bytes(), t(at_ms));
}

/// The issue's two pods under `--stall-after 3s`: pod 1 prints torchrun's start-up
/// warning 200 ms after its start and then nothing, while rank 0 prints `step N` every
/// 0.5 s. Job-wide, pod 1 is silent, never stalled, and nothing is due for it; per
/// pod (what the rule said for every job before) it is stalled 3 s after its warning.
#[test]
fn job_wide_a_pod_quiet_after_a_start_up_warning_is_silent_while_rank_0_progresses() {
    let mut pod1 = StallWatch::new(AFTER, t(0));
    let mut p = Progress::default();
    line(
        &mut p,
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",
        200,
    );
    assert_eq!(pod1.due(&p), Some(t(3_200)));
    // Rank 0's last published step, as the peers' progress.
    for (now, rank0) in [(3_200, 3_000), (5_000, 4_500), (10_000, 9_500)] {
        let job = view(Scope::Job, false, Some(rank0));
        assert_eq!(pod1.check(&p, job, t(now)), None, "at {now} ms");
        assert_eq!(pod1.standing, Standing::Silent);
        assert!(pod1.silent() && !pod1.stalled());
        assert_eq!(pod1.due(&p), None, "a pod that does not speak for the job");
    }
    assert_eq!(pod1.stalls, 0);
    // Rank 0 stopped at 9.5 s: the job's stall, which rank 0 tells, never pod 1.
    let job = view(Scope::Job, false, Some(9_500));
    assert_eq!(pod1.check(&p, job, t(60_000)), None);
    assert_eq!(pod1.standing, Standing::Silent);

    // Per pod, the same pod is stalled 3 s after its warning.
    let mut per_pod = StallWatch::new(AFTER, t(0));
    let job = view(Scope::Pod, false, Some(3_000));
    assert_eq!(per_pod.check(&p, job, t(3_199)), None);
    assert_eq!(per_pod.standing, Standing::Progressing);
    assert_eq!(
        per_pod.check(&p, job, t(3_200)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Own
        })
    );
    assert_eq!(per_pod.anchor(&p), t(200));
}

/// Rank 0 while the job progresses: its own steps, then a peer's progress alone keeps
/// the job alive (rank 0 quiet, another rank printing: a pipeline's last stage logs).
#[test]
fn job_wide_rank_0_is_never_stalled_while_another_pod_progresses() {
    let mut rank0 = StallWatch::new(AFTER, t(0));
    let mut p = Progress::default();
    line(&mut p, "step 1", 500);
    let job = |peer| view(Scope::Job, true, peer);
    assert_eq!(rank0.check(&p, job(Some(200)), t(3_499)), None);
    assert_eq!(rank0.standing, Standing::Progressing);
    // Its own last line 3 s ago, a peer's 1 s ago: silent, not stalled.
    assert_eq!(rank0.check(&p, job(Some(2_500)), t(3_500)), None);
    assert_eq!(rank0.standing, Standing::Silent);
    assert_eq!(rank0.anchor(&p), t(2_500));
    // Due when the job's silence reaches 3 s, as the last check saw it.
    assert_eq!(rank0.due(&p), Some(t(5_500)));
    assert_eq!(rank0.check(&p, job(Some(5_000)), t(5_500)), None);
    assert_eq!(rank0.due(&p), Some(t(8_000)));
    assert_eq!(rank0.standing, Standing::Silent);
}

/// Every rank hangs (rank 0's last step at 4 s, pod 1's warning at 0.2 s): rank 0's
/// own stall 3 s after its last step, once; pod 1 silent throughout. A peer's
/// progress from before this run of CMD counts for nothing.
#[test]
fn job_wide_a_hang_of_every_rank_is_one_stall_told_by_rank_0() {
    let mut rank0 = StallWatch::new(AFTER, t(0));
    let mut pod1 = StallWatch::new(AFTER, t(0));
    let (mut p0, mut p1) = (Progress::default(), Progress::default());
    line(&mut p0, "step 8", 4_000);
    line(&mut p1, "warning", 200);
    let as_rank0 = view(Scope::Job, true, Some(200));
    let as_pod1 = view(Scope::Job, false, Some(4_000));
    assert_eq!(rank0.due(&p0), Some(t(7_000)));
    assert_eq!(rank0.check(&p0, as_rank0, t(6_999)), None);
    assert_eq!(pod1.check(&p1, as_pod1, t(6_999)), None);
    assert_eq!(
        rank0.check(&p0, as_rank0, t(7_000)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Own
        })
    );
    assert_eq!(rank0.anchor(&p0), t(4_000));
    assert_eq!(rank0.due(&p0), None);
    assert_eq!(rank0.check(&p0, as_rank0, t(20_000)), None);
    assert_eq!(rank0.stalls, 1);
    for now in [7_000, 20_000, 3_600_000] {
        assert_eq!(pod1.check(&p1, as_pod1, t(now)), None);
        assert_eq!(pod1.standing, Standing::Silent);
    }
    // The group restarted at 21 s: both runs silent since; the steps before are
    // another run's. Rank 0 tells the job's stall 3 s after the restart.
    rank0.restart(t(21_000));
    let stale = view(Scope::Job, true, Some(4_000));
    assert_eq!(rank0.check(&p0, stale, t(23_999)), None);
    assert_eq!(rank0.standing, Standing::Silent);
    assert_eq!(
        rank0.check(&p0, stale, t(24_000)),
        Some(Transition::Stalled {
            n: 2,
            kind: StallKind::Job
        })
    );
    assert_eq!(rank0.anchor(&p0), t(21_000));
}

/// The job's last progress was another pod's: rank 0 tells the job's stall from it,
/// and a later step of that pod ends it.
#[test]
fn job_wide_rank_0_tells_the_jobs_stall_from_another_pods_last_progress() {
    let mut rank0 = StallWatch::new(AFTER, t(0));
    let mut p = Progress::default();
    line(&mut p, "warning", 100);
    let job = |peer| view(Scope::Job, true, Some(peer));
    assert_eq!(rank0.check(&p, job(5_000), t(7_999)), None);
    assert_eq!(
        rank0.check(&p, job(5_000), t(8_000)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Job
        })
    );
    assert_eq!(rank0.anchor(&p), t(5_000));
    assert!(rank0.silent());
    assert_eq!(
        rank0.check(&p, job(9_000), t(9_500)),
        Some(Transition::Resumed)
    );
    assert_eq!(rank0.standing, Standing::Silent);
}

/// The rule alone, both scopes on the same moments: a pod quiet 3 s after its last
/// line while a peer progressed 1 s ago.
#[test]
fn the_scopes_differ_only_for_a_pod_quiet_while_the_job_goes_on() {
    let after = AFTER;
    let judged = |scope, speaks, last: Option<u64>, peer: Option<u64>, now| {
        judge(t(0), last.map(t), after, view(scope, speaks, peer), t(now))
    };
    for speaks in [false, true] {
        assert_eq!(
            judged(Scope::Job, speaks, Some(1_000), Some(3_000), 4_000),
            Standing::Silent
        );
        assert_eq!(
            judged(Scope::Pod, speaks, Some(1_000), Some(3_000), 4_000),
            Standing::Stalled(StallKind::Own)
        );
        // Progressing within the window, either scope.
        for scope in [Scope::Job, Scope::Pod] {
            assert_eq!(
                judged(scope, speaks, Some(1_001), Some(3_000), 4_000),
                Standing::Progressing
            );
        }
    }
    // Nothing since the start for 3 s: the job's stall, told by rank 0, either scope.
    for scope in [Scope::Job, Scope::Pod] {
        assert_eq!(
            judged(scope, true, None, None, 3_000),
            Standing::Stalled(StallKind::Job)
        );
        assert_eq!(judged(scope, false, None, None, 3_000), Standing::Silent);
    }
}

/// `auto`: asynchronous when the cluster has TensorFlow's parameter servers, else the
/// job.
#[test]
fn auto_is_asynchronous_with_parameter_servers_only() {
    assert_eq!(Scope::of(&["chief", "ps", "worker"]), Scope::Async);
    assert_eq!(Scope::of(&["ps"]), Scope::Async);
    assert_eq!(Scope::of(&["worker"]), Scope::Job);
    assert_eq!(Scope::of(&["master", "worker"]), Scope::Job);
    assert_eq!(Scope::of(&["chief", "worker", "evaluator"]), Scope::Job);
    assert_eq!(Scope::of(&[]), Scope::Job);
}

/// exec's watch decides `auto` from `cluster.json`: worker 1 of a job with a `ps`
/// type, quiet 3 s after its heartbeat while a peer progressed, is stalled (per pod:
/// a signal), and silent after a plain line; the same worker without `ps` is silent
/// (job-wide) either way, and so it is with `--stall-scope job` whatever the cluster;
/// `--stall-scope pod` counts any line.
#[test]
fn exec_decides_auto_from_the_cluster_file() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = |types: &str| {
        let path = dir.path().join(format!("{}.json", types.replace(',', "-")));
        let spec: Vec<String> = types
            .split(',')
            .map(|k| format!("\"{k}\":[\"10.0.0.1:1\",\"10.0.0.2:1\"]"))
            .collect();
        let text = format!(
            r#"{{"cluster":{{{}}},"task":{{"type":"worker","index":1}},"master":"","peers":[],"ranks":["worker/0","worker/1"],"rank":1,"resolved_at":"","waited_seconds":0}}"#,
            spec.join(",")
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let stalled_at = |scope: Option<Scope>, types: &str, beat: bool| {
        let cfg = WatchConfig {
            stall_after: Some(AFTER),
            pattern: Pattern::default(),
            heartbeat: None,
            scope,
        };
        let mut w = Watching::new(&cfg, Some(&cluster(types)), t(0));
        let mut p = Progress::default();
        line(&mut p, "step 1", 1_000);
        if beat {
            p.on_heartbeat(t(1_000));
        }
        w.check(&p, Some(t(3_500)), t(4_000), Vec::new)
    };
    let own = Some(News::Stalled {
        n: 1,
        note: "no progress for 3s; last output \"step 1\"".into(),
    });
    assert_eq!(stalled_at(None, "ps,worker", true), own);
    assert_eq!(stalled_at(None, "ps,worker", false), None);
    assert_eq!(stalled_at(None, "worker", true), None);
    assert_eq!(stalled_at(Some(Scope::Job), "ps,worker", true), None);
    assert_eq!(stalled_at(Some(Scope::Pod), "worker", false), own);
}

/// With parameter servers (`auto`): a parameter server prints TensorFlow's start-up
/// line and then serves in silence while the chief logs and the workers beat; it is
/// silent, never stalled, and nothing is due for it.
#[test]
fn async_a_parameter_server_quiet_after_its_start_up_line_is_silent() {
    let mut ps = StallWatch::new(AFTER, t(0));
    let mut p = Progress::default();
    line(&mut p, "oneDNN custom operations are on.", 400);
    for (now, peer) in [(3_400, 3_000), (10_000, 9_800), (60_000, 59_500)] {
        let job = view(Scope::Async, false, Some(peer));
        assert_eq!(ps.check(&p, job, t(now)), None, "at {now} ms");
        assert_eq!(ps.standing, Standing::Silent);
        assert_eq!(ps.due(&p), None);
    }
    assert_eq!(ps.stalls, 0);
}

/// A worker whose heartbeat stops while the others train on is stalled alone, at its
/// last heartbeat plus `--stall-after`.
#[test]
fn async_a_worker_whose_heartbeat_stops_is_stalled_alone() {
    let mut worker = StallWatch::new(AFTER, t(0));
    let mut p = Progress::default();
    line(&mut p, "oneDNN custom operations are on.", 400);
    for at in [1_000, 2_000, 3_000] {
        p.on_heartbeat(t(at));
    }
    let job = view(Scope::Async, false, Some(5_900));
    assert_eq!(worker.due(&p), Some(t(6_000)));
    assert_eq!(worker.check(&p, job, t(5_999)), None);
    assert_eq!(worker.standing, Standing::Progressing);
    assert_eq!(
        worker.check(&p, job, t(6_000)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Own
        })
    );
}

/// A matching line of `--progress-pattern` is a signal too; a line without a pattern
/// is not, and the chief that only prints speaks for the job by the job's rule: not
/// stalled while a worker beats, stalled once nothing of the job moves.
#[test]
fn async_a_matching_line_is_a_signal_and_a_plain_one_follows_the_jobs_rule() {
    let pattern = Pattern::new(Some(r"step (\d+)")).unwrap();
    let mut p = Progress::default();
    p.on_line(&pattern, b"step 7", t(1_000));
    assert_eq!(p.signalled, Some(t(1_000)));
    let mut worker = StallWatch::new(AFTER, t(0));
    let job = view(Scope::Async, false, Some(3_900));
    assert_eq!(
        worker.check(&p, job, t(4_000)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Own
        })
    );

    let mut chief = StallWatch::new(AFTER, t(0));
    let mut c = Progress::default();
    line(&mut c, "step 3 scheduled", 1_000);
    assert_eq!(c.signalled, None);
    let beating = view(Scope::Async, true, Some(3_900));
    assert_eq!(chief.check(&c, beating, t(4_000)), None);
    assert_eq!(chief.standing, Standing::Silent);
    assert_eq!(chief.due(&c), Some(t(6_900)));
    let quiet = view(Scope::Async, true, Some(3_900));
    assert_eq!(
        chief.check(&c, quiet, t(6_900)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Job
        })
    );
}

/// A peer's stall restarts this pod's CMD job-wide and per pod (the group forms
/// again), never with parameter servers: the chief and the other workers train on
/// while the hung worker restarts alone.
#[test]
fn with_parameter_servers_a_peers_stall_restarts_nothing_here() {
    let peer = [super::peers::PeerStall {
        pod: "ps-3".into(),
        since: t(5_000),
        ongoing: true,
    }];
    let act = |scope: Scope| {
        let cfg = WatchConfig {
            stall_after: Some(AFTER),
            pattern: Pattern::default(),
            heartbeat: None,
            scope: Some(scope),
        };
        let w = Watching::new(&cfg, None, t(0));
        w.to_act_on(|| unreachable!(), &peer, Some("ps-0"))
    };
    let restart = Some("pod ps-3 made no progress since 2027-01-15T08:00:05Z".to_string());
    assert_eq!(act(Scope::Job), restart);
    assert_eq!(act(Scope::Pod), restart);
    assert_eq!(act(Scope::Async), None);
}
