//! trainlet's alerts (manifests/monitoring/), as shipped:
//! - `promtool check rules` accepts the rule file and `promtool test rules` passes its
//!   unit tests, where every alert fires and stays quiet at least once;
//! - the PrometheusRule is exactly `scripts/prometheusrule`'s output, so it says what the
//!   rule file says;
//! - the alerts speak of metrics trainlet exports, of trainlet's own critical XIDs and of
//!   the job labels the PodMonitor brings, and each has a section in docs/alerts.md;
//! - the PrometheusRule passes a server-side dry run against the Prometheus Operator's
//!   CRD on the real API server (as packaging.rs does for the PodMonitor).
//!
//! promtool comes with Debian's prometheus package, which .ci/deps installs: a missing
//! promtool fails these tests, unless `TRAINLET_TEST_SKIP` names `deps`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

use crate::support::*;

/// Every alert, in the order of the rule file and of docs/alerts.md.
const ALERTS: [&str; 17] = [
    "TrainletGPUCountMismatch",
    "TrainletGPULost",
    "TrainletGPUXidCritical",
    "TrainletGPUXidError",
    "TrainletPodDegraded",
    "TrainletOOMKill",
    "TrainletPortConflict",
    "TrainletClusterStale",
    "TrainletRestartsFrequent",
    "TrainletRestartBudgetSpent",
    "TrainletStalled",
    "TrainletTargetDown",
    "TrainletExecObservationsStale",
    "TrainletAPIErrors",
    "TrainletObservationsRejected",
    "TrainletEventsDropped",
    "TrainletAdminConnectionsRefused",
];

fn monitoring() -> PathBuf {
    repo().join("manifests/monitoring")
}

fn rules_file() -> PathBuf {
    monitoring().join("rules/trainlet.rules.yaml")
}

fn rules_test_file() -> PathBuf {
    monitoring().join("rules/trainlet.rules.test.yaml")
}

fn load_yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap();
    let mut docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {y:?}"))
}

/// Every rule of the rule file, in order.
fn rules() -> Vec<Yaml> {
    let doc = load_yaml(&rules_file());
    doc["groups"]
        .as_vec()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_vec().expect("rules").clone())
        .collect()
}

/// promtool's output, or what is missing (group `deps`).
fn promtool(args: &[&str], dir: &Path) -> Result<Output, Missing> {
    Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            Missing::new(
                Group::Deps,
                format!(
                    "promtool is not installed ({e}); run .ci/deps (Debian package prometheus)"
                ),
            )
        })
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = monitoring().join("rules");
    let check = require!(promtool(&["check", "rules", "trainlet.rules.yaml"], &dir));
    assert!(check.status.success(), "{}", text(&check));
    assert_eq!(
        String::from_utf8_lossy(&check.stdout),
        "Checking trainlet.rules.yaml\n  SUCCESS: 17 rules found\n\n"
    );
    let test = promtool(&["test", "rules", "trainlet.rules.test.yaml"], &dir).unwrap();
    assert!(test.status.success(), "{}", text(&test));
    assert_eq!(
        String::from_utf8_lossy(&test.stdout),
        "Unit Testing:  trainlet.rules.test.yaml\n  SUCCESS\n\n"
    );

    // A check that can fail: the same tests against rules whose cluster alert waits 5
    // minutes instead of 10 fail where it must not fire yet.
    let tmp = tempfile::tempdir().unwrap();
    let rules = std::fs::read_to_string(rules_file()).unwrap();
    assert_eq!(rules.matches("for: 10m").count(), 1);
    std::fs::write(
        tmp.path().join("trainlet.rules.yaml"),
        rules.replace("for: 10m", "for: 5m"),
    )
    .unwrap();
    std::fs::copy(
        rules_test_file(),
        tmp.path().join("trainlet.rules.test.yaml"),
    )
    .unwrap();
    let bad = promtool(&["test", "rules", "trainlet.rules.test.yaml"], tmp.path()).unwrap();
    assert!(!bad.status.success(), "{}", text(&bad));
    assert!(
        text(&bad).contains("alertname: TrainletClusterStale, time: 14m"),
        "{}",
        text(&bad)
    );
}

