//! `trainlet resolve`: TensorFlow's `cluster_spec()`. One list per selector, no waiting:
//! a matched pod that is not ready is an error (exit 3), as in the resolver.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cli::args::ResolveArgs;
use crate::cli::lower;
use crate::cluster::Task;
use crate::peers::{Scope, resolve_now};
use crate::{Exit, Failure, kube};

pub fn run(args: ResolveArgs) -> Result<Exit, Failure> {
    let cfg = lower::cluster_config(&args.cluster)?;
    let settings = lower::kube_settings(&args.kube)?;
    let (cluster, task) = super::runtime()?.block_on(async {
        let (client, default_ns) = kube::client(settings.kubeconfig.as_deref()).await?;
        let own_ns = settings.pod_namespace(&default_ns);
        let scope = Scope::of(&cfg.namespaces, &own_ns);
        // The own task is shown when this process runs in one of the matched pods.
        let own_name = settings.pod_name();
        let own = own_name.as_deref().map(|n| (n, own_ns.as_str()));
        Ok::<_, Failure>(resolve_now(&client, &scope, &cfg, own).await?)
    })?;
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
    Ok(Exit::OK)
}
