//! The second phase of parsing, as ripgrep's low and high args: clap's [`args`] in,
//! the validated configs of the domain out (`ClusterConfig`, `InitConfig`, the
//! reporter's `Config`, kube's `Settings`, `InjectConfig`). Nothing here talks to the
//! API server, loads a library or binds a socket; the few file checks are there to
//! catch a missing volume mount before a long wait.
//!
//! Every error that names a flag is written here, or in [`super::explain`] for the
//! errors that surface only at run time.
//!
//! [`args`]: super::args

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

use super::args::{
    ClusterArgs, ExecArgs, InitArgs, InjectArgs, KubeArgs, OutputArgs, ReportArgs, SidecarArgs,
};
use super::defaults;
use crate::Failure;
use crate::bootstrap::InitConfig;
use crate::cluster::{
    self, ClusterConfig, Job, Namespaces, Resolver, Task, add_selector, validate_task_type,
};
use crate::frameworks::{Elastic, Framework, FrameworkConfig, Nproc, Slots};
use crate::inject::InjectConfig;
use crate::kube;
use crate::report::engine::{Config as ReportConfig, Mode};
use crate::report::restart::{OnPeerChange, Policy};

/// Parses a duration such as `500ms`, `10s`, `10m` or `1h 30m`; a bare `0` is zero.
pub fn parse_duration(flag: &str, value: &str) -> Result<Duration, Failure> {
    let v = value.trim();
    if v == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(v).map_err(|e| {
        let zero = if flag == "--timeout" {
            "; 0 means no limit"
        } else {
            ""
        };
        Failure::usage(format!(
            "invalid {flag} {value:?}: {e} (use e.g. 30s, 10m or 1h{zero})"
        ))
    })
}

/// `--log-level`, in tracing's EnvFilter syntax.
///
/// kube's client logs every failed request at ERROR ("failed with error client error
/// (Connect)") and returns the error, which trainlet then reports in its own words: a
/// failure would print two lines. So that log is off unless the filter names
/// `kube_client`.
pub fn log_filter(value: &str) -> Result<EnvFilter, Failure> {
    let filter = EnvFilter::try_new(value)
        .map_err(|e| Failure::usage(format!("invalid --log-level {value:?}: {e}")))?;
    Ok(if value.contains("kube_client") {
        filter
    } else {
        filter.add_directive(
            "kube_client::client::builder=off"
                .parse()
                .expect("a valid directive"),
        )
    })
}

/// How to reach the API server and who "self" is; the environment's defaults
/// ($POD_NAME, the service account) are applied by `kube` when they are needed.
pub fn kube_settings(a: &KubeArgs) -> Result<kube::Settings, Failure> {
    if let Some(ns) = &a.pod_namespace {
        namespace("--pod-namespace", ns)?;
    }
    Ok(kube::Settings {
        kubeconfig: a.kubeconfig.clone(),
        pod_name: a.pod_name.clone(),
        pod_namespace: a.pod_namespace.clone(),
    })
}

/// A namespace name is a DNS label (RFC 1123): one the API server would refuse is a
/// usage error now, not a wait until the timeout.
fn namespace(flag: &str, ns: &str) -> Result<(), Failure> {
    if cluster::is_dns_label(ns) {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "invalid {flag} {ns:?}: a namespace is a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
        )))
    }
}

