//! After the start: the sidecar watches the peers of the cluster `trainlet init`
//! resolved (cluster.json) and says when a task's pod is lost or replaced (another pod,
//! whatever its address), and not when it Succeeded. The real Job controller replaces
//! the deleted pod 1; the test plays the scheduler and the kubelet (the pods' IPs).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

use crate::report_support::*;
use crate::support::jobs::*;
use crate::support::*;

#[tokio::test]
async fn a_replaced_peer_makes_the_cluster_stale_even_back_at_its_old_address() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "peers", dir.path()).await;
    indexed_job(&client, &ns, "w", 3, "app=w", serde_json::json!({})).await;
    let kubelet = Kubelet::new(&client, &ns);
    let names = run_job_pods(&client, &ns, "w", 3, |i| format!("10.7.0.{}", 2 + i)).await;
    let (w0, w1) = (names[0].as_str(), names[1].as_str());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let r = run(&mut init_cmd(
        &kc,
        &ns,
        w0,
        &out,
        &["--job", "worker=app=w"],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let cluster_file = out.join("cluster.json");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cluster_file).unwrap()).unwrap();
    assert_eq!(file["selectors"], serde_json::json!({"worker": ["app=w"]}));

    let sidecar = Reporter::start(sidecar_cmd(
        &kc,
        &ns,
        w0,
        &["--cluster-file", cluster_file.to_str().unwrap()],
    ));
    wait_annotation(&client, &ns, w0, "trainlet.io/cluster", "current").await;
    wait_annotation(&client, &ns, w0, "trainlet.io/health", "ok").await;
    assert_eq!(
        metric(&sidecar.metrics().await, "trainlet_cluster_stale"),
        Some(0.0)
    );

    // Pod 1 is deleted (and, with no kubelet to confirm, stays terminating): lost.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete(w1, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let lost = wait_warning(&client, &ns, "PeerLost").await;
    // Seen while terminating, or once gone: the watch may see either first.
    assert!(
        [
            format!("task worker/1 (10.7.0.3) has no live pod: pod {w1} is being deleted; the cluster this pod was given is stale"),
            format!("task worker/1 (10.7.0.3) has no live pod: pod {w1} is gone; the cluster this pod was given is stale"),
        ]
        .contains(&lost),
        "{lost}"
    );
    wait_annotation(
        &client,
        &ns,
        w0,
        "trainlet.io/cluster",
        "stale: worker/1 10.7.0.3 → none",
    )
    .await;
    wait_annotation(&client, &ns, w0, "trainlet.io/health", "degraded").await;
    assert_eq!(
        metric(&sidecar.metrics().await, "trainlet_cluster_stale"),
        Some(1.0)
    );

    // The Job controller's replacement of index 1 comes up at a new IP.
    let w1b = wait_job_pod(&client, &ns, "w", 1, &[w1.to_string()]).await;
    kubelet.run(&w1b, "10.7.0.13").await;
    let replaced = wait_warning(&client, &ns, "PeerReplaced").await;
    assert_eq!(
        replaced,
        format!(
            "task worker/1 moved: 10.7.0.3 → 10.7.0.13 (pod {w1b}); the cluster this pod was given is stale"
        )
    );
    wait_annotation(
        &client,
        &ns,
        w0,
        "trainlet.io/cluster",
        "stale: worker/1 10.7.0.3 → 10.7.0.13",
    )
    .await;
    let report: serde_json::Value =
        serde_json::from_str(&annotations(&client, &ns, w0).await["trainlet.io/report"]).unwrap();
    assert_eq!(
        report["reasons"],
        serde_json::json!([
            "the cluster this pod was given is stale: worker/1 10.7.0.3 → 10.7.0.13"
        ])
    );

    // The replacement at the old address (a hostNetwork pod on the same node): still
    // another pod, whose peers' communicators broke all the same; stale.
    kubelet.running(&w1b, "10.7.0.3").await;
    wait_annotation(
        &client,
        &ns,
        w0,
        "trainlet.io/cluster",
        &format!("stale: worker/1 10.7.0.3 → 10.7.0.3 (new pod {w1b})"),
    )
    .await;
    assert_eq!(
        metric(&sidecar.metrics().await, "trainlet_cluster_stale"),
        Some(1.0)
    );
    let again = format!(
        "task worker/1 (10.7.0.3) is held by a new pod, {w1b}, at the same address; the cluster this pod was given is stale"
    );
    eventually(
        "the second PeerReplaced",
        Duration::from_secs(30),
        || async {
            let w = warnings(&client, &ns).await;
            w.iter().any(|(_, n)| *n == again).then_some(w)
        },
    )
    .await;
    let w = warnings(&client, &ns).await;
    assert_eq!(
        w.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["PeerLost", "PeerReplaced", "PeerReplaced"],
        "{w:?}"
    );
    delete_namespace(&client, &ns).await;
}

/// A peer that Succeeded finished its part: no PeerLost, no stale cluster, nothing for
/// a group restart. Pod 2 deleted after it shows that the watch has seen pod 1's
/// Succeeded (one watch delivers its events in order): only pod 2's task is lost.
#[tokio::test]
async fn a_peer_that_succeeded_is_not_lost() {
    let client = admin().await;
    let dir = tempfile::tempdir().unwrap();
    let (ns, kc) = rbac_namespace(&client, "peers-done", dir.path()).await;
    indexed_job(&client, &ns, "w", 3, "app=w", serde_json::json!({})).await;
    let kubelet = Kubelet::new(&client, &ns);
    let names = run_job_pods(&client, &ns, "w", 3, |i| format!("10.7.1.{}", 2 + i)).await;
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let r = run(&mut init_cmd(
        &kc,
        &ns,
        &names[0],
        &out,
        &["--job", "worker=app=w"],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let cluster_file = out.join("cluster.json");
    let sidecar = Reporter::start(sidecar_cmd(
        &kc,
        &ns,
        &names[0],
        &["--cluster-file", cluster_file.to_str().unwrap()],
    ));
    wait_annotation(&client, &ns, &names[0], "trainlet.io/cluster", "current").await;

    kubelet.phase(&names[1], "Succeeded").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete(&names[2], &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_annotation(
        &client,
        &ns,
        &names[0],
        "trainlet.io/cluster",
        "stale: worker/2 10.7.1.4 → none",
    )
    .await;
    // The Event follows the annotation: wait for it, then see that it is the only one.
    let w = eventually(
        "the PeerLost of worker/2",
        Duration::from_secs(30),
        || async {
            let w = warnings(&client, &ns).await;
            w.iter()
                .any(|(_, n)| n.starts_with("task worker/2 "))
                .then_some(w)
        },
    )
    .await;
    assert_eq!(
        w.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["PeerLost"],
        "{w:?}"
    );
    assert!(w[0].1.starts_with("task worker/2 "), "{w:?}");
    assert_eq!(
        metric(&sidecar.metrics().await, "trainlet_cluster_stale"),
        Some(1.0)
    );
    delete_namespace(&client, &ns).await;
}
