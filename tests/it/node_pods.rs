//! trainlet in real pods on the real node (tests/node/up, support/node.rs), beyond the
//! shipped examples (node_examples.rs): a real framework, the order of the native
//! sidecar, the credentials, OOM kills inside a container's real memory limit, a port
//! conflict in a pod's network namespace, the termination message, the failure policy
//! on the kubelet's exit codes, a replaced pod, and `--address dns` with the node's
//! cluster DNS (CoreDNS).
//!
//! Every workload is made as a user makes it: a plain Indexed Job, run through the built
//! `trainlet inject` (the shipped layout: trainlet-init, the native sidecar, the
//! training container under `trainlet exec --report`), applied with kubectl into a
//! namespace that enforces Pod Security `restricted` (the framework venv's, mounted by
//! hostPath, alone is `privileged`), with trainlet's RBAC and the guard policy
//! installed. trainlet's containers run from the image of `make image`, the training
//! container from the test image (tests/node/images: the trainer, apicheck, memhog,
//! busybox).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, LogParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::report_support::http_get;
use crate::support::jobs::{index_of, job_pods, name_of};
use crate::support::*;

/// From `kubectl apply` to a Job's end.
pub(crate) const JOB_TIMEOUT: Duration = Duration::from_secs(240);

/// The node and a namespace of its own that enforces Pod Security `restricted`, with
/// trainlet's RBAC; or what is missing to start the node (support::node).
pub(crate) struct On {
    pub(crate) kc: &'static Path,
    pub(crate) client: Client,
    pub(crate) ns: String,
}

impl On {
    pub(crate) async fn restricted(prefix: &str) -> Result<On, Missing> {
        let kc = node()?;
        let client = client_from(kc).await;
        let ns = restricted_namespace(kc, &client, prefix).await;
        Ok(On { kc, client, ns })
    }

    pub(crate) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// `trainlet inject` of a plain Job, as a user runs it (`--job worker=<its pods>
    /// --wrap main` and `flags`), then `kubectl apply`, failing on any warning. Returns
    /// what was applied, as JSON.
    pub(crate) fn inject_and_apply(
        &self,
        plain: &Value,
        flags: &[&str],
        edit: impl FnOnce(&mut Value),
    ) {
        let mut doc = inject(self.kc, plain, flags);
        edit(&mut doc);
        apply_clean(self.kc, &self.ns, &doc);
    }

    /// Waits until the Job has ended (Complete or Failed) and returns that condition's
    /// (type, reason, message); the pods' states and logs on a timeout.
    pub(crate) async fn job_end(&self, job: &str) -> (String, String, String) {
        self.job_end_within(job, JOB_TIMEOUT).await
    }

    /// The same, with a deadline of its own (pods on the emulated cgroup v2 node).
    pub(crate) async fn job_end_within(
        &self,
        job: &str,
        timeout: Duration,
    ) -> (String, String, String) {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.ns);
        let start = Instant::now();
        loop {
            if let Some(c) = jobs
                .get(job)
                .await
                .unwrap()
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            {
                return (
                    c.type_,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default(),
                );
            }
            assert!(
                start.elapsed() < timeout,
                "Job {job} did not end within {timeout:?}; its pods:\n{}",
                describe_pods(&self.pods()).await
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The Job's pods, by index, each the only one of its index.
    pub(crate) async fn only_pods(&self, job: &str, n: usize) -> Vec<Pod> {
        let mut pods = job_pods(&self.client, &self.ns, job).await;
        pods.sort_by_key(index_of);
        assert_eq!(
            pods.iter().map(index_of).collect::<Vec<_>>(),
            (0..n as u32).map(Some).collect::<Vec<_>>(),
            "one pod per index, none replaced: {:?}",
            pods.iter().map(name_of).collect::<Vec<_>>()
        );
        pods
    }

    /// A container's log, with `timestamps` when asked; empty while it has not started.
    pub(crate) async fn log(&self, pod: &str, container: &str, timestamps: bool) -> String {
        let lp = LogParams {
            container: Some(container.to_string()),
            timestamps,
            ..Default::default()
        };
        self.pods().logs(pod, &lp).await.unwrap_or_default()
    }

    /// A container's log without trainlet's own lines (`<time>  INFO ...`): what CMD
    /// printed.
    pub(crate) async fn cmd_lines(&self, pod: &str, container: &str) -> Vec<String> {
        self.log(pod, container, false)
            .await
            .lines()
            .filter(|l| !is_trainlet_line(l))
            .map(str::to_string)
            .collect()
    }

    /// The Events (events.k8s.io) of this reason: (type, note, the pod they regard).
    pub(crate) async fn events_of(&self, reason: &str) -> Vec<(String, String, String)> {
        let mut v: Vec<_> = events(&self.client, &self.ns)
            .await
            .into_iter()
            .filter(|(_, r, _, _)| r == reason)
            .map(|(t, _, note, pod)| (t, note, pod))
            .collect();
        v.sort();
        v
    }

    pub(crate) async fn done(self) {
        delete_namespace(&self.client, &self.ns).await;
    }
}

/// trainlet's own log lines: an RFC 3339 time, then the level.
pub(crate) fn is_trainlet_line(l: &str) -> bool {
    let mut f = l.split_whitespace();
    f.next().is_some_and(|t| t.len() > 20 && t.ends_with('Z'))
        && f.next()
            .is_some_and(|lvl| ["INFO", "WARN", "ERROR", "DEBUG"].contains(&lvl))
}

/// The runs of CMD in a container's log, each from the `start: ` line it prints first,
/// without trainlet's own lines.
pub(crate) fn start_runs(log: &str) -> Vec<String> {
    let mut runs: Vec<String> = Vec::new();
    for l in log.lines().filter(|l| !is_trainlet_line(l)) {
        if l.starts_with("start: ") {
            runs.push(String::new());
        }
        let run = runs
            .last_mut()
            .unwrap_or_else(|| panic!("a line before `start: `: {l}\n{log}"));
        run.push_str(l);
        run.push('\n');
    }
    runs
}

/// A plain Indexed Job of `n` pods whose one container is `main`, as a user writes it
/// before `trainlet inject`: Pod Security `restricted` (non-root, no privilege
/// escalation, no capabilities, RuntimeDefault seccomp), `restartPolicy: Never`,
/// `backoffLimit: 0`.
pub(crate) fn plain_job(name: &str, n: usize, main: Value) -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"}
                    },
                    "containers": [main]
                }
            }
        }
    })
}

