//! The real node of `tests/node/up` for the tests that run pods on it
//! (tests/it/node_examples.rs, node_pods.rs, node_quickstart.rs) and the node benchmark
//! (benches/trainlet/node.rs): started once per process on a control plane of its own
//! (target/control-plane-node: on the shared one, its scheduler and kubelet would take
//! the pods that the other tests schedule and run themselves), with the guard policy of
//! manifests/guard/ installed, the JobSet CRD and the real JobSet controller, and
//! nvidia.com/gpu advertised as an extended resource; namespaces that enforce Pod
//! Security `restricted` with trainlet's RBAC applied as a user would; kubectl that
//! fails on any warning; what a pod's containers said, for failure messages; and the
//! lines the test trainer (tests/node/trainer) prints.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::binary::{output_with_stdin, trainlet};
use super::cluster::{kubectl_on, namespace_with_labels, repo};
use super::skip::{Group, Missing, root};

/// The node's own control plane (see the module's header).
pub const NODE_CONTROL_PLANE: &str = "target/control-plane-node";

/// nvidia.com/gpu the node advertises: every example at once, twice over.
pub const NODE_GPUS: u32 = 256;

/// The node's admin kubeconfig, once the node is up with what every node test needs:
/// the guard policy, the JobSet CRD and controller, and nvidia.com/gpu capacity; or
/// what is missing to start it (group `node`: root, the image archive). A node that
/// does not come up although nothing is missing fails the test.
pub fn node() -> Result<&'static Path, Missing> {
    static NODE: OnceLock<Result<PathBuf, Missing>> = OnceLock::new();
    NODE.get_or_init(|| {
        root(
            Group::Node,
            "tests/node/up (containerd, mounts, iptables, cgroups)",
        )?;
        let archive = image_archive();
        if !archive.is_file() {
            return Err(Missing::new(
                Group::Node,
                format!(
                    "no {}: the node runs trainlet's containers from this image archive; build it with `make image`",
                    archive.display()
                ),
            ));
        }
        let up = repo().join("tests/node/up");
        let out = Command::new(&up)
            .env("TRAINLET_CONTROL_PLANE_DIR", repo().join(NODE_CONTROL_PLANE))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", up.display()));
        assert!(
            out.status.success(),
            "the node could not be started ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let kc = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .expect("up prints the kubeconfig path last")
                .trim(),
        );
        let guard = repo().join("manifests/guard/own-pod-only.yaml");
        kubectl_on(&kc, &["apply", "-f", guard.to_str().unwrap()]);
        install_jobset_crd(&kc);
        let js = repo().join("tests/node/jobset-controller");
        let out = Command::new(&js)
            .arg(&kc)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", js.display()));
        assert!(
            out.status.success(),
            "the JobSet controller could not be started ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        advertise_gpus(&kc);
        Ok(kc)
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(Clone::clone)
}

/// The second node, on cgroup v2 with containerd 2 (`tests/node/up --cgroup2`:
/// tests/node/cgroup2/kubelet), joined to [`node`]'s cluster: node `trainlet-cgroup2`,
/// tainted [`CGROUP2_TAINT`], labelled `trainlet.test/node=cgroup2`, pods from
/// 10.244.1.0/24. Started once per process; returns the same kubeconfig as [`node`].
pub fn cgroup2_node() -> Result<&'static Path, Missing> {
    static NODE: OnceLock<Result<(), Missing>> = OnceLock::new();
    let kc = node()?;
    NODE.get_or_init(|| {
        cgroup2_kubelet(kc, false);
        Ok(())
    })
    .clone()
    .map(|()| kc)
}

/// The cgroup v2 node's name (tests/node/cgroup2/kubelet).
pub const CGROUP2_NODE: &str = "trainlet-cgroup2";

/// What a pod tolerates to run on the cgroup v2 node.
pub const CGROUP2_TAINT: &str = "trainlet.test/cgroup2";

/// (Re)starts the cgroup v2 node's kubelet with `singleProcessOOMKill` as given, and
/// returns once the node is Ready under it (tests/node/cgroup2/kubelet).
pub fn cgroup2_kubelet(kc: &Path, single_process_oom_kill: bool) {
    let script = repo().join("tests/node/cgroup2/kubelet");
    let out = Command::new(&script)
        .arg(kc)
        .arg(format!(
            "--single-process-oom-kill={single_process_oom_kill}"
        ))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "the cgroup v2 node could not be started ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn image_archive() -> PathBuf {
    repo().join(format!(
        "target/image/trainlet-{}.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// The JobSet CRD from sigs.k8s.io/jobset's module (tests/control-plane/crd), as
/// `support::jobset_crd` installs it on the shared control plane.
pub fn install_jobset_crd(kc: &Path) {
    let out = Command::new(repo().join("tests/control-plane/crd"))
        .arg("jobset")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crd = String::from_utf8(out.stdout).unwrap();
    kubectl_on(
        kc,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crd.trim(),
        ],
    );
    // kubectl wait fails at once while the CRD has no conditions yet: poll them.
    let start = Instant::now();
    loop {
        let got = kubectl_on(
            kc,
            &[
                "get",
                "crd/jobsets.jobset.x-k8s.io",
                "-o",
                "jsonpath={.status.conditions}",
            ],
        );
        let conditions: Value = serde_json::from_str(&got).unwrap_or(Value::Null);
        if conditions.as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        }) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the JobSet CRD is not Established after 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// nvidia.com/gpu as an extended resource of the node, as an admin advertises one
/// (a PATCH of the node's status capacity): the GPU examples schedule unchanged. There
/// is no device plugin and no GPU; the kubelet keeps a capacity it does not manage and
/// derives the allocatable from it at its next status update (within about 15 s).
pub fn advertise_gpus(kc: &Path) {
    let patch = json!({"status": {"capacity": {"nvidia.com/gpu": NODE_GPUS.to_string()}}});
    kubectl_on(
        kc,
        &[
            "patch",
            "node",
            "trainlet-node",
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
    );
    let start = Instant::now();
    loop {
        let got = kubectl_on(
            kc,
            &[
                "get",
                "node",
                "trainlet-node",
                "-o",
                r"jsonpath={.status.allocatable.nvidia\.com/gpu}",
            ],
        );
        if got == NODE_GPUS.to_string() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the node's allocatable nvidia.com/gpu is {got:?}, not {NODE_GPUS}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `trainlet inject -f - ARGS` of `plain`, as inject printed it (every document),
/// failing on an error.
pub fn inject_printed(plain: &Value, args: &[&str]) -> String {
    let out = output_with_stdin(
        trainlet().args(["inject", "-f", "-"]).args(args),
        plain.to_string().as_bytes(),
    );
    assert!(
        out.status.success(),
        "trainlet inject: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The one object of a YAML file or of `kubectl kustomize`'s output, as kubectl reads
/// it (go-yaml's rules, through `kubectl create --dry-run=client -o json`).
pub fn as_json(kc: &Path, yaml: &str) -> Value {
    let mut all = all_as_json(kc, yaml);
    assert_eq!(all.len(), 1, "not one object: {all:?}");
    all.remove(0)
}

/// Every object of a YAML stream, as kubectl reads it, in the stream's order.
pub fn all_as_json(kc: &Path, yaml: &str) -> Vec<Value> {
    let out = output_with_stdin(
        Command::new("kubectl").arg("--kubeconfig").arg(kc).args([
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            "-",
        ]),
        yaml.as_bytes(),
    );
    assert!(
        out.status.success(),
        "kubectl create --dry-run=client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One JSON document per object, one after the other.
    serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .collect()
}

/// The lines a trainer prints for a full mesh (TF_CONFIG, the hostfile): it listens on
/// its own address, connects to every other task and is reached by each, from that
/// task's pod IP.
pub fn mesh_lines(me: &str, addr: &str, peers: &[(String, String, String)]) -> Vec<String> {
    let n = peers.len();
    let mut v = vec![format!(
        "trainer: {me} listening on {addr}, waiting for {n} peers"
    )];
    for (name, paddr, ip) in peers {
        v.push(format!("trainer: {me}: connected to {name} at {paddr}"));
        v.push(format!("trainer: {me}: accepted {name} from {ip}"));
    }
    v.push(format!(
        "trainer: ok: {me} reached {n} peers and was reached by {n}"
    ));
    v
}

/// The trainer's lines of a log, comparable: the ephemeral source port of an accepted
/// connection and the time of the ok line left out, sorted (the processes of a pod and
/// the connecting and accepting threads interleave).
pub fn trainer_lines(log: &str) -> Vec<String> {
    let mut v: Vec<String> = log
        .lines()
        .filter(|l| l.starts_with("trainer: "))
        .map(|l| {
            if let Some(i) = l.find(" from ").filter(|_| l.contains(": accepted ")) {
                let (head, addr) = l.split_at(i + " from ".len());
                let ip = addr.rsplit_once(':').map_or(addr, |(ip, _)| ip);
                format!("{head}{ip}")
            } else if l.starts_with("trainer: ok: ") {
                l.rsplit_once(" in ").map_or(l, |(a, _)| a).to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    v.sort();
    v
}

/// kubectl on the node's control plane, failing on an error or on any warning (a Pod
/// Security warning included); returns stdout.
pub fn kubectl_clean(kc: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("kubectl is installed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl {args:?} failed:\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "kubectl {args:?} warned:\n{stderr}"
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A namespace on the node that enforces Pod Security `restricted` (and warns about it,
/// so that a violation fails `kubectl apply` at once), with trainlet's RBAC applied as
/// the examples' headers say: `kubectl apply -k manifests/ -n <namespace>`.
pub async fn restricted_namespace(kc: &Path, client: &Client, prefix: &str) -> String {
    let ns = namespace_with_labels(
        client,
        prefix,
        &[
            ("pod-security.kubernetes.io/enforce", "restricted"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
            ("pod-security.kubernetes.io/warn", "restricted"),
            ("pod-security.kubernetes.io/warn-version", "latest"),
        ],
    )
    .await;
    let manifests = repo().join("manifests");
    kubectl_clean(kc, &["apply", "-k", manifests.to_str().unwrap(), "-n", &ns]);
    ns
}

/// `kubectl apply -f -` of one object on the node's control plane, failing on an error
/// or any warning (a Pod Security warning included); returns kubectl's stdout.
pub fn apply_clean(kc: &Path, ns: &str, doc: &Value) -> String {
    // `as_json` gives objects the kubeconfig's namespace; they go into `ns`.
    let mut doc = doc.clone();
    if let Some(m) = doc["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    let out = output_with_stdin(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kc)
            .args(["apply", "-n", ns, "-f", "-"]),
        doc.to_string().as_bytes(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl apply failed:\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "kubectl apply warned:\n{stderr}"
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every pod of a namespace: its phase, address, each container's state and the last
/// lines of each container's log, for a failure message.
pub async fn describe_pods(pods: &Api<Pod>) -> String {
    let mut out = String::new();
    for p in pods.list(&ListParams::default()).await.unwrap() {
        let st = p.status.clone().unwrap_or_default();
        out += &format!(
            "{} {} {}\n",
            p.name_any(),
            st.phase.unwrap_or_default(),
            st.pod_ip.unwrap_or_default()
        );
        let states: Vec<_> = st
            .init_container_statuses
            .iter()
            .flatten()
            .chain(st.container_statuses.iter().flatten())
            .map(|c| (c.name.clone(), c.state.clone()))
            .collect();
        let spec = p.spec.clone().unwrap();
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            let lp = LogParams {
                container: Some(c.name.clone()),
                tail_lines: Some(15),
                ..Default::default()
            };
            let log = pods.logs(&p.name_any(), &lp).await.unwrap_or_default();
            let state = states
                .iter()
                .find(|(n, _)| *n == c.name)
                .and_then(|(_, s)| serde_json::to_string(s).ok())
                .unwrap_or_default();
            out += &format!("  [{}] {state}\n", c.name);
            for l in log.lines() {
                out += &format!("    {l}\n");
            }
        }
        if spec.node_name.as_deref() == Some(CGROUP2_NODE) {
            out += &cgroup2_kubelet_lines(&p.name_any());
        }
    }
    out + &namespace_events(pods).await
}

/// The namespace's last Events, oldest first: why a pod did not start (a sandbox that
/// failed, an image the node lacks) is there, not in the pods' states.
async fn namespace_events(pods: &Api<Pod>) -> String {
    let ns = pods.namespace().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(pods.clone().into_client(), ns);
    let Ok(list) = events.list(&ListParams::default()).await else {
        return "events: the API server did not list them\n".to_string();
    };
    let mut items = list.items;
    items.sort_by_key(|e| e.last_timestamp.clone().or(e.first_timestamp.clone()));
    let start = items.len().saturating_sub(20);
    items[start..]
        .iter()
        .fold("events:\n".to_string(), |out, e| {
            out + &format!(
                "  {} {} {}: {}\n",
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.involved_object.name.as_deref().unwrap_or_default(),
                e.message.as_deref().unwrap_or_default()
            )
        })
}

/// What the cgroup v2 node's kubelet and containerd logged about a pod, the last lines:
/// that node is a machine of its own whose logs no API reads.
fn cgroup2_kubelet_lines(pod: &str) -> String {
    let script = format!(
        "grep -h -F '{pod}' /var/log/kubelet.log /var/log/containerd.log | tail -n 15; \
         echo '-- the kubelet errors:'; grep -E '^E[0-9]' /var/log/kubelet.log | tail -n 5"
    );
    let out = Command::new(repo().join("tests/node/cgroup2/exec"))
        .args(["-t", "20", &script])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) => format!(
            "  the cgroup v2 node's logs about it:\n{}",
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        ),
        Err(e) => format!("  the cgroup v2 node's logs: cannot run tests/node/cgroup2/exec: {e}\n"),
    }
}
