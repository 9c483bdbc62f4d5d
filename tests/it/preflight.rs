//! The pre-flight (`init --preflight`): the three pods of a job, Pending in their
//! init containers with pod IPs (the test plays the scheduler and the kubelet), run
//! `trainlet init --preflight` at once, each on a loopback address of its own, and
//! prove the ring of their tasks over real sockets before writing. The played pods
//! share this machine's network namespace, where init's check of its own port binds
//! every address: each task has a port of its own (`--port-name`), as pods in network
//! namespaces of their own would not need. The failure case drops one pod's task port
//! with an iptables rule: the bridge CNI of the test node enforces no NetworkPolicy, and
//! a DROP is what a policy does to the traffic it refuses.

use std::process::Command;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::support::*;

/// Three pods `pf-0`… labelled `app=pf` with their index, each with a port `task` of
/// its own (`ports`), Pending in init at `ips`; and `trainlet init --preflight` for each,
/// run at once. Returns the namespace, the runs and their output directories.
async fn ring_of_three(
    prefix: &str,
    ips: [&str; 3],
    ports: [u16; 3],
) -> (String, Vec<Run>, Vec<tempfile::TempDir>) {
    let ns = pending_pods(prefix, ips, ports).await;
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let handles: Vec<_> = (0..3)
        .map(|i| {
            let mut cmd = preflight_init(&ns, i, dirs[i].path(), "40s");
            tokio::task::spawn_blocking(move || run(&mut cmd))
        })
        .collect();
    let mut runs = Vec::new();
    for h in handles {
        runs.push(h.await.unwrap());
    }
    (ns, runs, dirs)
}

/// The three pods of [`ring_of_three`], Pending in their trainlet-init at `ips`, in a
/// new namespace, which it returns.
pub(crate) async fn pending_pods(prefix: &str, ips: [&str; 3], ports: [u16; 3]) -> String {
    let client = admin().await;
    let ns = namespace(&client, prefix).await;
    let kubelet = Kubelet::new(&client, &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (i, ip) in ips.iter().enumerate() {
        let name = format!("pf-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {
                "app": "pf", "batch.kubernetes.io/job-completion-index": i.to_string()}},
            "spec": {
                "initContainers": [{"name": "trainlet-init", "image": "ghcr.io/trainlet/trainlet:0.1.0"}],
                "containers": [{"name": "main", "image": "registry.example/train:1",
                    "ports": [{"name": "task", "containerPort": ports[i]}]}]
            }
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        kubelet.bind(&name, "node-a").await;
        // Pending in its trainlet-init, with its address: where every pod of a job
        // waits for the others.
        kubelet
            .status(
                &name,
                json!({"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}],
                    "initContainerStatuses": [{"name": "trainlet-init", "image": "ghcr.io/trainlet/trainlet:0.1.0",
                        "imageID": "", "ready": false, "restartCount": 0, "started": true,
                        "state": {"running": {"startedAt": now()}}}]}),
            )
            .await;
    }
    ns
}

/// `trainlet init --preflight` for pod `pf-{i}` of [`pending_pods`], writing to `out`.
pub(crate) fn preflight_init(ns: &str, i: usize, out: &std::path::Path, timeout: &str) -> Command {
    init_cmd(
        kubeconfig(),
        ns,
        &format!("pf-{i}"),
        out,
        &[
            "--job",
            "worker=app=pf",
            "--expect",
            "worker=3",
            "--port-name",
            "task",
            "--preflight",
            "--timeout",
            timeout,
        ],
    )
}

pub(crate) fn proven(stderr: &str) -> bool {
    stderr.contains("pre-flight: the network to the ring's neighbours is proven")
}

/// Every pod reaches the next and is reached by the previous: all three write their
/// files, each having proven its two paths of the ring.
#[tokio::test]
async fn the_pods_prove_the_ring_and_write_their_files() {
    let ips = ["127.0.41.1", "127.0.41.2", "127.0.41.3"];
    let ports = [free_port(), free_port(), free_port()];
    let (ns, runs, dirs) = ring_of_three("preflight", ips, ports).await;
    let cluster: Vec<String> = (0..3)
        .map(|i| format!("\"{}:{}\"", ips[i], ports[i]))
        .collect();
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r.code, 0, "pf-{i}: {}", r.stderr);
        assert!(proven(&r.stderr), "pf-{i}: {}", r.stderr);
        let tf = std::fs::read_to_string(dirs[i].path().join("tf_config.json")).unwrap();
        assert_eq!(
            tf,
            format!(
                "{{\"cluster\":{{\"worker\":[{}]}},\"task\":{{\"type\":\"worker\",\"index\":{i}}}}}\n",
                cluster.join(",")
            )
        );
    }
    let client = admin().await;
    assert!(
        events(&client, &ns)
            .await
            .iter()
            .all(|(_, reason, _, _)| reason != "PeerUnreachable")
    );
    delete_namespace(&client, &ns).await;
}

