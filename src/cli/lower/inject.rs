//! `inject`'s flags into `InjectConfig`, and the init flags it writes into the pod
//! template from the same values.

use std::path::Path;

use super::super::args::{ClusterArgs, OutputArgs};
use super::super::defaults;
use super::super::inject_args::InjectArgs;
use super::super::values::{FailureAction, Flag, Framework};
use super::settings::settings;
use super::{cluster_config, framework_config, parse_duration, progress_watch};
use crate::Failure;
use crate::flags;
use crate::inject::quantity::{is_quantity, millibytes};
use crate::inject::transform::Metrics;
use crate::inject::transform::hostnet::addr_port;
use crate::inject::{Infer, InjectConfig, Resources};

/// `inject`'s flags: checked (no I/O), and rendered into the arguments of the agents it
/// adds. The init flags are validated exactly as `trainlet init` will, so a bad
/// selector fails here and not in every pod of the job; flags left at their defaults
/// are not written.
pub fn inject_config(a: &InjectArgs) -> Result<InjectConfig, Failure> {
    check_template_flags(a)?;
    let permanent_exit_codes = check_exec_flags(a)?;
    let resources = resources(&a.resources)?;
    if let Some(size) = &a.shm_size {
        check_shm_size(size)?;
    }
    let (output_dir, install_to) = paths(&a.output)?;
    let c = &a.cluster;

    let (init_args, framework_at) = init_flags(c, &a.output, &output_dir, &install_to);
    let exec_args = exec_flags(a);
    let metrics = metrics(a.metrics_addr.as_deref());
    let written: Vec<String> = init_args
        .iter()
        .chain(&exec_args)
        .cloned()
        .chain(
            a.metrics_addr
                .iter()
                .map(|v| flags::with_value(flags::METRICS_ADDR, v)),
        )
        .collect();
    settings(&install_to)
        .check_args(&written)
        .map_err(|r| Failure::usage(format!("invalid --{} {:?}: {}", r.flag, r.value, r.why)))?;
    Ok(InjectConfig {
        image: a.image.trim().to_string(),
        init_args,
        sidecar_args: sidecar_port(
            c.port,
            a.output
                .chosen_frameworks()
                .iter()
                .all(|f| *f == Framework::Tensorflow),
        ),
        // Without --framework, the wrapped command's launcher chooses, as if it were
        // given: what it infers is never TensorFlow's alone.
        infer: (a.output.frameworks.is_empty() && a.wrap.is_some()).then(|| Infer {
            at: framework_at,
            sidecar_args: sidecar_port(c.port, false),
        }),
        wrap_env: wrap_env(&output_dir),
        metrics,
        host_network: false,
        output_dir,
        observations_dir: defaults::OBSERVATIONS_DIR.to_string(),
        install_to,
        classic_sidecar: a.classic_sidecar,
        failure_policy: a.failure_policy,
        permanent_exit_codes,
        wrap: a.wrap.clone(),
        service_account: a.service_account.clone(),
        exec_args,
        resources,
        shm_size: a.shm_size.clone(),
    })
}

/// The flags of what inject adds to every pod template alike: the cluster's, the
/// frameworks', the image, and the container to wrap.
fn check_template_flags(a: &InjectArgs) -> Result<(), Failure> {
    cluster_config(&a.cluster)?;
    framework_config(&a.cluster, &a.output)?;
    let c = &a.cluster;
    if c.task_type.is_some() || c.task_index.is_some() {
        return Err(Failure::usage(
            "--task-type and --task-index would give every pod of a template the same task; inject leaves the task to each pod's own index",
        ));
    }
    parse_duration(flags::TIMEOUT, &a.output.timeout)?;
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
    Ok(())
}

