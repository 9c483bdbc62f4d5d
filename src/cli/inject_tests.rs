//! Unit tests of inject's pure part: exact output for fixtures, idempotence,
//! pass-through, every supported kind, --wrap, bad YAML, and that the shipped examples
//! are exactly what inject makes of their originals.

use clap::Parser;

use super::explain;
use super::lower::inject_config;
use super::{Cli, Command};
use crate::inject::{InjectConfig, TransformError, inject, yaml};
use crate::{Code, Failure};

const MIXED: &str = include_str!("../../tests/fixtures/inject/mixed.yaml");
const MIXED_INJECTED: &str = include_str!("../../tests/fixtures/inject/mixed.injected.yaml");
const CRONJOB: &str = include_str!("../../tests/fixtures/inject/cronjob.yaml");
const LIST: &str = include_str!("../../tests/fixtures/inject/list.yaml");
const IMPLICIT: &str = include_str!("../../tests/fixtures/inject/implicit-entrypoint.yaml");
const BAD: &str = include_str!("../../tests/fixtures/inject/bad.yaml");

/// The config that `trainlet inject ARGS` would use.
fn config(args: &[&str]) -> InjectConfig {
    let argv = ["trainlet", "inject"].iter().chain(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let Command::Inject(a) = cli.command else {
        unreachable!()
    };
    inject_config(&a).unwrap_or_else(|f| panic!("{}", f.message))
}

fn config_err(args: &[&str]) -> Failure {
    let argv = ["trainlet", "inject"].iter().chain(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let Command::Inject(a) = cli.command else {
        unreachable!()
    };
    inject_config(&a).unwrap_err()
}

fn docs(src: &str) -> Vec<serde_json::Value> {
    yaml::split_documents(src)
        .iter()
        .flat_map(|c| yaml::parse(c).unwrap())
        .map(|n| yaml::to_json(&n))
        .collect()
}

fn pod_spec(doc: &serde_json::Value) -> &serde_json::Value {
    match doc["kind"].as_str().unwrap() {
        "Pod" => &doc["spec"],
        "CronJob" => &doc["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &doc["spec"]["template"]["spec"],
    }
}

fn names(containers: &serde_json::Value) -> Vec<&str> {
    containers
        .as_array()
        .map(|a| a.iter().map(|c| c["name"].as_str().unwrap()).collect())
        .unwrap_or_default()
}

#[test]
fn mixed_fixture_gives_exactly_the_golden_output() {
    let cfg = config(&["--job", "worker=app=trainer", "--wrap", "train"]);
    let out = inject(MIXED, &cfg).unwrap();
    assert_eq!(out.yaml, MIXED_INJECTED);
    let notes: Vec<String> = out.notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "document 1 (v1 ConfigMap \"settings\"): no pod template; passed through unchanged",
            "document 2 (apps/v1 Deployment \"trainer\"): injected",
            "document 3 (v1 Service \"trainer\"): no pod template; passed through unchanged",
            "document 4 (batch.volcano.sh/v1alpha1 Job \"not-a-batch-job\"): no pod template; passed through unchanged",
        ]
    );
}

#[test]
fn injecting_twice_is_byte_identical_to_injecting_once() {
    let configs = [
        config(&["--job", "worker=app=trainer", "--wrap", "train"]),
        config(&["--job", "worker=app=trainer", "--classic-sidecar"]),
        config(&[
            "--job",
            "worker=app=trainer",
            "--expect",
            "worker=2",
            "--address",
            "dns",
            "--port",
            "2222",
            "--output-dir",
            "/var/run/trainlet",
            "--timeout",
            "30m",
        ]),
    ];
    for cfg in &configs {
        for src in [MIXED, CRONJOB, LIST] {
            let once = inject(src, cfg).unwrap();
            let twice = inject(&once.yaml, cfg).unwrap();
            assert_eq!(twice.yaml, once.yaml, "{cfg:?}\n{src}");
            assert!(
                twice.notes.iter().all(|n| !n.text.starts_with("injected")),
                "{:?}",
                twice.notes
            );
        }
    }
}

#[test]
fn other_kinds_and_unknown_fields_pass_through() {
    let cfg = config(&["--job", "worker=app=trainer"]);
    let out = inject(MIXED, &cfg).unwrap();
    let chunks = yaml::split_documents(&out.yaml);
    let input = yaml::split_documents(MIXED);
    // ConfigMap, Service and the custom resource: byte for byte, comments included.
    for i in [0, 2, 3] {
        assert_eq!(chunks[i].text, input[i].text);
    }
    let before = &docs(MIXED)[1];
    let after = &docs(&out.yaml)[1];
    assert_eq!(after["spec"]["futureField"], before["spec"]["futureField"]);
    assert_eq!(
        pod_spec(after)["someFutureSpecField"],
        serde_json::json!([1, 2])
    );
    assert_eq!(after["metadata"], before["metadata"]);
    // YAML 1.1 meanings survive the rewrite: octal mode, quoted "on", quoted '1.0'.
    assert_eq!(
        pod_spec(after)["volumes"][0]["configMap"]["defaultMode"],
        420
    );
    let env = &pod_spec(after)["containers"][0]["env"];
    assert_eq!(env[0]["value"], "on");
    assert_eq!(env[1]["value"], "1.0");
    // The user's init container stays, after trainlet's.
    assert_eq!(
        names(&pod_spec(after)["initContainers"]),
        ["trainlet-init", "trainlet", "fetch-data"]
    );
    assert_eq!(
        pod_spec(after)["initContainers"][2]["command"][2],
        "echo fetching\necho done\n"
    );
}

#[test]
fn a_cronjob_is_injected_at_its_job_template() {
    let cfg = config(&["--job", "worker=app=nightly", "--wrap", "train"]);
    let out = inject(CRONJOB, &cfg).unwrap();
    let d = &docs(&out.yaml)[0];
    let spec = pod_spec(d);
    assert_eq!(
        names(&spec["initContainers"]),
        ["trainlet-init", "trainlet"]
    );
    assert_eq!(spec["initContainers"][1]["restartPolicy"], "Always");
    assert_eq!(spec["serviceAccountName"], "trainlet");
    assert_eq!(
        spec["containers"][0]["command"],
        serde_json::json!([
            "/etc/trainlet/bin/trainlet",
            "exec",
            "--report",
            "--",
            "python",
            "train.py"
        ])
    );
    let meta = &d["spec"]["jobTemplate"]["spec"]["template"]["metadata"];
    assert_eq!(meta["annotations"]["prometheus.io/port"], "9464");
    assert_eq!(d["spec"]["schedule"], "0 3 * * *");
}

#[test]
fn a_list_is_injected_item_by_item() {
    let cfg = config(&["--job", "worker=app=solo"]);
    let out = inject(LIST, &cfg).unwrap();
    let d = &docs(&out.yaml)[0];
    let items = d["items"].as_array().unwrap();
    assert_eq!(
        names(&items[0]["spec"]["initContainers"]),
        ["trainlet-init", "trainlet"]
    );
    assert_eq!(
        items[0]["spec"]["containers"][0]["volumeMounts"],
        serde_json::json!([{"name": "trainlet", "mountPath": "/etc/trainlet", "readOnly": true}])
    );
    assert_eq!(
        items[1],
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "b"}})
    );
    let notes: Vec<String> = out.notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "document 1 (v1 Pod \"solo\"): injected",
            "document 1 (v1 ConfigMap \"cm\"): no pod template; passed through unchanged",
        ]
    );
}

