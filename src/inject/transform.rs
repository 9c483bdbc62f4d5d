//! The pure part of `inject`: YAML text in, YAML text and notes out, for one config.
//! No file, no environment, no clock: the same input gives the same bytes.

use std::fmt;

use super::yaml::{self, Chunk, Node};

/// Names that mark what inject owns in a pod template: finding them again is what makes
/// a second inject replace rather than add.
pub const INIT_CONTAINER: &str = "trainlet-init";
pub const SIDECAR: &str = "trainlet";
pub const VOLUME: &str = "trainlet";
/// The observation handover (`--observations`): written by the wrapped container's
/// `trainlet exec`, read by the sidecar. Separate from [`VOLUME`], which the training
/// container only reads.
pub const OBSERVED_VOLUME: &str = "trainlet-observed";
/// The projected ServiceAccount token, mounted only into trainlet's own containers.
pub const TOKEN_VOLUME: &str = "trainlet-token";
/// Where the token goes: the in-cluster path every Kubernetes client reads.
pub const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The kubelet's own choice for the automounted token: an hour, plus 7 s so that a
/// client can tell it from a token requested for exactly an hour.
const TOKEN_SECONDS: i64 = 3607;
/// Where the image puts the binary (docker/Dockerfile).
pub const BINARY: &str = "/usr/local/bin/trainlet";
/// The UID of distroless `nonroot`, which the image runs as.
pub const UID: i64 = 65532;

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
    /// The port of the sidecar's `/metrics`, for the Prometheus scrape annotations.
    pub metrics_port: u16,
    /// Give Jobs the podFailurePolicy of trainlet's exit codes (`--failure-policy`).
    pub failure_policy: bool,
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
}

/// `batch/v1 Job "mnist-ps"`, for notes and errors.
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

