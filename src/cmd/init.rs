//! `trainlet init`: the init container. Find the own pod, wait for the peers, resolve
//! the cluster and the own task, check the own port, write the files, tell the pod.
//!
//! Every failure exits with its own code and writes nothing: the kubelet then restarts
//! the init container, and a rerun starts clean.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use tracing::{info, warn};

use super::ClusterConfig;
use crate::cli::{KubeArgs, OutputArgs, parse_duration};
use crate::cluster::{Cluster, Task};
use crate::kube::{Identity, get_own_pod};
use crate::publish::{Publisher, keys};
use crate::tfconfig::{self, TfConfig};
use crate::wait::{WaitError, wait_for_peers};
use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub cluster: crate::cli::ClusterArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The validated flags of `init`.
#[derive(Debug, Clone)]
pub struct InitConfig {
    pub cluster: ClusterConfig,
    pub timeout: Option<Duration>,
    pub output_dir: PathBuf,
    pub install_to: Option<PathBuf>,
}

impl InitConfig {
    /// Validates flags, and that the output directories exist (a missing volume mount
    /// is the most common misconfiguration, and it is better caught before the wait).
    pub fn from_args(a: &InitArgs) -> Result<Self, Failure> {
        let cluster = ClusterConfig::from_args(&a.cluster)?;
        let timeout = parse_duration("--timeout", &a.output.timeout)?;
        let dir = &a.output.output_dir;
        if !dir.is_dir() {
            return Err(Failure::usage(format!(
                "invalid --output-dir {}: not a directory (mount a shared emptyDir there)",
                dir.display()
            )));
        }
        // --install-to may name a directory to create, but inside an existing volume.
        if let Some(to) = &a.output.install_to {
            let parent_ok = to
                .parent()
                .is_none_or(|p| p.as_os_str().is_empty() || p.is_dir());
            if !to.is_dir() && !parent_ok {
                return Err(Failure::usage(format!(
                    "invalid --install-to {}: neither it nor its parent is a directory (mount a shared emptyDir there)",
                    to.display()
                )));
            }
        }
        Ok(InitConfig {
            cluster,
            timeout: (!timeout.is_zero()).then_some(timeout),
            output_dir: a.output.output_dir.clone(),
            install_to: a.output.install_to.clone(),
        })
    }
}

pub fn run(args: InitArgs) -> Result<Code, Failure> {
    let cfg = InitConfig::from_args(&args)?;
    super::runtime()?.block_on(init(&args, &cfg))?;
    Ok(Code::Ok)
}

/// What `init` produced; `exec` uses it to start the command.
pub struct Outcome {
    pub tf_config: TfConfig,
    pub tf_config_json: String,
}

/// The whole init sequence. Shared with `trainlet exec`, which runs it when no
/// tf_config.json exists yet.
pub async fn init(args: &InitArgs, cfg: &InitConfig) -> Result<Outcome, Failure> {
    let (client, id, own) = own_pod(&args.kube).await?;
    let own_uid = own.metadata.uid.clone().unwrap_or_default();
    let resolver = &cfg.cluster.resolver;
    if cfg.cluster.task_override.is_none() {
        resolver.check_own_pod(&own)?;
    }
    let publisher = Publisher::new(client.clone(), &own);
    let scope = super::scope(&args.cluster, &id.namespace);
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
            let failure = Failure::from(e);
            best_effort(
                publisher
                    .event(true, "PeerWaitTimeout", &failure.message)
                    .await,
                "emit the PeerWaitTimeout event",
            );
            return Err(failure);
        }
        Err(e) => return Err(e.into()),
    };
    let task = resolver.own_task(
        &resolved.cluster,
        &own_uid,
        &id.pod_name,
        cfg.cluster.task_override.clone(),
    )?;

    // The own server port must be free in this pod's network namespace; with
    // hostNetwork it often is not, and TensorFlow would fail much later with a
    // confusing "Address already in use".
    let port = own_port(&resolved.cluster, &task);
    if let Err(msg) = check_port_free(port).await {
        best_effort(
            publisher.event(true, "PortConflict", &msg).await,
            "emit the PortConflict event",
        );
        return Err(Failure::new(Code::PortConflict, msg));
    }

    let tf = TfConfig::new(
        &resolved.cluster,
        task.clone(),
        cfg.cluster.environment.clone(),
    );
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

fn own_port(cluster: &Cluster, task: &Task) -> u16 {
    cluster
        .task(&task.task_type, task.index)
        .and_then(|p| p.address.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(8470)
}

/// Bind-tests the port on all addresses. A real listener holds the port for good; a
/// failed bind is retried briefly so that another process's own momentary bind test
/// is not mistaken for a conflict.
async fn check_port_free(port: u16) -> Result<(), String> {
    for attempt in 0..4 {
        match TcpListener::bind(("0.0.0.0", port)) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if attempt < 3 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Err(e) => {
                warn!(port, "cannot bind-test the port: {e}; assuming it is free");
                return Ok(());
            }
        }
    }
    Err(format!(
        "port {port} is already in use in this pod's network namespace"
    ))
}

fn write_outputs(
    cfg: &InitConfig,
    tf: &TfConfig,
    cluster: &Cluster,
    waited: Duration,
) -> Result<(), Failure> {
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
fn install_binary(dir: &Path) -> Result<(), Failure> {
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            Code::Internal,
            format!("cannot find the trainlet binary to install: {e}"),
        )
    })?;
    std::fs::create_dir_all(dir).map_err(|e| {
        Failure::new(
            Code::Internal,
            format!("cannot create --install-to {}: {e}", dir.display()),
        )
    })?;
    let bytes = std::fs::read(&exe).map_err(|e| {
        Failure::new(
            Code::Internal,
            format!("cannot read {}: {e}", exe.display()),
        )
    })?;
    tfconfig::write_atomic(dir, "trainlet", &bytes)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("trainlet"), std::fs::Permissions::from_mode(0o755))
        .map_err(|e| {
            Failure::new(
                Code::Internal,
                format!("cannot make {}/trainlet executable: {e}", dir.display()),
            )
        })?;
    Ok(())
}

/// The client, this pod's identity, and the pre-flight GET of the own pod.
pub(crate) async fn own_pod(args: &KubeArgs) -> Result<(Client, Identity, Pod), Failure> {
    let (client, default_ns) = crate::kube::client(args.kubeconfig.as_deref()).await?;
    let id = Identity {
        pod_name: crate::kube::pod_name(args).ok_or(crate::kube::KubeError::NoPodName)?,
        namespace: crate::kube::pod_namespace(args, &default_ns),
    };
    let pod = get_own_pod(&client, &id).await?;
    Ok((client, id, pod))
}
