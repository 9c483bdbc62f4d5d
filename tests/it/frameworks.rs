//! Every framework from one resolution, on the real API server: JobSet pods ordered
//! and counted through Pod -> Job -> JobSet with the real JobSet CRD installed, and
//! the real frameworks (PyTorch, JAX, TensorFlow, OpenMPI) forming clusters from what
//! trainlet writes, each pod given its own loopback address.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::*;

const JS_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
const JS_RJOB: &str = "jobset.sigs.k8s.io/replicatedjob-name";
const JS_JOB_INDEX: &str = "jobset.sigs.k8s.io/job-index";
const JS_GLOBAL: &str = "jobset.sigs.k8s.io/job-global-index";

/// The template of the JobSet's Jobs: 2 Indexed pods each.
fn job_template() -> Value {
    json!({
        "parallelism": 2, "completions": 2, "completionMode": "Indexed", "backoffLimit": 0,
        "template": {"spec": {"restartPolicy": "Never", "serviceAccountName": "trainlet",
            "automountServiceAccountToken": false,
            "containers": [{"name": "trainer", "image": "registry.example/train:1"}]}}
    })
}

/// A JobSet `js` with one replicated job `workers` of 2 Indexed Jobs × 2 pods; returns
/// its uid. There is no JobSet controller: [`jobset_job`] plays it.
async fn jobset(client: &Client, ns: &str) -> String {
    let gvk = GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "jobsets");
    let js: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2,
            "template": {"spec": job_template()}}]}
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
        .create(&PostParams::default(), &js)
        .await
        .expect("the JobSet passes the CRD's schema")
        .uid()
        .unwrap()
}

/// Job `j` of the JobSet, as the JobSet controller makes it (labels on the Job and its
/// pod template, owned by the JobSet); the real Job controller then makes its pods.
/// Returns the names of its pods, by index.
async fn jobset_job(client: &Client, ns: &str, js_uid: &str, j: usize) -> Vec<String> {
    let name = format!("js-workers-{j}");
    let labels = json!({JS_NAME: "js", JS_RJOB: "workers", JS_JOB_INDEX: j.to_string(), JS_GLOBAL: j.to_string()});
    let mut spec = job_template();
    spec["template"]["metadata"] = json!({"labels": labels, "annotations": labels});
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": labels,
            "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "name": "js", "uid": js_uid, "controller": true}]},
        "spec": spec,
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let mut names = Vec::new();
    for i in 0..2 {
        names.push(crate::support::jobs::wait_job_pod(client, ns, &name, i, &[]).await);
    }
    names
}

