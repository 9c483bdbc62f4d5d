//! Who a test acts as: ServiceAccount tokens minted through the TokenRequest API, a
//! pod-bound token, and a user from the admin's client certificate, each as a kubeconfig.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};

use super::cluster::{apply_rbac, kubeconfig, namespace, server_and_ca_of};

/// Mints a token for a ServiceAccount through the TokenRequest API and writes a
/// kubeconfig that uses it, so the binary runs with exactly the rights RBAC grants.
pub async fn sa_kubeconfig(client: &Client, ns: &str, sa: &str, dir: &Path) -> PathBuf {
    sa_kubeconfig_on(kubeconfig(), client, ns, sa, dir).await
}

/// `sa_kubeconfig` on the control plane of this admin kubeconfig.
pub async fn sa_kubeconfig_on(
    admin_kubeconfig: &Path,
    client: &Client,
    ns: &str,
    sa: &str,
    dir: &Path,
) -> PathBuf {
    token_kubeconfig(admin_kubeconfig, client, ns, sa, None, dir).await
}

/// A kubeconfig with a token of `sa` bound to `pod` (name, uid), as the kubelet
/// mounts into a pod: the API server then adds the pod's name and uid to the user's
/// extra fields.
pub async fn pod_token_kubeconfig_on(
    admin_kubeconfig: &Path,
    client: &Client,
    ns: &str,
    sa: &str,
    pod: (&str, &str),
    dir: &Path,
) -> PathBuf {
    token_kubeconfig(admin_kubeconfig, client, ns, sa, Some(pod), dir).await
}

async fn token_kubeconfig(
    admin_kubeconfig: &Path,
    client: &Client,
    ns: &str,
    sa: &str,
    pod: Option<(&str, &str)>,
    dir: &Path,
) -> PathBuf {
    let token = sa_token(client, ns, sa, pod.map(|(name, uid)| ("Pod", name, uid))).await;
    user_kubeconfig(
        admin_kubeconfig,
        ns,
        &format!("token: {token}"),
        &dir.join(format!("{sa}.kubeconfig")),
    )
}

/// A token of ServiceAccount `sa` for an hour, bound to `bound` (kind, name, uid) when
/// given: the API server then rejects it once that object is gone.
pub async fn sa_token(
    client: &Client,
    ns: &str,
    sa: &str,
    bound: Option<(&str, &str, &str)>,
) -> String {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref: bound.map(|(kind, name, uid)| {
                k8s_openapi::api::authentication::v1::BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some(kind.into()),
                    name: Some(name.into()),
                    uid: Some(uid.into()),
                }
            }),
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{sa}: {e}"))
        .status
        .expect("token status")
        .token
}

/// Writes a kubeconfig at `path` for the control plane of `admin_kubeconfig`, in
/// namespace `ns`, whose user is `user` (`token: …`, or `tokenFile: …`).
pub fn user_kubeconfig(admin_kubeconfig: &Path, ns: &str, user: &str, path: &Path) -> PathBuf {
    let (server, ca) = server_and_ca_of(admin_kubeconfig);
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    {user}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n    namespace: {ns}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path.to_path_buf()
}

/// A namespace with the RBAC manifests applied and a kubeconfig of the trainlet
/// ServiceAccount written into `dir`.
pub async fn rbac_namespace(client: &Client, prefix: &str, dir: &Path) -> (String, PathBuf) {
    let ns = namespace(client, prefix).await;
    apply_rbac(&ns);
    let kc = sa_kubeconfig(client, &ns, "trainlet", dir).await;
    (ns, kc)
}
