//! What init leaves behind: the own port checked free, every file rendered before any
//! is written, the binary installed for the training container.

use std::path::Path;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use super::{InitConfig, InitError};
use crate::cluster::Cluster;
use crate::cluster::published::Coordination;
use crate::render::frameworks::{self, PodFacts, Ranks};
use crate::render::{self, TfConfig};

/// Bind-tests the port on all addresses. A real listener holds the port for good; a
/// failed bind is retried briefly so that another process's own momentary bind test
/// is not mistaken for a conflict.
pub(super) async fn port_is_free(port: u16) -> bool {
    for attempt in 0..4 {
        // Bound, never listening: a listener, for the moment it lives, completes the
        // connections of peers that try the port (a peer's pre-flight would take it
        // for this pod's trainlet-init). SO_REUSEADDR as a server sets it, so that
        // connections of an earlier run in TIME_WAIT are no conflict.
        let bound = tokio::net::TcpSocket::new_v4().and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind((std::net::Ipv4Addr::UNSPECIFIED, port).into())
        });
        match bound {
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

/// Renders everything before it writes anything, so that a framework error leaves no
/// file behind; returns the environment of `trainlet.env`.
pub(super) fn render_outputs(
    cfg: &InitConfig,
    tf: &TfConfig,
    cluster: &Cluster,
    own: &Pod,
    waited: Duration,
    coordination: Option<Coordination>,
) -> Result<Outputs, InitError> {
    let order: Vec<&str> = cfg
        .cluster
        .resolver
        .jobs
        .iter()
        .map(|j| j.task_type.as_str())
        .collect();
    let ranks = Ranks::new(cluster, &order, &tf.task);
    let facts = pod_facts(own, &ranks);
    let rendered = frameworks::render(
        &ranks,
        cluster,
        &order,
        &tf.task,
        &cfg.frameworks,
        &facts,
        render::tf_env(tf),
    )?;
    let now = crate::time::rfc3339_millis(SystemTime::now());
    let meta = render::ClusterMeta {
        rpc_layer: cfg.cluster.rpc_layer.clone(),
        selectors: cfg
            .cluster
            .resolver
            .jobs
            .iter()
            .map(|j| {
                let sels = j.selectors.iter().map(ToString::to_string).collect();
                (j.task_type.clone(), sels)
            })
            .collect(),
        resolved_at: now,
        waited_seconds: waited.as_secs_f64(),
        coordination,
    };
    Ok(Outputs {
        cluster_json: render::render_cluster_file(tf, cluster, &ranks, &meta),
        tf_config: format!("{}\n", tf.render()),
        rendered,
    })
}

/// Every file init writes, rendered and not yet written: the ports the training
/// process will listen on are checked first ([`Outputs::listen_ports`]), so that a
/// conflict leaves nothing half written.
pub(super) struct Outputs {
    rendered: frameworks::Rendered,
    cluster_json: String,
    tf_config: String,
}

impl Outputs {
    /// The ports this task's process is about to listen on: each chosen framework's
    /// (a PyTorch job's is MASTER_PORT, not TensorFlow's 8470).
    pub fn listen_ports(&self, tf: &TfConfig) -> Vec<u16> {
        frameworks::listen_ports(&self.rendered.env, tf.own_port())
    }

    /// Installs the binary, then writes the files atomically, TF_CONFIG last; returns
    /// the environment of trainlet.env.
    pub fn write(self, cfg: &InitConfig) -> Result<Vec<(String, String)>, InitError> {
        let dir = &cfg.output_dir;
        if let Some(to) = &cfg.install_to {
            install_binary(to)?;
        }
        for f in &self.rendered.files {
            render::write_atomic(dir, &f.name, f.contents.as_bytes())?;
        }
        render::write_atomic(dir, render::CLUSTER_FILE, self.cluster_json.as_bytes())?;
        render::write_atomic(
            dir,
            render::ENV_FILE,
            render::render_env(&self.rendered.env).as_bytes(),
        )?;
        // Last: its presence tells `trainlet exec` that the set is complete.
        render::write_atomic(dir, render::TF_CONFIG_FILE, self.tf_config.as_bytes())?;
        Ok(self.rendered.env)
    }
}

/// What the frameworks need from the own pod: the training container's GPUs, and a
/// name for this run of the job that every pod agrees on, for torchrun's rendezvous:
/// the controller's uid (the Job of an elastic job's pods), else rank 0's pod uid.
fn pod_facts(own: &Pod, ranks: &Ranks) -> PodFacts {
    let container = crate::report::pod::training_container(own, None);
    let gpus = crate::report::pod::expected_gpus(None, container).map_or(0, |e| e.count);
    let run_id = own
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
        .or_else(|| ranks.zero().map(|p| p.uid.clone()))
        .unwrap_or_default();
    PodFacts { gpus, run_id }
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
    render::write_atomic(dir, render::BINARY_FILE, &bytes)?;
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
