//! The admission policy and `trainlet inject` are two implementations of one thing;
//! these tests hold them to one verdict and one pod, on the real API server:
//! - every setting, on a generated corpus of values (the ones a user got wrong,
//!   boundaries, newlines, Unicode, oversized, and seeded fuzz around them), is
//!   refused by the policy exactly when `trainlet inject` refuses it as a flag, and a
//!   refusal names the annotation and its value;
//! - a corpus of pod shapes (the default token's volumes read back from the API server
//!   beside a PVC, projected volumes, init containers and native sidecars, a user's own
//!   `trainlet exec`, an earlier inject's wrapper, env collisions, several containers,
//!   hostNetwork, the pods that Jobs, StatefulSets, ReplicaSets and JobSets make, and
//!   wrapped commands of every launcher, whose framework both infer) comes out of the
//!   policy as the pod that inject's output makes, field for field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::admission::{container, dry_run, injected, install, labelled, restricted_spec};
use crate::support::*;

/// The settings every value is tried with: one job, a wrapped container, a stall watch
/// (so that the exec settings apply); the tried setting replaces its own.
const BASE: [(&str, &str); 3] = [
    ("job", "worker=app=trainer"),
    ("wrap", "main"),
    ("stall-after", "10m"),
];

/// Values a person writes for each setting: right, nearly right, and the ones the
/// hardening pass found admitted and then refused by trainlet.
fn seeds(flag: &str) -> Vec<String> {
    let port = [
        "0", "1", "8470", "65535", "65536", "99999", "+80", "080", " 80", "8o", "1e3",
    ];
    let duration = [
        "0",
        "0s",
        "500ms",
        "1s",
        "10m",
        "1h30m",
        "1h 30m",
        "1h  30m",
        "365d",
        "366d",
        "1.5h",
        "1min",
        "-1s",
        "10",
        "10m ",
        "1d 2h 3m 4s",
        "1d 2h 3m 4s 5ms",
    ];
    let choice = |words: &[&str]| -> Vec<String> {
        words
            .iter()
            .flat_map(|w| {
                [
                    w.to_string(),
                    w.to_uppercase(),
                    format!("{w} "),
                    format!("{w}x"),
                ]
            })
            .collect()
    };
    let v: Vec<String> = match flag {
        "job" => [
            "worker=app=trainer",
            "worker=app=x;--kubeconfig=/x",
            "worker",
            "worker=",
            "worker=app=x;",
            "chief=app=trainer,role=chief; worker=app=trainer,role=worker",
            "w=job-name in (ps),tier!=canary",
            "w=a in (x,,y)",
            "w=a in ()",
            "w=!a",
            "w=a!=b",
            "w = example.com/a == b",
            "1w=a",
            "w-a=app=x;w_a=app=y",
            "ab=app=x;AB=app=y",
            "worker=app=x;worker=app=y",
            "w=a=b=c",
            "w=a<3",
            "w=ключ=x",
        ]
        .map(String::from)
        .into_iter()
        .chain([
            (0..16)
                .map(|i| format!("t{i}=app=x"))
                .collect::<Vec<_>>()
                .join(";"),
            (0..17)
                .map(|i| format!("t{i}=app=x"))
                .collect::<Vec<_>>()
                .join(";"),
            format!("w={}/a=b", "a".repeat(253)),
            format!("w={}/a=b", "a".repeat(254)),
            format!("w=app={}", "x".repeat(63)),
            format!("w=app={}", "x".repeat(64)),
        ])
        .collect(),
        "expect" => [
            "worker=2",
            "worker=0",
            "worker=two",
            "ps=1",
            "worker=1,worker=2",
            "worker=1,",
            "worker = 1",
            "worker=99999999999",
        ]
        .map(String::from)
        .to_vec(),
        "port" | "master-port" | "coordinator-port" => port.map(String::from).to_vec(),
        "port-name" => [
            "tf",
            "a-b",
            "-a",
            "a-",
            "abcdefghijklmno",
            "abcdefghijklmnop",
            "TF",
            "a_b",
        ]
        .map(String::from)
        .to_vec(),
        "address" => choice(&["pod-ip", "host-ip", "dns"]),
        "cluster-domain" => vec![
            "cluster.local".into(),
            "cluster.local.".into(),
            "Cluster.local".into(),
            "a".into(),
            "-a".into(),
            "a".repeat(253),
        ],
        "order" => choice(&["index", "name"]),
        "ready" => choice(&["running", "ready"]),
        "rpc-layer" => ["grpc", "grpc+verbs", "grpc://", "GRPC"]
            .map(String::from)
            .to_vec(),
        "environment" => vec![
            "cloud".into(),
            "google".into(),
            "a b".into(),
            "e".repeat(64),
            "e".repeat(65),
        ],
        "timeout" | "restart-grace" | "stall-after" => duration.map(String::from).to_vec(),
        "coordinate" => choice(&["auto", "always", "never"]),
        "coordinate-from" => ["0", "1", "2", "384", "+5", "999999999", "1000000000"]
            .map(String::from)
            .to_vec(),
        "framework" => [
            "tensorflow",
            "pytorch,jax",
            "pytorch, jax",
            "torch",
            "PYTORCH",
            "mpi,mpi",
            "pytorch,",
        ]
        .map(String::from)
        .to_vec(),
        "nproc-per-node" => ["auto", "gpu", "cpu", "0", "1", "8", "-1", "Auto"]
            .map(String::from)
            .to_vec(),
        "slots" => ["gpu", "0", "1", "auto"].map(String::from).to_vec(),
        "nnodes" => ["2:4", "5:2", "0:2", "4", "2:", "3:3"]
            .map(String::from)
            .to_vec(),
        "on-peer-change" | "on-stall" => choice(&["report", "restart", "exit"]),
        "stall-scope" => choice(&["auto", "job", "pod"]),
        "max-restarts" => ["0", "3", "-1", "+3", "03", "1000000000"]
            .map(String::from)
            .to_vec(),
        "progress-pattern" => [
            r"step (\d+)",
            "step (",
            "[a",
            r"\p{L}",
            "(?=a)",
            "a{2,1}",
            "[z-a]",
            "loss=[0-9.]+",
            "((a))",
            "(((a)))",
            r"\bstep\b",
        ]
        .map(String::from)
        .to_vec(),
        "wrap" => ["main", "nope", "Main"].map(String::from).to_vec(),
        "on-failure" => choice(&["exit", "restart"]),
        "permanent-exit-codes" => [
            "2,126,127",
            "42",
            "3,42,3",
            "255",
            "0",
            "0,1",
            "256",
            "1, 2",
            "01",
            "+1",
            "1,,2",
            "1,2,",
            "-1",
            "1;2",
        ]
        .map(String::from)
        .into_iter()
        .chain([
            (1..=255)
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
            (1..=255)
                .chain(1..=255)
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ])
        .collect(),
        "metrics-addr" => [
            "0.0.0.0:9465",
            "0.0.0.0:9464",
            "[::]:9465",
            "10.0.0.7:25000",
            "255.255.255.255:65535",
            "0.0.0.0:0",
            "0.0.0.0:65536",
            "0.0.0.0:09465",
            "256.0.0.1:80",
            "01.2.3.4:80",
            "[::1]:9465",
            "localhost:9465",
            ":9465",
            "9465",
            "off",
        ]
        .map(String::from)
        .to_vec(),
        other => panic!("no seeds for {other}"),
    };
    v
}

