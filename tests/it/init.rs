//! `trainlet init`, `resolve`, `master` and `exec` against the real control plane, with
//! the tests playing the kubelet.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use rand::seq::SliceRandom;
use serde_json::{Value, json};

use crate::support::*;

fn resolve(ns: &str, extra: &[&str]) -> Run {
    run(trainlet()
        .arg("resolve")
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["--pod-namespace", ns])
        .args(extra))
}

async fn running_pods(client: &Client, ns: &str, specs: &[(&str, &str, &str)]) {
    let kubelet = Kubelet::new(client, ns);
    for (name, labels, ip) in specs {
        pod(name).labels(labels).create(client, ns).await;
        kubelet.run(name, ip).await;
    }
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[tokio::test]
async fn tensorflow_parity_name_order_selector_order_and_not_running() {
    let client = admin().await;
    let ns = namespace(&client, "parity").await;
    // The resolver's own unit test: names sorted lexicographically with --order name.
    running_pods(
        &client,
        &ns,
        &[
            ("tensorflow-abc123", "job-name=tensorflow", "10.1.2.3"),
            ("tensorflow-def456", "job-name=tensorflow", "10.1.2.4"),
            ("tensorflow-999999", "job-name=tensorflow", "10.1.2.5"),
            ("first-0", "job-name=first", "10.1.3.1"),
            ("second-0", "job-name=second", "10.1.3.2"),
        ],
    )
    .await;
    let r = resolve(
        &ns,
        &["--job", "worker=job-name=tensorflow", "--order", "name"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "{\"cluster\":{\"worker\":[\"10.1.2.5:8470\",\"10.1.2.3:8470\",\"10.1.2.4:8470\"]}}\n"
    );

    // Two selectors for one type: the first selector's pods come first.
    let r = resolve(
        &ns,
        &[
            "--job",
            "worker=job-name=second",
            "--job",
            "worker=job-name=first",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "{\"cluster\":{\"worker\":[\"10.1.3.2:8470\",\"10.1.3.1:8470\"]}}\n"
    );

    // The same through TensorFlow's own argument.
    let r = resolve(
        &ns,
        &[
            "--job-to-label-mapping",
            r#"{"worker":["job-name=second","job-name=first"]}"#,
        ],
    );
    assert_eq!(
        r.stdout,
        "{\"cluster\":{\"worker\":[\"10.1.3.2:8470\",\"10.1.3.1:8470\"]}}\n"
    );

    // A matched pod that is not running: the resolver's RuntimeError, as exit 3.
    pod("tensorflow-000000")
        .labels("job-name=tensorflow")
        .create(&client, &ns)
        .await;
    let r = resolve(
        &ns,
        &["--job", "worker=job-name=tensorflow", "--order", "name"],
    );
    assert_eq!(r.code, 3);
    assert_eq!(
        r.error_line(),
        "pod \"tensorflow-000000\" is not running; phase: \"Pending\""
    );
    assert_eq!(r.stdout, "");
}

#[tokio::test]
async fn natural_order_and_index_annotations() {
    let client = admin().await;
    let ns = namespace(&client, "order").await;
    let kubelet = Kubelet::new(&client, &ns);
    let mut idx: Vec<usize> = (0..12).collect();
    idx.shuffle(&mut rand::rng());
    for i in &idx {
        let name = format!("worker-{i}");
        pod(&name).labels("role=worker").create(&client, &ns).await;
        kubelet.run(&name, &format!("10.2.0.{i}")).await;
    }
    let r = resolve(&ns, &["--job", "worker=role=worker", "--port", "2222"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let want: Vec<String> = (0..12).map(|i| format!("10.2.0.{i}:2222")).collect();
    assert_eq!(
        r.stdout,
        format!("{}\n", json!({"cluster": {"worker": want}}))
    );

    // Names that sort one way, indexes that say another: the index wins.
    for (name, index, ip) in [
        ("ps-zulu", 0, "10.2.1.1"),
        ("ps-alpha", 2, "10.2.1.3"),
        ("ps-mike", 1, "10.2.1.2"),
    ] {
        pod(name)
            .labels("role=ps")
            .annotation(
                "batch.kubernetes.io/job-completion-index",
                &index.to_string(),
            )
            .create(&client, &ns)
            .await;
        kubelet.run(name, ip).await;
    }
    let r = resolve(&ns, &["--job", "ps=role=ps"]);
    assert_eq!(
        r.stdout,
        "{\"cluster\":{\"ps\":[\"10.2.1.1:8470\",\"10.2.1.2:8470\",\"10.2.1.3:8470\"]}}\n"
    );
    // --order name is TensorFlow's lexicographic order and ignores the index.
    let r = resolve(&ns, &["--job", "ps=role=ps", "--order", "name"]);
    assert_eq!(
        r.stdout,
        "{\"cluster\":{\"ps\":[\"10.2.1.3:8470\",\"10.2.1.2:8470\",\"10.2.1.1:8470\"]}}\n"
    );
}

/// The heart of it: six init containers start before any pod runs; the kubelet brings
/// the pods up in random order; all six agree.
#[tokio::test]
async fn six_agents_started_before_any_pod_runs_agree() {
    let client = admin().await;
    let ns = namespace(&client, "conc").await;
    let names = [
        "ps-0", "ps-1", "worker-0", "worker-1", "worker-2", "worker-3",
    ];
    for n in names {
        let role = n.split('-').next().unwrap();
        pod(n)
            .labels(&format!("app=mnist,role={role}"))
            .create(&client, &ns)
            .await;
    }
    let port = free_port().to_string();
    let dirs: Vec<tempfile::TempDir> = names.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let agents: Vec<_> = names
        .iter()
        .zip(&dirs)
        .map(|(n, d)| {
            spawn_logged(init_cmd(
                kubeconfig(),
                &ns,
                n,
                d.path(),
                &[
                    "--job",
                    "ps=app=mnist,role=ps",
                    "--job",
                    "worker=app=mnist,role=worker",
                    "--expect",
                    "ps=2,worker=4",
                    "--port",
                    &port,
                    "--timeout",
                    "60s",
                ],
            ))
        })
        .collect();
    // Every agent waits before the first pod runs.
    for a in &agents {
        a.logged("waiting for peers: ").await;
    }
    let kubelet = Kubelet::new(&client, &ns);
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.shuffle(&mut rand::rng());
    for i in order {
        kubelet.run(names[i], &format!("10.3.0.{}", i + 1)).await;
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..150))).await;
    }
    let mut clusters = BTreeSet::new();
    for ((name, dir), agent) in names.iter().zip(&dirs).zip(agents) {
        let r = agent.run.await.unwrap();
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        let tf: Value = serde_json::from_str(&read(dir.path(), "tf_config.json")).unwrap();
        let (ty, idx) = name.split_once('-').unwrap();
        assert_eq!(
            tf["task"],
            json!({"type": ty, "index": idx.parse::<u32>().unwrap()}),
            "{name}"
        );
        clusters.insert(tf["cluster"].to_string());
    }
    assert_eq!(
        clusters.len(),
        1,
        "byte-identical cluster sections: {clusters:?}"
    );
    let p = &port;
    assert_eq!(
        read(dirs[3].path(), "tf_config.json"),
        format!(
            "{{\"cluster\":{{\"ps\":[\"10.3.0.1:{p}\",\"10.3.0.2:{p}\"],\"worker\":[\"10.3.0.3:{p}\",\"10.3.0.4:{p}\",\"10.3.0.5:{p}\",\"10.3.0.6:{p}\"]}},\"task\":{{\"type\":\"worker\",\"index\":1}}}}\n"
        )
    );
    let tf_json = read(dirs[3].path(), "tf_config.json");
    assert_eq!(
        read(dirs[3].path(), "trainlet.env"),
        format!(
            "# Written by trainlet init. Source it: . trainlet.env\n\
             export TF_CONFIG='{}'\nexport TRAINLET_TASK_TYPE='worker'\nexport TRAINLET_TASK_INDEX='1'\n\
             export VC_PS_HOSTS='10.3.0.1,10.3.0.2'\nexport VC_PS_NUM='2'\n\
             export VC_WORKER_HOSTS='10.3.0.3,10.3.0.4,10.3.0.5,10.3.0.6'\nexport VC_WORKER_NUM='4'\n\
             export VC_TASK_INDEX='1'\nexport VK_TASK_INDEX='1'\n",
            tf_json.trim()
        )
    );
    // Every framework's file, in the rank order of --job: ps before worker, so worker
    // 1 is rank 3; --port was given, so it is also the rendezvous port.
    assert_eq!(
        read(dirs[3].path(), "torch.env"),
        format!(
            "# Written by trainlet init. Source it: . torch.env\n\
             export MASTER_ADDR='10.3.0.1'\nexport MASTER_PORT='{p}'\nexport WORLD_SIZE='6'\nexport RANK='3'\n\
             export PET_NNODES='6'\nexport PET_NODE_RANK='3'\nexport PET_NPROC_PER_NODE='1'\n\
             export PET_MASTER_ADDR='10.3.0.1'\nexport PET_MASTER_PORT='{p}'\n"
        )
    );
    assert_eq!(
        read(dirs[3].path(), "jax.env"),
        format!(
            "# Written by trainlet init. Source it: . jax.env\n\
             export JAX_COORDINATOR_ADDRESS='10.3.0.1:{p}'\nexport JAX_NUM_PROCESSES='6'\nexport JAX_PROCESS_ID='3'\n\
             export COORDINATOR_ADDRESS='10.3.0.1'\nexport COORDINATOR_PORT='{p}'\nexport NUM_PROCESSES='6'\nexport PROCESS_ID='3'\n"
        )
    );
    assert_eq!(
        read(dirs[3].path(), "hostfile"),
        "10.3.0.1 slots=1\n10.3.0.2 slots=1\n10.3.0.3 slots=1\n10.3.0.4 slots=1\n10.3.0.5 slots=1\n10.3.0.6 slots=1\n"
    );
    assert_eq!(
        read(dirs[3].path(), "mpi.env"),
        "# Written by trainlet init. Source it: . mpi.env\n\
         export TRAINLET_HOSTS='10.3.0.1:1,10.3.0.2:1,10.3.0.3:1,10.3.0.4:1,10.3.0.5:1,10.3.0.6:1'\n"
    );
    assert_eq!(read(dirs[3].path(), "ps.host"), "10.3.0.1\n10.3.0.2");
    assert_eq!(
        read(dirs[3].path(), "worker.host"),
        "10.3.0.3\n10.3.0.4\n10.3.0.5\n10.3.0.6"
    );
    let cluster: Value = serde_json::from_str(&read(dirs[3].path(), "cluster.json")).unwrap();
    assert_eq!(cluster["master"], format!("grpc://10.3.0.4:{p}"));
    assert_eq!(cluster["peers"][3]["name"], "worker-1");
    assert_eq!(cluster["peers"][3]["node"], "node-a");
    assert_eq!(
        cluster["ranks"],
        json!([
            "ps/0", "ps/1", "worker/0", "worker/1", "worker/2", "worker/3"
        ])
    );
    assert_eq!(cluster["rank"], 3);

    // Every pod records its task, and says so in an Event.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for n in names {
        let p = api.get(n).await.unwrap();
        let ann = p.metadata.annotations.unwrap_or_default();
        assert_eq!(
            ann.get("trainlet.io/task").map(String::as_str),
            Some(n.replacen('-', "/", 1).as_str())
        );
    }
    let evs = events(&client, &ns).await;
    let resolved: Vec<_> = evs.iter().filter(|e| e.1 == "PeersResolved").collect();
    assert_eq!(resolved.len(), 6, "{evs:?}");
    let w1 = resolved.iter().find(|e| e.3 == "worker-1").unwrap();
    assert_eq!(w1.0, "Normal");
    assert!(
        w1.2.starts_with("worker/1 of ps:2,worker:4 after "),
        "{}",
        w1.2
    );

    // master reads cluster.json; exec runs the command with TF_CONFIG set.
    let r = run(trainlet()
        .args([
            "master",
            "--task-type",
            "worker",
            "--task-id",
            "2",
            "--output-dir",
        ])
        .arg(dirs[0].path()));
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, format!("grpc://10.3.0.5:{p}\n").as_str())
    );
    let r = run(trainlet()
        .args(["exec", "--output-dir"])
        .arg(dirs[3].path())
        .args([
            "--",
            "sh",
            "-c",
            "printf '%s|%s|%s' \"$TF_CONFIG\" \"$TRAINLET_TASK_TYPE\" \"$TRAINLET_TASK_INDEX\"",
        ]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, format!("{}|worker|1", tf_json.trim()));
    let r = run(trainlet()
        .args(["exec", "--output-dir"])
        .arg(dirs[3].path())
        .args(["--", "sh", "-c", "exit 7"]));
    assert_eq!(r.code, 7);
    let r = run(trainlet()
        .args(["exec", "--output-dir"])
        .arg(dirs[3].path())
        .args(["--", "/no/such/program"]));
    assert_eq!(r.code, 127);
    assert_eq!(
        r.error_line(),
        "cannot run \"/no/such/program\": No such file or directory (os error 2)"
    );
}

