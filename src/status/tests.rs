use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use serde_json::json;

use super::*;

fn pod(name: &str, phase: &str, annotations: serde_json::Value, extra: serde_json::Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "annotations": annotations},
        "status": {"phase": phase, "podIP": format!("10.0.0.{}", name.len())}
    });
    if let Some(status) = extra.get("status") {
        for (k, v) in status.as_object().unwrap() {
            p["status"][k] = v.clone();
        }
    }
    serde_json::from_value(p).unwrap()
}

const TODAY: &str = "2026-11-23";

fn event(pod: &str, reason: &str, time: &str) -> Event {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{pod}.{reason}")},
        "eventTime": time,
        "reason": reason,
        "regarding": {"kind": "Pod", "name": pod},
        "reportingController": "trainlet",
        "reportingInstance": "x",
        "action": "Report"
    }))
    .unwrap()
}

fn healthy(task: &str) -> serde_json::Value {
    json!({
        "trainlet.io/task": task,
        "trainlet.io/health": "ok",
        "trainlet.io/cluster": "current",
        "trainlet.io/report": json!({
            "health": "ok", "reasons": [],
            "gpu": {"count": 4, "expected": {"count": 4, "source": "limit"}, "status": "ok"},
            "oom": {"kills": 0, "recent": []}
        }).to_string()
    })
}

#[test]
fn a_pod_row_takes_what_the_agents_published() {
    let report = json!({
        "health": "degraded",
        "reasons": ["2 of 4 GPUs visible"],
        "gpu": {"count": 2, "expected": {"count": 4, "source": "limit"}, "status": "mismatch"},
        "oom": {"kills": 1, "recent": [
            {"time": "2026-11-23T12:00:01Z", "container": "trainer", "source": "cgroup"},
            {"time": "2026-11-23T12:03:04Z", "container": "trainer", "source": "cgroup",
             "process": {"pid": 812, "comm": "python", "rss_bytes": 1}}
        ]},
        "exec": {"epoch": "e", "kills": 1, "restarts": 2}
    });
    let p = pod(
        "w-1",
        "Running",
        json!({
            "trainlet.io/task": "worker/1",
            "trainlet.io/health": "degraded",
            "trainlet.io/cluster": "stale: worker/0 10.0.0.7 → 10.0.0.19",
            "trainlet.io/report": report.to_string(),
            "trainlet.io/progress": r#"{"at":"2026-11-23T12:04:00Z","step":41.0,"stalled":false,"since":"2026-11-23T11:00:00.250Z","stalls":1,"percent":45,"eta_seconds":795}"#
        }),
        json!({"status": {"containerStatuses": [
            {"name": "trainer", "image": "x", "imageID": "", "ready": true, "restartCount": 1}
        ]}}),
    );
    let events = [
        event("w-1", "PeersResolved", "2026-11-23T11:00:00.000000Z"),
        event("w-1", "GPUCountMismatch", "2026-11-23T12:00:00.000000Z"),
        event("w-0", "OOMKill", "2026-11-23T13:00:00.000000Z"),
    ];
    assert_eq!(
        row(&p, &events, "2026-11-23"),
        PodRow {
            task: "worker/1".into(),
            pod: "w-1".into(),
            ip: "10.0.0.3".into(),
            phase: "Running".into(),
            health: "degraded".into(),
            reasons: vec!["2 of 4 GPUs visible".into()],
            gpus: "2/4".into(),
            cluster: "stale: worker/0 10.0.0.7 → 10.0.0.19".into(),
            restarts: 3,
            last_oom: "python (pid 812) in trainer at 12:03:04Z".into(),
            progress: "45%, step 41 at 12:04:00Z".into(),
            eta: "13m15s".into(),
            stalled: false,
            stuck_at: vec![],
            last_event: "GPUCountMismatch".into(),
        }
    );
}

