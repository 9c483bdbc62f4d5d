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

use std::cell::Cell;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::SystemTime;

use crate::agent;
use crate::cli::exec_args::ExecArgs;
use crate::cli::values::{FailureAction, PeerChange};
use crate::cli::{explain, lower};
use crate::render::frameworks;
use crate::render::{CLUSTER_FILE, TF_CONFIG_FILE};
use crate::stall::progress::{HEARTBEAT_ENV, HEARTBEAT_FILE};
use crate::supervise::child::SpawnError;
use crate::supervise::child::{command, read_outputs};
use crate::supervise::launcher::{self, Verdict};
use crate::supervise::life::Ended;
use crate::supervise::lifecycle::Respawner;
use crate::supervise::lifecycle::Supervisor;
use crate::{Exit, Failure, bootstrap, kubeflow};
use tracing::warn;

pub fn run(args: ExecArgs) -> Result<Exit, Failure> {
    let dir = args.init.output.output_dir.clone();
    let path = dir.join(TF_CONFIG_FILE);
    let resolving = !path.exists();
    // exec's private directory, for the files of CMD's that no volume holds: made when
    // one needs it, removed when exec ends (dropped on return).
    let mut private = None;
    let (report, heartbeat, handing_over) = report_config(&args, &dir, resolving, &mut private)?;
    let permanent = lower::exec_permanent_codes(&args)?;
    let init_cfg = (resolving || (args.on_peer_change == PeerChange::Restart && !handing_over))
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
    let ports = frameworks::listen_ports(&env, tf.own_port());
    let kubeflow = report
        .as_ref()
        .filter(|(_, own)| own.progress.is_some() && !args.no_kubeflow_endpoint)
        .map(|_| lower::kube_settings(&args.init.kube))
        .transpose()?
        .and_then(|kube| kubeflow_endpoint(&mut private, &kube));
    let kubeflow_env = kubeflow.as_ref().map(|k| k.env.clone()).unwrap_or_default();
    let with_heartbeat = move |mut cmd: std::process::Command| {
        if let Some(h) = &heartbeat {
            cmd.env(HEARTBEAT_ENV, h);
        }
        cmd.envs(kubeflow_env.iter().map(|(k, v)| (k, v)));
        cmd
    };
    let cmd = with_heartbeat(command(&args.command, env, &dir));
    let Some((cfg, own)) = report else {
        let mut cmd = cmd;
        // Only returns on failure.
        let source = cmd.exec();
        return Err(SpawnError { program, source }.into());
    };
    // Where CMD (torchrun, a worker's `@record`) writes its root cause: the user's
    // TORCHELASTIC_ERROR_FILE, else a file of exec's own.
    let cause = Cause {
        error_file: error_file(&mut private),
        started: Rc::new(Cell::new(SystemTime::now())),
        argv: args.command.clone(),
    };
    let cmd = cause.env(cmd);
    let respawner = Respawner {
        argv: args.command.clone(),
        dir: dir.clone(),
        init: init_cfg.filter(|_| !handing_over),
        prepare: Box::new({
            let cause = cause.clone();
            move |cmd| {
                cause.started.set(SystemTime::now());
                cause.env(with_heartbeat(cmd))
            }
        }),
        explain: explain::init,
        retried: Box::new({
            let (cause, program) = (cause.clone(), program.clone());
            move |code| cause.retried(code, &program, &permanent)
        }),
    };
    let ended = super::runtime()?.block_on(async {
        let (mut reporter, mut signals, cmd) =
            agent::exec_reporter(cfg, own, cmd, &program, ports, kubeflow).await?;
        Supervisor::new(cmd, respawner)
            .run(&mut reporter, &mut signals)
            .await
    })?;
    let (code, why) = cause.exit(&ended, &program);
    if let Some(why) = why {
        crate::termination::record(&why);
    }
    Ok(Exit::Child(code))
}

/// What exec's agent is to do: what either agent does, and exec's own flags.
type ExecAgent = (agent::Config, agent::ExecConfig);

