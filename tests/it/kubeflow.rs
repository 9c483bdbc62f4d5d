//! Kubeflow Trainer's progress endpoint in `trainlet exec`: the real clients from PyPI
//! (the Kubeflow SDK's `update_trainjob_status`, Transformers' `KubeflowCallback` in a
//! tiny Trainer run) report to exec, and exec's reporter publishes what they said to
//! a pod on the real API server (`trainlet.io/progress`, the metrics, `trainlet
//! status`); bad requests get Trainer's answers, a burst is refused, and exec runs on.
//! The command prints no progress line (`--progress-pattern` matches nothing), so
//! whatever progress exec sees is the reports'.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::frameworks::fixture;
use crate::report_support::{Reporter, annotations, metric};
use crate::support::*;

/// One played pod running `trainlet exec --report --stall-after 60s` around
/// `kubeflow_progress.py WHAT`.
struct Run {
    ns: String,
    exec: Reporter,
    /// The shipped layout's sidecar, which publishes what exec hands over.
    sidecar: Option<Reporter>,
    out: PathBuf,
    release: PathBuf,
    _dir: tempfile::TempDir,
}

async fn start(what: &str) -> Result<Run, Missing> {
    start_in(what, false).await
}

/// With `handover`, as `inject --wrap` lays the pod out: exec without credentials
/// hands its observations to a sidecar, the pod's only writer.
async fn start_in(what: &str, handover: bool) -> Result<Run, Missing> {
    let py = framework_python()?;
    let client = admin().await;
    let ns = namespace(&client, "kubeflow").await;
    pod("kf-0").labels("app=kf").create(&client, &ns).await;
    Kubelet::new(&client, &ns).run("kf-0", "127.0.0.1").await;
    let dir = tempfile::tempdir().unwrap();
    write_tf_config(dir.path(), free_port());
    let (out, release) = (dir.path().join("seen.json"), dir.path().join("release"));
    let script = fixture("kubeflow_progress.py");
    let observed = dir.path().join("observed");
    std::fs::create_dir(&observed).unwrap();
    let observed = observed.to_str().unwrap().to_string();
    let mut flags = vec![
        "--stall-after",
        "60s",
        "--progress-pattern",
        "^no line is progress$",
    ];
    if handover {
        flags.extend(["--observations", &observed]);
    }
    let py = py.to_str().unwrap();
    let (out_s, release_s) = (out.to_str().unwrap(), release.to_str().unwrap());
    flags.extend(["--", py, &script, what, out_s, release_s]);
    let exec = exec_cmd(kubeconfig(), &ns, "kf-0", dir.path(), &flags);
    let sidecar = handover.then(|| {
        Reporter::start(sidecar_cmd(
            kubeconfig(),
            &ns,
            "kf-0",
            &["--observations", &observed],
        ))
    });
    Ok(Run {
        ns,
        exec: Reporter::start(exec),
        sidecar,
        out,
        release,
        _dir: dir,
    })
}

impl Run {
    /// What the script saw, once it wrote it (the Transformers run takes a while); an
    /// exec that ended before fails the test with its log (CMD's traceback).
    async fn seen(&mut self) -> Value {
        let out = self.out.clone();
        self.written(&out).await
    }

    /// What the script wrote at its checkpoint `name`; it waits for [`Run::resume`].
    async fn checkpoint(&mut self, name: &str) -> Value {
        let out = self.out.with_extension(format!("json.{name}"));
        self.written(&out).await
    }

    /// Lets the script go on from its checkpoint `name`.
    fn resume(&self, name: &str) {
        let release = self.release.with_extension(name);
        std::fs::write(release, "").unwrap();
    }

