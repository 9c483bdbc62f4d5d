//! trainlet on two nodes: the host node (cgroup v1, containerd 1.6) and the cgroup v2
//! node (`tests/node/up --cgroup2`: Debian's kernel under QEMU's emulation, containerd
//! 2, the same kubelet version), one cluster, pods routed between 10.244.0.0/24 and
//! 10.244.1.0/24. A job's tasks really cross nodes: real PyTorch (gloo) and TensorFlow
//! (MultiWorkerMirroredStrategy) with one pod on each node, a replaced pod on one node
//! while its peer runs on the other; and what only cgroup v2 shows: an OOM kill under
//! both settings of the kubelet's `singleProcessOOMKill`.
//!
//! Workloads are made as in node_pods.rs (a plain Indexed Job through the built
//! `trainlet inject`, applied with kubectl); a job spreads itself over the two nodes as
//! a user spreads one, by pod anti-affinity on the hostname, and tolerates the cgroup v2
//! node's taint. Emulation starts a pod there in about 20–40 s and imports PyTorch in
//! about a minute and TensorFlow in two: the deadlines are [`TWO_NODE_TIMEOUT`].

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::RwLock;

use crate::node_pods::{
    On, ip, main_container, plain_job, pod_spec, report, start_runs, state, terminated,
};
use crate::support::jobs::{index_of, job_pods};
use crate::support::*;

/// From `kubectl apply` to a Job's end, with a pod on the emulated node.
const TWO_NODE_TIMEOUT: Duration = Duration::from_secs(600);

/// The cgroup v2 node's kubelet setting: tests that run there with the kubelet's default
/// hold it shared; the `singleProcessOOMKill: true` test holds it alone while it
/// restarts the kubelet with it and back.
static KUBELET: RwLock<()> = RwLock::const_new(());

const NODES: [&str; 2] = [CGROUP2_NODE, "trainlet-node"];

/// One pod of the job on each node, as a user spreads a job: a required pod
/// anti-affinity on the hostname among the job's pods, and the cgroup v2 node's taint
/// tolerated.
fn across_nodes(plain: &mut Value) {
    let name = plain["metadata"]["name"].as_str().unwrap().to_string();
    let spec = pod_spec(plain);
    spec["tolerations"] =
        json!([{"key": CGROUP2_TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
    spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": name}},
        "topologyKey": "kubernetes.io/hostname"
    }]}});
}

