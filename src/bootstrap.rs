//! The init workflow: find the own pod, wait for the peers, resolve the cluster and the
//! own task, check the own port, write the files, tell the pod.
//!
//! `trainlet init` runs it as the init container; `trainlet exec` runs it in-process
//! when no init container wrote the files. Every failure writes nothing: the kubelet
//! then restarts the init container, and a rerun starts clean.
//!
//! In a large job the agents coordinate ([`Role`], `cluster::published`): task 0 of the
//! first type resolves by watching every peer and publishes the cluster on its own pod;
//! every other agent watches only that pod. The files are the same either way.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use thiserror::Error;
use tracing::{info, warn};

use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};

use crate::Code;
use crate::cluster::published::{self, ANNOTATION};
use crate::cluster::{Cluster, ClusterConfig, ClusterError, PeerPod, Task, order};
use crate::frameworks::{self, FrameworkConfig, FrameworkError, PodFacts, Ranks};
use crate::kube::{self as k8s, Identity, KubeError};
use crate::peers::coordinated::{FollowError, Verdict, follow};
use crate::peers::{Scope, WaitError, wait_for_peers};
use crate::publish::{Publisher, keys};
use crate::tfconfig::{self, OutputError, TfConfig};

/// Whether the agents of a job coordinate (see the module header). Derives
/// `clap::ValueEnum` so the CLI can offer it as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Coordinate {
    /// From [`COORDINATE_FROM`] pods on, as far as this agent can tell.
    Auto,
    Always,
    Never,
}

/// `auto` coordinates jobs of at least this many pods (README, Scaling). At 256 pods
/// every agent watching every peer still finished sooner on the bench (p99 0.4–0.7 s
/// against 0.9–2.1 s coordinated: the followers wait for one more hop) at about
/// 400 MiB of API-server egress per job; at 512 it sent 1.7–2 GiB and took 3.6–13 s,
/// where coordinated took 2–3 s. The threshold sits between the two.
pub const COORDINATE_FROM: usize = 384;

/// This agent's part in its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Watches every peer itself.
    Alone,
    /// Task 0 of the first type: watches every peer, and publishes the cluster when
    /// the job coordinates.
    Resolver,
    /// Watches only the resolver pod, found by `selector`.
    Follower { selector: String },
}

