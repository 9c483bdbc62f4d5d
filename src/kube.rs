//! The Kubernetes client, this pod's identity, and API errors that say what to fix.
//!
//! The client is built once per process. Configuration comes from `--kubeconfig` when
//! given, else the in-cluster service account (the normal case for an init container or
//! sidecar), else `$KUBECONFIG` / `~/.kube/config`. TensorFlow's resolver only tried a
//! kubeconfig, which is why it failed inside pods (tensorflow#70581).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use thiserror::Error;

use crate::Code;

/// The service account's namespace file, present in every pod that mounts its token.
const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[derive(Debug, Error)]
pub enum KubeError {
    #[error("cannot load kubeconfig {path}: {why}")]
    Kubeconfig { path: PathBuf, why: String },
    #[error(
        "no Kubernetes configuration: not in a cluster ({incluster}) and no kubeconfig ({kubeconfig})"
    )]
    NoConfig {
        incluster: String,
        kubeconfig: String,
    },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(String),
    #[error("cannot tell this pod's name")]
    NoPodName,
    #[error(
        "forbidden: cannot {verb} {resource} in namespace {namespace:?}: the Role bound to {user} lacks verb {verb:?} on {resource:?}; apply manifests/rbac.yaml ({message})"
    )]
    Forbidden {
        verb: String,
        resource: String,
        namespace: String,
        user: String,
        message: String,
    },
    #[error(
        "unauthorized: the API server rejected the credentials while trying to {verb} {resource} ({message})"
    )]
    Unauthorized {
        verb: String,
        resource: String,
        message: String,
    },
    #[error("{resource} {name:?} not found in namespace {namespace:?}")]
    NotFound {
        resource: String,
        name: String,
        namespace: String,
    },
    #[error("Kubernetes API error while trying to {verb} {resource}: {message}")]
    Api {
        verb: String,
        resource: String,
        message: String,
    },
    #[error("cannot reach the Kubernetes API server while trying to {verb} {resource}: {message}")]
    Unreachable {
        verb: String,
        resource: String,
        message: String,
    },
}

impl KubeError {
    /// A configuration the user must fix (exit 2), or the API server's answer (exit 4).
    pub fn code(&self) -> Code {
        match self {
            KubeError::Kubeconfig { .. } | KubeError::NoConfig { .. } | KubeError::NoPodName => {
                Code::Usage
            }
            _ => Code::Api,
        }
    }

    /// Whether retrying can help: network trouble and server-side 5xx/429, but not RBAC.
    pub fn is_transient(&self) -> bool {
        matches!(self, KubeError::Unreachable { .. })
    }
}

/// Turns a kube error into one that names the verb, resource and namespace, so that a
/// 403 tells the user exactly which RBAC rule is missing.
pub fn classify(err: &kube::Error, verb: &str, resource: &str, namespace: &str) -> KubeError {
    let (verb, resource) = (verb.to_string(), resource.to_string());
    match err {
        kube::Error::Api(s) if s.code == 403 => KubeError::Forbidden {
            user: forbidden_user(&s.message).unwrap_or_else(|| "this identity".into()),
            message: s.message.clone(),
            verb,
            resource,
            namespace: namespace.to_string(),
        },
        kube::Error::Api(s) if s.code == 401 => KubeError::Unauthorized {
            verb,
            resource,
            message: s.message.clone(),
        },
        kube::Error::Api(s) if s.code == 404 => KubeError::NotFound {
            resource,
            name: s
                .details
                .as_ref()
                .map(|d| d.name.clone())
                .unwrap_or_default(),
            namespace: namespace.to_string(),
        },
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => KubeError::Unreachable {
            verb,
            resource,
            message: format!("{} ({})", s.message, s.code),
        },
        kube::Error::Api(s) => KubeError::Api {
            verb,
            resource,
            message: format!("{} ({})", s.message, s.code),
        },
        other => KubeError::Unreachable {
            verb,
            resource,
            message: root_cause(other),
        },
    }
}

/// `pods is forbidden: User "system:serviceaccount:ns:sa" cannot ...` -> the user.
fn forbidden_user(message: &str) -> Option<String> {
    let rest = message.split_once("User \"")?.1;
    let user = rest.split_once('"')?.0;
    Some(match user.strip_prefix("system:serviceaccount:") {
        Some(sa) => format!("ServiceAccount {sa}"),
        None => format!("user {user}"),
    })
}

