//! manifests/admission/: the MutatingAdmissionPolicy that adds trainlet to pods labelled
//! `trainlet.io/inject: "true"`, on the real API server. The policy is
//! `trainlet inject --admission-policy`'s output; for the same settings, the pod the
//! API server makes of a plain pod with the label and annotations is the pod it makes
//! of `trainlet inject`'s output. The ValidatingAdmissionPolicy beside it refuses bad
//! settings, naming the annotation. On the real node, a plain Indexed Job with only
//! the label and annotations completes with TF_CONFIG and torch.env right.
//!
//! The policies are cluster-scoped and act on labelled pods only, which no other test
//! makes: they share the control planes.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::node_pods::{On, main_container, plain_job};
use crate::support::*;

const POLICY: &str = "manifests/admission/policy.yaml";

/// `trainlet inject --admission-policy`, as shipped; `TRAINLET_WRITE_DOCS=1` writes it.
#[test]
fn the_shipped_policy_is_what_inject_prints() {
    let printed = run(trainlet().args(["inject", "--admission-policy"]));
    assert_eq!(printed.code, 0, "{}", printed.stderr);
    let path = repo().join(POLICY);
    if std::env::var_os("TRAINLET_WRITE_DOCS").is_some() {
        std::fs::write(&path, &printed.stdout).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        printed.stdout,
        "{POLICY} is stale: run `make docs`"
    );
}

/// Settings are for the pods, not for the policy: a flag that only a pod can give is
/// refused, naming it.
#[test]
fn admission_policy_refuses_the_pods_own_flags() {
    let r = run(trainlet().args(["inject", "--admission-policy", "--wrap", "main"]));
    assert_eq!(r.code, 2);
    assert_eq!(
        r.stderr,
        "trainlet: error: --wrap is not for --admission-policy: the policy reads each pod's settings from its annotations (trainlet.io/<flag>); it takes --image, --resources and --service-account\n"
    );
}

/// The policy's parameter object, shared by every test on one control plane: a test
/// that changes it holds it alone ([`crate::admission_params`]); every other test that
/// uses the policy holds it to read while it runs.
pub(crate) static PARAMS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Installs the shipped policy and waits until the API server applies it; the guard
/// keeps the parameter object as shipped while the test runs.
pub(crate) async fn install(kc: &Path, ns: &str) -> tokio::sync::RwLockReadGuard<'static, ()> {
    let params = PARAMS.read().await;
    install_unguarded(kc, ns).await;
    params
}

/// [`install`], for the test that holds [`PARAMS`] alone.
pub(crate) async fn install_unguarded(kc: &Path, ns: &str) {
    let dir = repo().join("manifests/admission");
    // One apply at a time: on a fresh control plane, two tests creating the same
    // cluster-scoped policies at once made one `kubectl apply` fail.
    static APPLY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    {
        let _one = APPLY.lock().unwrap_or_else(|e| e.into_inner());
        kubectl_on(kc, &["apply", "-k", dir.to_str().unwrap()]);
    }
    let probe = labelled(
        "probe",
        json!({"trainlet.io/job": "worker=app=probe"}),
        json!([container("main", json!(["true"]))]),
    );
    // A pod that opts in without its required setting: refused once the validating
    // policy is loaded, which the API server does apart from the mutating one.
    let unset = labelled(
        "unset",
        json!({}),
        json!([container("main", json!(["true"]))]),
    );
    eventually("the policies to apply", Duration::from_secs(60), || async {
        let out = dry_run(kc, ns, &probe);
        let mutated = out["spec"]["initContainers"][0]["name"] == "trainlet-init";
        let validated = !create_dry_run(kc, ns, &unset, "name").status.success();
        (mutated && validated).then_some(())
    })
    .await;
}

/// `kubectl create --dry-run=server` of `pod`: the images of its init containers (none
/// when it was not injected) and kubectl's stderr (the API server's warnings); or, when
/// the API server refused it (as while a policy is being loaded), why.
pub(crate) fn init_images(
    kc: &Path,
    ns: &str,
    pod: &Value,
) -> Result<(Vec<String>, String), String> {
    let out = create_dry_run(kc, ns, pod, "json");
    let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    let created: Value = serde_json::from_slice(&out.stdout).map_err(|_| stderr.clone())?;
    let images = created["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["image"].as_str().unwrap_or_default().to_string())
        .collect();
    Ok((images, stderr))
}

/// A container as Pod Security `restricted` wants it.
pub(crate) fn container(name: &str, command: Value) -> Value {
    json!({
        "name": name,
        "image": "trainer:1",
        "command": command,
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
    })
}

/// A Pod with the opt-in label and these annotations.
pub(crate) fn labelled(name: &str, annotations: Value, containers: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"trainlet.io/inject": "true", "app": "trainer"},
            "annotations": annotations
        },
        "spec": restricted_spec(containers, json!([]), json!([]))
    })
}

