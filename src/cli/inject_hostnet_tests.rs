//! Unit tests of inject on hostNetwork pod templates and of `--metrics-addr`: ports
//! chosen per job (and kept by a second inject), the flags' where given, the sidecar's
//! containerPort, startup probe and scrape annotation in step, and the dnsPolicy.

use clap::Parser;
use serde_json::{Value, json};

use super::lower::inject_config;
use super::{Cli, Command};
use crate::Code;
use crate::inject::transform::hostnet::{ports, slot};
use crate::inject::{InjectConfig, inject, yaml};

fn parsed(args: &[&str]) -> Result<InjectConfig, crate::Failure> {
    let argv = ["trainlet", "inject", "--job", "worker=app=ddp"]
        .iter()
        .chain(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let Command::Inject(a) = cli.command else {
        unreachable!()
    };
    inject_config(&a)
}

fn config(args: &[&str]) -> InjectConfig {
    parsed(args).unwrap_or_else(|f| panic!("{}", f.message))
}

/// A Job `name` in namespace `ml`, on hostNetwork or not, with `extra` spec lines.
fn job(name: &str, host: bool, extra: &str) -> String {
    let host = if host {
        "      hostNetwork: true\n"
    } else {
        ""
    };
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  namespace: ml\nspec:\n  template:\n    metadata:\n      labels: {{app: ddp}}\n    spec:\n{host}{extra}      containers:\n        - name: train\n          image: t:1\n          command: [torchrun, train.py]\n"
    )
}

/// The pod spec and annotations of the first document, and the notes.
fn injected(src: &str, cfg: &InjectConfig) -> (Value, Value, Vec<String>) {
    let out = inject(src, cfg).unwrap();
    let node = yaml::parse(&yaml::split_documents(&out.yaml)[0])
        .unwrap()
        .remove(0);
    let t = yaml::to_json(&node)["spec"]["template"].clone();
    let notes = out.notes.iter().map(|n| n.text.clone()).collect();
    (
        t["spec"].clone(),
        t["metadata"]["annotations"].clone(),
        notes,
    )
}

fn args_of(spec: &Value, i: usize) -> Vec<String> {
    spec["initContainers"][i]["args"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn has_flag(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a.starts_with(&format!("--{flag}=")))
}

#[test]
fn a_hostnetwork_job_gets_ports_of_its_own_and_cluster_dns_with_notes() {
    let (master, metrics) = ports(slot("ml/ddp"));
    let (spec, annotations, notes) = injected(&job("ddp", true, ""), &config(&[]));
    assert!(args_of(&spec, 0).contains(&format!("--master-port={master}")));
    assert!(args_of(&spec, 1).contains(&format!("--metrics-addr=0.0.0.0:{metrics}")));
    let sidecar = &spec["initContainers"][1];
    assert_eq!(sidecar["ports"], Value::Null);
    assert_eq!(sidecar["startupProbe"]["tcpSocket"]["port"], json!(metrics));
    assert_eq!(
        annotations["prometheus.io/port"],
        json!(metrics.to_string())
    );
    assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet");
    let keys: Vec<&String> = spec.as_object().unwrap().keys().collect();
    assert_eq!(keys[..2], ["hostNetwork", "dnsPolicy"]);
    assert!(
        notes.iter().any(|n| n.starts_with(&format!(
            "chooses rank 0's rendezvous port {master} (--master-port, MASTER_PORT) and the sidecar's metrics port {metrics} (--metrics-addr=0.0.0.0:{metrics}) for \"ml/ddp\""
        ))),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("sets dnsPolicy ClusterFirstWithHostNet (was none)")),
        "{notes:?}"
    );
    // Another job of the namespace: other ports.
    let (other, _, _) = injected(&job("ddp-2", true, ""), &config(&[]));
    assert_ne!(args_of(&other, 0), args_of(&spec, 0));
    assert_ne!(args_of(&other, 1), args_of(&spec, 1));
}

#[test]
fn a_pod_network_template_keeps_todays_defaults() {
    let (spec, annotations, notes) = injected(&job("ddp", false, ""), &config(&[]));
    assert!(!has_flag(&args_of(&spec, 0), "master-port"));
    assert!(!has_flag(&args_of(&spec, 1), "metrics-addr"));
    let sidecar = &spec["initContainers"][1];
    assert_eq!(
        sidecar["ports"],
        json!([{"name": "trainlet", "containerPort": 9464}])
    );
    assert_eq!(sidecar["startupProbe"]["tcpSocket"]["port"], "trainlet");
    assert_eq!(annotations["prometheus.io/port"], "9464");
    assert_eq!(spec["dnsPolicy"], Value::Null);
    assert!(
        !notes.iter().any(|n| n.contains("hostNetwork")),
        "{notes:?}"
    );
}