/// The training container `main` of the test image running `command`, with a memory
/// limit.
pub(crate) fn main_container(command: &[&str], memory: &str) -> Value {
    json!({
        "name": "main",
        "image": "trainlet.test/trainer:1",
        "imagePullPolicy": "Never",
        "command": command,
        "resources": {
            "requests": {"cpu": "10m", "memory": memory},
            "limits": {"memory": memory}
        },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}
        }
    })
}

/// `trainlet inject -f - --job worker=batch.kubernetes.io/job-name=<name> --wrap
/// <the first container> FLAGS` of a plain Job, as kubectl reads the output.
fn inject(kc: &Path, plain: &Value, flags: &[&str]) -> Value {
    as_json(kc, &inject_yaml(plain, flags))
}

/// The same, inject's output as it printed it (every document).
fn inject_yaml(plain: &Value, flags: &[&str]) -> String {
    let name = plain["metadata"]["name"].as_str().unwrap();
    let wrap = plain["spec"]["template"]["spec"]["containers"][0]["name"]
        .as_str()
        .unwrap();
    let job = format!("worker=batch.kubernetes.io/job-name={name}");
    let mut args = vec!["--job", &job, "--wrap", wrap];
    args.extend(flags);
    inject_printed(plain, &args)
}

pub(crate) fn pod_spec(doc: &mut Value) -> &mut Value {
    &mut doc["spec"]["template"]["spec"]
}

/// The state of a container (init or regular) in a pod's status, as JSON.
pub(crate) fn state(p: &Pod, container: &str) -> Value {
    let st = p.status.clone().unwrap();
    let c = st
        .init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten())
        .find(|c| c.name == container)
        .unwrap_or_else(|| panic!("{}: no status of container {container}", p.name_any()));
    let mut v = serde_json::to_value(c).unwrap();
    v["state"]["restartCount"] = json!(c.restart_count);
    v["state"].clone()
}

/// `terminated` of a container's state without its containerID and times:
/// (exitCode, reason, message).
pub(crate) fn terminated(p: &Pod, container: &str) -> (i64, String, Option<String>) {
    let s = state(p, container);
    let t = &s["terminated"];
    assert!(t.is_object(), "{}: {container} is {s}", p.name_any());
    (
        t["exitCode"].as_i64().unwrap(),
        t["reason"].as_str().unwrap_or_default().to_string(),
        t["message"].as_str().map(str::to_string),
    )
}