/// Decides the role from what this agent knows before it waits: its own pod, the
/// configuration, and the expected counts. Coordination needs pods that carry their
/// index as a label (Indexed Jobs, StatefulSets, Kubeflow), the index order, and a
/// first type found by one selector, so that `<selector>,<index label>=0` names task 0.
/// `auto` coordinates when `--expect` says the job is large, or this pod's own index
/// does; an agent that cannot tell watches every peer, which gives the same files.
pub fn role(coordinate: Coordinate, cfg: &ClusterConfig, own: &Pod) -> Role {
    let resolver = &cfg.resolver;
    let Some(first) = resolver.jobs.first() else {
        return Role::Alone;
    };
    let (Some((index, key)), [selector]) = (
        order::label_index(&own.metadata),
        first.selectors.as_slice(),
    ) else {
        return Role::Alone;
    };
    if coordinate == Coordinate::Never || resolver.order != crate::cluster::OrderMode::Index {
        return Role::Alone;
    }
    // In a JobSet every Job numbers its pods from 0: task 0 is pod 0 of Job 0 of the
    // replicated job.
    let jobset = order::in_jobset(&own.metadata).then_some(order::jobset::JOB_INDEX);
    let job_index = jobset.and_then(|k| {
        own.metadata
            .labels
            .as_ref()?
            .get(k)?
            .trim()
            .parse::<u64>()
            .ok()
    });
    if jobset.is_some() && job_index.is_none() {
        return Role::Alone;
    }
    if index == 0
        && job_index.unwrap_or(0) == 0
        && resolver.types_of(&own.metadata) == [first.task_type.as_str()]
    {
        return Role::Resolver;
    }
    let known: usize = cfg.expected.values().sum();
    let all_known = resolver
        .jobs
        .iter()
        .all(|j| cfg.expected.contains_key(&j.task_type));
    let large = (all_known && known >= COORDINATE_FROM) || index >= COORDINATE_FROM as u64;
    if coordinate == Coordinate::Always || large {
        let selector = match jobset {
            Some(k) => format!("{selector},{key}=0,{k}=0"),
            None => format!("{selector},{key}=0"),
        };
        Role::Follower { selector }
    } else {
        Role::Alone
    }
}

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
            InitError::Follow(e) => e.code(),
            InitError::Framework(e) => e.code(),
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
    // A run killed between creating and renaming a file left it behind.
    for dir in std::iter::once(&cfg.output_dir).chain(&cfg.install_to) {
        for f in tfconfig::remove_leftovers(dir) {
            info!("removed {}, left by an earlier run", f.display());
        }
    }
    let (client, id, own) = k8s::connect_own_pod(&cfg.kube).await?;
    let own_uid = own.metadata.uid.clone().unwrap_or_default();
    let resolver = &cfg.cluster.resolver;
    if cfg.cluster.task_override.is_none() {
        resolver.check_own_pod(&own.metadata)?;
    }
    let publisher = Publisher::new(client.clone(), &own, "trainlet-init");
    let scope = Scope::of(&cfg.cluster.namespaces, &id.namespace);
    let role = match (&scope, &cfg.cluster.task_override) {
        // The resolver's selector is namespaced, and an explicit task is the user's.
        // Elastic jobs resolve with whoever is ready: each agent decides for itself.
        (Scope::Namespace(_), None) if cfg.frameworks.elastic.is_none() => {
            role(cfg.coordinate, &cfg.cluster, &own)
        }
        _ => Role::Alone,
    };
    info!(pod = %id.pod_name, namespace = %id.namespace, role = ?role, "waiting for peers");

    let timed_out = |e: InitError| async {
        best_effort(
            publisher
                .event(true, "PeerWaitTimeout", &describe(&e))
                .await,
            "emit the PeerWaitTimeout event",
        );
        e
    };
    let (cluster, task, waited) = if let Role::Follower { selector } = &role {
        match follow_resolver(cfg, &client, &id, &own, selector).await {
            Ok(r) => r,
            Err(e @ InitError::Follow(FollowError::Timeout { .. })) => {
                return Err(timed_out(e).await);
            }
            Err(e) => return Err(e),
        }
    } else {
        let resolved = match wait_for_peers(
            &client,
            &scope,
            resolver,
            cfg.cluster.expected.clone(),
            cfg.frameworks.elastic.map(|e| (e.min, own_uid.as_str())),
            cfg.timeout,
        )
        .await
        {
            Ok(r) => r,
            Err(e @ WaitError::Timeout { .. }) => return Err(timed_out(e.into()).await),
            Err(e) => return Err(e.into()),
        };
        let task = resolver.own_task(
            &resolved.cluster,
            &own_uid,
            &id.pod_name,
            cfg.cluster.task_override.clone(),
        )?;
        (resolved.cluster, task, resolved.waited)
    };
    let tf = TfConfig::new(&cluster, task.clone(), cfg.cluster.environment.clone());

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

    let env = write_outputs(cfg, &tf, &cluster, &own, waited)?;
    info!(task = %format!("{}/{}", task.task_type, task.index), cluster = %cluster.summary(), waited = ?waited, "wrote {}", cfg.output_dir.join(tfconfig::TF_CONFIG_FILE).display());

    let mut annotation = BTreeMap::from([(
        keys::TASK.to_string(),
        Some(format!("{}/{}", task.task_type, task.index)),
    )]);
    if role == Role::Resolver {
        // One patch carries the task and, for the followers, the whole cluster.
        let peers: usize = cluster.tasks.values().map(Vec::len).sum();
        if cfg.coordinate == Coordinate::Always || peers >= COORDINATE_FROM {
            let order: Vec<&str> = resolver.jobs.iter().map(|j| j.task_type.as_str()).collect();
            let generation = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            match published::encode(&cluster, &order, generation) {
                Ok(text) => {
                    info!(
                        bytes = text.len(),
                        "publishing the cluster for the other agents"
                    );
                    annotation.insert(ANNOTATION.to_string(), Some(text));
                }
                Err(e) => {
                    let note = format!(
                        "{e}; the other agents cannot read it from this pod (use --coordinate never)"
                    );
                    warn!("{note}");
                    best_effort(
                        publisher.event(true, "ClusterTooLarge", &note).await,
                        "emit the ClusterTooLarge event",
                    );
                }
            }
        }
    }
    if annotation.contains_key(ANNOTATION) {
        // The followers wait for this patch: a passing API error must not strand them.
        // Retried briefly; RBAC or validation errors are not transient and are logged.
        let mut delay = Duration::from_millis(200);
        for attempt in 1..=5 {
            match publisher.annotate(&annotation).await {
                Ok(()) => break,
                Err(crate::publish::PublishError::Kube(e)) if e.is_transient() && attempt < 5 => {
                    warn!("could not publish the cluster ({e}); retrying in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    warn!("could not publish the cluster for the other agents: {e}");
                    break;
                }
            }
        }
    } else {
        best_effort(
            publisher.annotate(&annotation).await,
            "annotate the pod with its task",
        );
    }
    let note = format!(
        "{}/{} of {} after {:.1}s",
        task.task_type,
        task.index,
        cluster.summary(),
        waited.as_secs_f64()
    );
    best_effort(
        publisher.event(false, "PeersResolved", &note).await,
        "emit the PeersResolved event",
    );
    Ok(Outcome { tf_config: tf, env })
}

