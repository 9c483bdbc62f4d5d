//! `trainlet exec [init flags] -- CMD ARGS...`: run the training command with TF_CONFIG
//! set. If the init container already wrote `<output-dir>/tf_config.json` it is reused;
//! otherwise `init` runs first, in this process.
//!
//! Without `--report` trainlet then replaces itself with CMD (execve), so CMD is the
//! container's main process and receives the kubelet's signals directly. With
//! `--report` it stays as CMD's parent to run the reporters in-process.

use std::os::unix::process::CommandExt;

use clap::Args;

use super::init::{InitArgs, InitConfig};
use crate::cli::ReportArgs;
use crate::tfconfig::{self, TF_CONFIG_FILE};
use crate::{Code, Failure};

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub init: InitArgs,

    /// Stay as CMD's parent and run the reporters (GPUs, ports, OOM kills of CMD and its
    /// children) in-process, forwarding signals to CMD.
    #[arg(long, env = "TRAINLET_REPORT")]
    pub report: bool,

    #[command(flatten)]
    pub report_args: ReportArgs,

    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub fn run(args: ExecArgs) -> Result<Code, Failure> {
    use crate::report::engine;
    // Every flag is checked before the wait for peers: a typo in a report flag must not
    // surface only after minutes of waiting.
    let report_cfg = args
        .report
        .then(|| engine::Config::from_args(engine::Mode::Exec, &args.report_args))
        .transpose()?;
    let path = args.init.output.output_dir.join(TF_CONFIG_FILE);
    let (json, tf) = if path.exists() {
        tfconfig::read_tf_config(&path)?
    } else {
        let cfg = InitConfig::from_args(&args.init)?;
        let out = super::runtime()?.block_on(super::init::init(&args.init, &cfg))?;
        (out.tf_config_json, out.tf_config)
    };
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("TF_CONFIG", &json)
        .env("TRAINLET_TASK_TYPE", &tf.task.task_type)
        .env("TRAINLET_TASK_INDEX", tf.task.index.to_string());
    if let Some(cfg) = report_cfg {
        return report(cfg, args, cmd, &tf);
    }
    // Only returns on failure.
    let err = cmd.exec();
    Err(spawn_failure(&args.command[0], &err))
}

/// `--report`: stay as CMD's parent, run the reporters in-process, forward signals,
/// and exit with CMD's code (or 128+signal).
fn report(
    cfg: crate::report::engine::Config,
    args: ExecArgs,
    cmd: std::process::Command,
    tf: &tfconfig::TfConfig,
) -> Result<Code, Failure> {
    use crate::report::engine;
    // The own task's server port, from TF_CONFIG: the port CMD is about to listen on.
    let own_port = tf
        .cluster
        .get(&tf.task.task_type)
        .and_then(|hosts| hosts.get(tf.task.index))
        .and_then(|addr| addr.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u16>().ok());
    let code = super::runtime()?.block_on(engine::exec(
        cfg,
        &args.init.kube,
        cmd,
        &args.command[0],
        own_port,
    ))?;
    std::process::exit(code);
}

/// Shell-compatible codes: 127 not found, 126 found but not executable.
pub(crate) fn spawn_failure(program: &str, err: &std::io::Error) -> Failure {
    let code = match err.kind() {
        std::io::ErrorKind::NotFound => Code::CommandNotFound,
        _ => Code::CannotExecute,
    };
    Failure::new(code, format!("cannot run {program:?}: {err}"))
}
