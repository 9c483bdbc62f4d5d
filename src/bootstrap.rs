//! The init workflow: find the own pod, wait for the peers, resolve the cluster and the
//! own task, check the own port, write the files, tell the pod.
//!
//! `trainlet init` runs it as the init container; `trainlet exec` runs it in-process
//! when no init container wrote the files. Every failure writes nothing: the kubelet
//! then restarts the init container, and a rerun starts clean.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use thiserror::Error;
use tracing::{info, warn};

use crate::Code;
use crate::cluster::{Cluster, ClusterConfig, ClusterError};
use crate::kube::{self, KubeError};
use crate::peers::{Scope, WaitError, wait_for_peers};
use crate::publish::{Publisher, keys};
use crate::tfconfig::{self, OutputError, TfConfig};

/// Everything `init` needs, validated.
#[derive(Debug, Clone)]
pub struct InitConfig {
    pub kube: kube::Settings,
    pub cluster: ClusterConfig,
    /// How long to wait for the peers; `None` waits forever.
    pub timeout: Option<Duration>,
    /// Where the files go (an existing directory, usually a shared emptyDir).
    pub output_dir: PathBuf,
    /// Where to install the trainlet binary for the other containers, if anywhere.
    pub install_to: Option<PathBuf>,
}

#[derive(Debug, Error)]
pub enum InitError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Wait(#[from] WaitError),
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The own server port is taken in this pod's network namespace.
    #[error("port {0} is already in use in this pod's network namespace")]
    PortConflict(u16),
    /// The binary could not be installed for the other containers.
    #[error("{0}")]
    Install(String),
    /// The install directory could not be created.
    #[error("cannot create the install directory {dir}: {why}")]
    InstallDir { dir: PathBuf, why: String },
}

impl InitError {
    pub fn code(&self) -> Code {
        match self {
            InitError::Kube(e) => e.code(),
            InitError::Cluster(e) => e.code(),
            InitError::Wait(e) => e.code(),
            InitError::Output(_) | InitError::Install(_) | InitError::InstallDir { .. } => {
                Code::Internal
            }
            InitError::PortConflict(_) => Code::PortConflict,
        }
    }
}

/// What `init` produced; `exec` uses it to start the command.
pub struct Outcome {
    pub tf_config: TfConfig,
    pub tf_config_json: String,
}

/// The whole init sequence.
///
/// `describe` turns an error into the message the user reads: the PeerWaitTimeout and
/// PortConflict Events carry the same text as the process's last line, and only the
/// caller knows how to word it (the flags that fix it are the CLI's).
pub async fn run(
    cfg: &InitConfig,
    describe: impl Fn(&InitError) -> String,
) -> Result<Outcome, InitError> {
    // A run killed between creating and renaming a file left it behind.
    for dir in std::iter::once(&cfg.output_dir).chain(&cfg.install_to) {
        for f in tfconfig::remove_leftovers(dir) {
            info!("removed {}, left by an earlier run", f.display());
        }
    }
    let (client, id, own) = kube::connect_own_pod(&cfg.kube).await?;
    let own_uid = own.metadata.uid.clone().unwrap_or_default();
    let resolver = &cfg.cluster.resolver;
    if cfg.cluster.task_override.is_none() {
        resolver.check_own_pod(&own)?;
    }
    let publisher = Publisher::new(client.clone(), &own);
    let scope = Scope::of(&cfg.cluster.namespaces, &id.namespace);
    info!(pod = %id.pod_name, namespace = %id.namespace, "waiting for peers");

    let resolved = match wait_for_peers(
        &client,
        &scope,
        resolver,
        cfg.cluster.expected.clone(),
        cfg.timeout,
    )
    .await
    {
        Ok(r) => r,
        Err(e @ WaitError::Timeout { .. }) => {
            let e = InitError::from(e);
            best_effort(
                publisher
                    .event(true, "PeerWaitTimeout", &describe(&e))
                    .await,
                "emit the PeerWaitTimeout event",
            );
            return Err(e);
        }
        Err(e) => return Err(e.into()),
    };
    let task = resolver.own_task(
        &resolved.cluster,
        &own_uid,
        &id.pod_name,
        cfg.cluster.task_override.clone(),
    )?;
    let tf = TfConfig::new(
        &resolved.cluster,
        task.clone(),
        cfg.cluster.environment.clone(),
    );

    // The own server port must be free in this pod's network namespace; with
    // hostNetwork it often is not, and TensorFlow would fail much later with a
    // confusing "Address already in use".
    let port = tf.own_port().unwrap_or(resolver.port);
    if !port_is_free(port).await {
        let e = InitError::PortConflict(port);
        best_effort(
            publisher.event(true, "PortConflict", &describe(&e)).await,
            "emit the PortConflict event",
        );
        return Err(e);
    }

    let tf_json = tf.render();
    write_outputs(cfg, &tf, &resolved.cluster, resolved.waited)?;
    info!(task = %format!("{}/{}", task.task_type, task.index), cluster = %resolved.cluster.summary(), waited = ?resolved.waited, "wrote {}", cfg.output_dir.join(tfconfig::TF_CONFIG_FILE).display());

    let annotation = BTreeMap::from([(
        keys::TASK.to_string(),
        Some(format!("{}/{}", task.task_type, task.index)),
    )]);
    best_effort(
        publisher.annotate(&annotation).await,
        "annotate the pod with its task",
    );
    let note = format!(
        "{}/{} of {} after {:.1}s",
        task.task_type,
        task.index,
        resolved.cluster.summary(),
        resolved.waited.as_secs_f64()
    );
    best_effort(
        publisher.event(false, "PeersResolved", &note).await,
        "emit the PeersResolved event",
    );
    Ok(Outcome {
        tf_config: tf,
        tf_config_json: tf_json,
    })
}