/// The cluster flags, validated: no client, no file, no syscall.
pub fn cluster_config(a: &ClusterArgs) -> Result<ClusterConfig, Failure> {
    let jobs = match &a.job_to_label_mapping {
        Some(json) => parse_mapping(json)?,
        None => parse_job_flags(&a.jobs)?,
    };
    let expected = parse_expect(&a.expect, &jobs)?;
    if a.port == Some(0) {
        return Err(Failure::usage(format!(
            "invalid --port 0: use the TensorFlow server port, e.g. {}",
            defaults::PORT
        )));
    }
    if let Some(n) = &a.port_name
        && (n.is_empty() || n.len() > 15)
    {
        return Err(Failure::usage(format!(
            "invalid --port-name {n:?}: a container port name has 1 to 15 characters"
        )));
    }
    let task_override = match (&a.task_type, a.task_index) {
        (Some(t), Some(i)) => {
            if !jobs.iter().any(|j| &j.task_type == t) {
                let known: Vec<&str> = jobs.iter().map(|j| j.task_type.as_str()).collect();
                return Err(Failure::usage(format!(
                    "invalid --task-type {t:?}: not a job type given by --job ({})",
                    known.join(", ")
                )));
            }
            Some(Task {
                task_type: t.clone(),
                index: i,
            })
        }
        _ => None,
    };
    if a.rpc_layer.contains("://") {
        return Err(Failure::usage(format!(
            "invalid --rpc-layer {:?}: give the scheme only, e.g. {}",
            a.rpc_layer,
            defaults::RPC_LAYER
        )));
    }
    if let Some(ns) = &a.namespace {
        namespace("--namespace", ns)?;
    }
    let namespaces = match (&a.namespace, a.all_namespaces) {
        (_, true) => Namespaces::All,
        (Some(ns), false) => Namespaces::Named(ns.clone()),
        (None, false) => Namespaces::Own,
    };
    Ok(ClusterConfig {
        resolver: Resolver {
            jobs,
            port: a.port.unwrap_or(defaults::PORT),
            port_name: a.port_name.clone(),
            address: a.address,
            cluster_domain: a.cluster_domain.trim_matches('.').to_string(),
            order: a.order,
            ready: a.ready,
        },
        expected,
        task_override,
        rpc_layer: a.rpc_layer.clone(),
        environment: a.environment.clone().filter(|e| !e.is_empty()),
        namespaces,
    })
}

/// `init`'s flags, and that the output directories exist: a missing volume mount is
/// the most common misconfiguration, and it is better caught before the wait.
pub fn init_config(a: &InitArgs) -> Result<InitConfig, Failure> {
    let cluster = cluster_config(&a.cluster)?;
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
        kube: kube_settings(&a.kube)?,
        cluster,
        timeout: (!timeout.is_zero()).then_some(timeout),
        output_dir: a.output.output_dir.clone(),
        install_to: a.output.install_to.clone(),
        coordinate: a.output.coordinate,
        frameworks: framework_config(&a.cluster, &a.output)?,
    })
}

/// The frameworks' flags: every usage error names its flag.
pub fn framework_config(c: &ClusterArgs, o: &OutputArgs) -> Result<FrameworkConfig, Failure> {
    let mut frameworks = o.frameworks.clone();
    frameworks.sort();
    frameworks.dedup();
    let count = |flag: &str, v: &str, what: &str| -> Result<u32, Failure> {
        v.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Failure::usage(format!("invalid {flag} {v:?}: give {what}")))
    };
    let nproc = match o.nproc_per_node.trim() {
        "auto" => Nproc::Auto,
        "gpu" => Nproc::Gpu,
        "cpu" => Nproc::Cpu,
        v => Nproc::Count(count(
            "--nproc-per-node",
            v,
            "auto, gpu, cpu or a number above 0",
        )?),
    };
    let slots = match o.slots.as_deref().map(str::trim) {
        None => Slots::Auto,
        Some("gpu") => Slots::Gpu,
        Some(v) => Slots::Count(count("--slots", v, "gpu or a number above 0")?),
    };
    let elastic = match &o.nnodes {
        None => None,
        Some(v) => Some(parse_nnodes(v)?),
    };
    Ok(FrameworkConfig {
        frameworks,
        nproc,
        slots,
        elastic,
        port_given: c.port.is_some() || c.port_name.is_some(),
    })
}

/// `--nnodes MIN:MAX`, 0 < MIN ≤ MAX.
fn parse_nnodes(v: &str) -> Result<Elastic, Failure> {
    let bad = |why: &str| Failure::usage(format!("invalid --nnodes {v:?}: {why}"));
    let (min, max) = v
        .split_once(':')
        .ok_or_else(|| bad("give MIN:MAX, e.g. 2:4"))?;
    let num = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|_| bad("give MIN:MAX, e.g. 2:4"))
    };
    let (min, max) = (num(min)?, num(max)?);
    if min == 0 {
        return Err(bad("MIN must be at least 1"));
    }
    if min > max {
        return Err(bad("MIN is above MAX"));
    }
    Ok(Elastic { min, max })
}

/// The cluster flags of `master`, where `--task-type`/`--task-id` select the task to
/// print instead of overriding the own task: the task, and the cluster to resolve when
/// no cluster.json exists.
pub fn master_query(a: &ClusterArgs) -> Result<(Task, ClusterArgs), Failure> {
    let (Some(task_type), Some(index)) = (a.task_type.clone(), a.task_index) else {
        return Err(Failure::usage(
            "trainlet master needs --task-type TYPE and --task-id I",
        ));
    };
    let mut cluster = a.clone();
    cluster.task_type = None;
    cluster.task_index = None;
    Ok((Task { task_type, index }, cluster))
}

