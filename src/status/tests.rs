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
            "trainlet.io/progress": r#"{"at":"2026-11-23T12:04:00Z","step":41.0,"stalled":false,"since":"2026-11-23T11:00:00.250Z","stalls":1}"#
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
        row(&p, &events),
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
            progress: "step 41 at 12:04:00Z".into(),
            stalled: false,
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
    let r = row(&p, &[]);
    assert_eq!(r.restarts, 1 << 32);
    assert_eq!(r.progress, "output at 12:04:00Z");
    assert_eq!(
        progress(r#"{"step":1e308,"stalled":true,"since":"2026-11-23T12:00:00.500Z"}"#),
        "stalled since 12:00:00Z"
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
    let v = view("Job mnist", &pods, &[]);
    let order: Vec<&str> = v.pods.iter().map(|r| r.pod.as_str()).collect();
    assert_eq!(order, ["ps-0", "w-2", "w-10", "z"]);
}

#[test]
fn the_verdict_is_the_worst_state_and_names_the_pods() {
    let ok = |n: &str| pod(n, "Running", healthy("worker/0"), json!({}));
    assert_eq!(
        view("Job mnist", &[ok("w-0"), ok("w-1")], &[]).verdict,
        "Job mnist: healthy: 2 pods running, cluster current"
    );
    let pending = pod(
        "w-1",
        "Pending",
        json!({}),
        json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}),
    );
    let v = view("Job mnist", &[ok("w-0"), pending.clone()], &[]);
    assert_eq!(v.state, State::Starting);
    assert_eq!(
        v.verdict,
        "Job mnist: starting: 1 of 2 pods running; waiting for w-1 Pending (Unschedulable)"
    );
    let mut stale = healthy("worker/1");
    stale["trainlet.io/cluster"] = json!("stale: worker/0 lost");
    let v = view(
        "Job mnist",
        &[ok("w-0"), pod("w-1", "Running", stale, json!({})), pending],
        &[],
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
        &[ok("w-0"), pod("w-1", "Running", stalled, json!({}))],
        &[],
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
    let v = view("Job mnist", &[failed, ok("w-1")], &[]);
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
        view("Job mnist", &[ok("w-0"), in_init], &[]).verdict,
        "Job mnist: starting: 1 of 2 pods running; waiting for w-1 Pending (in trainlet-init)"
    );
    let done = |n: &str| pod(n, "Succeeded", json!({}), json!({}));
    assert_eq!(
        view("JobSet j", &[done("a"), done("b")], &[]).verdict,
        "JobSet j: completed: 2 pods succeeded"
    );
    assert_eq!(
        view("Job gone", &[], &[]),
        View {
            state: State::Empty,
            verdict: "Job gone: no pods match".into(),
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
        table(&view("Job mnist", &pods, &events)),
        "\
TASK       POD   IP         PHASE     HEALTH   GPUS   CLUSTER   RESTARTS   PROGRESS   LAST OOM   LAST EVENT
worker/0   w-0   10.0.0.3   Running   ok       4/4    current   0          -          -          PeersResolved
-          w-1   10.0.0.3   Pending   -        -      -         0          -          -          -
Job mnist: starting: 1 of 2 pods running; waiting for w-1 Pending
"
    );
}

#[test]
fn targets_try_a_job_then_a_jobset() {
    assert_eq!(
        Target::Either("mnist".into()).candidates(),
        vec![
            (
                "Job mnist".to_string(),
                vec!["batch.kubernetes.io/job-name=mnist".to_string()]
            ),
            (
                "JobSet mnist".to_string(),
                vec!["jobset.sigs.k8s.io/jobset-name=mnist".to_string()]
            ),
        ]
    );
}
