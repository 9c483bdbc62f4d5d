//! Where a job hangs, on the real node as shipped: a 3-pod PyTorch DDP job (gloo on
//! CPU, torchrun with 2 processes per pod) in a namespace that enforces Pod Security
//! `restricted`, injected with docs/stall-watch.md's recipe, on
//! tests/fixtures/launchers/ddp_hang.py. Its first run hangs with global rank 1 in its
//! data loader and every other rank in the all-reduce; its second with every rank in
//! an all-reduce that waits for another (a cycle of groups); its third completes. At
//! each hang, exec reads the stacks of every Python process under it without a
//! capability (no `SYS_PTRACE`, RuntimeDefault seccomp): the `Stalled` Event says where
//! the ranks are, `trainlet status` names the pod that is somewhere else (or says all
//! are in one place), each pod's log holds its whole dump, and the group restart
//! happens as it does without the capture.
//!
//! The framework's venv reaches the restricted pods as persistent volumes (a hostPath
//! volume is not allowed there): each of node_pods.rs's hostPath mounts becomes a
//! PersistentVolume of this machine's directory, bound to a claim of the namespace.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::node_launchers::{live_pods, timed_events, training_container};
use crate::node_pods::{On, plain_job, pod_spec};
use crate::support::*;

/// Above the silent moments of a run once it steps (rank 0 logs a step every
/// `STEP_TIME`); until its first step, the heartbeat speaks for it.
const STALL_AFTER: u64 = 15;
/// From `kubectl apply` to the end of the job: three runs and two hangs.
const TIMEOUT: Duration = Duration::from_secs(480);
/// Where global rank 1 blocks in the first run: ddp_hang.py's `load_batch`, named by
/// its file alone (the script is outside the rank's working directory).
const LOADER: &str = "load_batch (ddp_hang.py:49)";
/// Where every other rank waits: in the all-reduce of `train_step`.
const REDUCE_IN: &str = ") ← train_step (ddp_hang.py:56)";
const REDUCE: &str = "all_reduce (torch/distributed/distributed_c10d.py:";

#[tokio::test]
async fn a_stalled_ddp_job_names_the_rank_in_its_data_loader_then_a_hung_collective() {
    let py = require!(framework_python());
    let on = require!(On::restricted("where").await);
    scripts(&on).await;
    let pvs = venv_claims(&on, py).await;
    let mut main = training_container(
        py,
        &["torchrun", "--nproc-per-node", "2", "/scripts/ddp_hang.py"],
        5,
    );
    // exec's own backoff before each restart (10 s, then 20 s): the moment the places
    // stay published after the stall.
    main["env"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["name"] != "TRAINLET_RESTART_BACKOFF");
    let mut plain = plain_job("where", 3, main);
    plain["spec"]["backoffLimit"] = json!(0);
    let (volumes, _) = venv_hostpath(py);
    let mut volumes: Vec<Value> = volumes
        .as_array()
        .unwrap()
        .iter()
        .map(|v| json!({"name": v["name"], "persistentVolumeClaim": {"claimName": v["name"], "readOnly": true}}))
        .collect();
    volumes.push(json!({"name": "scripts", "configMap": {"name": "scripts"}}));
    pod_spec(&mut plain)["volumes"] = json!(volumes);
    on.inject_and_apply(
        &plain,
        &[
            &format!("--stall-after={STALL_AFTER}s"),
            "--on-stall=restart",
            "--max-restarts=3",
            "--restart-grace=5s",
            "--nproc-per-node=2",
        ],
        |_| {},
    );
    let died = || async { describe_pods(&on.pods()).await };

    // Run 1: rank 1 (pod 0) in its data loader, the others in the all-reduce.
    let first = stalled(&on, 1).await;
    let pods = live_pods(&on, "where").await;
    assert_eq!(pods.len(), 3, "{}", died().await);
    let zero = pods[0].name_any();
    let (_, note, teller) = &first;
    assert_eq!(teller, &zero, "rank 0's pod tells the stall: {note}");
    let (_, at) = note
        .split_once("; where: ")
        .unwrap_or_else(|| panic!("{note}"));
    let (rank0, rank1) = at.split_once("; ").unwrap_or_else(|| panic!("{note}"));
    assert_eq!(rank1, format!("rank 1: {LOADER}"), "{note}");
    assert!(
        rank0.starts_with(&format!("rank 0: {REDUCE}")) && rank0.ends_with(REDUCE_IN),
        "{note}"
    );
    let at = status_where(&on, "2 pods in ").await;
    let rest = at
        .strip_prefix(&format!("2 pods in {REDUCE}"))
        .unwrap_or_else(|| panic!("{at}"));
    assert!(
        rest.ends_with(&format!("{REDUCE_IN}; {zero} in {LOADER}")),
        "{at}"
    );

    // Run 2: every rank in an all-reduce that waits for another.
    let second = stalled(&on, 2).await;
    let (_, note, teller) = &second;
    assert_eq!(teller, &zero, "{note}");
    let at = status_where(&on, "all 3 pods").await;
    let rest = at
        .strip_prefix(&format!("all 3 pods in the same place: {REDUCE}"))
        .unwrap_or_else(|| panic!("{at}"));
    assert!(rest.ends_with(REDUCE_IN), "{at}");

    // Run 3 completes; every pod's command restarted once for each stall.
    let (kind, _, message) = on.job_end_within("where", TIMEOUT).await;
    assert_eq!(kind, "Complete", "{message}\n{}", died().await);
    let restarts = timed_events(&on, "Restarting").await;
    for p in &pods {
        let n = restarts
            .iter()
            .filter(|(_, _, who)| *who == p.name_any())
            .count();
        assert_eq!(n, 2, "{}: {restarts:?}", p.name_any());
    }
    assert_eq!(timed_events(&on, "Stalled").await.len(), 2);
    // Each pod's log holds its whole dumps: torchrun's agent and both workers, every
    // thread, at each stall (pod 0's own, the others' as a peer stalls).
    for (k, p) in pods.iter().enumerate() {
        let log = on.log(&p.name_any(), "main", false).await;
        let why = if k == 0 {
            "at stall"
        } else {
            "as a peer stalls"
        };
        let dumps = log
            .matches(&format!("Python stacks of the processes of main, {why}"))
            .count();
        assert_eq!(dumps, 2, "{}:\n{log}", p.name_any());
        for rank in [2 * k, 2 * k + 1] {
            let read = log.matches(&format!(", rank {rank}:\n")).count();
            assert_eq!(read, 2, "{}: rank {rank}:\n{log}", p.name_any());
        }
        // torchrun's agent, its command line cut at 120 characters.
        let agent = "/bin/torchrun --nproc-per-node 2 ";
        assert_eq!(log.matches(agent).count(), 2, "{}:\n{log}", p.name_any());
    }
    let last = on.cmd_lines(&zero, "main").await;
    assert!(
        last.contains(&"done: world=6 sum=6".to_string()),
        "{last:?}"
    );
    let volumes: Api<PersistentVolume> = Api::all(on.client.clone());
    on.done().await;
    for pv in pvs {
        volumes.delete(&pv, &DeleteParams::default()).await.unwrap();
    }
}