/// What another pod published is shown within bounds: restarts past 2^32 add up
/// without wrapping, and a step that is no count (negative, 309 digits) is no step.
#[test]
fn restart_counts_do_not_wrap_and_odd_steps_are_not_shown() {
    let p = pod(
        "w-1",
        "Running",
        json!({
            "trainlet.io/report": json!({"exec": {"epoch": "e", "restarts": u32::MAX}}).to_string(),
            "trainlet.io/progress": r#"{"at":"2026-11-23T12:04:00Z","step":-5.0,"stalled":false,"stalls":0}"#
        }),
        json!({"status": {"containerStatuses": [
            {"name": "trainer", "image": "x", "imageID": "", "ready": true, "restartCount": 1}
        ]}}),
    );
    let r = row(&p, &[], "2026-11-23");
    assert_eq!(r.restarts, 1 << 32);
    assert_eq!(r.progress, "output at 12:04:00Z");
    assert_eq!(
        progress(
            &serde_json::from_str(
                r#"{"step":1e308,"stalled":true,"since":"2026-11-23T12:00:00.500Z"}"#
            )
            .unwrap(),
            "2026-11-23"
        ),
        "stalled since 12:00:00Z"
    );
    // A rank that never prints is silent, not stalled: so the column says.
    assert_eq!(
        progress(
            &serde_json::from_str(r#"{"stalled":false,"silent":true,"stalls":0}"#).unwrap(),
            "2026-11-23"
        ),
        "silent"
    );
}

#[test]
fn rows_follow_the_tasks_in_natural_order_and_pods_without_a_task_come_last() {
    let pods = [
        pod("w-10", "Running", healthy("worker/10"), json!({})),
        pod("z", "Pending", json!({}), json!({})),
        pod("w-2", "Running", healthy("worker/2"), json!({})),
        pod("ps-0", "Running", healthy("ps/0"), json!({})),
    ];
    let v = view("Job mnist", None, &pods, &[], TODAY);
    let order: Vec<&str> = v.pods.iter().map(|r| r.pod.as_str()).collect();
    assert_eq!(order, ["ps-0", "w-2", "w-10", "z"]);
}

#[test]
fn the_verdict_is_the_worst_state_and_names_the_pods() {
    let ok = |n: &str| pod(n, "Running", healthy("worker/0"), json!({}));
    assert_eq!(
        view("Job mnist", None, &[ok("w-0"), ok("w-1")], &[], TODAY).verdict,
        "Job mnist: healthy: 2 pods running, cluster current"
    );
    let pending = pod(
        "w-1",
        "Pending",
        json!({}),
        json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}),
    );
    let v = view("Job mnist", None, &[ok("w-0"), pending.clone()], &[], TODAY);
    assert_eq!(v.state, State::Starting);
    assert_eq!(
        v.verdict,
        "Job mnist: starting: 1 of 2 pods running; waiting for w-1 Pending (Unschedulable)"
    );
    let mut stale = healthy("worker/1");
    stale["trainlet.io/cluster"] = json!("stale: worker/0 lost");
    let v = view(
        "Job mnist",
        None,
        &[ok("w-0"), pod("w-1", "Running", stale, json!({})), pending],
        &[],
        TODAY,
    );
    assert_eq!(v.state, State::Degraded);
    assert_eq!(
        v.verdict,
        "Job mnist: degraded: w-1 (cluster stale: worker/0 lost)"
    );
    let mut stalled = healthy("worker/1");
    stalled["trainlet.io/progress"] = json!(
        r#"{"at":"2026-11-23T12:00:00Z","step":7.0,"stalled":true,"since":"2026-11-23T12:00:00.500Z","stalls":1}"#
    );
    let v = view(
        "Job mnist",
        None,
        &[ok("w-0"), pod("w-1", "Running", stalled, json!({}))],
        &[],
        TODAY,
    );
    assert_eq!(
        (v.state, v.verdict.as_str()),
        (
            State::Degraded,
            "Job mnist: degraded: w-1 (stalled since 12:00:00Z (step 7))"
        )
    );
    let failed = pod(
        "w-0",
        "Failed",
        json!({}),
        json!({"status": {"containerStatuses": [{"name": "t", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}),
    );
    let v = view("Job mnist", None, &[failed, ok("w-1")], &[], TODAY);
    assert_eq!(
        (v.state, v.verdict.as_str()),
        (
            State::Failing,
            "Job mnist: failing: 1 of 2 pods failed: w-0 Failed (OOMKilled)"
        )
    );
    let in_init = pod(
        "w-1",
        "Pending",
        json!({}),
        json!({"status": {"initContainerStatuses": [
            {"name": "trainlet-init", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "started": false, "state": {"running": {}}},
            {"name": "trainlet", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "started": false, "state": {"waiting": {"reason": "PodInitializing"}}}
        ]}}),
    );
    assert_eq!(
        view("Job mnist", None, &[ok("w-0"), in_init], &[], TODAY).verdict,
        "Job mnist: starting: 1 of 2 pods running; waiting for w-1 Pending (in trainlet-init)"
    );
    let done = |n: &str| pod(n, "Succeeded", json!({}), json!({}));
    assert_eq!(
        view("JobSet j", None, &[done("a"), done("b")], &[], TODAY).verdict,
        "JobSet j: completed: 2 pods succeeded"
    );
    assert_eq!(
        view("Job gone", None, &[], &[], TODAY),
        View {
            state: State::Empty,
            verdict: "Job gone: no pods match".into(),
            stuck_at: None,
            pods: vec![]
        }
    );
}

#[test]
fn the_table_aligns_its_columns_and_dashes_what_is_unknown() {
    let pods = [
        pod("w-0", "Running", healthy("worker/0"), json!({})),
        pod("w-1", "Pending", json!({}), json!({})),
    ];
    let events = [event("w-0", "PeersResolved", "2026-11-23T11:00:00.000000Z")];
    assert_eq!(
        table(&view("Job mnist", None, &pods, &events, TODAY)),
        "\
TASK       POD   IP         PHASE     HEALTH   GPUS   CLUSTER   RESTARTS   PROGRESS   ETA   LAST OOM   LAST EVENT
worker/0   w-0   10.0.0.3   Running   ok       4/4    current   0          -          -     -          PeersResolved
-          w-1   10.0.0.3   Pending   -        -      -         0          -          -     -          -
Job mnist: starting: 1 of 2 pods running; waiting for w-1 Pending
"
    );
}

#[test]
fn targets_try_a_job_then_a_jobset() {
    assert_eq!(
        Target::Either("mnist".into()).lookup(),
        Lookup::Named {
            name: "mnist".into(),
            kinds: vec![Kind::Job, Kind::JobSet]
        }
    );
    assert_eq!(
        Kind::Job.selector("mnist"),
        "batch.kubernetes.io/job-name=mnist"
    );
    assert_eq!(
        Kind::JobSet.selector("mnist"),
        "jobset.sigs.k8s.io/jobset-name=mnist"
    );
    assert_eq!(
        Target::Selectors(vec!["app=a".into(), "app=b".into()]).lookup(),
        Lookup::Pods {
            what: "pods of app=a; app=b".into(),
            selectors: vec!["app=a".into(), "app=b".into()]
        }
    );
}

fn job(extra: serde_json::Value) -> serde_json::Value {
    let mut j = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "mnist", "labels": {}},
        "spec": {"suspend": false},
        "status": {}
    });
    for (k, v) in extra.as_object().unwrap() {
        for (k2, v2) in v.as_object().unwrap() {
            j[k][k2] = v2.clone();
        }
    }
    j
}