#[test]
fn the_prometheusrule_is_the_rule_file() {
    let out = Command::new(repo().join("scripts/prometheusrule"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let committed = std::fs::read_to_string(monitoring().join("prometheusrule.yaml")).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == committed,
        "manifests/monitoring/prometheusrule.yaml is not what scripts/prometheusrule makes of \
         manifests/monitoring/rules/trainlet.rules.yaml: run `make monitoring` and commit it"
    );
    // And the YAML says the same: the PrometheusRule's spec is the rule file.
    let crd = load_yaml(&monitoring().join("prometheusrule.yaml"));
    assert_eq!(
        str_of(&crd["apiVersion"], "apiVersion"),
        "monitoring.coreos.com/v1"
    );
    assert_eq!(str_of(&crd["kind"], "kind"), "PrometheusRule");
    assert_eq!(crd["spec"], load_yaml(&rules_file()));
}

#[test]
fn every_alert_is_tested_documented_and_speaks_of_real_metrics() {
    let rules = rules();
    let names: Vec<&str> = rules.iter().map(|r| str_of(&r["alert"], "alert")).collect();
    assert_eq!(names, ALERTS);

    // Labels and annotations: a severity, and the same four annotations everywhere,
    // the runbook_url pointing at the alert's section of docs/alerts.md.
    let docs = format!("{}/blob/main/docs/alerts.md", env!("CARGO_PKG_REPOSITORY"));
    assert_eq!(
        docs,
        "https://github.com/trainlet/trainlet/blob/main/docs/alerts.md"
    );
    let mut severities = BTreeMap::new();
    for r in &rules {
        let name = str_of(&r["alert"], "alert");
        let labels = r["labels"].as_hash().expect("labels");
        assert_eq!(labels.len(), 1, "{name}: {labels:?}");
        severities.insert(name, str_of(&r["labels"]["severity"], "severity"));
        let keys: Vec<&str> = r["annotations"]
            .as_hash()
            .expect("annotations")
            .keys()
            .map(|k| str_of(k, "key"))
            .collect();
        assert_eq!(
            keys,
            ["summary", "description", "runbook", "runbook_url"],
            "{name}"
        );
        assert_eq!(
            str_of(&r["annotations"]["runbook_url"], "runbook_url"),
            format!("{docs}#{}", name.to_lowercase()),
            "{name}"
        );
    }
    let critical: Vec<&str> = severities
        .iter()
        .filter(|(_, s)| **s == "critical")
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(critical, ["TrainletGPULost", "TrainletGPUXidCritical"]);
    let info: Vec<&str> = severities
        .iter()
        .filter(|(_, s)| **s == "info")
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(info, ["TrainletEventsDropped"]);
    assert!(
        severities
            .values()
            .all(|s| ["critical", "warning", "info"].contains(s)),
        "{severities:?}"
    );

    // docs/alerts.md: one section per alert, in the same order, and no other.
    let md = std::fs::read_to_string(repo().join("docs/alerts.md")).unwrap();
    let sections: Vec<&str> = md
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter(|h| h.starts_with("Trainlet"))
        .collect();
    assert_eq!(sections, ALERTS);

    // The unit tests: every alert fires somewhere and must stay quiet somewhere.
    let tests = load_yaml(&rules_test_file());
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for t in tests["tests"].as_vec().expect("tests") {
        for a in t["alert_rule_test"].as_vec().expect("alert_rule_test") {
            let name = str_of(&a["alertname"], "alertname");
            match a["exp_alerts"].as_vec().expect("exp_alerts").is_empty() {
                true => quiet.insert(name),
                false => fires.insert(name),
            };
        }
    }
    let all: BTreeSet<&str> = ALERTS.into_iter().collect();
    assert_eq!(fires, all, "alerts with a test where they fire");
    assert_eq!(quiet, all, "alerts with a test where they must not fire");

    // Every trainlet_* name in an expression is a series trainlet exports, as Prometheus
    // names it (counters with _total). A family without a child is not encoded at all,
    // so each gets one.
    use trainlet::metrics::*;
    let m = Metrics::new();
    let (gpu, uuid, xid) = ("0".to_string(), "GPU-a".to_string(), "79".to_string());
    m.gpu_info
        .get_or_create(&GpuLabel {
            gpu: gpu.clone(),
            uuid: uuid.clone(),
            model: "H100".into(),
        })
        .set(1);
    m.gpu_xid_errors
        .get_or_create(&XidLabel { gpu, uuid, xid })
        .inc();
    m.oom_kills
        .get_or_create(&ContainerLabel {
            container: "train".into(),
        })
        .inc();
    m.port_conflict
        .get_or_create(&PortLabel {
            port: "8470".into(),
        })
        .set(1);
    m.progress
        .stalled
        .get_or_create(&ContainerLabel {
            container: "train".into(),
        })
        .set(1);
    for family in [&m.observations_rejected, &m.events_dropped] {
        family
            .get_or_create(&ReasonLabel {
                reason: "invalid".into(),
            })
            .inc();
    }
    let exported: BTreeSet<String> = to_classic_text(&m.encode())
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    let mut used = BTreeSet::new();
    for r in &rules {
        let expr = str_of(&r["expr"], "expr");
        for (i, _) in expr.match_indices("trainlet_") {
            let name: String = expr[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            used.insert(name);
        }
    }
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the rules use {unknown:?}, which trainlet does not export ({exported:?})"
    );
    assert_eq!(used.len(), 15, "the metrics the rules read: {used:?}");

    // The critical XIDs are trainlet's own (src/report/xid.rs), in both rules.
    let theirs: Vec<u64> = (0..1000)
        .filter(|x| trainlet::report::probe::gpu::xid::is_critical(*x))
        .collect();
    let list = theirs
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("|");
    assert_eq!(list, "48|62|64|74|79|95|119|120|140");
    let xid_rule = |name: &str| {
        let r = rules
            .iter()
            .find(|r| r["alert"].as_str() == Some(name))
            .unwrap();
        str_of(&r["expr"], "expr").to_string()
    };
    assert_eq!(
        xid_rule("TrainletGPUXidCritical"),
        format!("trainlet_gpu_xid_errors_total{{xid=~\"{list}\"}} > 0")
    );
    let error = xid_rule("TrainletGPUXidError");
    assert_eq!(
        error.matches(&format!("{{xid!~\"{list}\"}}")).count(),
        3,
        "{error}"
    );

    // Per-job aggregation is by namespace and exactly the labels that the PodMonitor's
    // podTargetLabels bring, sanitized as the Prometheus Operator does.
    let podmonitor = load_yaml(&monitoring().join("podmonitor.yaml"));
    let mut job_labels = vec!["namespace".to_string()];
    job_labels.extend(
        podmonitor["spec"]["podTargetLabels"]
            .as_vec()
            .expect("podTargetLabels")
            .iter()
            .map(|l| {
                str_of(l, "label")
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect::<String>()
            }),
    );
    assert_eq!(
        job_labels,
        [
            "namespace",
            "batch_kubernetes_io_job_name",
            "job_name",
            "jobset_sigs_k8s_io_jobset_name",
            "training_kubeflow_org_job_name",
            "app_kubernetes_io_name"
        ]
    );
    let mut aggregated = Vec::new();
    for r in &rules {
        let expr = str_of(&r["expr"], "expr");
        for (i, _) in expr.match_indices(" by (") {
            let rest = &expr[i + " by (".len()..];
            let by: Vec<&str> = rest[..rest.find(')').unwrap()].split(", ").collect();
            assert_eq!(by, job_labels, "{}", str_of(&r["alert"], "alert"));
            aggregated.push(str_of(&r["alert"], "alert"));
        }
    }
    assert_eq!(
        aggregated,
        [
            "TrainletClusterStale",
            "TrainletRestartsFrequent",
            "TrainletRestartBudgetSpent",
            // Stalled now, or stalled in the last hour: two aggregations.
            "TrainletStalled",
            "TrainletStalled"
        ]
    );
}

/// Installs the Prometheus Operator's PrometheusRule CRD from its Go module
/// (`tests/control-plane/crd prometheusrule`), once per run, and waits until it is
/// Established; as support's install_crd does for the PodMonitor's.
fn prometheusrule_crd() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        const CRD: &str = "prometheusrules.monitoring.coreos.com";
        let out = Command::new(repo().join("tests/control-plane/crd"))
            .arg("prometheusrule")
            .output()
            .expect("tests/control-plane/crd runs");
        assert!(
            out.status.success(),
            "tests/control-plane/crd prometheusrule: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = String::from_utf8(out.stdout).unwrap();
        // Server-side: the CRD is larger than client-side apply's annotation allows.
        kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            path.trim(),
        ]);
        let start = Instant::now();
        loop {
            let conditions: Value = serde_json::from_str(&kubectl(&[
                "get",
                &format!("crd/{CRD}"),
                "-o",
                "jsonpath={.status.conditions}",
            ]))
            .unwrap_or(Value::Null);
            if conditions.as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            }) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the CRD {CRD} is not Established after 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    });
}