impl Ctx<'_> {
    fn note(&mut self, what: String, text: impl Into<String>) {
        self.notes.push(Note {
            doc: self.doc,
            what,
            text: text.into(),
        });
    }

    fn shape(&self, what: &str, why: impl Into<String>) -> TransformError {
        TransformError::Shape {
            doc: self.doc,
            what: what.to_string(),
            why: why.into(),
        }
    }

    fn document(&mut self, node: &mut Node) -> Result<(), TransformError> {
        let what = describe(node);
        let kind = node.get("kind").and_then(Node::as_str).unwrap_or_default();
        let av = node
            .get("apiVersion")
            .and_then(Node::as_str)
            .unwrap_or_default();
        if kind == "List" || kind.ends_with("List") && node.get("items").is_some() {
            let Some(Node::Seq(items)) = node.get_mut("items") else {
                self.note(what, "no items; passed through unchanged");
                return Ok(());
            };
            let mut n = 0;
            for item in items.iter_mut() {
                n += usize::from(self.resource(item)?);
            }
            if n == 0 {
                self.note(
                    what,
                    "no pod template in its items; passed through unchanged",
                );
            }
            return Ok(());
        }
        if template_path(av, kind).is_none() && !is_jobset(av, kind) {
            self.note(what, "no pod template; passed through unchanged");
            return Ok(());
        }
        self.resource(node)?;
        Ok(())
    }

    /// Injects every replicated job's pod template of a JobSet.
    fn jobset(&mut self, node: &mut Node, what: String) -> Result<bool, TransformError> {
        let path = ["template", "spec", "template"];
        let Some(Node::Seq(rjobs)) = node
            .get_mut("spec")
            .and_then(|s| s.get_mut("replicatedJobs"))
        else {
            self.note(what, "has no spec.replicatedJobs; passed through unchanged");
            return Ok(false);
        };
        let mut changed = false;
        let mut found = false;
        for rjob in rjobs.iter_mut() {
            if descend(rjob, &path).is_none() {
                continue;
            }
            found = true;
            let before = rjob.clone();
            let template = descend(rjob, &path).expect("found above");
            self.pod_template(template, &what)?;
            if self.cfg.failure_policy
                && let Some(job_spec) = descend(rjob, &["template", "spec"])
            {
                self.failure_policy(job_spec, &what)?;
            }
            changed |= *rjob != before;
        }
        if !found {
            self.note(
                what,
                "has no spec.replicatedJobs[*].template.spec.template; passed through unchanged",
            );
            return Ok(false);
        }
        self.note(
            what,
            if changed {
                "injected"
            } else {
                "already injected; unchanged"
            },
        );
        Ok(true)
    }

    /// Injects one resource; false (with a note) when it has no pod template.
    fn resource(&mut self, node: &mut Node) -> Result<bool, TransformError> {
        let what = describe(node);
        let kind = node.get("kind").and_then(Node::as_str).unwrap_or_default();
        let av = node
            .get("apiVersion")
            .and_then(Node::as_str)
            .unwrap_or_default();
        if is_jobset(av, kind) {
            return self.jobset(node, what);
        }
        let Some(path) = template_path(av, kind) else {
            self.note(what, "no pod template; passed through unchanged");
            return Ok(false);
        };
        let is_job = (av, kind) == ("batch/v1", "Job");
        let whole = node.clone();
        let mut template = &mut *node;
        for key in path {
            match template.get_mut(key) {
                Some(t @ Node::Map(_)) => template = t,
                _ => {
                    self.note(
                        what,
                        format!("has no {}; passed through unchanged", path.join(".")),
                    );
                    return Ok(false);
                }
            }
        }
        self.pod_template(template, &what)?;
        if self.cfg.failure_policy
            && is_job
            && let Some(job_spec) = descend(node, &["spec"])
        {
            self.failure_policy(job_spec, &what)?;
        }
        self.note(
            what,
            if *node == whole {
                "already injected; unchanged"
            } else {
                "injected"
            },
        );
        Ok(true)
    }

    /// `--failure-policy`: the Job fails at once on a permanent exit code of
    /// trainlet-init or of the training container, ignores disruptions, and counts the
    /// rest against backoffLimit (`crate::exit::INIT_PERMANENT`, `CMD_PERMANENT`).
    fn failure_policy(&mut self, job_spec: &mut Node, what: &str) -> Result<(), TransformError> {
        let Some(pod) = descend(job_spec, &["template", "spec"]) else {
            return Err(self.shape(what, "spec.template.spec is not a mapping"));
        };
        let training = self
            .cfg
            .wrap
            .clone()
            .or_else(|| match pod.get("containers") {
                Some(Node::Seq(cs)) => cs
                    .iter()
                    .filter_map(name_of)
                    .find(|n| *n != SIDECAR)
                    .map(str::to_string),
                _ => None,
            });
        let Some(training) = training else {
            return Err(self.shape(what, "--failure-policy: the pod template has no container"));
        };
        match pod.get("restartPolicy").and_then(Node::as_str) {
            Some("Never") => {}
            other => {
                self.note(
                    what.to_string(),
                    format!(
                        "restartPolicy {} -> Never, which podFailurePolicy requires: a failed pod is replaced by a new pod (with a new IP)",
                        other.unwrap_or("Always")
                    ),
                );
                pod.set("restartPolicy", Node::str("Never"));
            }
        }
        job_spec.set("podFailurePolicy", pod_failure_policy(&training));
        Ok(())
    }

    /// Adds trainlet to a pod template (or a Pod): metadata annotations, the volume, the
    /// init container, the sidecar, the mounts, and --wrap.
    fn pod_template(&mut self, t: &mut Node, what: &str) -> Result<(), TransformError> {
        let cfg = self.cfg;
        let annotations = t
            .map_entry("metadata")
            .and_then(|m| m.map_entry("annotations"))
            .ok_or_else(|| self.shape(what, "metadata or its annotations is not a mapping"))?;
        annotations.set("prometheus.io/scrape", Node::str("true"));
        annotations.set(
            "prometheus.io/port",
            Node::str(cfg.metrics_port.to_string()),
        );
        annotations.set("prometheus.io/path", Node::str("/metrics"));

        let Some(spec) = t.map_entry("spec") else {
            return Err(self.shape(what, "spec is not a mapping"));
        };
        // New keys go before `containers`, where people expect them to be.
        insert_before(
            spec,
            "serviceAccountName",
            "containers",
            Node::Scalar(plain("")),
        );
        insert_before(spec, "initContainers", "containers", Node::Seq(Vec::new()));
        match spec
            .get("serviceAccountName")
            .and_then(Node::as_str)
            .map(str::to_string)
        {
            None => spec.set("serviceAccountName", Node::str(&cfg.service_account)),
            Some(sa) if sa == "default" => {
                spec.set("serviceAccountName", Node::str(&cfg.service_account))
            }
            Some(sa) if sa == cfg.service_account => {}
            Some(sa) => self.note(
                what.to_string(),
                format!(
                    "keeps serviceAccountName {sa:?}: bind trainlet's Role to it (manifests/rbac.yaml binds {:?})",
                    cfg.service_account
                ),
            ),
        }
        // No token in the training container: its code (and every package it installs)
        // could use it to patch any pod of the namespace. trainlet's own containers get
        // a projected one instead (TOKEN_VOLUME).
        insert_before(
            spec,
            "automountServiceAccountToken",
            "initContainers",
            Node::Scalar(plain("false")),
        );
        spec.set("automountServiceAccountToken", Node::Scalar(plain("false")));

        let volumes = spec
            .seq_entry("volumes")
            .ok_or_else(|| self.shape(what, "spec.volumes is not a list"))?;
        upsert_named(volumes, volume(), VOLUME, None);
        if cfg.wrap.is_some() {
            upsert_named(volumes, observed_volume(), OBSERVED_VOLUME, None);
        }
        upsert_named(volumes, token_volume(), TOKEN_VOLUME, None);

        // Regular containers: drop a classic sidecar from an earlier inject, mount the
        // volume read-only into the others, and wrap the one named by --wrap.
        let containers = spec
            .seq_entry("containers")
            .ok_or_else(|| self.shape(what, "spec.containers is not a list"))?;
        containers.retain(|c| name_of(c) != Some(SIDECAR));
        for c in containers.iter_mut() {
            let name = name_of(c).unwrap_or_default().to_string();
            self.containers_seen.push(name.clone());
            if !matches!(c, Node::Map(_)) {
                continue;
            }
            let mounts = c.seq_entry("volumeMounts").ok_or_else(|| {
                self.shape(
                    what,
                    format!("volumeMounts of container {name:?} is not a list"),
                )
            })?;
            upsert_named(mounts, mount(&cfg.output_dir, true), VOLUME, None);
            if cfg.wrap.as_deref() == Some(name.as_str()) {
                upsert_named(
                    mounts,
                    mount_of(OBSERVED_VOLUME, &cfg.observations_dir, false),
                    OBSERVED_VOLUME,
                    None,
                );
                self.wrap(c, what, &name)?;
                *self.wrapped += 1;
            }
        }
        if cfg.classic_sidecar {
            containers.push(sidecar(cfg));
        }

        let inits = spec
            .seq_entry("initContainers")
            .ok_or_else(|| self.shape(what, "spec.initContainers is not a list"))?;
        inits.retain(|c| !matches!(name_of(c), Some(INIT_CONTAINER | SIDECAR)));
        inits.insert(0, init_container(cfg));
        if !cfg.classic_sidecar {
            inits.insert(1, sidecar(cfg));
        }
        Ok(())
    }

    /// `command: [trainlet exec --report -- <command>]`, `args` unchanged, so the
    /// container runs exactly what it ran before, under trainlet.
    fn wrap(&mut self, c: &mut Node, what: &str, name: &str) -> Result<(), TransformError> {
        let cfg = self.cfg;
        let exe = format!("{}/trainlet", cfg.install_to);
        let prefix = [exe.as_str(), "exec", "--report", "--"];
        let command: Vec<String> = match c.get("command") {
            None => Vec::new(),
            Some(n) if n.is_null() => Vec::new(),
            Some(Node::Seq(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    self.shape(
                        what,
                        format!("command of container {name:?} is not a list of strings"),
                    )
                })?,
            Some(_) => {
                return Err(
                    self.shape(what, format!("command of container {name:?} is not a list"))
                );
            }
        };
        if command.is_empty() {
            return Err(TransformError::ImplicitEntrypoint {
                doc: self.doc,
                what: what.to_string(),
                container: name.to_string(),
            });
        }
        // Already wrapped by an earlier inject (maybe with another --install-to): unwrap
        // first, so that injecting again never wraps twice.
        let original: &[String] = match command.get(..prefix.len()) {
            Some([exe, rest @ ..])
                if exe.ends_with("/trainlet")
                    && rest == ["exec", "--report", "--"]
                    && command.len() > prefix.len() =>
            {
                &command[prefix.len()..]
            }
            _ => &command,
        };
        let wrapped: Vec<Node> = prefix
            .iter()
            .map(|s| Node::str(*s))
            .chain(original.iter().map(Node::str))
            .collect();
        c.set("command", Node::Seq(wrapped));
        let env = c
            .seq_entry("env")
            .ok_or_else(|| self.shape(what, format!("env of container {name:?} is not a list")))?;
        for e in downward_env() {
            upsert_named(env, e.clone(), name_of(&e).unwrap_or_default(), None);
        }
        // Settings of `trainlet exec` that inject owns: removed and added again, so
        // their order and values never depend on an earlier inject.
        env.retain(|e| {
            !matches!(
                name_of(e),
                Some("TRAINLET_OUTPUT_DIR" | "TRAINLET_METRICS_ADDR" | "TRAINLET_OBSERVATIONS")
            )
        });
        for (name, value) in &cfg.wrap_env {
            env.push(Node::map([
                ("name", Node::str(name)),
                ("value", Node::str(value)),
            ]));
        }
        // exec hands its observations to the sidecar instead of publishing them.
        env.push(Node::map([
            ("name", Node::str("TRAINLET_OBSERVATIONS")),
            ("value", Node::str(&cfg.observations_dir)),
        ]));
        Ok(())
    }
}

