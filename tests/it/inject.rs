//! `trainlet inject` as users run it: the binary, stdin or -f, stdout, notes on stderr,
//! exit codes; and its output accepted by the real API server.

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;

use crate::support::*;

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/inject").join(name)
}

/// Runs `trainlet inject ARGS` with `input` on stdin.
fn inject_stdin(args: &[&str], input: &str) -> Run {
    let mut cmd = trainlet();
    cmd.arg("inject").args(args);
    Run::from_output(output_with_stdin(&mut cmd, input.as_bytes()))
}

const MIXED_ARGS: [&str; 4] = ["--job", "worker=app=trainer", "--wrap", "train"];

#[test]
fn reads_a_file_or_stdin_and_writes_the_golden_output() {
    let golden = std::fs::read_to_string(fixture("mixed.injected.yaml")).unwrap();
    let input = std::fs::read_to_string(fixture("mixed.yaml")).unwrap();

    let from_file = run(trainlet()
        .arg("inject")
        .arg("-f")
        .arg(fixture("mixed.yaml"))
        .args(MIXED_ARGS));
    assert_eq!(from_file.code, 0, "{}", from_file.stderr);
    assert_eq!(from_file.stdout, golden);
    let f = fixture("mixed.yaml").display().to_string();
    assert_eq!(
        from_file.stderr,
        format!(
            "trainlet: note: {f}: document 1 (v1 ConfigMap \"settings\"): no pod template; passed through unchanged\n\
             trainlet: note: {f}: document 2 (apps/v1 Deployment \"trainer\"): injected\n\
             trainlet: note: {f}: document 3 (v1 Service \"trainer\"): no pod template; passed through unchanged\n\
             trainlet: note: {f}: document 4 (batch.volcano.sh/v1alpha1 Job \"not-a-batch-job\"): no pod template; passed through unchanged\n"
        )
    );

    let from_stdin = inject_stdin(&MIXED_ARGS, &input);
    assert_eq!(from_stdin.code, 0, "{}", from_stdin.stderr);
    assert_eq!(from_stdin.stdout, golden);
    assert!(
        from_stdin
            .stderr
            .starts_with("trainlet: note: stdin: document 1 (v1 ConfigMap"),
        "{}",
        from_stdin.stderr
    );
    let mut dash = vec!["-f", "-"];
    dash.extend(MIXED_ARGS);
    assert_eq!(inject_stdin(&dash, &input).stdout, golden);
}

