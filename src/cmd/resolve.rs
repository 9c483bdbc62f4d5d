//! `trainlet resolve`: TensorFlow's `cluster_spec()`. One list per selector, no waiting:
//! a matched pod that is not ready is an error (exit 3), as in the resolver.

use std::collections::{BTreeMap, HashSet};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::ListParams;
use serde::Serialize;

use super::ClusterConfig;
use crate::cli::{ClusterArgs, KubeArgs};
use crate::cluster::slim::PeerPod;
use crate::cluster::{Assessment, Cluster, Task, is_live, phase, readiness};
use crate::kube::classify;
use crate::wait::Scope;
use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

pub fn run(args: ResolveArgs) -> Result<Code, Failure> {
    let cfg = ClusterConfig::from_args(&args.cluster)?;
    let (cluster, task) =
        super::runtime()?.block_on(resolve_once(&args.kube, &args.cluster, &cfg))?;
    #[derive(Serialize)]
    struct Out<'a> {
        cluster: BTreeMap<&'a str, Vec<&'a str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        task: Option<Task>,
    }
    let out = Out {
        cluster: cluster.spec(),
        task,
    };
    println!("{}", serde_json::to_string(&out).expect("plain data"));
    Ok(Code::Ok)
}

/// Lists the peers once and resolves them. The own task is included when this process
/// runs in one of the matched pods (by --pod-name/$POD_NAME/$HOSTNAME) or is given by
/// --task-type/--task-index.
pub async fn resolve_once(
    kube_args: &KubeArgs,
    args: &ClusterArgs,
    cfg: &ClusterConfig,
) -> Result<(Cluster, Option<Task>), Failure> {
    let (client, default_ns) = crate::kube::client(kube_args.kubeconfig.as_deref()).await?;
    let own_ns = crate::kube::pod_namespace(kube_args, &default_ns);
    let scope = super::scope(args, &own_ns);
    let pods = list_peers(&client, &scope, cfg).await?;
    let refs: Vec<&Pod> = pods.iter().collect();
    let resolver = &cfg.resolver;

    // Like cluster_spec(): every matched pod must be ready now.
    for p in &refs {
        if is_live(p)
            && !resolver.types_of(p).is_empty()
            && readiness(p, resolver.ready, resolver.address).is_err()
        {
            return Err(Failure::new(
                Code::NotReady,
                format!(
                    "pod {:?} is not running; phase: {:?}",
                    p.metadata.name.as_deref().unwrap_or_default(),
                    phase(p)
                ),
            ));
        }
    }
    // Without --expect, the pods that exist are the cluster, as in TensorFlow.
    let mut expected = cfg.expected.clone();
    for job in &resolver.jobs {
        let n = refs
            .iter()
            .filter(|p| is_live(p) && resolver.types_of(p).contains(&job.task_type.as_str()))
            .count();
        expected.entry(job.task_type.clone()).or_insert(n);
    }
    let cluster = match resolver.assess(&refs, &expected)? {
        Assessment::Complete(c) => c,
        Assessment::Waiting(s) => {
            return Err(Failure::new(
                Code::NotReady,
                format!("peers not ready: {}", crate::wait::describe(&s)),
            ));
        }
    };
    let task = match &cfg.task_override {
        Some(t) => Some(resolver.own_task(&cluster, "", "", Some(t.clone()))?),
        None => crate::kube::pod_name(kube_args).and_then(|name| {
            cluster
                .tasks
                .values()
                .flatten()
                .find(|p| p.name == name && p.namespace == own_ns)
                .map(|p| Task {
                    task_type: p.task_type.clone(),
                    index: p.index,
                })
        }),
    };
    Ok((cluster, task))
}

/// One list per distinct selector, deduplicated by uid, parsed into the slim view.
async fn list_peers(
    client: &Client,
    scope: &Scope,
    cfg: &ClusterConfig,
) -> Result<Vec<Pod>, Failure> {
    let api = scope.api(client);
    let mut seen_sel = HashSet::new();
    let mut seen_uid = HashSet::new();
    let mut out = Vec::new();
    for sel in cfg.resolver.jobs.iter().flat_map(|j| &j.selectors) {
        let sel = sel.to_string();
        if !seen_sel.insert(sel.clone()) {
            continue;
        }
        let list = api
            .list(&ListParams::default().labels(&sel))
            .await
            .map_err(|e| classify(&e, "list", "pods", scope.label()))?;
        for PeerPod(p) in list.items {
            if seen_uid.insert(p.metadata.uid.clone().unwrap_or_default()) {
                out.push(p);
            }
        }
    }
    Ok(out)
}