pub(crate) fn ip(p: &Pod) -> String {
    p.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

/// A log timestamp (RFC 3339 with up to 9 fractional digits) as a sortable key.
fn log_time(line: &str) -> (String, u32) {
    let ts = line.split_whitespace().next().unwrap();
    let ts = ts.strip_suffix('Z').unwrap();
    let (secs, frac) = ts.split_once('.').unwrap_or((ts, "0"));
    let nanos = format!("{frac:0<9}")[..9].parse().unwrap();
    (secs.to_string(), nanos)
}

pub(crate) fn report(p: &Pod) -> Value {
    serde_json::from_str(&p.annotations()["trainlet.io/report"]).unwrap()
}

/// 1. A real framework on real pods: PyTorch all-reduces with gloo across the 3 pods of
/// an Indexed Job, from what trainlet-init wrote (`--framework pytorch`: torch.env, and
/// its variables in CMD's environment through `trainlet exec --report`). The framework
/// venv (.ci/frameworks) and its base interpreter are the host's, mounted read-only by
/// hostPath with the host's /usr (tests/node/README.md), so this namespace is
/// `privileged`, the only one.
#[tokio::test]
async fn pytorch_all_reduces_with_gloo_across_three_pods_of_an_indexed_job() {
    let py = require!(framework_python());
    let kc = require!(node());
    let client = client_from(kc).await;
    let ns = namespace_with_labels(
        &client,
        "torch",
        &[("pod-security.kubernetes.io/enforce", "privileged")],
    )
    .await;
    let manifests = repo().join("manifests");
    kubectl_clean(kc, &["apply", "-k", manifests.to_str().unwrap(), "-n", &ns]);
    let on = On { kc, client, ns };
    let (volumes, mounts) = venv_hostpath(py);
    // tests/fixtures/frameworks/torch_allreduce.py, and the rendezvous it was given.
    let code = format!(
        "import os\nos.write(1, f\"master={{os.environ['MASTER_ADDR']}}:{{os.environ['MASTER_PORT']}}\\n\".encode())\n{}",
        std::fs::read_to_string(repo().join("tests/fixtures/frameworks/torch_allreduce.py"))
            .unwrap()
    );
    let mut main = main_container(&[py.to_str().unwrap(), "-c", &code], "2Gi");
    main["name"] = json!("pytorch");
    main["env"] = json!([
        {"name": "HOME", "value": "/tmp"},
        {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"}
    ]);
    main["volumeMounts"] = mounts;
    let mut plain = plain_job("allreduce", 3, main);
    pod_spec(&mut plain)["volumes"] = volumes;
    on.inject_and_apply(&plain, &["--framework", "pytorch"], |_| {});
    let end = on.job_end("allreduce").await;
    assert_eq!(
        end,
        (
            "Complete".into(),
            "CompletionsReached".into(),
            "Reached expected number of succeeded pods".into()
        ),
        "{}",
        describe_pods(&on.pods()).await
    );
    let pods = on.only_pods("allreduce", 3).await;
    let master = ip(&pods[0]);
    for (rank, p) in pods.iter().enumerate() {
        let lines: Vec<String> = on
            .cmd_lines(&p.name_any(), "pytorch")
            .await
            .into_iter()
            .filter(|l| l.starts_with("master=") || l.starts_with("rank="))
            .collect();
        assert_eq!(
            lines,
            [
                format!("master={master}:29500"),
                format!("rank={rank} world=3 sum=3")
            ],
            "{}",
            p.name_any()
        );
        assert_eq!(terminated(p, "pytorch").0, 0);
        assert_eq!(
            p.annotations().get("trainlet.io/task").map(String::as_str),
            Some(format!("worker/{rank}").as_str())
        );
    }
    on.done().await;
}

/// 2. The native sidecar (an init container with `restartPolicy: Always`) runs before
/// the training container starts and after it ends, and does not hold the Job: the
/// Job completes. The kubelet's container times (seconds) are in that order; the
/// containers' log lines (the CRI's nanosecond times) strictly so, because the kubelet
/// starts the training container only once the sidecar's startup probe finds its
/// metrics port listening; the training container finds it so in the pod's network
/// namespace; the sidecar's last line is its SIGTERM from the kubelet, after the
/// training container ended; it exits 0, never restarted.
#[tokio::test]
async fn the_native_sidecar_starts_before_the_training_container_and_stops_after_it() {
    let on = require!(On::restricted("order").await);
    // 9464 is 0x24F8: a LISTEN socket (state 0A) on it, IPv4 or IPv6.
    let script = "if cat /proc/net/tcp /proc/net/tcp6 | grep -Eq ':24F8 0+:0000 0A'; then echo 'sidecar metrics port: listening'; else echo 'sidecar metrics port: closed'; fi
trainer --source tf || exit 1
sleep 2
echo 'training: done'";
    let plain = plain_job("order", 1, main_container(&["sh", "-c", script], "64Mi"));
    on.inject_and_apply(&plain, &[], |_| {});
    let end = on.job_end("order").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Complete", "CompletionsReached"),
        "{end:?}: {}",
        describe_pods(&on.pods()).await
    );
    let p = on.only_pods("order", 1).await.remove(0);
    let name = p.name_any();
    // Every container ended by itself or, the sidecar, by the kubelet, with 0.
    for c in ["trainlet-init", "trainlet", "main"] {
        assert_eq!(terminated(&p, c), (0, "Completed".to_string(), None), "{c}");
        assert_eq!(state(&p, c)["restartCount"], 0, "{c}");
    }
    let t = |c: &str, k: &str| state(&p, c)["terminated"][k].as_str().unwrap().to_string();
    let order = [
        ("trainlet-init finished", t("trainlet-init", "finishedAt")),
        ("trainlet started", t("trainlet", "startedAt")),
        ("main started", t("main", "startedAt")),
        ("main finished", t("main", "finishedAt")),
        ("trainlet finished", t("trainlet", "finishedAt")),
    ];
    for w in order.windows(2) {
        assert!(w[0].1 <= w[1].1, "{order:?}");
    }
    let sidecar = on.log(&name, "trainlet", true).await;
    let main = on.log(&name, "main", true).await;
    let (s_first, s_last) = (
        sidecar.lines().next().unwrap(),
        sidecar.lines().last().unwrap(),
    );
    let (m_first, m_last) = (main.lines().next().unwrap(), main.lines().last().unwrap());
    assert!(
        log_time(s_first) < log_time(m_first),
        "the sidecar's first line {s_first:?} is not before the training container's {m_first:?}"
    );
    assert!(
        log_time(m_last) < log_time(s_last),
        "the training container's last line {m_last:?} is not before the sidecar's {s_last:?}"
    );
    assert!(m_last.ends_with(" training: done"), "{m_last}");
    assert!(s_last.ends_with(" INFO SIGTERM: stopping"), "{s_last}");
    assert_eq!(
        on.cmd_lines(&name, "main").await[0],
        "sidecar metrics port: listening"
    );
    on.done().await;
}

/// 3. Credentials: the training container has no API token (`automountServiceAccountToken:
/// false`; its own `ls` and `apicheck` say so); trainlet-init and the sidecar work
/// with the kubelet-projected, pod-bound token (the task annotation, the health); and
/// with the guard policy (manifests/guard/), that token is denied on another pod:
/// a probe container mounting the same projected token PATCHes the other pod's
/// trainlet.io/ annotation (403, the policy's message) and its own (200).
#[tokio::test]
async fn the_training_container_has_no_token_and_the_pod_token_cannot_touch_another_pod() {
    let on = require!(On::restricted("creds").await);
    // One stream, so that the log keeps the order of the lines.
    let script = "exec 2>&1
ls /var/run/secrets/kubernetes.io/serviceaccount
apicheck --timeout 5
echo \"apicheck exit $?\"
trainer --source tf";
    let plain = plain_job("creds", 2, main_container(&["sh", "-c", script], "64Mi"));
    // The other pod's name from trainlet-init's cluster.json.
    let probe = r#"exec 2>&1
other=$(grep -o '"name": *"[^"]*"' /etc/trainlet/cluster.json | cut -d'"' -f4 | grep -vx "$POD_NAME")
echo "other: $other"
apicheck --merge-patch '{"metadata":{"annotations":{"trainlet.io/task":"worker/9"}}}' --path "/api/v1/namespaces/$POD_NAMESPACE/pods/$other"
apicheck --merge-patch '{"metadata":{"annotations":{"trainlet.io/probe":"own"}}}' --path "/api/v1/namespaces/$POD_NAMESPACE/pods/$POD_NAME"
true"#;
    on.inject_and_apply(&plain, &[], |doc| {
        let spec = pod_spec(doc);
        // The token volume that inject gives trainlet's containers.
        assert_eq!(spec["automountServiceAccountToken"], false);
        let token = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "trainlet-token")
            .unwrap();
        assert_eq!(
            token["projected"]["sources"][0]["serviceAccountToken"]["path"],
            "token"
        );
        let mut c = main_container(&["sh", "-c", probe], "32Mi");
        c["name"] = json!("probe");
        c["env"] = json!([
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
        ]);
        c["volumeMounts"] = json!([
            {"name": "trainlet", "mountPath": "/etc/trainlet", "readOnly": true},
            {"name": "trainlet-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}
        ]);
        spec["containers"].as_array_mut().unwrap().push(c);
    });
    let end = on.job_end("creds").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Complete", "CompletionsReached"),
        "{end:?}: {}",
        describe_pods(&on.pods()).await
    );
    let pods = on.only_pods("creds", 2).await;
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let ns = &on.ns;
    let url = |pod: &str| {
        format!(
            "apicheck: PATCH https://10.96.0.1:443/api/v1/namespaces/{ns}/pods/{pod} (verified as kubernetes.default.svc and 10.96.0.1, with the service-account token)"
        )
    };
    for (i, p) in pods.iter().enumerate() {
        let (me, other) = (&names[i], &names[1 - i]);
        let main: Vec<String> = on
            .cmd_lines(me, "main")
            .await
            .into_iter()
            .filter(|l| !l.starts_with("trainer: "))
            .collect();
        assert_eq!(
            main,
            [
                "ls: /var/run/secrets/kubernetes.io/serviceaccount: No such file or directory",
                "apicheck: error: cannot read: /var/run/secrets/kubernetes.io/serviceaccount/token",
                "apicheck exit 1"
            ],
            "{me}"
        );
        assert_eq!(
            on.cmd_lines(me, "probe").await,
            [
                format!("other: {other}"),
                format!(
                    "{}: HTTP/1.1 403 Forbidden: pods \"{other}\" is forbidden: ValidatingAdmissionPolicy 'trainlet-own-pod-only' with binding 'trainlet-own-pod-only' denied request: trainlet's ServiceAccount may change only the pod its token is bound to",
                    url(other)
                ),
                format!("{}: HTTP/1.1 200 OK", url(me)),
            ],
            "{me}"
        );
        // What trainlet-init and the sidecar wrote with the token; the other pod's
        // probe changed nothing here.
        let a = p.annotations();
        assert_eq!(a["trainlet.io/task"], format!("worker/{i}"), "{me}");
        assert_eq!(a["trainlet.io/health"], "ok", "{me}");
        assert_eq!(a["trainlet.io/probe"], "own", "{me}");
    }
    on.done().await;
}

