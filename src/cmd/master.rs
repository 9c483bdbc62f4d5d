//! `trainlet master`: TensorFlow's `master(task_type, task_id, rpc_layer)`. Reads
//! `<output-dir>/cluster.json` when `init` wrote one, else resolves like `resolve`.

use std::collections::BTreeMap;

use crate::cli::args::MasterArgs;
use crate::cli::lower;
use crate::peers::{Scope, resolve_now};
use crate::render::{self, CLUSTER_FILE, master_url};
use crate::{Code, Exit, Failure, kube};

pub fn run(args: MasterArgs) -> Result<Exit, Failure> {
    let (task, cluster_args) = lower::master_query(&args.cluster)?;
    let file = args.output_dir.join(CLUSTER_FILE);
    let cluster: BTreeMap<String, Vec<String>> = if file.exists() {
        render::read_cluster_file(&file)?.cluster
    } else {
        let cfg = lower::cluster_config(&cluster_args)?;
        let settings = lower::kube_settings(&args.kube)?;
        let (c, _) = super::runtime()?.block_on(async {
            let (client, default_ns) = kube::client(settings.kubeconfig.as_deref()).await?;
            let scope = Scope::of(&cfg.namespaces, &settings.pod_namespace(&default_ns));
            Ok::<_, Failure>(resolve_now(&client, &scope, &cfg, None).await?)
        })?;
        c.spec()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
            .collect()
    };
    let Some(tasks) = cluster.get(&task.task_type) else {
        let known: Vec<&str> = cluster.keys().map(String::as_str).collect();
        return Err(Failure::new(
            Code::Inconsistent,
            format!(
                "task type {:?} is not in the cluster (types: {})",
                task.task_type,
                known.join(", ")
            ),
        ));
    };
    let Some(address) = tasks.get(task.index) else {
        return Err(Failure::new(
            Code::Inconsistent,
            format!(
                "task {}/{} is not in the cluster: {} has {} tasks",
                task.task_type,
                task.index,
                task.task_type,
                tasks.len()
            ),
        ));
    };
    println!("{}", master_url(&args.cluster.rpc_layer, address));
    Ok(Exit::OK)
}
