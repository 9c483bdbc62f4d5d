//! The packaging works as shipped, against the real API server:
//! - every file under manifests/ (the examples and the quickstart's jobs among them) and
//!   every `inject` output of the examples' originals passes server-side validation and
//!   Pod Security `restricted`, without a warning;
//! - `kubectl kustomize manifests/` renders the RBAC and `kubectl apply -k` installs it;
//! - the RBAC is least privilege (`kubectl auth can-i --list`, Secrets, other namespaces);
//! - the ps/worker example really resolves: the test plays the Job controller and the
//!   kubelet, and runs each pod's `trainlet-init` container as written in the manifest,
//!   under the ServiceAccount of rbac.yaml;
//! - hadolint passes on docker/Dockerfile.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::support::*;

/// What `kubectl` printed, and whether it succeeded; unlike `support::kubectl`, this
/// keeps stderr, where kubectl prints warnings.
struct Kubectl {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn kubectl_full(args: &[&str], stdin: Option<&str>) -> Kubectl {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig()).args(args);
    // Without input, an empty stdin: kubectl reads it only for `-f -`.
    let out = output_with_stdin(&mut cmd, stdin.unwrap_or_default().as_bytes());
    Kubectl {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn manifests() -> PathBuf {
    repo().join("manifests")
}

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/inject").join(name)
}

/// Inject command lines and the fixtures they inject: two examples' originals, and the
/// StatefulSet with `--address dns` that no example ships.
fn example_injections() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "tf-ps-worker.orig.yaml",
            vec![
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
        ("statefulset-dns.yaml", statefulset_dns_injection()),
        (
            "classic-sidecar-job.orig.yaml",
            vec![
                "--job",
                "worker=batch.kubernetes.io/job-name=mnist-classic",
                "--classic-sidecar",
                "--wrap",
                "tensorflow",
            ],
        ),
    ]
}

/// `--address dns` for tests/fixtures/inject/statefulset-dns.yaml: its pods are
/// `mnist-<i>` behind the headless Service `mnist`.
fn statefulset_dns_injection() -> Vec<&'static str> {
    vec![
        "--job",
        "worker=app.kubernetes.io/name=mnist",
        "--address",
        "dns",
        "--wrap",
        "tensorflow",
    ]
}