/// A follower's wait: the resolver pod's published cluster, checked against this pod
/// as the API server reports it now (its address may be newer than the pre-flight GET).
async fn follow_resolver(
    cfg: &InitConfig,
    client: &Client,
    id: &Identity,
    own: &Pod,
    selector: &str,
) -> Result<(Cluster, Task, Duration), InitError> {
    let resolver = &cfg.cluster.resolver;
    let types: Vec<&str> = resolver.jobs.iter().map(|j| j.task_type.as_str()).collect();
    let first = types.first().copied().unwrap_or_default();
    let own_uid = own.uid().unwrap_or_default();
    let own_uid = own_uid.as_str();
    // The own address as the pre-flight GET saw it; asked again only if it differs.
    let mut own_address = resolver.address_of(&PeerPod::from(own))?;
    let start = std::time::Instant::now();
    loop {
        let left = cfg.timeout.map(|t| t.saturating_sub(start.elapsed()));
        let (cluster, _) = follow(client, &id.namespace, first, selector, left, |pod| {
            let Some(text) = pod.annotations().get(ANNOTATION) else {
                return Verdict::Wait("has not published the cluster yet".into());
            };
            let cluster = match published::decode(text, &id.namespace) {
                Ok((c, _)) => c,
                Err(e) => {
                    return Verdict::Wait(format!("carries a cluster trainlet cannot use: {e}"));
                }
            };
            let resolver_uid = pod.uid().unwrap_or_default();
            match published::own_task(
                &cluster,
                &types,
                &cfg.cluster.expected,
                &resolver_uid,
                own_uid,
                None,
            ) {
                Ok(_) => Verdict::Accept(cluster),
                Err(why) => Verdict::Wait(format!("carries a cluster this pod cannot use: {why}")),
            }
        })
        .await
        .map_err(|e| match e {
            // The configured timeout, not what was left of it: the message stays exact.
            FollowError::Timeout {
                task_type,
                selector,
                why,
                ..
            } => FollowError::Timeout {
                waited: cfg.timeout.unwrap_or_default(),
                task_type,
                selector,
                why,
            },
            e => e,
        })?;
        let placed = cluster
            .tasks
            .values()
            .flatten()
            .find(|p| p.uid == own_uid)
            .map(|p| p.address.clone());
        if own_address.is_none() || own_address != placed {
            let fresh = k8s::get_own_pod(client, id).await?;
            own_address = resolver.address_of(&PeerPod::from(&fresh))?;
        }
        let address = own_address.clone().unwrap_or_default();
        let resolver_uid = cluster
            .task(first, 0)
            .map(|p| p.uid.clone())
            .unwrap_or_default();
        match published::own_task(
            &cluster,
            &types,
            &cfg.cluster.expected,
            &resolver_uid,
            own_uid,
            Some(&address),
        ) {
            Ok(task) => return Ok((cluster, task, start.elapsed())),
            Err(why) => {
                warn!("the published cluster does not fit this pod yet: {why}; waiting");
                let resolver_name = cluster
                    .task(first, 0)
                    .map(|p| p.name.clone())
                    .unwrap_or_default();
                if cfg
                    .timeout
                    .is_some_and(|t| start.elapsed() + Duration::from_secs(1) >= t)
                {
                    return Err(FollowError::Timeout {
                        waited: cfg.timeout.unwrap_or_default(),
                        task_type: first.to_string(),
                        selector: selector.to_string(),
                        why: format!(
                            "pod {resolver_name:?} carries a cluster this pod cannot use: {why}"
                        ),
                    }
                    .into());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
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

/// Renders everything before it writes anything, so that a framework error leaves no
/// file behind; returns the environment of `trainlet.env`.
fn write_outputs(
    cfg: &InitConfig,
    tf: &TfConfig,
    cluster: &Cluster,
    own: &Pod,
    waited: Duration,
) -> Result<Vec<(String, String)>, InitError> {
    let dir = &cfg.output_dir;
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
        tfconfig::tf_env(tf),
    )?;
    if let Some(to) = &cfg.install_to {
        install_binary(to)?;
    }
    let now = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    let cluster_json = tfconfig::render_cluster_file(
        tf,
        cluster,
        &ranks,
        &cfg.cluster.rpc_layer,
        cfg.cluster
            .resolver
            .jobs
            .iter()
            .map(|j| {
                let sels = j.selectors.iter().map(ToString::to_string).collect();
                (j.task_type.clone(), sels)
            })
            .collect(),
        &now,
        waited.as_secs_f64(),
    );
    for f in &rendered.files {
        tfconfig::write_atomic(dir, &f.name, f.contents.as_bytes())?;
    }
    tfconfig::write_atomic(dir, tfconfig::CLUSTER_FILE, cluster_json.as_bytes())?;
    tfconfig::write_atomic(
        dir,
        tfconfig::ENV_FILE,
        tfconfig::render_env(&rendered.env).as_bytes(),
    )?;
    // Last: its presence tells `trainlet exec` that the set is complete.
    tfconfig::write_atomic(
        dir,
        tfconfig::TF_CONFIG_FILE,
        format!("{}\n", tf.render()).as_bytes(),
    )?;
    Ok(rendered.env)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::selector;
    use crate::cluster::{AddressMode, Job, Namespaces, OrderMode, ReadyMode, Resolver};

    fn cfg(expected: &[(&str, usize)]) -> ClusterConfig {
        let job = |t: &str, s: &str| Job {
            task_type: t.into(),
            selectors: vec![selector::parse(s).unwrap()],
        };
        ClusterConfig {
            resolver: Resolver {
                jobs: vec![job("ps", "role=ps"), job("worker", "role=worker")],
                port: 8470,
                port_name: None,
                address: AddressMode::PodIp,
                cluster_domain: "cluster.local".into(),
                order: OrderMode::Index,
                ready: ReadyMode::Running,
            },
            expected: expected.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
            task_override: None,
            rpc_layer: "grpc".into(),
            environment: None,
            namespaces: Namespaces::Own,
        }
    }

    fn own(role: &str, index: Option<u64>) -> Pod {
        let mut labels = std::collections::BTreeMap::from([("role".to_string(), role.to_string())]);
        if let Some(i) = index {
            labels.insert(order::INDEX_KEYS[0].to_string(), i.to_string());
        }
        let mut p = Pod::default();
        p.metadata.labels = Some(labels);
        p
    }

    const FOLLOW_PS0: &str = "role=ps,batch.kubernetes.io/job-completion-index=0";

    #[test]
    fn task_0_of_the_first_type_resolves() {
        let c = cfg(&[]);
        assert_eq!(
            role(Coordinate::Auto, &c, &own("ps", Some(0))),
            Role::Resolver
        );
        assert_eq!(
            role(Coordinate::Always, &c, &own("ps", Some(0))),
            Role::Resolver
        );
        // Index 0 of another type is a follower.
        assert_eq!(
            role(Coordinate::Always, &c, &own("worker", Some(0))),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
    }

    #[test]
    fn in_a_jobset_task_0_is_pod_0_of_job_0() {
        let c = cfg(&[]);
        let in_job = |role: &str, index: u64, job: Option<u64>| {
            let mut p = own(role, Some(index));
            let labels = p.metadata.labels.as_mut().unwrap();
            labels.insert(order::jobset::GLOBAL_INDEX.into(), "3".into());
            if let Some(j) = job {
                labels.insert(order::jobset::JOB_INDEX.into(), j.to_string());
            }
            p
        };
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("ps", 0, Some(0))),
            Role::Resolver
        );
        let follow = Role::Follower {
            selector: format!("{FOLLOW_PS0},{}=0", order::jobset::JOB_INDEX),
        };
        // Pod 0 of the replicated job's second Job follows.
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("ps", 0, Some(1))),
            follow
        );
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("worker", 5, Some(0))),
            follow
        );
        // Without the job index label, nothing names task 0: every agent watches all.
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("ps", 0, None)),
            Role::Alone
        );
    }

    #[test]
    fn auto_follows_only_when_the_job_is_known_to_be_large() {
        let small = cfg(&[("ps", 1), ("worker", 300)]);
        let large = cfg(&[("ps", 1), ("worker", 383)]);
        let half = cfg(&[("worker", 1000)]);
        let w = own("worker", Some(5));
        assert_eq!(role(Coordinate::Auto, &small, &w), Role::Alone);
        assert_eq!(
            role(Coordinate::Auto, &large, &w),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
        // Not every count known: only this pod's own index can tell.
        assert_eq!(role(Coordinate::Auto, &half, &w), Role::Alone);
        assert_eq!(
            role(Coordinate::Auto, &half, &own("worker", Some(384))),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
    }

    #[test]
    fn coordination_needs_index_labels_index_order_and_one_first_selector() {
        let c = cfg(&[("ps", 1), ("worker", 1000)]);
        assert_eq!(
            role(Coordinate::Always, &c, &own("worker", None)),
            Role::Alone
        );
        assert_eq!(
            role(Coordinate::Never, &c, &own("worker", Some(3))),
            Role::Alone
        );
        let mut by_name = c.clone();
        by_name.resolver.order = OrderMode::Name;
        assert_eq!(
            role(Coordinate::Always, &by_name, &own("worker", Some(3))),
            Role::Alone
        );
        let mut two = c.clone();
        two.resolver.jobs[0]
            .selectors
            .push(selector::parse("role=chief").unwrap());
        assert_eq!(
            role(Coordinate::Always, &two, &own("worker", Some(3))),
            Role::Alone
        );
    }
}