/// The seeds, each also with a newline, Unicode and past its size bound, and seeded
/// fuzz: characters inserted, removed and swapped, and short random strings.
fn corpus(flag: &str, rng: &mut StdRng) -> Vec<String> {
    const ALPHABET: &[char] = &[
        'a', 'b', 'W', 'Z', '0', '1', '9', '=', ',', ';', ':', '(', ')', '!', '-', '_', '.', '/',
        ' ', '\t', '+', '*', '?', '[', ']', '{', '}', '\\', 'é', '\n', 'm', 's', 'h', 'd',
    ];
    let seeds = seeds(flag);
    let mut out = seeds.clone();
    for s in &seeds {
        out.push(format!("{s}\n"));
        out.push(format!("{s}é"));
    }
    let max = match flag {
        "job" => 4096,
        "permanent-exit-codes" => 1024,
        _ => 256,
    };
    out.push(format!(
        "{}{}",
        seeds[0],
        "1".repeat(max + 1 - seeds[0].chars().count())
    ));
    out.push("x\n".repeat(40));
    let pick = |rng: &mut StdRng| ALPHABET[rng.random_range(0..ALPHABET.len())];
    for _ in 0..12 {
        let mut chars: Vec<char> = seeds[rng.random_range(0..seeds.len())].chars().collect();
        let at = rng.random_range(0..=chars.len());
        match rng.random_range(0..3) {
            0 => chars.insert(at, pick(rng)),
            1 if at < chars.len() => {
                chars.remove(at);
            }
            _ if !chars.is_empty() => {
                let at = at.min(chars.len() - 1);
                chars[at] = pick(rng);
            }
            _ => chars.push(pick(rng)),
        }
        out.push(chars.into_iter().collect());
    }
    for _ in 0..6 {
        let len = rng.random_range(1..12);
        out.push((0..len).map(|_| pick(rng)).collect());
    }
    out.retain(|v| !v.is_empty() && !v.contains('\0'));
    out.sort();
    out.dedup();
    out
}