/// The wrapped exec's flags: each valid, and given only with `--wrap`, whose command
/// they act on. The permanent exit codes, parsed.
fn check_exec_flags(a: &InjectArgs) -> Result<Option<Vec<i32>>, Failure> {
    progress_watch(&a.stall)?;
    if a.wrap.is_none()
        && let Some(flag) = [
            (a.stall.stall_after.is_some(), flags::STALL_AFTER),
            (a.stall.progress_pattern.is_some(), flags::PROGRESS_PATTERN),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    {
        return Err(Failure::usage(format!(
            "--{flag} watches the command of the container that --wrap names; pass --wrap CONTAINER"
        )));
    }
    if a.on_peer_change != defaults::ON_PEER_CHANGE && a.wrap.is_none() {
        return Err(Failure::usage(format!(
            "--on-peer-change {} acts on the command of the container that --wrap names; pass --wrap CONTAINER",
            a.on_peer_change.name()
        )));
    }
    let permanent_exit_codes = a
        .permanent_exit_codes
        .as_deref()
        .map(super::permanent_exit_codes)
        .transpose()?;
    // The codes serve the Job's podFailurePolicy and the wrapped exec's restarts in
    // place alike: a code the Job fails on is not first retried in the pod.
    if permanent_exit_codes.is_some() && !a.failure_policy && a.on_failure != FailureAction::Restart
    {
        return Err(Failure::usage(format!(
            "--{} names the codes that the podFailurePolicy of --{} fails the Job on, and that --{} restart does not retry; pass either",
            flags::PERMANENT_EXIT_CODES,
            flags::FAILURE_POLICY,
            flags::ON_FAILURE
        )));
    }
    parse_duration(flags::RESTART_GRACE, &a.restart_grace)?;
    if a.wrap.is_none()
        && let Some(flag) = [
            (
                a.max_restarts != defaults::MAX_RESTARTS,
                flags::MAX_RESTARTS,
            ),
            (
                a.restart_grace != defaults::RESTART_GRACE,
                flags::RESTART_GRACE,
            ),
            (a.on_failure != defaults::ON_FAILURE, flags::ON_FAILURE),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    {
        return Err(Failure::usage(format!(
            "--{flag} acts on the command of the container that --wrap names; pass --wrap CONTAINER"
        )));
    }
    Ok(permanent_exit_codes)
}

/// `--shm-size`: a quantity of bytes, not of millibytes (`512m` is half a byte).
fn check_shm_size(size: &str) -> Result<(), Failure> {
    if let Some(n) = millibytes(size) {
        return Err(Failure::usage(format!(
            "invalid --shm-size {size:?}: {size} is {n} millibytes; write {n}Mi"
        )));
    }
    if !is_quantity(size) {
        return Err(Failure::usage(format!(
            "invalid --shm-size {size:?}: give a size such as 8Gi or 512Mi"
        )));
    }
    Ok(())
}

/// `--output-dir` (the shared volume's mount path) and `--install-to` inside it.
fn paths(o: &OutputArgs) -> Result<(String, String), Failure> {
    let output_dir = path_str(flags::OUTPUT_DIR, &o.output_dir)?;
    if !o.output_dir.is_absolute() || output_dir == "/" {
        return Err(Failure::usage(format!(
            "invalid --output-dir {output_dir}: the mount path of the shared volume must be an absolute path below /"
        )));
    }
    let install_to = match &o.install_to {
        None => format!("{output_dir}/bin"),
        Some(p) => {
            let s = path_str(flags::INSTALL_TO, p)?;
            if !p.starts_with(&o.output_dir) || p == &o.output_dir {
                return Err(Failure::usage(format!(
                    "invalid --install-to {s}: it must be a directory inside --output-dir {output_dir}, the only volume inject adds"
                )));
            }
            s
        }
    };
    Ok((output_dir, install_to))
}

/// The sidecar's metrics endpoint: `--metrics-addr` (checked by its rule before), written
/// into the sidecar's arguments where it is not the sidecar's default.
pub(super) fn metrics(given: Option<&str>) -> Metrics {
    let default = defaults::metrics_addr();
    let addr = given.unwrap_or(&default);
    Metrics {
        addr: (addr != default).then(|| addr.to_string()),
        port: addr_port(addr).unwrap_or(defaults::METRICS_PORT),
        given: given.is_some(),
    }
}

/// The task port the sidecar watches for conflicts: the one given, or TensorFlow's
/// where every framework is TensorFlow's. Other frameworks' ports are the training
/// container's containerPorts, which the sidecar watches without --port.
fn sidecar_port(port: Option<u16>, tensorflow_only: bool) -> Vec<String> {
    match port {
        Some(p) => vec![format!("--port={p}")],
        None if tensorflow_only => vec![format!("--port={}", defaults::PORT)],
        None => Vec::new(),
    }
}

/// The wrapped container's env that inject owns. `trainlet exec` reads TF_CONFIG from
/// --output-dir, whose default is the default mount path; the sidecar serves the pod's
/// metrics, so the in-process reporters of
/// `exec --report` must not bind the same port in the same pod.
pub(super) fn wrap_env(output_dir: &str) -> Vec<(String, String)> {
    (output_dir != defaults::OUTPUT_DIR)
        .then(|| ("TRAINLET_OUTPUT_DIR".to_string(), output_dir.to_string()))
        .into_iter()
        .chain([("TRAINLET_METRICS_ADDR".to_string(), "off".to_string())])
        .collect()
}

/// The flags of the wrapped container's `trainlet exec`: `--report`, and those that
/// differ from their defaults, in the order of `inject::transform::EXEC_FLAGS`.
fn exec_flags(a: &InjectArgs) -> Vec<String> {
    let stall = &a.stall;
    let mut args = vec![flags::long(flags::REPORT)];
    if a.on_peer_change != defaults::ON_PEER_CHANGE {
        args.push(flags::with_value(
            flags::ON_PEER_CHANGE,
            a.on_peer_change.name(),
        ));
    }
    if a.max_restarts != defaults::MAX_RESTARTS {
        args.push(flags::with_value(flags::MAX_RESTARTS, a.max_restarts));
    }
    // Written as given: the policy checks an annotation's value untrimmed, and so
    // does inject (`settings`).
    if a.restart_grace != defaults::RESTART_GRACE {
        args.push(flags::with_value(flags::RESTART_GRACE, &a.restart_grace));
    }
    if let Some(d) = &stall.stall_after {
        args.push(flags::with_value(flags::STALL_AFTER, d));
    }
    if stall.on_stall != defaults::ON_STALL {
        args.push(flags::with_value(flags::ON_STALL, stall.on_stall.name()));
    }
    if stall.stall_scope != defaults::STALL_SCOPE {
        args.push(flags::with_value(
            flags::STALL_SCOPE,
            stall.stall_scope.name(),
        ));
    }
    if let Some(p) = &stall.progress_pattern {
        args.push(flags::with_value(flags::PROGRESS_PATTERN, p));
    }
    if a.on_failure != defaults::ON_FAILURE {
        args.push(flags::with_value(flags::ON_FAILURE, a.on_failure.name()));
    }
    // As given, like the annotation the policy passes on; exec reads the codes only
    // with `--on-failure restart`, and refuses them without it.
    if let Some(codes) = &a.permanent_exit_codes
        && a.on_failure == FailureAction::Restart
    {
        args.push(flags::with_value(flags::PERMANENT_EXIT_CODES, codes));
    }
    args
}

/// `--resources cpu=Q,memory=Q`: either may be left out, keeping its default.
pub(super) fn resources(spec: &str) -> Result<Resources, Failure> {
    let bad = |why: String| Failure::usage(format!("invalid --resources {spec:?}: {why}"));
    let mut r = Resources {
        cpu: String::new(),
        memory: String::new(),
    };
    for (key, value) in [defaults::RESOURCES, spec]
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
    {
        let (key, value) = (key.trim(), value.trim());
        if key == "memory"
            && let Some(n) = millibytes(value)
        {
            return Err(bad(format!(
                "memory={value} is {n} millibytes; write memory={n}Mi"
            )));
        }
        if !is_quantity(value) {
            return Err(bad(format!(
                "{key}={value:?} is not a quantity such as 250m or 128Mi"
            )));
        }
        match key {
            "cpu" => r.cpu = value.to_string(),
            "memory" => r.memory = value.to_string(),
            _ => {
                return Err(bad(format!(
                    "unknown resource {key:?}; give cpu=Q,memory=Q"
                )));
            }
        }
    }
    Ok(r)
}

/// The `trainlet init` flags for the injected init container: those that differ from
/// their defaults, then `--install-to`; and where `--framework` goes among them (where
/// an inferred one goes when it is not given).
fn init_flags(
    c: &ClusterArgs,
    o: &OutputArgs,
    output_dir: &str,
    install_to: &str,
) -> (Vec<String>, usize) {
    use crate::flags::{self as f, with_value};
    let mut init = cluster_flags(c);
    if output_dir != defaults::OUTPUT_DIR {
        init.push(with_value(f::OUTPUT_DIR, output_dir));
    }
    init.push(with_value(f::INSTALL_TO, install_to));
    if o.timeout != defaults::TIMEOUT {
        init.push(with_value(f::TIMEOUT, &o.timeout));
    }
    if o.coordinate != defaults::COORDINATE {
        init.push(with_value(f::COORDINATE, o.coordinate.name()));
    }
    if o.coordinate_from != defaults::COORDINATE_FROM {
        init.push(with_value(f::COORDINATE_FROM, o.coordinate_from));
    }
    if o.preflight {
        init.push(f::long(f::PREFLIGHT));
    }
    // The variables of the frameworks chosen land in trainlet.env, which the wrapped
    // container's `trainlet exec` (or a shell that sources it) starts with.
    let framework_at = init.len();
    init.extend(framework_flags(o));
    (init, framework_at)
}

/// The init flags that find the cluster and its addresses, where not the defaults.
fn cluster_flags(c: &ClusterArgs) -> Vec<String> {
    use crate::flags::{self as f, with_value};
    let mut init = Vec::new();
    for j in &c.jobs {
        init.push(with_value(f::JOB, j));
    }
    if let Some(m) = &c.job_to_label_mapping {
        init.push(with_value(f::JOB_TO_LABEL_MAPPING, m));
    }
    if !c.expect.is_empty() {
        init.push(with_value(f::EXPECT, c.expect.join(",")));
    }
    if let Some(ns) = &c.namespace {
        init.push(with_value(f::NAMESPACE, ns));
    }
    if c.all_namespaces {
        init.push(f::long(f::ALL_NAMESPACES));
    }
    if let Some(p) = c.port {
        init.push(with_value(f::PORT, p));
    }
    if let Some(p) = &c.port_name {
        init.push(with_value(f::PORT_NAME, p));
    }
    if c.address != defaults::ADDRESS {
        init.push(with_value(f::ADDRESS, c.address.name()));
    }
    if c.cluster_domain != defaults::CLUSTER_DOMAIN {
        init.push(with_value(f::CLUSTER_DOMAIN, &c.cluster_domain));
    }
    if c.order != defaults::ORDER {
        init.push(with_value(f::ORDER, c.order.name()));
    }
    if c.ready != defaults::READY {
        init.push(with_value(f::READY, c.ready.name()));
    }
    if c.rpc_layer != defaults::RPC_LAYER {
        init.push(with_value(f::RPC_LAYER, &c.rpc_layer));
    }
    if let Some(e) = &c.environment {
        init.push(with_value(f::ENVIRONMENT, e));
    }
    init
}

/// The init flags of the frameworks' files, where not the defaults.
fn framework_flags(o: &OutputArgs) -> Vec<String> {
    use crate::flags::{self as f, with_value};
    let mut init = Vec::new();
    let frameworks = o.chosen_frameworks();
    if frameworks != [Framework::Tensorflow] {
        let mut names: Vec<String> = Vec::new();
        for fw in &frameworks {
            let name = fw.name();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        init.push(with_value(f::FRAMEWORK, names.join(",")));
    }
    if o.nproc_per_node != defaults::NPROC_PER_NODE {
        init.push(with_value(f::NPROC_PER_NODE, &o.nproc_per_node));
    }
    if let Some(s) = &o.slots {
        init.push(with_value(f::SLOTS, s));
    }
    if let Some(p) = o.master_port {
        init.push(with_value(f::MASTER_PORT, p.to_string()));
    }
    if let Some(p) = o.coordinator_port {
        init.push(with_value(f::COORDINATOR_PORT, p.to_string()));
    }
    if let Some(n) = &o.nnodes {
        init.push(with_value(f::NNODES, n));
    }
    init
}

fn path_str(flag: &str, p: &Path) -> Result<String, Failure> {
    let s = p
        .to_str()
        .ok_or_else(|| Failure::usage(format!("invalid --{flag}: not UTF-8")))?;
    Ok(s.trim_end_matches('/').to_string())
}