#[tokio::test]
async fn other_namespaces_terminal_and_terminating_pods_are_not_peers() {
    let client = admin().await;
    let ns = namespace(&client, "iso").await;
    let decoy_ns = namespace(&client, "decoy").await;
    running_pods(
        &client,
        &decoy_ns,
        &[("worker-5", "app=iso,role=worker", "10.9.9.9")],
    )
    .await;
    let kubelet = Kubelet::new(&client, &ns);
    // A pod the Job left behind before a retry, and its replacement.
    running_pods(
        &client,
        &ns,
        &[("worker-0-old", "app=iso,role=worker", "10.4.0.9")],
    )
    .await;
    kubelet.phase("worker-0-old", "Failed").await;
    // A terminating pod: deleted, held by a finalizer.
    let mut held = pod("worker-1-old").labels("app=iso,role=worker").to_pod();
    held.metadata.finalizers = Some(vec!["trainlet.test/hold".into()]);
    Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &held)
        .await
        .unwrap();
    kubelet.run("worker-1-old", "10.4.0.8").await;
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("worker-1-old", &DeleteParams::default())
        .await
        .unwrap();
    running_pods(
        &client,
        &ns,
        &[
            ("worker-0", "app=iso,role=worker", "10.4.0.1"),
            ("worker-1", "app=iso,role=worker", "10.4.0.2"),
        ],
    )
    .await;

    let out = tempfile::tempdir().unwrap();
    let r = run(&mut init_cmd(
        kubeconfig(),
        &ns,
        "worker-0",
        out.path(),
        &[
            "--job",
            "worker=app=iso,role=worker",
            "--expect",
            "worker=2",
            "--timeout",
            "20s",
            "--port",
            &free_port().to_string(),
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let tf: Value = serde_json::from_str(&read(out.path(), "tf_config.json")).unwrap();
    let port = tf["cluster"]["worker"][0]
        .as_str()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_string();
    assert_eq!(
        tf["cluster"],
        json!({"worker": [format!("10.4.0.1:{port}"), format!("10.4.0.2:{port}")]})
    );
    assert_eq!(tf["task"], json!({"type": "worker", "index": 0}));
}

#[tokio::test]
async fn timeout_names_the_pending_pod_and_its_reason() {
    let client = admin().await;
    let ns = namespace(&client, "timeout").await;
    running_pods(&client, &ns, &[("w-0", "role=w", "10.5.0.1")]).await;
    pod("w-1").labels("role=w").create(&client, &ns).await;
    Kubelet::new(&client, &ns)
        .unschedulable(
            "w-1",
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        )
        .await;
    let out = tempfile::tempdir().unwrap();
    // The kubelet's empty termination log, outside the output directory.
    let logs = tempfile::tempdir().unwrap();
    let termination = logs.path().join("termination-log");
    std::fs::write(&termination, "").unwrap();
    let mut cmd = init_cmd(
        kubeconfig(),
        &ns,
        "w-0",
        out.path(),
        &[
            "--job",
            "worker=role=w",
            "--expect",
            "worker=3",
            "--timeout",
            "2s",
        ],
    );
    cmd.env("TRAINLET_TERMINATION_LOG", &termination);
    let r = run(&mut cmd);
    assert_eq!(r.code, 3, "{}", r.stderr);
    let msg = "peers not ready after 2s: worker: expected 3, ready 1 of 2 live (1 missing); pod \"w-1\" is Pending (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)";
    assert_eq!(r.error_line(), msg);
    assert_eq!(list_dir(out.path()), Vec::<String>::new());
    // `kubectl describe pod` shows the same line for the failed init container.
    assert_eq!(
        std::fs::read_to_string(&termination).unwrap(),
        format!("trainlet: {msg}")
    );
    let evs = events(&client, &ns).await;
    assert!(
        evs.contains(&(
            "Warning".into(),
            "PeerWaitTimeout".into(),
            msg.into(),
            "w-0".into()
        )),
        "{evs:?}"
    );
}

#[tokio::test]
async fn expected_count_comes_from_the_owning_job_or_fails_asking_for_expect() {
    let client = admin().await;
    let ns = namespace(&client, "owner").await;
    // The real Job controller makes the pods (owned by the Job); the test runs them.
    crate::support::jobs::indexed_job(&client, &ns, "w", 2, "app=owned", json!({})).await;
    let names =
        crate::support::jobs::run_job_pods(&client, &ns, "w", 2, |i| format!("10.6.0.{i}")).await;
    // Run as the manifests' ServiceAccount: its Role must allow reading the Job.
    apply_rbac(&ns);
    let dir = tempfile::tempdir().unwrap();
    let kc = sa_kubeconfig(&client, &ns, "trainlet", dir.path()).await;
    let out = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let r = run(&mut init_cmd(
        &kc,
        &ns,
        &names[1],
        out.path(),
        &[
            "--job",
            "worker=app=owned",
            "--timeout",
            "20s",
            "--port",
            &port,
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        read(out.path(), "tf_config.json"),
        format!(
            "{{\"cluster\":{{\"worker\":[\"10.6.0.0:{port}\",\"10.6.0.1:{port}\"]}},\"task\":{{\"type\":\"worker\",\"index\":1}}}}\n"
        )
    );

    // No owner and no --expect: exit 2, asking for --expect.
    running_pods(&client, &ns, &[("loner", "app=loner", "10.6.1.1")]).await;
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut init_cmd(
        kubeconfig(),
        &ns,
        "loner",
        out.path(),
        &["--job", "worker=app=loner", "--timeout", "20s"],
    ));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        "cannot determine how many worker pods to expect: pod \"loner\" has no owning Job, StatefulSet or ReplicaSet; pass --expect worker=N"
    );
    assert_eq!(list_dir(out.path()), Vec::<String>::new());
}

/// A pod whose init starts after the other pod of its Indexed Job completed (a slower
/// node): the completed pod's index is never run again, and init counts it at its last
/// address instead of waiting for it until --timeout. The Job controller keeps it.
#[tokio::test]
async fn a_peer_that_completed_its_index_counts_for_a_late_pod() {
    let client = admin().await;
    let ns = namespace(&client, "late").await;
    crate::support::jobs::indexed_job(&client, &ns, "w", 2, "app=late", json!({})).await;
    let names =
        crate::support::jobs::run_job_pods(&client, &ns, "w", 2, |i| format!("10.6.2.{i}")).await;
    let kubelet = Kubelet::new(&client, &ns);
    kubelet.phase(&names[0], "Succeeded").await;
    eventually(
        "the Job to count pod 0",
        Duration::from_secs(30),
        || async {
            let job = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), &ns)
                .get("w")
                .await
                .unwrap();
            (job.status?.succeeded? == 1).then_some(())
        },
    )
    .await;
    let out = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let started = std::time::Instant::now();
    let r = run(&mut init_cmd(
        kubeconfig(),
        &ns,
        &names[1],
        out.path(),
        &[
            "--job",
            "worker=app=late",
            "--timeout",
            "10s",
            "--port",
            &port,
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        read(out.path(), "tf_config.json"),
        format!(
            "{{\"cluster\":{{\"worker\":[\"10.6.2.0:{port}\",\"10.6.2.1:{port}\"]}},\"task\":{{\"type\":\"worker\",\"index\":1}}}}\n"
        )
    );
    // The Job controller made no pod for the completed index.
    assert_eq!(
        crate::support::jobs::job_pods(&client, &ns, "w")
            .await
            .len(),
        2
    );
    delete_namespace(&client, &ns).await;
}

/// A ServiceAccount bound to a Role with only these verbs on pods, and its kubeconfig.
async fn sa_with_pod_role(
    client: &Client,
    ns: &str,
    name: &str,
    verbs: &str,
    dir: &Path,
) -> std::path::PathBuf {
    kubectl(&["create", "serviceaccount", name, "-n", ns]);
    kubectl(&[
        "create",
        "role",
        name,
        "-n",
        ns,
        &format!("--verb={verbs}"),
        "--resource=pods",
    ]);
    kubectl(&[
        "create",
        "rolebinding",
        name,
        "-n",
        ns,
        &format!("--role={name}"),
        &format!("--serviceaccount={ns}:{name}"),
    ]);
    sa_kubeconfig(client, ns, name, dir).await
}

#[tokio::test]
async fn rbac_from_the_manifests_suffices_and_a_missing_watch_is_named() {
    let client = admin().await;
    let ns = namespace(&client, "rbac").await;
    apply_rbac(&ns);
    running_pods(&client, &ns, &[("w-0", "role=w", "10.7.0.1")]).await;
    let dir = tempfile::tempdir().unwrap();
    let kc = sa_kubeconfig(&client, &ns, "trainlet", dir.path()).await;
    let out = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let r = run(&mut init_cmd(
        &kc,
        &ns,
        "w-0",
        out.path(),
        &[
            "--job",
            "worker=role=w",
            "--expect",
            "worker=1",
            "--port",
            &port,
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        !r.stderr.contains("WARN"),
        "annotation and event are allowed: {}",
        r.stderr
    );
    assert_eq!(
        read(out.path(), "tf_config.json"),
        format!(
            "{{\"cluster\":{{\"worker\":[\"10.7.0.1:{port}\"]}},\"task\":{{\"type\":\"worker\",\"index\":0}}}}\n"
        )
    );

    // A Role that can read pods but neither patch them nor write Events: the files are
    // what the job needs, so init warns and succeeds.
    let kc = sa_with_pod_role(&client, &ns, "readonly", "get,list,watch", dir.path()).await;
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut init_cmd(
        &kc,
        &ns,
        "w-0",
        out.path(),
        &[
            "--job",
            "worker=role=w",
            "--expect",
            "worker=1",
            "--port",
            &port,
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains(&format!(
        "could not annotate the pod with its task: forbidden: cannot patch pods in namespace \"{ns}\": the Role bound to ServiceAccount {ns}:readonly lacks verb \"patch\" on \"pods\""
    )), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("could not emit the PeersResolved event: forbidden: cannot create events"),
        "{}",
        r.stderr
    );
    assert_eq!(list_dir(out.path()), WORKER_JOB_FILES);

    // A Role without watch: exit 4, naming the verb and the resource. (With every peer
    // ready at the first list, no watch is needed and none is made; so a second peer is
    // still missing here, as it is when init containers start.)
    let kc = sa_with_pod_role(&client, &ns, "limited", "get,list,patch", dir.path()).await;
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut init_cmd(
        &kc,
        &ns,
        "w-0",
        out.path(),
        &[
            "--job",
            "worker=role=w",
            "--expect",
            "worker=2",
            "--timeout",
            "20s",
        ],
    ));
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!(
            "forbidden: cannot watch pods in namespace \"{ns}\": the Role bound to ServiceAccount {ns}:limited lacks verb \"watch\" on \"pods\"; apply manifests/rbac.yaml (pods is forbidden: User \"system:serviceaccount:{ns}:limited\" cannot watch resource \"pods\" in API group \"\" in the namespace \"{ns}\")"
        )
    );
    assert_eq!(list_dir(out.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_real_listener_on_the_port_gives_exit_6_and_writes_nothing() {
    let client = admin().await;
    let ns = namespace(&client, "port").await;
    running_pods(&client, &ns, &[("w-0", "role=w", "10.8.0.1")]).await;
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut init_cmd(
        kubeconfig(),
        &ns,
        "w-0",
        out.path(),
        &[
            "--job",
            "worker=role=w",
            "--expect",
            "worker=1",
            "--port",
            &port,
        ],
    ));
    assert_eq!(r.code, 6, "{}", r.stderr);
    let msg = format!("port {port} is already in use in this pod's network namespace");
    assert_eq!(r.error_line(), msg);
    assert_eq!(list_dir(out.path()), Vec::<String>::new());
    let evs = events(&client, &ns).await;
    assert!(
        evs.contains(&("Warning".into(), "PortConflict".into(), msg, "w-0".into())),
        "{evs:?}"
    );
    drop(listener);
}

/// hostNetwork: init checks the ports the chosen frameworks listen on, not
/// TensorFlow's for every job (before, a PyTorch job exited 6 with the node's 8470
/// held and 0 with its MASTER_PORT held).
#[tokio::test]
async fn a_pytorch_job_checks_master_port_not_the_tensorflow_port() {
    let client = admin().await;
    let ns = namespace(&client, "port-torch").await;
    running_pods(&client, &ns, &[("w-0", "role=w", "10.8.0.2")]).await;
    let tf_port = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let tf = tf_port.local_addr().unwrap().port().to_string();
    let master = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let master_port = master.local_addr().unwrap().port().to_string();
    let init = |out: &std::path::Path, master: &str| {
        run(&mut init_cmd(
            kubeconfig(),
            &ns,
            "w-0",
            out,
            &[
                "--job",
                "worker=role=w",
                "--expect",
                "worker=1",
                "--port",
                &tf,
                "--framework",
                "pytorch",
                "--master-port",
                master,
            ],
        ))
    };
    // TensorFlow's port held, PyTorch's free: fine.
    let out = tempfile::tempdir().unwrap();
    let free = free_port().to_string();
    let r = init(out.path(), &free);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let torch = std::fs::read_to_string(out.path().join("torch.env")).unwrap();
    assert!(
        torch.contains(&format!("export MASTER_PORT='{free}'\n")),
        "{torch}"
    );
    // MASTER_PORT held on rank 0: exit 6, nothing written.
    let out = tempfile::tempdir().unwrap();
    let r = init(out.path(), &master_port);
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!("port {master_port} is already in use in this pod's network namespace")
    );
    assert_eq!(list_dir(out.path()), Vec::<String>::new());
    drop((tf_port, master));
}

#[tokio::test]
async fn exec_runs_init_first_when_no_tf_config_exists() {
    let client = admin().await;
    let ns = namespace(&client, "exec").await;
    running_pods(&client, &ns, &[("chief-0", "role=chief", "10.8.1.1")]).await;
    let out = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let r = run(trainlet()
        .arg("exec")
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args([
            "--pod-name",
            "chief-0",
            "--pod-namespace",
            &ns,
            "--job",
            "chief=role=chief",
            "--expect",
            "chief=1",
            "--port",
            &port,
            "--environment",
            "cloud",
        ])
        .arg("--output-dir")
        .arg(out.path())
        .args(["--", "sh", "-c", "echo \"$TF_CONFIG\""]));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let want = format!(
        "{{\"cluster\":{{\"chief\":[\"10.8.1.1:{port}\"]}},\"task\":{{\"type\":\"chief\",\"index\":0}},\"environment\":\"cloud\"}}"
    );
    assert_eq!(r.stdout, format!("{want}\n"));
    assert_eq!(read(out.path(), "tf_config.json"), format!("{want}\n"));
}

/// Every selector trainlet accepts, the API server accepts too: a sample of generated
/// selectors in every form, each sent as a real list's labelSelector.
#[tokio::test]
async fn every_selector_trainlet_accepts_kubernetes_accepts() {
    let client = admin().await;
    let ns = namespace(&client, "selectors").await;
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let name = "([a-zA-Z0-9]([a-zA-Z0-9._-]{0,10}[a-zA-Z0-9])?)?";
    let key = "([a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,2}/)?[a-zA-Z0-9]([a-zA-Z0-9._-]{0,10}[a-zA-Z0-9])?";
    let req = prop_oneof![
        (key, name).prop_map(|(k, v)| format!("{k}={v}")),
        (key, name).prop_map(|(k, v)| format!("{k} == {v}")),
        (key, name).prop_map(|(k, v)| format!("{k}!={v}")),
        key.prop_map(|k| k.to_string()),
        key.prop_map(|k| format!("!{k}")),
        (key, proptest::collection::vec(name, 1..4))
            .prop_map(|(k, vs)| format!("{k} in ({})", vs.join(","))),
        (key, proptest::collection::vec(name, 1..4))
            .prop_map(|(k, vs)| format!("{k} notin ( {} )", vs.join(" , "))),
    ];
    let selectors = proptest::collection::vec(req, 1..4).prop_map(|r| r.join(","));
    let mut runner = TestRunner::new(Config {
        cases: 64,
        rng_seed: RngSeed::Fixed(14),
        failure_persistence: None,
        ..Config::default()
    });
    let mut sample = Vec::new();
    for _ in 0..64 {
        let s = selectors.new_tree(&mut runner).unwrap().current();
        if trainlet::cluster::selector::parse(&s).is_ok() {
            sample.push(s);
        }
    }
    assert!(sample.len() >= 48, "only {} accepted", sample.len());
    for s in &sample {
        let parsed = trainlet::cluster::selector::parse(s).unwrap().to_string();
        for sel in [s.as_str(), parsed.as_str()] {
            if let Err(e) = api.list(&ListParams::default().labels(sel)).await {
                panic!("trainlet accepts {sel:?} but the API server refuses it: {e}");
            }
        }
    }
}

/// Two running pods with DNS names (`w-0.ml.NS.svc.cluster.local`, ...), and the init
/// command of `w-0` with `--address dns` and `extra`.
async fn dns_pods(client: &Client, ns: &str, out: &Path, extra: &[&str]) -> std::process::Command {
    let kubelet = Kubelet::new(client, ns);
    for (name, ip) in [("w-0", "10.9.0.1"), ("w-1", "10.9.0.2")] {
        pod(name)
            .labels("role=w")
            .dns(name, "ml")
            .create(client, ns)
            .await;
        kubelet.run(name, ip).await;
    }
    let port = free_port().to_string();
    let mut args = vec![
        "--job",
        "worker=role=w",
        "--expect",
        "worker=2",
        "--address",
        "dns",
        "--port",
        &port,
    ];
    args.extend(extra);
    init_cmd(kubeconfig(), ns, "w-0", out, &args)
}

/// `--address dns`: init waits until each name resolves (through the real system
/// resolver, from a real DNS server) to its pod's IP, saying which peer it waits for,
/// and writes the names once they do.
#[tokio::test]
async fn dns_addresses_wait_until_the_names_resolve_to_the_pod_ips() {
    let client = admin().await;
    let ns = namespace(&client, "dns").await;
    let out = tempfile::tempdir().unwrap();
    let cmd = dns_pods(&client, &ns, out.path(), &["--timeout", "90s"]).await;
    let dns = crate::support::dns::DnsServer::start();
    let (n0, n1) = (
        format!("w-0.ml.{ns}.svc.cluster.local"),
        format!("w-1.ml.{ns}.svc.cluster.local"),
    );
    dns.set(&n0, "10.9.0.1");
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("stderr");
    let mut child = dns
        .command(&cmd)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let waiting = format!(
        "waiting for DNS: peer worker/1 ({n1}) does not resolve to its pod IP 10.9.0.2 yet (lookup failed: "
    );
    eventually(
        "init to log the peer it waits for",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            std::future::ready(text.contains(&waiting).then_some(()))
        },
    )
    .await;
    // A stale record (the IP of a replaced pod) is waited out too.
    dns.set(&n1, "10.9.0.99");
    let stale = format!(
        "waiting for DNS: peer worker/1 ({n1}) does not resolve to its pod IP 10.9.0.2 yet (resolves to 10.9.0.99)"
    );
    eventually(
        "init to log the stale record",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            std::future::ready(text.contains(&stale).then_some(()))
        },
    )
    .await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(list_dir(out.path()), Vec::<String>::new());
    dns.set(&n1, "10.9.0.2");
    let status = eventually("init to finish", Duration::from_secs(60), || {
        std::future::ready(child.try_wait().unwrap())
    })
    .await;
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    let tf: Value = serde_json::from_str(&read(out.path(), "tf_config.json")).unwrap();
    let port = tf["cluster"]["worker"][0]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        tf["cluster"],
        json!({"worker": [format!("{n0}:{port}"), format!("{n1}:{port}")]})
    );
    assert!(
        stderr.contains("every peer's DNS name resolves to its pod IP"),
        "{stderr}"
    );
}

/// `--address dns` past `--timeout`: exit 3 with one line naming the peer, its name,
/// what it resolves to and the IP wanted, and nothing written.
#[tokio::test]
async fn dns_addresses_that_never_resolve_exit_3_naming_the_peer() {
    let client = admin().await;
    let ns = namespace(&client, "dns-timeout").await;
    let out = tempfile::tempdir().unwrap();
    let cmd = dns_pods(&client, &ns, out.path(), &["--timeout", "3s"]).await;
    let dns = crate::support::dns::DnsServer::start();
    dns.set(&format!("w-0.ml.{ns}.svc.cluster.local"), "10.9.0.1");
    dns.set(&format!("w-1.ml.{ns}.svc.cluster.local"), "10.9.0.99");
    let r = run(&mut dns.command(&cmd));
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!(
            "peer worker/1 (w-1.ml.{ns}.svc.cluster.local) does not resolve to its pod IP 10.9.0.2 yet (resolves to 10.9.0.99) after 3s: is there a headless Service named ml in namespace {ns} with publishNotReadyAddresses: true (trainlet inject --address dns adds one), and does the pod's DNS reach it?"
        )
    );
    assert_eq!(list_dir(out.path()), Vec::<String>::new());
}