/// A replicated job of two Indexed Jobs numbers each Job's pods from 0. trainlet
/// orders them by the Job's global index, then the pod's, instead of failing on a
/// "duplicate index", and without --expect it waits for all replicas × parallelism
/// pods that the JobSet asks for, not only the Jobs created so far.
#[tokio::test]
async fn jobset_pods_order_by_job_and_count_through_the_jobset() {
    jobset_crd();
    let client = admin().await;
    let ns = namespace(&client, "fw-jobset").await;
    apply_rbac(&ns);
    let dir = tempfile::tempdir().unwrap();
    let kc = sa_kubeconfig(&client, &ns, "trainlet", dir.path()).await;
    let js = jobset(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    let port = free_port().to_string();
    let outs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();

    // Only the first Job's pods exist and run: 2 of the 4 the JobSet asks for.
    let mut names = jobset_job(&client, &ns, &js, 0).await;
    let agent = |n: usize, name: &str| {
        spawn(init_cmd(
            &kc,
            &ns,
            name,
            outs[n].path(),
            &[
                "--job",
                "worker=jobset.sigs.k8s.io/jobset-name=js",
                "--port",
                &port,
                "--timeout",
                "60s",
            ],
        ))
    };
    let mut agents: Vec<_> = (0..2).map(|n| agent(n, &names[n])).collect();
    for (n, ip) in [(0, "10.40.0.1"), (1, "10.40.0.2")] {
        kubelet.run(&names[n], ip).await;
    }
    // No pause to see that nothing resolves yet: agents 0 and 1 ran while only 2 of
    // the 4 pods existed, so each cluster below that lists all 4 shows they waited.
    names.extend(jobset_job(&client, &ns, &js, 1).await);
    agents.extend((2..4).map(|n| agent(n, &names[n])));
    // The second Job's pods turn Running in reverse order.
    for (n, ip) in [(3, "10.40.0.4"), (2, "10.40.0.3")] {
        kubelet.run(&names[n], ip).await;
    }
    let p = &port;
    let cluster = format!(
        "{{\"worker\":[\"10.40.0.1:{p}\",\"10.40.0.2:{p}\",\"10.40.0.3:{p}\",\"10.40.0.4:{p}\"]}}"
    );
    for (n, a) in agents.into_iter().enumerate() {
        let r = a.await.unwrap();
        assert_eq!(r.code, 0, "{}: {}", names[n], r.stderr);
        assert!(
            r.stderr
                .contains("expected count from the owning controller")
                && r.stderr.contains("expected=4"),
            "{}",
            r.stderr
        );
        let tf: Value = serde_json::from_str(
            &std::fs::read_to_string(outs[n].path().join("tf_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(tf["cluster"].to_string(), cluster, "{}", names[n]);
        assert_eq!(
            tf["task"],
            json!({"type": "worker", "index": n}),
            "{}",
            names[n]
        );
    }
}

pub(crate) fn fixture(name: &str) -> String {
    repo()
        .join("tests/fixtures/frameworks")
        .join(name)
        .display()
        .to_string()
}

/// A job of real framework processes: pods `<type>-<i>` with Indexed-Job labels, each
/// its own loopback address `127.0.<net>.<n+2>` and a distinct free named port `fw`
/// (the processes share this machine's port space), one `trainlet exec` per pod on the
/// real API server running `command(pod, rank in creation order, its output dir)`.
struct Training<'a> {
    types: &'a [(&'a str, usize)],
    net: u8,
    flags: &'a [&'a str],
    /// The last pod turns Running only once every other pod's init wrote its files.
    late: bool,
    /// The training container's nvidia.com/gpu limit (no GPU is used: the limit is
    /// what trainlet reads).
    gpus: u32,
}

struct Ran {
    name: String,
    run: Run,
}

impl Training<'_> {
    async fn run(&self, command: impl Fn(&str, usize, &Path) -> Vec<String>) -> Vec<Ran> {
        let client = admin().await;
        let ns = namespace(&client, "fw").await;
        let kubelet = Kubelet::new(&client, &ns);
        let mut pods = Vec::new();
        for (t, n) in self.types {
            for i in 0..*n {
                let name = format!("{t}-{i}");
                let spec = pod(&name)
                    .labels(&format!(
                        "role={t},batch.kubernetes.io/job-completion-index={i}"
                    ))
                    .port("fw", i32::from(free_port()));
                let spec = if self.gpus > 0 {
                    spec.gpus(self.gpus)
                } else {
                    spec
                };
                spec.create(&client, &ns).await;
                pods.push(name);
            }
        }
        let mut flags: Vec<String> = Vec::new();
        for (t, _) in self.types {
            flags.extend(["--job".into(), format!("{t}=role={t}")]);
        }
        let expect: Vec<String> = self.types.iter().map(|(t, n)| format!("{t}={n}")).collect();
        flags.extend(["--expect".into(), expect.join(",")]);
        flags.extend(["--port-name", "fw", "--timeout", "120s"].map(String::from));
        flags.extend(self.flags.iter().map(|s| s.to_string()));
        let dirs: Vec<tempfile::TempDir> =
            pods.iter().map(|_| tempfile::tempdir().unwrap()).collect();
        let mut runs = Vec::new();
        for (k, name) in pods.iter().enumerate() {
            let mut cmd = trainlet();
            cmd.arg("exec")
                .arg("--kubeconfig")
                .arg(kubeconfig())
                .args(["--pod-name", name, "--pod-namespace", &ns])
                .arg("--output-dir")
                .arg(dirs[k].path())
                .args(&flags)
                .arg("--")
                .args(command(name, k, dirs[k].path()))
                // Keep gloo, OpenMPI and TensorFlow on loopback and quiet.
                .env("GLOO_SOCKET_IFNAME", "lo")
                .env("TF_CPP_MIN_LOG_LEVEL", "2")
                .env("TF_ENABLE_ONEDNN_OPTS", "0")
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            runs.push((name.clone(), spawn(cmd)));
        }
        for (k, name) in pods.iter().enumerate() {
            if self.late && k + 1 == pods.len() {
                let early = &dirs[..k];
                eventually("the other pods' init", Duration::from_secs(120), || async {
                    early
                        .iter()
                        .all(|d| d.path().join("tf_config.json").exists())
                        .then_some(())
                })
                .await;
            }
            kubelet
                .run(name, &format!("127.0.{}.{}", self.net, k + 2))
                .await;
        }
        let mut out = Vec::new();
        for (name, r) in runs {
            let run = tokio::time::timeout(Duration::from_secs(240), r)
                .await
                .unwrap_or_else(|_| panic!("{name} did not finish in 240 s"))
                .unwrap();
            out.push(Ran { name, run });
        }
        out
    }
}