#[test]
fn classic_and_native_sidecars_replace_each_other() {
    let native = config(&["--job", "worker=app=trainer"]);
    let classic = config(&["--job", "worker=app=trainer", "--classic-sidecar"]);
    let a = inject(MIXED, &classic).unwrap();
    let spec = pod_spec(&docs(&a.yaml)[1]).clone();
    assert_eq!(names(&spec["containers"]), ["train", "trainlet"]);
    assert_eq!(
        names(&spec["initContainers"]),
        ["trainlet-init", "fetch-data"]
    );
    assert_eq!(
        spec["containers"][1]["args"],
        serde_json::json!(["--port=8470", "--exit-with-main"])
    );
    assert!(spec["containers"][1].get("restartPolicy").is_none());
    // Back to native: the same as injecting the original natively.
    let b = inject(&a.yaml, &native).unwrap();
    assert_eq!(b.yaml, inject(MIXED, &native).unwrap().yaml);
}

#[test]
fn wrap_needs_an_explicit_command() {
    let cfg = config(&["--job", "worker=app=x", "--wrap", "train"]);
    let err = inject(IMPLICIT, &cfg).unwrap_err();
    assert_eq!(
        explain::transform(&err),
        "cannot --wrap container \"train\" of batch/v1 Job \"implicit\" (document 1): it has no `command`, so it runs its image's ENTRYPOINT, which inject cannot see; give the program explicitly, e.g. `command: [python, train.py]`, and inject again"
    );
    let cfg = config(&["--job", "worker=app=x", "--wrap", "trainer"]);
    let err = inject(MIXED, &cfg).unwrap_err();
    assert_eq!(
        explain::transform(&err),
        "--wrap \"trainer\": no pod template has a container of that name (found: train)"
    );
    // Without --wrap the same template is fine: args stay as they are.
    let cfg = config(&["--job", "worker=app=x"]);
    let out = inject(IMPLICIT, &cfg).unwrap();
    let spec = pod_spec(&docs(&out.yaml)[0]).clone();
    assert_eq!(
        spec["containers"][0]["args"],
        serde_json::json!(["--epochs", "3"])
    );
    assert!(spec["containers"][0].get("command").is_none());
}

#[test]
fn wrap_keeps_args_and_puts_the_command_after_the_separator() {
    let cfg = config(&["--job", "worker=app=trainer", "--wrap", "train"]);
    let out = inject(MIXED, &cfg).unwrap();
    let d = docs(&out.yaml);
    let c = &pod_spec(&d[1])["containers"][0];
    assert_eq!(
        c["command"],
        serde_json::json!([
            "/etc/trainlet/bin/trainlet",
            "exec",
            "--report",
            "--",
            "python"
        ])
    );
    assert_eq!(c["args"], serde_json::json!(["train.py", "--epochs", "10"]));
    let env: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        env,
        [
            "FLAG",
            "RATE",
            "POD_NAME",
            "POD_NAMESPACE",
            "POD_UID",
            "TRAINLET_METRICS_ADDR",
            "TRAINLET_OBSERVATIONS"
        ]
    );
}

