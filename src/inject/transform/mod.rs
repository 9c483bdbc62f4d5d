//! The pure part of `inject`: YAML text in, YAML text and notes out, for one config.
//! No file, no environment, no clock: the same input gives the same bytes.

use std::fmt;

use super::yaml::{self, Chunk, Node};
pub use hostnet::Metrics;
pub use parts::METRICS_PORT_NAME;

pub mod admission;
mod collisions;
pub mod hostnet;
pub mod launcher;
mod own;
mod parts;
mod policy;
mod selectors;
mod service;
mod template;
mod walk;
mod wrap;
mod wrapper;

/// The names of what inject adds to a pod template. A second inject replaces what it
/// finds under them only where the shape is inject's too (`own`); a user's object
/// under one of them is refused.
pub const INIT_CONTAINER: &str = "trainlet-init";
pub const SIDECAR: &str = "trainlet";
pub const VOLUME: &str = "trainlet";
/// The observation handover (`--observations`): written by the wrapped container's
/// `trainlet exec`, read by the sidecar. Separate from [`VOLUME`], which the training
/// container only reads.
pub const OBSERVED_VOLUME: &str = "trainlet-observed";
/// The memory-backed `/dev/shm` of `--shm-size`.
pub const SHM_VOLUME: &str = "trainlet-shm";
/// Where every container's shared memory is.
pub const SHM_PATH: &str = "/dev/shm";
/// The projected ServiceAccount token, mounted only into trainlet's own containers.
pub const TOKEN_VOLUME: &str = "trainlet-token";
/// Where the token goes: the in-cluster path every Kubernetes client reads.
pub const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The kubelet's own choice for the automounted token: an hour, plus 7 s so that a
/// client can tell it from a token requested for exactly an hour.
const TOKEN_SECONDS: i64 = 3607;
/// The name the API server's ServiceAccount admission gives the default token's volume
/// (`kube-api-access-<suffix>`). A pod read back from the API server carries it, and
/// with it the token in every container: inject and the admission policy take it out
/// (trainlet's own containers mount [`TOKEN_VOLUME`]).
pub const DEFAULT_TOKEN_PREFIX: &str = "kube-api-access-";
/// Where the image puts the binary (docker/Dockerfile).
pub const BINARY: &str = "/usr/local/bin/trainlet";
/// The UID of distroless `nonroot`, which the image runs as.
pub const UID: i64 = 65532;
/// The flags inject writes into the wrapped container's `trainlet exec` after
/// `--report`, as `--flag=value`, in this order: how a wrapper an earlier inject wrote
/// is told from the user's own.
pub const EXEC_FLAGS: [&str; 9] = [
    crate::flags::ON_PEER_CHANGE,
    crate::flags::MAX_RESTARTS,
    crate::flags::RESTART_GRACE,
    crate::flags::STALL_AFTER,
    crate::flags::ON_STALL,
    crate::flags::STALL_SCOPE,
    crate::flags::PROGRESS_PATTERN,
    crate::flags::ON_FAILURE,
    crate::flags::PERMANENT_EXIT_CODES,
];

/// What to inject, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectConfig {
    /// trainlet's image.
    pub image: String,
    /// The `trainlet init` arguments after `init`, e.g. `--job=ps=app=x`.
    pub init_args: Vec<String>,
    /// The `trainlet sidecar` arguments after `sidecar`.
    pub sidecar_args: Vec<String>,
    /// Mount path of the shared emptyDir (init's --output-dir).
    pub output_dir: String,
    /// Mount path of the observation handover volume (`--observations`).
    pub observations_dir: String,
    /// Where init copies the binary (its --install-to), inside `output_dir`.
    pub install_to: String,
    /// A regular container with `--exit-with-main` instead of a native sidecar.
    pub classic_sidecar: bool,
    /// The container whose command runs under `trainlet exec --report --`.
    pub wrap: Option<String>,
    /// The ServiceAccount bound to trainlet's Role, set where a template has none.
    pub service_account: String,
    /// The environment of the wrapped container, after trainlet's own variables are
    /// removed from it (`TRAINLET_OUTPUT_DIR`, `TRAINLET_METRICS_ADDR`).
    pub wrap_env: Vec<(String, String)>,
    /// The sidecar's `/metrics`: `--metrics-addr`, and the port the sidecar's
    /// containerPort, startup probe and the Prometheus scrape annotations name. Per pod
    /// template on hostNetwork ([`hostnet`]).
    pub metrics: Metrics,
    /// The pod template at hand has `hostNetwork: true`: set by inject per template,
    /// never by the CLI.
    pub host_network: bool,
    /// Give Jobs the podFailurePolicy of trainlet's exit codes (`--failure-policy`).
    pub failure_policy: bool,
    /// The training container's permanent exit codes (`--permanent-exit-codes`);
    /// `None`: trainlet's (`crate::exit::CMD_PERMANENT`).
    pub permanent_exit_codes: Option<Vec<i32>>,
    /// The flags of the wrapped container's `trainlet exec`: `--report`, then those of
    /// [`EXEC_FLAGS`] given, in that order.
    pub exec_args: Vec<String>,
    /// CPU and memory of trainlet's containers, requests and limits alike.
    pub resources: Resources,
    /// The size of a memory-backed `/dev/shm` for the pod's containers, if any.
    pub shm_size: Option<String>,
    /// Where `--framework` is not given: how a pod template's frameworks follow its
    /// wrapped command's launcher ([`launcher`]). `None` with `--framework`, which
    /// always wins, `tensorflow` too.
    pub infer: Option<Infer>,
}

