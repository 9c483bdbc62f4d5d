//! Coordinated mode (`--coordinate`): task 0 of the first type resolves and publishes
//! the cluster on its pod; the other agents watch only that pod. The files are the
//! same as when every agent watches every peer; a resolver pod that goes away is
//! waited for or named in the timeout; a forged or broken annotation is never used.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::support::*;

const INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// A 1 ps + 3 worker job, as Indexed Jobs label their pods.
async fn job(client: &Client, ns: &str) -> Vec<(String, String)> {
    let mut pods = Vec::new();
    for (t, n) in [("ps", 1), ("worker", 3)] {
        for i in 0..n {
            let name = format!("{t}-{i}");
            pod(&name)
                .labels(&format!("role={t},{INDEX}={i}"))
                .create(client, ns)
                .await;
            pods.push((name, t.to_string()));
        }
    }
    pods
}

fn agent(
    ns: &str,
    pod: &str,
    out: &Path,
    port: &str,
    coordinate: &str,
    timeout: &str,
) -> std::process::Command {
    init_cmd(
        kubeconfig(),
        ns,
        pod,
        out,
        &[
            "--job",
            "ps=role=ps",
            "--job",
            "worker=role=worker",
            "--expect",
            "ps=1,worker=3",
            "--port",
            port,
            "--coordinate",
            coordinate,
            "--timeout",
            timeout,
        ],
    )
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap()
}

/// cluster.json without the fields that are each agent's own (when, how long, its part
/// in coordinating after the start, and the peers' slots, which only an agent that
/// watched every peer knows and only its reporters' watch of every peer uses: a
/// follower's watches the resolver pod), and that part.
fn cluster_json(dir: &Path) -> (Value, Value) {
    let mut v: Value = serde_json::from_str(&read(dir, "cluster.json")).unwrap();
    let o = v.as_object_mut().unwrap();
    assert!(o.remove("resolved_at").is_some());
    assert!(o.remove("waited_seconds").is_some());
    let coordination = o.remove("coordination").unwrap_or(Value::Null);
    for p in o["peers"].as_array_mut().unwrap() {
        p.as_object_mut().unwrap().remove("slot");
    }
    (v, coordination)
}