/// 4a. A child of the training command is OOM-killed inside the training container's
/// real memory limit (96Mi) while the command goes on: `trainlet exec` sees it in the
/// container's memory cgroup and hands it over; the sidecar publishes one `OOMKill`
/// Event and the annotations naming the process. The kubelet (containerd) marks the
/// container `OOMKilled` although its command exited 0: it records any OOM kill in the
/// container's cgroup; trainlet's report says which process it was.
#[tokio::test]
async fn a_child_oom_killed_in_the_training_container_is_published_by_the_sidecar() {
    let on = require!(On::restricted("oom-child").await);
    let script = "exec 2>&1; memhog 10 & echo \"memhog pid $!\"; wait $!; echo \"memhog status $?\"; sleep 3";
    let plain = plain_job(
        "oom-child",
        1,
        main_container(&["sh", "-c", script], "96Mi"),
    );
    on.inject_and_apply(&plain, &[], |_| {});
    let end = on.job_end("oom-child").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Complete", "CompletionsReached"),
        "{end:?}: {}",
        describe_pods(&on.pods()).await
    );
    let p = on.only_pods("oom-child", 1).await.remove(0);
    let name = p.name_any();
    let lines = on.cmd_lines(&name, "main").await;
    let pid = lines[0].strip_prefix("memhog pid ").unwrap().to_string();
    assert_eq!(
        lines,
        [
            format!("memhog pid {pid}"),
            "Killed".to_string(),
            "memhog status 137".to_string()
        ]
    );
    let note =
        format!("process memhog (pid {pid}) in container main was OOM-killed; memory limit 96Mi");
    assert_eq!(
        on.events_of("OOMKill").await,
        [("Warning".to_string(), note.clone(), name.clone())]
    );
    let a = p.annotations();
    assert_eq!(a["trainlet.io/oom-kills"], "1");
    assert_eq!(a["trainlet.io/health"], "degraded");
    let r = report(&p);
    assert_eq!(r["mode"], "sidecar", "published by the sidecar");
    assert_eq!(r["oom"]["kills"], 1);
    assert_eq!(r["oom"]["by_container"], json!({"main": 1}));
    assert_eq!(
        r["oom"]["sources"],
        json!([
            "pod status",
            "trainlet exec in container main (observations)"
        ])
    );
    let kill = &r["oom"]["recent"][0];
    assert_eq!(r["oom"]["recent"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(kill["container"], "main");
    assert_eq!(kill["source"], "cgroup");
    assert_eq!(kill["process"]["comm"], "memhog");
    assert_eq!(kill["process"]["pid"].to_string(), pid);
    assert_eq!(kill["memory_limit"], "96Mi");
    assert_eq!(kill["memory_peak"], 96 << 20);
    assert!(
        r["reasons"][0]
            .as_str()
            .unwrap()
            .ends_with(&format!("(last: {note})")),
        "{r}"
    );
    assert_eq!(terminated(&p, "main"), (0, "OOMKilled".to_string(), None));
    on.done().await;
}

/// 4b. The training command itself is OOM-killed: the kubelet's `OOMKilled` (exit 137)
/// and trainlet agree: the termination message names the process and the limit, the
/// sidecar's report counts the one kill, of that process, in that container, from both
/// of its sources, and one `OOMKill` Event says so.
#[tokio::test]
async fn the_training_command_oom_killed_agrees_with_the_kubelets_oomkilled() {
    let on = require!(On::restricted("oom-main").await);
    let plain = plain_job("oom-main", 1, main_container(&["memhog", "10"], "96Mi"));
    on.inject_and_apply(&plain, &[], |_| {});
    let end = on.job_end("oom-main").await;
    assert_eq!(
        end,
        (
            "Failed".into(),
            "BackoffLimitExceeded".into(),
            "Job has reached the specified backoff limit".into()
        )
    );
    let p = on.only_pods("oom-main", 1).await.remove(0);
    let name = p.name_any();
    let log = on.log(&name, "main", false).await;
    let pid = log
        .lines()
        .find_map(|l| l.split_once(" INFO started memhog pid=").map(|(_, p)| p))
        .unwrap_or_else(|| panic!("{log}"))
        .to_string();
    let kill = format!("process memhog (pid {pid}) was OOM-killed; memory limit 96Mi");
    assert_eq!(
        terminated(&p, "main"),
        (
            137,
            "OOMKilled".to_string(),
            Some(format!("memhog was killed by signal 9 (SIGKILL); {kill}"))
        )
    );
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Failed"));
    assert_eq!(
        on.events_of("OOMKill").await,
        [(
            "Warning".to_string(),
            format!(
                "process memhog (pid {pid}) in container main was OOM-killed; memory limit 96Mi"
            ),
            name.clone()
        )]
    );
    let a = p.annotations();
    assert_eq!(a["trainlet.io/oom-kills"], "1");
    let r = report(&p);
    assert_eq!(r["oom"]["kills"], 1, "{r}");
    assert_eq!(r["oom"]["by_container"], json!({"main": 1}));
    assert_eq!(
        r["oom"]["sources"],
        json!([
            "pod status",
            "trainlet exec in container main (observations)"
        ])
    );
    let k = &r["oom"]["recent"][0];
    assert_eq!(
        (
            &k["container"],
            &k["process"]["comm"],
            k["process"]["pid"].to_string()
        ),
        (&json!("main"), &json!("memhog"), pid.clone())
    );
    on.done().await;
}

/// 5. A port conflict in a real pod's network namespace: another vendor's native
/// sidecar (`exporter`, busybox `nc`) listens on the training port 8470 before the
/// training container starts (its startup probe), the pod shares one process namespace,
/// and `trainlet exec` names the holder; the sidecar publishes one `PortConflict`
/// Event. The trainer then cannot listen, and says why.
#[tokio::test]
async fn a_process_in_the_pod_holding_the_training_port_is_named_in_the_event() {
    let on = require!(On::restricted("port").await);
    let mut plain = plain_job(
        "port",
        1,
        main_container(&["trainer", "--source", "tf"], "64Mi"),
    );
    let spec = pod_spec(&mut plain);
    spec["shareProcessNamespace"] = json!(true);
    // `$$$$`: the kubelet makes `$$` of it, the shell its pid.
    spec["initContainers"] = json!([{
        "name": "exporter",
        "image": "trainlet.test/trainer:1",
        "imagePullPolicy": "Never",
        "restartPolicy": "Always",
        "command": ["sh", "-c", "echo \"exporter pid $$$$\"; exec nc -ll -p 8470 -e true"],
        "startupProbe": {"tcpSocket": {"port": 8470}, "periodSeconds": 1},
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
    }]);
    on.inject_and_apply(&plain, &[], |doc| {
        let inits: Vec<&str> = pod_spec(doc)["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(inits, ["trainlet-init", "trainlet", "exporter"]);
    });
    let end = on.job_end("port").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Failed", "BackoffLimitExceeded")
    );
    let p = on.only_pods("port", 1).await.remove(0);
    let name = p.name_any();
    let pid = on.cmd_lines(&name, "exporter").await[0]
        .strip_prefix("exporter pid ")
        .unwrap()
        .to_string();
    let want = format!(
        "port 8470 is held by process nc (pid {pid}), which is not part of container main; main cannot listen on it"
    );
    assert_eq!(
        on.events_of("PortConflict").await,
        [("Warning".to_string(), want.clone(), name.clone())],
        "{}",
        describe_pods(&on.pods()).await
    );
    assert_eq!(p.annotations()["trainlet.io/port-conflict"], "8470");
    let r = report(&p);
    assert_eq!(
        r["ports"],
        json!([{"port": 8470, "state": "conflict", "reason": "foreign-process",
                "owner": {"pid": pid.parse::<u32>().unwrap(), "comm": "nc"}}])
    );
    assert_eq!(r["reasons"], json!([want]));
    assert_eq!(
        on.cmd_lines(&name, "main").await,
        [format!(
            "trainer: error: worker:0: cannot listen on its own address {}:8470: Address already in use",
            ip(&p)
        )]
    );
    assert_eq!(
        terminated(&p, "main"),
        (
            1,
            "Error".to_string(),
            Some("trainer exited with code 1".to_string())
        )
    );
    on.done().await;
}

/// 6. The termination message of a failed command, as `kubectl get pod -o
/// jsonpath='{..state.terminated.message}'` shows it: the shipped example's `python
/// train.py` in an image without python (exit 127, as a shell's).
#[tokio::test]
async fn kubectl_shows_trainlets_termination_message_for_a_failed_command() {
    let on = require!(On::restricted("message").await);
    let plain = plain_job(
        "message",
        1,
        main_container(&["python", "train.py"], "64Mi"),
    );
    on.inject_and_apply(&plain, &[], |_| {});
    let end = on.job_end("message").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Failed", "BackoffLimitExceeded")
    );
    let p = on.only_pods("message", 1).await.remove(0);
    let got = kubectl_on(
        on.kc,
        &[
            "get",
            "pod",
            "-n",
            &on.ns,
            &p.name_any(),
            "-o",
            "jsonpath={..state.terminated.message}",
        ],
    );
    assert_eq!(
        got,
        "trainlet: cannot run \"python\": No such file or directory (os error 2)"
    );
    assert_eq!(terminated(&p, "main").0, 127);
    on.done().await;
}