/// The reporter's config, where exec stays CMD's parent (`--report`, or a flag that
/// needs it), with the heartbeat file CMD may touch; and whether exec hands over to a
/// sidecar. Every flag is checked before the wait for peers: a typo in a report flag
/// must not surface only after minutes of waiting.
fn report_config(
    args: &ExecArgs,
    dir: &Path,
    resolving: bool,
    private: &mut Option<tempfile::TempDir>,
) -> Result<(Option<ExecAgent>, Option<PathBuf>, bool), Failure> {
    let cluster_file = dir.join(CLUSTER_FILE);
    let cluster_file = (resolving || cluster_file.exists()).then_some(cluster_file.as_path());
    let (report, mut own) = lower::exec_report_config(args, cluster_file, resolving)?;
    // Resolving again after a peer change is the init workflow, with exec's own flags;
    // handing over to a sidecar, exec has no credentials and the sidecar moves the files.
    let handing_over = own.hands_over();
    // The heartbeat file CMD may touch: in the observation volume, which both CMD's
    // container and exec write, else in the private directory.
    let heartbeat = own.progress.as_ref().and_then(|_| {
        heartbeat_file(args.report_args.observations.as_deref(), private)
            .map_err(|e| warn!("no heartbeat file for the command: {e}"))
            .ok()
    });
    if let Some(p) = own.progress.as_mut() {
        p.heartbeat = heartbeat.clone();
    }
    let report = (args.report
        || args.on_peer_change != PeerChange::Report
        || args.on_failure != FailureAction::Exit
        || own.progress.is_some())
    .then_some((report, own));
    Ok((report, heartbeat, handing_over))
}

/// CMD's root cause, as a launcher (torchrun, a worker's `@record`) writes it: where
/// (the user's TORCHELASTIC_ERROR_FILE, or exec's own, which CMD is given), and since
/// when CMD last started (an error file from before is a previous run's).
#[derive(Clone)]
struct Cause {
    /// The file, and whether it is exec's own.
    error_file: Option<(PathBuf, bool)>,
    started: Rc<Cell<SystemTime>>,
    argv: Vec<String>,
}

impl Cause {
    /// `cmd` with exec's own error file in its environment.
    fn env(&self, mut cmd: std::process::Command) -> std::process::Command {
        if let Some((path, true)) = &self.error_file {
            cmd.env(launcher::ERROR_FILE_ENV, path);
        }
        cmd
    }

    /// The root cause CMD's last run wrote, if any.
    fn read(&self) -> Option<launcher::RootCause> {
        self.error_file
            .as_ref()
            .and_then(|(p, _)| launcher::read_root_cause(p, self.started.get()))
    }

    /// A failure worth a retry (--on-failure restart), in words: how CMD ended and its
    /// root cause; none for a permanent code or root cause.
    fn retried(&self, code: i32, program: &str, permanent: &[i32]) -> Option<String> {
        let how = Ended {
            code,
            oom: None,
            why: None,
        }
        .reason(program)?;
        let cause = self.read();
        let verdict = launcher::classify(launcher::launcher(&self.argv), code, cause.as_ref());
        (!permanent.contains(&verdict.code(code)))
            .then(|| launcher::reason(&how, cause.as_ref(), Verdict::PassOn))
    }

    /// exec's exit code and why: for a launcher's exit 1, what its root cause says
    /// (exec's own reasons, a peer change or a stall, stand as they are).
    fn exit(&self, ended: &Ended, program: &str) -> (i32, Option<String>) {
        match ended.reason(program) {
            Some(how) if ended.why.is_none() => {
                let cause = self.read();
                let verdict =
                    launcher::classify(launcher::launcher(&self.argv), ended.code, cause.as_ref());
                let why = launcher::reason(&how, cause.as_ref(), verdict);
                if verdict != Verdict::PassOn || cause.is_some() {
                    warn!("{why}");
                }
                (verdict.code(ended.code), Some(why))
            }
            why => (ended.code, why),
        }
    }
}

/// Creates the heartbeat file (empty, so that `touch` and writes alike work) and
/// returns its path: in the observation volume, else in exec's private directory.
fn heartbeat_file(
    observations: Option<&Path>,
    private: &mut Option<tempfile::TempDir>,
) -> std::io::Result<PathBuf> {
    let dir = match observations {
        Some(d) => d.to_path_buf(),
        None => private_dir(private)?,
    };
    let path = dir.join(HEARTBEAT_FILE);
    create_regular(&path)?;
    Ok(path)
}

/// Creates `path`, or opens it as it is (a heartbeat from an earlier exec keeps its
/// contents): never through a symlink, never blocking on a FIFO, and only a regular
/// file will do.
fn create_regular(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(())
}

