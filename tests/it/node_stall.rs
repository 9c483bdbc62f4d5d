//! The stall watch on the real node, in the shipped layout (`trainlet inject
//! --stall-after --on-stall restart --progress-pattern`): one pod of a 3-pod Indexed Job
//! hangs after its first step; its `trainlet exec` sees no progress for `--stall-after`,
//! publishes the stall (a `Stalled` Event, as `kubectl get events` lists it) and
//! restarts its command; the sidecars of the other two relay the stall and their
//! commands restart exactly once, so the job runs again as a whole and completes.

use serde_json::json;

use crate::node_pods::{On, main_container, plain_job};
use crate::support::*;

/// Each run of the command appends to /tmp/runs (the container's, kept across exec's
/// restarts of CMD in place). Run 1: pod 1 prints `step 1` and hangs; the others print
/// a step a second until restarted. Run 2: three steps, then success.
const SCRIPT: &str = r#"runs=$(( $(cat /tmp/runs 2>/dev/null || echo 0) + 1 ))
echo "$runs" > /tmp/runs
echo "run $runs"
if [ "$runs" -ge 2 ]; then for i in 1 2 3; do echo "step $i"; sleep 0.2; done; exit 0; fi
if [ "$JOB_COMPLETION_INDEX" = 1 ]; then echo "step 1"; exec sleep 3600; fi
i=0; while :; do i=$((i+1)); echo "step $i"; sleep 1; done"#;

#[tokio::test]
async fn a_hung_pod_is_stalled_published_and_restarts_every_pods_command_once() {
    let on = require!(On::restricted("stall").await);
    let plain = plain_job("stall", 3, main_container(&["sh", "-c", SCRIPT], "64Mi"));
    let flags = [
        "--stall-after",
        "10s",
        "--on-stall",
        "restart",
        // The pods print on their own and wait for no collective: a pod's silence is
        // its stall while the others go on.
        "--stall-scope",
        "pod",
        "--progress-pattern",
        r"step (\d+)",
    ];
    on.inject_and_apply(&plain, &flags, |doc| {
        let c = &doc["spec"]["template"]["spec"]["containers"][0]["command"];
        assert_eq!(
            c,
            &json!([
                "/etc/trainlet/bin/trainlet",
                "exec",
                "--report",
                "--stall-after=10s",
                "--on-stall=restart",
                "--stall-scope=pod",
                r"--progress-pattern=step (\d+)",
                "--",
                "sh",
                "-c",
                SCRIPT
            ]),
            "the wrapped command carries inject's stall flags"
        );
    });
    let (kind, _, _) = on.job_end("stall").await;
    assert_eq!(kind, "Complete");
    let pods = on.only_pods("stall", 3).await;
    let names: Vec<String> = pods.iter().map(kube::ResourceExt::name_any).collect();
    for name in &names {
        let runs: Vec<String> = on
            .cmd_lines(name, "main")
            .await
            .into_iter()
            .filter(|l| l.starts_with("run "))
            .collect();
        assert_eq!(runs, ["run 1", "run 2"], "{name}: its command ran twice");
    }
    let stalled = on.events_of("Stalled").await;
    assert_eq!(stalled.len(), 1, "one Stalled Event: {stalled:?}");
    let (kind, note, regarding) = &stalled[0];
    assert_eq!((kind.as_str(), regarding), ("Warning", &names[1]));
    // The silence exec measured when it checked, at the moment the stall began: 10 s,
    // or 11 s where this loaded machine woke exec a little late (never the next
    // `--interval`).
    let rest = ["10s", "11s"]
        .iter()
        .find_map(|s| {
            note.strip_prefix(&format!(
                "no progress for {s}; last step 1 in \"step 1\"; CMD used "
            ))
        })
        .unwrap_or_else(|| panic!("{note}"));
    let (share, tail) = rest.split_once('%').unwrap_or_else(|| panic!("{note}"));
    assert!(share.parse::<u32>().is_ok(), "{note}");
    // A shell and a sleep: exec read no Python stack, and says so.
    assert_eq!(
        tail, " of a core over the window; where: no Python process",
        "{note}"
    );
    // As people look at it.
    let listed = kubectl_on(
        on.kc,
        &[
            "get",
            "events",
            "-n",
            &on.ns,
            "--field-selector",
            "reason=Stalled",
            "-o",
            "jsonpath={range .items[*]}{.type} {.reason} {.involvedObject.kind}/{.involvedObject.name}: {.message}{\"\\n\"}{end}",
        ],
    );
    assert_eq!(
        listed,
        format!("Warning Stalled Pod/{}: {note}\n", names[1])
    );
    let restarting = on.events_of("Restarting").await;
    let mut restarted: Vec<&String> = restarting.iter().map(|(_, _, pod)| pod).collect();
    restarted.sort();
    assert_eq!(
        restarted,
        names.iter().collect::<Vec<_>>(),
        "each pod's command restarted once: {restarting:?}"
    );
    on.done().await;
}