/// The last line a process printed that starts with `prefix`.
fn line<'r>(r: &'r Ran, prefix: &str) -> &'r str {
    r.run
        .stdout
        .lines()
        .rev()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| {
            panic!(
                "{}: no line starting with {prefix:?}; exit {}\nstdout:\n{}\nstderr:\n{}",
                r.name, r.run.code, r.run.stdout, r.run.stderr
            )
        })
}

/// Every `rank=…` line the processes printed, sorted.
fn rank_lines(runs: &[Ran]) -> Vec<&str> {
    let mut v: Vec<&str> = runs
        .iter()
        .flat_map(|r| r.run.stdout.lines())
        .filter(|l| l.starts_with("rank="))
        .collect();
    v.sort();
    v
}

/// `rank=0 <rest>` … `rank=<n-1> <rest>`, sorted as [`rank_lines`] sorts (n ≤ 10).
fn expected_ranks(n: usize, rest: &str) -> Vec<String> {
    (0..n).map(|r| format!("rank={r} {rest}")).collect()
}

/// PyTorch from torch.env alone: three pods, one process each, `init_method="env://"`
/// with the gloo backend; every process has its pod's rank and the same sum.
#[tokio::test]
async fn pytorch_forms_a_cluster_from_torch_env() {
    let py = require!(framework_python());
    let job = Training {
        types: &[("worker", 3)],
        net: 11,
        flags: &["--framework", "pytorch"],
        late: false,
        gpus: 0,
    };
    let runs = job
        .run(|_, _, _| vec![py.display().to_string(), fixture("torch_allreduce.py")])
        .await;
    for (k, r) in runs.iter().enumerate() {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
        assert_eq!(
            line(r, "rank="),
            format!("rank={k} world=3 sum=3"),
            "{}",
            r.name
        );
    }
}

/// `torchrun train.py` with no flags: torchrun takes PET_NNODES, PET_NODE_RANK,
/// PET_NPROC_PER_NODE=2 and the master from torch.env; world size 6.
#[tokio::test]
async fn torchrun_needs_no_flags_two_processes_per_pod() {
    let py = require!(framework_python());
    let torchrun = py.with_file_name("torchrun").display().to_string();
    let job = Training {
        types: &[("worker", 3)],
        net: 12,
        flags: &["--framework", "pytorch", "--nproc-per-node", "2"],
        late: false,
        gpus: 0,
    };
    let runs = job
        .run(|_, _, _| vec![torchrun.clone(), fixture("torch_allreduce.py")])
        .await;
    for r in &runs {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
    }
    assert_eq!(rank_lines(&runs), expected_ranks(6, "world=6 sum=15"));
}

