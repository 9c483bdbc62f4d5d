//! The init workflow: find the own pod, wait for the peers, resolve the cluster and the
//! own task, check the own port, write the files, tell the pod.
//!
//! `trainlet init` runs it as the init container; `trainlet exec` runs it in-process
//! when no init container wrote the files. Every failure writes nothing: the kubelet
//! then restarts the init container, and a rerun starts clean.
//!
//! In a large job the agents coordinate ([`Role`], `cluster::published`): task 0 of the
//! first type resolves by watching every peer and publishes the cluster on its own pod;
//! every other agent watches only that pod. The files are the same either way, and
//! `cluster.json` records the pod's part ([`Coordination`](crate::cluster::published::Coordination)) for the reporters, which
//! go on coordinating after the start: the resolver pod's reporter publishes again when
//! a peer is lost or replaced, and the others watch only the resolver pod.

mod announce;
pub mod dns;
mod follow;
mod output;
mod role;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;
use tracing::{info, warn};

use crate::Code;
use crate::cluster::published::ANNOTATION;
use crate::cluster::{AddressMode, Cluster, ClusterConfig, ClusterError, Task};
use crate::event::Event;
use crate::kube::{self as k8s, KubeError};
use crate::peers::follow::FollowError;
use crate::peers::{Scope, WaitError, wait_for_peers};
use crate::publish::Publisher;
use crate::reason::Reason;
use crate::render::frameworks::{FrameworkConfig, FrameworkError};
use crate::render::{self, OutputError, TfConfig};
use follow::{FALLBACK, follow_resolver};
use output::{port_is_free, render_outputs};
pub use role::{COORDINATE_FROM, Coordinate, Role, coordinates, coordination_target, role};