#[tokio::test]
async fn both_modes_write_the_same_files_for_the_same_pods() {
    let client = admin().await;
    let ns = namespace(&client, "coord-same").await;
    let pods = job(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    for (i, (name, _)) in pods.iter().enumerate() {
        kubelet.run(name, &format!("10.40.0.{}", i + 1)).await;
    }
    let port = free_port().to_string();
    let mut dirs = Vec::new();
    for mode in ["never", "always"] {
        let runs: Vec<_> = pods
            .iter()
            .map(|(name, _)| {
                let d = tempfile::tempdir().unwrap();
                let h = spawn(agent(&ns, name, d.path(), &port, mode, "60s"));
                (d, h)
            })
            .collect();
        let mut out = Vec::new();
        for ((name, _), (d, h)) in pods.iter().zip(runs) {
            let r = h.await.unwrap();
            assert_eq!(r.code, 0, "{mode} {name}: {}", r.stderr);
            if mode == "always" && name != "ps-0" {
                let waiting: Vec<&str> = r
                    .stderr
                    .lines()
                    .filter_map(|l| l.split_once("  INFO waiting for peers ").map(|(_, m)| m))
                    .collect();
                assert_eq!(
                    waiting,
                    [format!(
                        "pod={name} namespace={ns} role=Follower {{ selector: \"role=ps,batch.kubernetes.io/job-completion-index=0\" }}"
                    )],
                    "{}",
                    r.stderr
                );
            }
            out.push(d);
        }
        dirs.push(out);
    }
    let want_cluster = format!(
        "{{\"ps\":[\"10.40.0.1:{port}\"],\"worker\":[\"10.40.0.2:{port}\",\"10.40.0.3:{port}\",\"10.40.0.4:{port}\"]}}"
    );
    let mut generations = Vec::new();
    for (i, (name, t)) in pods.iter().enumerate() {
        let (never, always) = (dirs[0][i].path(), dirs[1][i].path());
        for f in ["tf_config.json", "trainlet.env"] {
            assert_eq!(read(never, f), read(always, f), "{name} {f}");
        }
        let ((plain, none), (coordinated, coordination)) =
            (cluster_json(never), cluster_json(always));
        assert_eq!(plain, coordinated, "{name} cluster.json");
        assert_eq!(
            none,
            Value::Null,
            "{name}: a job of 4 does not coordinate by default"
        );
        // After the start the reporters go on coordinating: the resolver watches every
        // peer, the others watch the resolver pod.
        let generation = coordination["generation"].as_u64().unwrap();
        generations.push(generation);
        let want = if name == "ps-0" {
            json!({"role": "resolver", "types": ["ps", "worker"], "generation": generation})
        } else {
            json!({"role": "follower", "resolver": format!("role=ps,{INDEX}=0"), "types": ["ps", "worker"], "generation": generation})
        };
        assert_eq!(coordination, want, "{name}");
        let tf: Value = serde_json::from_str(&read(always, "tf_config.json")).unwrap();
        assert_eq!(tf["cluster"].to_string(), want_cluster);
        assert_eq!(tf["task"]["type"], t.as_str());
    }
    // The resolver published the cluster on its own pod.
    let ps0 = Api::<Pod>::namespaced(client, &ns)
        .get("ps-0")
        .await
        .unwrap();
    let text = ps0.metadata.annotations.unwrap()["trainlet.io/resolution"].clone();
    let resolution = trainlet::cluster::published::decode(&text, &ns).unwrap();
    assert_eq!(resolution.cluster.summary(), "ps:1,worker:3");
    // Every agent's files are at the generation the resolver published.
    assert_eq!(generations, [resolution.generation; 4]);
}

#[tokio::test]
async fn a_resolver_pod_replaced_before_it_published_is_followed() {
    let client = admin().await;
    let ns = namespace(&client, "coord-replaced").await;
    let pods = job(&client, &ns).await;
    let port = free_port().to_string();
    let workers: Vec<_> = pods
        .iter()
        .filter(|(_, t)| t == "worker")
        .map(|(name, _)| {
            let d = tempfile::tempdir().unwrap();
            let h = spawn_logged(agent(&ns, name, d.path(), &port, "always", "60s"));
            (name.clone(), d, h)
        })
        .collect();
    // Every worker follows ps-0 before it goes.
    for (_, _, h) in &workers {
        h.logged("waiting for the resolver: pod \"ps-0\"").await;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    api.delete("ps-0", &DeleteParams::default()).await.unwrap();
    pod("ps-0b")
        .labels(&format!("role=ps,{INDEX}=0"))
        .create(&client, &ns)
        .await;
    let kubelet = Kubelet::new(&client, &ns);
    kubelet.run("ps-0b", "10.41.0.9").await;
    for (i, (name, _, _)) in workers.iter().enumerate() {
        kubelet.run(name, &format!("10.41.0.{}", i + 1)).await;
    }
    let resolver_dir = tempfile::tempdir().unwrap();
    let r = run(&mut agent(
        &ns,
        "ps-0b",
        resolver_dir.path(),
        &port,
        "always",
        "60s",
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    for (i, (name, d, h)) in workers.into_iter().enumerate() {
        let r = h.run.await.unwrap();
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        assert_eq!(
            read(d.path(), "tf_config.json"),
            format!(
                "{{\"cluster\":{{\"ps\":[\"10.41.0.9:{port}\"],\"worker\":[\"10.41.0.1:{port}\",\"10.41.0.2:{port}\",\"10.41.0.3:{port}\"]}},\"task\":{{\"type\":\"worker\",\"index\":{i}}}}}\n"
            )
        );
    }
}

#[tokio::test]
async fn a_resolver_pod_never_replaced_is_named_in_the_timeout() {
    let client = admin().await;
    let ns = namespace(&client, "coord-gone").await;
    job(&client, &ns).await;
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("ps-0", &DeleteParams::default())
        .await
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let r = run(&mut agent(
        &ns,
        "worker-1",
        out.path(),
        &port,
        "always",
        "3s",
    ));
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!(
            "peers not ready after 3s: waiting for the cluster from the resolver pod (task 0 of ps, role=ps,{INDEX}=0): no live pod matches role=ps,{INDEX}=0 yet"
        )
    );
    assert!(list_dir(out.path()).is_empty());

    // Deleted while the agent watches it: the message says so.
    pod("ps-0")
        .labels(&format!("role=ps,{INDEX}=0"))
        .create(&client, &ns)
        .await;
    let h = spawn_logged(agent(&ns, "worker-1", out.path(), &port, "always", "4s"));
    h.logged("waiting for the resolver: pod \"ps-0\"").await;
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("ps-0", &DeleteParams::default())
        .await
        .unwrap();
    let r = h.run.await.unwrap();
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!(
            "peers not ready after 4s: waiting for the cluster from the resolver pod (task 0 of ps, role=ps,{INDEX}=0): pod \"ps-0\" was deleted and has no live replacement yet"
        )
    );
    let events = events(&client, &ns).await;
    assert!(
        events.iter().any(|(ty, reason, note, pod)| ty == "Warning"
            && reason == "PeerWaitTimeout"
            && pod == "worker-1"
            && note.contains("pod \"ps-0\" was deleted")),
        "{events:?}"
    );
}

/// Writes the annotation a resolver would, as anyone with `patch pods` could.
async fn set_resolution(api: &Api<Pod>, value: &str) {
    api.patch(
        "ps-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"trainlet.io/resolution": value}}})),
    )
    .await
    .unwrap();
}

/// Whatever the resolver pod carries that is not a usable cluster for this agent, the
/// agent writes nothing from it and says why when it times out.
#[tokio::test]
async fn a_forged_or_broken_annotation_is_never_used() {
    let client = admin().await;
    let ns = namespace(&client, "coord-forged").await;
    let pods = job(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    for (i, (name, _)) in pods.iter().enumerate() {
        kubelet.run(name, &format!("10.42.0.{}", i + 1)).await;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ps0_uid = api.get("ps-0").await.unwrap().metadata.uid.unwrap();
    let worker1_uid = api.get("worker-1").await.unwrap().metadata.uid.unwrap();
    let peer =
        |name: &str, t: &str, index: usize, address: &str, uid: &str| trainlet::cluster::Peer {
            name: name.into(),
            task_type: t.into(),
            index,
            address: address.into(),
            node: Some("node-a".into()),
            uid: uid.into(),
            namespace: ns.clone(),
            pod_ip: None,
            slot: String::new(),
            past_init: false,
        };
    let port = free_port().to_string();
    let encode = |workers: Vec<trainlet::cluster::Peer>| {
        let mut c = trainlet::cluster::Cluster::default();
        c.tasks.insert(
            "ps".into(),
            vec![peer(
                "ps-0",
                "ps",
                0,
                &format!("10.42.0.1:{port}"),
                &ps0_uid,
            )],
        );
        c.tasks.insert("worker".into(), workers);
        trainlet::cluster::published::encode(&c, &["ps", "worker"], 1, &[]).unwrap()
    };
    // Three workers, none of them this pod.
    let without_me = encode(
        (0..3)
            .map(|i| {
                peer(
                    &format!("x-{i}"),
                    "worker",
                    i,
                    &format!("10.9.0.{i}:{port}"),
                    &format!("uid-{i}"),
                )
            })
            .collect(),
    );
    // This pod, at an address that is not its own.
    let elsewhere = encode(vec![
        peer("worker-0", "worker", 0, "10.9.0.1:1", "uid-a"),
        peer("worker-1", "worker", 1, "10.66.6.6:1", &worker1_uid),
        peer("worker-2", "worker", 2, "10.9.0.3:1", "uid-c"),
    ]);
    let mut wrong_hash: Value = serde_json::from_str(&without_me).unwrap();
    wrong_hash["sha256"] = json!("0".repeat(64));
    let cases = [
        ("not json", "carries a cluster trainlet cannot use: not trainlet's format: ".to_string()),
        (wrong_hash.to_string().as_str(), "carries a cluster trainlet cannot use: the hash does not match the content".to_string()),
        (without_me.as_str(), format!("carries a cluster this pod cannot use: it does not contain this pod (uid {worker1_uid})")),
    ]
    .map(|(v, w)| (v.to_string(), w));
    for (value, why) in cases {
        set_resolution(&api, &value).await;
        let out = tempfile::tempdir().unwrap();
        let r = run(&mut agent(
            &ns,
            "worker-1",
            out.path(),
            &port,
            "always",
            "2s",
        ));
        assert_eq!(r.code, 3, "{}", r.stderr);
        let want = format!(
            "peers not ready after 2s: waiting for the cluster from the resolver pod (task 0 of ps, role=ps,{INDEX}=0): pod \"ps-0\" {why}"
        );
        assert!(
            r.error_line().starts_with(&want),
            "{}\nwant: {want}",
            r.error_line()
        );
        assert!(list_dir(out.path()).is_empty(), "{why}");
    }
    // This pod at another address: accepted by the watch, refused against the pod's own
    // address as the API server reports it; the agent keeps waiting, then times out.
    set_resolution(&api, &elsewhere).await;
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut agent(
        &ns,
        "worker-1",
        out.path(),
        &port,
        "always",
        "3s",
    ));
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "it places this pod at 10.66.6.6:1, but its address is 10.42.0.3:{port}"
        )),
        "{}",
        r.stderr
    );
    assert!(list_dir(out.path()).is_empty());
}

