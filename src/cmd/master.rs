//! `trainlet master`: TensorFlow's `master(task_type, task_id, rpc_layer)`. Reads
//! `<output-dir>/cluster.json` when `init` wrote one, else resolves like `resolve`.

use std::path::PathBuf;

use clap::Args;

use super::ClusterConfig;
use crate::cli::{ClusterArgs, KubeArgs};
use crate::tfconfig::{self, CLUSTER_FILE, master_url};
use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct MasterArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Directory where `trainlet init` wrote cluster.json.
    #[arg(
        long,
        env = "TRAINLET_OUTPUT_DIR",
        value_name = "DIR",
        default_value = "/etc/trainlet"
    )]
    pub output_dir: PathBuf,
}

pub fn run(args: MasterArgs) -> Result<Code, Failure> {
    let (Some(task_type), Some(index)) = (args.cluster.task_type.clone(), args.cluster.task_index)
    else {
        return Err(Failure::usage(
            "trainlet master needs --task-type TYPE and --task-id I",
        ));
    };
    let file = args.output_dir.join(CLUSTER_FILE);
    let cluster: std::collections::BTreeMap<String, Vec<String>> = if file.exists() {
        tfconfig::read_cluster_file(&file)?.cluster
    } else {
        let mut cluster_args = args.cluster.clone();
        // The task flags select the master here; they are no override of the own task.
        cluster_args.task_type = None;
        cluster_args.task_index = None;
        let cfg = ClusterConfig::from_args(&cluster_args)?;
        let (c, _) = super::runtime()?.block_on(super::resolve::resolve_once(
            &args.kube,
            &cluster_args,
            &cfg,
        ))?;
        c.spec()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
            .collect()
    };
    let Some(tasks) = cluster.get(&task_type) else {
        let known: Vec<&str> = cluster.keys().map(String::as_str).collect();
        return Err(Failure::new(
            Code::Inconsistent,
            format!(
                "task type {task_type:?} is not in the cluster (types: {})",
                known.join(", ")
            ),
        ));
    };
    let Some(address) = tasks.get(index) else {
        return Err(Failure::new(
            Code::Inconsistent,
            format!(
                "task {task_type}/{index} is not in the cluster: {task_type} has {} tasks",
                tasks.len()
            ),
        ));
    };
    println!("{}", master_url(&args.cluster.rpc_layer, address));
    Ok(Code::Ok)
}
