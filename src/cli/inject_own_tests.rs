//! Unit tests of what inject owns in a pod template and what stays the user's: objects
//! under trainlet's names, mount paths, `POD_NAME`, the user's own `trainlet exec`,
//! memory quantities, and a second inject with other flags.

use clap::Parser;

use super::lower::inject_config;
use super::{Cli, Command};
use crate::inject::{InjectConfig, inject, yaml};
use crate::{Code, Failure};

/// A Job whose training container `train` gets `extra` (indented for its keys) and
/// whose pod spec gets `spec_extra`.
fn job(extra: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: batch/v1
kind: Job
metadata:
  name: mnist
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: registry.example.com/train:1
          command: [python, train.py]
{extra}{spec_extra}"
    )
}

fn parsed(args: &[&str]) -> Result<InjectConfig, Failure> {
    let argv = [
        "trainlet",
        "inject",
        "--job",
        "worker=batch.kubernetes.io/job-name=mnist",
    ]
    .iter()
    .chain(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let Command::Inject(a) = cli.command else {
        unreachable!()
    };
    inject_config(&a)
}

fn cfg(args: &[&str]) -> InjectConfig {
    parsed(args).unwrap_or_else(|f| panic!("{}", f.message))
}

fn spec_of(out: &str) -> serde_json::Value {
    let doc = yaml::to_json(&yaml::parse(&yaml::split_documents(out)[0]).unwrap()[0]);
    doc["spec"]["template"]["spec"].clone()
}

fn notes(out: &crate::inject::transform::Output) -> Vec<String> {
    out.notes.iter().map(|n| n.text.clone()).collect()
}

/// A memory-backed emptyDir of the user's named `trainlet` is refused, not turned into
/// trainlet's 64Mi volume with its mount moved away from /cache.
#[test]
fn a_users_emptydir_named_trainlet_is_refused_not_taken_over() {
    let src = job(
        "          volumeMounts: [{name: trainlet, mountPath: /cache}]\n",
        "      volumes:\n        - name: trainlet\n          emptyDir: {medium: Memory, sizeLimit: 2Gi}\n",
    );
    let e = inject(&src, &cfg(&[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "batch/v1 Job \"mnist\" (document 1): has a volume \"trainlet\" that trainlet inject did not add; inject adds its own under that name: rename yours (and the volumeMounts that use it)"
    );
    // Renamed, it stays as it was, beside trainlet's.
    let src = src.replace("name: trainlet", "name: cache");
    let spec = spec_of(&inject(&src, &cfg(&[])).unwrap().yaml);
    assert_eq!(
        spec["volumes"][0],
        serde_json::json!({"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}})
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        serde_json::json!([
            {"name": "cache", "mountPath": "/cache"},
            {"name": "trainlet", "mountPath": "/etc/trainlet", "readOnly": true}
        ])
    );
}

/// A container of the user's named `trainlet` that runs trainlet's sidecar its own way
/// (another volume, its own flags) is refused, not removed.
#[test]
fn a_users_own_trainlet_container_is_refused_not_removed() {
    let src = job(
        "        - name: trainlet
          image: ghcr.io/trainlet/trainlet:0.1.0
          command: [/usr/local/bin/trainlet, sidecar]
          args: [--cgroup-root=/host/sys/fs/cgroup, --exit-with-main]
          volumeMounts: [{name: cgroup, mountPath: /host/sys/fs/cgroup, readOnly: true}]
",
        "      volumes:\n        - name: cgroup\n          hostPath: {path: /sys/fs/cgroup}\n",
    );
    let e = inject(&src, &cfg(&[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "batch/v1 Job \"mnist\" (document 1): containers has a container \"trainlet\" that trainlet inject did not add; inject adds its own under that name: rename yours"
    );
    // inject's own classic sidecar is still found and replaced by the native one.
    let classic = inject(&job("", ""), &cfg(&["--classic-sidecar"])).unwrap();
    let native = inject(&classic.yaml, &cfg(&[])).unwrap();
    assert_eq!(native.yaml, inject(&job("", ""), &cfg(&[])).unwrap().yaml);
}

/// The user's own mount at inject's --output-dir would give the pod two mounts at one
/// path, which the API server rejects: refused, naming the way out.
#[test]
fn a_users_mount_at_the_output_dir_is_refused() {
    let src = job(
        "          volumeMounts: [{name: config, mountPath: /etc/trainlet/}]\n",
        "      volumes:\n        - name: config\n          configMap: {name: trainlet-config}\n",
    );
    let e = inject(&src, &cfg(&[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "batch/v1 Job \"mnist\" (document 1): container \"train\" mounts volume \"config\" at /etc/trainlet, where inject mounts trainlet's files (--output-dir): give inject another --output-dir, e.g. /run/trainlet, or mount yours elsewhere"
    );
    let spec = spec_of(
        &inject(&src, &cfg(&["--output-dir", "/run/trainlet"]))
            .unwrap()
            .yaml,
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        serde_json::json!([
            {"name": "config", "mountPath": "/etc/trainlet/"},
            {"name": "trainlet", "mountPath": "/run/trainlet", "readOnly": true}
        ])
    );
}

/// `/dev/shm/` is `/dev/shm`: the container keeps its own and gets no second one.
#[test]
fn a_users_dev_shm_with_a_trailing_slash_is_its_own_dev_shm() {
    let src = job(
        "          volumeMounts: [{name: big, mountPath: /dev/shm/}]\n",
        "      volumes:\n        - name: big\n          emptyDir: {medium: Memory}\n",
    );
    let out = inject(&src, &cfg(&["--shm-size", "8Gi"])).unwrap();
    let spec = spec_of(&out.yaml);
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        serde_json::json!([
            {"name": "big", "mountPath": "/dev/shm/"},
            {"name": "trainlet", "mountPath": "/etc/trainlet", "readOnly": true}
        ])
    );
    assert!(
        notes(&out).contains(
            &"keeps container \"train\"'s own /dev/shm (volume \"big\"); --shm-size applies to the others"
                .to_string()
        ),
        "{:?}",
        out.notes
    );
    // Its only container has its own: no trainlet-shm volume mounted nowhere.
    let volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(volumes, ["big", "trainlet", "trainlet-token"]);
    assert!(
        notes(&out).contains(
            &"adds no trainlet-shm volume: every container mounts its own /dev/shm".to_string()
        ),
        "{:?}",
        out.notes
    );
}

/// The user's POD_NAME stays as it was; trainlet exec gets the pod's name from its own
/// TRAINLET_POD_NAME, which wins over POD_NAME.
#[test]
fn a_users_own_pod_name_stays_and_exec_gets_trainlet_pod_name() {
    let src = job(
        "          env: [{name: POD_NAME, value: worker}, {name: POD_UID, value: u}]\n",
        "",
    );
    let c = cfg(&["--wrap", "train"]);
    let out = inject(&src, &c).unwrap();
    let field = |name: &str, path: &str| serde_json::json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    assert_eq!(
        spec_of(&out.yaml)["containers"][0]["env"],
        serde_json::json!([
            {"name": "POD_NAME", "value": "worker"},
            {"name": "POD_UID", "value": "u"},
            field("POD_NAMESPACE", "metadata.namespace"),
            field("TRAINLET_POD_NAME", "metadata.name"),
            {"name": "TRAINLET_METRICS_ADDR", "value": "off"},
            {"name": "TRAINLET_OBSERVATIONS", "value": "/run/trainlet-observed"},
        ])
    );
    assert!(
        notes(&out).contains(
            &"keeps container \"train\"'s own POD_NAME (its trainlet exec reads TRAINLET_POD_NAME), POD_UID"
                .to_string()
        ),
        "{:?}",
        out.notes
    );
    assert_eq!(inject(&out.yaml, &c).unwrap().yaml, out.yaml);
    // A POD_NAME from the downward API, as the API server writes it back, is inject's.
    let src = job(
        "          env: [{name: POD_NAME, valueFrom: {fieldRef: {apiVersion: v1, fieldPath: metadata.name}}}]\n",
        "",
    );
    let env = &spec_of(&inject(&src, &c).unwrap().yaml)["containers"][0]["env"];
    assert_eq!(env[0], field("POD_NAME", "metadata.name"));
    assert_eq!(
        env[3],
        serde_json::json!({"name": "TRAINLET_METRICS_ADDR", "value": "off"})
    );
}

/// The user's own `trainlet exec` keeps every flag; inject adds `--report` (once) and
/// its own flags where the user's do not set them.
#[test]
fn a_users_own_trainlet_exec_keeps_its_flags() {
    let src = job("", "").replace(
        "command: [python, train.py]",
        "command: [trainlet, exec, --on-peer-change=restart, --stall-after=30m, --, python, train.py]",
    );
    let c = cfg(&["--wrap", "train"]);
    let out = inject(&src, &c).unwrap();
    assert_eq!(
        spec_of(&out.yaml)["containers"][0]["command"],
        serde_json::json!([
            "trainlet",
            "exec",
            "--on-peer-change=restart",
            "--stall-after=30m",
            "--report",
            "--",
            "python",
            "train.py"
        ])
    );
    assert!(
        notes(&out).contains(
            &"keeps container \"train\"'s own `trainlet exec` and its flags, adding --report"
                .to_string()
        ),
        "{:?}",
        out.notes
    );
    assert_eq!(inject(&out.yaml, &c).unwrap().yaml, out.yaml);
    let c = cfg(&[
        "--wrap",
        "train",
        "--stall-after",
        "10m",
        "--max-restarts",
        "5",
    ]);
    let out = inject(&out.yaml, &c).unwrap();
    assert_eq!(
        spec_of(&out.yaml)["containers"][0]["command"],
        serde_json::json!([
            "trainlet",
            "exec",
            "--on-peer-change=restart",
            "--stall-after=30m",
            "--report",
            "--max-restarts=5",
            "--",
            "python",
            "train.py"
        ])
    );
    assert!(
        notes(&out).contains(
            &"keeps container \"train\"'s own `trainlet exec` and its flags, adding --max-restarts=5; its own --stall-after=30m stays over this inject's"
                .to_string()
        ),
        "{:?}",
        out.notes
    );
    // With the value as a separate word, and --report already there: nothing doubled.
    let src = job("", "").replace(
        "command: [python, train.py]",
        "command: [/opt/bin/trainlet, exec, --report, --stall-after, 30m, --, python, train.py]",
    );
    let out = inject(&src, &cfg(&["--wrap", "train", "--stall-after", "30m"])).unwrap();
    assert_eq!(
        spec_of(&out.yaml)["containers"][0]["command"],
        serde_json::json!([
            "/opt/bin/trainlet",
            "exec",
            "--report",
            "--stall-after",
            "30m",
            "--",
            "python",
            "train.py"
        ])
    );
}

/// Millibytes are no memory size: `128m` is 0.128 bytes to the API server.
#[test]
fn memory_in_millibytes_is_refused_with_the_size_meant() {
    for (args, want) in [
        (
            ["--resources", "memory=128m"],
            "invalid --resources \"memory=128m\": memory=128m is 128 millibytes; write memory=128Mi",
        ),
        (
            ["--resources", "cpu=1,memory=1.5m"],
            "invalid --resources \"cpu=1,memory=1.5m\": memory=1.5m is 1.5 millibytes; write memory=1.5Mi",
        ),
        (
            ["--shm-size", "512m"],
            "invalid --shm-size \"512m\": 512m is 512 millibytes; write 512Mi",
        ),
    ] {
        let f = parsed(&args).unwrap_err();
        assert_eq!((f.code, f.message.as_str()), (Code::Usage, want));
    }
    // Millicores stay what a CPU is given in.
    assert_eq!(cfg(&["--resources", "cpu=250m"]).resources.cpu, "250m");
}

/// `--max-restarts` and `--restart-grace` go into the wrapped command like
/// `--on-peer-change`, after it.
#[test]
fn max_restarts_and_restart_grace_go_into_the_wrapped_command() {
    let c = cfg(&[
        "--wrap",
        "train",
        "--on-peer-change",
        "restart",
        "--restart-grace",
        "1m",
        "--max-restarts",
        "5",
        "--stall-after",
        "10m",
    ]);
    assert_eq!(
        c.exec_args,
        [
            "--report",
            "--on-peer-change=restart",
            "--max-restarts=5",
            "--restart-grace=1m",
            "--stall-after=10m"
        ]
    );
    let out = inject(&job("", ""), &c).unwrap();
    assert_eq!(
        spec_of(&out.yaml)["containers"][0]["command"],
        serde_json::json!([
            "/etc/trainlet/bin/trainlet",
            "exec",
            "--report",
            "--on-peer-change=restart",
            "--max-restarts=5",
            "--restart-grace=1m",
            "--stall-after=10m",
            "--",
            "python",
            "train.py"
        ])
    );
    assert_eq!(
        cfg(&["--wrap", "train", "--max-restarts", "3"]).exec_args,
        ["--report"]
    );
    for (args, want) in [
        (
            &["--max-restarts", "5"][..],
            "--max-restarts acts on the command of the container that --wrap names; pass --wrap CONTAINER",
        ),
        (
            &["--restart-grace", "1m"][..],
            "--restart-grace acts on the command of the container that --wrap names; pass --wrap CONTAINER",
        ),
    ] {
        let f = parsed(args).unwrap_err();
        assert_eq!((f.code, f.message.as_str()), (Code::Usage, want));
    }
    let f = parsed(&["--wrap", "train", "--restart-grace", "soon"]).unwrap_err();
    assert!(
        f.message.starts_with("invalid --restart-grace \"soon\": "),
        "{}",
        f.message
    );
}

/// A second inject with other flags applies them, and says which settings of the
/// first it drops: the result is what the second alone makes of the original.
#[test]
fn a_second_inject_applies_its_flags_and_says_what_it_drops() {
    // With a subdomain already: the one `--address dns` gives a Job without one stays
    // the user's after it (harmless without DNS addresses).
    let original = &job("", "      subdomain: mnist\n");
    let first = cfg(&[
        "--wrap",
        "train",
        "--shm-size",
        "8Gi",
        "--address",
        "dns",
        "--on-peer-change",
        "restart",
        "--resources",
        "memory=256Mi",
    ]);
    let once = inject(original, &first).unwrap();
    // Changed: the new values apply, and nothing is dropped.
    let changed = cfg(&[
        "--wrap",
        "train",
        "--shm-size",
        "4Gi",
        "--address",
        "host-ip",
        "--on-peer-change",
        "exit",
        "--resources",
        "memory=256Mi",
    ]);
    let out = inject(&once.yaml, &changed).unwrap();
    assert_eq!(out.yaml, inject(original, &changed).unwrap().yaml);
    assert_eq!(notes(&out), ["injected"]);
    // Left out: the defaults apply, and one note names what was dropped.
    let plain = cfg(&["--wrap", "train"]);
    let out = inject(&once.yaml, &plain).unwrap();
    assert_eq!(out.yaml, inject(original, &plain).unwrap().yaml);
    assert_eq!(
        notes(&out),
        [
            "drops --on-peer-change=restart --address=dns --resources=cpu=50m,memory=256Mi --shm-size=8Gi of an earlier inject: not in this one's flags, so the default applies; pass them again to keep them",
            "injected"
        ]
    );
    // Without --wrap, the container an earlier inject wrapped is unwrapped again.
    let out = inject(&once.yaml, &cfg(&["--classic-sidecar"])).unwrap();
    assert_eq!(
        notes(&out),
        [
            "drops --wrap=train --address=dns --resources=cpu=50m,memory=256Mi --shm-size=8Gi of an earlier inject: not in this one's flags, so the default applies; pass them again to keep them",
            "injected"
        ]
    );
    let spec = spec_of(&out.yaml);
    assert_eq!(
        spec["containers"][0]["command"],
        serde_json::json!(["python", "train.py"])
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        serde_json::json!([{"name": "trainlet", "mountPath": "/etc/trainlet", "readOnly": true}])
    );
    assert_eq!(
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["trainlet", "trainlet-token"]
    );
    let back = inject(&out.yaml, &cfg(&[])).unwrap();
    assert_eq!(
        notes(&back),
        [
            "drops --classic-sidecar of an earlier inject: not in this one's flags, so the default applies; pass it again to keep it",
            "injected"
        ]
    );
}

/// What the API server sends back (`kubectl get -o yaml`: `apiVersion: v1` in every
/// fieldRef, defaults in every container) is still inject's own where it was.
#[test]
fn inject_knows_its_own_objects_as_the_api_server_returns_them() {
    fn as_returned(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                if let Some(serde_json::Value::Object(f)) = o.get_mut("fieldRef") {
                    f.insert("apiVersion".into(), "v1".into());
                }
                if o.contains_key("image") {
                    o.insert("imagePullPolicy".into(), "IfNotPresent".into());
                    o.insert(
                        "terminationMessagePath".into(),
                        "/dev/termination-log".into(),
                    );
                }
                o.values_mut().for_each(as_returned);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(as_returned),
            _ => {}
        }
    }
    for (args, init, containers) in [
        (
            &["--wrap", "train"][..],
            &["trainlet-init", "trainlet"][..],
            &["train"][..],
        ),
        (
            &["--classic-sidecar", "--shm-size", "1Gi"],
            &["trainlet-init"],
            &["train", "trainlet"],
        ),
    ] {
        let c = cfg(args);
        let once = inject(&job("", ""), &c).unwrap();
        let mut returned =
            yaml::to_json(&yaml::parse(&yaml::split_documents(&once.yaml)[0]).unwrap()[0]);
        as_returned(&mut returned);
        let again = inject(&returned.to_string(), &c).unwrap_or_else(|e| panic!("{e}"));
        let (before, after) = (spec_of(&once.yaml), spec_of(&again.yaml));
        let names = |list: &str| -> Vec<String> {
            after[list]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(after["volumes"], before["volumes"], "{args:?}");
        assert_eq!(names("initContainers"), init, "{args:?}");
        assert_eq!(names("containers"), containers, "{args:?}");
        assert_eq!(
            after["containers"][0]["command"],
            before["containers"][0]["command"]
        );
    }
}