/// How the policy shows a value in a message: 64 characters, line breaks as `\n`.
fn shown(v: &str) -> String {
    let cut: String = v.chars().take(64).collect();
    let cut = if v.chars().count() > 64 {
        cut + "…"
    } else {
        cut
    };
    cut.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

/// The plain pod, and its settings as annotations and as inject's flags. The exit codes
/// that `--on-failure restart` does not retry are tried with it (without it, both
/// refuse them: tests/it/admission.rs).
fn case(flag: &str, value: &str) -> (Value, Vec<String>) {
    let mut settings: BTreeMap<&str, &str> = BASE.into_iter().collect();
    if flag == "permanent-exit-codes" {
        settings.insert("on-failure", "restart");
    }
    settings.insert(flag, value);
    let annotations: serde_json::Map<String, Value> = settings
        .iter()
        .map(|(f, v)| (format!("trainlet.io/{f}"), json!(v)))
        .collect();
    let flags = settings.iter().map(|(f, v)| format!("--{f}={v}")).collect();
    let pod = labelled(
        "v",
        Value::Object(annotations),
        json!([container("main", json!(["python", "train.py"]))]),
    );
    (pod, flags)
}

/// `trainlet inject`'s verdict on the plain pod with these flags (from a file: a flag
/// refused by clap ends inject before it reads its input).
fn inject_accepts(pod: &Value, flags: &[String]) -> bool {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), pod.to_string()).unwrap();
    let out = trainlet()
        .args(["inject", "-f"])
        .arg(file.path())
        .args(flags)
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => true,
        Some(2) => false,
        other => panic!(
            "inject {flags:?} exited {other:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Every setting's generated values get one verdict from the policy and from inject;
/// a refusal by the policy names the annotation and the value.
#[tokio::test]
async fn the_policy_refuses_exactly_the_values_inject_refuses() {
    let kc = kubeconfig();
    let client = admin().await;
    let ns = restricted_namespace(kc, &client, "admission-agree").await;
    let _params = install(kc, &ns).await;
    let api = Api::<Pod>::namespaced(client.clone(), &ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let flags = [
        "job",
        "expect",
        "port",
        "port-name",
        "address",
        "cluster-domain",
        "order",
        "ready",
        "rpc-layer",
        "environment",
        "timeout",
        "coordinate",
        "coordinate-from",
        "framework",
        "nproc-per-node",
        "slots",
        "master-port",
        "coordinator-port",
        "nnodes",
        "on-peer-change",
        "max-restarts",
        "restart-grace",
        "stall-after",
        "on-stall",
        "stall-scope",
        "progress-pattern",
        "on-failure",
        "permanent-exit-codes",
        "metrics-addr",
        "wrap",
    ];
    let mut rng = StdRng::seed_from_u64(0x7472_6169_6e6c_6574);
    let (mut tried, mut refused, mut disagree) = (0, 0, Vec::new());
    let mut sides: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for flag in flags {
        for value in corpus(flag, &mut rng) {
            let (pod, args) = case(flag, &value);
            let by_inject = inject_accepts(&pod, &args);
            let typed: Pod = serde_json::from_value(pod).unwrap();
            let by_policy = match api.create(&dry, &typed).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) => Err(s.message),
                Err(e) => panic!("{flag}={value:?}: {e}"),
            };
            tried += 1;
            let side = sides.entry(flag).or_default();
            if by_policy.is_ok() {
                side.0 += 1;
            } else {
                side.1 += 1;
            }
            if let Err(message) = &by_policy {
                refused += 1;
                let named = format!("trainlet.io/{flag} \"{}\"", shown(&value));
                assert!(
                    message.contains(&named),
                    "{flag}={value:?}: the refusal does not name {named}: {message}"
                );
            }
            if by_policy.is_ok() != by_inject {
                disagree.push(format!(
                    "{flag}={value:?}: policy {by_policy:?}, inject {}",
                    if by_inject { "accepts" } else { "refuses" }
                ));
            }
        }
    }
    assert!(
        disagree.is_empty(),
        "{} of {tried}:\n{}",
        disagree.len(),
        disagree.join("\n")
    );
    eprintln!(
        "{tried} values of {} settings, {refused} refused by both",
        flags.len()
    );
    // The corpus tries both sides of every rule.
    let one_sided: Vec<&str> = flags
        .iter()
        .filter(|f| {
            let (yes, no) = sides.get(**f).copied().unwrap_or_default();
            yes == 0 || no == 0
        })
        .copied()
        .collect();
    assert!(
        one_sided.is_empty(),
        "only accepted or only refused: {one_sided:?}"
    );
    delete_namespace(&client, &ns).await;
}

/// Where two JSON values first differ, for a message.
fn difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            difference(
                &format!("{path}.{k}"),
                &x.get(k).cloned().unwrap_or(Value::Null),
                &y.get(k).cloned().unwrap_or(Value::Null),
            )
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| difference(&format!("{path}[{i}]"), p, q)),
        _ if a == b => None,
        _ => Some(format!("{path}: {a} against {b}")),
    }
}