/// 7a. `trainlet inject --failure-policy` on the kubelet's exit codes: the trainer
/// exits 1 (a permanent code), and the Job fails at once, by its podFailurePolicy, with
/// no replacement pod.
#[tokio::test]
async fn the_failure_policy_fails_the_job_at_once_when_the_trainer_exits_1() {
    let on = require!(On::restricted("fp-exit1").await);
    // torch's variables are not in CMD's environment (--framework is tensorflow).
    let mut plain = plain_job(
        "fp-exit1",
        1,
        main_container(&["trainer", "--source", "torch"], "64Mi"),
    );
    plain["spec"]["backoffLimit"] = json!(6);
    on.inject_and_apply(&plain, &["--failure-policy"], |_| {});
    let end = on.job_end("fp-exit1").await;
    let pods = on.only_pods("fp-exit1", 1).await;
    let name = pods[0].name_any();
    assert_eq!(
        end,
        (
            "Failed".into(),
            "PodFailurePolicy".into(),
            format!(
                "Container main for pod {}/{name} failed with exit code 1 matching FailJob rule at index 2",
                on.ns
            )
        )
    );
    assert_eq!(
        on.cmd_lines(&name, "main").await,
        ["trainer: error: --source torch: MASTER_ADDR and MASTER_PORT must be set"]
    );
    assert_eq!(
        terminated(&pods[0], "main"),
        (
            1,
            "Error".to_string(),
            Some("trainer exited with code 1".to_string())
        )
    );
    let job = Api::<Job>::namespaced(on.client.clone(), &on.ns)
        .get("fp-exit1")
        .await
        .unwrap();
    assert_eq!(job.status.unwrap().failed, Some(1));
    on.done().await;
}