#[test]
fn flags_from_env_vars_give_the_same_output() {
    let golden = std::fs::read_to_string(fixture("mixed.injected.yaml")).unwrap();
    let r = run(trainlet()
        .arg("inject")
        .env("TRAINLET_FILENAME", fixture("mixed.yaml"))
        .env("TRAINLET_JOB", "worker=app=trainer")
        .env("TRAINLET_WRAP", "train"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, golden);
}

#[test]
fn injecting_its_own_output_again_changes_no_byte() {
    for (file, extra) in [
        ("mixed.yaml", &["--wrap", "train"][..]),
        ("cronjob.yaml", &["--classic-sidecar"][..]),
        (
            "list.yaml",
            &["--address", "dns", "--expect", "worker=1"][..],
        ),
        ("tf-ps-worker.orig.yaml", &["--port", "2222"][..]),
    ] {
        let mut args = vec!["--job", "worker=app=x"];
        args.extend(extra);
        let input = std::fs::read_to_string(fixture(file)).unwrap();
        let once = inject_stdin(&args, &input);
        assert_eq!(once.code, 0, "{file}: {}", once.stderr);
        assert_ne!(once.stdout, input, "{file}");
        let twice = inject_stdin(&args, &once.stdout);
        assert_eq!(twice.code, 0, "{file}: {}", twice.stderr);
        assert_eq!(twice.stdout, once.stdout, "{file}");
        assert!(!twice.stderr.contains("): injected"), "{}", twice.stderr);
    }
}

/// The pod inject prints for `input` with `args`, as JSON, and its stderr.
fn injected_pod(args: &[&str], input: &str) -> (serde_json::Value, String) {
    let r = inject_stdin(args, input);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let chunks = trainlet::inject::yaml::split_documents(&r.stdout);
    let node = trainlet::inject::yaml::parse(&chunks[0]).unwrap().remove(0);
    (trainlet::inject::yaml::to_json(&node), r.stderr)
}

/// Without `--framework`, the wrapped container's launcher chooses the frameworks
/// (torchrun: PyTorch's variables, and the sidecar watches no TensorFlow port), exactly
/// as if `--framework pytorch` were given, and a note says so; an explicit
/// `--framework`, `tensorflow` included, always wins, and a plain `python` keeps the
/// default.
#[test]
fn the_wrapped_commands_launcher_chooses_the_framework_with_a_note() {
    let pod = |command: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ddp\n  labels: {{app: ddp}}\nspec:\n  containers:\n    - name: trainer\n      image: trainer:1\n      command: {command}\n"
        )
    };
    let args = |extra: &[&'static str]| {
        let mut a = vec!["--job", "worker=app=ddp", "--wrap", "trainer"];
        a.extend(extra);
        a
    };
    let init = |p: &serde_json::Value| p["spec"]["initContainers"][0]["args"].clone();
    let sidecar = |p: &serde_json::Value| p["spec"]["initContainers"][1]["args"].clone();
    let torchrun = pod("[/usr/local/bin/torchrun, --nproc-per-node=2, train.py]");

    let (inferred, notes) = injected_pod(&args(&[]), &torchrun);
    assert_eq!(
        init(&inferred),
        json!([
            "--job=worker=app=ddp",
            "--install-to=/etc/trainlet/bin",
            "--framework=pytorch"
        ])
    );
    assert_eq!(
        sidecar(&inferred),
        json!(["--observations=/run/trainlet-observed"])
    );
    assert_eq!(
        notes,
        "trainlet: note: stdin: document 1 (v1 Pod \"ddp\"): infers --framework pytorch from container \"trainer\"'s command (torchrun): pass --framework to choose\n\
         trainlet: note: stdin: document 1 (v1 Pod \"ddp\"): injected\n"
    );
    // Exactly what --framework pytorch gives.
    let (given, notes) = injected_pod(&args(&["--framework", "pytorch"]), &torchrun);
    assert_eq!(given, inferred);
    assert_eq!(
        notes,
        "trainlet: note: stdin: document 1 (v1 Pod \"ddp\"): injected\n"
    );

    let (explicit, notes) = injected_pod(&args(&["--framework", "tensorflow"]), &torchrun);
    assert_eq!(
        init(&explicit),
        json!(["--job=worker=app=ddp", "--install-to=/etc/trainlet/bin"])
    );
    assert_eq!(
        sidecar(&explicit),
        json!(["--port=8470", "--observations=/run/trainlet-observed"])
    );
    assert!(!notes.contains("infers"), "{notes}");

    let (shell, notes) = injected_pod(
        &args(&[]),
        &pod("[sh, -c, \"pip install -r req.txt && mpirun -np 4 python train.py\"]"),
    );
    assert_eq!(init(&shell)[2], json!("--framework=mpi"));
    assert!(
        notes.contains("infers --framework mpi from container \"trainer\"'s command (mpirun)"),
        "{notes}"
    );

    let (plain, notes) = injected_pod(&args(&[]), &pod("[python, train.py]"));
    assert_eq!(
        init(&plain),
        json!(["--job=worker=app=ddp", "--install-to=/etc/trainlet/bin"])
    );
    assert!(!notes.contains("infers"), "{notes}");

    // Injecting the output again finds the launcher behind the wrapper and changes no byte.
    let once = inject_stdin(&args(&[]), &torchrun);
    let twice = inject_stdin(&args(&[]), &once.stdout);
    assert_eq!(twice.stdout, once.stdout);
    assert!(twice.stderr.contains("(torchrun)"), "{}", twice.stderr);
}

#[test]
fn bad_yaml_exits_2_with_the_document_and_line() {
    let r = run(trainlet()
        .arg("inject")
        .arg("-f")
        .arg(fixture("bad.yaml"))
        .args(["--job", "worker=app=x"]));
    assert_eq!(r.code, 2);
    assert_eq!(r.stdout, "");
    assert_eq!(
        r.error_line(),
        format!(
            "{}: invalid YAML in document 2 at line 12, column 3: invalid indentation in flow construct",
            fixture("bad.yaml").display()
        )
    );
}