/// `--metrics-addr`: `HOST:PORT`, `[::]:PORT`, or `off`.
fn metrics_addr(value: &str) -> Result<Option<SocketAddr>, Failure> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("off") || v.is_empty() {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| {
        Failure::usage(format!(
            "invalid --metrics-addr {value:?}: use HOST:PORT such as {}, or `off`",
            defaults::metrics_addr()
        ))
    })
}

/// The reporter flags shared by `sidecar` and `exec --report`: no client, no NVML, no
/// socket.
pub fn report_config(mode: Mode, r: &ReportArgs, kube: &KubeArgs) -> Result<ReportConfig, Failure> {
    let interval = parse_duration("--interval", &r.interval)?;
    if interval < Duration::from_millis(100) {
        return Err(Failure::usage(format!(
            "invalid --interval {:?}: use at least 100ms, e.g. {}",
            r.interval,
            defaults::INTERVAL
        )));
    }
    let min_patch_interval = parse_duration("--min-patch-interval", &r.min_patch_interval)?;
    let metrics_addr = metrics_addr(&r.metrics_addr)?;
    if let Some(lib) = &r.nvml_lib
        && lib.as_os_str().is_empty()
    {
        return Err(Failure::usage(
            "invalid --nvml-lib \"\": give the path of libnvidia-ml.so.1",
        ));
    }
    if let Some(dir) = &r.observations
        && !dir.is_dir()
    {
        return Err(Failure::usage(format!(
            "invalid --observations {:?}: no such directory; mount the volume shared with the trainlet sidecar there",
            dir.display().to_string()
        )));
    }
    Ok(ReportConfig {
        mode,
        kube: kube_settings(kube)?,
        nvml_lib: r.nvml_lib.clone(),
        expect_gpus: r.expect_gpus,
        container: r.container.clone().filter(|c| !c.is_empty()),
        interval,
        min_patch_interval,
        metrics_addr,
        ports: Vec::new(),
        cgroup_root: None,
        exit_with_main: false,
        observations: r.observations.clone(),
        cluster_file: None,
        restart: Policy {
            on_change: defaults::ON_PEER_CHANGE,
            max_restarts: defaults::MAX_RESTARTS,
            grace: parse_duration("--restart-grace", defaults::RESTART_GRACE)?,
            backoff: parse_duration("--restart-backoff", defaults::RESTART_BACKOFF)?,
            wait: None,
        },
    })
}

/// `exec --report` (implied by `--on-peer-change restart|exit`): the reporter flags
/// plus what a peer change does. `cluster_file` is init's cluster.json, the peers to
/// watch: there already, or (`resolving`) about to be written by exec's own init.
pub fn exec_report_config(
    a: &ExecArgs,
    cluster_file: Option<&Path>,
    resolving: bool,
) -> Result<ReportConfig, Failure> {
    let mut cfg = report_config(Mode::Exec, &a.report_args, &a.init.kube)?;
    cfg.restart = Policy {
        on_change: a.on_peer_change,
        max_restarts: a.max_restarts,
        grace: parse_duration("--restart-grace", &a.restart_grace)?,
        backoff: parse_duration("--restart-backoff", &a.restart_backoff)?,
        wait: Some(parse_duration("--timeout", &a.init.output.timeout)?).filter(|t| !t.is_zero()),
    };
    if a.on_peer_change != OnPeerChange::Report {
        let what = a
            .on_peer_change
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        match cluster_file {
            _ if resolving => {}
            Some(f) if has_selectors(f) => {}
            Some(f) => {
                return Err(Failure::usage(format!(
                    "--on-peer-change {what} needs the peers' selectors, and {} names none (written by an older trainlet init): run this version's trainlet init, or let exec resolve (remove tf_config.json and give --job or --selector)",
                    f.display()
                )));
            }
            None => {
                return Err(Failure::usage(format!(
                    "--on-peer-change {what} needs the peers' selectors: there is no cluster.json in --output-dir {} next to tf_config.json; run trainlet init (or let exec resolve: remove tf_config.json and give --job or --selector)",
                    a.init.output.output_dir.display()
                )));
            }
        }
    }
    cfg.cluster_file = cluster_file.map(Path::to_path_buf);
    Ok(cfg)
}

/// Whether a cluster.json lists the selectors it was resolved with.
fn has_selectors(f: &Path) -> bool {
    crate::tfconfig::read_cluster_file(f).is_ok_and(|c| !c.selectors.is_empty())
}

