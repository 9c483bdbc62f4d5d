//! Unit tests of `--framework` inferred from the wrapped command's launcher: the config
//! that carries it, where the flag lands among init's, the note, and a second inject.

use clap::Parser;

use super::lower::inject_config;
use super::{Cli, Command};
use crate::inject::{Infer, InjectConfig, inject, yaml};

/// A Job whose container `train` runs `command`, and a second container `log`.
fn job(command: &str) -> String {
    format!(
        "apiVersion: batch/v1
kind: Job
metadata:
  name: ddp
spec:
  template:
    metadata:
      labels: {{app: ddp}}
    spec:
      restartPolicy: Never
      containers:
        - name: log
          image: busybox
          command: [torchrun, log.py]
        - name: train
          image: trainer:1
          command: {command}
"
    )
}

fn config(args: &[&str]) -> InjectConfig {
    let argv = ["trainlet", "inject", "--job", "worker=app=ddp"]
        .iter()
        .chain(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let Command::Inject(a) = cli.command else {
        unreachable!()
    };
    inject_config(&a).unwrap_or_else(|f| panic!("{}", f.message))
}

/// trainlet-init's and the sidecar's args, and the notes.
fn injected(src: &str, args: &[&str]) -> (serde_json::Value, serde_json::Value, Vec<String>) {
    let out = inject(src, &config(args)).unwrap();
    let chunks = yaml::split_documents(&out.yaml);
    let doc = yaml::to_json(&yaml::parse(&chunks[0]).unwrap()[0]);
    let inits = &doc["spec"]["template"]["spec"]["initContainers"];
    let notes = out.notes.iter().map(ToString::to_string).collect();
    (inits[0]["args"].clone(), inits[1]["args"].clone(), notes)
}

/// Only `--wrap` without `--framework` infers; any `--framework` (TensorFlow's too)
/// is written as given, or not at all for TensorFlow's alone.
#[test]
fn only_a_wrap_without_framework_infers() {
    let cfg = config(&["--wrap", "train", "--nnodes", "2:4"]);
    assert_eq!(
        cfg.infer,
        Some(Infer {
            at: 2,
            sidecar_args: Vec::new(),
        })
    );
    assert_eq!(cfg.sidecar_args, ["--port=8470"]);
    let cfg = config(&["--wrap", "train", "--port", "2222"]);
    assert_eq!(
        cfg.infer.map(|i| i.sidecar_args),
        Some(vec!["--port=2222".to_string()])
    );
    assert_eq!(
        config(&["--wrap", "train", "--framework", "tensorflow"]).infer,
        None
    );
    assert_eq!(
        config(&["--wrap", "train", "--framework", "jax"]).infer,
        None
    );
    assert_eq!(config(&[]).infer, None);
}

#[test]
fn the_inferred_framework_lands_where_the_flag_would_with_a_note() {
    let src = job("[sh, -c, \"mpirun -np 2 hostname && exec /opt/bin/torchrun t.py\"]");
    let (init, sidecar, notes) = injected(&src, &["--wrap", "train", "--nnodes", "2:4"]);
    assert_eq!(
        init,
        serde_json::json!([
            "--job=worker=app=ddp",
            "--install-to=/etc/trainlet/bin",
            "--framework=pytorch,mpi",
            "--nnodes=2:4"
        ])
    );
    assert_eq!(
        sidecar,
        serde_json::json!(["--observations=/run/trainlet-observed"])
    );
    assert_eq!(
        notes,
        [
            "document 1 (batch/v1 Job \"ddp\"): infers --framework pytorch,mpi from container \"train\"'s command (torchrun, mpirun): pass --framework to choose",
            "document 1 (batch/v1 Job \"ddp\"): injected",
        ]
    );
    // The same as --framework pytorch,mpi, which notes nothing.
    let given = injected(
        &src,
        &[
            "--wrap",
            "train",
            "--nnodes",
            "2:4",
            "--framework",
            "pytorch,mpi",
        ],
    );
    assert_eq!((given.0, given.1), (init, sidecar));
    assert_eq!(given.2, ["document 1 (batch/v1 Job \"ddp\"): injected"]);
}

/// Only the wrapped container counts (`log` runs torchrun too), and a plain `python`
/// keeps TensorFlow's default, with its port and without a note.
#[test]
fn a_plain_python_keeps_the_default() {
    let (init, sidecar, notes) = injected(&job("[python, -m, train]"), &["--wrap", "train"]);
    assert_eq!(
        init,
        serde_json::json!(["--job=worker=app=ddp", "--install-to=/etc/trainlet/bin"])
    );
    assert_eq!(
        sidecar,
        serde_json::json!(["--port=8470", "--observations=/run/trainlet-observed"])
    );
    assert_eq!(notes, ["document 1 (batch/v1 Job \"ddp\"): injected"]);
}

/// A second inject finds the launcher behind the first one's wrapper: the same output,
/// and the note again. One with another `--framework` replaces the inferred one and
/// says nothing is dropped (the flag is there, with its new value).
#[test]
fn a_second_inject_infers_the_same_through_the_wrapper() {
    let args = ["--wrap", "train"];
    let once = inject(&job("[deepspeed, train.py]"), &config(&args)).unwrap();
    let twice = inject(&once.yaml, &config(&args)).unwrap();
    assert_eq!(twice.yaml, once.yaml);
    assert_eq!(
        twice
            .notes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "document 1 (batch/v1 Job \"ddp\"): infers --framework pytorch from container \"train\"'s command (deepspeed): pass --framework to choose",
            "document 1 (batch/v1 Job \"ddp\"): already injected; unchanged",
        ]
    );
    let (init, _, notes) = injected(&once.yaml, &["--wrap", "train", "--framework", "jax"]);
    assert_eq!(init[2], "--framework=jax");
    assert_eq!(notes, ["document 1 (batch/v1 Job \"ddp\"): injected"]);
}

/// A template an earlier inject gave TensorFlow's default (its sidecar watching port
/// 8470) gets the launcher's frameworks from a new inject, and no note that it drops a
/// `--port` nobody passed: the sidecar's port follows init's `--port`, whose own drop
/// is noted with init's flags.
#[test]
fn inferring_after_tensorflows_default_drops_no_port() {
    let src = job("[torchrun, train.py]");
    let tf = inject(
        &src,
        &config(&["--wrap", "train", "--framework", "tensorflow"]),
    )
    .unwrap();
    let (init, sidecar, notes) = injected(&tf.yaml, &["--wrap", "train"]);
    assert_eq!(init[2], "--framework=pytorch");
    assert_eq!(
        sidecar,
        serde_json::json!(["--observations=/run/trainlet-observed"])
    );
    assert_eq!(
        notes,
        [
            "document 1 (batch/v1 Job \"ddp\"): infers --framework pytorch from container \"train\"'s command (torchrun): pass --framework to choose",
            "document 1 (batch/v1 Job \"ddp\"): injected",
        ]
    );
    let port = inject(&src, &config(&["--wrap", "train", "--port", "2222"])).unwrap();
    let (_, _, notes) = injected(&port.yaml, &["--wrap", "train"]);
    assert!(
        notes[1].ends_with("drops --port=2222 of an earlier inject: not in this one's flags, so the default applies; pass it again to keep it"),
        "{notes:?}"
    );
}