/// A namespace where Pod Security `restricted` is enforced, warned about and audited.
async fn restricted_namespace(prefix: &str) -> String {
    let client = admin().await;
    namespace_with_labels(
        &client,
        prefix,
        &[
            ("pod-security.kubernetes.io/enforce", "restricted"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
            ("pod-security.kubernetes.io/warn", "restricted"),
            ("pod-security.kubernetes.io/warn-version", "latest"),
            ("pod-security.kubernetes.io/audit", "restricted"),
            ("pod-security.kubernetes.io/audit-version", "latest"),
        ],
    )
    .await
}

/// Applies with --dry-run=server and fails on an error or on any warning.
fn dry_run_clean(ns: &str, what: &str, args: &[&str], stdin: Option<&str>) {
    let mut all = vec!["apply", "--dry-run=server", "-n", ns];
    all.extend_from_slice(args);
    let r = kubectl_full(&all, stdin);
    assert!(
        r.ok,
        "{what}: kubectl apply --dry-run=server failed:\n{}",
        r.stderr
    );
    let out = format!("{}{}", r.stdout, r.stderr);
    assert!(
        !out.to_lowercase().contains("warning"),
        "{what}: kubectl printed a warning:\n{out}"
    );
    assert!(
        r.stdout.contains("(server dry run)"),
        "{what}: {}",
        r.stdout
    );
}

#[tokio::test]
async fn every_manifest_and_every_injected_example_passes_restricted_without_warnings() {
    let ns = restricted_namespace("psa-manifests").await;

    // A check that can fail: a container without the restricted settings is warned
    // about for a Job, so a clean result below means something.
    let bad = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: bad}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox, command: [\"true\"]}]\n";
    let r = kubectl_full(
        &["apply", "--dry-run=server", "-n", &ns, "-f", "-"],
        Some(bad),
    );
    assert!(
        r.stderr
            .contains("Warning: would violate PodSecurity \"restricted:latest\""),
        "{}",
        r.stderr
    );

    let mut files: Vec<PathBuf> = vec![
        manifests().join("rbac.yaml"),
        manifests().join("status/role.yaml"),
    ];
    let mut examples: Vec<PathBuf> = std::fs::read_dir(manifests().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    examples.sort();
    assert_eq!(
        examples
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect::<Vec<_>>(),
        [
            "classic-sidecar-job.yaml",
            "failure-policy-job.yaml",
            "hostnetwork-pytorch.yaml",
            "jax.yaml",
            "jobset-pytorch.yaml",
            "mpi-hostfile.yaml",
            "pytorch-torchrun.yaml",
            "tf-multiworker.yaml",
            "tf-ps-worker.yaml"
        ]
    );
    // The README's quickstart.
    let mut quickstart: Vec<PathBuf> = std::fs::read_dir(manifests().join("quickstart"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    quickstart.sort();
    assert_eq!(
        quickstart
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect::<Vec<_>>(),
        ["pytorch.yaml", "tensorflow.yaml"]
    );
    // hostNetwork is forbidden by `restricted` (and `baseline`): that example is checked
    // on its own below, in a `privileged` namespace.
    let hostnetwork = manifests().join("examples/hostnetwork-pytorch.yaml");
    examples.retain(|p| *p != hostnetwork);
    // The JobSet example is validated against the real JobSet schema.
    jobset_crd();
    files.extend(examples);
    files.extend(quickstart);
    for f in &files {
        dry_run_clean(
            &ns,
            &f.display().to_string(),
            &["-f", f.to_str().unwrap()],
            None,
        );
    }
    // The PodMonitor, against the Prometheus Operator's real schema.
    podmonitor_crd();
    let podmonitor = manifests().join("monitoring/podmonitor.yaml");
    dry_run_clean(
        &ns,
        "manifests/monitoring/podmonitor.yaml",
        &["-f", podmonitor.to_str().unwrap()],
        None,
    );
    dry_run_clean(
        &ns,
        "manifests/ (kustomize)",
        &["-k", manifests().to_str().unwrap()],
        None,
    );

    hostnetwork_example_violates_only_host_namespaces(&hostnetwork).await;

    for (name, args) in example_injections() {
        let orig = fixture(name);
        let r = run(trainlet().arg("inject").arg("-f").arg(&orig).args(&args));
        assert_eq!(r.code, 0, "inject {name}: {}", r.stderr);
        dry_run_clean(
            &ns,
            &format!("inject {name}"),
            &["-f", "-"],
            Some(&r.stdout),
        );
    }
}

/// manifests/examples/hostnetwork-pytorch.yaml, in a namespace that enforces
/// `privileged` (what its header asks for) and warns at `restricted`: admitted, and the
/// one warning is its host network, so every container, trainlet's included, keeps
/// every other rule of `restricted`. (Where `restricted` is enforced its pods would be
/// refused for the same reason.)
async fn hostnetwork_example_violates_only_host_namespaces(file: &Path) {
    let f = file.to_str().unwrap();
    let client = admin().await;
    let ns = namespace_with_labels(
        &client,
        "psa-hostnet",
        &[
            ("pod-security.kubernetes.io/enforce", "privileged"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
            ("pod-security.kubernetes.io/warn", "restricted"),
            ("pod-security.kubernetes.io/warn-version", "latest"),
        ],
    )
    .await;
    let r = kubectl_full(&["apply", "--dry-run=server", "-n", &ns, "-f", f], None);
    assert!(r.ok, "{f}: {}", r.stderr);
    assert_eq!(
        r.stdout, "job.batch/ddp-hostnet created (server dry run)\n",
        "{f}"
    );
    assert_eq!(
        r.stderr,
        "Warning: would violate PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true)\n",
        "{f}"
    );
}

#[tokio::test]
async fn kustomize_renders_the_rbac_and_apply_k_installs_it() {
    let rendered = kubectl(&["kustomize", manifests().to_str().unwrap()]);
    let kinds: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .collect();
    assert_eq!(
        kinds,
        ["ServiceAccount", "Role", "RoleBinding"],
        "{rendered}"
    );
    assert!(!rendered.contains("namespace:"), "{rendered}");

    let client = admin().await;
    let ns = namespace(&client, "kustomize").await;
    kubectl(&["apply", "-k", manifests().to_str().unwrap(), "-n", &ns]);
    let got = kubectl(&[
        "get",
        "serviceaccount,role,rolebinding",
        "-n",
        &ns,
        "-l",
        "app.kubernetes.io/name=trainlet",
        "-o",
        "name",
    ]);
    assert_eq!(
        got,
        "serviceaccount/trainlet\nrole.rbac.authorization.k8s.io/trainlet\nrolebinding.rbac.authorization.k8s.io/trainlet\n"
    );
}

/// `kubectl auth can-i --list` rows as (resource, non-resource URLs, verbs).
fn can_i_list(ns: &str, user: &str) -> Vec<(String, String, String)> {
    let out = kubectl(&["auth", "can-i", "--list", "--as", user, "-n", ns]);
    let mut lines = out.lines();
    let header = lines.next().expect("a header");
    let col = |name: &str| header.find(name).unwrap_or_else(|| panic!("{header}"));
    let (urls, names, verbs) = (
        col("Non-Resource URLs"),
        col("Resource Names"),
        col("Verbs"),
    );
    lines
        .map(|l| {
            (
                l[..urls].trim().to_string(),
                l[urls..names].trim().to_string(),
                l[verbs..].trim().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_service_account_has_exactly_the_role_rules_and_nothing_else() {
    let client = admin().await;
    let ns = namespace(&client, "least").await;
    let other = namespace(&client, "least-other").await;
    apply_rbac(&ns);
    let user = format!("system:serviceaccount:{ns}:trainlet");

    // What every authenticated user may do (self reviews and discovery; since 1.37,
    // where ClusterTrustBundles are GA, reading those public CA bundles through
    // system:cluster-trust-bundle-discovery): filtered out by name, so that anything
    // else shows up below.
    let everyone: BTreeSet<&str> = [
        "selfsubjectreviews.authentication.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
        "clustertrustbundles.certificates.k8s.io",
    ]
    .into();
    let rows = can_i_list(&ns, &user);
    for (res, urls, verbs) in &rows {
        if res.is_empty() {
            assert_eq!(
                verbs, "[get]",
                "a non-resource URL with more than get: {urls}"
            );
        }
    }
    let granted: BTreeSet<(String, String)> = rows
        .into_iter()
        .filter(|(res, _, _)| !res.is_empty() && !everyone.contains(res.as_str()))
        .map(|(res, _, verbs)| (res, verbs))
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("pods", "[get list watch patch]"),
        ("events.events.k8s.io", "[create patch]"),
        ("jobs.batch", "[get]"),
        ("statefulsets.apps", "[get]"),
        ("replicasets.apps", "[get]"),
        ("jobsets.jobset.x-k8s.io", "[get]"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(granted, want);

    // Nothing in another namespace, and no Secrets anywhere.
    let other_rows = can_i_list(&other, &user);
    assert!(
        other_rows
            .iter()
            .all(|(res, _, _)| res.is_empty() || everyone.contains(res.as_str())),
        "{other_rows:?}"
    );
    for (verb, res, where_) in [
        ("get", "secrets", ns.as_str()),
        ("list", "secrets", ns.as_str()),
        ("list", "pods", other.as_str()),
        ("get", "pods", other.as_str()),
        ("delete", "pods", ns.as_str()),
        ("create", "pods", ns.as_str()),
        ("update", "jobs.batch", ns.as_str()),
    ] {
        let r = kubectl_full(
            &["auth", "can-i", verb, res, "--as", &user, "-n", where_],
            None,
        );
        assert_eq!(r.stdout.trim(), "no", "{verb} {res} in {where_}");
        assert!(!r.ok);
    }

    // And with a real token, the API server says 403.
    let dir = tempfile::tempdir().unwrap();
    let kc = sa_kubeconfig(&client, &ns, "trainlet", dir.path()).await;
    let sa = client_from(&kc).await;
    let err = Api::<Pod>::namespaced(sa.clone(), &other)
        .list(&Default::default())
        .await
        .expect_err("pods in another namespace must be forbidden");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}")
    };
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        format!(
            "pods is forbidden: User \"{user}\" cannot list resource \"pods\" in API group \"\" in the namespace \"{other}\""
        )
    );
    let err = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(sa, &ns)
        .get("anything")
        .await
        .expect_err("secrets must be forbidden");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}")
    };
    assert_eq!(status.code, 403, "{}", status.message);
}

/// Checks one pod's results: exit 0, the exact TF_CONFIG, trainlet.env, the installed
/// binary, and the task annotation on the pod.
async fn check_outputs(
    pods: &Api<Pod>,
    name: &str,
    r: &Run,
    volume: &Path,
    cluster: &str,
    task: (&str, usize),
) {
    let (task_type, index) = task;
    assert_eq!(r.code, 0, "{name}: {}", r.stderr);
    let tf = std::fs::read_to_string(volume.join("tf_config.json")).unwrap();
    assert_eq!(
        tf,
        format!(
            "{{\"cluster\":{cluster},\"task\":{{\"type\":\"{task_type}\",\"index\":{index}}}}}\n"
        ),
        "{name}"
    );
    let env = std::fs::read_to_string(volume.join("trainlet.env")).unwrap();
    let lines: Vec<&str> = env.lines().filter(|l| l.starts_with("export ")).collect();
    assert_eq!(
        lines[..3],
        [
            format!("export TF_CONFIG='{}'", tf.trim_end()),
            format!("export TRAINLET_TASK_TYPE='{task_type}'"),
            format!("export TRAINLET_TASK_INDEX='{index}'"),
        ],
        "{name}"
    );
    // --install-to copied the binary into the shared volume for `trainlet exec`.
    use std::os::unix::fs::PermissionsExt;
    let bin = std::fs::metadata(volume.join("bin/trainlet")).unwrap();
    assert_eq!(bin.permissions().mode() & 0o777, 0o755);
    let p = pods.get(name).await.unwrap();
    assert_eq!(
        p.annotations().get("trainlet.io/task").map(String::as_str),
        Some(format!("{task_type}/{index}").as_str()),
        "{name}"
    );
}

#[tokio::test]
async fn the_ps_worker_example_really_resolves_tf_config() {
    let client = admin().await;
    let ns = restricted_namespace("example").await;
    apply_rbac(&ns);
    // The real Job controller makes the pods; the test schedules them and plays their
    // kubelet until trainlet-init has run.
    let example = manifests().join("examples/tf-ps-worker.yaml");
    kubectl(&["apply", "-n", &ns, "-f", example.to_str().unwrap()]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let kubelet = Kubelet::new(&client, &ns);

    // One Job: indexes 0-2 are the workers, 3-4 the parameter servers. Pod IPs
    // deliberately out of index order, so order by index is what is checked.
    let plan: [(u32, &str, (&str, usize)); 5] = [
        (0, "10.8.0.23", ("worker", 0)),
        (1, "10.8.0.21", ("worker", 1)),
        (2, "10.8.0.22", ("worker", 2)),
        (3, "10.8.0.12", ("ps", 0)),
        (4, "10.8.0.11", ("ps", 1)),
    ];
    let mut created = Vec::new();
    for (index, ip, _) in plan {
        let name =
            crate::support::jobs::wait_job_pod(&client, &ns, "mnist-ps-worker", index, &[]).await;
        let pod = pods.get(&name).await.unwrap();
        pending_in_init(&kubelet, &pod, ip).await;
        created.push(pod);
    }

    let dir = tempfile::tempdir().unwrap();
    let results = run_init_containers(&client, &ns, &created, dir.path()).await;
    let cluster = r#"{"ps":["10.8.0.12:8470","10.8.0.11:8470"],"worker":["10.8.0.23:8470","10.8.0.21:8470","10.8.0.22:8470"]}"#;
    for ((name, r, volume), (_, _, task)) in results.iter().zip(plan) {
        check_outputs(&pods, name, r, volume, cluster, task).await;
    }
}

/// A StatefulSet with a headless Service, injected with `--address dns` (no example
/// ships one: a StatefulSet restarts a finished trainer forever, but long-running
/// servers use one).
#[tokio::test]
async fn an_injected_statefulset_really_resolves_dns_addresses() {
    let client = admin().await;
    let ns = restricted_namespace("example-sts").await;
    apply_rbac(&ns);
    let r = run(trainlet()
        .arg("inject")
        .arg("-f")
        .arg(fixture("statefulset-dns.yaml"))
        .args(statefulset_dns_injection()));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let injected = kubectl_full(&["apply", "-n", &ns, "-f", "-"], Some(&r.stdout));
    assert!(injected.ok, "{}", injected.stderr);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let kubelet = Kubelet::new(&client, &ns);
    // The real StatefulSet controller makes the pods (Parallel); the test runs them in
    // reverse and with IPs in reverse: neither may leak into the order.
    let mut created = Vec::new();
    for index in (0..3).rev() {
        let name = format!("mnist-{index}");
        let pod = eventually(
            &format!("the StatefulSet controller's pod {name}"),
            Duration::from_secs(30),
            || async { pods.get_opt(&name).await.ok().flatten() },
        )
        .await;
        pending_in_init(&kubelet, &pod, &format!("10.9.0.{}", 10 - index)).await;
        created.push(pod);
    }
    // Init waits until each name resolves to its pod IP: a DNS server of the test's
    // plays the cluster DNS.
    let dns = crate::support::dns::DnsServer::start();
    for index in 0..3 {
        dns.set(
            &format!("mnist-{index}.mnist.{ns}.svc.cluster.local"),
            &format!("10.9.0.{}", 10 - index),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let results =
        run_init_containers_via(&client, &ns, &created, dir.path(), &|c| dns.command(&c)).await;
    let cluster = format!(
        r#"{{"worker":["mnist-0.mnist.{ns}.svc.cluster.local:8470","mnist-1.mnist.{ns}.svc.cluster.local:8470","mnist-2.mnist.{ns}.svc.cluster.local:8470"]}}"#
    );
    for (name, r, volume) in &results {
        let index: usize = name.strip_prefix("mnist-").unwrap().parse().unwrap();
        check_outputs(&pods, name, r, volume, &cluster, ("worker", index)).await;
    }
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let dockerfile = repo().join("docker/Dockerfile");
    let out = require!(
        Command::new("hadolint")
            .arg(&dockerfile)
            .output()
            .map_err(|e| Missing::new(
                Group::Deps,
                format!("hadolint is not installed ({e}); run .ci/deps")
            ))
    );
    assert!(
        out.status.success(),
        "hadolint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&dockerfile).unwrap();
    for needle in [
        "FROM gcr.io/distroless/cc-debian12:nonroot",
        "USER 65532:65532",
        "ENV NVIDIA_DRIVER_CAPABILITIES=utility",
        "ENTRYPOINT [\"/usr/local/bin/trainlet\"]",
        "org.opencontainers.image.source=",
    ] {
        assert!(text.contains(needle), "docker/Dockerfile lacks {needle}");
    }
    let instructions: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    assert!(
        !instructions.contains("musl"),
        "the binary must stay glibc-linked (NVML is loaded with dlopen)"
    );
}

/// `make rootfs` without Docker: the tarball holds the binary at the image's path, the
/// libraries it links and the nonroot user, and the binary runs in it as 65532.
#[test]
fn the_rootfs_tarball_runs_the_binary_as_nonroot() {
    // chroot needs root; CI runs as root.
    require!(root(Group::Root, "chroot into the rootfs"));
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(repo().join("docker/rootfs.sh"))
        .arg(env!("CARGO_BIN_EXE_trainlet"))
        .env("TRAINLET_ROOTFS_DIR", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tar = dir.path().join("trainlet-rootfs.tar");
    let listing = Command::new("tar").arg("tf").arg(&tar).output().unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for path in [
        "./usr/local/bin/trainlet",
        "./lib/x86_64-linux-gnu/libc.so.6",
        "./etc/passwd",
    ] {
        assert!(listing.lines().any(|l| l == path), "{path} in\n{listing}");
    }
    let run = Command::new("chroot")
        .arg("--userspec=65532:65532")
        .arg(dir.path().join("root"))
        .args(["/usr/local/bin/trainlet", "--version"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        format!("trainlet {}\n", env!("CARGO_PKG_VERSION")),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// The training container holds no API token, as the real API server admits the pod:
/// its ServiceAccount admission adds the automounted token only where automount is
/// on. A check that can fail: the same pod before inject gets a token in every
/// container.
#[tokio::test]
async fn an_injected_pod_has_a_token_only_in_trainlets_containers() {
    const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let client = admin().await;
    let ns = namespace(&client, "notoken").await;
    apply_rbac(&ns);
    let plain = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  serviceAccountName: trainlet\n  containers:\n    - {name: train, image: registry.example/train:1, command: [python, train.py]}\n";
    let admitted = |yaml: &str| -> Value {
        let r = kubectl_full(
            &[
                "create",
                "--dry-run=server",
                "-o",
                "json",
                "-n",
                &ns,
                "-f",
                "-",
            ],
            Some(yaml),
        );
        assert!(r.ok, "{}", r.stderr);
        serde_json::from_str(&r.stdout).unwrap()
    };
    let token_mounts = |pod: &Value, containers: &str| -> BTreeMap<String, Vec<String>> {
        pod["spec"][containers]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let vols = c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|m| {
                        m["mountPath"]
                            .as_str()
                            .is_some_and(|p| p.starts_with(TOKEN_PATH))
                    })
                    .map(|m| m["name"].as_str().unwrap().to_string())
                    .collect();
                (c["name"].as_str().unwrap().to_string(), vols)
            })
            .collect()
    };
    let before = admitted(plain);
    let mounted = &token_mounts(&before, "containers")["train"];
    assert_eq!(mounted.len(), 1, "{before}");
    assert!(mounted[0].starts_with("kube-api-access-"), "{mounted:?}");

    let r = run(trainlet()
        .args(["inject", "--job", "worker=app=x", "--wrap", "train"])
        .stdin(Stdio::piped())
        .arg("-f")
        .arg(write_temp(plain)));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let after = admitted(&r.stdout);
    assert_eq!(after["spec"]["automountServiceAccountToken"], false);
    assert_eq!(
        token_mounts(&after, "containers"),
        BTreeMap::from([("train".to_string(), vec![])]),
        "{after}"
    );
    assert_eq!(
        token_mounts(&after, "initContainers"),
        BTreeMap::from([
            (
                "trainlet-init".to_string(),
                vec!["trainlet-token".to_string()]
            ),
            ("trainlet".to_string(), vec!["trainlet-token".to_string()]),
        ])
    );
    let volumes: Vec<&str> = after["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(volumes, ["trainlet", "trainlet-observed", "trainlet-token"]);
}

/// A temporary file holding `text`, kept for the rest of the test run.
fn write_temp(text: &str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let p = dir.join("in.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Plays the kubelet for a pod that ended: Failed, with the exit code of `container`
/// (an init container or the training container).
async fn failed_with(kubelet: &Kubelet, pod: &Pod, container: &str, code: i32, reason: &str) {
    let name = pod.name_any();
    let now = now();
    let spec = pod.spec.as_ref().unwrap();
    let status = |c: &Container| {
        let state = if c.name == container {
            json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now}})
        } else {
            json!({"waiting": {"reason": "PodInitializing"}})
        };
        json!({"name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
               "ready": false, "restartCount": 0, "state": state})
    };
    kubelet.bind(&name, "node-a").await;
    kubelet
        .status(
            &name,
            json!({
                "phase": "Failed",
                "initContainerStatuses": spec.init_containers.iter().flatten().map(status).collect::<Vec<_>>(),
                "containerStatuses": spec.containers.iter().map(status).collect::<Vec<_>>(),
            }),
        )
        .await;
}

/// The failure-policy example under the real Job controller: CMD killed by SIGKILL
/// (137, what an OOM kill gives) is retried with a new pod; trainlet-init exiting 2 (a
/// configuration that cannot work) fails the whole Job at once.
#[tokio::test]
async fn the_failure_policy_example_retries_137_and_fails_the_job_on_a_bad_init() {
    use crate::support::jobs::*;
    let client = admin().await;
    let ns = restricted_namespace("failpolicy").await;
    apply_rbac(&ns);
    let example = manifests().join("examples/failure-policy-job.yaml");
    kubectl(&["apply", "-n", &ns, "-f", example.to_str().unwrap()]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let kubelet = Kubelet::new(&client, &ns);

    // Index 1: the training command dies of SIGKILL; trainlet exec passes 137 on.
    let first = wait_job_pod(&client, &ns, "mnist-failure-policy", 1, &[]).await;
    let files = tempfile::tempdir().unwrap();
    write_tf_config(files.path(), free_port());
    let r = run(trainlet()
        .args(["exec", "--report", "--output-dir"])
        .arg(files.path())
        .args(["--", "sh", "-c", "kill -9 $$"]));
    assert_eq!(r.code, 137, "{}", r.stderr);
    let pod = pods.get(&first).await.unwrap();
    failed_with(&kubelet, &pod, "tensorflow", r.code, "OOMKilled").await;
    let second = wait_job_pod(
        &client,
        &ns,
        "mnist-failure-policy",
        1,
        std::slice::from_ref(&first),
    )
    .await;
    assert_ne!(second, first);
    let job = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), &ns)
        .get("mnist-failure-policy")
        .await
        .unwrap();
    let status = job.status.unwrap();
    assert_eq!(status.failed, Some(1));
    assert!(
        !status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Failed"),
        "{:?}",
        status.conditions
    );

    // Index 0: trainlet-init, from the pod's own command line, with a flag that cannot
    // work: exit 2, and the Job fails at once.
    let name = wait_job_pod(&client, &ns, "mnist-failure-policy", 0, &[]).await;
    let pod = pods.get(&name).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = sa_kubeconfig(&client, &ns, "trainlet", dir.path()).await;
    let volume = dir.path().join("volume");
    std::fs::create_dir(&volume).unwrap();
    let r = run(init_command(&pod, &volume, &kc).arg("--timeout=soon"));
    assert_eq!(r.code, 2, "{}", r.stderr);
    failed_with(&kubelet, &pod, "trainlet-init", r.code, "Error").await;
    assert_eq!(
        wait_job_condition(&client, &ns, "mnist-failure-policy", "Failed").await,
        "PodFailurePolicy"
    );
    delete_namespace(&client, &ns).await;
}

/// The JobSet `failurePolicy` that docs/failure-handling.md pairs with
/// `inject --failure-policy` is one the JobSet schema accepts (the real CRD), as the
/// docs print it; and the schema refuses a rule without a name, as they say.
#[tokio::test]
async fn the_jobset_failure_policy_of_the_docs_fits_the_jobset_schema() {
    let docs = std::fs::read_to_string(repo().join("docs/failure-handling.md")).unwrap();
    let section = docs
        .split_once("### In a JobSet")
        .expect("docs/failure-handling.md has the JobSet section")
        .1;
    let block = section
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the JobSet section has a YAML block")
        .0;
    assert!(block.starts_with("spec:"), "{block}");
    let jobset = |spec: &str| {
        format!(
            "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {{name: docs-failure-policy}}\n{spec}  replicatedJobs:\n    - name: w\n      template:\n        spec:\n          template:\n            spec:\n              restartPolicy: Never\n              containers: [{{name: c, image: busybox}}]\n"
        )
    };
    jobset_crd();
    let ns = namespace(&admin().await, "jobset-policy").await;
    let doc = jobset(block);
    let r = kubectl_full(
        &["create", "--dry-run=server", "-n", &ns, "-f", "-"],
        Some(&doc),
    );
    assert!(
        r.ok && r.stdout.contains("(server dry run)"),
        "{doc}\n{}",
        r.stderr
    );
    let unnamed = jobset(&block.replace("      - name: permanent ", "      - "));
    assert_ne!(unnamed, doc);
    let r = kubectl_full(
        &["create", "--dry-run=server", "-n", &ns, "-f", "-"],
        Some(&unnamed),
    );
    assert!(
        !r.ok
            && r.stderr
                .contains("spec.failurePolicy.rules[0].name: Required value"),
        "{unnamed}\n{}",
        r.stderr
    );
}