/// `sidecar`: the reporter flags plus the ports to watch, the node's cgroups and
/// `--exit-with-main`.
pub fn sidecar_config(a: &SidecarArgs) -> Result<ReportConfig, Failure> {
    let mut cfg = report_config(Mode::Sidecar, &a.report, &a.kube)?;
    if let Some(p) = a.ports.iter().find(|p| **p == 0) {
        return Err(Failure::usage(format!(
            "invalid --port {p}: give the container port to watch, e.g. {}",
            defaults::PORT
        )));
    }
    cfg.ports = a.ports.clone();
    if let Some(root) = &a.cgroup_root
        && !root.is_dir()
    {
        return Err(Failure::usage(format!(
            "invalid --cgroup-root {}: not a directory (mount the node's /sys/fs/cgroup there read-only)",
            root.display()
        )));
    }
    cfg.cgroup_root = a.cgroup_root.clone();
    cfg.exit_with_main = a.exit_with_main;
    cfg.cluster_file = match a.cluster_file.as_deref().map(str::trim) {
        None => Some(Path::new(defaults::OUTPUT_DIR).join(crate::tfconfig::CLUSTER_FILE)),
        Some("" | "off") => None,
        Some(f) => Some(f.into()),
    };
    Ok(cfg)
}

/// `inject`'s flags: checked (no I/O), and rendered into the arguments of the agents it
/// adds. The init flags are validated exactly as `trainlet init` will, so a bad
/// selector fails here and not in every pod of the job; flags left at their defaults
/// are not written.
pub fn inject_config(a: &InjectArgs) -> Result<InjectConfig, Failure> {
    cluster_config(&a.cluster)?;
    framework_config(&a.cluster, &a.output)?;
    let c = &a.cluster;
    if c.task_type.is_some() || c.task_index.is_some() {
        return Err(Failure::usage(
            "--task-type and --task-index would give every pod of a template the same task; inject leaves the task to each pod's own index",
        ));
    }
    parse_duration("--timeout", &a.output.timeout)?;
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

    Ok(InjectConfig {
        image: a.image.trim().to_string(),
        init_args: init_flags(c, &a.output, &output_dir, &install_to),
        // The task port the sidecar watches for conflicts: TensorFlow's, or the one given.
        // Other frameworks' ports are the training container's containerPorts, which
        // the sidecar watches without --port.
        sidecar_args: match c.port {
            Some(p) => vec![format!("--port={p}")],
            None if a
                .output
                .frameworks
                .iter()
                .all(|f| *f == Framework::Tensorflow) =>
            {
                vec![format!("--port={}", defaults::PORT)]
            }
            None => Vec::new(),
        },
        // `trainlet exec` reads TF_CONFIG from --output-dir, whose default is the
        // default mount path; the sidecar serves the pod's metrics, so the in-process
        // reporters of `exec --report` must not bind the same port in the same pod.
        wrap_env: (output_dir != defaults::OUTPUT_DIR)
            .then(|| ("TRAINLET_OUTPUT_DIR".to_string(), output_dir.clone()))
            .into_iter()
            .chain([("TRAINLET_METRICS_ADDR".to_string(), "off".to_string())])
            .collect(),
        metrics_port: defaults::METRICS_PORT,
        output_dir,
        observations_dir: defaults::OBSERVATIONS_DIR.to_string(),
        install_to,
        classic_sidecar: a.classic_sidecar,
        failure_policy: a.failure_policy,
        wrap: a.wrap.clone(),
        service_account: a.service_account.clone(),
    })
}