/// Everything `init` needs, validated.
#[derive(Debug, Clone)]
pub struct InitConfig {
    pub kube: k8s::Settings,
    pub cluster: ClusterConfig,
    /// How long to wait for the peers; `None` waits forever.
    pub timeout: Option<Duration>,
    /// Where the files go (an existing directory, usually a shared emptyDir).
    pub output_dir: PathBuf,
    /// Where to install the trainlet binary for the other containers, if anywhere.
    pub install_to: Option<PathBuf>,
    pub coordinate: Coordinate,
    /// The other frameworks' files and what goes into the environment.
    pub frameworks: FrameworkConfig,
    /// A follower accepts no resolution older than this: `exec` resolving again after
    /// a peer change must not take the cluster that change made stale.
    pub min_generation: Option<u64>,
    /// `--preflight`: prove the network to the ring's neighbours before writing.
    pub preflight: bool,
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
    Follow(#[from] FollowError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Framework(#[from] FrameworkError),
    /// `--address dns`: a peer's name does not resolve to its pod IP by the timeout.
    #[error(transparent)]
    Dns(#[from] dns::DnsError),
    /// `--preflight`: a path between the pods is not proven.
    #[error(transparent)]
    Preflight(#[from] crate::preflight::PreflightError),
    /// The own server port is taken in this pod's network namespace.
    #[error("port {0} is already in use in this pod's network namespace")]
    PortConflict(u16),
    /// The binary could not be installed for the other containers.
    #[error("{0}")]
    Install(String),
    /// The resolver could not publish the cluster for the other agents, who would wait
    /// for it until their timeout.
    #[error("cannot publish the cluster for the other agents: {0}")]
    Publish(String),
    /// The resolver's cluster does not fit in its pod's annotations.
    #[error("cannot publish the cluster for the other agents: {0}")]
    TooLarge(String),
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
            InitError::Follow(e) => e.code(),
            InitError::Framework(e) => e.code(),
            InitError::Dns(e) => e.code(),
            InitError::Output(_) | InitError::Install(_) | InitError::InstallDir { .. } => {
                Code::Internal
            }
            InitError::PortConflict(_) => Code::PortConflict,
            InitError::Preflight(crate::preflight::PreflightError::Unreachable(_)) => {
                Code::PeerUnreachable
            }
            InitError::Preflight(crate::preflight::PreflightError::Listen { .. }) => {
                Code::PortConflict
            }
            InitError::Publish(_) => Code::Api,
            // Waiting or retrying changes nothing: the job needs --coordinate never, or
            // fewer annotations of its own on the resolver pod.
            InitError::TooLarge(_) => Code::Usage,
        }
    }
}

/// What `init` produced; `exec` uses it to start the command.
pub struct Outcome {
    pub tf_config: TfConfig,
    /// What `trainlet.env` holds: CMD's environment under `trainlet exec`.
    pub env: Vec<(String, String)>,
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
    let started = std::time::Instant::now();
    // A run killed between creating and renaming a file left it behind.
    for dir in std::iter::once(&cfg.output_dir).chain(&cfg.install_to) {
        for f in render::remove_leftovers(dir) {
            info!("removed {}, left by an earlier run", f.display());
        }
    }
    let (client, id, own) = k8s::connect_own_pod(&cfg.kube).await?;
    if cfg.cluster.task_override.is_none() {
        cfg.cluster.resolver.check_own_pod(&own.metadata)?;
    }
    let this = Session {
        cfg,
        publisher: Publisher::new(client.clone(), &own, "trainlet-init"),
        scope: Scope::of(&cfg.cluster.namespaces, &id.namespace),
        own_uid: own.metadata.uid.clone().unwrap_or_default(),
        client,
        id,
        own,
        started,
        describe: &describe,
    };
    let role = this.role();
    info!(pod = %this.id.pod_name, namespace = %this.id.namespace, role = ?role, "waiting for peers");
    let found = this.resolve(&role).await?;
    this.wait_for_dns(&found).await?;
    let tf = TfConfig::new(
        &found.cluster,
        found.task.clone(),
        cfg.cluster.environment.clone(),
    );
    let plan = this.plan(&role, &found).await?;
    let outputs = render_outputs(
        cfg,
        &tf,
        &found.cluster,
        &this.own,
        found.waited,
        plan.coordination,
    )?;
    this.check_ports(&outputs.listen_ports(&tf)).await?;
    this.preflight(&found).await?;
    let env = outputs.write(cfg)?;
    let (task, cluster) = (&found.task, &found.cluster);
    info!(task = %format!("{}/{}", task.task_type, task.index), cluster = %cluster.summary(), waited = ?found.waited, "wrote {}", cfg.output_dir.join(render::TF_CONFIG_FILE).display());
    this.announce(&plan.annotation).await?;
    let note = format!(
        "{}/{} of {} after {:.1}s",
        task.task_type,
        task.index,
        cluster.summary(),
        found.waited.as_secs_f64()
    );
    best_effort(
        this.publisher
            .event(&Event::normal(Reason::PeersResolved, note))
            .await,
        "emit the PeersResolved event",
    );
    Ok(Outcome { tf_config: tf, env })
}

/// One run of init, connected: what every step needs.
struct Session<'a> {
    cfg: &'a InitConfig,
    client: kube::Client,
    id: k8s::Identity,
    own: Pod,
    own_uid: String,
    publisher: Publisher,
    scope: Scope,
    /// When init started: `--timeout` bounds the pre-flight from here.
    started: std::time::Instant,
    describe: &'a dyn Fn(&InitError) -> String,
}

/// The cluster and the own task, and where they came from.
struct Found {
    cluster: Cluster,
    task: Task,
    waited: Duration,
    /// The generation of the resolution the files come from (a follower's), or that
    /// they are newer than (a follower that fell back to watching every peer).
    followed: Option<u64>,
}