pub(crate) fn restricted_spec(containers: Value, inits: Value, volumes: Value) -> Value {
    let mut spec = json!({
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "containers": containers,
    });
    if inits.as_array().is_some_and(|a| !a.is_empty()) {
        spec["initContainers"] = inits;
    }
    if volumes.as_array().is_some_and(|a| !a.is_empty()) {
        spec["volumes"] = volumes;
    }
    spec
}

/// `kubectl create --dry-run=server -o OUTPUT` of `doc`: what the API server would
/// do with it (admission, defaults), without creating it.
pub(crate) fn create_dry_run(
    kc: &Path,
    ns: &str,
    doc: &Value,
    output: &str,
) -> std::process::Output {
    output_with_stdin(
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kc)
            .args([
                "create",
                "--dry-run=server",
                "-o",
                output,
                "-n",
                ns,
                "-f",
                "-",
            ]),
        doc.to_string().as_bytes(),
    )
}

/// The pod the API server would create of `doc`, failing on an error or a warning (Pod
/// Security's included).
pub(crate) fn dry_run(kc: &Path, ns: &str, doc: &Value) -> Value {
    let out = create_dry_run(kc, ns, doc, "json");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl create failed:\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "kubectl create warned:\n{stderr}"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The API server's refusal of `doc`.
fn refused(kc: &Path, ns: &str, doc: &Value) -> String {
    let out = create_dry_run(kc, ns, doc, "name");
    assert!(
        !out.status.success(),
        "accepted: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).trim_end().to_string()
}

/// `trainlet inject -f - FLAGS` of `doc`, as JSON.
pub(crate) fn injected(doc: &Value, flags: &[&str]) -> Value {
    // kubectl gives the object its kubeconfig's namespace; it goes into the test's.
    let mut doc = as_json(kubeconfig(), &inject_printed(doc, flags));
    doc["metadata"].as_object_mut().unwrap().remove("namespace");
    doc
}

/// A case: its name, the annotations, the same settings as inject's flags, the pod's
/// containers, init containers and volumes.
type Case<'a> = (&'a str, Value, Vec<&'a str>, Value, Value, Value);

/// For each case (annotations, the same settings as inject's flags, the pod's
/// containers, init containers and volumes): the pod the policy makes of the labelled
/// plain pod is the pod inject's output makes, spec and scrape annotations alike.
#[tokio::test]
async fn the_policy_makes_the_pod_inject_makes_for_the_same_settings() {
    let kc = kubeconfig();
    let client = admin().await;
    let ns = restricted_namespace(kc, &client, "admission").await;
    let _params = install(kc, &ns).await;
    let main = container("main", json!(["python", "train.py"]));
    let mut main_env = main.clone();
    main_env["env"] = json!([{"name": "EPOCHS", "value": "3"}]);
    main_env["ports"] = json!([{"name": "tf", "containerPort": 2222}]);
    main_env["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let mut logger = container("logger", json!(["sh", "-c", "tail -F /data/log"]));
    logger["volumeMounts"] = json!([{"name": "data", "mountPath": "/data", "readOnly": true}]);
    let mut fetch = container("fetch", json!(["sh", "-c", "echo fetched > /data/ok"]));
    fetch["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let data = json!([{"name": "data", "emptyDir": {}}]);
    let cases: Vec<Case> = vec![
        (
            "wrapped",
            json!({
                "trainlet.io/job": "worker=app=trainer",
                "trainlet.io/expect": "worker=2",
                "trainlet.io/wrap": "main",
            }),
            vec![
                "--job",
                "worker=app=trainer",
                "--expect",
                "worker=2",
                "--wrap",
                "main",
            ],
            json!([main]),
            json!([]),
            json!([]),
        ),
        (
            "everything",
            json!({
                "trainlet.io/job": "chief=app=trainer,role=chief; worker=app=trainer,role=worker",
                "trainlet.io/expect": "chief=1,worker=3",
                "trainlet.io/port-name": "tf",
                "trainlet.io/address": "pod-ip",
                "trainlet.io/timeout": "20m",
                "trainlet.io/preflight": "true",
                "trainlet.io/framework": "tensorflow,pytorch",
                "trainlet.io/wrap": "main",
                "trainlet.io/on-peer-change": "restart",
                "trainlet.io/max-restarts": "5",
                "trainlet.io/stall-after": "10m",
                "trainlet.io/on-stall": "restart",
                "trainlet.io/progress-pattern": r"step (\d+)",
            }),
            vec![
                "--job",
                "chief=app=trainer,role=chief",
                "--job",
                "worker=app=trainer,role=worker",
                "--expect",
                "chief=1,worker=3",
                "--port-name",
                "tf",
                "--timeout",
                "20m",
                "--preflight",
                "--framework",
                "tensorflow,pytorch",
                "--wrap",
                "main",
                "--on-peer-change",
                "restart",
                "--max-restarts",
                "5",
                "--stall-after",
                "10m",
                "--on-stall",
                "restart",
                "--progress-pattern",
                r"step (\d+)",
            ],
            json!([main_env, logger]),
            json!([fetch]),
            data,
        ),
        (
            "unwrapped",
            json!({
                "trainlet.io/job": "worker=app=trainer",
                "trainlet.io/framework": "jax",
            }),
            vec!["--job", "worker=app=trainer", "--framework", "jax"],
            json!([main]),
            json!([]),
            json!([]),
        ),
    ];
    for (name, annotations, flags, containers, inits, volumes) in cases {
        let spec = restricted_spec(containers, inits, volumes);
        let plain = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "trainer"}},
            "spec": spec
        });
        let mut opted = plain.clone();
        opted["metadata"]["labels"]["trainlet.io/inject"] = json!("true");
        opted["metadata"]["annotations"] = annotations.clone();
        let by_policy = dry_run(kc, &ns, &opted);
        let by_inject = dry_run(kc, &ns, &injected(&plain, &flags));
        assert_eq!(
            by_policy["spec"], by_inject["spec"],
            "{name}: the policy's pod and inject's differ"
        );
        let mut want = by_inject["metadata"]["annotations"].clone();
        for (k, v) in annotations.as_object().unwrap() {
            want[k] = v.clone();
        }
        assert_eq!(by_policy["metadata"]["annotations"], want, "{name}");
        // No default token in any container: trainlet's own get theirs.
        assert!(
            !by_policy.to_string().contains("kube-api-access-"),
            "{name}: {by_policy}"
        );
    }
    // A pod that passed through inject already is left as it is.
    let plain = labelled(
        "twice",
        json!({"trainlet.io/job": "worker=app=trainer", "trainlet.io/wrap": "main"}),
        json!([main]),
    );
    let once = injected(&plain, &["--job", "worker=app=trainer", "--wrap", "main"]);
    let mut unlabelled = once.clone();
    unlabelled["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("trainlet.io/inject");
    assert_eq!(
        dry_run(kc, &ns, &once)["spec"],
        dry_run(kc, &ns, &unlabelled)["spec"]
    );
    // So is inject's output with the label but none of the settings' annotations (the
    // docs say labelling an injected pod changes nothing; it was refused for want of
    // trainlet.io/job).
    let mut bare = once.clone();
    bare["metadata"]
        .as_object_mut()
        .unwrap()
        .insert("annotations".into(), json!({}));
    assert_eq!(
        dry_run(kc, &ns, &bare)["spec"],
        dry_run(kc, &ns, &unlabelled)["spec"]
    );
    delete_namespace(&client, &ns).await;
}

/// A pod that opts in with settings missing or bad is refused at admission, and the
/// message names the annotation (and its value).
#[tokio::test]
async fn bad_settings_are_refused_at_admission_naming_the_annotation() {
    let kc = kubeconfig();
    let client = admin().await;
    let ns = restricted_namespace(kc, &client, "admission-bad").await;
    let _params = install(kc, &ns).await;
    let main = json!([container("main", json!(["python", "train.py"]))]);
    let denied = "The pods \"bad\" is invalid: : ValidatingAdmissionPolicy 'trainlet-inject' with binding 'trainlet-inject' denied request: ";
    let job = "worker=app=trainer";
    let cases = [
        (
            json!({}),
            "a pod labelled trainlet.io/inject=true needs the annotation trainlet.io/job",
        ),
        (
            json!({"trainlet.io/job": "worker"}),
            "invalid annotation trainlet.io/job \"worker\": give TYPE=SELECTOR (a TYPE of letters, digits, '_' and '-', a label selector), at most 16 separated by ';'",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/stall_after": "10m"}),
            "unknown annotation trainlet.io/stall_after: trainlet's settings are trainlet.io/<flag> for the flags job, expect, port, port-name, address, cluster-domain, order, ready, rpc-layer, environment, timeout, coordinate, coordinate-from, preflight, framework, nproc-per-node, slots, master-port, coordinator-port, nnodes, on-peer-change, max-restarts, restart-grace, stall-after, on-stall, stall-scope, progress-pattern, on-failure, permanent-exit-codes, metrics-addr, wrap (docs/admission.md)",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/wrap": "trainer"}),
            "invalid annotation trainlet.io/wrap \"trainer\": name a container of this pod that sets `command` (trainlet cannot see an image's ENTRYPOINT)",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/wrap": "main", "trainlet.io/on-stall": "reboot"}),
            "invalid annotation trainlet.io/on-stall \"reboot\": give one of report, restart, exit",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/expect": "worker=two"}),
            "invalid annotation trainlet.io/expect \"worker=two\": give TYPE=N with N at least 1, at most 16 separated by ',' without spaces",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/metrics-addr": "9465"}),
            "invalid annotation trainlet.io/metrics-addr \"9465\": give IPV4:PORT or [::]:PORT with a PORT from 1 to 65535, e.g. 0.0.0.0:9464",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/preflight": "yes"}),
            "invalid annotation trainlet.io/preflight \"yes\": give \"true\" or \"false\"",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/stall-after": "10m"}),
            "the annotation trainlet.io/stall-after acts on the command of the container that trainlet.io/wrap names: add trainlet.io/wrap",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/wrap": "main", "trainlet.io/permanent-exit-codes": "42"}),
            "the annotation trainlet.io/permanent-exit-codes \"42\" names the codes that trainlet.io/on-failure restart does not retry: add it",
        ),
        (
            json!({"trainlet.io/job": job, "trainlet.io/wrap": "main", "trainlet.io/on-failure": "restart", "trainlet.io/permanent-exit-codes": "1, 42"}),
            "invalid annotation trainlet.io/permanent-exit-codes \"1, 42\": give exit codes from 1 to 255 in digits, separated by ',' without spaces, e.g. 2,126,127",
        ),
    ];
    for (annotations, why) in cases {
        let doc = labelled("bad", annotations.clone(), main.clone());
        assert_eq!(
            refused(kc, &ns, &doc),
            format!("{denied}{why}"),
            "{annotations}"
        );
    }
    // The label misspelt: told, not ignored; "false" opts out.
    let settings = json!({"trainlet.io/job": job});
    for label in ["True", "TRUE", "yes", "1"] {
        let mut doc = labelled("bad", settings.clone(), main.clone());
        doc["metadata"]["labels"]["trainlet.io/inject"] = json!(label);
        assert_eq!(
            refused(kc, &ns, &doc),
            format!(
                "{denied}invalid label trainlet.io/inject \"{label}\": give \"true\" to add trainlet, or \"false\" (or no label) for none"
            )
        );
    }
    let mut out = labelled("bad", json!({}), main.clone());
    out["metadata"]["labels"]["trainlet.io/inject"] = json!("false");
    assert_eq!(
        dry_run(kc, &ns, &out)["spec"]["initContainers"],
        Value::Null
    );
    // The names inject adds, taken by the pod's own: inject's words, not the API
    // server's `Duplicate value`.
    let mut own_init = labelled("bad", settings.clone(), main.clone());
    own_init["spec"]["initContainers"] = json!([container("trainlet-init", json!(["sh"]))]);
    let mut own_volume = labelled("bad", settings.clone(), main.clone());
    own_volume["spec"]["volumes"] = json!([{"name": "trainlet", "emptyDir": {}}]);
    for (doc, why) in [
        (
            own_init,
            "initContainers has a container \"trainlet-init\" that trainlet inject did not add; inject adds its own under that name: rename yours",
        ),
        (
            own_volume,
            "has a volume \"trainlet\" that trainlet inject did not add; inject adds its own under that name: rename yours (and the volumeMounts that use it)",
        ),
    ] {
        assert_eq!(refused(kc, &ns, &doc), format!("{denied}{why}"));
    }
    delete_namespace(&client, &ns).await;
}

/// On the real node: a plain Indexed Job whose template has only the label and the
/// annotations runs under trainlet, completes, and its command saw TF_CONFIG and
/// torch.env of the resolved cluster; applying it again changes nothing.
#[tokio::test]
async fn node_runs_a_labelled_job_under_trainlet() {
    let on = require!(On::restricted("admission").await);
    let _params = install(on.kc, &on.ns).await;
    let script = r#"echo "TF_CONFIG=$TF_CONFIG"; sed 's/^/torch.env: /' /etc/trainlet/torch.env"#;
    let mut job = plain_job("labelled", 2, main_container(&["sh", "-c", script], "64Mi"));
    let t = &mut job["spec"]["template"]["metadata"];
    t["labels"]["trainlet.io/inject"] = json!("true");
    t["annotations"] = json!({
        "trainlet.io/job": "worker=batch.kubernetes.io/job-name=labelled",
        "trainlet.io/expect": "worker=2",
        "trainlet.io/framework": "tensorflow,pytorch",
        "trainlet.io/wrap": "main",
    });
    assert_eq!(
        apply_clean(on.kc, &on.ns, &job),
        "job.batch/labelled created\n"
    );
    let (kind, _, message) = on.job_end("labelled").await;
    assert_eq!(kind, "Complete", "{message}");
    let pods = on.only_pods("labelled", 2).await;
    let ips: Vec<String> = pods
        .iter()
        .map(|p| p.status.as_ref().unwrap().pod_ip.clone().unwrap())
        .collect();
    for (rank, p) in pods.iter().enumerate() {
        let spec = p.spec.as_ref().unwrap();
        let inits: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(inits, ["trainlet-init", "trainlet"]);
        let name = kube::ResourceExt::name_any(p);
        let lines = on.cmd_lines(&name, "main").await;
        let tf: Value = serde_json::from_str(
            lines[0]
                .strip_prefix("TF_CONFIG=")
                .unwrap_or_else(|| panic!("{lines:?}")),
        )
        .unwrap();
        assert_eq!(
            tf,
            json!({
                "cluster": {"worker": [format!("{}:8470", ips[0]), format!("{}:8470", ips[1])]},
                "task": {"type": "worker", "index": rank}
            })
        );
        let torch: Vec<&str> = lines[1..]
            .iter()
            .filter(|l| {
                ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"]
                    .iter()
                    .any(|k| l.starts_with(&format!("torch.env: export {k}=")))
            })
            .map(String::as_str)
            .collect();
        assert_eq!(
            torch,
            [
                format!("torch.env: export MASTER_ADDR='{}'", ips[0]),
                "torch.env: export MASTER_PORT='29500'".to_string(),
                "torch.env: export WORLD_SIZE='2'".to_string(),
                format!("torch.env: export RANK='{rank}'"),
            ],
            "{lines:?}"
        );
    }
    // Applying the same Job again: nothing to change.
    assert_eq!(
        apply_clean(on.kc, &on.ns, &job),
        "job.batch/labelled unchanged\n"
    );
    // A Job whose pods opt in with a bad setting gets no pod, and says why.
    let mut bad = plain_job("bad", 1, main_container(&["true"], "64Mi"));
    let t = &mut bad["spec"]["template"]["metadata"];
    t["labels"]["trainlet.io/inject"] = json!("true");
    t["annotations"] = json!({
        "trainlet.io/job": "worker=batch.kubernetes.io/job-name=bad",
        "trainlet.io/wrap": "main",
        "trainlet.io/on-stall": "reboot",
    });
    apply_clean(on.kc, &on.ns, &bad);
    let failed = eventually(
        "the Job controller's FailedCreate",
        Duration::from_secs(60),
        || async {
            events(&on.client, &on.ns)
                .await
                .into_iter()
                .find(|(_, reason, _, regarding)| reason == "FailedCreate" && regarding == "bad")
                .map(|(kind, _, note, _)| (kind, note))
        },
    )
    .await;
    let (kind, note) = failed;
    assert_eq!(kind, "Warning");
    let why = "ValidatingAdmissionPolicy 'trainlet-inject' with binding 'trainlet-inject' denied request: invalid annotation trainlet.io/on-stall \"reboot\": give one of report, restart, exit";
    assert!(
        note.starts_with("Error creating: pods \"bad-0-")
            && note.ends_with(&format!("\" is forbidden: {why}")),
        "{note}"
    );
    on.done().await;
}