/// Every pod of the job on the cgroup v2 node.
fn on_cgroup2(plain: &mut Value) {
    let spec = pod_spec(plain);
    spec["tolerations"] =
        json!([{"key": CGROUP2_TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
    spec["nodeSelector"] = json!({"trainlet.test/node": "cgroup2"});
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .unwrap()
        .node_name
        .clone()
        .unwrap_or_default()
}

/// The pods' nodes, sorted, and each pod's address in its node's pod subnet.
fn assert_across(pods: &[Pod]) {
    let mut nodes: Vec<String> = pods.iter().map(node_of).collect();
    nodes.sort();
    assert_eq!(nodes, NODES);
    for p in pods {
        let subnet = if node_of(p) == CGROUP2_NODE {
            "10.244.1."
        } else {
            "10.244.0."
        };
        assert!(ip(p).starts_with(subnet), "{}: {}", p.name_any(), ip(p));
    }
}

/// The namespace of a framework job: `privileged`, the venv being mounted by hostPath
/// (node_pods.rs), with trainlet's RBAC.
pub(crate) async fn framework_namespace(kc: &'static std::path::Path, prefix: &str) -> On {
    let client = client_from(kc).await;
    let ns = namespace_with_labels(
        &client,
        prefix,
        &[("pod-security.kubernetes.io/enforce", "privileged")],
    )
    .await;
    let manifests = repo().join("manifests");
    kubectl_clean(kc, &["apply", "-k", manifests.to_str().unwrap(), "-n", &ns]);
    On { kc, client, ns }
}

/// A training container of the framework venv running `code`; a small request, so
/// that two framework pods fit the emulated node, and room for the framework.
fn framework_container(py: &std::path::Path, name: &str, code: &str) -> Value {
    let (_, mounts) = venv_hostpath(py);
    let mut main = main_container(&[py.to_str().unwrap(), "-c", code], "2Gi");
    main["name"] = json!(name);
    main["resources"]["requests"]["memory"] = json!("256Mi");
    main["env"] = json!([
        {"name": "HOME", "value": "/tmp"},
        {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"},
        {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}
    ]);
    main["volumeMounts"] = mounts;
    main
}

async fn completed(on: &On, job: &str) {
    let end = on.job_end_within(job, TWO_NODE_TIMEOUT).await;
    assert_eq!(
        end,
        (
            "Complete".into(),
            "CompletionsReached".into(),
            "Reached expected number of succeeded pods".into()
        ),
        "{}",
        describe_pods(&on.pods()).await
    );
}

/// PyTorch all-reduces with gloo between a pod on each node, from what trainlet-init
/// wrote there (`--framework pytorch`): rank 0's address is the rendezvous of both,
/// whichever node it is on.
#[tokio::test]
async fn pytorch_all_reduces_with_gloo_across_the_two_nodes() {
    let py = require!(framework_python());
    let kc = require!(cgroup2_node());
    let _kubelet = KUBELET.read().await;
    let on = framework_namespace(kc, "torch2").await;
    let code = format!(
        "import os\nos.write(1, f\"master={{os.environ['MASTER_ADDR']}}:{{os.environ['MASTER_PORT']}}\\n\".encode())\n{}",
        std::fs::read_to_string(repo().join("tests/fixtures/frameworks/torch_allreduce.py"))
            .unwrap()
    );
    let mut plain = plain_job("allreduce", 2, framework_container(py, "pytorch", &code));
    pod_spec(&mut plain)["volumes"] = venv_hostpath(py).0;
    across_nodes(&mut plain);
    on.inject_and_apply(&plain, &["--framework", "pytorch"], |_| {});
    completed(&on, "allreduce").await;
    let pods = on.only_pods("allreduce", 2).await;
    assert_across(&pods);
    let master = ip(&pods[0]);
    for (rank, p) in pods.iter().enumerate() {
        let lines: Vec<String> = on
            .cmd_lines(&p.name_any(), "pytorch")
            .await
            .into_iter()
            .filter(|l| l.starts_with("master=") || l.starts_with("rank="))
            .collect();
        assert_eq!(
            lines,
            [
                format!("master={master}:29500"),
                format!("rank={rank} world=2 sum=1")
            ],
            "{}",
            p.name_any()
        );
        assert_eq!(terminated(p, "pytorch").0, 0);
    }
    on.done().await;
}

/// TensorFlow's MultiWorkerMirroredStrategy between a worker on each node, from the
/// TF_CONFIG trainlet-init wrote and `trainlet exec` put in the command's environment:
/// both replicas take part in one all-reduce over gRPC between the nodes.
#[tokio::test]
async fn tensorflow_multiworker_all_reduces_across_the_two_nodes() {
    let py = require!(framework_python());
    let kc = require!(cgroup2_node());
    let _kubelet = KUBELET.read().await;
    let on = framework_namespace(kc, "tf2").await;
    let code =
        std::fs::read_to_string(repo().join("tests/fixtures/frameworks/tf_mwms.py")).unwrap();
    let mut plain = plain_job("mwms", 2, framework_container(py, "tensorflow", &code));
    pod_spec(&mut plain)["volumes"] = venv_hostpath(py).0;
    across_nodes(&mut plain);
    on.inject_and_apply(&plain, &[], |_| {});
    completed(&on, "mwms").await;
    let pods = on.only_pods("mwms", 2).await;
    assert_across(&pods);
    for (k, p) in pods.iter().enumerate() {
        let lines: Vec<String> = on
            .cmd_lines(&p.name_any(), "tensorflow")
            .await
            .into_iter()
            .filter(|l| l.starts_with("worker/"))
            .collect();
        assert_eq!(
            lines,
            [format!("worker/{k} replicas=2 sum=2")],
            "{}",
            p.name_any()
        );
    }
    on.done().await;
}

/// A replaced pod on one node while its peer runs on the other: the host node's pod is
/// deleted; its replacement (on the host node again: the other node has the job's other
/// pod) gets a new address; on the cgroup v2 node the sidecar sees it and `trainlet exec
/// --on-peer-change restart` restarts the command exactly once, with the new cluster,
/// whose trainer then reaches the replacement across the nodes.
#[tokio::test]
async fn a_replaced_pod_on_one_node_restarts_its_peers_command_on_the_other() {
    let kc = require!(cgroup2_node());
    let _kubelet = KUBELET.read().await;
    let client = client_from(kc).await;
    let ns = restricted_namespace(kc, &client, "replace2").await;
    let on = On { kc, client, ns };
    let script = "echo \"start: $TF_CONFIG\"
trainer --source tf --timeout 300 || exit 1
exec sleep 3600";
    let mut plain = plain_job("replace", 2, main_container(&["sh", "-c", script], "64Mi"));
    plain["spec"]["backoffLimit"] = json!(6);
    across_nodes(&mut plain);
    on.inject_and_apply(&plain, &[], |doc| {
        let c = pod_spec(doc)["containers"][0]["command"]
            .as_array_mut()
            .unwrap();
        assert_eq!(c[3], json!("--"));
        for (i, a) in ["--on-peer-change", "restart", "--restart-backoff", "1s"]
            .into_iter()
            .enumerate()
        {
            c.insert(3 + i, json!(a));
        }
    });
    let oks = |log: &str| {
        log.lines()
            .filter(|l| l.starts_with("trainer: ok: "))
            .count()
    };
    // The job's live pods once each has run its trainer `want(pod)` times.
    let live = |gone: Option<String>, want: fn(&Pod) -> usize| {
        let on = &on;
        async move {
            eventually("both pods' trainers", TWO_NODE_TIMEOUT, || {
                let gone = gone.clone();
                async move {
                    let mut live: Vec<Pod> = job_pods(&on.client, &on.ns, "replace")
                        .await
                        .into_iter()
                        .filter(|p| {
                            p.metadata.deletion_timestamp.is_none() && Some(p.name_any()) != gone
                        })
                        .collect();
                    live.sort_by_key(index_of);
                    if live.len() != 2 {
                        return None;
                    }
                    for p in &live {
                        if oks(&on.log(&p.name_any(), "main", false).await) < want(p) {
                            return None;
                        }
                    }
                    Some(live)
                }
            })
            .await
        }
    };
    let before = live(None, |_| 1).await;
    assert_across(&before);
    let (host, far): (Vec<&Pod>, Vec<&Pod>) =
        before.iter().partition(|p| node_of(p) == "trainlet-node");
    let (old, far) = (host[0].clone(), far[0].clone());
    let (i_old, i_far) = (
        index_of(&old).unwrap() as usize,
        index_of(&far).unwrap() as usize,
    );
    on.pods()
        .delete(&old.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let after = live(Some(old.name_any()), |p| {
        if node_of(p) == CGROUP2_NODE { 2 } else { 1 }
    })
    .await;
    assert_across(&after);
    let new = &after[i_old];
    assert_eq!(node_of(new), "trainlet-node");
    assert_ne!(ip(new), ip(&old), "the replacement's address");
    assert_eq!(after[i_far].name_any(), far.name_any());
    let tf = |ips: [&String; 2], i: usize| {
        let mut order = [String::new(), String::new()];
        order[i_old] = format!("\"{}:8470\"", ips[0]);
        order[i_far] = format!("\"{}:8470\"", ips[1]);
        format!(
            "{{\"cluster\":{{\"worker\":[{}]}},\"task\":{{\"type\":\"worker\",\"index\":{i}}}}}",
            order.join(",")
        )
    };
    let mesh = |me_ip: &String, peer_ip: &String, peer: usize| {
        let mut v = mesh_lines(
            &format!("worker:{i_far}"),
            &format!("{me_ip}:8470"),
            &[(
                format!("worker:{peer}"),
                format!("{peer_ip}:8470"),
                peer_ip.clone(),
            )],
        );
        v.sort();
        v
    };
    // On the cgroup v2 node: two runs, the first with the deleted pod's address, the
    // second with the replacement's.
    let log = on.log(&far.name_any(), "main", false).await;
    let runs = start_runs(&log);
    assert_eq!(runs.len(), 2, "{log}");
    let far_ip = ip(&far);
    for (run, peer_ip) in runs.iter().zip([ip(&old), ip(new)]) {
        assert_eq!(
            run.lines().next().unwrap(),
            format!("start: {}", tf([&peer_ip, &far_ip], i_far)),
            "{log}"
        );
        assert_eq!(trainer_lines(run), mesh(&far_ip, &peer_ip, i_old), "{log}");
    }
    // The sidecar's next patch (at most every 10 s) says the cluster is current again.
    let now = eventually("the cluster current again", Duration::from_secs(60), || {
        let pods = on.pods();
        let name = far.name_any();
        async move {
            let p = pods.get(&name).await.unwrap();
            (p.annotations()
                .get("trainlet.io/cluster")
                .map(String::as_str)
                == Some("current"))
            .then_some(p)
        }
    })
    .await;
    for c in ["trainlet-init", "trainlet", "main"] {
        assert_eq!(state(&now, c)["restartCount"], 0, "{c}");
    }
    // One restart, announced by the peer. Whether its sidecar saw the replacement
    // before exec stopped CMD (→ its address) or only the loss (→ none) is the
    // emulated node's timing.
    let restarting = eventually("the Restarting Event", Duration::from_secs(60), || {
        let on = &on;
        async move {
            let v = on.events_of("Restarting").await;
            (!v.is_empty()).then_some(v)
        }
    })
    .await;
    let note = |to: &str| {
        format!(
            "restarting sh (1 of 3) in 1s: the cluster changed (stale: worker/{i_old} {} → {to})",
            ip(&old)
        )
    };
    assert_eq!(restarting.len(), 1, "{restarting:?}");
    let (kind, said, by) = &restarting[0];
    assert_eq!(
        (kind.as_str(), by.as_str()),
        ("Warning", far.name_any().as_str())
    );
    assert!([note("none"), note(&ip(new))].contains(said), "{said}");
    let job = Api::<Job>::namespaced(on.client.clone(), &on.ns)
        .get("replace")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!((job.failed, job.active), (Some(1), Some(2)), "{job:?}");
    on.done().await;
}

/// The training container on the cgroup v2 node: prints its cgroup's
/// `memory.oom.group` (the kubelet's setting), waits for the sidecar's first report,
/// runs the memory hog as a child past a 96 MiB limit, prints the child's status, and
/// ends 0.
async fn oom_job(kc: &'static std::path::Path, prefix: &str) -> (On, Pod, Vec<String>) {
    let client = client_from(kc).await;
    let ns = restricted_namespace(kc, &client, prefix).await;
    let on = On { kc, client, ns };
    // The hog starts once the sidecar's first report is out (its /readyz): a kill
    // in the middle of a training, not in the sidecar's first second. It grows 1 MiB
    // every 30 ms, about 3 s to the limit: on this emulated machine, under the other
    // lane's load, exec's 250 ms ticks can be a second late, and a hog that lived
    // through none of them could not be named (the readiness loop's last `wget`,
    // gone just before, is no candidate: exec's snapshots tell which went first).
    let script = "exec 2>&1; echo \"oom.group $(cat /sys/fs/cgroup/memory.oom.group)\"; i=0; until wget -q -O /dev/null http://127.0.0.1:9464/readyz 2>/dev/null; do i=$((i+1)); [ $i -lt 600 ] || exit 9; sleep 0.2; done; memhog 30 & echo \"memhog pid $!\"; wait $!; echo \"memhog status $?\"; sleep 3";
    let mut plain = plain_job("oom", 1, main_container(&["sh", "-c", script], "96Mi"));
    on_cgroup2(&mut plain);
    on.inject_and_apply(&plain, &[], |_| {});
    on.job_end_within("oom", TWO_NODE_TIMEOUT).await;
    // The sidecar tells of the kill once the pod's status shows it, and the kubelet stops
    // it after the training container: read the pod and its Events once it has ended.
    let p = eventually("the sidecar stopped", TWO_NODE_TIMEOUT, || async {
        let p = on.only_pods("oom", 1).await.remove(0);
        let s = p.status.as_ref()?;
        let ended = s
            .container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .all(|c| c.state.as_ref().is_some_and(|st| st.terminated.is_some()));
        ended.then_some(p)
    })
    .await;
    assert_eq!(node_of(&p), CGROUP2_NODE);
    let lines = on.cmd_lines(&p.name_any(), "main").await;
    (on, p, lines)
}

/// The kubelet's default on cgroup v2 (`singleProcessOOMKill: false`): it sets
/// `memory.oom.group` 1 on the container, so the child's OOM kill takes every process
/// of the container, `trainlet exec` and the shell with it: the container ends
/// `OOMKilled` with 137 and the pod fails. The sidecar, in a container of its own,
/// reports what the kubelet says, in agreement with it: one `OOMKill` Event naming the
/// container, exit code and limit. Which process set it off only the kernel's log says,
/// which no pod reads.
#[tokio::test]
async fn a_childs_oom_kill_on_cgroup_v2_takes_the_container_and_the_sidecar_agrees_with_the_kubelet()
 {
    let kc = require!(cgroup2_node());
    let _kubelet = KUBELET.read().await;
    let (on, p, lines) = oom_job(kc, "oom-group").await;
    let name = p.name_any();
    assert_eq!(lines[0], "oom.group 1", "{lines:?}");
    assert_eq!(lines.len(), 2, "nothing after the hog's start: {lines:?}");
    assert!(lines[1].starts_with("memhog pid "), "{lines:?}");
    assert_eq!(terminated(&p, "main"), (137, "OOMKilled".to_string(), None));
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Failed"));
    assert_eq!(
        on.events_of("OOMKill").await,
        [(
            "Warning".to_string(),
            "container main was OOM-killed (exit code 137); memory limit 96Mi".to_string(),
            name.clone()
        )]
    );
    let a = p.annotations();
    assert_eq!(a["trainlet.io/oom-kills"], "1");
    let r = report(&p);
    assert_eq!(r["mode"], "sidecar", "{r}");
    assert_eq!(r["oom"]["kills"], 1, "{r}");
    assert_eq!(r["oom"]["by_container"], json!({"main": 1}));
    // The report is the sidecar's last, written when the kubelet stopped it after the
    // training container: exec, killed with the group, is a source while its last
    // observation is fresh (17 s), and no longer once the report says it is gone (the
    // emulated node can take longer than that to stop the sidecar).
    let exec_gone = r["gpu"]["unknown"]
        .as_str()
        .is_some_and(|u| u.ends_with("the training container's trainlet exec is gone"));
    let sources = if exec_gone {
        json!(["pod status"])
    } else {
        json!([
            "pod status",
            "trainlet exec in container main (observations)"
        ])
    };
    assert_eq!(r["oom"]["sources"], sources, "{r}");
    // exec, killed with the rest, handed over no kill.
    assert_eq!(r["exec"]["kills"], 0, "{r}");
    let kill = &r["oom"]["recent"][0];
    assert_eq!(kill["container"], "main", "{r}");
    assert_eq!(kill["source"], "pod-status", "{r}");
    assert_eq!(kill["exit_code"], 137, "{r}");
    on.done().await;
}

/// `singleProcessOOMKill: true`: the kubelet leaves `memory.oom.group` 0, the kernel
/// kills the child alone and the command goes on; `trainlet exec` sees the kill in the
/// cgroup's `memory.events` and names the process with its pid, and the sidecar
/// publishes it; the container ends 0, and containerd 2 marks it `OOMKilled` all the
/// same. The kubelet is put back to its default afterwards, also when the test fails.
#[tokio::test]
async fn with_single_process_oom_kill_only_the_child_dies_on_cgroup_v2_and_exec_names_it() {
    let kc = require!(cgroup2_node());
    let _kubelet = KUBELET.write().await;
    struct Default(&'static std::path::Path);
    impl Drop for Default {
        fn drop(&mut self) {
            cgroup2_kubelet(self.0, false);
        }
    }
    cgroup2_kubelet(kc, true);
    let _default = Default(kc);
    let (on, p, lines) = oom_job(kc, "oom-single").await;
    let name = p.name_any();
    let pid = lines
        .get(1)
        .and_then(|l| l.strip_prefix("memhog pid "))
        .unwrap_or_else(|| panic!("{lines:?}"))
        .to_string();
    assert_eq!(
        lines,
        [
            "oom.group 0".to_string(),
            format!("memhog pid {pid}"),
            "Killed".to_string(),
            "memhog status 137".to_string()
        ]
    );
    assert_eq!(terminated(&p, "main"), (0, "OOMKilled".to_string(), None));
    assert_eq!(
        p.status.as_ref().unwrap().phase.as_deref(),
        Some("Succeeded")
    );
    let note =
        format!("process memhog (pid {pid}) in container main was OOM-killed; memory limit 96Mi");
    assert_eq!(
        on.events_of("OOMKill").await,
        [("Warning".to_string(), note, name.clone())]
    );
    let r = report(&p);
    assert_eq!(r["oom"]["kills"], 1, "{r}");
    assert_eq!(
        r["oom"]["sources"],
        json!([
            "pod status",
            "trainlet exec in container main (observations)"
        ])
    );
    let kill = &r["oom"]["recent"][0];
    assert_eq!(kill["source"], "cgroup", "{r}");
    assert_eq!(kill["process"]["comm"], "memhog", "{r}");
    assert_eq!(kill["process"]["pid"].to_string(), pid, "{r}");
    assert_eq!(kill["memory_limit"], "96Mi", "{r}");
    on.done().await;
}
