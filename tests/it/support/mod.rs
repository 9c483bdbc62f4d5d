//! Test support shared by every integration test: a real kube-apiserver, etcd and
//! kube-controller-manager on 127.0.0.1 (started by `tests/control-plane/up`), a fresh
//! namespace per test, pods
//! from short specs, a kubelet player that writes pod status, the manifests' RBAC with a
//! minted ServiceAccount token, and the built `trainlet` binary as a subprocess.
//!
//! Nothing here is a mock: the API server enforces RBAC, admission, validation and
//! watch semantics exactly as in a cluster, and the Job, StatefulSet, namespace and
//! ServiceAccount controllers act as in one ([`jobs`]). There is no kubelet and no
//! scheduler, so the tests play those parts.
#![allow(dead_code)]

pub mod jobs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

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

/// A unique suffix for names, so tests and reruns never collide.
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!(
        "{:x}{}{}",
        t % 0xffffff,
        std::process::id() % 1000,
        N.fetch_add(1, Ordering::Relaxed)
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
/// everything in it. The test plays the kubelet that confirms its pods are gone (a
/// bound pod is deleted gracefully, and only a kubelet ends that).
pub async fn delete_namespace(client: &Client, name: &str) {
    let api = Api::<Namespace>::all(client.clone());
    api.delete(name, &Default::default())
        .await
        .expect("delete namespace");
    let pods = Api::<Pod>::namespaced(client.clone(), name);
    eventually("the namespace is gone", Duration::from_secs(60), || async {
        for p in pods
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let now = kube::api::DeleteParams::default().grace_period(0);
            let _ = pods
                .delete(p.metadata.name.as_deref().unwrap_or_default(), &now)
                .await;
        }
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
}

/// A pod from a short spec. Build it, then `create` it.
#[derive(Clone)]
pub struct PodSpec {
    pub name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    ports: Vec<(String, i32)>,
    hostname: Option<String>,
    subdomain: Option<String>,
    gpus: Option<u32>,
    container: String,
    owner: Option<Value>,
    service_account: Option<String>,
    host_network: bool,
}

pub fn pod(name: &str) -> PodSpec {
    PodSpec {
        name: name.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        ports: Vec::new(),
        hostname: None,
        subdomain: None,
        gpus: None,
        container: "trainer".into(),
        owner: None,
        service_account: None,
        host_network: false,
    }
}

impl PodSpec {
    /// Labels in selector syntax: `app=mnist,role=worker`.
    pub fn labels(mut self, spec: &str) -> Self {
        for kv in spec.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').expect("k=v");
            self.labels.insert(k.into(), v.into());
        }
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }
    pub fn port(mut self, name: &str, port: i32) -> Self {
        self.ports.push((name.into(), port));
        self
    }
    pub fn dns(mut self, hostname: &str, subdomain: &str) -> Self {
        self.hostname = Some(hostname.into());
        self.subdomain = Some(subdomain.into());
        self
    }
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus = Some(n);
        self
    }
    pub fn container(mut self, name: &str) -> Self {
        self.container = name.into();
        self
    }
    pub fn host_network(mut self) -> Self {
        self.host_network = true;
        self
    }
    pub fn service_account(mut self, sa: &str) -> Self {
        self.service_account = Some(sa.into());
        self
    }
    /// A controller owner reference, as the Job or StatefulSet controller would set.
    pub fn owned_by(mut self, api_version: &str, kind: &str, name: &str, uid: &str) -> Self {
        self.owner = Some(
            json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}),
        );
        self
    }

    pub fn to_pod(&self) -> Pod {
        let mut container = json!({"name": self.container, "image": "registry.example/train:1"});
        if !self.ports.is_empty() {
            container["ports"] = self
                .ports
                .iter()
                .map(|(n, p)| json!({"name": n, "containerPort": p}))
                .collect();
        }
        if let Some(n) = self.gpus {
            container["resources"] = json!({"limits": {"nvidia.com/gpu": n.to_string()}});
        }
        let mut spec = json!({"containers": [container], "restartPolicy": "Never"});
        if let Some(h) = &self.hostname {
            spec["hostname"] = json!(h);
        }
        if let Some(s) = &self.subdomain {
            spec["subdomain"] = json!(s);
        }
        if let Some(sa) = &self.service_account {
            spec["serviceAccountName"] = json!(sa);
        }
        if self.host_network {
            spec["hostNetwork"] = json!(true);
        }
        let mut meta =
            json!({"name": self.name, "labels": self.labels, "annotations": self.annotations});
        if let Some(o) = &self.owner {
            meta["ownerReferences"] = json!([o]);
        }
        serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
    }

    pub async fn create(&self, client: &Client, ns: &str) -> Pod {
        Api::<Pod>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &self.to_pod())
            .await
            .unwrap_or_else(|e| panic!("create pod {}: {e}", self.name))
    }
}