/// A plain `python train.py` on pods with 2 GPUs each and no flags: one process per
/// pod, so WORLD_SIZE is the pods (Kubeflow's rule for a non-numeric nprocPerNode), and
/// `init_process_group` forms a world of 3, not 6.
#[tokio::test]
async fn plain_python_on_two_gpu_pods_needs_no_flags() {
    let py = require!(framework_python());
    let job = Training {
        types: &[("worker", 3)],
        net: 18,
        flags: &["--framework", "pytorch"],
        late: false,
        gpus: 2,
    };
    let runs = job
        .run(|_, _, _| vec![py.display().to_string(), fixture("torch_allreduce.py")])
        .await;
    for (k, r) in runs.iter().enumerate() {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
        assert_eq!(line(r, "rank="), format!("rank={k} world=3 sum=3"));
    }
}

/// A bare `torchrun train.py` on the same pods: torchrun reads PET_NPROC_PER_NODE=2
/// (`auto` resolved from the GPU limit) and starts two processes per pod: world 6.
#[tokio::test]
async fn torchrun_on_two_gpu_pods_starts_one_process_per_gpu() {
    let py = require!(framework_python());
    let torchrun = py.with_file_name("torchrun").display().to_string();
    let job = Training {
        types: &[("worker", 3)],
        net: 19,
        flags: &["--framework", "pytorch"],
        late: false,
        gpus: 2,
    };
    let runs = job
        .run(|_, _, _| vec![torchrun.clone(), fixture("torch_allreduce.py")])
        .await;
    for r in &runs {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
    }
    assert_eq!(rank_lines(&runs), expected_ranks(6, "world=6 sum=15"));
}

/// JAX from jax.env: `jax.distributed.initialize()` finds the coordinator itself and
/// is given the count and id; every process's index is its pod's rank.
#[tokio::test]
async fn jax_forms_a_cluster_from_jax_env() {
    let py = require!(framework_python());
    let job = Training {
        types: &[("worker", 3)],
        net: 13,
        flags: &["--framework", "jax"],
        late: false,
        gpus: 0,
    };
    let runs = job
        .run(|_, _, _| vec![py.display().to_string(), fixture("jax_distributed.py")])
        .await;
    for (k, r) in runs.iter().enumerate() {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
        assert_eq!(
            line(r, "count="),
            format!("count=3 index={k} gathered=[0, 1, 2]"),
            "{}",
            r.name
        );
    }
}

/// TensorFlow: a real MultiWorkerMirroredStrategy all-reduce across three workers.
#[tokio::test]
async fn tensorflow_multi_worker_all_reduces_from_tf_config() {
    let py = require!(framework_python());
    let job = Training {
        types: &[("worker", 3)],
        net: 14,
        flags: &[],
        late: false,
        gpus: 0,
    };
    let runs = job
        .run(|_, _, _| vec![py.display().to_string(), fixture("tf_mwms.py")])
        .await;
    for (k, r) in runs.iter().enumerate() {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
        assert_eq!(line(r, "worker/"), format!("worker/{k} replicas=3 sum=3"));
    }
}

/// chief + worker + evaluator: the evaluator is left out of `cluster` but keeps its
/// task, and the strategy of the chief and the worker starts without it.
#[tokio::test]
async fn tensorflow_evaluator_is_left_out_and_the_strategy_starts() {
    let py = require!(framework_python());
    let job = Training {
        types: &[("chief", 1), ("worker", 1), ("evaluator", 1)],
        net: 15,
        flags: &[],
        late: false,
        gpus: 0,
    };
    let runs = job
        .run(|_, _, _| vec![py.display().to_string(), fixture("tf_mwms.py")])
        .await;
    for r in &runs {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
    }
    assert_eq!(line(&runs[0], "chief/"), "chief/0 replicas=2 sum=2");
    assert_eq!(line(&runs[1], "worker/"), "worker/0 replicas=2 sum=2");
    assert_eq!(
        line(&runs[2], "evaluator"),
        "evaluator cluster=chief,worker task=evaluator/0"
    );
}

