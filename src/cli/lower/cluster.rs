//! The cluster flags (`--job`, `--job-to-label-mapping`, `--expect`, the frameworks'
//! flags) into `ClusterConfig`, `InitConfig` and `FrameworkConfig`.

use std::collections::BTreeMap;

use super::super::args::{ClusterArgs, InitArgs, OutputArgs};
use super::super::defaults;
use super::{kube_settings, namespace, parse_duration};
use crate::Failure;
use crate::bootstrap::InitConfig;
use crate::cluster::{
    self, ClusterConfig, Job, Namespaces, Resolver, Task, add_selector, validate_task_type,
};
use crate::flags;
use crate::render::frameworks::{Elastic, FrameworkConfig, Nproc, RendezvousPort, Slots};

/// The cluster flags, validated: no client, no file, no syscall.
pub fn cluster_config(a: &ClusterArgs) -> Result<ClusterConfig, Failure> {
    let jobs = match &a.job_to_label_mapping {
        Some(json) => parse_mapping(json)?,
        None => parse_job_flags(&a.jobs)?,
    };
    let types: Vec<&str> = jobs.iter().map(|j| j.task_type.as_str()).collect();
    crate::render::frameworks::volcano::distinct_names(&types).map_err(|e| {
        let flag = match a.job_to_label_mapping {
            Some(_) => "--job-to-label-mapping",
            None => "--job",
        };
        Failure::usage(format!("invalid {flag}: {e}; rename one of them"))
    })?;
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
        namespace(flags::NAMESPACE, ns)?;
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
            address: a.address.into(),
            cluster_domain: a.cluster_domain.trim_matches('.').to_string(),
            order: a.order.into(),
            ready: a.ready.into(),
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
    let timeout = parse_duration(flags::TIMEOUT, &a.output.timeout)?;
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
        coordinate: a.output.coordinate.with_threshold(a.output.coordinate_from),
        frameworks: framework_config(&a.cluster, &a.output)?,
        min_generation: None,
        preflight: a.output.preflight,
    })
}

/// The frameworks' flags: every usage error names its flag.
pub fn framework_config(c: &ClusterArgs, o: &OutputArgs) -> Result<FrameworkConfig, Failure> {
    let mut frameworks = o.chosen_frameworks();
    frameworks.sort();
    frameworks.dedup();
    let count = |flag: &str, v: &str, what: &str| -> Result<u32, Failure> {
        v.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Failure::usage(format!("invalid --{flag} {v:?}: give {what}")))
    };
    let nproc = match o.nproc_per_node.trim() {
        "auto" => Nproc::Auto,
        "gpu" => Nproc::Gpu,
        "cpu" => Nproc::Cpu,
        v => Nproc::Count(count(
            flags::NPROC_PER_NODE,
            v,
            "auto, gpu, cpu or a number above 0",
        )?),
    };
    let slots = match o.slots.as_deref().map(str::trim) {
        None => Slots::Auto,
        Some("gpu") => Slots::Gpu,
        Some(v) => Slots::Count(count(flags::SLOTS, v, "gpu or a number above 0")?),
    };
    let elastic = match &o.nnodes {
        None => None,
        Some(v) => Some(parse_nnodes(v)?),
    };
    // The named task port is every framework's, but for MPI's: with MPI chosen too it
    // is its sshd's, which PyTorch's and JAX's rank 0 cannot listen on.
    let task_port = (c.port.is_some() || c.port_name.is_some())
        && !frameworks.contains(&super::super::values::Framework::Mpi);
    Ok(FrameworkConfig {
        frameworks: frameworks.into_iter().map(Into::into).collect(),
        nproc,
        slots,
        elastic,
        torch_port: rendezvous_port(o.master_port, task_port),
        jax_port: rendezvous_port(o.coordinator_port, task_port),
    })
}

/// A launcher's rendezvous port: its own flag, else the named task port where it is
/// this framework's, else the launcher's default.
fn rendezvous_port(own: Option<u16>, task_port: bool) -> RendezvousPort {
    match own {
        Some(p) => RendezvousPort::Fixed(p),
        None if task_port => RendezvousPort::Task,
        None => RendezvousPort::Default,
    }
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

    fn ports(args: &[&str]) -> (RendezvousPort, RendezvousPort) {
        use clap::Parser;
        let argv = ["trainlet", "init", "--job", "w=a=b"].iter().chain(args);
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        let crate::cli::Command::Init(a) = cli.command else {
            unreachable!()
        };
        let c = framework_config(&a.cluster, &a.output).unwrap();
        (c.torch_port, c.jax_port)
    }

    /// `--framework mpi,pytorch --port-name ssh` wrote MASTER_PORT=2222, the sshd's:
    /// with MPI chosen, the named port is its alone.
    #[test]
    fn the_named_port_is_not_pytorchs_when_it_is_mpis_sshd() {
        use RendezvousPort::{Default, Fixed, Task};
        let named = ["--port-name", "ssh"];
        assert_eq!(ports(&["--framework", "pytorch,jax"]), (Default, Default));
        assert_eq!(
            ports(&[&["--framework", "pytorch,jax"][..], &named].concat()),
            (Task, Task)
        );
        assert_eq!(
            ports(&[&["--framework", "mpi,pytorch"][..], &named].concat()),
            (Default, Default)
        );
        assert_eq!(
            ports(
                &[
                    &["--framework", "mpi,pytorch", "--master-port", "29600"][..],
                    &["--coordinator-port", "55600"],
                    &named
                ]
                .concat()
            ),
            (Fixed(29600), Fixed(55600))
        );
    }

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
}