    async fn written(&mut self, path: &Path) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(240);
        loop {
            if let Some(v) = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
            {
                return v;
            }
            assert!(
                self.exec.alive(),
                "exec ended before the script wrote {}:\n{}",
                path.display(),
                self.exec.stderr()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after 240s waiting for {}",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// exec's metrics once `done` says they are the ones awaited.
    async fn metrics(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        eventually(what, Duration::from_secs(60), || async {
            let body = self.exec.metrics().await;
            done(&body).then_some(body)
        })
        .await
    }

    /// `trainlet.io/progress` once `done` says it is the one awaited.
    async fn progress(&self, done: impl Fn(&Value) -> bool) -> Value {
        let client = admin().await;
        eventually("trainlet.io/progress", Duration::from_secs(60), || async {
            let a = annotations(&client, &self.ns, "kf-0").await;
            let v: Value = serde_json::from_str(a.get("trainlet.io/progress")?).ok()?;
            done(&v).then_some(v)
        })
        .await
    }

    /// Lets the script end; exec ends with it (and the sidecar is stopped).
    fn finish(mut self) -> String {
        std::fs::write(&self.release, "").unwrap();
        let (code, _) = self.exec.wait(Duration::from_secs(60));
        let log = self.exec.stderr();
        assert_eq!(code, 0, "{log}");
        assert!(!log.contains("panicked"), "{log}");
        log
    }
}

/// The three variables exec gave the command: its own endpoint on loopback for this
/// pod, and a token file only its owner reads.
fn assert_env(seen: &Value, ns: &str) {
    let env = &seen["env"];
    let url = env["KUBEFLOW_TRAINER_SERVER_URL"].as_str().unwrap();
    let rest = url.strip_prefix("https://127.0.0.1:").unwrap();
    let (port, path) = rest.split_once('/').unwrap();
    assert!(port.parse::<u16>().is_ok(), "{url}");
    assert_eq!(
        path,
        format!("apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/kf-0/status")
    );
    let token = Path::new(env["KUBEFLOW_TRAINER_SERVER_TOKEN"].as_str().unwrap());
    let ca = Path::new(env["KUBEFLOW_TRAINER_SERVER_CA_CERT"].as_str().unwrap());
    assert_eq!(token.file_name().unwrap(), "kubeflow-token");
    assert_eq!(ca.parent(), token.parent());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(token), mode(token.parent().unwrap())), (0o600, 0o700));
    assert_eq!(std::fs::read_to_string(token).unwrap().len(), 43);
}

/// The SDK's call is accepted; it is progress (the command printed nothing, yet it is
/// not `silent`), its `current_step` the step; the annotation, the metrics and
/// `trainlet status` show percentage, time remaining and metrics.
#[tokio::test]
async fn the_kubeflow_sdks_report_is_progress_and_published() {
    let mut run = require!(start("sdk").await);
    let seen = run.seen().await;
    assert_eq!(seen["ok"], true, "{seen}");
    assert_env(&seen, &run.ns);
    let p = run.progress(|v| v["percent"] == 40).await;
    let at = p["at"].as_str().unwrap().to_string();
    assert_eq!(
        p,
        json!({
            "at": at,
            "step": 120.0,
            "stalled": false,
            "stalls": 0,
            "percent": 40,
            "eta_seconds": 795,
            "metrics": [
                {"name": "loss", "value": "0.25"},
                {"name": "current_step", "value": "120"}
            ]
        })
    );
    let body = run.exec.metrics().await;
    let series = |s: &str| metric(&body, s).unwrap_or_else(|| panic!("no {s} in\n{body}"));
    assert_eq!(
        [
            series("trainlet_reported_progress_percent{container=\"trainer\"}"),
            series("trainlet_reported_remaining_seconds{container=\"trainer\"}"),
            series("trainlet_reported_metric{container=\"trainer\",name=\"loss\"}"),
            series("trainlet_reported_metric{container=\"trainer\",name=\"current_step\"}"),
            series("trainlet_progress_step{container=\"trainer\"}"),
        ],
        [40.0, 795.0, 0.25, 120.0, 120.0]
    );
    let r = crate::support::run(
        trainlet()
            .args([
                "status",
                "-l",
                "app=kf",
                "-o",
                "json",
                "-n",
                &run.ns,
                "--kubeconfig",
            ])
            .arg(kubeconfig()),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let today = k8s_openapi::jiff::Timestamp::now().to_string();
    let (date, time) = at.split_once('T').unwrap();
    let clock = if today.starts_with(date) {
        time.to_string()
    } else {
        format!("{date} {time}")
    };
    assert_eq!(
        (&v["pods"][0]["progress"], &v["pods"][0]["eta"]),
        (
            &json!(format!("40%, step 120 at {clock}")),
            &json!("13m15s")
        )
    );
    run.finish();
}

/// Transformers adds its `KubeflowCallback` because exec set the URL; the Trainer's
/// first and last reports reach exec, and the last one stands: 100%, nothing remaining,
/// the run's metrics.
#[tokio::test]
async fn the_transformers_callback_reports_a_tiny_training_run() {
    let mut run = require!(start("transformers").await);
    let seen = run.seen().await;
    assert_env(&seen, &run.ns);
    assert_eq!(
        (&seen["report_to"], &seen["steps"]),
        (&json!(["kubeflow"]), &json!(16)),
        "{seen}"
    );
    assert!(
        seen["callbacks"]
            .as_array()
            .unwrap()
            .contains(&json!("KubeflowCallback")),
        "{seen}"
    );
    let p = run.progress(|v| v["percent"] == 100).await;
    assert_eq!(
        (&p["eta_seconds"], &p["stalled"]),
        (&json!(0), &json!(false))
    );
    assert_eq!(p.get("silent"), None, "{p}");
    let names: Vec<&str> = p["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "loss",
            "grad_norm",
            "learning_rate",
            "epoch",
            "train_runtime",
            "train_samples_per_second",
            "train_steps_per_second",
            "total_flos",
            "train_loss"
        ],
        "{p}"
    );
    run.finish();
}

