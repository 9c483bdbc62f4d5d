//! The nodes inject writes: trainlet's containers, volumes, mounts and env.

use super::yaml::{self, Node};
use super::{
    BINARY, INIT_CONTAINER, InjectConfig, OBSERVED_VOLUME, Resources, SHM_VOLUME, SIDECAR,
    TOKEN_PATH, TOKEN_SECONDS, TOKEN_VOLUME, UID, VOLUME,
};
use crate::flags;

pub(super) fn volume() -> Node {
    Node::map([
        ("name", Node::str(VOLUME)),
        // Holds TF_CONFIG files and the trainlet binary (about 15 MiB).
        ("emptyDir", Node::map([("sizeLimit", Node::str("64Mi"))])),
    ])
}

/// The handover: a few KiB in memory.
pub(super) fn observed_volume() -> Node {
    Node::map([
        ("name", Node::str(OBSERVED_VOLUME)),
        (
            "emptyDir",
            Node::map([
                ("medium", Node::str("Memory")),
                ("sizeLimit", Node::str("1Mi")),
            ]),
        ),
    ])
}

/// What the kubelet's automount gives a pod (token, CA, namespace), as a volume that
/// only trainlet's containers mount. The kubelet rotates the token; kube's client
/// re-reads the file every minute.
pub(super) fn token_volume() -> Node {
    Node::map([
        ("name", Node::str(TOKEN_VOLUME)),
        (
            "projected",
            Node::map([
                ("defaultMode", Node::int(0o444)),
                (
                    "sources",
                    Node::seq([
                        Node::map([(
                            "serviceAccountToken",
                            Node::map([
                                ("path", Node::str("token")),
                                ("expirationSeconds", Node::int(TOKEN_SECONDS)),
                            ]),
                        )]),
                        Node::map([(
                            "configMap",
                            Node::map([
                                ("name", Node::str("kube-root-ca.crt")),
                                (
                                    "items",
                                    Node::seq([Node::map([
                                        ("key", Node::str("ca.crt")),
                                        ("path", Node::str("ca.crt")),
                                    ])]),
                                ),
                            ]),
                        )]),
                        Node::map([(
                            "downwardAPI",
                            Node::map([(
                                "items",
                                Node::seq([Node::map([
                                    ("path", Node::str("namespace")),
                                    (
                                        "fieldRef",
                                        Node::map([("fieldPath", Node::str("metadata.namespace"))]),
                                    ),
                                ])]),
                            )]),
                        )]),
                    ]),
                ),
            ]),
        ),
    ])
}

pub(super) fn mount(path: &str, read_only: bool) -> Node {
    mount_of(VOLUME, path, read_only)
}

pub(super) fn mount_of(volume: &str, path: &str, read_only: bool) -> Node {
    let mut m = Node::map([("name", Node::str(volume)), ("mountPath", Node::str(path))]);
    if read_only {
        m.set("readOnly", Node::Scalar(plain("true")));
    }
    m
}

pub(super) fn plain(text: &str) -> yaml::Scalar {
    yaml::Scalar {
        text: text.to_string(),
        plain: true,
        tag: None,
    }
}

