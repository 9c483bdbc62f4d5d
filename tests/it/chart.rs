//! The Helm chart (`charts/trainlet`): the objects of manifests/ with what a cluster
//! admin sets (image, resources, the namespaces that run jobs, which policies). Helm is
//! the real one, built from its Go module by tests/helm/build, once per machine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::admission::{PARAMS, container, init_images, install_unguarded, labelled};
use crate::admission_params::Shipped;
use crate::support::*;

/// Helm, built once; a build that fails fails the test that needs it.
fn helm() -> Command {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    let bin = HELM.get_or_init(|| {
        let out = Command::new(repo().join("tests/helm/build"))
            .output()
            .expect("tests/helm/build");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "tests/helm/build failed:\n{stderr}");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    });
    let mut c = Command::new(bin);
    // Helm's own state (repositories, cache) out of $HOME.
    let home = std::env::temp_dir().join("trainlet-helm-home");
    c.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    c
}

fn chart() -> PathBuf {
    repo().join("charts/trainlet")
}

/// The objects of a YAML stream, as kubectl reads them, in one order.
fn objects(kc: &Path, yaml: &str) -> Vec<Value> {
    let mut items = all_as_json(kc, yaml);
    items.sort_by_key(|o| o.to_string());
    items
}

#[test]
fn helm_lint_finds_nothing() {
    let out = stdout_of(helm().args(["lint", "--strict"]).arg(chart()));
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}

/// The objects of manifests/ as the chart's defaults install them: trainlet's RBAC in
/// the namespace `default`, the guard, the admission policy with its parameter object;
/// sorted.
fn manifests_objects(kc: &Path) -> Vec<Value> {
    let read = |p: &str| std::fs::read_to_string(repo().join(p)).unwrap();
    let rbac: Vec<Value> = objects(kc, &read("manifests/rbac.yaml"))
        .into_iter()
        .map(|mut o| {
            o["metadata"]["namespace"] = json!("default");
            if let Some(subjects) = o.get_mut("subjects").and_then(Value::as_array_mut) {
                for s in subjects {
                    s["namespace"] = json!("default");
                }
            }
            o
        })
        .collect();
    let mut all: Vec<Value> = [
        "manifests/guard/own-pod-only.yaml",
        "manifests/admission/policy.yaml",
    ]
    .iter()
    .flat_map(|p| objects(kc, &read(p)))
    .chain(rbac)
    .collect();
    all.sort_by_key(|o| o.to_string());
    all
}

/// One source of truth: the chart with its defaults renders exactly the objects of
/// manifests/ (trainlet's RBAC in the namespace `default`, the guard, the admission
/// policy with its parameter object).
#[test]
fn the_chart_with_its_defaults_is_manifests() {
    let kc = kubeconfig();
    let rendered = stdout_of(helm().args(["template", "trainlet"]).arg(chart()));
    assert_eq!(objects(kc, &rendered), manifests_objects(kc));
}

/// The release's install.yaml (`make release`) is the same objects, the image pinned by
/// the release's digest the one difference.
#[test]
fn the_releases_install_yaml_is_manifests_with_the_pinned_image() {
    let dir = require!(crate::release::artifacts());
    let kc = kubeconfig();
    let install = objects(
        kc,
        &std::fs::read_to_string(dir.join("install.yaml")).unwrap(),
    );
    let image = install
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .and_then(|o| o["data"]["image"].as_str())
        .expect("the parameter object's image");
    assert!(
        image.starts_with("ghcr.io/trainlet/trainlet@sha256:"),
        "{image}"
    );
    let mut want = manifests_objects(kc);
    for o in want.iter_mut().filter(|o| o["kind"] == "ConfigMap") {
        assert_eq!(o["data"]["image"], "ghcr.io/trainlet/trainlet:0.1.0");
        o["data"]["image"] = json!(image);
    }
    want.sort_by_key(|o| o.to_string());
    assert_eq!(install, want);
}

/// Helm takes over what `kubectl apply -k manifests/admission/` made (the ownership
/// metadata Helm looks for on an object it did not create), as a cluster admin moving
/// to the chart does.
fn adopt(kc: &Path, release: &str, namespace: &str) {
    let cluster = [
        "mutatingadmissionpolicy/trainlet-inject",
        "mutatingadmissionpolicybinding/trainlet-inject",
        "validatingadmissionpolicy/trainlet-inject",
        "validatingadmissionpolicybinding/trainlet-inject",
        "validatingadmissionpolicy/trainlet-inject-parameters",
        "validatingadmissionpolicybinding/trainlet-inject-parameters",
        "namespace/trainlet-system",
    ];
    let owner = [
        format!("meta.helm.sh/release-name={release}"),
        format!("meta.helm.sh/release-namespace={namespace}"),
    ];
    for (object, ns) in cluster
        .iter()
        .map(|o| (*o, None))
        .chain([("configmap/trainlet-inject", Some("trainlet-system"))])
    {
        let mut args = vec!["annotate", "--overwrite", object, &owner[0], &owner[1]];
        let mut label = vec![
            "label",
            "--overwrite",
            object,
            "app.kubernetes.io/managed-by=Helm",
        ];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
            label.extend(["-n", ns]);
        }
        kubectl_on(kc, &args);
        kubectl_on(kc, &label);
    }
}

/// `helm install` into the control plane, with the image as one value: trainlet's RBAC
/// in the job's namespace, and a labelled pod comes out with that image; the guard left
/// out, as a value says.
#[tokio::test]
async fn helm_install_sets_the_image_in_one_value_and_a_labelled_pod_gets_it() {
    let kc = kubeconfig();
    let client = admin().await;
    // Pod Security `restricted`, and none of trainlet's RBAC yet: the chart brings it.
    let ns = namespace_with_labels(
        &client,
        "chart",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    )
    .await;
    let _alone = PARAMS.write().await;
    // What `kubectl apply -k manifests/admission/` made, which the chart takes over;
    // shown working in a namespace with trainlet's RBAC.
    let applied = restricted_namespace(kc, &client, "chart-applied").await;
    install_unguarded(kc, &applied).await;
    let _shipped = Shipped(kc);
    adopt(kc, "trainlet", &ns);
    let image = "registry.example.test/helm/trainlet:0.1.0";
    stdout_of(
        helm()
            .arg("install")
            .arg("trainlet")
            .arg(chart())
            .arg("--kubeconfig")
            .arg(kc)
            .args([
                "-n",
                &ns,
                "--set",
                &format!("image={image}"),
                "--set",
                &format!("namespaces={{{ns}}}"),
                "--set",
                "guard.enabled=false",
            ]),
    );
    for object in ["serviceaccount", "role", "rolebinding"] {
        kubectl_on(kc, &["get", "-n", &ns, object, "trainlet"]);
    }
    let pod = labelled(
        "charted",
        json!({"trainlet.io/job": "worker=app=trainer"}),
        json!([container("main", json!(["python", "train.py"]))]),
    );
    eventually("the chart's image", Duration::from_secs(30), || async {
        let (images, _) = init_images(kc, &ns, &pod).ok()?;
        (images == [image, image]).then_some(())
    })
    .await;
    delete_namespace(&client, &ns).await;
    delete_namespace(&client, &applied).await;
}