/// Plays the kubelet (and the scheduler): binds pods to nodes and writes their status
/// through the status subresource, as the real ones do.
#[derive(Clone)]
pub struct Kubelet {
    pub api: Api<Pod>,
}

impl Kubelet {
    pub fn new(client: &Client, ns: &str) -> Self {
        Kubelet {
            api: Api::namespaced(client.clone(), ns),
        }
    }

    /// Sets spec.nodeName through the binding subresource, as the scheduler does.
    pub async fn bind(&self, pod: &str, node: &str) {
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
        self.api
            .create_subresource::<Value, Value>("binding", pod, &PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("bind {pod}: {e}"));
    }

    /// Writes a merge patch to the status subresource and returns the updated pod.
    pub async fn status(&self, pod: &str, status: Value) -> Pod {
        self.api
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap_or_else(|e| panic!("patch status of {pod}: {e}"))
    }

    /// Scheduled and running with this pod IP (and Ready, with a started container).
    pub async fn run(&self, pod: &str, ip: &str) -> Pod {
        self.bind(pod, "node-a").await;
        self.running(pod, ip).await
    }

    /// Running with this IP; the pod must be bound already.
    pub async fn running(&self, pod: &str, ip: &str) -> Pod {
        let p = self.api.get(pod).await.unwrap();
        let container = p.spec.as_ref().unwrap().containers[0].name.clone();
        self.running_as(pod, ip, &container).await
    }

    /// Running with this IP, for a pod whose (first) container is `container`: one
    /// request, for benchmarks that count the API server's requests.
    pub async fn running_as(&self, pod: &str, ip: &str, container: &str) -> Pod {
        let now = now();
        self.status(
            pod,
            json!({
                "phase": "Running",
                "podIP": ip, "podIPs": [{"ip": ip}],
                "hostIP": "192.168.0.10", "hostIPs": [{"ip": "192.168.0.10"}],
                "startTime": now,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now}
                ],
                "containerStatuses": [{
                    "name": container, "image": "registry.example/train:1", "imageID": "",
                    "ready": true, "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": now}}
                }]
            }),
        )
        .await
    }

    /// Pending and unschedulable, with the scheduler's message.
    pub async fn unschedulable(&self, pod: &str, message: &str) -> Pod {
        self.status(
            pod,
            json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message, "lastTransitionTime": now()}]
            }),
        )
        .await
    }

    /// Sets only the phase.
    pub async fn phase(&self, pod: &str, phase: &str) -> Pod {
        self.status(pod, json!({ "phase": phase })).await
    }

    /// Running, and the container restarted once after an OOM kill.
    pub async fn oom_killed(&self, pod: &str, container: &str, restarts: i32) -> Pod {
        let now = now();
        self.status(
            pod,
            json!({
                "containerStatuses": [{
                    "name": container, "image": "registry.example/train:1", "imageID": "",
                    "ready": true, "restartCount": restarts, "started": true,
                    "state": {"running": {"startedAt": now}},
                    "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": now, "finishedAt": now}}
                }]
            }),
        )
        .await
    }
}

pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
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

/// The built trainlet binary, with a clean environment: no TRAINLET_* or downward API
/// variables leak in from the developer's shell.
pub fn trainlet() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainlet"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TRAINLET_")
            || k.starts_with("POD_")
            || k == "KUBECONFIG"
            || k == "HOSTNAME"
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("TRAINLET_LOG_LEVEL", "info");
    cmd.stdin(Stdio::null());
    cmd
}

/// The result of a trainlet run, with convenient accessors.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from_output(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
    /// The one-line error trainlet printed last.
    pub fn error_line(&self) -> &str {
        self.stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("trainlet: error: "))
            .map(|l| &l["trainlet: error: ".len()..])
            .unwrap_or_else(|| panic!("no error line in stderr:\n{}", self.stderr))
    }
}

/// Runs trainlet to completion (blocking), returning code and output.
pub fn run(cmd: &mut Command) -> Run {
    Run::from_output(cmd.output().expect("spawn trainlet"))
}

/// Runs trainlet on a blocking thread, so an async test can play the kubelet meanwhile.
pub fn spawn(mut cmd: Command) -> tokio::task::JoinHandle<Run> {
    tokio::task::spawn_blocking(move || run(&mut cmd))
}

/// Lists the Events (events.k8s.io/v1) in a namespace as (type, reason, note, regarding).
pub async fn events(client: &Client, ns: &str) -> Vec<(String, String, String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits until `check` returns Some, polling every 50 ms, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// In CI a missing prerequisite is a failure; elsewhere a test may skip with a reason.
pub fn skip_or_fail(reason: &str) -> bool {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("prerequisite missing under CI=true: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
    true
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

/// A free TCP port on 127.0.0.1 (the kernel picks it), for servers a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The files in a directory, sorted, for "nothing was written" checks.
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every file `trainlet init` writes for a job of one type, `worker`, in `list_dir`'s
/// order.
pub const WORKER_JOB_FILES: [&str; 8] = [
    "cluster.json",
    "hostfile",
    "jax.env",
    "mpi.env",
    "tf_config.json",
    "torch.env",
    "trainlet.env",
    "worker.host",
];

/// `trainlet init` against a namespace as pod `pod`, writing to `out`.
pub fn init_cmd(kubeconfig: &Path, ns: &str, pod: &str, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = trainlet();
    cmd.arg("init")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--pod-name", pod, "--pod-namespace", ns])
        .arg("--output-dir")
        .arg(out)
        .args(extra);
    cmd
}

/// `n` pods `w-0`… labelled `role=w`, and a waiting `trainlet init` agent for each on
/// `kubeconfig` (`--job worker=role=w --expect worker=n`): the pod names, the agents'
/// output directories and their runs.
pub async fn waiting_agents(
    kubeconfig: &Path,
    client: &Client,
    ns: &str,
    n: usize,
    port: &str,
) -> (
    Vec<String>,
    Vec<tempfile::TempDir>,
    Vec<tokio::task::JoinHandle<Run>>,
) {
    let names: Vec<String> = (0..n).map(|i| format!("w-{i}")).collect();
    for name in &names {
        pod(name).labels("role=w").create(client, ns).await;
    }
    let dirs: Vec<tempfile::TempDir> = names.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let expect = format!("worker={n}");
    let agents = names
        .iter()
        .zip(&dirs)
        .map(|(name, d)| {
            spawn(init_cmd(
                kubeconfig,
                ns,
                name,
                d.path(),
                &[
                    "--job",
                    "worker=role=w",
                    "--expect",
                    &expect,
                    "--port",
                    port,
                    "--timeout",
                    "90s",
                ],
            ))
        })
        .collect();
    (names, dirs, agents)
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