/// The Prometheus scrape annotations of the pod: the sidecar's `/metrics`.
pub(super) fn scrape_annotations(cfg: &InjectConfig) -> [(&'static str, String); 3] {
    [
        ("prometheus.io/scrape", "true".to_string()),
        ("prometheus.io/port", cfg.metrics.port.to_string()),
        ("prometheus.io/path", "/metrics".to_string()),
    ]
}

/// The wrapped container's `trainlet exec` settings that inject owns, after the
/// downward env: `wrap_env`, and the handover directory, since exec hands its
/// observations to the sidecar instead of publishing them.
pub(super) fn exec_env(cfg: &InjectConfig) -> Vec<Node> {
    cfg.wrap_env
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .chain([("TRAINLET_OBSERVATIONS", cfg.observations_dir.as_str())])
        .map(|(name, value)| Node::map([("name", Node::str(name)), ("value", Node::str(value))]))
        .collect()
}

/// POD_NAME, POD_NAMESPACE and POD_UID from the downward API: who "self" is.
pub(super) fn downward_env() -> Vec<Node> {
    [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_UID", "metadata.uid"),
    ]
    .into_iter()
    .map(|(name, path)| {
        Node::map([
            ("name", Node::str(name)),
            (
                "valueFrom",
                Node::map([("fieldRef", Node::map([("fieldPath", Node::str(path))]))]),
            ),
        ])
    })
    .collect()
}

/// Pod Security `restricted`, and then some: no root, no writes outside the volume, no
/// privilege escalation, no capabilities, the runtime's seccomp profile.
pub(super) fn security_context() -> Node {
    Node::map([
        ("allowPrivilegeEscalation", Node::Scalar(plain("false"))),
        (
            "capabilities",
            Node::map([("drop", Node::seq([Node::str("ALL")]))]),
        ),
        ("readOnlyRootFilesystem", Node::Scalar(plain("true"))),
        ("runAsNonRoot", Node::Scalar(plain("true"))),
        ("runAsUser", Node::int(UID)),
        ("runAsGroup", Node::int(UID)),
        (
            "seccompProfile",
            Node::map([("type", Node::str("RuntimeDefault"))]),
        ),
    ])
}

/// Small: init waits on one watch, the sidecar polls /proc and NVML every few seconds.
pub(super) fn resources(r: &Resources) -> Node {
    let both = || Node::map([("cpu", Node::str(&r.cpu)), ("memory", Node::str(&r.memory))]);
    Node::map([("requests", both()), ("limits", both())])
}

/// `--shm-size`: shared memory in RAM, counted against the containers' memory limits.
pub(super) fn shm_volume(size: &str) -> Node {
    Node::map([
        ("name", Node::str(SHM_VOLUME)),
        (
            "emptyDir",
            Node::map([
                ("medium", Node::str("Memory")),
                ("sizeLimit", Node::str(size)),
            ]),
        ),
    ])
}

pub(super) fn trainlet_container(
    cfg: &InjectConfig,
    name: &str,
    sub: &str,
    args: &[String],
) -> Node {
    let mut c = Node::map([
        ("name", Node::str(name)),
        ("image", Node::str(&cfg.image)),
        ("command", Node::seq([Node::str(BINARY), Node::str(sub)])),
    ]);
    if !args.is_empty() {
        c.set("args", Node::seq(args.iter().map(Node::str)));
    }
    c.set("env", Node::Seq(downward_env()));
    c.set("resources", resources(&cfg.resources));
    c.set("securityContext", security_context());
    // init writes the files; with --wrap the sidecar moves them to replaced peers for
    // exec's restart (report::handover::peers). Everyone else only reads them.
    let writes = sub == "init" || (sub == "sidecar" && cfg.wrap.is_some());
    let mut mounts = vec![mount(&cfg.output_dir, !writes)];
    if sub == "sidecar" && cfg.wrap.is_some() {
        mounts.push(mount_of(OBSERVED_VOLUME, &cfg.observations_dir, true));
    }
    mounts.push(mount_of(TOKEN_VOLUME, TOKEN_PATH, true));
    c.set("volumeMounts", Node::Seq(mounts));
    c
}

pub(super) fn init_container(cfg: &InjectConfig) -> Node {
    trainlet_container(cfg, INIT_CONTAINER, flags::INIT, &cfg.init_args)
}

/// The name of the sidecar's metrics port, which the PodMonitor example selects (a
/// port name has at most 15 characters).
pub const METRICS_PORT_NAME: &str = "trainlet";

/// The arguments of `trainlet sidecar`.
pub(super) fn sidecar_args(cfg: &InjectConfig) -> Vec<String> {
    let mut args = cfg.sidecar_args.clone();
    if cfg.wrap.is_some() {
        // One reporter per pod: the sidecar publishes what the wrapped exec observes.
        args.push(flags::with_value(
            flags::OBSERVATIONS,
            &cfg.observations_dir,
        ));
    }
    if let Some(addr) = &cfg.metrics.addr {
        args.push(flags::with_value(flags::METRICS_ADDR, addr));
    }
    if cfg.classic_sidecar {
        args.push(flags::long(flags::EXIT_WITH_MAIN));
    }
    args
}

pub(super) fn sidecar(cfg: &InjectConfig) -> Node {
    let args = sidecar_args(cfg);
    let mut c = trainlet_container(cfg, SIDECAR, flags::SIDECAR, &args);
    // Named, so that a Prometheus Operator PodMonitor (which ignores prometheus.io/*
    // annotations) can select it: manifests/monitoring/podmonitor.yaml. Not on
    // hostNetwork, where a containerPort is a host port too: the scheduler would keep
    // the job's own pods off one node, and the second sidecar of a node serves on
    // another port anyway (docs/hostnetwork.md).
    if !cfg.host_network {
        c.set("ports", Node::seq([metrics_port(cfg.metrics.port)]));
    }
    if !cfg.classic_sidecar {
        // A native sidecar (Kubernetes 1.29+): an init container that keeps running
        // beside the main containers and is stopped after them, so Jobs complete.
        let Node::Map(entries) = &mut c else {
            unreachable!()
        };
        entries.insert(
            1,
            (yaml::Scalar::string("restartPolicy"), Node::str("Always")),
        );
        c.set("startupProbe", startup_probe(cfg));
    }
    c
}

/// The sidecar's named metrics port.
fn metrics_port(port: u16) -> Node {
    Node::map([
        ("name", Node::str(METRICS_PORT_NAME)),
        ("containerPort", Node::Scalar(plain(&port.to_string()))),
    ])
}

/// How long the kubelet waits for the sidecar to serve, in probes one second apart.
const STARTUP_PROBES: u32 = 30;

/// The kubelet starts the training container once the native sidecar counts as
/// started: without a startup probe, as soon as its process exists, which can be
/// before the sidecar has run a line of its own. With this one, once its metrics port
/// listens, which is the sidecar's first step. A probe of the socket, not of `/livez`:
/// with `hostNetwork`, another process of the node may hold the port (the sidecar then
/// serves on another one and says so), and the training container must not wait for
/// the sidecar's port there. By the port's name where the sidecar declares it, else
/// (hostNetwork) by its number.
fn startup_probe(cfg: &InjectConfig) -> Node {
    let port = if cfg.host_network {
        Node::Scalar(plain(&cfg.metrics.port.to_string()))
    } else {
        Node::str(METRICS_PORT_NAME)
    };
    Node::map([
        ("tcpSocket", Node::map([("port", port)])),
        ("periodSeconds", Node::Scalar(plain("1"))),
        (
            "failureThreshold",
            Node::Scalar(plain(&STARTUP_PROBES.to_string())),
        ),
    ])
}

/// The `name` of a container, volume or env entry.
pub(super) fn name_of(n: &Node) -> Option<&str> {
    n.get("name").and_then(Node::as_str)
}
