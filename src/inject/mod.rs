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
//! Inject is idempotent: what it owns is found again by its shape (never by its name
//! alone; a user's object under one of trainlet's names is refused or kept, see
//! docs/inject.md) and replaced, and a document that comes out unchanged is written
//! back byte for byte. A second inject with other flags applies them and notes what
//! of the first it drops. Other kinds and
//! unknown fields pass through. The pure transformation is in [`transform`], the YAML
//! layer (and why it is not a serde round trip) in [`yaml`]; this module is the I/O.

pub mod quantity;
pub mod transform;
pub mod yaml;

use std::io::{Read, Write};
use std::path::Path;

use crate::Code;
pub use transform::{Infer, InjectConfig, Note, Resources, TransformError, inject};

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

impl InjectError {
    pub fn code(&self) -> Code {
        match self {
            InjectError::Write(_) => Code::Internal,
            _ => Code::Usage,
        }
    }
}

/// Reads the manifests (a file, or stdin for `-` or `None`), injects, and writes the
/// result to stdout and one note per document to stderr.
pub fn run(cfg: &InjectConfig, filename: Option<&Path>) -> Result<(), InjectError> {
    let (source, text) = read_input(filename)?;
    let out = inject(&text, cfg).map_err(|error| InjectError::Transform {
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
    Ok(())
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