/// `pod` with its default token's volume named `kube-api-access-x` (the API server
/// gives it a random suffix on each create) and last among the volumes and each
/// container's mounts: the ServiceAccount admission adds it after inject's, and before
/// the policy's.
fn token_named(pod: Value) -> Value {
    let text = regex::Regex::new("kube-api-access-[a-z0-9]+")
        .unwrap()
        .replace_all(&pod.to_string(), "kube-api-access-x")
        .into_owned();
    let mut pod: Value = serde_json::from_str(&text).unwrap();
    let last = |list: &mut Value| {
        if let Some(items) = list.as_array_mut() {
            let (token, mut rest): (Vec<Value>, Vec<Value>) = items
                .drain(..)
                .partition(|v| v["name"] == "kube-api-access-x");
            rest.extend(token);
            *items = rest;
        }
    };
    last(&mut pod["spec"]["volumes"]);
    for l in ["initContainers", "containers"] {
        for c in pod["spec"][l].as_array_mut().into_iter().flatten() {
            last(&mut c["volumeMounts"]);
        }
    }
    pod
}

/// A Pod with the label, these annotations, and `spec`.
fn pod(name: &str, labels: Value, annotations: Value, spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec
    })
}

/// One shape: its name, the settings as annotations and as inject's flags, and the
/// plain pod.
struct Shape {
    name: &'static str,
    settings: Vec<(&'static str, &'static str)>,
    pod: Value,
}

fn restricted(mut c: Value) -> Value {
    c["securityContext"] =
        json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    c
}