/// The rules of `--failure-policy`, from `crate::exit`'s permanent codes.
fn pod_failure_policy(training: &str) -> Node {
    let codes = |v: &[i32]| Node::seq(v.iter().map(|c| Node::int(i64::from(*c))));
    let fail_on = |container: &str, values: &[i32]| {
        Node::map([
            ("action", Node::str("FailJob")),
            (
                "onExitCodes",
                Node::map([
                    ("containerName", Node::str(container)),
                    ("operator", Node::str("In")),
                    ("values", codes(values)),
                ]),
            ),
        ])
    };
    Node::map([(
        "rules",
        Node::seq([
            // Preemption, eviction by a drain or a taint: not the job's fault.
            Node::map([
                ("action", Node::str("Ignore")),
                (
                    "onPodConditions",
                    Node::seq([Node::map([
                        ("type", Node::str("DisruptionTarget")),
                        ("status", Node::str("True")),
                    ])]),
                ),
            ]),
            fail_on(INIT_CONTAINER, &crate::exit::INIT_PERMANENT),
            fail_on(training, &crate::exit::CMD_PERMANENT),
        ]),
    )])
}

/// Adds `key` (when absent) just before `before`, or at the end.
fn insert_before(map: &mut Node, key: &str, before: &str, value: Node) {
    let Node::Map(entries) = map else { return };
    if entries.iter().any(|(k, _)| k.text == key) {
        return;
    }
    let at = entries
        .iter()
        .position(|(k, _)| k.text == before)
        .unwrap_or(entries.len());
    entries.insert(at, (yaml::Scalar::string(key), value));
}