#[test]
fn metrics_addr_moves_the_port_the_probe_and_the_annotation_together() {
    let cfg = config(&["--metrics-addr", "0.0.0.0:9465"]);
    let (spec, annotations, _) = injected(&job("ddp", false, ""), &cfg);
    let sidecar = &spec["initContainers"][1];
    assert!(args_of(&spec, 1).contains(&"--metrics-addr=0.0.0.0:9465".to_string()));
    assert_eq!(
        sidecar["ports"],
        json!([{"name": "trainlet", "containerPort": 9465}])
    );
    assert_eq!(sidecar["startupProbe"]["tcpSocket"]["port"], "trainlet");
    assert_eq!(annotations["prometheus.io/port"], "9465");
    // On hostNetwork the flags win, the default address too.
    let cfg = config(&["--master-port", "29501", "--metrics-addr", "0.0.0.0:9464"]);
    let (spec, annotations, notes) = injected(&job("ddp", true, ""), &cfg);
    assert!(args_of(&spec, 0).contains(&"--master-port=29501".to_string()));
    assert!(!has_flag(&args_of(&spec, 1), "metrics-addr"));
    assert_eq!(
        spec["initContainers"][1]["startupProbe"]["tcpSocket"]["port"],
        9464
    );
    assert_eq!(annotations["prometheus.io/port"], "9464");
    assert!(!notes.iter().any(|n| n.starts_with("chooses")), "{notes:?}");
}

#[test]
fn a_task_port_serves_as_the_rendezvous_port_but_mpis() {
    let (spec, _, _) = injected(&job("ddp", true, ""), &config(&["--port", "2222"]));
    assert!(!has_flag(&args_of(&spec, 0), "master-port"));
    assert!(has_flag(&args_of(&spec, 1), "metrics-addr"));
    let cfg = config(&["--port", "2222", "--framework", "mpi,pytorch"]);
    let (spec, _, _) = injected(&job("ddp", true, ""), &cfg);
    assert!(has_flag(&args_of(&spec, 0), "master-port"));
}

#[test]
fn a_users_dns_policy_is_kept_and_cluster_first_becomes_with_host_net() {
    for (given, want) in [
        ("Default", "Default"),
        ("None", "None"),
        ("ClusterFirstWithHostNet", "ClusterFirstWithHostNet"),
        ("ClusterFirst", "ClusterFirstWithHostNet"),
    ] {
        let src = job("ddp", true, &format!("      dnsPolicy: {given}\n"));
        let (spec, _, notes) = injected(&src, &config(&[]));
        assert_eq!(spec["dnsPolicy"], want, "{given}");
        let noted = notes.iter().any(|n| n.starts_with("sets dnsPolicy"));
        assert_eq!(noted, given == "ClusterFirst", "{given}: {notes:?}");
    }
}

#[test]
fn a_second_inject_keeps_the_ports_also_with_a_namespace_added() {
    let cfg = config(&[]);
    let src = job("ddp", true, "").replace("  namespace: ml\n", "");
    let once = inject(&src, &cfg).unwrap().yaml;
    assert_eq!(inject(&once, &cfg).unwrap().yaml, once);
    // Read back from the API server: with its namespace, which would choose others.
    let read_back = once.replacen("  name: ddp\n", "  name: ddp\n  namespace: ml\n", 1);
    let (spec, _, notes) = injected(&read_back, &cfg);
    let (first, _, _) = injected(&once, &cfg);
    assert_eq!(args_of(&spec, 0), args_of(&first, 0));
    assert_eq!(args_of(&spec, 1), args_of(&first, 1));
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("keeps an earlier inject's --master-port=")),
        "{notes:?}"
    );
}

#[test]
fn a_bad_metrics_addr_is_a_usage_error_naming_the_flag() {
    for bad in ["off", "9465", "localhost:9464", "0.0.0.0:0", "[::1]:9464"] {
        let f = parsed(&["--metrics-addr", bad]).unwrap_err();
        assert_eq!(f.code, Code::Usage, "{bad}");
        assert_eq!(
            f.message,
            format!(
                "invalid --metrics-addr {bad:?}: give IPV4:PORT or [::]:PORT with a PORT from 1 to 65535, e.g. 0.0.0.0:9464"
            )
        );
    }
}