fn shapes() -> Vec<Shape> {
    let wrapped = vec![("job", "worker=app=trainer"), ("wrap", "main")];
    let main = container("main", json!(["python", "train.py"]));
    let with = |mut c: Value, key: &str, v: Value| {
        c[key] = v;
        c
    };
    let token_volume = |n: &str| json!({"name": n, "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}});
    let spec = |containers: Value, inits: Value, volumes: Value| {
        restricted_spec(containers, inits, volumes)
    };
    let labels = json!({"app": "trainer"});
    // Without trainlet.io/framework, the wrapped command's launcher chooses it, in the
    // policy as in inject.
    let launcher = |name: &'static str, command: Value, args: Option<Value>| {
        let mut c = container("main", command);
        if let Some(a) = args {
            c["args"] = a;
        }
        Shape {
            name,
            settings: wrapped.clone(),
            pod: pod(
                name,
                labels.clone(),
                json!({}),
                spec(json!([c]), json!([]), json!([])),
            ),
        }
    };
    let launchers = [
        launcher(
            "torchrun",
            json!(["/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"]),
            None,
        ),
        launcher(
            "torch-distributed-run",
            json!(["python3", "-u", "-m", "torch.distributed.run"]),
            Some(json!(["--nnodes=2", "train.py"])),
        ),
        launcher(
            "accelerate-launch",
            json!(["accelerate", "launch", "train.py"]),
            None,
        ),
        launcher(
            "deepspeed",
            json!(["deepspeed"]),
            Some(json!(["--hostfile", "/etc/trainlet/hostfile", "train.py"])),
        ),
        launcher(
            "mpirun",
            json!(["mpirun", "-np", "4", "python", "train.py"]),
            None,
        ),
        launcher(
            "horovodrun",
            json!(["horovodrun", "-np", "4", "python", "train.py"]),
            None,
        ),
        launcher(
            "sh-c-torchrun",
            json!([
                "sh",
                "-c",
                "pip install -r req.txt && exec torchrun train.py"
            ]),
            None,
        ),
        launcher(
            "own-exec-mpirun-torchrun",
            json!([
                "trainlet",
                "exec",
                "--progress-pattern=step (\\d+)",
                "--",
                "bash",
                "-lc"
            ]),
            Some(json!([
                "mpirun -np 2 hostname && torchrun train.py; echo done"
            ])),
        ),
        launcher("plain-python", json!(["python", "-m", "train"]), None),
        Shape {
            settings: vec![
                ("job", "worker=app=trainer"),
                ("wrap", "main"),
                ("framework", "tensorflow"),
            ],
            ..launcher(
                "torchrun-but-tensorflow",
                json!(["torchrun", "train.py"]),
                None,
            )
        },
        Shape {
            settings: vec![
                ("job", "worker=app=trainer"),
                ("wrap", "main"),
                ("on-failure", "restart"),
                ("permanent-exit-codes", "42,3,42"),
            ],
            ..launcher("restart-on-failure", json!(["torchrun", "train.py"]), None)
        },
    ];
    vec![
        Shape {
            name: "tokens-and-pvc",
            settings: wrapped.clone(),
            pod: pod("tokens-and-pvc", labels.clone(), json!({}), {
                let mut s = spec(
                    json!([with(
                        main.clone(),
                        "volumeMounts",
                        json!([
                            {"name": "kube-api-access-a", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
                            {"name": "kube-api-access-b", "mountPath": "/b", "readOnly": true},
                            {"name": "data", "mountPath": "/data"}
                        ])
                    )]),
                    json!([]),
                    json!([token_volume("kube-api-access-a"), token_volume("kube-api-access-b"),
                        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]),
                );
                s["automountServiceAccountToken"] = json!(false);
                s
            }),
        },
        Shape {
            name: "projected-and-inits",
            settings: wrapped.clone(),
            pod: pod(
                "projected-and-inits",
                labels.clone(),
                json!({}),
                spec(
                    json!([with(
                        main.clone(),
                        "volumeMounts",
                        json!([{"name": "s3", "mountPath": "/var/run/s3", "readOnly": true}])
                    )]),
                    json!([
                        container("fetch", json!(["sh", "-c", "true"])),
                        with(
                            container("proxy", json!(["sh", "-c", "sleep 1d"])),
                            "restartPolicy",
                            json!("Always")
                        ),
                    ]),
                    json!([{"name": "s3", "projected": {"sources": [{"serviceAccountToken": {"audience": "s3", "path": "token"}}]}}]),
                ),
            ),
        },
        Shape {
            name: "own-exec",
            settings: vec![
                ("job", "worker=app=trainer"),
                ("wrap", "main"),
                ("stall-after", "10m"),
                ("on-stall", "restart"),
            ],
            pod: pod(
                "own-exec",
                labels.clone(),
                json!({}),
                spec(
                    json!([container(
                        "main",
                        json!([
                            "trainlet",
                            "exec",
                            "--stall-after=5m",
                            "--",
                            "python",
                            "train.py"
                        ])
                    )]),
                    json!([]),
                    json!([]),
                ),
            ),
        },
        Shape {
            name: "earlier-wrapper",
            settings: vec![
                ("job", "worker=app=trainer"),
                ("wrap", "main"),
                ("max-restarts", "7"),
            ],
            pod: pod(
                "earlier-wrapper",
                labels.clone(),
                json!({}),
                spec(
                    json!([container(
                        "main",
                        json!([
                            "/etc/trainlet/bin/trainlet",
                            "exec",
                            "--report",
                            "--max-restarts=5",
                            "--",
                            "python",
                            "train.py"
                        ])
                    )]),
                    json!([]),
                    json!([]),
                ),
            ),
        },
        Shape {
            name: "env-collisions",
            settings: wrapped.clone(),
            pod: pod(
                "env-collisions",
                labels.clone(),
                json!({}),
                spec(
                    json!([with(
                        main.clone(),
                        "env",
                        json!([
                            {"name": "POD_NAME", "value": "literal"},
                            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            {"name": "TRAINLET_METRICS_ADDR", "value": "0.0.0.0:9000"},
                            {"name": "TRAINLET_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "EPOCHS", "value": "3"}
                        ])
                    )]),
                    json!([]),
                    json!([]),
                ),
            ),
        },
        Shape {
            name: "several-containers",
            settings: vec![
                ("job", "worker=app=trainer"),
                ("wrap", "train"),
                ("framework", "pytorch"),
            ],
            pod: pod(
                "several-containers",
                labels.clone(),
                json!({}),
                spec(
                    json!([
                        container("logger", json!(["sh", "-c", "tail -F /log"])),
                        container("train", json!(["torchrun", "train.py"])),
                        with(
                            container("metrics", json!(["exporter"])),
                            "ports",
                            json!([{"name": "m", "containerPort": 9100}])
                        ),
                    ]),
                    json!([]),
                    json!([]),
                ),
            ),
        },
        Shape {
            name: "users-sa",
            settings: wrapped.clone(),
            pod: pod("users-sa", labels.clone(), json!({}), {
                let mut s = spec(json!([main.clone()]), json!([]), json!([]));
                s["serviceAccountName"] = json!("s3-reader");
                s
            }),
        },
        Shape {
            name: "metrics-addr",
            settings: vec![
                ("job", "worker=app=trainer"),
                ("wrap", "main"),
                ("metrics-addr", "0.0.0.0:9465"),
            ],
            pod: pod(
                "metrics-addr",
                labels.clone(),
                json!({}),
                spec(json!([main.clone()]), json!([]), json!([])),
            ),
        },
    ]
    .into_iter()
    .chain(host_shapes(&main))
    .chain(launchers)
    .collect()
}

/// hostNetwork pods: ports chosen from the pod's identity (its namespace and name)
/// where no annotation gives them, the annotations' where they do, no rendezvous port
/// chosen where a task port serves as one (but MPI's, the sshd's), and the dnsPolicy
/// set where the pod names none or ClusterFirst, kept where it names another.
fn host_shapes(main: &Value) -> Vec<Shape> {
    let host =
        |name: &'static str, settings: Vec<(&'static str, &'static str)>, dns: Option<&str>| {
            let mut s = restricted_spec(json!([main.clone()]), json!([]), json!([]));
            s["hostNetwork"] = json!(true);
            if let Some(d) = dns {
                s["dnsPolicy"] = json!(d);
            }
            let mut all = vec![("job", "worker=app=trainer"), ("wrap", "main")];
            all.extend(settings);
            Shape {
                name,
                settings: all,
                pod: pod(name, json!({"app": "trainer"}), json!({}), s),
            }
        };
    vec![
        host("host-network", vec![("address", "host-ip")], None),
        host(
            "host-network-ports",
            vec![
                ("framework", "pytorch"),
                ("master-port", "29501"),
                ("metrics-addr", "0.0.0.0:9465"),
            ],
            None,
        ),
        host("host-network-task-port", vec![("port", "2222")], None),
        host(
            "host-network-mpi-port",
            vec![("framework", "mpi,pytorch"), ("port-name", "ssh")],
            None,
        ),
        host("host-network-dns-default", vec![], Some("Default")),
        host("host-network-cluster-first", vec![], Some("ClusterFirst")),
    ]
}

/// The frameworks that the wrapped command of each launcher's shape gives, where no
/// trainlet.io/framework says otherwise; none: TensorFlow's alone, and its port.
const INFERRED: [(&str, Option<&str>); 10] = [
    ("torchrun", Some("pytorch")),
    ("torch-distributed-run", Some("pytorch")),
    ("accelerate-launch", Some("pytorch")),
    ("deepspeed", Some("pytorch")),
    ("mpirun", Some("mpi")),
    ("horovodrun", Some("mpi")),
    ("sh-c-torchrun", Some("pytorch")),
    ("own-exec-mpirun-torchrun", Some("pytorch,mpi")),
    ("plain-python", None),
    ("torchrun-but-tensorflow", None),
];

/// The pods that controllers make of a template, as they make them: their labels and
/// annotations, the hostname, and (the Job controller) JOB_COMPLETION_INDEX in every
/// container.
fn controller_pods() -> Vec<(&'static str, Value, Value)> {
    let template = json!({
        "metadata": {"labels": {"app": "trainer"}},
        "spec": restricted_spec(
            json!([restricted(json!({"name": "main", "image": "trainer:1", "command": ["python", "train.py"]}))]),
            json!([]),
            json!([]),
        )
    });
    let job_spec = json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2, "template": template});
    vec![
        (
            "job",
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}, "spec": job_spec}),
            json!({"labels": {"batch.kubernetes.io/job-name": "train", "job-name": "train", "batch.kubernetes.io/job-completion-index": "1"},
                   "annotations": {"batch.kubernetes.io/job-completion-index": "1"}, "hostname": "train-1", "index_env": true}),
        ),
        (
            "statefulset",
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "train"},
                   "spec": {"serviceName": "train", "replicas": 2, "selector": {"matchLabels": {"app": "trainer"}}, "template": template}}),
            json!({"labels": {"apps.kubernetes.io/pod-index": "1", "statefulset.kubernetes.io/pod-name": "train-1"},
                   "annotations": {}, "hostname": "train-1", "subdomain": "train", "index_env": false}),
        ),
        (
            "replicaset",
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "train"},
                   "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "trainer"}}, "template": template}}),
            json!({"labels": {}, "annotations": {}, "index_env": false}),
        ),
        (
            "jobset",
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "train"},
                   "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": job_spec}}]}}),
            json!({"labels": {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                              "batch.kubernetes.io/job-completion-index": "1"},
                   "annotations": {"batch.kubernetes.io/job-completion-index": "1", "jobset.sigs.k8s.io/jobset-name": "train"},
                   "hostname": "train-workers-0-1", "subdomain": "train", "index_env": true}),
        ),
    ]
}