#[test]
fn a_suspended_job_is_not_admitted() {
    let queued = Owner::of(
        Kind::Job,
        &job(json!({
            "spec": {"suspend": true},
            "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}}
        })),
    );
    assert_eq!(
        queued,
        Owner {
            what: "Job mnist".into(),
            suspended: true,
            queue: "gpu-queue".into(),
            complete: false,
            failed: None,
        }
    );
    let v = view("", Some(&queued), &[], &[], TODAY);
    assert_eq!(
        (v.state, v.verdict.as_str()),
        (
            State::NotAdmitted,
            "Job mnist: not admitted: suspended in Kueue queue gpu-queue (spec.suspend: true)"
        )
    );
    // Suspended by hand, with a pod still terminating.
    let suspended = Owner::of(Kind::JobSet, &job(json!({"spec": {"suspend": true}})));
    let v = view(
        "",
        Some(&suspended),
        &[pod("w-0", "Running", healthy("worker/0"), json!({}))],
        &[],
        TODAY,
    );
    assert_eq!(
        (v.state, v.verdict.as_str()),
        (
            State::NotAdmitted,
            "JobSet mnist: not admitted: suspended (spec.suspend: true); 1 pod left"
        )
    );
    assert_eq!(serde_json::to_value(v.state).unwrap(), "not_admitted");
}