/// The `trainlet init` flags for the injected init container: those that differ from
/// their defaults, then `--install-to`.
fn init_flags(c: &ClusterArgs, o: &OutputArgs, output_dir: &str, install_to: &str) -> Vec<String> {
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
    if let Some(p) = c.port {
        init.push(format!("--port={p}"));
    }
    if let Some(p) = &c.port_name {
        init.push(format!("--port-name={p}"));
    }
    if c.address != defaults::ADDRESS {
        init.push(format!("--address={}", value_name(c.address)));
    }
    if c.cluster_domain != defaults::CLUSTER_DOMAIN {
        init.push(format!("--cluster-domain={}", c.cluster_domain));
    }
    if c.order != defaults::ORDER {
        init.push(format!("--order={}", value_name(c.order)));
    }
    if c.ready != defaults::READY {
        init.push(format!("--ready={}", value_name(c.ready)));
    }
    if c.rpc_layer != defaults::RPC_LAYER {
        init.push(format!("--rpc-layer={}", c.rpc_layer));
    }
    if let Some(e) = &c.environment {
        init.push(format!("--environment={e}"));
    }
    if output_dir != defaults::OUTPUT_DIR {
        init.push(format!("--output-dir={output_dir}"));
    }
    init.push(format!("--install-to={install_to}"));
    if o.timeout != defaults::TIMEOUT {
        init.push(format!("--timeout={}", o.timeout));
    }
    if o.coordinate != defaults::COORDINATE {
        init.push(format!("--coordinate={}", value_name(o.coordinate)));
    }
    // The variables of the frameworks chosen land in trainlet.env, which the wrapped
    // container's `trainlet exec` (or a shell that sources it) starts with.
    if o.frameworks != [Framework::Tensorflow] {
        let mut names: Vec<String> = Vec::new();
        for f in &o.frameworks {
            let name = value_name(*f);
            if !names.contains(&name) {
                names.push(name);
            }
        }
        init.push(format!("--framework={}", names.join(",")));
    }
    if o.nproc_per_node != defaults::NPROC_PER_NODE {
        init.push(format!("--nproc-per-node={}", o.nproc_per_node));
    }
    if let Some(s) = &o.slots {
        init.push(format!("--slots={s}"));
    }
    if let Some(n) = &o.nnodes {
        init.push(format!("--nnodes={n}"));
    }
    init
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

fn job_flag(flag: &str, why: String) -> Failure {
    Failure::usage(format!("invalid --job {flag:?}: {why}"))
}

fn mapping(why: String) -> Failure {
    Failure::usage(format!("invalid --job-to-label-mapping: {why}"))
}

fn no_jobs() -> Failure {
    Failure::usage(
        "no jobs given: pass --job TYPE=SELECTOR (repeatable) or --job-to-label-mapping JSON",
    )
}

/// Parses repeated `--job TYPE=SELECTOR` flags. Types keep the order of their first
/// appearance; several flags for one type append selectors.
fn parse_job_flags(flags: &[String]) -> Result<Vec<Job>, Failure> {
    let mut jobs: Vec<Job> = Vec::new();
    for flag in flags {
        let (ty, sel) = flag.split_once('=').ok_or_else(|| {
            job_flag(
                flag,
                "expected TYPE=SELECTOR, e.g. worker=app=mnist,role=worker".into(),
            )
        })?;
        let ty = ty.trim();
        validate_task_type(ty).map_err(|m| job_flag(flag, m))?;
        if sel.trim().is_empty() {
            return Err(job_flag(
                flag,
                "empty selector would match every pod in the namespace".into(),
            ));
        }
        let sel = cluster::selector::parse(sel).map_err(|m| job_flag(flag, m))?;
        add_selector(&mut jobs, ty, sel);
    }
    if jobs.is_empty() {
        return Err(no_jobs());
    }
    Ok(jobs)
}

/// Parses TensorFlow's `job_to_label_mapping`, e.g.
/// `{"worker":["job-name=w"],"ps":["job-name=p"]}`. Types keep the JSON's order.
fn parse_mapping(json: &str) -> Result<Vec<Job>, Failure> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json)
        .map_err(|e| mapping(format!("not a JSON object of lists: {e}")))?;
    let mut jobs = Vec::new();
    for (ty, sels) in map {
        validate_task_type(&ty).map_err(|m| mapping(format!("job {ty:?}: {m}")))?;
        let list = match sels {
            serde_json::Value::Array(a) => a,
            serde_json::Value::String(s) => vec![serde_json::Value::String(s)],
            _ => {
                return Err(mapping(format!(
                    "job {ty:?}: expected a list of selector strings"
                )));
            }
        };
        if list.is_empty() {
            return Err(mapping(format!("job {ty:?}: no selectors")));
        }
        for s in list {
            let s = s
                .as_str()
                .ok_or_else(|| mapping(format!("job {ty:?}: selectors must be strings")))?;
            if s.trim().is_empty() {
                return Err(mapping(format!("job {ty:?}: empty selector")));
            }
            let sel =
                cluster::selector::parse(s).map_err(|m| mapping(format!("job {ty:?}: {m}")))?;
            add_selector(&mut jobs, &ty, sel);
        }
    }
    if jobs.is_empty() {
        return Err(no_jobs());
    }
    Ok(jobs)
}