/// The pod a controller makes of `template` (its metadata and spec), with `made`'s
/// additions.
fn made_pod(name: &str, template: &Value, made: &Value) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"].clone(), "spec": template["spec"].clone()});
    p["metadata"]["name"] = json!(name);
    for key in ["labels", "annotations"] {
        for (k, v) in made[key].as_object().unwrap() {
            p["metadata"][key][k] = v.clone();
        }
    }
    for key in ["hostname", "subdomain"] {
        if let Some(v) = made.get(key) {
            p["spec"][key] = v.clone();
        }
    }
    if made["index_env"] == json!(true) {
        let index = json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}});
        for list in ["initContainers", "containers"] {
            for c in p["spec"][list].as_array_mut().into_iter().flatten() {
                match c["env"].as_array_mut() {
                    Some(env) => env.push(index.clone()),
                    None => c["env"] = json!([index.clone()]),
                }
            }
        }
    }
    p
}

/// The template inside a manifest that inject printed.
fn template_of(doc: &Value) -> Value {
    match doc["kind"].as_str() {
        Some("JobSet") => doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"].clone(),
        _ => doc["spec"]["template"].clone(),
    }
}

/// A pod's spec with JOB_COMPLETION_INDEX last in every env, and none in trainlet's own
/// containers: the Job controller adds it to a template's containers after inject (to
/// trainlet's too, which read no such variable), and to a pod's before the policy adds
/// trainlet's.
fn index_last(mut spec: Value) -> Value {
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            let own = c["name"] == "trainlet-init" || c["name"] == "trainlet";
            if let Some(env) = c["env"].as_array_mut() {
                if own {
                    env.retain(|e| e["name"] != "JOB_COMPLETION_INDEX");
                }
                let (index, mut rest): (Vec<Value>, Vec<Value>) = env
                    .drain(..)
                    .partition(|e| e["name"] == "JOB_COMPLETION_INDEX");
                rest.extend(index);
                *env = rest;
            }
        }
    }
    spec
}