#[test]
fn wrap_without_an_explicit_command_exits_2_and_says_why() {
    let r = run(trainlet()
        .arg("inject")
        .arg("-f")
        .arg(fixture("implicit-entrypoint.yaml"))
        .args(["--job", "worker=app=x", "--wrap", "train"]));
    assert_eq!(r.code, 2);
    assert_eq!(r.stdout, "");
    assert!(
        r.error_line().ends_with(
            "cannot --wrap container \"train\" of batch/v1 Job \"implicit\" (document 1): it has no `command`, so it runs its image's ENTRYPOINT, which inject cannot see; give the program explicitly, e.g. `command: [python, train.py]`, and inject again"
        ),
        "{}",
        r.stderr
    );
}

#[test]
fn usage_errors_exit_2_before_reading_input() {
    let cases: [(&[&str], &str); 7] = [
        // The bounds of exec's own check, before they are written into a template.
        (
            &[
                "--job",
                "w=a=b",
                "--wrap",
                "train",
                "--stall-after",
                "18446744073709551615s",
            ],
            "invalid --stall-after \"18446744073709551615s\": use at most 365d (a year), e.g. 30s, 10m or 1h",
        ),
        (
            &["--job", "w=a=b", "--wrap", "train", "--stall-after", "1ms"],
            "invalid --stall-after \"1ms\": use at least 1s, e.g. 10m",
        ),
        (
            &[
                "--job",
                "w=a=b",
                "--wrap",
                "train",
                "--restart-grace",
                "18446744073709551615s",
            ],
            "invalid --restart-grace \"18446744073709551615s\": use at most 365d (a year), e.g. 30s, 10m or 1h",
        ),
        (
            &["-f", "/nonexistent/job.yaml", "--job", "w=a=b"],
            "cannot read /nonexistent/job.yaml: No such file or directory (os error 2)",
        ),
        (
            &["-f", "/nonexistent/job.yaml"],
            "no jobs given: pass --job TYPE=SELECTOR (repeatable) or --job-to-label-mapping JSON",
        ),
        (
            &["--job", "w=a=b", "--output-dir", "relative"],
            "invalid --output-dir relative: the mount path of the shared volume must be an absolute path below /",
        ),
        (
            &["--job", "w=a=b", "--wrap", "nope"],
            "stdin: --wrap \"nope\": no pod template has a container of that name (found: train)",
        ),
    ];
    let input = std::fs::read_to_string(fixture("cronjob.yaml")).unwrap();
    for (args, want) in cases {
        let r = inject_stdin(args, &input);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert_eq!(r.stdout, "", "{args:?}");
        assert_eq!(r.error_line(), want, "{args:?}");
    }
}

#[test]
fn help_documents_the_init_flags_and_the_env_vars() {
    let r = run(trainlet().args(["inject", "--help"]));
    assert_eq!(r.code, 0);
    for flag in [
        "--filename",
        "--image",
        "--wrap",
        "--classic-sidecar",
        "--service-account",
        "--job",
        "--expect",
        "--address",
        "--install-to",
        "TRAINLET_WRAP",
        concat!(
            "[default: ghcr.io/trainlet/trainlet:",
            env!("CARGO_PKG_VERSION"),
            "]"
        ),
    ] {
        assert!(
            r.stdout.contains(flag),
            "--help lacks {flag}:\n{}",
            r.stdout
        );
    }
}

/// The API server accepts what inject writes for a Deployment, a CronJob and a List
/// (native and classic sidecars): the shapes are valid Kubernetes, not just YAML.
#[tokio::test]
async fn the_api_server_accepts_injected_deployment_cronjob_and_list() {
    let client = admin().await;
    let ns = namespace(&client, "inject").await;
    // The injected Pod in list.yaml runs as the ServiceAccount `trainlet`, which
    // admission requires to exist.
    apply_rbac(&ns);
    for (file, extra) in [
        ("deployment.yaml", &["--wrap", "train"][..]),
        ("deployment.yaml", &["--classic-sidecar"][..]),
        ("cronjob.yaml", &["--wrap", "train"][..]),
        ("list.yaml", &[][..]),
    ] {
        let mut args = vec!["--job", "worker=app=x"];
        args.extend(extra);
        let input = std::fs::read_to_string(fixture(file)).unwrap();
        let injected = inject_stdin(&args, &input);
        assert_eq!(injected.code, 0, "{}", injected.stderr);
        let applied = server_dry_run(&ns, &without_custom_resources(&injected.stdout))
            .unwrap_or_else(|e| panic!("{file} {extra:?}: {e}"));
        if file == "deployment.yaml" {
            // What the API server received: kubectl's YAML 1.1 meanings, unchanged by
            // inject (octal 0644 is 420; the quoted "on" stays a string).
            let spec = &applied["spec"]["template"]["spec"];
            assert_eq!(spec["volumes"][0]["configMap"]["defaultMode"], 420);
            assert_eq!(
                spec["containers"][0]["env"][0],
                serde_json::json!({"name": "FLAG", "value": "on"})
            );
            assert_eq!(spec["containers"][0]["env"][1]["value"], "1.0");
            assert_eq!(spec["containers"][0]["env"][2]["value"], "0644");
            let init: Vec<&str> = spec["initContainers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect();
            let want: &[&str] = if extra == ["--classic-sidecar"] {
                &["trainlet-init"]
            } else {
                &["trainlet-init", "trainlet"]
            };
            assert_eq!(init, want);
        }
    }
}

/// What the API server makes of `yaml` in `ns` (`kubectl apply --dry-run=server`), or
/// why it refuses it.
fn server_dry_run(ns: &str, yaml: &str) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig()).args([
        "apply",
        "--dry-run=server",
        "-n",
        ns,
        "-o",
        "json",
        "-f",
        "-",
    ]);
    let out = output_with_stdin(&mut cmd, yaml.as_bytes());
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

