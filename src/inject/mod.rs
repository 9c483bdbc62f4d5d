//! `trainlet inject`: adds trainlet to the pod templates of existing manifests, like
//! `linkerd inject`: `trainlet inject -f job.yaml --job worker=app=mnist | kubectl apply -f -`.
//!
//! For every pod template of a Pod, Job, CronJob, StatefulSet, Deployment or ReplicaSet
//! (also inside a `List`) it adds:
//! - the `trainlet` emptyDir, mounted at --output-dir (read-only in the user's containers);
//! - the `trainlet-init` init container, running `trainlet init` with the init flags
//!   given here and `--install-to <output-dir>/bin`, so the other containers can run
//!   `trainlet exec` without trainlet in their images;
//! - the `trainlet` sidecar: a native sidecar (init container with `restartPolicy:
//!   Always`, Kubernetes 1.29+) or, with --classic-sidecar, a regular container that
//!   exits with the main one;
//! - the downward API env (POD_NAME, POD_NAMESPACE, POD_UID), the ServiceAccount of
//!   manifests/rbac.yaml, and Prometheus scrape annotations;
//! - with --wrap, `trainlet exec --report --` in front of that container's command.
//!
//! Inject is idempotent: what it owns is found again by name and replaced, and a
//! document that comes out unchanged is written back byte for byte. Other kinds and
//! unknown fields pass through. The pure transformation is in [`transform`], the YAML
//! layer (and why it is not a serde round trip) in [`yaml`]; this module is the I/O.

pub mod transform;
pub mod yaml;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use crate::cli::{AddressMode, ClusterArgs, OrderMode, OutputArgs, ReadyMode};
use crate::{Code, Failure};
pub use transform::{InjectConfig, Note, TransformError, inject};

/// The release image of this version of trainlet.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/trainlet/trainlet:", env!("CARGO_PKG_VERSION"));

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "The init flags (--job, --expect, --port, --address, ...) are those \
of `trainlet init` and are passed to the trainlet-init container; flags left at their \
defaults are not written. Output goes to stdout, one note per document to stderr.\n\n\
Example: trainlet inject -f job.yaml --job worker=app=mnist,role=worker --wrap train | kubectl apply -f -"
)]
pub struct InjectArgs {
    /// Kubernetes YAML to read; `-` or absent reads standard input. Several documents
    /// (`---`) and `List`s are handled.
    #[arg(
        short = 'f',
        long = "filename",
        env = "TRAINLET_FILENAME",
        value_name = "FILE"
    )]
    pub filename: Option<PathBuf>,

    /// trainlet's image for the init container and the sidecar. The default is the
    /// release of this binary, so the injected agents match the one that injected them.
    #[arg(long, env = "TRAINLET_IMAGE", value_name = "IMAGE", default_value = DEFAULT_IMAGE)]
    pub image: String,

    /// Run this container's command under `<install-to>/trainlet exec --report --`, so it
    /// gets TF_CONFIG in its environment and its GPUs, ports and OOM kills are reported.
    /// The container must set `command`: inject cannot see an image's ENTRYPOINT.
    #[arg(long, env = "TRAINLET_WRAP", value_name = "CONTAINER")]
    pub wrap: Option<String>,

    /// Add the sidecar as a regular container that exits when the main container does
    /// (`--exit-with-main`), for clusters older than Kubernetes 1.29, which lack native
    /// sidecars (init containers with restartPolicy: Always).
    #[arg(long, env = "TRAINLET_CLASSIC_SIDECAR")]
    pub classic_sidecar: bool,

    /// ServiceAccount for pod templates that set none (or `default`); it must be bound to
    /// trainlet's Role, as manifests/rbac.yaml does for `trainlet`.
    #[arg(
        long,
        env = "TRAINLET_SERVICE_ACCOUNT",
        value_name = "NAME",
        default_value = "trainlet"
    )]
    pub service_account: String,

    #[command(flatten)]
    pub cluster: ClusterArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// Why inject failed, before or after the transformation.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is not UTF-8 text")]
    NotUtf8(String),
    #[error("{input}: {error}")]
    Transform {
        input: String,
        error: TransformError,
    },
    #[error("cannot write to stdout: {0}")]
    Write(std::io::Error),
}

impl From<InjectError> for Failure {
    fn from(e: InjectError) -> Self {
        let code = match e {
            InjectError::Write(_) => Code::Internal,
            _ => Code::Usage,
        };
        Failure::new(code, e.to_string())
    }
}