/// Each pod shape comes out of the policy as the pod that `trainlet inject`'s output
/// makes for the same settings: spec, and annotations besides the settings.
#[tokio::test]
async fn the_policy_makes_inject_s_pod_of_every_shape() {
    let kc = kubeconfig();
    let client = admin().await;
    let ns = restricted_namespace(kc, &client, "admission-shapes").await;
    // hostNetwork is no pod of a restricted namespace.
    let open = namespace(&client, "admission-shapes-host").await;
    kubectl_clean(
        kc,
        &[
            "apply",
            "-k",
            repo().join("manifests").to_str().unwrap(),
            "-n",
            &open,
        ],
    );
    let _params = install(kc, &ns).await;
    kubectl_clean(kc, &["create", "serviceaccount", "s3-reader", "-n", &ns]);
    for s in shapes() {
        let ns = if s.name.starts_with("host-network") {
            &open
        } else {
            &ns
        };
        let flags: Vec<String> = s
            .settings
            .iter()
            .map(|(f, v)| format!("--{f}={v}"))
            .collect();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        // In its namespace, which a hostNetwork pod's ports are chosen from, in inject
        // (from the manifest) as in the policy (from the request).
        let mut plain = s.pod.clone();
        plain["metadata"]["namespace"] = json!(ns);
        let mut opted = plain.clone();
        opted["metadata"]["labels"]["trainlet.io/inject"] = json!("true");
        for (f, v) in &s.settings {
            opted["metadata"]["annotations"][format!("trainlet.io/{f}")] = json!(v);
        }
        let by_policy = token_named(dry_run(kc, ns, &opted));
        let by_inject = token_named(dry_run(kc, ns, &injected(&plain, &flags)));
        if s.name.starts_with("host-network") {
            host_network_checks(ns, s.name, &by_policy);
        }
        assert_eq!(
            by_policy["spec"], by_inject["spec"],
            "{}: the policy's pod and inject's differ",
            s.name
        );
        let mut want = by_inject["metadata"]["annotations"].clone();
        for (f, v) in &s.settings {
            want[format!("trainlet.io/{f}")] = json!(v);
        }
        assert_eq!(by_policy["metadata"]["annotations"], want, "{}", s.name);
        let tokens: Vec<String> = ["initContainers", "containers"]
            .iter()
            .flat_map(|l| by_policy["spec"][l].as_array().cloned().unwrap_or_default())
            .filter(|c| {
                c["volumeMounts"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["name"] == "kube-api-access-x"))
            })
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        // No default token but in a pod that keeps its own ServiceAccount, and there
        // in its own containers only: trainlet's mount trainlet-token.
        let want: &[&str] = if s.name == "users-sa" { &["main"] } else { &[] };
        assert_eq!(tokens, want, "{}", s.name);
        if let Some((_, want)) = INFERRED.iter().find(|(n, _)| *n == s.name) {
            let args = |i: usize| by_policy["spec"]["initContainers"][i]["args"].clone();
            let framework: Vec<Value> = args(0)
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| a.as_str().unwrap().starts_with("--framework="))
                .cloned()
                .collect();
            let want_arg: Vec<Value> = want
                .iter()
                .map(|w| json!(format!("--framework={w}")))
                .collect();
            assert_eq!(framework, want_arg, "{}", s.name);
            let tf_port = args(1).as_array().unwrap().contains(&json!("--port=8470"));
            assert_eq!(tf_port, want.is_none(), "{}: {}", s.name, args(1));
        }
    }
    // kubectl reads inject's JobSet through its CRD.
    jobset_crd();
    let settings = [
        ("job", "worker=app=trainer"),
        ("wrap", "main"),
        ("framework", "pytorch"),
    ];
    let flags: Vec<String> = settings.iter().map(|(f, v)| format!("--{f}={v}")).collect();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    for (kind, manifest, made) in controller_pods() {
        let name = format!("{kind}-1");
        let mut opted = made_pod(&name, &template_of(&manifest), &made);
        opted["metadata"]["labels"]["trainlet.io/inject"] = json!("true");
        for (f, v) in settings {
            opted["metadata"]["annotations"][format!("trainlet.io/{f}")] = json!(v);
        }
        let printed = injected(&manifest, &flags);
        let from_inject = made_pod(&name, &template_of(&printed), &made);
        let by_policy = dry_run(kc, &ns, &opted);
        let by_inject = dry_run(kc, &ns, &from_inject);
        assert_eq!(
            difference(
                "spec",
                &index_last(by_policy["spec"].clone()),
                &index_last(by_inject["spec"].clone())
            ),
            None,
            "{kind}: the policy's pod and inject's differ"
        );
    }
    host_controller_pods(kc, &open, &flags);
    delete_namespace(&client, &ns).await;
    delete_namespace(&client, &open).await;
}