/// Reporting to the pod is secondary to the files: log, and carry on.
fn best_effort<E: std::fmt::Display>(r: Result<(), E>, what: &str) {
    if let Err(e) = r {
        warn!("could not {what}: {e}");
    }
}

/// Bind-tests the port on all addresses. A real listener holds the port for good; a
/// failed bind is retried briefly so that another process's own momentary bind test
/// is not mistaken for a conflict.
async fn port_is_free(port: u16) -> bool {
    for attempt in 0..4 {
        match TcpListener::bind(("0.0.0.0", port)) {
            Ok(_) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if attempt < 3 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Err(e) => {
                warn!(port, "cannot bind-test the port: {e}; assuming it is free");
                return true;
            }
        }
    }
    false
}

fn write_outputs(
    cfg: &InitConfig,
    tf: &TfConfig,
    cluster: &Cluster,
    waited: Duration,
) -> Result<(), InitError> {
    let dir = &cfg.output_dir;
    if let Some(to) = &cfg.install_to {
        install_binary(to)?;
    }
    let now = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    let cluster_json = tfconfig::render_cluster_file(
        tf,
        cluster,
        &cfg.cluster.rpc_layer,
        &now,
        waited.as_secs_f64(),
    );
    tfconfig::write_atomic(dir, tfconfig::CLUSTER_FILE, cluster_json.as_bytes())?;
    tfconfig::write_atomic(dir, tfconfig::ENV_FILE, tfconfig::render_env(tf).as_bytes())?;
    // Last: its presence tells `trainlet exec` that the set is complete.
    tfconfig::write_atomic(
        dir,
        tfconfig::TF_CONFIG_FILE,
        format!("{}\n", tf.render()).as_bytes(),
    )?;
    Ok(())
}

/// Copies the running binary to `dir/trainlet`, executable, atomically.
fn install_binary(dir: &Path) -> Result<(), InitError> {
    let exe = std::env::current_exe().map_err(|e| {
        InitError::Install(format!("cannot find the trainlet binary to install: {e}"))
    })?;
    std::fs::create_dir_all(dir).map_err(|e| InitError::InstallDir {
        dir: dir.to_path_buf(),
        why: e.to_string(),
    })?;
    let bytes = std::fs::read(&exe)
        .map_err(|e| InitError::Install(format!("cannot read {}: {e}", exe.display())))?;
    tfconfig::write_atomic(dir, tfconfig::BINARY_FILE, &bytes)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("trainlet"), std::fs::Permissions::from_mode(0o755))
        .map_err(|e| {
            InitError::Install(format!(
                "cannot make {}/trainlet executable: {e}",
                dir.display()
            ))
        })?;
    Ok(())
}