/// Waits for the job's `n`-th `Stalled` Event and returns it: (time, note, pod).
async fn stalled(on: &On, n: usize) -> (String, String, String) {
    eventually(&format!("Stalled {n}"), TIMEOUT, || async {
        timed_events(on, "Stalled").await.into_iter().nth(n - 1)
    })
    .await
}

/// Waits until `trainlet status` says where the job's pods are, in words that begin
/// with `prefix` (while the pods wait out exec's backoff before they restart), and
/// returns them.
async fn status_where(on: &On, prefix: &str) -> String {
    eventually(
        &format!("status: where: {prefix}…"),
        Duration::from_secs(60),
        || async {
            let r = run(trainlet()
                .args(["status", "job/where", "-o", "json", "-n", &on.ns])
                .arg("--kubeconfig")
                .arg(on.kc));
            assert_eq!(r.code, 0, "{}", r.stderr);
            let v: Value = serde_json::from_str(&r.stdout).unwrap();
            v["where"]
                .as_str()
                .filter(|w| w.starts_with(prefix))
                .map(String::from)
        },
    )
    .await
}

/// ConfigMap `scripts`: ddp_hang.py.
async fn scripts(on: &On) {
    let file = repo().join("tests/fixtures/launchers/ddp_hang.py");
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("scripts".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "ddp_hang.py".to_string(),
            std::fs::read_to_string(file).unwrap(),
        )])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(on.client.clone(), &on.ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

/// A claim of the namespace for each hostPath volume of the venv ([`venv_hostpath`]),
/// named like it and bound to a read-only PersistentVolume of the same directory.
/// Returns the volumes' names, to delete them after the test.
async fn venv_claims(on: &On, py: &std::path::Path) -> Vec<String> {
    let (volumes, _) = venv_hostpath(py);
    let pvs: Api<PersistentVolume> = Api::all(on.client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(on.client.clone(), &on.ns);
    let mut made = Vec::new();
    for v in volumes.as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let pv_name = format!("{}-{name}", on.ns);
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": v["hostPath"],
                "claimRef": {"namespace": on.ns, "name": name}
            }
        }))
        .unwrap();
        pvs.create(&PostParams::default(), &pv).await.unwrap();
        made.push(pv_name.clone());
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": "1Gi"}}
            }
        }))
        .unwrap();
        claims.create(&PostParams::default(), &claim).await.unwrap();
    }
    for v in volumes.as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        eventually(
            &format!("claim {name} bound (kube-controller-manager's persistentvolume-binder)"),
            Duration::from_secs(60),
            || async {
                let c = claims.get(name).await.ok()?;
                (c.status?.phase.as_deref() == Some("Bound")).then_some(())
            },
        )
        .await;
    }
    made
}
