//! Unit tests of what inject adds to the pod beyond trainlet itself: `--on-peer-change`
//! in the wrapped command, `--resources` (requests equal limits), `--shm-size`.

use clap::Parser;

use super::lower::inject_config;
use super::{Cli, Command};
use crate::inject::{InjectConfig, inject, yaml};
use crate::{Code, Failure};

/// A GPU pod whose training container is Guaranteed on its own.
const POD: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: w-0
  labels: {app: mnist}
spec:
  containers:
    - name: train
      image: registry.example.com/train:1
      command: [python, train.py]
      resources:
        limits: {cpu: '8', memory: 64Gi, nvidia.com/gpu: '8'}
";

fn parsed(args: &[&str]) -> Result<InjectConfig, Failure> {
    let argv = ["trainlet", "inject", "--job", "worker=app=mnist"]
        .iter()
        .chain(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let Command::Inject(a) = cli.command else {
        unreachable!()
    };
    inject_config(&a)
}

fn injected(src: &str, args: &[&str]) -> serde_json::Value {
    let cfg = parsed(args).unwrap_or_else(|f| panic!("{}", f.message));
    let out = inject(src, &cfg).unwrap();
    let chunks = yaml::split_documents(&out.yaml);
    yaml::to_json(&yaml::parse(&chunks[0]).unwrap()[0])
}

fn container<'a>(pod: &'a serde_json::Value, list: &str, name: &str) -> &'a serde_json::Value {
    pod["spec"][list]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} {name}"))
}

#[test]
fn on_peer_change_goes_into_the_wrapped_command_and_a_second_inject_replaces_it() {
    let pod = injected(POD, &["--wrap", "train", "--on-peer-change", "restart"]);
    assert_eq!(
        container(&pod, "containers", "train")["command"],
        serde_json::json!([
            "/etc/trainlet/bin/trainlet",
            "exec",
            "--report",
            "--on-peer-change=restart",
            "--",
            "python",
            "train.py"
        ])
    );
    // Injecting the output again with the default takes the flag out; nothing is
    // wrapped twice.
    let again = injected(&serde_json::to_string(&pod).unwrap(), &["--wrap", "train"]);
    assert_eq!(
        container(&again, "containers", "train")["command"],
        serde_json::json!([
            "/etc/trainlet/bin/trainlet",
            "exec",
            "--report",
            "--",
            "python",
            "train.py"
        ])
    );
    let f = parsed(&["--on-peer-change", "exit"]).unwrap_err();
    assert_eq!(f.code, Code::Usage);
    assert_eq!(
        f.message,
        "--on-peer-change exit acts on the command of the container that --wrap names; pass --wrap CONTAINER"
    );
}

#[test]
fn trainlets_containers_get_requests_equal_to_limits() {
    let both = |cpu: &str, memory: &str| {
        serde_json::json!({
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"cpu": cpu, "memory": memory}
        })
    };
    let pod = injected(POD, &[]);
    for name in ["trainlet-init", "trainlet"] {
        assert_eq!(
            container(&pod, "initContainers", name)["resources"],
            both("50m", "128Mi"),
            "{name}"
        );
    }
    let pod = injected(POD, &["--resources", "memory=256Mi"]);
    assert_eq!(
        container(&pod, "initContainers", "trainlet")["resources"],
        both("50m", "256Mi")
    );
    let pod = injected(POD, &["--resources", "cpu=1,memory=1.5Gi"]);
    assert_eq!(
        container(&pod, "initContainers", "trainlet-init")["resources"],
        both("1", "1.5Gi")
    );
    for (value, why) in [
        (
            "cpu=lots",
            "cpu=\"lots\" is not a quantity such as 250m or 128Mi",
        ),
        ("gpu=1", "unknown resource \"gpu\"; give cpu=Q,memory=Q"),
        (
            "memory",
            "memory=\"\" is not a quantity such as 250m or 128Mi",
        ),
    ] {
        let f = parsed(&["--resources", value]).unwrap_err();
        assert_eq!(f.code, Code::Usage);
        assert_eq!(f.message, format!("invalid --resources {value:?}: {why}"));
    }
}

#[test]
fn shm_size_mounts_memory_at_dev_shm_except_where_a_container_has_its_own() {
    let src = POD.replace(
        "      resources:\n",
        "    - name: loader\n      image: registry.example.com/loader:1\n      command: [load]\n      volumeMounts: [{name: big, mountPath: /dev/shm}]\n    - name: train2\n      image: x\n      command: [y]\n      resources:\n",
    );
    let cfg = parsed(&["--shm-size", "8Gi"]).unwrap();
    let out = inject(&src, &cfg).unwrap();
    let notes: Vec<String> = out.notes.iter().map(ToString::to_string).collect();
    assert!(
        notes.contains(&"document 1 (v1 Pod \"w-0\"): keeps container \"loader\"'s own /dev/shm (volume \"big\"); --shm-size applies to the others".to_string()),
        "{notes:?}"
    );
    let pod = yaml::to_json(&yaml::parse(&yaml::split_documents(&out.yaml)[0]).unwrap()[0]);
    let shm = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "trainlet-shm")
        .unwrap();
    assert_eq!(
        shm,
        &serde_json::json!({"name": "trainlet-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}})
    );
    let shm_mounts = |name: &str| -> Vec<String> {
        container(&pod, "containers", name)["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["mountPath"] == "/dev/shm")
            .map(|m| m["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(shm_mounts("train"), ["trainlet-shm"]);
    assert_eq!(shm_mounts("train2"), ["trainlet-shm"]);
    assert_eq!(shm_mounts("loader"), ["big"]);
    // Without --shm-size, a second inject takes it away again.
    let again = injected(&out.yaml, &[]);
    assert!(
        !serde_json::to_string(&again)
            .unwrap()
            .contains("trainlet-shm")
    );
    let f = parsed(&["--shm-size", "8GB"]).unwrap_err();
    assert_eq!(
        (f.code, f.message.as_str()),
        (
            Code::Usage,
            "invalid --shm-size \"8GB\": give a size such as 8Gi or 512Mi"
        )
    );
}
