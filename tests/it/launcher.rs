//! `exec --report` and a launcher's exit: a launcher (torchrun, mpirun, …) that exits 1
//! ends exec with 9 (retryable) unless the root cause in `TORCHELASTIC_ERROR_FILE` is
//! permanent; the root cause is in the termination message. Fake launchers (shell
//! scripts named as the real ones) write the file as torch's error handler does; the
//! real torchrun of the framework venv runs a worker that raises.

use std::path::{Path, PathBuf};

use crate::frameworks::fixture;
use crate::support::*;

/// An executable script `name` in `dir` that runs `body` with sh.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// What torchrun's agent writes into its TORCHELASTIC_ERROR_FILE when a worker
/// decorated with `@record` raised: the worker's file, with `errorCode` added.
fn torch_error(message: &str) -> String {
    serde_json::json!({"message": {
        "message": message,
        "extraInfo": {"py_callstack": format!("Traceback (most recent call last):\n  File \"train.py\", line 3, in main\n{message}\n"), "timestamp": "1764080000"},
        "errorCode": 1
    }})
    .to_string()
}

/// Runs `exec --report -- argv` outside a pod; returns (exit code, termination
/// message, stderr).
fn exec(dir: &Path, argv: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    write_tf_config(dir, free_port());
    let termination = dir.join("termination-log");
    std::fs::write(&termination, "").unwrap();
    let mut cmd = trainlet();
    cmd.args(["exec", "--report", "--metrics-addr", "off", "--output-dir"])
        .arg(dir)
        .arg("--")
        .args(argv)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("TRAINLET_TERMINATION_LOG", &termination)
        .env_remove("TORCHELASTIC_ERROR_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let r = run(&mut cmd);
    let message = std::fs::read_to_string(&termination).unwrap();
    (r.code, message, r.stderr)
}

#[test]
fn a_launchers_transient_exit_1_ends_exec_with_9_and_its_root_cause() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "printf '%s' '{}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1",
        torch_error("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    );
    let torchrun = script(dir.path(), "torchrun", &body);
    let (code, message, stderr) = exec(dir.path(), &[torchrun.to_str().unwrap(), "train.py"], &[]);
    assert_eq!(code, 9, "{stderr}");
    assert_eq!(
        message,
        format!(
            "{} exited with code 1; root cause: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; exit 9 (retryable): a launcher exits 1 for any worker's failure",
            torchrun.display()
        )
    );
}

#[test]
fn a_launchers_exit_1_with_a_permanent_root_cause_stays_1() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "printf '%s' '{}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1",
        torch_error("ModuleNotFoundError: No module named tansformers")
    );
    let torchrun = script(dir.path(), "torchrun", &body);
    let (code, message, stderr) = exec(dir.path(), &[torchrun.to_str().unwrap(), "train.py"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        message,
        format!(
            "{} exited with code 1; root cause: ModuleNotFoundError: No module named tansformers; exit 1 (permanent): a ModuleNotFoundError repeats on a retry",
            torchrun.display()
        )
    );
}

/// mpirun writes no error file: its exit 1 is retryable. A plain command's exit 1
/// passes on, with a root cause if it left one (a script with `@record`), and a user's
/// own TORCHELASTIC_ERROR_FILE is the one exec reads.
#[test]
fn no_root_cause_a_plain_command_and_the_users_error_file() {
    let dir = tempfile::tempdir().unwrap();
    let mpirun = script(dir.path(), "mpirun", "exit 1");
    let (code, message, stderr) = exec(
        dir.path(),
        &[mpirun.to_str().unwrap(), "-np", "2", "./a.out"],
        &[],
    );
    assert_eq!(code, 9, "{stderr}");
    assert_eq!(
        message,
        format!(
            "{} exited with code 1; exit 9 (retryable): a launcher exits 1 for any worker's failure",
            mpirun.display()
        )
    );
    let own = dir.path().join("own-error.json");
    let body = format!(
        "test \"$TORCHELASTIC_ERROR_FILE\" = '{}' || exit 3; printf '%s' '{}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 1",
        own.display(),
        torch_error("ValueError: bad learning rate")
    );
    let train = script(dir.path(), "train", &body);
    let (code, message, stderr) = exec(
        dir.path(),
        &[train.to_str().unwrap()],
        &[("TORCHELASTIC_ERROR_FILE", &own)],
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        message,
        format!(
            "{} exited with code 1; root cause: ValueError: bad learning rate",
            train.display()
        )
    );
    // An error file from before CMD started is not this run's.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let stale = dir.path().join("stale-error.json");
    std::fs::write(&stale, torch_error("SyntaxError: invalid syntax")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let torchrun = script(dir.path(), "torchrun", "exit 1");
    let (code, message, stderr) = exec(
        dir.path(),
        &[torchrun.to_str().unwrap()],
        &[("TORCHELASTIC_ERROR_FILE", &stale)],
    );
    assert_eq!(code, 9, "{stderr}");
    assert_eq!(
        message,
        format!(
            "{} exited with code 1; exit 9 (retryable): a launcher exits 1 for any worker's failure",
            torchrun.display()
        )
    );
}

/// The real torchrun: its worker, decorated with `@record`, raises; torchrun exits 1
/// and copies the worker's error into exec's file. A typo in an import stays 1
/// (permanent); a broken collective's RuntimeError becomes 9.
#[test]
fn real_torchrun_a_workers_import_error_is_permanent_a_collectives_is_not() {
    let py = require!(framework_python());
    let torchrun = py.with_file_name("torchrun").display().to_string();
    let worker = fixture("torch_raise.py");
    for (kind, want_code, cause, verdict) in [
        (
            "import",
            1,
            "ModuleNotFoundError: No module named 'tansformers'",
            "exit 1 (permanent): a ModuleNotFoundError repeats on a retry",
        ),
        (
            "nccl",
            9,
            "RuntimeError: NCCL communicator was aborted on rank 0.",
            "exit 9 (retryable): a launcher exits 1 for any worker's failure",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let argv = [
            torchrun.as_str(),
            "--standalone",
            "--nproc-per-node",
            "1",
            worker.as_str(),
            kind,
        ];
        let (code, message, stderr) = exec(dir.path(), &argv, &[]);
        assert_eq!(code, want_code, "{kind}: {stderr}");
        assert_eq!(
            message,
            format!("{torchrun} exited with code 1; root cause: {cause}; {verdict}"),
            "{kind}"
        );
    }
}