/// Kubeflow Trainer's progress endpoint for CMD, its files in exec's private
/// directory; none where CMD already has Trainer's variables (Trainer's own endpoint)
/// or it cannot be made (said, and CMD runs without it). The path names the pod's
/// namespace and the pod (as --pod-namespace and --pod-name default): without Trainer
/// there is no TrainJob.
fn kubeflow_endpoint(
    private: &mut Option<tempfile::TempDir>,
    kube: &crate::kube::Settings,
) -> Option<kubeflow::server::Prepared> {
    let set = [
        kubeflow::URL_ENV,
        kubeflow::CA_CERT_ENV,
        kubeflow::TOKEN_ENV,
    ]
    .into_iter()
    .find(|v| std::env::var_os(v).is_some());
    if let Some(v) = set {
        tracing::info!("{v} is set: the command reports to that Kubeflow endpoint, not to exec's");
        return None;
    }
    let namespace = kube.pod_namespace("default");
    let name = kube.pod_name().unwrap_or_else(|| "trainlet".into());
    private_dir(private)
        .map_err(|source| kubeflow::KubeflowError::Write {
            path: std::env::temp_dir().display().to_string(),
            source,
        })
        .and_then(|dir| kubeflow::server::prepare(&dir, &namespace, &name))
        .map_err(|e| warn!("no Kubeflow progress endpoint for the command: {e}"))
        .ok()
}

/// A directory of this exec's own, for files CMD writes to it.
/// A new one of random name and mode 0700 in $TMPDIR, made on first use and removed
/// when `private` is dropped. A name anyone can predict (`trainlet-<pid>`, once) could
/// be taken first, by a directory or a symlink leading exec to truncate another file,
/// and it stayed behind.
fn private_dir(private: &mut Option<tempfile::TempDir>) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match private.take() {
        Some(d) => d,
        None => tempfile::Builder::new()
            .prefix("trainlet-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()?,
    };
    let path = dir.path().to_path_buf();
    *private = Some(dir);
    Ok(path)
}

/// The error file torch's elastic launcher and `@record` write the root cause to:
/// `TORCHELASTIC_ERROR_FILE` if the user set it (`false`: exec leaves it as it is),
/// else one in exec's private directory (`true`: exec sets it for CMD).
fn error_file(private: &mut Option<tempfile::TempDir>) -> Option<(PathBuf, bool)> {
    if let Some(p) = std::env::var_os(launcher::ERROR_FILE_ENV).filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(p), false));
    }
    match private_dir(private) {
        Ok(d) => Some((d.join(launcher::ERROR_FILE), true)),
        Err(e) => {
            warn!("no {} for the command: {e}", launcher::ERROR_FILE_ENV);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;

    /// exec once made `$TMPDIR/trainlet-<pid>/heartbeat`, following a symlink planted
    /// there: its victim was truncated to 0 bytes, and the directory stayed.
    #[test]
    fn a_symlink_planted_at_the_old_predictable_path_truncates_nothing() {
        let elsewhere = tempfile::tempdir().unwrap();
        let victim = elsewhere.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let old = std::env::temp_dir().join(format!("trainlet-{}", std::process::id()));
        std::fs::create_dir_all(&old).unwrap();
        symlink(&victim, old.join(HEARTBEAT_FILE)).unwrap();
        let mut private = None;
        let made = heartbeat_file(None, &mut private);
        std::fs::remove_dir_all(&old).unwrap();
        let path = made.unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        // The error file for torch's launcher shares the directory.
        assert_eq!(
            error_file(&mut private),
            Some((path.with_file_name(launcher::ERROR_FILE), true))
        );
        let dir = private.unwrap();
        assert_eq!(path, dir.path().join(HEARTBEAT_FILE));
        assert_eq!(dir.path().parent(), Some(std::env::temp_dir().as_path()));
        assert_ne!(dir.path(), old);
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        let kept = dir.path().to_path_buf();
        drop(dir);
        assert!(!kept.exists());
    }

    /// In the observation volume, which CMD's container writes too: an existing
    /// heartbeat is kept as it is; a symlink or a FIFO there is refused, not followed.
    #[test]
    fn in_the_observation_volume_a_symlink_or_fifo_is_refused() {
        let obs = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let victim = elsewhere.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let beat = obs.path().join(HEARTBEAT_FILE);
        symlink(&victim, &beat).unwrap();
        let mut private = None;
        let e = heartbeat_file(Some(obs.path()), &mut private).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: Too many levels of symbolic links (os error 40)",
                beat.display()
            )
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_file(&beat).unwrap();
        nix::unistd::mkfifo(&beat, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(heartbeat_file(Some(obs.path()), &mut private).is_err());
        std::fs::remove_file(&beat).unwrap();
        std::fs::write(&beat, "beat").unwrap();
        let path = heartbeat_file(Some(obs.path()), &mut private).unwrap();
        assert_eq!((path, private.is_none()), (beat.clone(), true));
        assert_eq!(std::fs::read_to_string(&beat).unwrap(), "beat");
    }
}