/// What changes in a pod template whose wrapped command's launcher chooses its
/// frameworks: exactly what `--framework` with them would have changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Infer {
    /// Where `--framework=…` goes among `init_args`: where inject writes the flag.
    pub at: usize,
    /// The sidecar's arguments with frameworks other than TensorFlow's alone: without
    /// TensorFlow's task port, which it watches only for TensorFlow (or `--port`).
    pub sidecar_args: Vec<String>,
}

impl InjectConfig {
    /// This config for a pod template whose wrapped container runs `command` with
    /// `args`: with the frameworks its launcher asks for, where `--framework` is not
    /// given; and what was inferred, for the note.
    fn inferred(
        &self,
        command: &[String],
        args: &[String],
    ) -> Option<(InjectConfig, launcher::Inferred)> {
        let infer = self.infer.as_ref()?;
        let inferred = launcher::infer(command, args)?;
        let mut cfg = self.clone();
        let at = infer.at.min(cfg.init_args.len());
        cfg.init_args.insert(
            at,
            crate::flags::with_value(crate::flags::FRAMEWORK, inferred.value()),
        );
        cfg.sidecar_args = infer.sidecar_args.clone();
        Some((cfg, inferred))
    }
}

/// CPU and memory quantities, checked ([`super::quantity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    pub cpu: String,
    pub memory: String,
}

/// Something the user should know about one document; printed on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// 1-based document number.
    pub doc: usize,
    /// e.g. `batch/v1 Job "mnist-ps"`.
    pub what: String,
    pub text: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {} ({}): {}", self.doc, self.what, self.text)
    }
}

/// Why a stream cannot be injected. Each names what the user can fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    #[error("invalid YAML in document {doc} at line {line}, column {column}: {message}")]
    Syntax {
        doc: usize,
        line: usize,
        column: usize,
        message: String,
    },
    /// The container to wrap runs its image's ENTRYPOINT, which inject cannot see.
    #[error(
        "cannot wrap container {container:?} of {what} (document {doc}): {}",
        Self::IMPLICIT_ENTRYPOINT
    )]
    ImplicitEntrypoint {
        doc: usize,
        what: String,
        container: String,
    },
    /// No pod template has the container to wrap.
    #[error("no pod template has a container {container:?} to wrap (found: {found})")]
    WrapNotFound { container: String, found: String },
    #[error("{what} (document {doc}): {why}")]
    Shape {
        doc: usize,
        what: String,
        why: String,
    },
}

impl TransformError {
    /// Why a container without `command` cannot be wrapped, and what to do.
    pub const IMPLICIT_ENTRYPOINT: &str = "it has no `command`, so it runs its image's ENTRYPOINT, which inject cannot see; give the program explicitly, e.g. `command: [python, train.py]`, and inject again";
}

/// The result of a whole stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub yaml: String,
    pub notes: Vec<Note>,
}