/// `kubectl apply --dry-run=server -n NS -f -` of `yaml`: (success, stdout, stderr).
fn dry_run(ns: &str, args: &[&str], yaml: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["apply", "--dry-run=server", "-n", ns])
        .args(args);
    // Without input, an empty stdin: kubectl reads it only for `-f -`.
    let out = output_with_stdin(&mut cmd, yaml.unwrap_or_default().as_bytes());
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_prometheusrule_passes_a_server_side_dry_run() {
    prometheusrule_crd();
    podmonitor_crd();
    let client = admin().await;
    let ns = namespace(&client, "monitoring").await;
    let file = monitoring().join("prometheusrule.yaml");
    let yaml = std::fs::read_to_string(&file).unwrap();

    let (ok, stdout, stderr) = dry_run(&ns, &["-f", "-"], Some(&yaml));
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout,
        "prometheusrule.monitoring.coreos.com/trainlet created (server dry run)\n"
    );
    assert_eq!(stderr, "", "a warning");

    // The whole directory at once, as the docs install it: the PodMonitor and the
    // PrometheusRule, and nothing from rules/ (kubectl does not recurse without -R).
    let (ok, stdout, stderr) = dry_run(&ns, &["-f", monitoring().to_str().unwrap()], None);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout,
        "podmonitor.monitoring.coreos.com/trainlet created (server dry run)\n\
         prometheusrule.monitoring.coreos.com/trainlet created (server dry run)\n"
    );
    assert_eq!(stderr, "", "a warning");

    // A check that can fail: the CRD's schema refuses a `for` that is no duration.
    let bad = yaml.replacen("for: 10m", "for: ten minutes", 1);
    assert_ne!(bad, yaml);
    let (ok, _, stderr) = dry_run(&ns, &["-f", "-"], Some(&bad));
    assert!(!ok);
    assert!(
        stderr.contains("spec.groups[2].rules[0].for: Invalid value: \"ten minutes\""),
        "{stderr}"
    );
    delete_namespace(&client, &ns).await;
}