/// A Job whose training container has its own things where trainlet puts its own: a
/// config mounted at /etc/trainlet, a /dev/shm/ (trailing slash), a POD_NAME and a
/// `trainlet exec` with flags. At the default --output-dir inject refuses it (exit 2,
/// nothing on stdout), as the API server would refuse the pod; with another
/// --output-dir the API server accepts the Job, and the user's things are all there;
/// what the API server returns is injected again as inject's own.
#[tokio::test]
async fn the_api_server_accepts_inject_beside_the_users_own_objects() {
    let client = admin().await;
    let ns = namespace(&client, "inject-own").await;
    apply_rbac(&ns);
    let job = "\
apiVersion: batch/v1
kind: Job
metadata:
  name: own
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: registry.example.com/train:1
          command: [trainlet, exec, --on-peer-change=restart, --stall-after=30m, --, python, train.py]
          env: [{name: POD_NAME, value: worker}]
          volumeMounts:
            - {name: config, mountPath: /etc/trainlet}
            - {name: shm, mountPath: /dev/shm/}
      volumes:
        - name: config
          configMap: {name: settings}
        - name: shm
          emptyDir: {medium: Memory}
";
    let mut args = vec![
        "--job",
        "worker=batch.kubernetes.io/job-name=own",
        "--wrap",
        "train",
        "--shm-size",
        "1Gi",
    ];
    let refused = inject_stdin(&args, job);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert_eq!(refused.stdout, "");
    assert_eq!(
        refused.error_line(),
        "stdin: batch/v1 Job \"own\" (document 1): container \"train\" mounts volume \"config\" at /etc/trainlet, where inject mounts trainlet's files (--output-dir): give inject another --output-dir, e.g. /run/trainlet, or mount yours elsewhere"
    );
    args.extend(["--output-dir", "/run/trainlet"]);
    let injected = inject_stdin(&args, job);
    assert_eq!(injected.code, 0, "{}", injected.stderr);
    let applied = server_dry_run(&ns, &injected.stdout).unwrap_or_else(|e| panic!("{e}"));
    let train = &applied["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        train["command"],
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
    let mounts: Vec<(&str, &str)> = train["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            ("config", "/etc/trainlet"),
            ("shm", "/dev/shm/"),
            ("trainlet", "/run/trainlet"),
            ("trainlet-observed", "/run/trainlet-observed"),
        ]
    );
    assert_eq!(
        train["env"][0],
        serde_json::json!({"name": "POD_NAME", "value": "worker"})
    );
    // What the API server sends back is inject's own where it was: injected again, it
    // keeps the same containers, volumes and command.
    let again = inject_stdin(&args, &applied.to_string());
    assert_eq!(again.code, 0, "{}", again.stderr);
    let reapplied = {
        use trainlet::inject::yaml;
        yaml::to_json(&yaml::parse(&yaml::split_documents(&again.stdout)[0]).unwrap()[0])
    };
    for key in ["initContainers", "containers", "volumes"] {
        let names = |v: &serde_json::Value| -> Vec<String> {
            v["spec"]["template"]["spec"][key]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names(&reapplied), names(&applied), "{key}");
    }
    assert_eq!(
        reapplied["spec"]["template"]["spec"]["containers"][0]["command"],
        train["command"]
    );
}

