//! After the start: the sidecar watches the peers of the cluster `trainlet init`
//! resolved (cluster.json) and says when a task's pod is lost or replaced at another
//! address. The test plays the Job controller (deleting and replacing pod 1 with the
//! same Job labels and completion index) and the kubelet (its IPs).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

use crate::report_support::*;
use crate::support::*;

fn worker(i: usize, name: &str) -> PodSpec {
    pod(name).labels(&format!(
        "app=w,batch.kubernetes.io/job-name=w,batch.kubernetes.io/job-completion-index={i}"
    ))
}

#[tokio::test]
async fn a_replaced_peer_makes_the_cluster_stale_until_its_old_address_returns() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "peers", dir.path()).await;
    let kubelet = Kubelet::new(&client, &ns);
    for i in 0..3 {
        worker(i, &format!("w-{i}-a")).create(&client, &ns).await;
        kubelet
            .run(&format!("w-{i}-a"), &format!("10.7.0.{}", 2 + i))
            .await;
    }
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let r = run(&mut init_cmd(
        &kc,
        &ns,
        "w-0-a",
        &out,
        &["--job", "worker=app=w", "--expect", "worker=3"],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let cluster_file = out.join("cluster.json");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cluster_file).unwrap()).unwrap();
    assert_eq!(file["selectors"], serde_json::json!({"worker": ["app=w"]}));

    let sidecar = Reporter::start(sidecar_cmd(
        &kc,
        &ns,
        "w-0-a",
        &["--cluster-file", cluster_file.to_str().unwrap()],
    ));
    wait_annotation(&client, &ns, "w-0-a", "trainlet.io/cluster", "current").await;
    wait_annotation(&client, &ns, "w-0-a", "trainlet.io/health", "ok").await;
    assert_eq!(
        metric(&sidecar.metrics().await, "trainlet_cluster_stale"),
        Some(0.0)
    );

    // Pod 1 is deleted (and, with no kubelet to confirm, stays terminating): lost.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete("w-1-a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let lost = wait_warning(&client, &ns, "PeerLost").await;
    // Seen while terminating, or once gone: the watch may see either first.
    assert!(
        [
            "task worker/1 (10.7.0.3) has no live pod: pod w-1-a is being deleted; the cluster this pod was given is stale",
            "task worker/1 (10.7.0.3) has no live pod: pod w-1-a is gone; the cluster this pod was given is stale",
        ]
        .contains(&lost.as_str()),
        "{lost}"
    );
    wait_annotation(
        &client,
        &ns,
        "w-0-a",
        "trainlet.io/cluster",
        "stale: worker/1 10.7.0.3 → none",
    )
    .await;
    wait_annotation(&client, &ns, "w-0-a", "trainlet.io/health", "degraded").await;
    assert_eq!(
        metric(&sidecar.metrics().await, "trainlet_cluster_stale"),
        Some(1.0)
    );

    // The Job controller's replacement of index 1 comes up at a new IP.
    worker(1, "w-1-b").create(&client, &ns).await;
    kubelet.run("w-1-b", "10.7.0.13").await;
    let replaced = wait_warning(&client, &ns, "PeerReplaced").await;
    assert_eq!(
        replaced,
        "task worker/1 moved: 10.7.0.3 → 10.7.0.13 (pod w-1-b); the cluster this pod was given is stale"
    );
    wait_annotation(
        &client,
        &ns,
        "w-0-a",
        "trainlet.io/cluster",
        "stale: worker/1 10.7.0.3 → 10.7.0.13",
    )
    .await;
    let report: serde_json::Value =
        serde_json::from_str(&annotations(&client, &ns, "w-0-a").await["trainlet.io/report"])
            .unwrap();
    assert_eq!(
        report["reasons"],
        serde_json::json!([
            "the cluster this pod was given is stale: worker/1 10.7.0.3 → 10.7.0.13"
        ])
    );

    // The old address returns: current again, and ok.
    kubelet.running("w-1-b", "10.7.0.3").await;
    wait_annotation(&client, &ns, "w-0-a", "trainlet.io/cluster", "current").await;
    wait_annotation(&client, &ns, "w-0-a", "trainlet.io/health", "ok").await;
    assert_eq!(
        metric(&sidecar.metrics().await, "trainlet_cluster_stale"),
        Some(0.0)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let w = warnings(&client, &ns).await;
    assert_eq!(
        w.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["PeerLost", "PeerReplaced"],
        "{w:?}"
    );
}