/// 7b. The training command killed by SIGKILL (`kubectl exec ... kill -9`): trainlet
/// exec exits 137, which the podFailurePolicy counts against backoffLimit: the Job
/// controller replaces the pod (same index, a new pod), whose command is then let
/// finish, and the Job completes with one failure counted.
#[tokio::test]
async fn the_failure_policy_counts_a_sigkilled_trainer_and_the_pod_is_replaced() {
    let on = require!(On::restricted("fp-kill").await);
    let script = "echo $$$$ > /tmp/cmd.pid
trainer --source tf || exit 1
echo 'waiting for /tmp/release'
until [ -e /tmp/release ]; do sleep 0.2; done
echo released";
    let mut plain = plain_job("fp-kill", 1, main_container(&["sh", "-c", script], "64Mi"));
    plain["spec"]["backoffLimit"] = json!(6);
    on.inject_and_apply(&plain, &["--failure-policy"], |_| {});
    let waiting = |not: Vec<String>| {
        let on = &on;
        async move {
            eventually(
                "a pod's command waiting for /tmp/release",
                JOB_TIMEOUT,
                || {
                    let not = not.clone();
                    async move {
                        for p in job_pods(&on.client, &on.ns, "fp-kill").await {
                            let name = p.name_any();
                            if !not.contains(&name)
                                && on
                                    .cmd_lines(&name, "main")
                                    .await
                                    .contains(&"waiting for /tmp/release".to_string())
                            {
                                return Some(name);
                            }
                        }
                        None
                    }
                },
            )
            .await
        }
    };
    let first = waiting(vec![]).await;
    // The container ends with its command, the `kubectl exec` in it too (137, or 0 when
    // it returned first): its status says nothing; the pod's does.
    let kill = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(on.kc)
        .args(["exec", "-n", &on.ns, &first, "-c", "main", "--"])
        .args(["sh", "-c", "kill -9 $(cat /tmp/cmd.pid)"])
        .output()
        .unwrap();
    assert!(
        [Some(0), Some(137)].contains(&kill.status.code()),
        "kubectl exec: {kill:?}"
    );
    let second = waiting(vec![first.clone()]).await;
    kubectl_on(
        on.kc,
        &[
            "exec",
            "-n",
            &on.ns,
            &second,
            "-c",
            "main",
            "--",
            "touch",
            "/tmp/release",
        ],
    );
    let end = on.job_end("fp-kill").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Complete", "CompletionsReached"),
        "{end:?}"
    );
    let job = Api::<Job>::namespaced(on.client.clone(), &on.ns)
        .get("fp-kill")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!((job.failed, job.succeeded), (Some(1), Some(1)));
    let pods: BTreeMap<String, Pod> = job_pods(&on.client, &on.ns, "fp-kill")
        .await
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect();
    assert_eq!(
        pods.keys().collect::<Vec<_>>().len(),
        2,
        "{:?}",
        pods.keys()
    );
    let (killed, replacement) = (&pods[&first], &pods[&second]);
    assert_eq!(index_of(killed), Some(0));
    assert_eq!(index_of(replacement), Some(0));
    assert_ne!(killed.uid(), replacement.uid());
    assert_eq!(
        killed.status.as_ref().unwrap().phase.as_deref(),
        Some("Failed")
    );
    assert_eq!(
        terminated(killed, "main"),
        (
            137,
            "Error".to_string(),
            Some("sh was killed by signal 9 (SIGKILL)".to_string())
        )
    );
    assert_eq!(
        terminated(replacement, "main"),
        (0, "Completed".to_string(), None)
    );
    assert_eq!(
        on.cmd_lines(&second, "main").await.last().unwrap(),
        "released"
    );
    on.done().await;
}