/// Runs every agent of [`job`]'s pods in coordinated mode at once; their directories.
async fn resolve_all(ns: &str, pods: &[(String, String)], port: &str) -> Vec<tempfile::TempDir> {
    let runs: Vec<_> = pods
        .iter()
        .map(|(name, _)| {
            let d = tempfile::tempdir().unwrap();
            let h = spawn(agent(ns, name, d.path(), port, "always", "60s"));
            (d, h)
        })
        .collect();
    let mut dirs = Vec::new();
    for ((name, _), (d, h)) in pods.iter().zip(runs) {
        let r = h.await.unwrap();
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        dirs.push(d);
    }
    dirs
}

/// A resolver pod that failed (its controller replaces it) still carries the cluster it
/// resolved; a follower never takes it, and its timeout says why.
#[tokio::test]
async fn a_failed_resolver_is_not_followed() {
    let client = admin().await;
    let ns = namespace(&client, "coord-failed").await;
    let pods = job(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    for (i, (name, _)) in pods.iter().enumerate() {
        kubelet.run(name, &format!("10.43.0.{}", i + 1)).await;
    }
    let port = free_port().to_string();
    resolve_all(&ns, &pods, &port).await;

    kubelet.phase("ps-0", "Failed").await;
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut agent(
        &ns,
        "worker-1",
        out.path(),
        &port,
        "always",
        "3s",
    ));
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.error_line(),
        format!(
            "peers not ready after 3s: waiting for the cluster from the resolver pod (task 0 of ps, role=ps,{INDEX}=0): pod \"ps-0\" is Failed and has no live replacement yet"
        )
    );
    assert!(list_dir(out.path()).is_empty());
    delete_namespace(&client, &ns).await;
}