const STATUS_403: &str = "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Forbidden\",\"reason\":\"Forbidden\",\"code\":403}\n";
const STATUS_404: &str = "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Not found\",\"reason\":\"NotFound\",\"code\":404}\n";
const STATUS_422: &str = "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Invalid payload\",\"reason\":\"Invalid\",\"code\":422}\n";
const STATUS_429: &str = "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Too many requests: one report per second is enough\",\"reason\":\"TooManyRequests\",\"code\":429}\n";

/// Bad requests get Trainer's answers and change nothing; a burst past the rate is
/// refused; a report after it is accepted; exec never fails.
#[tokio::test]
async fn bad_reports_get_trainers_answers_and_a_burst_is_refused() {
    let mut run = require!(start("bad").await);
    let seen = run.seen().await;
    let answer = |k: &str| (seen[k][0].as_u64().unwrap(), seen[k][1].as_str().unwrap());
    assert_eq!(answer("token"), (403, STATUS_403));
    assert_eq!(answer("route"), (404, STATUS_404));
    assert_eq!(answer("get"), (404, STATUS_404));
    assert_eq!(answer("float"), (422, STATUS_422));
    assert_eq!(
        answer("range"),
        (
            422,
            "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"TrainJob.trainer.kubeflow.org \\\"kf-0\\\" is invalid: status.trainerStatus.progressPercentage: Invalid value: 101: status.trainerStatus.progressPercentage in body should be less than or equal to 100\",\"reason\":\"Invalid\",\"code\":422}\n"
        )
    );
    assert_eq!(
        answer("declared"),
        (
            413,
            "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Payload too large\",\"reason\":\"RequestEntityTooLarge\",\"code\":413}\n"
        )
    );
    assert_eq!(answer("chunked"), (422, STATUS_422));
    assert_eq!(
        answer("good"),
        (
            200,
            "{\"trainerStatus\":{\"progressPercentage\":7,\"lastUpdatedTime\":\"2026-11-26T10:25:35Z\"}}\n"
        )
    );
    // 20 at once: of the burst of 10, the 4 above with the token and a body took 4
    // (a wrong token, a wrong route and a declared size past the bound spend none),
    // and one a second came back since the first request; the rest is refused.
    let burst: Vec<(u64, &str)> = seen["burst"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a[0].as_u64().unwrap(), a[1].as_str().unwrap()))
        .collect();
    let elapsed = seen["elapsed"].as_f64().unwrap();
    let passed = burst.iter().filter(|a| a.0 == 200).count();
    assert!(
        passed as f64 <= 6.0 + elapsed.ceil() && passed < 20,
        "{passed} passed in {elapsed}s: {burst:?}"
    );
    for a in &burst {
        assert!(
            *a == (429, STATUS_429)
                || *a
                    == (
                        200,
                        "{\"trainerStatus\":{\"lastUpdatedTime\":\"2026-11-26T10:25:35Z\"}}\n"
                    ),
            "{a:?}"
        );
    }
    assert_eq!(
        answer("again"),
        (
            200,
            "{\"trainerStatus\":{\"progressPercentage\":9,\"metrics\":[{\"name\":\"step\",\"value\":\"12\"}],\"lastUpdatedTime\":\"2026-11-26T10:25:35Z\"}}\n"
        )
    );
    // The last accepted report stands; none of the refused ones left a trace.
    let p = run.progress(|v| v["percent"] == 9).await;
    assert_eq!(
        (&p["step"], &p["metrics"], p.get("eta_seconds")),
        (
            &json!(12.0),
            &json!([{"name": "step", "value": "12"}]),
            None
        )
    );
    run.finish();
}

/// As `inject --wrap` lays the pod out: exec, without credentials, hands the report over
/// and the sidecar publishes it (the annotation and its own metrics).
#[tokio::test]
async fn in_the_shipped_layout_the_sidecar_publishes_the_report() {
    let mut run = require!(start_in("sdk", true).await);
    let seen = run.seen().await;
    assert_eq!(seen["ok"], true, "{seen}");
    let p = run.progress(|v| v["percent"] == 40).await;
    assert_eq!(
        (&p["step"], &p["eta_seconds"], &p["metrics"]),
        (
            &json!(120.0),
            &json!(795),
            &json!([
                {"name": "loss", "value": "0.25"},
                {"name": "current_step", "value": "120"}
            ])
        )
    );
    let sidecar = run.sidecar.as_ref().unwrap();
    let body = sidecar.metrics().await;
    assert_eq!(
        metric(
            &body,
            "trainlet_reported_progress_percent{container=\"trainer\"}"
        ),
        Some(40.0),
        "{body}"
    );
    assert!(
        run.exec
            .stderr()
            .contains("handing observations to the trainlet sidecar"),
        "{}",
        run.exec.stderr()
    );
    run.finish();
}