/// OpenMPI: pod 0 runs `mpirun --hostfile` over the pods' hostfile (the remote launch
/// agent runs each host's part on this machine), and every rank all-reduces. The
/// hostfile is byte for byte mpi-operator's OpenMPI format.
#[tokio::test]
async fn openmpi_runs_across_the_hostfile() {
    let _ = require!(framework_python());
    let build = tempfile::tempdir().unwrap();
    let hello = build.path().join("mpi_hello");
    let cc = std::process::Command::new("mpicc")
        .arg("-o")
        .arg(&hello)
        .arg(fixture("mpi_hello.c"))
        .output()
        .expect("mpicc (OpenMPI, installed by .ci/frameworks)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let hello = hello.display().to_string();
    let job = Training {
        types: &[("worker", 3)],
        net: 16,
        flags: &["--framework", "mpi", "--slots", "2"],
        late: false,
        gpus: 0,
    };
    let runs = job
        .run(|_, k, dir| {
            if k > 0 {
                // The other pods only hold their slots: mpirun reaches them through
                // the launch agent. Their environment has the same hosts.
                return vec![
                    "sh".into(),
                    "-c".into(),
                    "echo hosts=$TRAINLET_HOSTS".into(),
                ];
            }
            let hostfile = dir.join("hostfile").display().to_string();
            let script = format!(
                "cat {hostfile} && exec mpirun --hostfile {hostfile} -np 6 \
                 --mca plm_rsh_agent {agent} --mca btl self,tcp \
                 --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo {hello}",
                agent = fixture("mpi-local-agent"),
            );
            vec!["sh".into(), "-c".into(), script]
        })
        .await;
    for r in &runs {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
    }
    assert_eq!(
        line(&runs[1], "hosts="),
        "hosts=127.0.16.2:2,127.0.16.3:2,127.0.16.4:2"
    );
    let rank0 = &runs[0].run.stdout;
    assert!(
        rank0.starts_with("127.0.16.2 slots=2\n127.0.16.3 slots=2\n127.0.16.4 slots=2\n"),
        "{rank0}"
    );
    assert_eq!(rank_lines(&runs), expected_ranks(6, "size=6 sum=6"));
}

/// Elastic: with `--nnodes 2:3`, init completes once two pods are ready: the first two
/// start torchrun while the third pod is not even Running. The third, Running later,
/// resolves the same rank 0, and torchrun's c10d rendezvous (PET_RDZV_ENDPOINT at rank
/// 0, PET_RDZV_ID) admits it: the world is 3 (torchrun waits up to its last-call
/// timeout, 30 s, for more than MIN nodes).
#[tokio::test]
async fn elastic_init_completes_with_min_and_the_late_pod_joins_the_rendezvous() {
    let py = require!(framework_python());
    let torchrun = py.with_file_name("torchrun").display().to_string();
    let job = Training {
        types: &[("worker", 3)],
        net: 17,
        flags: &["--framework", "pytorch", "--nnodes", "2:3"],
        late: true,
        gpus: 0,
    };
    let runs = job
        .run(|_, _, _| vec![torchrun.clone(), fixture("torch_allreduce.py")])
        .await;
    for r in &runs {
        assert_eq!(r.run.code, 0, "{}: {}", r.name, r.run.stderr);
    }
    // One world of 3: no process started in a world of 2.
    assert_eq!(rank_lines(&runs), expected_ranks(3, "world=3 sum=3"));
    // The early pods resolved a cluster of two; the late one of three.
    let cluster = |r: &Ran| -> Vec<String> {
        r.run
            .stderr
            .lines()
            .filter(|l| l.contains("  INFO wrote "))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|w| w.strip_prefix("cluster="))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(cluster(&runs[0]), ["worker:2"], "{}", runs[0].run.stderr);
    assert_eq!(cluster(&runs[1]), ["worker:2"], "{}", runs[1].run.stderr);
    assert_eq!(cluster(&runs[2]), ["worker:3"], "{}", runs[2].run.stderr);
}

/// A PyTorch cluster re-forms after its master is replaced: an Indexed Job of 3 pods
/// (the real Job controller) all-reduces; pod 0 is deleted and the controller's
/// replacement comes up at a new loopback IP; `trainlet exec --on-peer-change restart`
/// in pods 1 and 2 restarts their CMD with the new MASTER_ADDR, and the three processes
/// all-reduce again.
#[tokio::test]
async fn pytorch_all_reduces_again_after_its_master_is_replaced() {
    use crate::report_support::{Reporter, wait_warning};
    use crate::support::jobs::*;
    use crate::support::rbac_namespace;
    let py = require!(framework_python());
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "reform", dir.path()).await;
    let port = free_port();
    let template_port = json!({"template": {"metadata": {"labels": {"role": "worker"}}, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": false,
        "containers": [{"name": "main", "image": "registry.example/train:1",
            "ports": [{"name": "fw", "containerPort": port}]}]}}});
    indexed_job(&client, &ns, "torch", 3, "role=worker", template_port).await;
    let kubelet = Kubelet::new(&client, &ns);
    let script = format!(
        r#""{}" "{}" >> "$RANKS"; exec sleep 600"#,
        py.display(),
        fixture("torch_allreduce.py")
    );
    let outs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |k: usize, pod: &str| {
        let mut cmd = trainlet();
        cmd.args(["exec", "--kubeconfig"])
            .arg(&kc)
            .args(["--pod-name", pod, "--pod-namespace", &ns, "--output-dir"])
            .arg(outs[k].path().join("out"))
            .args([
                "--job",
                "worker=role=worker",
                "--port-name",
                "fw",
                "--framework",
                "pytorch",
            ])
            .args([
                "--on-peer-change",
                "restart",
                "--restart-backoff",
                "1s",
                "--restart-grace",
                "5s",
            ])
            .args(["--", "sh", "-c", &script])
            .env("RANKS", outs[k].path().join("ranks"))
            .env("GLOO_SOCKET_IFNAME", "lo");
        std::fs::create_dir(outs[k].path().join("out")).unwrap();
        Reporter::start(cmd)
    };
    let ranks = |k: usize| {
        std::fs::read_to_string(outs[k].path().join("ranks"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let wait_ranks = |k: usize, n: usize| async move {
        let what = format!("{n} all-reduces of pod {k}");
        eventually(&what, Duration::from_secs(120), move || async move {
            (ranks(k).len() >= n).then(|| ranks(k))
        })
        .await
    };
    let names = run_job_pods(&client, &ns, "torch", 3, |i| format!("127.0.21.{}", i + 2)).await;
    let mut execs: Vec<Reporter> = (0..3).map(|k| start(k, &names[k])).collect();
    for k in 0..3 {
        assert_eq!(wait_ranks(k, 1).await, [format!("rank={k} world=3 sum=3")]);
    }

    // The master's pod is deleted (its container stopped); once the others have stopped
    // their CMD, the replacement comes up at 127.0.21.9.
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
        .delete(
            &names[0],
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
    execs[0].terminate();
    wait_warning(&client, &ns, "Restarting").await;
    eventually(
        "the master port is free",
        Duration::from_secs(30),
        || async {
            std::net::TcpListener::bind(("0.0.0.0", port))
                .ok()
                .map(drop)
        },
    )
    .await;
    let replacement = wait_job_pod(&client, &ns, "torch", 0, &names[..1]).await;
    kubelet.run(&replacement, "127.0.21.9").await;
    execs.push(start(3, &replacement));

    assert_eq!(wait_ranks(3, 1).await, ["rank=0 world=3 sum=3"]);
    for (k, out) in outs.iter().enumerate().take(3).skip(1) {
        assert_eq!(
            wait_ranks(k, 2).await,
            [
                format!("rank={k} world=3 sum=3"),
                format!("rank={k} world=3 sum=3")
            ]
        );
        let env = std::fs::read_to_string(out.path().join("out/torch.env")).unwrap();
        assert!(env.contains("MASTER_ADDR='127.0.21.9'"), "{env}");
    }
    delete_namespace(&client, &ns).await;
}