fn name_of(n: &Node) -> Option<&str> {
    n.get("name").and_then(Node::as_str)
}

/// Replaces the item named `name` in place, or appends (or inserts at `at`).
fn upsert_named(items: &mut Vec<Node>, item: Node, name: &str, at: Option<usize>) {
    if let Some(existing) = items.iter_mut().find(|i| name_of(i) == Some(name)) {
        *existing = item;
    } else if let Some(i) = at {
        items.insert(i.min(items.len()), item);
    } else {
        items.push(item);
    }
}

fn volume() -> Node {
    Node::map([
        ("name", Node::str(VOLUME)),
        // Holds TF_CONFIG files and the trainlet binary (about 15 MiB).
        ("emptyDir", Node::map([("sizeLimit", Node::str("64Mi"))])),
    ])
}

/// The handover: a few KiB in memory.
fn observed_volume() -> Node {
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
fn token_volume() -> Node {
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

fn mount(path: &str, read_only: bool) -> Node {
    mount_of(VOLUME, path, read_only)
}

fn mount_of(volume: &str, path: &str, read_only: bool) -> Node {
    let mut m = Node::map([("name", Node::str(volume)), ("mountPath", Node::str(path))]);
    if read_only {
        m.set("readOnly", Node::Scalar(plain("true")));
    }
    m
}

fn plain(text: &str) -> yaml::Scalar {
    yaml::Scalar {
        text: text.to_string(),
        plain: true,
        tag: None,
    }
}

/// POD_NAME, POD_NAMESPACE and POD_UID from the downward API: who "self" is.
fn downward_env() -> Vec<Node> {
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
fn security_context() -> Node {
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
fn resources() -> Node {
    Node::map([
        (
            "requests",
            Node::map([("cpu", Node::str("10m")), ("memory", Node::str("32Mi"))]),
        ),
        (
            "limits",
            Node::map([("cpu", Node::str("250m")), ("memory", Node::str("128Mi"))]),
        ),
    ])
}

fn trainlet_container(cfg: &InjectConfig, name: &str, sub: &str, args: &[String]) -> Node {
    let mut c = Node::map([
        ("name", Node::str(name)),
        ("image", Node::str(&cfg.image)),
        ("command", Node::seq([Node::str(BINARY), Node::str(sub)])),
    ]);
    if !args.is_empty() {
        c.set("args", Node::seq(args.iter().map(Node::str)));
    }
    c.set("env", Node::Seq(downward_env()));
    c.set("resources", resources());
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

fn init_container(cfg: &InjectConfig) -> Node {
    trainlet_container(cfg, INIT_CONTAINER, "init", &cfg.init_args)
}

/// The name of the sidecar's metrics port, which the PodMonitor example selects (a
/// port name has at most 15 characters).
pub const METRICS_PORT_NAME: &str = "trainlet";

fn sidecar(cfg: &InjectConfig) -> Node {
    let mut args = cfg.sidecar_args.clone();
    if cfg.wrap.is_some() {
        // One reporter per pod: the sidecar publishes what the wrapped exec observes.
        args.push(format!("--observations={}", cfg.observations_dir));
    }
    if cfg.classic_sidecar {
        args.push("--exit-with-main".into());
    }
    let mut c = trainlet_container(cfg, SIDECAR, "sidecar", &args);
    // Named, so that a Prometheus Operator PodMonitor (which ignores prometheus.io/*
    // annotations) can select it: manifests/monitoring/podmonitor.yaml.
    c.set(
        "ports",
        Node::seq([Node::map([
            ("name", Node::str(METRICS_PORT_NAME)),
            (
                "containerPort",
                Node::Scalar(plain(&cfg.metrics_port.to_string())),
            ),
        ])]),
    );
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
    }
    c
}
