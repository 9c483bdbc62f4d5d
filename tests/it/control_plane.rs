//! Proves that the API server the tests run against is real: Pod Security admission,
//! watches of the status subresource, and RBAC on minted ServiceAccount tokens.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn pod_security_restricted_rejects_a_privileged_pod() {
    let client = admin().await;
    let ns = namespace_with_labels(
        &client,
        "psa",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    )
    .await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "priv"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": true}}]}
    }))
    .unwrap();
    let err = Api::<Pod>::namespaced(client, &ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect_err("a privileged pod must be rejected");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}")
    };
    assert_eq!(status.code, 403);
    assert!(
        status.message.starts_with(
            "pods \"priv\" is forbidden: violates PodSecurity \"restricted:latest\": privileged (container \"c\" must not set securityContext.privileged=true)"
        ),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn a_watch_sees_a_status_update_through_the_status_subresource() {
    let client = admin().await;
    let ns = namespace(&client, "watch").await;
    let created = pod("w-0").labels("app=watch").create(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let rv = created.resource_version().unwrap();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=watch"), &rv)
        .await
        .unwrap()
        .boxed();
    let kubelet = Kubelet::new(&client, &ns);
    kubelet.run("w-0", "10.1.0.7").await;
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = stream.try_next().await.unwrap() {
            if let WatchEvent::Modified(p) = ev {
                let st = p.status.unwrap_or_default();
                if st.phase.as_deref() == Some("Running") {
                    return (st.pod_ip, p.spec.unwrap().node_name);
                }
            }
        }
        panic!("watch ended")
    })
    .await
    .expect("the watch delivers the status update within 10s");
    assert_eq!(
        seen,
        (Some("10.1.0.7".to_string()), Some("node-a".to_string()))
    );
}

#[tokio::test]
async fn a_minted_service_account_token_gets_403_outside_its_role() {
    let client = admin().await;
    let ns = namespace(&client, "rbac").await;
    apply_rbac(&ns);
    let dir = tempfile::tempdir().unwrap();
    let kc = sa_kubeconfig(&client, &ns, "trainlet", dir.path()).await;
    let sa = client_from(&kc).await;

    // Granted by the Role: list pods.
    Api::<Pod>::namespaced(sa.clone(), &ns)
        .list(&Default::default())
        .await
        .expect("the Role grants list pods");
    // Not granted: secrets.
    let err = Api::<Secret>::namespaced(sa, &ns)
        .list(&Default::default())
        .await
        .expect_err("secrets must be forbidden");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}")
    };
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        format!(
            "secrets is forbidden: User \"system:serviceaccount:{ns}:trainlet\" cannot list resource \"secrets\" in API group \"\" in the namespace \"{ns}\""
        )
    );
}
