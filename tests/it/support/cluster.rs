//! The real control plane: the shared one of `tests/control-plane/up` (its admin
//! kubeconfig, a client, a fresh namespace per test, kubectl, the manifests' RBAC and
//! the CRDs the tests apply), and a private one a test may stop and start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

use super::{eventually, unique};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The admin kubeconfig of the running control plane, starting it if needed.
///
/// `up` is idempotent and takes a file lock, so test binaries that run at once share
/// one control plane. If it cannot be built or started, this panics with the step that
/// failed: a test never silently skips.
pub fn kubeconfig() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        let up = repo().join("tests/control-plane/up");
        let out = Command::new(&up)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", up.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the local control plane could not be started ({}):\n{stderr}",
            out.status
        );
        let path = stdout
            .lines()
            .last()
            .expect("up prints the kubeconfig path last")
            .trim();
        PathBuf::from(path)
    })
}

pub async fn client_from(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig config");
    Client::try_from(cfg).expect("client")
}

/// A client with the admin identity (system:masters).
pub async fn admin() -> Client {
    client_from(kubeconfig()).await
}

/// The API server's URL and CA, for building other kubeconfigs.
pub fn server_and_ca() -> (String, String) {
    server_and_ca_of(kubeconfig())
}

/// The URL and CA of the control plane of an admin kubeconfig (shared or private).
pub fn server_and_ca_of(admin_kubeconfig: &Path) -> (String, String) {
    let kc = Kubeconfig::read_from(admin_kubeconfig).unwrap();
    let c = kc.clusters[0].cluster.as_ref().unwrap();
    (
        c.server.clone().unwrap(),
        c.certificate_authority_data.clone().unwrap(),
    )
}

/// A fresh namespace, once the real ServiceAccount controller has made its `default`
/// ServiceAccount (the ServiceAccount admission plugin requires it for pods).
pub async fn namespace(client: &Client, prefix: &str) -> String {
    namespace_with_labels(client, prefix, &[]).await
}

pub async fn namespace_with_labels(
    client: &Client,
    prefix: &str,
    labels: &[(&str, &str)],
) -> String {
    let name = format!("{prefix}-{}", unique());
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), &name);
    eventually(
        "the ServiceAccount controller makes the default ServiceAccount",
        Duration::from_secs(30),
        || async { sas.get_opt("default").await.ok().flatten() },
    )
    .await;
    name
}