/// WatchList: `trainlet init` gets its selector's pods as the initial events of one
/// watch (`sendInitialEvents`), not as a list plus a watch; the API server counts each
/// such request in `apiserver_watch_list_duration_seconds`. Both versions the tests run
/// serve it by default (`make test-k8s-previous` runs this on the previous one). On a
/// control plane of its own, whose controllers watch no pods, so that the count is
/// trainlet's alone.
#[tokio::test]
async fn the_api_server_streams_the_initial_pods() {
    let cp =
        PrivateControlPlane::start_with("watchlist", Some("serviceaccount,serviceaccount-token"));
    let client = client_from(&cp.kubeconfig).await;
    let ns = namespace(&client, "watchlist").await;
    let kubelet = Kubelet::new(&client, &ns);
    for i in 0..2 {
        pod(&format!("w-{i}"))
            .labels("role=w")
            .create(&client, &ns)
            .await;
        kubelet.run(&format!("w-{i}"), &format!("10.4.0.{i}")).await;
    }
    let before = watch_lists_of_pods(&cp);
    let dir = tempfile::tempdir().unwrap();
    let r = run(&mut init_cmd(
        &cp.kubeconfig,
        &ns,
        "w-0",
        dir.path(),
        &[
            "--job",
            "worker=role=w",
            "--expect",
            "worker=2",
            "--timeout",
            "60s",
        ],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        read(dir.path(), "tf_config.json"),
        "{\"cluster\":{\"worker\":[\"10.4.0.0:8470\",\"10.4.0.1:8470\"]},\"task\":{\"type\":\"worker\",\"index\":0}}\n"
    );
    assert!(
        !r.stderr.contains("does not stream initial events"),
        "init fell back to list + watch: {}",
        r.stderr
    );
    assert_eq!(watch_lists_of_pods(&cp) - before, 1, "{}", r.stderr);
}

/// The API server's count of finished watch-list requests for pods (0 before the first).
fn watch_lists_of_pods(cp: &PrivateControlPlane) -> u64 {
    let file = |f: &str| {
        std::fs::read_to_string(cp.dir.join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    let out = std::process::Command::new("curl")
        .args(["-sSf", "--max-time", "10", "--cacert"])
        .arg(cp.dir.join("pki/ca.crt"))
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", file("admin.token")))
        .arg(format!(
            "https://127.0.0.1:{}/metrics",
            file("apiserver.port")
        ))
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find(|l| {
            l.starts_with("apiserver_watch_list_duration_seconds_count{")
                && l.contains("resource=\"pods\"")
                && l.contains("scope=\"namespace\"")
        })
        .map_or(0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}