/// Drops what reaches pod 2's address (an iptables rule, as a NetworkPolicy or a
/// firewall would). Pod 1, whose next task is pod 2, cannot reach it; pod 2 is not
/// reached by pod 1: both exit 10, write nothing, and a `PeerUnreachable` Event on each
/// pod names the peer and the side. Pod 0 (reached by pod 2, reaching pod 1) writes its
/// files.
#[tokio::test]
async fn a_dropped_port_fails_the_pods_on_that_path_and_names_the_peer() {
    require!(root(
        Group::Node,
        "an iptables rule that drops a pod's port"
    ));
    let ips = ["127.0.42.1", "127.0.42.2", "127.0.42.3"];
    let ports = [free_port(), free_port(), free_port()];
    let dport = ports[2].to_string();
    let rule: Vec<String> = [
        "OUTPUT",
        "-d",
        ips[2],
        "-p",
        "tcp",
        "--dport",
        &dport,
        "-m",
        "comment",
        "--comment",
        "trainlet test: preflight drop",
        "-j",
        "DROP",
    ]
    .map(String::from)
    .to_vec();
    struct Rule(Vec<String>);
    impl Drop for Rule {
        fn drop(&mut self) {
            let _ = Command::new("iptables")
                .args(["-w", "-D"])
                .args(&self.0)
                .status();
        }
    }
    let ok = Command::new("iptables")
        .args(["-w", "-I"])
        .args(&rule)
        .status()
        .unwrap();
    assert!(ok.success());
    let _rule = Rule(rule);
    let (ns, runs, dirs) = ring_of_three("preflight-drop", ips, ports).await;
    let (r0, r1, r2) = (&runs[0], &runs[1], &runs[2]);
    assert_eq!(r0.code, 0, "{}", r0.stderr);
    assert!(proven(&r0.stderr), "{}", r0.stderr);
    let cannot = format!(
        "this pod cannot reach worker/2 (pf-2) at {}:{}: no answer within ",
        ips[2], ports[2]
    );
    let not_reached = format!(
        "worker/1 (pf-1, {}) did not reach this pod's port {} within",
        ips[1], ports[2]
    );
    for (r, says) in [(r1, &cannot), (r2, &not_reached)] {
        assert_eq!(r.code, 10, "{}", r.stderr);
        let last = r.stderr.trim_end().lines().last().unwrap();
        assert!(
            last.contains("the network between the job's pods is not proven: ")
                && last.contains(says.as_str())
                && last.ends_with("(check the NetworkPolicies of the namespace and the routes and firewalls between the nodes, or run without --preflight)"),
            "{last}"
        );
    }
    for d in &dirs[1..] {
        assert_eq!(list_dir(d.path()), Vec::<String>::new(), "nothing written");
    }
    let client = admin().await;
    let mut unreachable: Vec<(String, String)> = events(&client, &ns)
        .await
        .into_iter()
        .filter(|(_, reason, _, _)| reason == "PeerUnreachable")
        .map(|(kind, _, note, pod)| {
            assert!(note.contains("is not proven"), "{note}");
            (kind, pod)
        })
        .collect();
    unreachable.sort();
    assert_eq!(
        unreachable,
        [
            ("Warning".to_string(), "pf-1".to_string()),
            ("Warning".to_string(), "pf-2".to_string())
        ]
    );
    delete_namespace(&client, &ns).await;
}

/// On the real node, pods in network namespaces of their own: a 3-pod Indexed Job
/// through `trainlet inject --preflight` completes; each pod's trainlet-init proved
/// the ring before it wrote, and each trainer then reaches every peer.
#[tokio::test]
async fn an_injected_job_with_preflight_completes_on_a_real_node() {
    use crate::node_pods::{On, main_container, plain_job};
    let on = require!(On::restricted("preflight-node").await);
    let plain = plain_job(
        "pf",
        3,
        main_container(&["trainer", "--source", "tf", "--timeout", "120"], "64Mi"),
    );
    on.inject_and_apply(&plain, &["--preflight"], |_| {});
    let end = on.job_end("pf").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Complete", "CompletionsReached"),
        "{end:?}: {}",
        describe_pods(&on.pods()).await
    );
    for p in on.only_pods("pf", 3).await {
        let name = kube::ResourceExt::name_any(&p);
        let init = on.log(&name, "trainlet-init", false).await;
        assert!(proven(&init), "{name}: {init}");
        let lines = on.cmd_lines(&name, "main").await;
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("trainer: ok: ") && l.contains("reached 2 peers")),
            "{name}: {lines:?}"
        );
    }
    on.done().await;
}