#[test]
fn bad_yaml_names_the_document_and_line() {
    let cfg = config(&["--job", "worker=app=x"]);
    let err = inject(BAD, &cfg).unwrap_err();
    let TransformError::Syntax { doc, line, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((*doc, *line), (2, 12), "{err}");
    assert!(
        err.to_string()
            .starts_with("invalid YAML in document 2 at line 12, column 3: "),
        "{err}"
    );
}

#[test]
fn init_flags_are_passed_through_only_when_set() {
    let cfg = config(&["--job", "ps=job-name=p", "--job", "worker=job-name=w"]);
    assert_eq!(
        cfg.init_args,
        [
            "--job=ps=job-name=p",
            "--job=worker=job-name=w",
            "--install-to=/etc/trainlet/bin"
        ]
    );
    let cfg = config(&[
        "--job-to-label-mapping",
        r#"{"worker":["app=w"]}"#,
        "--expect",
        "worker=4",
        "--namespace",
        "ml",
        "--port",
        "2222",
        "--port-name",
        "tfjob-port",
        "--address",
        "host-ip",
        "--cluster-domain",
        "corp.local",
        "--order",
        "name",
        "--ready",
        "ready",
        "--rpc-layer",
        "grpc+verbs",
        "--environment",
        "cloud",
        "--output-dir",
        "/run/tf/",
        "--install-to",
        "/run/tf/tools",
        "--timeout",
        "1h",
        "--image",
        "registry.local/trainlet:dev",
        "--service-account",
        "ml-runner",
        "--framework",
        "pytorch,mpi",
        "--framework",
        "pytorch",
        "--nproc-per-node",
        "gpu",
        "--slots",
        "4",
        "--nnodes",
        "2:4",
        "--coordinate",
        "always",
        "--coordinate-from",
        "16",
    ]);
    assert_eq!(
        cfg.init_args,
        [
            r#"--job-to-label-mapping={"worker":["app=w"]}"#,
            "--expect=worker=4",
            "--namespace=ml",
            "--port=2222",
            "--port-name=tfjob-port",
            "--address=host-ip",
            "--cluster-domain=corp.local",
            "--order=name",
            "--ready=ready",
            "--rpc-layer=grpc+verbs",
            "--environment=cloud",
            "--output-dir=/run/tf",
            "--install-to=/run/tf/tools",
            "--timeout=1h",
            "--coordinate=always",
            "--coordinate-from=16",
            "--framework=pytorch,mpi",
            "--nproc-per-node=gpu",
            "--slots=4",
            "--nnodes=2:4",
        ]
    );
    assert_eq!(cfg.sidecar_args, ["--port=2222"]);
    assert_eq!(cfg.output_dir, "/run/tf");
    assert_eq!(cfg.image, "registry.local/trainlet:dev");
    assert_eq!(cfg.service_account, "ml-runner");
    assert_eq!(
        config(&["--job", "w=a=b"]).image,
        format!("ghcr.io/trainlet/trainlet:{}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bad_flags_fail_before_reading_anything() {
    let cases: [(&[&str], &str); 10] = [
        (&[], "no jobs given: pass --job TYPE=SELECTOR"),
        (
            &["--job", "w=a=b", "--nproc-per-node", "many"],
            "invalid --nproc-per-node \"many\": give auto, gpu, cpu or a number above 0",
        ),
        (
            &["--job", "w=a=b", "--slots", "0"],
            "invalid --slots \"0\": give gpu or a number above 0",
        ),
        (
            &["--job", "w=a=b", "--nnodes", "3"],
            "invalid --nnodes \"3\": give MIN:MAX, e.g. 2:4",
        ),
        (
            &["--job", "w=a=b", "--nnodes", "4:2"],
            "invalid --nnodes \"4:2\": MIN is above MAX",
        ),
        (
            &["--job", "w=a=b", "--nnodes", "0:2"],
            "invalid --nnodes \"0:2\": MIN must be at least 1",
        ),
        (&["--job", "worker"], "--job"),
        (
            &["--job", "w=a=b", "--task-type", "w", "--task-index", "0"],
            "--task-type and --task-index would give every pod of a template the same task",
        ),
        (
            &["--job", "w=a=b", "--install-to", "/opt/bin"],
            "invalid --install-to /opt/bin: it must be a directory inside --output-dir /etc/trainlet",
        ),
        (
            &["--job", "w=a=b", "--timeout", "soon"],
            "invalid --timeout \"soon\"",
        ),
    ];
    for (args, want) in cases {
        let f = config_err(args);
        assert_eq!(f.code, Code::Usage, "{args:?}");
        assert!(f.message.contains(want), "{args:?}: {}", f.message);
    }
}

#[test]
fn an_unknown_framework_is_a_usage_error_listing_the_known_ones() {
    let e = Cli::try_parse_from([
        "trainlet",
        "inject",
        "--job",
        "w=a=b",
        "--framework",
        "caffe",
    ])
    .unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let msg = e.to_string();
    assert!(
        msg.starts_with("error: invalid value 'caffe' for '--framework <NAME>'")
            && msg.contains("[possible values: tensorflow, pytorch, jax, mpi]"),
        "{msg}"
    );
}

#[test]
fn a_template_with_its_own_service_account_keeps_it_with_a_note() {
    let src = MIXED.replace(
        "serviceAccountName: default",
        "serviceAccountName: ml-runner",
    );
    let out = inject(&src, &config(&["--job", "worker=app=trainer"])).unwrap();
    assert_eq!(
        pod_spec(&docs(&out.yaml)[1])["serviceAccountName"],
        "ml-runner"
    );
    assert!(
        out.notes.iter().any(|n| n.text
            == "keeps serviceAccountName \"ml-runner\" and its token in the pod's containers: bind trainlet's Role to it (manifests/rbac.yaml binds \"trainlet\"); the token then has trainlet's rights too (docs/security.md)"),
        "{:?}",
        out.notes
    );
    // Its token stays where its code needs it: no automountServiceAccountToken: false.
    assert_eq!(
        pod_spec(&docs(&out.yaml)[1]).get("automountServiceAccountToken"),
        None
    );
}

/// The shipped examples and the quickstart's manifests are exactly what inject makes of
/// their un-injected originals (comments aside), so they and inject can never drift apart.
#[test]
fn the_examples_are_inject_output_of_their_originals() {
    let cases: [(&str, &str, &[&str]); 10] = [
        (
            include_str!("../../tests/fixtures/inject/pytorch-torchrun.orig.yaml"),
            include_str!("../../manifests/examples/pytorch-torchrun.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=ddp-torchrun",
                "--framework",
                "pytorch",
                "--wrap",
                "pytorch",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/jax.orig.yaml"),
            include_str!("../../manifests/examples/jax.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=jax",
                "--framework",
                "jax",
                "--wrap",
                "jax",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/mpi-hostfile.orig.yaml"),
            include_str!("../../manifests/examples/mpi-hostfile.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=allreduce",
                "--framework",
                "mpi",
                "--wrap",
                "mpi",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/jobset-pytorch.orig.yaml"),
            include_str!("../../manifests/examples/jobset-pytorch.yaml"),
            &[
                "--job",
                "worker=jobset.sigs.k8s.io/jobset-name=ddp-jobset",
                "--framework",
                "pytorch",
                "--wrap",
                "pytorch",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/tf-ps-worker.orig.yaml"),
            include_str!("../../manifests/examples/tf-ps-worker.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=mnist-ps-worker,batch.kubernetes.io/job-completion-index in (0,1,2)",
                "--job",
                "ps=batch.kubernetes.io/job-name=mnist-ps-worker,batch.kubernetes.io/job-completion-index in (3,4)",
                "--expect",
                "ps=2,worker=3",
                "--wrap",
                "tensorflow",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/tf-multiworker.orig.yaml"),
            include_str!("../../manifests/examples/tf-multiworker.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=mnist-mwms",
                "--wrap",
                "tensorflow",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/failure-policy.orig.yaml"),
            include_str!("../../manifests/examples/failure-policy-job.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=mnist-failure-policy",
                "--wrap",
                "tensorflow",
                "--failure-policy",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/classic-sidecar-job.orig.yaml"),
            include_str!("../../manifests/examples/classic-sidecar-job.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=mnist-classic",
                "--classic-sidecar",
                "--wrap",
                "tensorflow",
            ],
        ),
        // The README's quickstart.
        (
            include_str!("../../tests/fixtures/inject/quickstart-pytorch.orig.yaml"),
            include_str!("../../manifests/quickstart/pytorch.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=pytorch-quickstart",
                "--framework",
                "pytorch",
                "--wrap",
                "pytorch",
            ],
        ),
        (
            include_str!("../../tests/fixtures/inject/quickstart-tensorflow.orig.yaml"),
            include_str!("../../manifests/quickstart/tensorflow.yaml"),
            &[
                "--job",
                "worker=batch.kubernetes.io/job-name=tensorflow-quickstart",
                "--wrap",
                "tensorflow",
            ],
        ),
    ];
    for (orig, example, args) in cases {
        let out = inject(orig, &config(args)).unwrap();
        assert_eq!(docs(&out.yaml), docs(example), "{args:?}");
        // And injecting the example changes nothing at all.
        assert_eq!(inject(example, &config(args)).unwrap().yaml, example);
    }
}

/// The hostNetwork example is exactly inject's output of its original with its two
/// ports given (`--master-port 29501 --metrics-addr 0.0.0.0:9465`): no hand edit that
/// a second inject would erase. Injected again without them, it keeps them; its
/// original without them gets ports chosen for the job, and no containerPort.
#[test]
fn the_hostnetwork_example_is_inject_output_of_its_original() {
    let orig = include_str!("../../tests/fixtures/inject/hostnetwork-pytorch.orig.yaml");
    let example = include_str!("../../manifests/examples/hostnetwork-pytorch.yaml");
    let args = [
        "--job",
        "worker=batch.kubernetes.io/job-name=ddp-hostnet",
        "--framework",
        "pytorch",
        "--wrap",
        "pytorch",
        "--on-peer-change",
        "restart",
    ];
    let given: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--master-port", "29501", "--metrics-addr", "0.0.0.0:9465"])
        .collect();
    let out = inject(orig, &config(&given)).unwrap();
    assert_eq!(docs(&out.yaml), docs(example));
    assert_eq!(inject(example, &config(&given)).unwrap().yaml, example);
    let again = inject(example, &config(&args)).unwrap();
    assert_eq!(again.yaml, example);
    assert!(
        again.notes.iter().any(|n| n.text.starts_with(
            "keeps an earlier inject's --master-port=29501 --metrics-addr=0.0.0.0:9465"
        )),
        "{:?}",
        again.notes
    );

    let chosen = docs(&inject(orig, &config(&args)).unwrap().yaml);
    let (master, metrics) = crate::inject::transform::hostnet::ports(
        crate::inject::transform::hostnet::slot("/ddp-hostnet"),
    );
    let spec = &chosen[0]["spec"]["template"]["spec"];
    let init_args = spec["initContainers"][0]["args"].as_array().unwrap();
    assert!(init_args.contains(&format!("--master-port={master}").into()));
    let sidecar = &spec["initContainers"][1];
    assert!(
        sidecar["args"]
            .as_array()
            .unwrap()
            .contains(&format!("--metrics-addr=0.0.0.0:{metrics}").into())
    );
    assert_eq!(sidecar["ports"], serde_json::Value::Null);
    assert_eq!(sidecar["startupProbe"]["tcpSocket"]["port"], metrics);
}

#[test]
fn every_trainlet_container_is_locked_down() {
    for args in [
        &["--job", "worker=app=trainer"][..],
        &["--job", "worker=app=trainer", "--classic-sidecar"][..],
    ] {
        let out = inject(MIXED, &config(args)).unwrap();
        let spec = pod_spec(&docs(&out.yaml)[1]).clone();
        let all: Vec<&serde_json::Value> = spec["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .chain(spec["containers"].as_array().unwrap())
            .filter(|c| matches!(c["name"].as_str(), Some("trainlet" | "trainlet-init")))
            .collect();
        assert_eq!(all.len(), 2);
        for c in all {
            assert_eq!(
                c["securityContext"],
                serde_json::json!({
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": true,
                    "runAsNonRoot": true,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"}
                })
            );
            assert_eq!(
                c["resources"],
                serde_json::json!({"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "50m", "memory": "128Mi"}})
            );
        }
    }
}

#[test]
fn a_comment_only_chunk_and_leading_separator_are_kept() {
    let src = "# header\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n";
    let out = inject(src, &config(&["--job", "w=a=b"])).unwrap();
    assert_eq!(out.yaml, src);
    let src2 = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: i}]\n";
    let out = inject(src2, &config(&["--job", "w=a=b"])).unwrap();
    assert!(
        out.yaml.starts_with("apiVersion: v1\nkind: Pod\n"),
        "{}",
        out.yaml
    );
    let again = inject(&out.yaml, &config(&["--job", "w=a=b"])).unwrap();
    assert_eq!(again.yaml, out.yaml);
}

#[test]
fn rewrapping_with_another_install_dir_replaces_the_wrapper() {
    let a = config(&["--job", "worker=app=trainer", "--wrap", "train"]);
    let b = config(&[
        "--job",
        "worker=app=trainer",
        "--wrap",
        "train",
        "--output-dir",
        "/run/trainlet",
    ]);
    let once = inject(MIXED, &a).unwrap();
    let moved = inject(&once.yaml, &b).unwrap();
    let d = docs(&moved.yaml);
    let c = &pod_spec(&d[1])["containers"][0];
    assert_eq!(
        c["command"],
        serde_json::json!([
            "/run/trainlet/bin/trainlet",
            "exec",
            "--report",
            "--",
            "python"
        ])
    );
    // exec must find TF_CONFIG where init writes it.
    let env = c["env"].as_array().unwrap();
    assert!(
        env.contains(&serde_json::json!({"name": "TRAINLET_OUTPUT_DIR", "value": "/run/trainlet"})),
        "{env:?}"
    );
    assert_eq!(
        pod_spec(&d[1])["initContainers"][0]["volumeMounts"],
        serde_json::json!([
            {"name": "trainlet", "mountPath": "/run/trainlet"},
            {"name": "trainlet-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}
        ])
    );
    assert_eq!(moved.yaml, inject(MIXED, &b).unwrap().yaml);
    // And back to the default: no stale TRAINLET_OUTPUT_DIR.
    assert_eq!(inject(&moved.yaml, &a).unwrap().yaml, once.yaml);
}

mod properties {
    use super::*;
    use crate::testing::budget;
    use proptest::prelude::*;

    /// A Job whose names, labels, args and env values are arbitrary.
    fn job() -> impl Strategy<Value = String> {
        (
            "[a-z][a-z0-9-]{0,20}",
            proptest::collection::vec("[a-z][a-z0-9-]{0,10}", 1..4),
            proptest::collection::vec("[ -~]{0,30}", 0..4),
            proptest::collection::vec(("[A-Z][A-Z0-9_]{0,10}", "[ -~]{0,30}"), 0..3),
            any::<bool>(),
        )
            .prop_map(|(name, containers, args, env, indexed)| {
                let mut y = format!(
                    "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\nspec:\n{}  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      restartPolicy: Never\n      containers:\n",
                    if indexed { "  completionMode: Indexed\n  completions: 2\n" } else { "" }
                );
                for (i, c) in containers.iter().enumerate() {
                    y.push_str(&format!("        - name: {c}{i}\n          image: example.com/{c}:1\n          command: [python]\n"));
                    y.push_str(&format!("          args: {}\n", serde_json::to_string(&args).unwrap()));
                    if !env.is_empty() {
                        y.push_str("          env:\n");
                        for (k, v) in &env {
                            y.push_str(&format!("            - {{name: {k}, value: {}}}\n", serde_json::to_string(v).unwrap()));
                        }
                    }
                }
                y
            })
    }

    /// A document inject must leave alone, with comments and odd scalars.
    fn other() -> impl Strategy<Value = String> {
        (
            "[a-z][a-z0-9-]{0,20}",
            proptest::collection::btree_map("[a-z][a-z0-9_.-]{0,10}", prop_oneof!["[ -~]{0,20}".prop_map(|s| serde_json::to_string(&s).unwrap()), Just("0644".to_string()), Just("on".to_string()), Just("~".to_string()), Just("-1".to_string())], 0..5),
        )
            .prop_map(|(name, data)| {
                let mut y = format!("# keep me\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}  # and me\ndata:\n");
                for (k, v) in data {
                    y.push_str(&format!("  {k}: {v}\n"));
                }
                y
            })
    }

    proptest! {
        #![proptest_config(budget(64))]

        #[test]
        fn output_reparses_is_idempotent_and_leaves_other_documents_alone(
            job in job(),
            before in other(),
            after in other(),
            wrap in any::<bool>(),
        ) {
            let src = format!("{before}---\n{job}---\n{after}");
            let mut args = vec!["--job", "worker=app=x"];
            if wrap {
                args.extend(["--wrap", "zz-not-there"]);
            }
            let cfg = config(&args);
            let out = match inject(&src, &cfg) {
                Ok(out) => out,
                // --wrap of a container no template has is the only refusal here.
                Err(e) => {
                    prop_assert!(wrap, "{e}");
                    let not_found = matches!(e, TransformError::WrapNotFound { .. });
                    prop_assert!(not_found, "{e}");
                    return Ok(());
                }
            };
            let docs: Vec<_> = yaml::split_documents(&out.yaml);
            prop_assert_eq!(docs.len(), 3);
            for d in &docs {
                prop_assert!(yaml::parse(d).is_ok(), "{}", d.text);
            }
            // The other documents come back byte for byte, comments included.
            prop_assert_eq!(docs[0].text.trim_end(), before.trim_end());
            prop_assert_eq!(docs[2].text.trim_end(), after.trim_end());
            // The job got the init container and the sidecar.
            let j = yaml::to_json(&yaml::parse(&docs[1]).unwrap()[0]);
            let inits: Vec<&str> = j["spec"]["template"]["spec"]["initContainers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect();
            prop_assert_eq!(inits, ["trainlet-init", "trainlet"]);
            let twice = inject(&out.yaml, &cfg).unwrap();
            prop_assert_eq!(twice.yaml, out.yaml);
        }
    }
}

/// No container of the training job can read an API token: every shipped example and
/// every inject output turns automounting off and mounts the projected token only into
/// trainlet-init and the trainlet sidecar.
#[test]
fn no_token_reaches_the_training_containers() {
    use crate::inject::transform::{TOKEN_PATH, TOKEN_VOLUME};
    let examples = [
        include_str!("../../manifests/examples/pytorch-torchrun.yaml"),
        include_str!("../../manifests/examples/jax.yaml"),
        include_str!("../../manifests/examples/mpi-hostfile.yaml"),
        include_str!("../../manifests/examples/jobset-pytorch.yaml"),
        include_str!("../../manifests/examples/tf-ps-worker.yaml"),
        include_str!("../../manifests/examples/tf-multiworker.yaml"),
        include_str!("../../manifests/examples/classic-sidecar-job.yaml"),
        include_str!("../../manifests/examples/failure-policy-job.yaml"),
        include_str!("../../manifests/examples/hostnetwork-pytorch.yaml"),
    ];
    let injected = [
        inject(
            MIXED,
            &config(&["--job", "worker=app=trainer", "--wrap", "train"]),
        )
        .unwrap(),
        inject(
            MIXED,
            &config(&["--job", "worker=app=trainer", "--classic-sidecar"]),
        )
        .unwrap(),
    ];
    let mut templates = 0;
    for src in examples
        .iter()
        .copied()
        .chain(injected.iter().map(|o| o.yaml.as_str()))
    {
        for doc in docs(src) {
            let specs: Vec<&serde_json::Value> = if doc["kind"] == "JobSet" {
                doc["spec"]["replicatedJobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| &r["template"]["spec"]["template"]["spec"])
                    .collect()
            } else if matches!(
                doc["kind"].as_str(),
                Some("Job" | "StatefulSet" | "Pod" | "Deployment" | "CronJob")
            ) {
                vec![pod_spec(&doc)]
            } else {
                continue;
            };
            for spec in specs {
                if spec["initContainers"].is_null() {
                    continue; // not injected (the fixture's non-workload kinds)
                }
                templates += 1;
                assert_eq!(spec["automountServiceAccountToken"], false, "{spec}");
                for key in ["initContainers", "containers"] {
                    for c in spec[key].as_array().into_iter().flatten() {
                        let name = c["name"].as_str().unwrap();
                        let token: Vec<&serde_json::Value> = c["volumeMounts"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter(|m| {
                                m["name"] == TOKEN_VOLUME
                                    || m["mountPath"]
                                        .as_str()
                                        .is_some_and(|p| p.contains("serviceaccount"))
                            })
                            .collect();
                        if matches!(name, "trainlet" | "trainlet-init") {
                            assert_eq!(
                                token,
                                [
                                    &serde_json::json!({"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": true})
                                ],
                                "{name}"
                            );
                        } else {
                            assert!(
                                token.is_empty(),
                                "container {name} mounts a token: {token:?}"
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(templates >= 10, "{templates} pod templates checked");
}

/// `--failure-policy`: the rules come from `crate::exit`'s lists, name the wrapped
/// container, and turn restartPolicy to Never (with a note); a JobSet's replicated Jobs
/// get them too; without the flag nothing changes.
#[test]
fn failure_policy_adds_the_exit_code_rules_and_restart_policy_never() {
    let src = include_str!("../../tests/fixtures/inject/failure-policy.orig.yaml");
    let args = [
        "--job",
        "worker=batch.kubernetes.io/job-name=mnist",
        "--wrap",
        "tensorflow",
    ];
    let plain = inject(src, &config(&args)).unwrap();
    assert!(docs(&plain.yaml)[0]["spec"]["podFailurePolicy"].is_null());
    let mut with = args.to_vec();
    with.push("--failure-policy");
    let out = inject(src, &config(&with)).unwrap();
    let job = &docs(&out.yaml)[0];
    assert_eq!(
        job["spec"]["podFailurePolicy"],
        serde_json::json!({"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "trainlet-init", "operator": "In", "values": [1, 2, 5]}},
            {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow", "operator": "In", "values": [1, 2, 126, 127, 128, 139]}}
        ]})
    );
    assert_eq!(pod_spec(job)["restartPolicy"], "Never");
    assert!(
        out.notes
            .iter()
            .any(|n| n.text.starts_with("restartPolicy OnFailure -> Never")),
        "{:?}",
        out.notes
    );
    // Again: nothing changes.
    assert_eq!(inject(&out.yaml, &config(&with)).unwrap().yaml, out.yaml);
    // A JobSet's replicated Jobs, without --wrap: the first regular container.
    let js = include_str!("../../tests/fixtures/inject/jobset-pytorch.orig.yaml");
    let out = inject(
        js,
        &config(&[
            "--job",
            "worker=jobset.sigs.k8s.io/jobset-name=ddp",
            "--failure-policy",
        ]),
    )
    .unwrap();
    let d = docs(&out.yaml);
    let rjob =
        d.iter().find(|d| d["kind"] == "JobSet").unwrap()["spec"]["replicatedJobs"][0]["template"]
            ["spec"]
            .clone();
    assert_eq!(
        rjob["podFailurePolicy"]["rules"][2]["onExitCodes"]["containerName"],
        rjob["template"]["spec"]["containers"][0]["name"]
    );
    assert_eq!(rjob["template"]["spec"]["restartPolicy"], "Never");
    // Its container runs torchrun itself, not under trainlet exec: exit 1 may be any
    // worker's transient failure, and is counted.
    assert_eq!(
        rjob["podFailurePolicy"]["rules"][2]["onExitCodes"]["values"],
        serde_json::json!([2, 126, 127, 128, 139])
    );
    let notes: Vec<String> = out.notes.iter().map(ToString::to_string).collect();
    assert!(
        notes.contains(&"document 1 (jobset.x-k8s.io/v1alpha2 JobSet \"ddp-jobset\"): --failure-policy: container \"pytorch\" runs torchrun, a launcher that exits 1 for any worker's failure, transient ones too: its exit 1 is counted, not permanent (--wrap pytorch tells them apart)".to_string()),
        "{notes:?}"
    );
    // Again with other codes: trainlet's earlier rule is replaced, not kept first.
    let again = inject(
        &out.yaml,
        &config(&[
            "--job",
            "worker=jobset.sigs.k8s.io/jobset-name=ddp",
            "--failure-policy",
            "--permanent-exit-codes",
            "42",
        ]),
    )
    .unwrap();
    let rules = &docs(&again.yaml)[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
        ["rules"];
    assert_eq!(rules.as_array().unwrap().len(), 3, "{rules}");
    assert_eq!(rules[2]["onExitCodes"]["values"], serde_json::json!([42]));
    // Wrapped, torchrun runs under trainlet exec, which tells its exits apart: 1 stays.
    let wrapped = inject(
        js,
        &config(&[
            "--job",
            "worker=jobset.sigs.k8s.io/jobset-name=ddp",
            "--wrap",
            "pytorch",
            "--failure-policy",
        ]),
    )
    .unwrap();
    assert_eq!(
        docs(&wrapped.yaml)[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
            ["rules"][2]["onExitCodes"]["values"],
        serde_json::json!([1, 2, 126, 127, 128, 139])
    );
    assert!(
        wrapped.notes.iter().all(|n| !n.text.contains("launcher")),
        "{:?}",
        wrapped.notes
    );
}

/// `--permanent-exit-codes` replaces the training container's codes (sorted, each
/// once, as Kubernetes wants them), trainlet-init's stay; a second inject with other
/// codes replaces trainlet's rule instead of keeping the old one first.
#[test]
fn permanent_exit_codes_replace_the_training_containers_codes() {
    let src = include_str!("../../tests/fixtures/inject/failure-policy.orig.yaml");
    let args = [
        "--job",
        "worker=batch.kubernetes.io/job-name=mnist",
        "--wrap",
        "tensorflow",
        "--failure-policy",
    ];
    let default = inject(src, &config(&args)).unwrap();
    let mut with = args.to_vec();
    with.extend(["--permanent-exit-codes", "42,2,42,126"]);
    for input in [src, default.yaml.as_str()] {
        let out = inject(input, &config(&with)).unwrap();
        assert_eq!(
            docs(&out.yaml)[0]["spec"]["podFailurePolicy"]["rules"],
            serde_json::json!([
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": "trainlet-init", "operator": "In", "values": [1, 2, 5]}},
                {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow", "operator": "In", "values": [2, 42, 126]}}
            ])
        );
        assert_eq!(inject(&out.yaml, &config(&with)).unwrap().yaml, out.yaml);
    }
}

#[test]
fn permanent_exit_codes_are_checked() {
    let base = [
        "--job",
        "worker=batch.kubernetes.io/job-name=mnist",
        "--failure-policy",
        "--permanent-exit-codes",
    ];
    let digits =
        "give exit codes from 1 to 255 in digits, separated by ',' without spaces, e.g. 2,126,127";
    for (codes, why) in [
        ("0,1", "0 is success, never a failure"),
        ("1, 0", "0 is success, never a failure"),
        ("1,256", digits),
        ("1,-1", digits),
        ("1;2", digits),
        ("1, 2", digits),
        ("01", digits),
        ("+1", digits),
        ("1,,2", digits),
        (" , ", digits),
        ("", digits),
    ] {
        let mut args = base.to_vec();
        args.push(codes);
        let e = config_err(&args);
        assert_eq!(e.code, Code::Usage);
        assert_eq!(
            e.message,
            format!("invalid --permanent-exit-codes {codes:?}: {why}")
        );
    }
    // Every code once fits the bound the policy checks; twice does not.
    let once: Vec<String> = (1..=255).rev().map(|c| c.to_string()).collect();
    let once = once.join(",");
    let mut args = base.to_vec();
    args.push(&once);
    assert_eq!(
        config(&args).permanent_exit_codes,
        Some((1..=255).collect::<Vec<i32>>())
    );
    let twice = format!("{once},{once}");
    let mut args = base.to_vec();
    args.push(&twice);
    assert_eq!(
        config_err(&args).message,
        format!(
            "invalid --permanent-exit-codes {twice:?}: {} characters, at most 1024 allowed",
            twice.len()
        )
    );
    let e = config_err(&[
        "--job",
        "worker=batch.kubernetes.io/job-name=mnist",
        "--permanent-exit-codes",
        "1",
    ]);
    assert_eq!(
        e.message,
        "--permanent-exit-codes names the codes that the podFailurePolicy of --failure-policy fails the Job on, and that --on-failure restart does not retry; pass either"
    );
}

/// With `--on-failure restart`, the wrapped exec gets the codes too, as given, after
/// `--on-failure`: a code the Job fails on is not first restarted in place. Without
/// `--failure-policy` they are exec's alone; without `--on-failure restart`, the Job's.
#[test]
fn permanent_exit_codes_reach_the_wrapped_exec_with_on_failure_restart() {
    let src = include_str!("../../tests/fixtures/inject/failure-policy.orig.yaml");
    let exec_args = |extra: &[&str]| {
        let mut args = vec![
            "--job",
            "worker=batch.kubernetes.io/job-name=mnist",
            "--wrap",
            "tensorflow",
        ];
        args.extend(extra);
        let out = inject(src, &config(&args)).unwrap();
        let c = &docs(&out.yaml)[0]["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<String> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .filter(|a| a.starts_with("--on-failure") || a.starts_with("--permanent"))
            .collect();
        (args, docs(&out.yaml)[0]["spec"]["podFailurePolicy"].clone())
    };
    let (args, policy) = exec_args(&["--on-failure", "restart", "--permanent-exit-codes", "42,3"]);
    assert_eq!(
        args,
        ["--on-failure=restart", "--permanent-exit-codes=42,3"]
    );
    assert!(policy.is_null(), "{policy}");
    let (args, policy) = exec_args(&[
        "--on-failure",
        "restart",
        "--failure-policy",
        "--permanent-exit-codes",
        "42,3",
    ]);
    assert_eq!(
        args,
        ["--on-failure=restart", "--permanent-exit-codes=42,3"]
    );
    assert_eq!(
        policy["rules"][2]["onExitCodes"]["values"],
        serde_json::json!([3, 42])
    );
    let (args, _) = exec_args(&["--failure-policy", "--permanent-exit-codes", "42,3"]);
    assert!(args.is_empty(), "{args:?}");
    let e = config_err(&[
        "--job",
        "worker=batch.kubernetes.io/job-name=mnist",
        "--on-failure",
        "restart",
    ]);
    assert_eq!(
        e.message,
        "--on-failure acts on the command of the container that --wrap names; pass --wrap CONTAINER"
    );
}

/// A Job that has a podFailurePolicy of its own keeps its rules, first (the first rule
/// that matches applies: its `Ignore` for exit code 1 stands), with trainlet's after
/// them, a note saying so, and nothing added twice by a second inject.
#[test]
fn failure_policy_keeps_the_jobs_own_rules_first() {
    let src = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: mnist
spec:
  podFailurePolicy:
    rules:
      - action: Ignore
        onExitCodes:
          containerName: tensorflow
          operator: In
          values: [1]
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: tensorflow
          image: tf
          command: [python, train.py]
"#;
    let args = [
        "--job",
        "worker=batch.kubernetes.io/job-name=mnist",
        "--wrap",
        "tensorflow",
        "--failure-policy",
    ];
    let out = inject(src, &config(&args)).unwrap();
    let rules = docs(&out.yaml)[0]["spec"]["podFailurePolicy"]["rules"].clone();
    assert_eq!(
        rules,
        serde_json::json!([
            {"action": "Ignore", "onExitCodes": {"containerName": "tensorflow", "operator": "In", "values": [1]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "trainlet-init", "operator": "In", "values": [1, 2, 5]}},
            {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow", "operator": "In", "values": [1, 2, 126, 127, 128, 139]}}
        ])
    );
    let notes: Vec<String> = out.notes.iter().map(ToString::to_string).collect();
    assert_eq!(
        notes,
        [
            "document 1 (batch/v1 Job \"mnist\"): --failure-policy keeps the 1 podFailurePolicy rule it had first (the first rule that matches applies) and adds trainlet's after it",
            "document 1 (batch/v1 Job \"mnist\"): injected"
        ]
    );
    let again = inject(&out.yaml, &config(&args)).unwrap();
    assert_eq!(again.yaml, out.yaml);
    assert!(
        again
            .notes
            .iter()
            .all(|n| !n.text.contains("podFailurePolicy")),
        "{:?}",
        again.notes
    );
    // More rules than Kubernetes allows with trainlet's: refused, naming the count.
    let many: String = (0..18)
        .map(|i| {
            format!(
                "      - action: Count\n        onExitCodes: {{operator: In, values: [{}]}}\n",
                200 + i
            )
        })
        .collect();
    let crowded = src.replace(
        "      - action: Ignore\n        onExitCodes:\n          containerName: tensorflow\n          operator: In\n          values: [1]\n",
        &many,
    );
    let e = inject(&crowded, &config(&args)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "batch/v1 Job \"mnist\" (document 1): --failure-policy: with trainlet's 3 rules after its 18 own, spec.podFailurePolicy would have 21 rules, more than the 20 Kubernetes allows"
    );
}

/// A pod template built with a YAML merge key: inject edits what kubectl would send,
/// so the merged training container stays and trainlet's come beside it.
#[test]
fn a_template_built_with_merge_keys_keeps_its_merged_containers() {
    // An alias reaches only within its document, as for kubectl: one List here.
    let merged = r#"apiVersion: v1
kind: List
items:
  - apiVersion: batch/v1
    kind: Job
    metadata: {name: base}
    spec:
      template:
        spec: &spec
          restartPolicy: Never
          containers:
            - name: tensorflow
              image: tf
              command: [python, train.py]
  - apiVersion: batch/v1
    kind: Job
    metadata: {name: eval}
    spec:
      template:
        spec:
          <<: *spec
          activeDeadlineSeconds: 600
"#;
    for classic in [false, true] {
        let mut args = vec!["--job", "worker=batch.kubernetes.io/job-name=eval"];
        if classic {
            args.push("--classic-sidecar");
        }
        let out = inject(merged, &config(&args)).unwrap();
        let d = &docs(&out.yaml)[0]["items"][1];
        let spec = &d["spec"]["template"]["spec"];
        let want_containers: &[&str] = if classic {
            &["tensorflow", "trainlet"]
        } else {
            &["tensorflow"]
        };
        assert_eq!(names(&spec["containers"]), want_containers, "{}", out.yaml);
        assert_eq!(spec["activeDeadlineSeconds"], 600);
        assert_eq!(spec["restartPolicy"], "Never");
        assert!(!out.yaml.contains("<<"), "{}", out.yaml);
    }
}

/// A container or volume of the user's with a name inject uses is refused, not
/// replaced: the user's would be gone without a word.
#[test]
fn the_users_own_trainlet_named_containers_and_volumes_are_refused() {
    let job = |extra_container: &str, volumes: &str| {
        format!(
            r#"apiVersion: batch/v1
kind: Job
metadata:
  name: mnist
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: tensorflow
          image: tf
          command: [python, train.py]
{extra_container}{volumes}"#
        )
    };
    let args = ["--job", "worker=batch.kubernetes.io/job-name=mnist"];
    let e = inject(
        &job("        - name: trainlet\n          image: my/logger\n", ""),
        &config(&args),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "batch/v1 Job \"mnist\" (document 1): containers has a container \"trainlet\" that trainlet inject did not add; inject adds its own under that name: rename yours"
    );
    let e = inject(
        &job(
            "",
            "      volumes:\n        - name: trainlet-token\n          secret: {secretName: mine}\n",
        ),
        &config(&args),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "batch/v1 Job \"mnist\" (document 1): has a volume \"trainlet-token\" that trainlet inject did not add; inject adds its own under that name: rename yours (and the volumeMounts that use it)"
    );
    // inject's own, from an earlier inject: replaced, as always.
    let once = inject(&job("", ""), &config(&args)).unwrap();
    assert_eq!(inject(&once.yaml, &config(&args)).unwrap().yaml, once.yaml);
}