impl Session<'_> {
    /// This agent's part while it waits. The resolver's selector is namespaced, and an
    /// explicit task is the user's; elastic jobs resolve with whoever is ready: each
    /// agent decides for itself.
    fn role(&self) -> Role {
        if self.decides_alone() {
            Role::Alone
        } else {
            role(self.cfg.coordinate, &self.cfg.cluster, &self.own)
        }
    }

    fn decides_alone(&self) -> bool {
        !matches!(self.scope, Scope::Namespace(_))
            || self.cfg.cluster.task_override.is_some()
            || self.cfg.frameworks.elastic.is_some()
    }

    /// Tells the pod why the wait ended, and hands the error on.
    async fn timed_out(&self, e: InitError) -> InitError {
        self.told(Reason::PeerWaitTimeout, e).await
    }

    /// A Warning Event of `reason` on the pod, with the message the process ends with;
    /// hands the error on.
    async fn told(&self, reason: Reason, e: InitError) -> InitError {
        best_effort(
            self.publisher
                .event(&Event::warning(reason, (self.describe)(&e)))
                .await,
            &format!("emit the {reason} event"),
        );
        e
    }

    /// Follows the resolver pod, or watches every peer: a follower whose resolver
    /// stays behind falls back to the latter after [`FALLBACK`].
    async fn resolve(&self, role: &Role) -> Result<Found, InitError> {
        let Role::Follower { selector } = role else {
            return self.watch_every_peer().await;
        };
        let start = std::time::Instant::now();
        match follow_resolver(self.cfg, &self.client, &self.id, &self.own, selector).await {
            Ok(r) => Ok(Found {
                cluster: r.cluster,
                task: r.task,
                waited: r.waited,
                followed: Some(r.generation),
            }),
            Err((e @ InitError::Follow(FollowError::Timeout { .. }), _)) => {
                Err(self.timed_out(e).await)
            }
            Err((InitError::Follow(FollowError::Behind { why }), seen)) => {
                warn!(
                    "{why} for {}; resolving by watching every peer instead",
                    humantime::format_duration(FALLBACK)
                );
                let found = self.watch_every_peer().await?;
                Ok(Found {
                    waited: start.elapsed(),
                    followed: Some((seen + 1).max(self.cfg.min_generation.unwrap_or(0))),
                    ..found
                })
            }
            Err((e, _)) => Err(e),
        }
    }

    async fn watch_every_peer(&self) -> Result<Found, InitError> {
        let cfg = self.cfg;
        let resolved = match wait_for_peers(
            &self.client,
            &self.scope,
            &cfg.cluster.resolver,
            cfg.cluster.expected.clone(),
            cfg.frameworks
                .elastic
                .map(|e| (e.min, self.own_uid.as_str())),
            cfg.timeout,
        )
        .await
        {
            Ok(r) => r,
            Err(e @ WaitError::Timeout { .. }) => return Err(self.timed_out(e.into()).await),
            Err(e) => return Err(e.into()),
        };
        let task = cfg.cluster.resolver.own_task(
            &resolved.cluster,
            &self.own_uid,
            &self.id.pod_name,
            cfg.cluster.task_override.clone(),
        )?;
        Ok(Found {
            cluster: resolved.cluster,
            task,
            waited: resolved.waited,
            followed: None,
        })
    }

    /// With `--address dns`, the files name peers by names that cluster DNS may not
    /// serve yet: waits until each resolves to its pod's IP, within what is left of
    /// `--timeout`.
    async fn wait_for_dns(&self, found: &Found) -> Result<(), InitError> {
        if self.cfg.cluster.resolver.address != AddressMode::Dns {
            return Ok(());
        }
        let own_ip = self.own.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        let wants = dns::wants(&found.cluster, own_ip.map(|ip| (self.own_uid.as_str(), ip)));
        let now = std::time::Instant::now();
        let start = now.checked_sub(found.waited).unwrap_or(now);
        match dns::wait_until_resolved(&wants, start, self.cfg.timeout).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.timed_out(e.into()).await),
        }
    }

    /// The ports the training process will listen on must be free in this pod's
    /// network namespace: each chosen framework's (TensorFlow's server port, PyTorch's
    /// MASTER_PORT on rank 0, JAX's coordinator port on process 0), not TensorFlow's
    /// for every job. With hostNetwork they often are not, and the framework would
    /// fail much later with a confusing "Address already in use".
    async fn check_ports(&self, ports: &[u16]) -> Result<(), InitError> {
        let mut taken = None;
        for &port in ports {
            if !port_is_free(port).await {
                taken = Some(port);
                break;
            }
        }
        let Some(port) = taken else {
            return Ok(());
        };
        Err(self
            .told(Reason::PortConflict, InitError::PortConflict(port))
            .await)
    }

    /// `--preflight`: proves the ring around the own task within what is left of
    /// `--timeout` since init started, a hard deadline whatever the peers do; on failure
    /// a `PeerUnreachable` Event names the peers.
    async fn preflight(&self, found: &Found) -> Result<(), InitError> {
        if !self.cfg.preflight {
            return Ok(());
        }
        let own = format!("{}/{}", found.task.task_type, found.task.index);
        let Some(ring) = crate::preflight::ring::ring(&found.cluster, &own) else {
            return Ok(());
        };
        let within = self.cfg.timeout.map_or(PREFLIGHT_WITHOUT_TIMEOUT, |t| {
            t.saturating_sub(self.started.elapsed())
        });
        let namespace = self.id.namespace.clone();
        let client = self.client.clone();
        let past_init = async |pod: &str| {
            let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &namespace);
            api.get_opt(pod).await.ok().flatten().is_none_or(|p| {
                matches!(
                    p.status.and_then(|s| s.phase).as_deref(),
                    Some("Running" | "Succeeded" | "Failed")
                )
            })
        };
        // The pod's own IP; unspecified (every address) where the pod has none yet.
        let bind = self
            .own
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok())
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        match crate::preflight::prove(&ring, &own, bind, within, past_init).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.told(Reason::PeerUnreachable, e.into()).await),
        }
    }

    /// What the pod's annotations and `cluster.json` will say of this agent's part. After
    /// the start the job's reporters coordinate as init did: a job known to be large now
    /// that it is resolved coordinates, even where this agent could not tell before it
    /// waited.
    async fn plan(&self, role: &Role, found: &Found) -> Result<announce::Plan, InitError> {
        let cfg = self.cfg;
        let peers: usize = found.cluster.tasks.values().map(Vec::len).sum();
        let target = match role {
            Role::Alone if !self.decides_alone() => {
                coordination_target(cfg.coordinate, &cfg.cluster, &self.own)
            }
            Role::Alone => None,
            r => Some(r.clone()),
        }
        .filter(|_| coordinates(cfg.coordinate, peers));
        let plan = announce::plan(
            target.as_ref(),
            &cfg.cluster.resolver,
            &self.own,
            &self.id.namespace,
            found,
        );
        if let Err(e) = &plan {
            let note = (self.describe)(e);
            warn!("{note}");
            best_effort(
                self.publisher
                    .event(&Event::warning(Reason::ClusterTooLarge, note))
                    .await,
                "emit the ClusterTooLarge event",
            );
        }
        plan
    }

    /// Annotates the own pod with its task and, on the resolver, the cluster.
    async fn announce(
        &self,
        annotation: &BTreeMap<String, Option<String>>,
    ) -> Result<(), InitError> {
        if !annotation.contains_key(ANNOTATION) {
            best_effort(
                self.publisher.annotate(annotation).await,
                "annotate the pod with its task",
            );
            return Ok(());
        }
        let r = announce::publish(&self.publisher, annotation).await;
        if let Err(e) = &r {
            best_effort(
                self.publisher
                    .event(&Event::warning(
                        Reason::ClusterNotPublished,
                        (self.describe)(e),
                    ))
                    .await,
                "emit the ClusterNotPublished event",
            );
        }
        r
    }
}

/// The pre-flight's bound where `--timeout` is 0 (wait forever for the peers): the
/// pods that waited together reach each other in seconds, or not at all.
const PREFLIGHT_WITHOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// Reporting to the pod is secondary to the files: log, and carry on.
fn best_effort<E: std::fmt::Display>(r: Result<(), E>, what: &str) {
    if let Err(e) = r {
        warn!("could not {what}: {e}");
    }
}