/// Parses `--expect TYPE=N[,TYPE=N...]`; every type must be one of the jobs.
fn parse_expect(flags: &[String], jobs: &[Job]) -> Result<BTreeMap<String, usize>, Failure> {
    let mut out = BTreeMap::new();
    for flag in flags.iter().filter(|f| !f.trim().is_empty()) {
        let err = |m: &str| Failure::usage(format!("invalid --expect {flag:?}: {m}"));
        let (ty, n) = flag
            .split_once('=')
            .ok_or_else(|| err("expected TYPE=N, e.g. worker=4"))?;
        let ty = ty.trim();
        if !jobs.iter().any(|j| j.task_type == ty) {
            let known: Vec<&str> = jobs.iter().map(|j| j.task_type.as_str()).collect();
            return Err(err(&format!(
                "{ty:?} is not a job type given by --job ({})",
                known.join(", ")
            )));
        }
        let n: usize = n
            .trim()
            .parse()
            .map_err(|_| err("N must be a whole number"))?;
        if n == 0 {
            return Err(err("N must be at least 1"));
        }
        if out.insert(ty.to_string(), n).is_some() {
            return Err(err("type given twice"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn job_flags_and_mapping_agree() {
        let a = parse_job_flags(&["worker=job-name=w".into(), "ps=job-name=p".into()]).unwrap();
        let b = parse_mapping(r#"{"worker":["job-name=w"],"ps":["job-name=p"]}"#).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn bad_job_and_expect_flags() {
        assert_eq!(
            parse_job_flags(&["worker".into()]).unwrap_err().to_string(),
            "invalid --job \"worker\": expected TYPE=SELECTOR, e.g. worker=app=mnist,role=worker"
        );
        assert_eq!(
            parse_job_flags(&["1w=app=x".into()])
                .unwrap_err()
                .to_string(),
            "invalid --job \"1w=app=x\": task type \"1w\" must start with a letter and contain only letters, digits, '_' and '-'"
        );
        let jobs = parse_job_flags(&["worker=app=x".into()]).unwrap();
        assert_eq!(
            parse_expect(&["ps=1".into()], &jobs)
                .unwrap_err()
                .to_string(),
            "invalid --expect \"ps=1\": \"ps\" is not a job type given by --job (worker)"
        );
        assert_eq!(
            parse_expect(&["worker=0".into()], &jobs)
                .unwrap_err()
                .to_string(),
            "invalid --expect \"worker=0\": N must be at least 1"
        );
        assert!(
            parse_mapping("[1]")
                .unwrap_err()
                .to_string()
                .starts_with("invalid --job-to-label-mapping: not a JSON object")
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("--timeout", "0").unwrap().as_secs(), 0);
        assert_eq!(parse_duration("--timeout", "10m").unwrap().as_secs(), 600);
        assert_eq!(
            parse_duration("--timeout", "1h 30m").unwrap().as_secs(),
            5400
        );
        let e = parse_duration("--timeout", "soon").unwrap_err();
        assert_eq!(e.code, Code::Usage);
        assert!(
            e.message.starts_with("invalid --timeout \"soon\""),
            "{}",
            e.message
        );
    }

    #[test]
    fn metrics_addresses() {
        assert_eq!(metrics_addr("off").unwrap(), None);
        assert_eq!(
            metrics_addr("0.0.0.0:9464").unwrap(),
            Some("0.0.0.0:9464".parse().unwrap())
        );
        assert_eq!(
            metrics_addr("[::]:9464").unwrap(),
            Some("[::]:9464".parse().unwrap())
        );
        let e = metrics_addr("localhost").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --metrics-addr \"localhost\": use HOST:PORT such as 0.0.0.0:9464, or `off`"
        );
    }

    mod properties {
        use super::*;
        use crate::testing::budget;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(budget(512))]

            #[test]
            fn durations_never_panic_and_fail_as_usage(text in "\\PC{0,40}") {
                if let Err(f) = parse_duration("--timeout", &text) {
                    prop_assert_eq!(f.code, Code::Usage);
                    prop_assert!(f.message.starts_with("invalid --timeout "));
                    prop_assert!(!f.message.contains('\n'));
                }
            }

            #[test]
            fn durations_in_each_unit_are_exact(n in 1u64..100_000, unit in prop_oneof![Just(("ms", 1u64)), Just(("s", 1000)), Just(("m", 60_000)), Just(("h", 3_600_000))]) {
                let d = parse_duration("--interval", &format!("{n}{}", unit.0)).unwrap();
                prop_assert_eq!(d.as_millis(), u128::from(n * unit.1));
            }
        }
    }
}