#[test]
fn a_running_job_is_judged_by_its_pods_and_a_finished_one_by_its_conditions() {
    let running = Owner::of(Kind::Job, &job(json!({})));
    let ok = pod("w-0", "Running", healthy("worker/0"), json!({}));
    assert_eq!(
        view("", Some(&running), std::slice::from_ref(&ok), &[], TODAY).verdict,
        "Job mnist: healthy: 1 pods running, cluster current"
    );
    assert_eq!(
        view("", Some(&running), &[], &[], TODAY).verdict,
        "Job mnist: no pods match"
    );
    let failed = Owner::of(
        Kind::Job,
        &job(json!({"status": {"conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}
        ]}})),
    );
    assert_eq!(
        view("", Some(&failed), &[], &[], TODAY),
        View {
            state: State::Failing,
            verdict: "Job mnist: failing: failed: BackoffLimitExceeded: Job has reached the specified backoff limit".into(),
            stuck_at: None,
            pods: vec![]
        }
    );
    let complete = Owner::of(
        Kind::JobSet,
        &job(json!({"status": {"conditions": [
            {"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}
        ]}})),
    );
    assert_eq!(
        (view("", Some(&complete), &[], &[], TODAY).verdict),
        "JobSet mnist: completed"
    );
    // Complete, with its pods there and succeeded (the README's quickstart): they say so.
    let done = [
        pod("w-0", "Succeeded", healthy("worker/0"), json!({})),
        pod("w-1", "Succeeded", healthy("worker/1"), json!({})),
    ];
    assert_eq!(
        view("", Some(&complete), &done, &[], TODAY).verdict,
        "JobSet mnist: completed: 2 pods succeeded"
    );
    // A condition that is not True says nothing.
    let not_yet = Owner::of(
        Kind::Job,
        &job(json!({"status": {"conditions": [{"type": "Failed", "status": "False"}]}})),
    );
    assert_eq!(not_yet, running);
}

#[test]
fn a_missing_job_is_one_line_that_names_what_to_check() {
    assert_eq!(
        not_found("mnist", &[Kind::Job, Kind::JobSet], "ml"),
        "no Job or JobSet \"mnist\" in namespace \"ml\": check the name and --namespace"
    );
    assert_eq!(
        not_found("mnist", &[Kind::JobSet], "ml"),
        "no JobSet \"mnist\" in namespace \"ml\": check the name and --namespace"
    );
}

#[test]
fn only_the_newest_event_of_each_of_the_jobs_pods_is_kept() {
    let pods = [
        pod("w-0", "Running", json!({}), json!({})),
        pod("w-1", "Running", json!({}), json!({})),
    ];
    let mut newest = NewestEvents::new(&pods);
    let mut of_old_pod = event("w-1", "OldPod", "2026-11-23T14:00:00.000000Z");
    of_old_pod.regarding.as_mut().unwrap().uid = Some("uid-of-an-earlier-w-1".into());
    let mut of_this_pod = event("w-1", "Pulled", "2026-11-23T10:00:00.000000Z");
    of_this_pod.regarding.as_mut().unwrap().uid = Some("uid-w-1".into());
    let mut of_a_job = event("w-0", "Completed", "2026-11-23T15:00:00.000000Z");
    of_a_job.regarding.as_mut().unwrap().kind = Some("Job".into());
    for e in [
        event("w-0", "Started", "2026-11-23T11:00:00.000000Z"),
        event("w-0", "PeersResolved", "2026-11-23T12:00:00.000000Z"),
        event("w-0", "Pulled", "2026-11-23T09:00:00.000000Z"),
        event("other-0", "OOMKill", "2026-11-23T13:00:00.000000Z"),
        of_old_pod,
        of_this_pod,
        of_a_job,
    ] {
        newest.add(e);
    }
    let kept: Vec<(String, String)> = newest
        .into_events()
        .into_iter()
        .map(|e| (e.regarding.unwrap().name.unwrap(), e.reason.unwrap()))
        .collect();
    assert_eq!(
        kept,
        [
            ("w-0".to_string(), "PeersResolved".to_string()),
            ("w-1".to_string(), "Pulled".to_string())
        ]
    );
}

