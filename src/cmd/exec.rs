//! `trainlet exec [init flags] -- CMD ARGS...`: run the training command with the
//! variables of `trainlet.env` set (TF_CONFIG and the selected frameworks'). If the init
//! container already wrote `<output-dir>/tf_config.json` its files are reused;
//! otherwise `init` runs first, in this process.
//!
//! Without `--report` trainlet then replaces itself with CMD (execve), so CMD is the
//! container's main process and receives the kubelet's signals directly. With
//! `--report` it stays as CMD's parent to run the reporters in-process, and ends with
//! CMD's status. With `--on-peer-change restart` it also keeps init's flags: after a
//! peer change, the init workflow runs again (wait, resolve, write) before CMD does.

use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::cli::args::ExecArgs;
use crate::cli::{explain, lower};
use crate::frameworks::envfile;
use crate::report::engine::{self, child::SpawnError};
use crate::report::restart::OnPeerChange;
use crate::tfconfig::{self, CLUSTER_FILE, ENV_FILE, TF_CONFIG_FILE, TfConfig};
use crate::{Exit, Failure, bootstrap};
use tracing::warn;

pub fn run(args: ExecArgs) -> Result<Exit, Failure> {
    let dir = args.init.output.output_dir.clone();
    let path = dir.join(TF_CONFIG_FILE);
    let resolving = !path.exists();
    let cluster_file = dir.join(CLUSTER_FILE);
    let cluster_file = (resolving || cluster_file.exists()).then_some(cluster_file.as_path());
    // Every flag is checked before the wait for peers: a typo in a report flag must not
    // surface only after minutes of waiting. A peer-change policy needs the reporter.
    let report = lower::exec_report_config(&args, cluster_file, resolving)?;
    let report = (args.report || args.on_peer_change != OnPeerChange::Report).then_some(report);
    // Resolving again after a peer change is the init workflow, with exec's own flags;
    // handing over to a sidecar, exec has no credentials and the sidecar moves the files.
    let handing_over = args.report_args.observations.is_some();
    let init_cfg = (resolving || (args.on_peer_change == OnPeerChange::Restart && !handing_over))
        .then(|| lower::init_config(&args.init))
        .transpose()?;
    let (env, tf) = match &init_cfg {
        Some(cfg) if resolving => {
            let out = super::runtime()?.block_on(bootstrap::run(cfg, explain::init))?;
            (out.env, out.tf_config)
        }
        _ => read_outputs(&dir)?,
    };
    let program = args.command[0].clone();
    let cmd = command(&args.command, env, &dir);
    if let Some(cfg) = report {
        let argv = args.command.clone();
        let dir = dir.clone();
        let respawn: engine::Respawn = Box::new(move || {
            let init_cfg = init_cfg.clone();
            let argv = argv.clone();
            let dir = dir.clone();
            Box::pin(async move {
                match init_cfg {
                    Some(init_cfg) if !handing_over => {
                        let out = bootstrap::run(&init_cfg, explain::init)
                            .await
                            .map_err(|e| Failure::new(e.code(), explain::init(&e)))?;
                        Ok(command(&argv, out.env, &init_cfg.output_dir))
                    }
                    // The sidecar moved the files.
                    _ => {
                        let (env, _) = read_outputs(&dir)?;
                        Ok(command(&argv, env, &dir))
                    }
                }
            })
        });
        let ended =
            super::runtime()?.block_on(engine::exec(cfg, cmd, &program, tf.own_port(), respawn))?;
        if let Some(why) = ended.reason(&program) {
            crate::termination::record(&why);
        }
        return Ok(Exit::Child(ended.code));
    }
    let mut cmd = cmd;
    // Only returns on failure.
    let source = cmd.exec();
    Err(SpawnError { program, source }.into())
}

/// The init container's files: trainlet.env holds what its --framework chose. A
/// tf_config.json alone (written by hand, or by an older init) gives TF_CONFIG.
fn read_outputs(dir: &Path) -> Result<(Vec<(String, String)>, TfConfig), Failure> {
    let (_, tf) = tfconfig::read_tf_config(&dir.join(TF_CONFIG_FILE))?;
    let env_file = dir.join(ENV_FILE);
    let env = if env_file.exists() {
        tfconfig::read_env(&env_file)?
    } else {
        tfconfig::tf_env(&tf)
    };
    Ok((env, tf))
}

/// CMD with the variables of trainlet.env, those that fit in an environment.
fn command(argv: &[String], env: Vec<(String, String)>, dir: &Path) -> std::process::Command {
    let (env, too_long) = envfile::fitting(env);
    for name in too_long {
        warn!(
            "{name} is longer than the kernel allows one environment variable (128 KiB) and is left out of CMD's environment; read it from {} instead",
            dir.display()
        );
    }
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env);
    cmd
}