/// Injects every pod template in a stream of documents.
///
/// Documents that come out unchanged (other kinds, or already injected with this same
/// config) are written back byte for byte, comments included; that is also what makes
/// a second inject give exactly the output of the first. Changed documents are written
/// anew in block style, and lose their comments.
pub fn inject(src: &str, cfg: &InjectConfig) -> Result<Output, TransformError> {
    let mut out = Output {
        yaml: String::new(),
        notes: Vec::new(),
    };
    let mut parts: Vec<String> = Vec::new();
    let mut doc = 0;
    let mut wrapped = 0;
    let mut containers_seen: Vec<String> = Vec::new();
    let mut services = service::Services::default();
    for chunk in yaml::split_documents(src) {
        if chunk.text.trim().is_empty() {
            continue;
        }
        let nodes = parse(&chunk, doc + 1)?;
        if nodes.is_empty() {
            // Only comments: keep them.
            parts.push(chunk.text.to_string());
            continue;
        }
        let mut changed = false;
        let mut emitted = String::new();
        for (i, node) in nodes.iter().enumerate() {
            doc += 1;
            let mut new = node.clone();
            let mut ctx = Ctx {
                cfg,
                doc,
                notes: &mut out.notes,
                wrapped: &mut wrapped,
                containers_seen: &mut containers_seen,
                services: &mut services,
                identity: String::new(),
            };
            ctx.document(&mut new)?;
            changed |= new != *node;
            if i > 0 {
                emitted.push_str("---\n");
            }
            emitted.push_str(&yaml::emit(&new));
        }
        parts.push(if changed {
            emitted
        } else {
            chunk.text.to_string()
        });
    }
    if let Some(c) = &cfg.wrap
        && wrapped == 0
    {
        containers_seen.dedup();
        return Err(TransformError::WrapNotFound {
            container: c.clone(),
            found: if containers_seen.is_empty() {
                "no containers".into()
            } else {
                containers_seen.join(", ")
            },
        });
    }
    if service::dns(&cfg.init_args) {
        for (service, what, text) in services.missing() {
            if let Some(node) = service {
                parts.push(yaml::emit(&node));
                doc += 1;
            }
            out.notes.push(Note { doc, what, text });
        }
    }
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.yaml.push_str("---\n");
        }
        out.yaml.push_str(p);
        if !p.ends_with('\n') {
            out.yaml.push('\n');
        }
    }
    Ok(out)
}

fn parse(chunk: &Chunk<'_>, doc: usize) -> Result<Vec<Node>, TransformError> {
    yaml::parse(chunk).map_err(|e| TransformError::Syntax {
        doc,
        line: e.line,
        column: e.column,
        message: e.message,
    })
}

struct Ctx<'a> {
    cfg: &'a InjectConfig,
    doc: usize,
    notes: &'a mut Vec<Note>,
    wrapped: &'a mut usize,
    containers_seen: &'a mut Vec<String>,
    services: &'a mut service::Services,
    /// `namespace/name` of the workload whose pod template is at hand ([`hostnet`]).
    identity: String,
}

/// `batch/v1 Job "mnist-ps"`, for notes and errors.
/// A resource's kind and name, or empty strings.
fn kind_name(node: &Node) -> (String, String) {
    let get = |n: Option<&Node>| n.and_then(Node::as_str).unwrap_or_default().to_string();
    (
        get(node.get("kind")),
        get(node.get("metadata").and_then(|m| m.get("name"))),
    )
}

/// `namespace/name` of a workload, for [`hostnet::slot`]: its `generateName` where it
/// has no name, an empty namespace where it names none.
fn workload_identity(node: &Node) -> String {
    let meta = |key: &str| {
        node.get("metadata")
            .and_then(|m| m.get(key))
            .and_then(Node::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let name = match meta("name") {
        n if n.is_empty() => meta("generateName"),
        n => n,
    };
    hostnet::identity(&meta("namespace"), &name)
}

fn describe(node: &Node) -> String {
    let av = node.get("apiVersion").and_then(Node::as_str).unwrap_or("?");
    let kind = node.get("kind").and_then(Node::as_str).unwrap_or("?");
    match node
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Node::as_str)
    {
        Some(n) => format!("{av} {kind} {n:?}"),
        None => format!("{av} {kind}"),
    }
}

/// The path from a resource to its pod template, by apiVersion and kind. Only the core
/// workload kinds: a custom resource with the same kind name (say a Volcano `Job`) has
/// another shape and passes through.
fn template_path(api_version: &str, kind: &str) -> Option<&'static [&'static str]> {
    Some(match (api_version, kind) {
        ("v1", "Pod") => &[],
        ("batch/v1", "Job")
        | ("apps/v1", "StatefulSet")
        | ("apps/v1", "Deployment")
        | ("apps/v1", "ReplicaSet") => &["spec", "template"],
        ("batch/v1", "CronJob") => &["spec", "jobTemplate", "spec", "template"],
        _ => return None,
    })
}

/// The mapping at `path` below `node`, if every step is a mapping.
fn descend<'n>(node: &'n mut Node, path: &[&str]) -> Option<&'n mut Node> {
    match path.split_first() {
        None => Some(node),
        Some((key, rest)) => match node.get_mut(key) {
            Some(t @ Node::Map(_)) => descend(t, rest),
            _ => None,
        },
    }
}

/// JobSet (`jobset.x-k8s.io`): a pod template in every replicated job, at
/// `spec.replicatedJobs[*].template.spec.template`.
fn is_jobset(api_version: &str, kind: &str) -> bool {
    kind == "JobSet" && api_version.starts_with("jobset.x-k8s.io/")
}