impl InjectConfig {
    /// Checks the flags (no I/O) and renders the init and sidecar arguments. The init
    /// flags are validated exactly as `trainlet init` will, so a bad selector fails here
    /// and not in every pod of the job.
    pub fn from_args(a: &InjectArgs) -> Result<InjectConfig, Failure> {
        crate::cmd::ClusterConfig::from_args(&a.cluster)?;
        let c = &a.cluster;
        if c.task_type.is_some() || c.task_index.is_some() {
            return Err(Failure::usage(
                "--task-type and --task-index would give every pod of a template the same task; inject leaves the task to each pod's own index",
            ));
        }
        crate::cli::parse_duration("--timeout", &a.output.timeout)?;
        if a.image.trim().is_empty() {
            return Err(Failure::usage(
                "invalid --image \"\": give an image reference",
            ));
        }
        if let Some(w) = &a.wrap
            && w.trim().is_empty()
        {
            return Err(Failure::usage("invalid --wrap \"\": give a container name"));
        }
        let output_dir = path_str("--output-dir", &a.output.output_dir)?;
        if !a.output.output_dir.is_absolute() || output_dir == "/" {
            return Err(Failure::usage(format!(
                "invalid --output-dir {output_dir}: the mount path of the shared volume must be an absolute path below /"
            )));
        }
        let install_to = match &a.output.install_to {
            None => format!("{output_dir}/bin"),
            Some(p) => {
                let s = path_str("--install-to", p)?;
                if !p.starts_with(&a.output.output_dir) || p == &a.output.output_dir {
                    return Err(Failure::usage(format!(
                        "invalid --install-to {s}: it must be a directory inside --output-dir {output_dir}, the only volume inject adds"
                    )));
                }
                s
            }
        };

        let mut init = Vec::new();
        for j in &c.jobs {
            init.push(format!("--job={j}"));
        }
        if let Some(m) = &c.job_to_label_mapping {
            init.push(format!("--job-to-label-mapping={m}"));
        }
        if !c.expect.is_empty() {
            init.push(format!("--expect={}", c.expect.join(",")));
        }
        if let Some(ns) = &c.namespace {
            init.push(format!("--namespace={ns}"));
        }
        if c.all_namespaces {
            init.push("--all-namespaces".into());
        }
        if c.port != 8470 {
            init.push(format!("--port={}", c.port));
        }
        if let Some(p) = &c.port_name {
            init.push(format!("--port-name={p}"));
        }
        if c.address != AddressMode::PodIp {
            init.push(format!("--address={}", value_name(c.address)));
        }
        if c.cluster_domain != "cluster.local" {
            init.push(format!("--cluster-domain={}", c.cluster_domain));
        }
        if c.order != OrderMode::Index {
            init.push(format!("--order={}", value_name(c.order)));
        }
        if c.ready != ReadyMode::Running {
            init.push(format!("--ready={}", value_name(c.ready)));
        }
        if c.rpc_layer != "grpc" {
            init.push(format!("--rpc-layer={}", c.rpc_layer));
        }
        if let Some(e) = &c.environment {
            init.push(format!("--environment={e}"));
        }
        if output_dir != transform::DEFAULT_OUTPUT_DIR {
            init.push(format!("--output-dir={output_dir}"));
        }
        init.push(format!("--install-to={install_to}"));
        if a.output.timeout != "10m" {
            init.push(format!("--timeout={}", a.output.timeout));
        }

        Ok(InjectConfig {
            image: a.image.trim().to_string(),
            init_args: init,
            sidecar_args: vec![format!("--port={}", c.port)],
            output_dir,
            install_to,
            classic_sidecar: a.classic_sidecar,
            wrap: a.wrap.clone(),
            service_account: a.service_account.clone(),
        })
    }
}

fn value_name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

fn path_str(flag: &str, p: &Path) -> Result<String, Failure> {
    let s = p
        .to_str()
        .ok_or_else(|| Failure::usage(format!("invalid {flag}: not UTF-8")))?;
    Ok(s.trim_end_matches('/').to_string())
}

pub fn run(args: InjectArgs) -> Result<Code, Failure> {
    let cfg = InjectConfig::from_args(&args)?;
    let (source, text) = read_input(args.filename.as_deref())?;
    let out = inject(&text, &cfg).map_err(|error| InjectError::Transform {
        input: source.clone(),
        error,
    })?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.yaml.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(InjectError::Write)?;
    let mut stderr = std::io::stderr().lock();
    for n in &out.notes {
        let _ = writeln!(stderr, "trainlet: note: {source}: {n}");
    }
    Ok(Code::Ok)
}

/// The input and the name to use for it in messages.
fn read_input(path: Option<&Path>) -> Result<(String, String), InjectError> {
    let (name, bytes) = match path {
        None => read_stdin()?,
        Some(p) if p == Path::new("-") => read_stdin()?,
        Some(p) => {
            let name = p.display().to_string();
            let bytes = std::fs::read(p).map_err(|source| InjectError::Read {
                path: name.clone(),
                source,
            })?;
            (name, bytes)
        }
    };
    let text = String::from_utf8(bytes).map_err(|_| InjectError::NotUtf8(name.clone()))?;
    Ok((name, text))
}

fn read_stdin() -> Result<(String, Vec<u8>), InjectError> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .map_err(|source| InjectError::Read {
            path: "stdin".into(),
            source,
        })?;
    Ok(("stdin".into(), bytes))
}

#[cfg(test)]
mod tests;