/// The echo of an accepted report of `status`'s fields, at the fixture's time.
fn echoed(fields: &str) -> String {
    format!("{{\"trainerStatus\":{{{fields}\"lastUpdatedTime\":\"2026-11-26T10:25:35Z\"}}}}\n")
}

/// A wrong token spends none of the rate: after 30 of them a report is accepted. Idle
/// connections, past the endpoint's 64 places and however many, do not hold a report
/// up: it is answered within a second (asserted within 2 s, for a loaded host), by
/// http.client and by the Kubeflow SDK, whose timeout is 5 s; and every idle one is
/// closed by the server.
#[tokio::test]
async fn wrong_tokens_and_idle_connections_do_not_keep_a_report_out() {
    let mut run = require!(start("flood").await);
    let seen = run.seen().await;
    let code_and_body = |v: &Value| (v[0].as_u64().unwrap_or(0), v[1].to_string());
    let (http, http_secs) = (
        &seen["idle_http"][0],
        seen["idle_http"][1].as_f64().unwrap(),
    );
    let (sdk, sdk_secs) = (&seen["idle_sdk"][0], seen["idle_sdk"][1].as_f64().unwrap());
    assert_eq!(
        (
            &seen["bad_tokens"],
            code_and_body(&seen["after_bad_tokens"]),
            code_and_body(http),
            sdk,
            &seen["idle_tls"],
        ),
        (
            &json!(vec![403; 30]),
            (200, json!(echoed("\"progressPercentage\":3,")).to_string()),
            (200, json!(echoed("\"progressPercentage\":5,")).to_string()),
            &json!(true),
            &json!(20),
        ),
        "{seen}"
    );
    assert!(http_secs < 2.0 && sdk_secs < 2.0, "{seen}");
    assert_eq!(seen["idle_closed"], 80, "{seen}");
    let p = run.progress(|v| v["percent"] == 6).await;
    assert_eq!(p["stalled"], false, "{p}");
    run.finish();
}

/// The series a report sets last: once it has a report's value, so have the others.
const CURRENT_STEP: &str = "reported_metric{container=\"trainer\",name=\"current_step\"}";

/// Each report replaces the one before, in /metrics too: the time remaining and a
/// metric the later report omits have no series any more. A `current_step` of 12.5
/// is kept as a metric and is no step; the last second of 9999 is a time.
#[tokio::test]
async fn a_report_replaces_the_one_before_and_a_step_is_a_whole_number() {
    let mut run = require!(start("replace").await);
    let first = run.checkpoint("a").await;
    assert_eq!(first["first"][0], 200, "{first}");
    let series = |body: &str, s: &str| metric(body, &format!("trainlet_{s}"));
    let body = run
        .metrics("the first report's series", |b| {
            series(b, CURRENT_STEP) == Some(12.0)
        })
        .await;
    let first_series = [
        "reported_progress_percent{container=\"trainer\"}",
        "reported_remaining_seconds{container=\"trainer\"}",
        "reported_metric{container=\"trainer\",name=\"loss\"}",
        "reported_metric{container=\"trainer\",name=\"acc\"}",
        "reported_metric{container=\"trainer\",name=\"current_step\"}",
        "progress_step{container=\"trainer\"}",
    ];
    assert_eq!(
        first_series.map(|s| series(&body, s)),
        [
            Some(40.0),
            Some(795.0),
            Some(0.25),
            Some(0.5),
            Some(12.0),
            Some(12.0)
        ],
        "{body}"
    );
    run.resume("a");
    let seen = run.seen().await;
    let body = run
        .metrics("the later report's series", |b| {
            series(b, CURRENT_STEP) == Some(12.5)
        })
        .await;
    assert_eq!(
        first_series.map(|s| series(&body, s)),
        [Some(50.0), None, None, Some(0.75), Some(12.5), Some(12.0)],
        "{body}"
    );
    let p = run.progress(|v| v["percent"] == 50).await;
    assert_eq!(
        (&p["step"], &p["metrics"], p.get("eta_seconds")),
        (
            &json!(12.0),
            &json!([
                {"name": "acc", "value": "0.75"},
                {"name": "current_step", "value": "12.5"}
            ]),
            None
        ),
        "{p}"
    );
    let later = "\"progressPercentage\":50,\"metrics\":[{\"name\":\"acc\",\"value\":\"0.75\"},{\"name\":\"current_step\",\"value\":\"12.5\"}],";
    assert_eq!(
        (&seen["later"], &seen["last"]),
        (
            &json!([200, echoed(later)]),
            &json!([
                200,
                echoed(later).replace("2026-11-26T10:25:35Z", "9999-12-31T23:59:59Z")
            ])
        ),
        "{seen}"
    );
    run.finish();
}