#[test]
fn control_characters_are_escaped() {
    assert_eq!(
        escape("a\x1b]8;;http://x\x07b\r\nc\td\x7f\u{9b}31m\u{202e}é✓"),
        "a\\e]8;;http://x\\u{7}b\\r\\nc\\td\\u{7f}\\u{9b}31m\\u{202e}é✓"
    );
    assert_eq!(escape("plain text: 2 of 4 GPUs"), "plain text: 2 of 4 GPUs");
}

/// A report reason with a carriage return and an ANSI erase used to rewrite the
/// degraded verdict, on a terminal, into a healthy-looking line.
#[test]
fn a_reason_cannot_make_a_degraded_verdict_look_healthy() {
    let mut a = healthy("worker/0");
    a["trainlet.io/health"] = json!("degraded");
    a["trainlet.io/report"] = json!(
        json!({
            "health": "degraded",
            "reasons": ["x\r\x1b[2KJob mnist: healthy: 1 pods running"]
        })
        .to_string()
    );
    let v = view(
        "Job mnist",
        None,
        &[pod("w-0", "Running", a, json!({}))],
        &[],
        TODAY,
    );
    assert_eq!(
        v.verdict,
        "Job mnist: degraded: w-0 (x\\r\\e[2KJob mnist: healthy: 1 pods running)"
    );
    assert!(!table(&v).chars().any(|c| c.is_control() && c != '\n'));
}

#[test]
fn cells_are_bounded() {
    assert_eq!(bound("abcdef", 4), "abc…");
    assert_eq!(bound("abcd", 4), "abcd");
    assert_eq!(bound("ééééé", 3), "éé…");
    assert_eq!(cell(&"x".repeat(CELL_MAX)), "x".repeat(CELL_MAX));
    assert_eq!(
        cell(&"x".repeat(CELL_MAX + 1)),
        format!("{}…", "x".repeat(CELL_MAX - 1))
    );
    // Escaping can lengthen a text; the bound applies after it.
    assert_eq!(cell(&"\r".repeat(CELL_MAX)).chars().count(), CELL_MAX);
    assert_eq!(
        cell(&"é".repeat(CELL_MAX + 5)),
        format!("{}…", "é".repeat(CELL_MAX - 1))
    );
}

/// An Event reason of 65,536 characters (the API server takes it) made the table panic
/// with `Formatting argument out of range`.
#[test]
fn a_65536_character_event_reason_does_not_panic_and_is_cut() {
    let long = "R".repeat(65_536);
    let pods = [pod("w-0", "Running", healthy("worker/0"), json!({}))];
    let events = [event("w-0", &long, "2026-11-23T11:00:00.000000Z")];
    let v = view("Job mnist", None, &pods, &events, TODAY);
    assert_eq!(
        v.pods[0].last_event,
        format!("{}…", "R".repeat(CELL_MAX - 1))
    );
    let t = table(&v);
    assert_eq!(t.lines().count(), 3);
    assert!(
        t.lines()
            .nth(1)
            .unwrap()
            .ends_with(&format!("{}…", "R".repeat(CELL_MAX - 1)))
    );
}

/// 2,000 pods with a 65,535-character annotation each printed 131 MB; every cell and
/// the verdict are bounded now.
#[test]
fn the_output_of_many_pods_with_huge_annotations_is_bounded() {
    let huge = "y".repeat(65_535);
    let pods: Vec<Pod> = (0..2000)
        .map(|i| {
            let mut a = healthy(&format!("worker/{i}"));
            a["trainlet.io/health"] = json!("degraded");
            a["trainlet.io/cluster"] = json!(huge.clone());
            a["trainlet.io/report"] = json!(
                json!({
                    "health": "degraded",
                    "reasons": vec!["z".repeat(300); 20]
                })
                .to_string()
            );
            pod(&format!("w-{i}"), "Running", a, json!({}))
        })
        .collect();
    let v = view("Job mnist", None, &pods, &[], TODAY);
    assert_eq!(v.pods[0].reasons.len(), REASONS_MAX + 1);
    assert_eq!(v.pods[0].reasons[REASONS_MAX], "12 more");
    assert_eq!(v.pods[0].cluster.chars().count(), CELL_MAX);
    let reason = format!("{}…", "z".repeat(CELL_MAX - 1));
    let why = bound(&vec![reason; REASONS_MAX + 1].join("; "), CELL_MAX);
    let named: Vec<String> = (0..VERDICT_PODS_MAX)
        .map(|i| format!("w-{i} ({why})"))
        .collect();
    assert_eq!(
        v.verdict,
        format!("Job mnist: degraded: {}, and 1995 more", named.join(", "))
    );
    // Every line of the table is at most 11 cells of CELL_MAX and their gaps.
    let widest = table(&v).lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest <= 11 * CELL_MAX + 10 * 3, "{widest}");
}