/// The innermost error message, which is the one that says what went wrong.
pub fn root_cause(err: &dyn std::error::Error) -> String {
    let mut cur = err;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// How to reach the API server and who "self" is: what the user gave, before the
/// environment's defaults are applied.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// A kubeconfig file; `None`: in-cluster, then `$KUBECONFIG`, then `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The own pod's name; `None`: `$POD_NAME`, then `$HOSTNAME`.
    pub pod_name: Option<String>,
    /// The own pod's namespace; `None`: `$POD_NAMESPACE`, the service account's
    /// namespace file, then the kubeconfig's default.
    pub pod_namespace: Option<String>,
}

impl Settings {
    /// The pod name from the setting, $POD_NAME, then $HOSTNAME (which Kubernetes sets
    /// to the pod name unless the pod sets `hostname`).
    pub fn pod_name(&self) -> Option<String> {
        self.pod_name
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty())
    }

    /// The namespace from the setting, $POD_NAMESPACE, the service account's namespace
    /// file, then the kubeconfig's default.
    pub fn pod_namespace(&self, config_default: &str) -> String {
        self.pod_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .or_else(|| {
                std::fs::read_to_string(SA_NAMESPACE_FILE)
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| config_default.to_string())
    }
}

/// Builds the client: the kubeconfig setting, else in-cluster, else
/// $KUBECONFIG/~/.kube/config. Returns the client and the namespace its config defaults
/// to.
pub async fn client(kubeconfig: Option<&Path>) -> Result<(Client, String), KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| KubeError::Kubeconfig {
                path: path.to_path_buf(),
                why: root_cause(&e),
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Kubeconfig {
                    path: path.to_path_buf(),
                    why: root_cause(&e),
                })?
        }
        None => match Config::incluster() {
            Ok(c) => c,
            Err(incluster) => Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(|kc| KubeError::NoConfig {
                    incluster: root_cause(&incluster),
                    kubeconfig: root_cause(&kc),
                })?,
        },
    };
    let ns = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| KubeError::Client(root_cause(&e)))?;
    Ok((client, ns))
}

/// Who "self" is: the pod this process runs in.
#[derive(Debug, Clone)]
pub struct Identity {
    pub pod_name: String,
    pub namespace: String,
}

/// The client and the own identity; no request is made yet.
pub async fn connect(settings: &Settings) -> Result<(Client, Identity), KubeError> {
    let (client, default_ns) = client(settings.kubeconfig.as_deref()).await?;
    let id = Identity {
        pod_name: settings.pod_name().ok_or(KubeError::NoPodName)?,
        namespace: settings.pod_namespace(&default_ns),
    };
    Ok((client, id))
}

/// The client, the own identity, and the pre-flight GET of the own pod: what every
/// workflow that acts on its own pod starts with.
pub async fn connect_own_pod(settings: &Settings) -> Result<(Client, Identity, Pod), KubeError> {
    let (client, id) = connect(settings).await?;
    let pod = get_own_pod(&client, &id).await?;
    Ok((client, id, pod))
}

/// The pre-flight call: GET the own pod. It proves the credentials work and that RBAC
/// grants `get pods`, before any waiting starts.
pub async fn get_own_pod(client: &Client, id: &Identity) -> Result<Pod, KubeError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &id.namespace);
    match api.get(&id.pod_name).await {
        Ok(p) => Ok(p),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(KubeError::NotFound {
            resource: "pod".into(),
            name: id.pod_name.clone(),
            namespace: id.namespace.clone(),
        }),
        Err(e) => Err(classify(&e, "get", "pods", &id.namespace)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_names_verb_resource_and_service_account() {
        let status = kube::core::Status {
            code: 403,
            message: r#"pods is forbidden: User "system:serviceaccount:t1:trainlet" cannot watch resource "pods" in API group "" in the namespace "t1""#.into(),
            reason: "Forbidden".into(),
            ..Default::default()
        };
        let e = classify(&kube::Error::Api(Box::new(status)), "watch", "pods", "t1");
        assert!(
            e.to_string().starts_with(
                "forbidden: cannot watch pods in namespace \"t1\": the Role bound to ServiceAccount t1:trainlet lacks verb \"watch\" on \"pods\""
            ),
            "{e}"
        );
        assert_eq!(e.code(), Code::Api);
    }
}