/// 8. A replaced pod: index 1 of a running 3-pod Indexed Job is deleted (`kubectl
/// delete pod`); the Job controller's replacement gets a new address; in the other two
/// pods the sidecar sees it, moves the files and `trainlet exec --on-peer-change
/// restart` restarts the command exactly once, with the new cluster; every trainer
/// then reaches every peer at the address it was given, the new one included.
#[tokio::test]
async fn a_replaced_pod_restarts_each_peers_command_once_and_the_trainers_reach_its_new_address() {
    let on = require!(On::restricted("replace").await);
    let script = "echo \"start: $TF_CONFIG\"
trainer --source tf --timeout 120 || exit 1
exec sleep 3600";
    let mut plain = plain_job("replace", 3, main_container(&["sh", "-c", script], "64Mi"));
    // The deleted pod's command ends by SIGTERM: a failure the Job counts.
    plain["spec"]["backoffLimit"] = json!(6);
    on.inject_and_apply(&plain, &[], |doc| {
        let command = &mut pod_spec(doc)["containers"][0]["command"];
        let c = command.as_array_mut().unwrap();
        assert_eq!(
            c[..4],
            [
                json!("/etc/trainlet/bin/trainlet"),
                json!("exec"),
                json!("--report"),
                json!("--")
            ]
        );
        for (i, a) in [
            "--on-peer-change",
            "restart",
            "--restart-backoff",
            "1s",
            "--restart-grace",
            "5s",
        ]
        .into_iter()
        .enumerate()
        {
            c.insert(3 + i, json!(a));
        }
    });
    let pods = on.pods();
    // Every pod's trainer done: `oks` "trainer: ok" lines in each pod's log.
    let running = |oks: usize, not: Option<String>| {
        let on = &on;
        async move {
            eventually(
                &format!("3 pods, each with {oks} trainer run(s) ok"),
                JOB_TIMEOUT,
                || {
                    let not = not.clone();
                    async move {
                        let mut live: Vec<Pod> = job_pods(&on.client, &on.ns, "replace")
                            .await
                            .into_iter()
                            .filter(|p| {
                                p.metadata.deletion_timestamp.is_none() && Some(p.name_any()) != not
                            })
                            .collect();
                        live.sort_by_key(index_of);
                        if live.len() != 3 {
                            return None;
                        }
                        for p in &live {
                            let log = on.log(&p.name_any(), "main", false).await;
                            let n = log
                                .lines()
                                .filter(|l| l.starts_with("trainer: ok: "))
                                .count();
                            if n < oks {
                                return None;
                            }
                        }
                        Some(live)
                    }
                },
            )
            .await
        }
    };
    let before = running(1, None).await;
    let old = before[1].name_any();
    let old_ip = ip(&before[1]);
    pods.delete(&old, &DeleteParams::default()).await.unwrap();
    // Pods 0 and 2 ran their trainer twice; the replacement once.
    let after = eventually("the replacement and the restarts", JOB_TIMEOUT, || {
        let (on, old) = (&on, old.clone());
        async move {
            let live = running(1, Some(old.clone())).await;
            for i in [0, 2] {
                let log = on.log(&live[i].name_any(), "main", false).await;
                if log
                    .lines()
                    .filter(|l| l.starts_with("trainer: ok: "))
                    .count()
                    < 2
                {
                    return None;
                }
            }
            Some(live)
        }
    })
    .await;
    let new_ip = ip(&after[1]);
    assert_ne!(after[1].name_any(), old);
    assert_ne!(new_ip, old_ip, "the replacement's address");
    assert_eq!(
        [ip(&after[0]), ip(&after[2])],
        [ip(&before[0]), ip(&before[2])]
    );
    let ips: Vec<String> = after.iter().map(ip).collect();
    let old_ips = [ip(&before[0]), old_ip.clone(), ip(&before[2])];
    let tf = |ips: &[String], i: usize| {
        format!(
            "{{\"cluster\":{{\"worker\":[{}]}},\"task\":{{\"type\":\"worker\",\"index\":{i}}}}}",
            ips.iter()
                .map(|ip| format!("\"{ip}:8470\""))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let mesh = |ips: &[String], i: usize| {
        let peers: Vec<(String, String, String)> = (0..3)
            .filter(|&j| j != i)
            .map(|j| {
                (
                    format!("worker:{j}"),
                    format!("{}:8470", ips[j]),
                    ips[j].clone(),
                )
            })
            .collect();
        let mut v = mesh_lines(&format!("worker:{i}"), &format!("{}:8470", ips[i]), &peers);
        v.sort();
        v
    };
    for (i, p) in after.iter().enumerate() {
        let name = p.name_any();
        let log = on.log(&name, "main", false).await;
        let runs = start_runs(&log);
        let starts = if i == 1 { 1 } else { 2 };
        assert_eq!(
            runs.len(),
            starts,
            "{name}: CMD started {} times:\n{log}",
            runs.len()
        );
        let last = runs.last().unwrap();
        assert_eq!(
            last.lines().next().unwrap(),
            format!("start: {}", tf(&ips, i)),
            "{name}"
        );
        assert_eq!(trainer_lines(last), mesh(&ips, i), "{name}:\n{log}");
        if i != 1 {
            assert_eq!(
                runs[0].lines().next().unwrap(),
                format!("start: {}", tf(&old_ips, i))
            );
            assert_eq!(trainer_lines(&runs[0]), mesh(&old_ips, i), "{name}");
            // The sidecar's own view: one restart, the cluster current again.
            let (_, _, metrics) = http_get(&format!("{}:9464", ips[i]), "/metrics").unwrap();
            assert_eq!(
                crate::report_support::metric(&metrics, "trainlet_restarts_total"),
                Some(1.0),
                "{name}"
            );
            assert_eq!(
                crate::report_support::metric(&metrics, "trainlet_cluster_stale"),
                Some(0.0),
                "{name}"
            );
        }
        let now = pods.get(&name).await.unwrap();
        assert_eq!(
            now.annotations()["trainlet.io/cluster"],
            "current",
            "{name}"
        );
        // In place: the kubelet restarted no container, trainlet-init ran once (not
        // RestartAllContainers, which would run the pod's containers again from its
        // init containers: docs/failure-handling.md says why).
        for c in ["trainlet-init", "trainlet", "main"] {
            assert_eq!(state(&now, c)["restartCount"], 0, "{name}: {c}");
        }
    }
    let job = Api::<Job>::namespaced(on.client.clone(), &on.ns)
        .get("replace")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!((job.failed, job.active), (Some(1), Some(3)), "{job:?}");
    // One restart announced by each peer, none by the replacement.
    let restarting = on.events_of("Restarting").await;
    let mut by: Vec<&str> = restarting.iter().map(|(_, _, p)| p.as_str()).collect();
    by.sort();
    let mut peers = vec![after[0].name_any(), after[2].name_any()];
    peers.sort();
    assert_eq!(by, peers, "{restarting:?}");
    for (t, note, _) in &restarting {
        assert_eq!(t, "Warning");
        assert_eq!(
            note,
            &format!(
                "restarting sh (1 of 3) in 1s: the cluster changed (stale: worker/1 {old_ip} → none)"
            )
        );
    }
    on.done().await;
}

/// 9. `--address dns` with the node's cluster DNS (CoreDNS, tests/node/up): a plain
/// 2-pod Indexed Job through `trainlet inject --address dns`, which gives the pods the
/// Job's name as subdomain and adds the headless Service the names need. The Job is
/// applied first and the Service only once both pods' trainlet-init say they wait for
/// the names (cluster DNS trails the pods; here, until the Service exists): init waits
/// until each peer's name resolves to that peer's pod IP, then writes names. TF_CONFIG
/// names the pods; the trainers resolve the peer's name through the cluster DNS,
/// connect to it there and are reached from the peer's pod IP; the Job completes.
#[tokio::test]
async fn address_dns_waits_for_coredns_and_the_trainers_connect_by_name() {
    let on = require!(On::restricted("dns").await);
    let script = "echo \"start: $TF_CONFIG\"\nexec trainer --source tf --timeout 60";
    let plain = plain_job("dns", 2, main_container(&["sh", "-c", script], "64Mi"));
    let yaml = inject_yaml(&plain, &["--address", "dns"]);
    let items: Vec<Value> = yaml
        .split("\n---\n")
        .map(|doc| as_json(on.kc, doc))
        .collect();
    assert_eq!(
        items
            .iter()
            .map(|d| format!(
                "{}/{}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            ))
            .collect::<Vec<_>>(),
        ["Job/dns", "Service/dns"]
    );
    let (job, service) = (&items[0], &items[1]);
    assert_eq!(pod_spec(&mut job.clone())["subdomain"], "dns");
    assert_eq!(
        (
            &service["spec"]["clusterIP"],
            &service["spec"]["publishNotReadyAddresses"],
            &service["spec"]["selector"]
        ),
        (
            &json!("None"),
            &json!(true),
            &json!({"app.kubernetes.io/name": "dns"})
        )
    );
    let name = |i: usize| format!("dns-{i}.dns.{}.svc.cluster.local", on.ns);

    // The Job alone: both inits wait for the names.
    apply_clean(on.kc, &on.ns, job);
    let waiting = eventually(
        "both pods' trainlet-init waiting for DNS",
        JOB_TIMEOUT,
        || {
            let on = &on;
            async move {
                let pods = job_pods(&on.client, &on.ns, "dns").await;
                if pods.len() != 2
                    || pods
                        .iter()
                        .any(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_none())
                {
                    return None;
                }
                let mut out = Vec::new();
                for p in &pods {
                    let log = on.log(&p.name_any(), "trainlet-init", false).await;
                    let line = log.lines().find(|l| l.contains("waiting for DNS: "))?;
                    out.push((p.clone(), line.to_string()));
                }
                Some(out)
            }
        },
    )
    .await;
    let mut ips = [String::new(), String::new()];
    for (p, _) in &waiting {
        ips[index_of(p).unwrap() as usize] = ip(p);
    }
    for (p, line) in &waiting {
        let (_, said) = line.split_once("waiting for DNS: ").unwrap();
        let nx = "lookup failed: failed to lookup address information: Name or service not known";
        // Its own name is in its /etc/hosts (the kubelet writes it there): the peer's is
        // what it waits for.
        let j = 1 - index_of(p).unwrap() as usize;
        assert_eq!(
            said,
            format!(
                "peer worker/{j} ({}) does not resolve to its pod IP {} yet ({nx})",
                name(j),
                ips[j]
            ),
            "{}",
            p.name_any()
        );
        // Nothing written yet: the training container has not started.
        assert!(
            state(p, "main")["waiting"].is_object(),
            "{}: {}",
            p.name_any(),
            state(p, "main")
        );
    }

    // The Service: the names resolve, init writes them, the trainers meet by name.
    apply_clean(on.kc, &on.ns, service);
    let end = on.job_end("dns").await;
    assert_eq!(
        end,
        (
            "Complete".into(),
            "CompletionsReached".into(),
            "Reached expected number of succeeded pods".into()
        ),
        "{}",
        describe_pods(&on.pods()).await
    );
    let pods = on.only_pods("dns", 2).await;
    assert_eq!(pods.iter().map(ip).collect::<Vec<_>>(), ips);
    for (i, p) in pods.iter().enumerate() {
        let pname = p.name_any();
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            (spec.hostname.as_deref(), spec.subdomain.as_deref()),
            (Some(format!("dns-{i}").as_str()), Some("dns"))
        );
        let init = on.log(&pname, "trainlet-init", false).await;
        assert!(
            init.contains("every peer's DNS name resolves to its pod IP"),
            "{pname}: {init}"
        );
        let lines = on.cmd_lines(&pname, "main").await;
        assert_eq!(
            lines[0],
            format!(
                "start: {{\"cluster\":{{\"worker\":[\"{}:8470\",\"{}:8470\"]}},\"task\":{{\"type\":\"worker\",\"index\":{i}}}}}",
                name(0),
                name(1)
            ),
            "{pname}"
        );
        let j = 1 - i;
        // The trainer prints the address it listens on as resolved (its own name is in
        // its /etc/hosts), and each peer's as it was given.
        let mut want = mesh_lines(
            &format!("worker:{i}"),
            &format!("{}:8470", ips[i]),
            &[(
                format!("worker:{j}"),
                format!("{}:8470", name(j)),
                ips[j].clone(),
            )],
        );
        want.sort();
        assert_eq!(trainer_lines(&lines.join("\n")), want, "{pname}");
        assert_eq!(terminated(p, "main").0, 0);
    }
    on.done().await;
}

/// 10. Kubernetes 1.36+'s `RestartAllContainers` container restart rule (KEP-5532, on by
/// default since 1.36): the training container of pod 0 exits 42, which its rule turns
/// into a restart of the whole pod in place (same pod, address and volumes), init
/// containers first. trainlet-init runs again and resolves the same cluster (TF_CONFIG
/// of both runs alike, the trainers then reach each other), and the restarted sidecar
/// does not repeat the `OOMKill` Event of the first run, whose observation it reads
/// again from the volume. Only on the newest version (not in `make test-k8s-previous`).
#[tokio::test]
async fn restart_all_containers_runs_trainlet_init_again_and_repeats_no_event() {
    let on = require!(On::restricted("restart-all").await);
    // Each run's lines also go to the pod's volume: the kubelet removes the containers of
    // the first run, and their logs with them.
    let script = "echo \"start: $TF_CONFIG\" >>/scratch/log
if [ \"$JOB_COMPLETION_INDEX\" = 0 ] && [ ! -e /scratch/restarted ]; then
  touch /scratch/restarted
  memhog 10 & wait $!; echo \"memhog status $?\" >>/scratch/log
  exit 42
fi
cat /scratch/log
exec trainer --source tf --timeout 180";
    let plain = plain_job(
        "restart-all",
        2,
        main_container(&["sh", "-c", script], "96Mi"),
    );
    on.inject_and_apply(&plain, &[], |doc| {
        let spec = pod_spec(doc);
        spec["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "scratch", "emptyDir": {}}));
        let main = &mut spec["containers"][0];
        assert_eq!(main["name"], "main");
        main["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "scratch", "mountPath": "/scratch"}));
        main["restartPolicy"] = json!("Never");
        main["restartPolicyRules"] = json!([{
            "action": "RestartAllContainers",
            "exitCodes": {"operator": "In", "values": [42]}
        }]);
    });
    let end = on.job_end("restart-all").await;
    assert_eq!(
        (end.0.as_str(), end.1.as_str()),
        ("Complete", "CompletionsReached"),
        "{end:?}: {}",
        describe_pods(&on.pods()).await
    );
    let pods = on.only_pods("restart-all", 2).await;
    let ips: Vec<String> = pods.iter().map(ip).collect();
    let tf = |i: usize| {
        format!(
            "{{\"cluster\":{{\"worker\":[\"{}:8470\",\"{}:8470\"]}},\"task\":{{\"type\":\"worker\",\"index\":{i}}}}}",
            ips[0], ips[1]
        )
    };
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    for (i, name) in names.iter().enumerate() {
        let lines = on.cmd_lines(name, "main").await;
        let log = lines.join("\n");
        let starts: Vec<&String> = lines.iter().filter(|l| l.starts_with("start: ")).collect();
        let want = format!("start: {}", tf(i));
        if i == 0 {
            assert_eq!(
                lines[..3],
                [want.clone(), "memhog status 137".to_string(), want],
                "{name}: {log}"
            );
        } else {
            assert_eq!(starts, [&want], "{name}: {log}");
        }
        let peer = 1 - i;
        let mesh = mesh_lines(
            &format!("worker:{i}"),
            &format!("{}:8470", ips[i]),
            &[(
                format!("worker:{peer}"),
                format!("{}:8470", ips[peer]),
                ips[peer].clone(),
            )],
        );
        let mut got = trainer_lines(&log);
        got.sort();
        let mut want = mesh;
        want.sort();
        assert_eq!(got, want, "{name}: {log}");
    }
    // Pod 0 ran its init container and its sidecar twice; pod 1 once.
    let st = pods[0].status.clone().unwrap();
    let restarted: Vec<(String, bool)> = st
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status == "True"))
        .filter(|(t, _)| t == "AllContainersRestarting")
        .collect();
    assert_eq!(
        restarted,
        [("AllContainersRestarting".to_string(), false)],
        "{st:?}"
    );
    let resolved = on.events_of("PeersResolved").await;
    let by: Vec<&str> = resolved.iter().map(|(_, _, p)| p.as_str()).collect();
    assert_eq!(by, [&names[0], &names[0], &names[1]], "{resolved:?}");
    // One OOM kill, one Event, although the sidecar that published it was restarted.
    let oom = on.events_of("OOMKill").await;
    assert_eq!(oom.len(), 1, "{oom:?}");
    assert_eq!(oom[0].2, names[0]);
    assert_eq!(pods[0].annotations()["trainlet.io/oom-kills"], "1");
    on.done().await;
}