/// The stream without the fixture's Volcano Job, whose CRD this API server lacks.
fn without_custom_resources(yaml: &str) -> String {
    yaml.split("---\n")
        .filter(|d| !d.contains("apiVersion: batch.volcano.sh/"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The QoS class the API server gives a Pod, from a server-side dry run.
fn qos_class(ns: &str, pod: &str) -> String {
    let created = server_dry_run(ns, pod).unwrap_or_else(|e| panic!("{e}"));
    created["status"]["qosClass"].as_str().unwrap().to_string()
}

/// A GPU pod whose training container is Guaranteed stays Guaranteed once trainlet's
/// init container, sidecar and /dev/shm are added, as the real API server computes the
/// class (the kubelet's static CPU manager and topology manager need it); a pod that
/// was Burstable stays Burstable.
#[tokio::test]
async fn an_injected_guaranteed_pod_stays_guaranteed() {
    let client = admin().await;
    let ns = namespace(&client, "qos").await;
    apply_rbac(&ns);
    let pod = |limits: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: w-0\n  labels: {{app: mnist}}\nspec:\n  containers:\n    - name: train\n      image: registry.example.com/train:1\n      command: [python, train.py]\n      resources:\n        {limits}\n"
        )
    };
    let guaranteed = pod("limits: {cpu: '8', memory: 64Gi, nvidia.com/gpu: '8'}");
    let burstable = pod("requests: {cpu: '1', memory: 1Gi}");
    assert_eq!(qos_class(&ns, &guaranteed), "Guaranteed");
    let args = [
        "--job",
        "worker=app=mnist",
        "--wrap",
        "train",
        "--on-peer-change",
        "restart",
        "--shm-size",
        "8Gi",
    ];
    let injected = inject_stdin(&args, &guaranteed);
    assert_eq!(injected.code, 0, "{}", injected.stderr);
    assert_eq!(qos_class(&ns, &injected.stdout), "Guaranteed");
    let injected = inject_stdin(&args, &burstable);
    assert_eq!(injected.code, 0, "{}", injected.stderr);
    assert_eq!(qos_class(&ns, &injected.stdout), "Burstable");
}

/// `--address dns`: the API server accepts the headless Service inject adds (no ports,
/// `clusterIP: None`, `publishNotReadyAddresses`) and the Job's subdomain it sets.
#[tokio::test]
async fn the_api_server_accepts_the_headless_service_of_address_dns() {
    let client = admin().await;
    let ns = namespace(&client, "inject-dns").await;
    let input = "apiVersion: batch/v1
kind: Job
metadata:
  name: mnist
spec:
  completionMode: Indexed
  completions: 2
  parallelism: 2
  template:
    metadata:
      labels:
        app: mnist
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: registry.example.com/train:1
          command: [python, train.py]
";
    let injected = inject_stdin(&["--job", "worker=app=mnist", "--address", "dns"], input);
    assert_eq!(injected.code, 0, "{}", injected.stderr);
    assert!(
        injected.stderr.contains(
            "trainlet: note: stdin: document 2 (v1 Service \"mnist\"): added: the DNS names of the pods of batch/v1 Job \"mnist\" need a headless Service (--address dns)\n"
        ),
        "{}",
        injected.stderr
    );
    let applied = server_dry_run(&ns, &injected.stdout).unwrap_or_else(|e| panic!("{e}"));
    let items = applied["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{applied}");
    assert_eq!(
        items[0]["spec"]["template"]["spec"]["subdomain"],
        serde_json::json!("mnist")
    );
    let svc = &items[1];
    assert_eq!(svc["kind"], "Service");
    assert_eq!(svc["metadata"]["name"], "mnist");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(svc["spec"]["selector"], serde_json::json!({"app": "mnist"}));
}

/// `inject --wrap --stall-after --on-stall --progress-pattern`: the wrapped container's
/// command, as the API server stores it, carries the three flags exactly; run as the
/// kubelet would run it (its command and env, with this build's trainlet and local
/// directories), it honours them. CMD prints one `step` line and then only noise:
/// under the pattern the noise is no progress, so after 5 s the stall stops CMD and
/// exec exits 8 (`--on-stall exit`). Without the pattern the noise would be progress.
#[tokio::test]
async fn inject_writes_the_stall_watch_into_the_command_and_the_pod_honours_it() {
    let client = admin().await;
    let ns = namespace(&client, "inject-stall").await;
    let job = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: stall
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: registry.example.com/train:1
          command: [sh, -c, "echo step 1; while :; do echo noise; sleep 0.5; done"]
"#;
    let injected = inject_stdin(
        &[
            "--job",
            "worker=batch.kubernetes.io/job-name=stall",
            "--wrap",
            "train",
            "--stall-after",
            "5s",
            "--on-stall",
            "exit",
            "--progress-pattern",
            r"step (\d+)",
        ],
        job,
    );
    assert_eq!(injected.code, 0, "{}", injected.stderr);
    let applied = server_dry_run(&ns, &injected.stdout).unwrap_or_else(|e| panic!("{e}"));
    let train = &applied["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        train["command"],
        serde_json::json!([
            "/etc/trainlet/bin/trainlet",
            "exec",
            "--report",
            "--stall-after=5s",
            "--on-stall=exit",
            r"--progress-pattern=step (\d+)",
            "--",
            "sh",
            "-c",
            "echo step 1; while :; do echo noise; sleep 0.5; done"
        ])
    );
    let env: Vec<(&str, &str)> = train["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    assert_eq!(
        env,
        [
            ("TRAINLET_METRICS_ADDR", "off"),
            ("TRAINLET_OBSERVATIONS", "/run/trainlet-observed")
        ]
    );

    // The kubelet's part: the container's command and env, with the paths of this
    // machine for the volumes (trainlet's files and the observations).
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    let observed = dir.path().join("observed");
    std::fs::create_dir(&observed).unwrap();
    let args: Vec<&str> = train["command"].as_array().unwrap()[1..]
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mut pod = trainlet();
    pod.args(&args)
        .env("TRAINLET_METRICS_ADDR", "off")
        .env("TRAINLET_OBSERVATIONS", &observed)
        .env("TRAINLET_OUTPUT_DIR", dir.path());
    let r = run(&mut pod);
    assert_eq!(r.code, 8, "{}", r.stderr);
    assert!(r.stdout.starts_with("step 1\nnoise\n"), "{}", r.stdout);
    assert!(
        r.stdout.lines().skip(1).all(|l| l == "noise"),
        "{}",
        r.stdout
    );
    let seen: serde_json::Value =
        serde_json::from_slice(&std::fs::read(observed.join("exec.json")).unwrap()).unwrap();
    assert_eq!(seen["exited"], 8, "{seen}");
    // The stall as exec handed it over: the pattern's step, 5 s, one stall.
    let p = &seen["progress"];
    assert_eq!(
        (&p["step"], &p["stalled"], &p["stalls"], &p["after_ms"]),
        (&json!(1.0), &json!(true), &json!(1), &json!(5000)),
        "{seen}"
    );
    assert!(
        p["note"]
            .as_str()
            .unwrap()
            .starts_with("no progress for 5s; last step 1 in \"step 1\"; "),
        "{seen}"
    );
}

/// A `--job` selector that matches none of a template's pods (`job-name=llm-dp` for a
/// Job named `llm-ddp`) is told at once, naming the labels the pods will have (the
/// template's and the Job controller's); the output is still written.
#[test]
fn a_selector_that_matches_none_of_the_templates_pods_is_told() {
    let job = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: llm-ddp\nspec:\n  template:\n    metadata:\n      labels: {app: llm}\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: trainer\n          image: trainer:1\n          command: [torchrun, train.py]\n";
    let typo = inject_stdin(&["--job", "worker=job-name=llm-dp"], job);
    assert_eq!(typo.code, 0, "{}", typo.stderr);
    assert_eq!(
        typo.stderr,
        "trainlet: note: stdin: document 1 (batch/v1 Job \"llm-ddp\"): no --job selector (job-name=llm-dp) matches this template's pods, whose labels are app=llm, batch.kubernetes.io/job-name=llm-ddp, job-name=llm-ddp: their init would wait out --timeout for peers it never finds\ntrainlet: note: stdin: document 1 (batch/v1 Job \"llm-ddp\"): injected\n"
    );
    let right = inject_stdin(&["--job", "worker=job-name=llm-ddp"], job);
    assert_eq!(
        right.stderr,
        "trainlet: note: stdin: document 1 (batch/v1 Job \"llm-ddp\"): injected\n"
    );
}

/// A hostNetwork Job in namespace `ml`.
const HOSTNET_JOB: &str = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: ddp\n  namespace: ml\nspec:\n  template:\n    metadata:\n      labels: {app: ddp}\n    spec:\n      hostNetwork: true\n      containers:\n        - name: train\n          image: t:1\n          command: [torchrun, train.py]\n";

/// On hostNetwork, inject chooses the job's own rendezvous and metrics ports and says
/// so; init is told the rendezvous port, the sidecar, its probe and the annotation the
/// metrics port; dnsPolicy is set; a second inject changes no byte.
#[test]
fn a_hostnetwork_job_gets_its_own_ports_and_cluster_dns() {
    use trainlet::inject::transform::hostnet::{ports, slot};
    let (master, metrics) = ports(slot("ml/ddp"));
    let args = ["--job", "worker=app=ddp", "--wrap", "train"];
    let (doc, notes) = injected_pod(&args, HOSTNET_JOB);
    let spec = &doc["spec"]["template"]["spec"];
    let init = spec["initContainers"][0]["args"].as_array().unwrap();
    assert!(
        init.contains(&json!(format!("--master-port={master}"))),
        "{init:?}"
    );
    let sidecar = &spec["initContainers"][1];
    assert!(
        sidecar["args"]
            .as_array()
            .unwrap()
            .contains(&json!(format!("--metrics-addr=0.0.0.0:{metrics}")))
    );
    assert_eq!(sidecar["ports"], serde_json::Value::Null);
    assert_eq!(sidecar["startupProbe"]["tcpSocket"]["port"], json!(metrics));
    assert_eq!(
        doc["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"],
        json!(metrics.to_string())
    );
    assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet");
    assert!(
        notes.contains(&format!("chooses rank 0's rendezvous port {master} (--master-port, MASTER_PORT) and the sidecar's metrics port {metrics}")),
        "{notes}"
    );
    assert!(
        notes.contains("sets dnsPolicy ClusterFirstWithHostNet (was none)"),
        "{notes}"
    );

    let once = inject_stdin(&args, HOSTNET_JOB);
    let twice = inject_stdin(&args, &once.stdout);
    assert_eq!(twice.code, 0, "{}", twice.stderr);
    assert_eq!(twice.stdout, once.stdout);
    assert!(
        twice
            .stderr
            .contains("keeps an earlier inject's --master-port="),
        "{}",
        twice.stderr
    );
}

/// The flags (and their env vars) win over the choice, on hostNetwork as elsewhere.
#[test]
fn master_port_and_metrics_addr_flags_override_the_choice() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), HOSTNET_JOB).unwrap();
    let r = run(trainlet()
        .args(["inject", "--job", "worker=app=ddp", "--wrap", "train", "-f"])
        .arg(file.path())
        .env("TRAINLET_MASTER_PORT", "29501")
        .env("TRAINLET_METRICS_ADDR", "0.0.0.0:9465"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("- --master-port=29501\n"), "{}", r.stdout);
    assert!(
        r.stdout.contains("- --metrics-addr=0.0.0.0:9465\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("prometheus.io/port: \"9465\""),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("port: 9465\n"), "{}", r.stdout);
    assert!(!r.stderr.contains("chooses"), "{}", r.stderr);
}

/// A bad --metrics-addr or --master-port: exit 2 and one line that names the flag.
#[test]
fn bad_metrics_addr_and_master_port_exit_2_with_one_line() {
    for (flag, value, why) in [
        (
            "--metrics-addr",
            "off",
            "invalid --metrics-addr \"off\": give IPV4:PORT or [::]:PORT with a PORT from 1 to 65535, e.g. 0.0.0.0:9464",
        ),
        (
            "--metrics-addr",
            "0.0.0.0:70000",
            "invalid --metrics-addr \"0.0.0.0:70000\": give IPV4:PORT or [::]:PORT with a PORT from 1 to 65535, e.g. 0.0.0.0:9464",
        ),
        (
            "--master-port",
            "0",
            "invalid --master-port \"0\": give a whole number from 1 to 65535",
        ),
    ] {
        let r = inject_stdin(&["--job", "worker=app=ddp", flag, value], HOSTNET_JOB);
        assert_eq!(r.code, 2, "{flag} {value}: {}", r.stderr);
        assert_eq!(r.stdout, "");
        assert_eq!(
            r.stderr,
            format!("trainlet: error: {why}\n"),
            "{flag} {value}"
        );
    }
}