/// What a hostNetwork shape must come out with (both sides agreeing is not enough):
/// the ports chosen from `namespace/name`, or the annotations', and its dnsPolicy.
fn host_network_checks(ns: &str, name: &str, pod: &Value) {
    use trainlet::inject::transform::hostnet::{identity, ports, slot};
    let (master, metrics) = ports(slot(&identity(ns, name)));
    let (master, metrics) = match name {
        "host-network-ports" => (Some(29501), 9465),
        "host-network-task-port" => (None, metrics),
        _ => (Some(master), metrics),
    };
    let spec = &pod["spec"];
    let args = |i: usize| {
        spec["initContainers"][i]["args"]
            .as_array()
            .cloned()
            .unwrap()
    };
    let master_arg: Vec<Value> = args(0)
        .into_iter()
        .filter(|a| a.as_str().unwrap().starts_with("--master-port="))
        .collect();
    let want: Vec<Value> = master
        .iter()
        .map(|p| json!(format!("--master-port={p}")))
        .collect();
    assert_eq!(master_arg, want, "{name}");
    let addr = json!(format!("--metrics-addr=0.0.0.0:{metrics}"));
    assert!(args(1).contains(&addr), "{name}: {:?}", args(1));
    let sidecar = &spec["initContainers"][1];
    assert_eq!(sidecar["ports"], Value::Null, "{name}");
    assert_eq!(
        sidecar["startupProbe"]["tcpSocket"]["port"],
        json!(metrics),
        "{name}"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/port"],
        json!(metrics.to_string()),
        "{name}"
    );
    let dns = if name == "host-network-dns-default" {
        "Default"
    } else {
        "ClusterFirstWithHostNet"
    };
    assert_eq!(spec["dnsPolicy"], json!(dns), "{name}");
}

/// The hostNetwork pods of a Job and of a Deployment, as their controllers make them
/// (owned by the Job, or by the Deployment's ReplicaSet `train-<pod-template-hash>`):
/// the policy finds the workload's name as inject does, and chooses inject's ports.
fn host_controller_pods(kc: &std::path::Path, ns: &str, flags: &[&str]) {
    let mut template = json!({
        "metadata": {"labels": {"app": "trainer"}},
        "spec": restricted_spec(
            json!([restricted(json!({"name": "main", "image": "trainer:1", "command": ["python", "train.py"]}))]),
            json!([]),
            json!([]),
        )
    });
    template["spec"]["hostNetwork"] = json!(true);
    let owner = |kind: &str, name: &str| {
        json!([{"apiVersion": if kind == "Job" { "batch/v1" } else { "apps/v1" }, "kind": kind, "name": name,
                "uid": "6b0c3a52-0000-4000-8000-000000000001", "controller": true}])
    };
    let cases = [
        (
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns},
                   "spec": {"template": template}}),
            json!({"labels": {"batch.kubernetes.io/job-name": "train"}, "annotations": {}, "index_env": false}),
            owner("Job", "train"),
        ),
        (
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve", "namespace": ns},
                   "spec": {"selector": {"matchLabels": {"app": "trainer"}}, "template": template}}),
            json!({"labels": {"pod-template-hash": "5d4f8c9b7"}, "annotations": {}, "index_env": false}),
            owner("ReplicaSet", "serve-5d4f8c9b7"),
        ),
    ];
    for (manifest, made, owners) in cases {
        let kind = manifest["kind"].as_str().unwrap().to_string();
        let name = format!("{}-1", kind.to_lowercase());
        let mut opted = made_pod(&name, &template_of(&manifest), &made);
        opted["metadata"]["ownerReferences"] = owners.clone();
        opted["metadata"]["labels"]["trainlet.io/inject"] = json!("true");
        for pair in flags
            .iter()
            .map(|f| f.trim_start_matches("--").split_once('=').unwrap())
        {
            opted["metadata"]["annotations"][format!("trainlet.io/{}", pair.0)] = json!(pair.1);
        }
        let mut from_inject = made_pod(&name, &template_of(&injected(&manifest, flags)), &made);
        from_inject["metadata"]["ownerReferences"] = owners;
        let by_policy = dry_run(kc, ns, &opted);
        let by_inject = dry_run(kc, ns, &from_inject);
        assert_eq!(
            difference("spec", &by_policy["spec"], &by_inject["spec"]),
            None,
            "{kind}: the policy's hostNetwork pod and inject's differ"
        );
        let workload = manifest["metadata"]["name"].as_str().unwrap();
        let (_, metrics) = trainlet::inject::transform::hostnet::ports(
            trainlet::inject::transform::hostnet::slot(&format!("{ns}/{workload}")),
        );
        assert_eq!(
            by_policy["spec"]["initContainers"][1]["startupProbe"]["tcpSocket"]["port"],
            json!(metrics),
            "{kind}"
        );
    }
}