/// Deletes a namespace and waits until the namespace controller has removed it and
/// everything in it, or, past a minute, until none of its pods is left. The test plays
/// the kubelet that confirms its pods are gone (a bound pod is deleted gracefully, and
/// only a kubelet ends that).
pub async fn delete_namespace(client: &Client, name: &str) {
    let api = Api::<Namespace>::all(client.clone());
    let pods = Api::<Pod>::namespaced(client.clone(), name);
    let start = std::time::Instant::now();
    let mut asked = false;
    loop {
        // A loaded API server may time a request out: the deletion is asked again
        // until it is accepted (or the namespace is already going).
        if !asked {
            asked = match api.delete(name, &Default::default()).await {
                Ok(_) => true,
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => true,
                Err(e) => {
                    assert!(
                        start.elapsed() < Duration::from_secs(60),
                        "delete namespace {name}: {e}"
                    );
                    false
                }
            };
        }
        // The played kubelet never confirms a deletion and a Job's pods carry the Job
        // controller's tracking finalizer, which that controller removes only when its
        // queue gets to them: on a loaded machine that took over a minute. The test owns
        // these pods, so it removes both waits itself.
        let left_pods = pods.list(&Default::default()).await.map(|l| l.items);
        for p in left_pods.as_deref().unwrap_or_default() {
            let pod = p.metadata.name.as_deref().unwrap_or_default();
            if p.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
            {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = pods
                    .patch(pod, &Default::default(), &kube::api::Patch::Merge(&patch))
                    .await;
            }
            let now = kube::api::DeleteParams::default().grace_period(0);
            let _ = pods.delete(pod, &now).await;
        }
        // What the namespace controller says remains: its conditions that are True.
        let left: Vec<String> = match api.get_opt(name).await {
            Ok(None) => return,
            Ok(Some(ns)) => ns.status.and_then(|s| s.conditions).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
        .into_iter()
        .filter(|c| c.status == "True")
        .map(|c| c.message.unwrap_or(c.type_))
        .collect();
        let pods_gone = asked && left_pods.is_ok_and(|p| p.is_empty());
        // What a test holds is its pods: once they are gone, the rest of the
        // namespace is the namespace controller's to finish (it retries at its own
        // pace, up to a minute apart), and no test waits on it.
        if pods_gone && start.elapsed() >= Duration::from_secs(60) {
            eprintln!(
                "namespace {name}: no pods left, still terminating after {:?}: {left:?}",
                start.elapsed()
            );
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "namespace {name}: pods are still there after 180s: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies manifests/rbac.yaml into the namespace, as a user would (`kubectl apply`).
pub fn apply_rbac(ns: &str) {
    apply_rbac_on(kubeconfig(), ns);
}

/// `apply_rbac` on the control plane of this admin kubeconfig.
pub fn apply_rbac_on(admin_kubeconfig: &Path, ns: &str) {
    let rbac = repo().join("manifests/rbac.yaml");
    kubectl_on(
        admin_kubeconfig,
        &["apply", "-n", ns, "-f", rbac.to_str().unwrap()],
    );
}

/// Runs kubectl with the admin kubeconfig and asserts success; returns stdout.
pub fn kubectl(args: &[&str]) -> String {
    kubectl_on(kubeconfig(), args)
}

/// `kubectl` on the control plane of this admin kubeconfig.
pub fn kubectl_on(admin_kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(admin_kubeconfig)
        .args(args)
        .output()
        .expect("kubectl is installed");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A control plane of a test's own, in its own state dir, for tests that restart the
/// API server: restarting the shared one would disturb every other test.
pub struct PrivateControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
}

impl PrivateControlPlane {
    pub fn start(name: &str) -> Self {
        Self::start_with(name, None)
    }

    /// With only these kube-controller-manager controllers (`up`'s
    /// TRAINLET_CONTROLLERS), e.g. for a benchmark that counts the API server's requests.
    pub fn start_with(name: &str, controllers: Option<&str>) -> Self {
        let dir = repo().join("target").join(format!("control-plane-{name}"));
        let mut up = Command::new(repo().join("tests/control-plane/up"));
        if let Some(c) = controllers {
            up.env("TRAINLET_CONTROLLERS", c);
        }
        let out = up
            .env("TRAINLET_CONTROL_PLANE_DIR", &dir)
            .stdin(Stdio::null())
            .output()
            .expect("run up");
        assert!(
            out.status.success(),
            "private control plane {name} could not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let kubeconfig = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap()
                .trim(),
        );
        PrivateControlPlane { dir, kubeconfig }
    }

    /// Stops kube-apiserver, keeps it down for `down_for`, starts it again with the same
    /// port and etcd, and waits until it is ready.
    pub fn restart_apiserver(&self, down_for: Duration) {
        let out = Command::new(repo().join("tests/control-plane/restart-apiserver"))
            .env("TRAINLET_CONTROL_PLANE_DIR", &self.dir)
            .args(["--down-for", &format!("{:.1}", down_for.as_secs_f64())])
            .output()
            .expect("run restart-apiserver");
        assert!(
            out.status.success(),
            "restart failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("tests/control-plane/down"))
            .env("TRAINLET_CONTROL_PLANE_DIR", &self.dir)
            .output();
    }
}

/// Installs the JobSet CRD from sigs.k8s.io/jobset's Go module (tests/control-plane/crd),
/// once per run, and waits until it is served.
pub fn jobset_crd() {
    install_crd("jobset", "jobsets.jobset.x-k8s.io");
}

/// Installs the Prometheus Operator's PodMonitor CRD from its Go module, once per run.
pub fn podmonitor_crd() {
    install_crd("podmonitor", "podmonitors.monitoring.coreos.com");
}

/// Installs the CRD that `tests/control-plane/crd <which>` names, once per run, and
/// waits until `crd` is Established.
fn install_crd(which: &str, crd: &str) {
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    // A test that panicked while holding the lock leaves it poisoned; the list is
    // still right.
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if done.iter().any(|d| d == which) {
        return;
    }
    let out = std::process::Command::new(repo().join("tests/control-plane/crd"))
        .arg(which)
        .output()
        .expect("tests/control-plane/crd runs");
    assert!(
        out.status.success(),
        "tests/control-plane/crd {which}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8(out.stdout).unwrap();
    // Server-side: a CRD can be larger than client-side apply's annotation allows.
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        path.trim(),
    ]);
    // kubectl wait (and a jsonpath filter) fail at once while the CRD has no
    // conditions yet: poll the conditions as JSON.
    let established = || {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args([
                "get",
                &format!("crd/{crd}"),
                "-o",
                "jsonpath={.status.conditions}",
            ])
            .output()
            .expect("kubectl is installed");
        let conditions: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        conditions.as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        })
    };
    let start = std::time::Instant::now();
    while !established() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the CRD {crd} is not Established after 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    done.push(which.to_string());
}