/// A resolver pod that Succeeded finished its part; the cluster it published stands,
/// and an agent that resolves after it finished (init run again, a late pod) follows
/// it rather than wait for a resolver that will never come back.
#[tokio::test]
async fn a_resolver_that_succeeded_is_followed() {
    let client = admin().await;
    let ns = namespace(&client, "coord-done").await;
    let pods = job(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    for (i, (name, _)) in pods.iter().enumerate() {
        kubelet.run(name, &format!("10.45.0.{}", i + 1)).await;
    }
    let port = free_port().to_string();
    let dirs = resolve_all(&ns, &pods, &port).await;

    kubelet.phase("ps-0", "Succeeded").await;
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut agent(
        &ns,
        "worker-1",
        out.path(),
        &port,
        "always",
        "5s",
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        read(out.path(), "tf_config.json"),
        read(dirs[2].path(), "tf_config.json")
    );
    delete_namespace(&client, &ns).await;
}

/// A replacement that the live resolver's cluster leaves out, with nothing on the
/// resolver pod to publish again (no reporter there): after `FALLBACK` (15 s) it
/// resolves by watching every peer itself, and its files say they are newer than that
/// cluster.
#[tokio::test]
async fn a_replacement_the_resolver_leaves_out_resolves_by_watching_every_peer() {
    let client = admin().await;
    let ns = namespace(&client, "coord-fallback").await;
    let pods = job(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    for (i, (name, _)) in pods.iter().enumerate() {
        kubelet.run(name, &format!("10.44.0.{}", i + 1)).await;
    }
    let port = free_port().to_string();
    resolve_all(&ns, &pods, &port).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let text =
        api.get("ps-0").await.unwrap().metadata.annotations.unwrap()["trainlet.io/resolution"]
            .clone();
    let published = trainlet::cluster::published::decode(&text, &ns).unwrap();

    api.delete("worker-1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pod("worker-1b")
        .labels(&format!("role=worker,{INDEX}=1"))
        .create(&client, &ns)
        .await;
    kubelet.run("worker-1b", "10.44.0.21").await;
    let out = tempfile::tempdir().unwrap();
    let r = run(&mut agent(
        &ns,
        "worker-1b",
        out.path(),
        &port,
        "always",
        "60s",
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains(
            "pod \"ps-0\" carries a cluster this pod cannot use: it does not contain this pod"
        ) && r
            .stderr
            .contains("for 15s; resolving by watching every peer instead"),
        "{}",
        r.stderr
    );
    assert_eq!(
        read(out.path(), "tf_config.json"),
        format!(
            "{{\"cluster\":{{\"ps\":[\"10.44.0.1:{port}\"],\"worker\":[\"10.44.0.2:{port}\",\"10.44.0.21:{port}\",\"10.44.0.4:{port}\"]}},\"task\":{{\"type\":\"worker\",\"index\":1}}}}\n"
        )
    );
    let (_, coordination) = cluster_json(out.path());
    assert_eq!(
        coordination["generation"].as_u64(),
        Some(published.generation + 1)
    );
    delete_namespace(&client, &ns).await;
}

/// The resolver's annotation must fit beside the pod's other annotations (256 KiB in
/// all): when it cannot, the resolver says so in a Warning Event and exits 2 before it
/// writes anything, instead of reporting success to followers that would wait for a
/// cluster never published.
#[tokio::test]
async fn a_resolution_that_does_not_fit_the_pods_annotations_fails_the_resolver() {
    let client = admin().await;
    let ns = namespace(&client, "coord-toolarge").await;
    let pods = job(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    for (i, (name, _)) in pods.iter().enumerate() {
        kubelet.run(name, &format!("10.45.0.{}", i + 1)).await;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // The user's own annotations take all but a few hundred bytes of the budget.
    let big = "x".repeat(256 * 1024 - 400);
    api.patch(
        "ps-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"example.com/notes": big}}})),
    )
    .await
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let r = run(&mut agent(&ns, "ps-0", out.path(), &port, "always", "30s"));
    assert_eq!(r.code, 2, "{}", r.stderr);
    let line = r.error_line();
    assert!(
        line.starts_with("cannot publish the cluster for the other agents: the pod's annotations would take ")
            && line.contains("more than the 262144 the API server allows")
            && line.contains(&format!(
                "example.com/notes the largest at {} bytes",
                "example.com/notes".len() + big.len()
            ))
            && line.ends_with("use --coordinate never (every agent then watches every peer), or keep fewer annotations of your own on this pod"),
        "{line}"
    );
    assert!(list_dir(out.path()).is_empty(), "nothing is written");
    let events = events(&client, &ns).await;
    let of_ps0: Vec<_> = events
        .iter()
        .filter(|(_, _, _, pod)| pod == "ps-0")
        .map(|(ty, reason, note, _)| (ty.as_str(), reason.as_str(), note.as_str()))
        .collect();
    assert_eq!(of_ps0, [("Warning", "ClusterTooLarge", line)], "{events:?}");
    let annotations = api.get("ps-0").await.unwrap().metadata.annotations.unwrap();
    assert!(!annotations.contains_key("trainlet.io/resolution"));
    delete_namespace(&client, &ns).await;
}

/// `--coordinate auto` switches at its threshold (`--coordinate-from`, lowered here so
/// that 4 pods can cross it): with 4, the job of 4 (by --expect) coordinates: ps-0
/// resolves, watches every peer and publishes, the workers follow it and watch only
/// ps-0; with 5 nobody coordinates, every agent watches every peer, and nothing is
/// published. The threshold also comes from TRAINLET_COORDINATE_FROM.
#[tokio::test]
async fn auto_coordinates_from_its_threshold_on() {
    let client = admin().await;
    let ns = namespace(&client, "coord-auto").await;
    let pods = job(&client, &ns).await;
    let kubelet = Kubelet::new(&client, &ns);
    for (i, (name, _)) in pods.iter().enumerate() {
        kubelet.run(name, &format!("10.41.0.{}", i + 1)).await;
    }
    let port = free_port().to_string();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (from, by_env) in [("5", false), ("4", true)] {
        let runs: Vec<_> = pods
            .iter()
            .map(|(name, _)| {
                let d = tempfile::tempdir().unwrap();
                let mut cmd = agent(&ns, name, d.path(), &port, "auto", "60s");
                if by_env {
                    cmd.env("TRAINLET_COORDINATE_FROM", from);
                } else {
                    cmd.args(["--coordinate-from", from]);
                }
                (d, spawn(cmd))
            })
            .collect();
        let mut roles = Vec::new();
        for ((name, _), (d, h)) in pods.iter().zip(runs) {
            let r = h.await.unwrap();
            assert_eq!(r.code, 0, "from {from}, {name}: {}", r.stderr);
            let (_, coordination) = cluster_json(d.path());
            let role = match coordination["role"].as_str() {
                Some("resolver") => "resolver: watches every peer".to_string(),
                Some("follower") => format!(
                    "follower: watches {}",
                    coordination["resolver"].as_str().unwrap()
                ),
                _ => "alone: watches every peer".to_string(),
            };
            roles.push((name.clone(), role));
        }
        let published = api
            .get("ps-0")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("trainlet.io/resolution");
        let every = |role: &str| {
            pods.iter()
                .map(|(n, _)| (n.clone(), role.to_string()))
                .collect::<Vec<_>>()
        };
        if from == "5" {
            assert_eq!(roles, every("alone: watches every peer"));
            assert!(
                !published,
                "a job of 4 below a threshold of 5 publishes nothing"
            );
        } else {
            let follow = format!("follower: watches role=ps,{INDEX}=0");
            let mut want = every(&follow);
            want[0].1 = "resolver: watches every peer".into();
            assert_eq!(roles, want);
            assert!(published, "ps-0 publishes the resolution");
        }
    }
}