#[test]
fn times_of_another_day_keep_their_date() {
    assert_eq!(clock("2026-11-23T12:03:04Z", "2026-11-23"), "12:03:04Z");
    assert_eq!(clock("2026-11-23T12:03:04.250Z", "2026-11-23"), "12:03:04Z");
    assert_eq!(
        clock("2020-01-02T12:00:00.5Z", "2026-11-23"),
        "2020-01-02 12:00:00Z"
    );
    assert_eq!(clock("garbage", "2026-11-23"), "garbage");
    let p = pod(
        "w-0",
        "Running",
        json!({
            "trainlet.io/progress": r#"{"at":"2020-01-02T12:00:00Z","step":42.0,"stalled":false}"#,
            "trainlet.io/report": json!({"oom": {"recent": [
                {"time": "2020-01-02T11:00:00Z", "container": "trainer"}
            ]}}).to_string()
        }),
        json!({}),
    );
    let r = row(&p, &[], TODAY);
    assert_eq!(
        (r.progress.as_str(), r.last_oom.as_str()),
        (
            "step 42 at 2020-01-02 12:00:00Z",
            "trainer at 2020-01-02 11:00:00Z"
        )
    );
}

/// A stalled job's pods, grouped by where their ranks are: the odd one out named in
/// the text and the JSON; a hostile place escaped and bounded like every cell.
#[test]
fn a_stalled_job_names_the_pod_that_is_somewhere_else() {
    const REDUCE: &str =
        "all_reduce (torch/distributed/distributed_c10d.py:2501) ← train_step (train.py:88)";
    let stuck = |name: &str, places: &[&str]| {
        let progress = json!({"stalled": true, "stalls": 1, "where": places}).to_string();
        pod(
            name,
            "Running",
            json!({"trainlet.io/progress": progress}),
            json!({}),
        )
    };
    let pods = [
        stuck("w-0", &[REDUCE]),
        stuck("w-1", &[REDUCE, "load_batch (data.py:41)"]),
        stuck("w-2", &[REDUCE]),
    ];
    let v = view("Job j", None, &pods, &[], TODAY);
    let at = format!("2 pods in {REDUCE}; w-1 in load_batch (data.py:41)");
    assert_eq!(v.stuck_at.as_deref(), Some(at.as_str()));
    assert!(
        table(&v).ends_with(&format!("\nwhere: {at}\n")),
        "{}",
        table(&v)
    );
    let j = serde_json::to_value(&v).unwrap();
    assert_eq!(j["where"], at);
    assert_eq!(
        j["pods"][1]["where"],
        json!([REDUCE, "load_batch (data.py:41)"])
    );

    let same = [stuck("w-0", &[REDUCE]), stuck("w-1", &[REDUCE])];
    assert_eq!(
        view("Job j", None, &same, &[], TODAY).stuck_at,
        Some(format!("all 2 pods in the same place: {REDUCE}"))
    );
    let quiet = [pod("w-0", "Running", json!({}), json!({}))];
    assert_eq!(view("Job j", None, &quiet, &[], TODAY).stuck_at, None);
    assert!(!table(&view("Job j", None, &quiet, &[], TODAY)).contains("where:"));

    let hostile = [stuck("w-0", &["x\u{1b}[2J (a.py:1)"])];
    assert_eq!(
        view("Job j", None, &hostile, &[], TODAY)
            .stuck_at
            .as_deref(),
        Some("all 1 pod in the same place: x\\e[2J (a.py:1)")
    );
}
