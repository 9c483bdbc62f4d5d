//! What the endpoint answers, as Trainer's status server does: the same checks in the
//! same order (size, route, token, JSON, the CRD's validation), the same codes, and
//! errors as a Kubernetes `Status`. Two additions: a caller over the rate gets 429
//! (Trainer queues instead, behind its API client's throttle), and trainlet's own
//! bounds ([`bounds`]) refuse a time remaining past ten years and unprintable metrics.
//! Pure: a request in, an answer and the accepted status out; [`admit`] (route and
//! token) apart from [`decode`] (the body), so that the server spends the rate and
//! reads a body only for a caller with the token.

use serde::{Deserialize, Serialize};

use super::bounds::{self, MAX_METRICS};

/// The largest body, as Trainer's `maxBodySize`.
pub const MAX_BODY: usize = 1 << 16;

/// `/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status`.
pub fn status_path(namespace: &str, name: &str) -> String {
    format!("/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status")
}

/// One request, as the server read it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub authorization: Option<&'a [u8]>,
    pub body: &'a [u8],
}

/// What the endpoint serves: its one path and the token it accepts.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub path: String,
    pub name: String,
    pub token: String,
}

/// An HTTP answer: its code and its JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub code: u16,
    pub body: String,
}

/// A report, as accepted.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainerStatus {
    pub percent: Option<u8>,
    pub eta_seconds: Option<u32>,
    /// In the order sent.
    pub metrics: Vec<(String, String)>,
    /// `lastUpdatedTime`, in UTC to the second, as Trainer stores it.
    pub updated: String,
}

impl TrainerStatus {
    /// The step the report gives: a metric `current_step` (Transformers' callback) or
    /// `step`, when it is a step: a count, so a whole number from 0 to 2^53
    /// ([`crate::stall::progress::step`]); `12.5` stays a metric, and is no step.
    pub fn step(&self) -> Option<f64> {
        ["current_step", "step"].iter().find_map(|n| {
            self.metrics
                .iter()
                .find(|(name, _)| name == n)
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
                .filter(|v| v.fract() == 0.0)
                .and_then(crate::stall::progress::step)
        })
    }
}

/// The answer to an `update`, and the report when it was accepted (`None` inside:
/// an empty body `{}`, which Trainer accepts and changes nothing with).
pub fn answer(e: &Endpoint, r: &Request) -> (Answer, Option<Option<TrainerStatus>>) {
    match admit(e, r.method, r.path, r.authorization) {
        Ok(()) => decode(e, r.body),
        Err(refused) => (refused, None),
    }
}

/// The route and the token, from the request's head alone: 404 or 403, as Trainer.
pub fn admit(
    e: &Endpoint,
    method: &str,
    path: &str,
    authorization: Option<&[u8]>,
) -> Result<(), Answer> {
    if method != "POST" || path != e.path {
        return Err(failure(404, "NotFound", "Not found"));
    }
    if !authorized(authorization, &e.token) {
        return Err(failure(403, "Forbidden", "Forbidden"));
    }
    Ok(())
}

/// The body of an admitted request: 422 for what is no report or out of bounds, else
/// 200 and the report back.
pub fn decode(e: &Endpoint, body: &[u8]) -> (Answer, Option<Option<TrainerStatus>>) {
    let Ok(wire) = serde_json::from_slice::<Wire>(body) else {
        return (invalid_payload(), None);
    };
    let Some(s) = wire.trainer_status else {
        return (ok("{}".to_string()), Some(None));
    };
    let updated = match s.last_updated_time.as_deref().map(parse_time) {
        Some(Some(t)) => Some(t),
        Some(None) => return (invalid_payload(), None),
        None => None,
    };
    if let Err(why) = validate(&s, updated.is_some()) {
        let message = format!(
            "TrainJob.trainer.kubeflow.org {:?} is invalid: {why}",
            e.name
        );
        return (failure(422, "Invalid", &message), None);
    }
    let status = TrainerStatus {
        percent: s.progress_percentage.map(|p| p as u8),
        eta_seconds: s.estimated_remaining_seconds.map(|s| s as u32),
        metrics: s
            .metrics
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.name.unwrap_or_default(), m.value.unwrap_or_default()))
            .collect(),
        updated: updated.unwrap_or_default(),
    };
    (ok(echo(&status)), Some(Some(status)))
}

/// A body over [`MAX_BODY`] by its Content-Length.
pub fn too_large() -> Answer {
    failure(413, "RequestEntityTooLarge", "Payload too large")
}

/// A body that turned out longer than [`MAX_BODY`] while it was read.
pub fn invalid_payload() -> Answer {
    failure(422, "Invalid", "Invalid payload")
}

/// Over the rate: trainlet's, not Trainer's.
pub fn too_many() -> Answer {
    failure(
        429,
        "TooManyRequests",
        "Too many requests: one report per second is enough",
    )
}

/// `Authorization: Bearer <token>`: "Bearer" in any case, as Trainer (v2.3 on)
/// accepts it; the token compared in constant time.
fn authorized(header: Option<&[u8]>, token: &str) -> bool {
    let Some(text) = header.and_then(|h| std::str::from_utf8(h).ok()) else {
        return false;
    };
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [scheme, given] = parts[..] else {
        return false;
    };
    scheme.eq_ignore_ascii_case("Bearer") && same(given.as_bytes(), token.as_bytes())
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The body as Trainer's Go types decode it: integers must be JSON integers that fit
/// an int32, metric values strings; unknown fields are ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    trainer_status: Option<WireStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStatus {
    progress_percentage: Option<i32>,
    estimated_remaining_seconds: Option<i32>,
    metrics: Option<Vec<WireMetric>>,
    last_updated_time: Option<String>,
}

#[derive(Deserialize)]
struct WireMetric {
    name: Option<String>,
    value: Option<String>,
}

/// RFC 3339, any offset, to UTC seconds; `None` when it is no such time. Up to
/// `9999-12-31T23:59:59Z`, which Trainer's CRD takes (a civil time: jiff's `Timestamp`
/// ends a day earlier, to leave room for any offset); a time whose UTC is past 9999
/// is none.
fn parse_time(text: &str) -> Option<String> {
    use k8s_openapi::jiff::{SignedDuration, fmt::temporal::Pieces};
    let p = Pieces::parse(text).ok()?;
    let (time, offset) = (p.time()?, p.to_numeric_offset()?);
    let utc = p
        .date()
        .to_datetime(time)
        .checked_sub(SignedDuration::from_secs(i64::from(offset.seconds())))
        .ok()?;
    (0..=9999)
        .contains(&utc.year())
        .then(|| utc.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// The CRD's rules, in its words, and trainlet's bounds ([`bounds::check`]); then
/// the time the CRD requires.
fn validate(s: &WireStatus, has_time: bool) -> Result<(), String> {
    let metrics: Vec<(&str, &str)> = s
        .metrics
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m.name.as_deref().unwrap_or_default(),
                m.value.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    let report = bounds::Report {
        percent: s.progress_percentage.map(i64::from),
        eta_seconds: s.estimated_remaining_seconds.map(i64::from),
        metrics: &metrics,
    };
    bounds::check(&bounds::WIRE, &report, MAX_METRICS).map_err(|e| e.to_string())?;
    if !has_time {
        return Err(format!(
            "{}: Invalid value: \"object\": lastUpdatedTime is required when trainerStatus is present",
            "status.trainerStatus"
        ));
    }
    Ok(())
}

fn ok(body: String) -> Answer {
    Answer { code: 200, body }
}

/// A Kubernetes `Status`, as apimachinery writes it.
fn failure(code: u16, reason: &str, message: &str) -> Answer {
    #[derive(Serialize)]
    struct Status<'a> {
        metadata: serde_json::Map<String, serde_json::Value>,
        status: &'a str,
        message: &'a str,
        reason: &'a str,
        code: u16,
    }
    let body = serde_json::to_string(&Status {
        metadata: serde_json::Map::new(),
        status: "Failure",
        message,
        reason,
        code,
    })
    .unwrap_or_default();
    Answer {
        code,
        body: body + "\n",
    }
}

/// The accepted report, as Trainer echoes it.
fn echo(s: &TrainerStatus) -> String {
    let mut o = serde_json::Map::new();
    if let Some(p) = s.percent {
        o.insert("progressPercentage".into(), p.into());
    }
    if let Some(e) = s.eta_seconds {
        o.insert("estimatedRemainingSeconds".into(), e.into());
    }
    if !s.metrics.is_empty() {
        let list = s
            .metrics
            .iter()
            .map(|(n, v)| serde_json::json!({"name": n, "value": v}))
            .collect();
        o.insert("metrics".into(), serde_json::Value::Array(list));
    }
    o.insert("lastUpdatedTime".into(), s.updated.clone().into());
    serde_json::json!({ "trainerStatus": o }).to_string() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            path: status_path("ml", "job"),
            name: "job".into(),
            token: "s3cret".into(),
        }
    }

    fn post(body: &str) -> (Answer, Option<Option<TrainerStatus>>) {
        let e = endpoint();
        answer(
            &e,
            &Request {
                method: "POST",
                path: &e.path,
                authorization: Some(b"Bearer s3cret"),
                body: body.as_bytes(),
            },
        )
    }

    #[test]
    fn a_report_is_accepted_and_echoed_in_utc_seconds() {
        let (a, s) = post(
            r#"{"trainerStatus":{"lastUpdatedTime":"2026-11-26T10:25:35.366367+01:00","progressPercentage":45,"estimatedRemainingSeconds":795,"metrics":[{"name":"loss","value":"0.23"},{"name":"current_step","value":"9"}],"extra":1}}"#,
        );
        assert_eq!(a.code, 200);
        assert_eq!(
            a.body,
            "{\"trainerStatus\":{\"progressPercentage\":45,\"estimatedRemainingSeconds\":795,\"metrics\":[{\"name\":\"loss\",\"value\":\"0.23\"},{\"name\":\"current_step\",\"value\":\"9\"}],\"lastUpdatedTime\":\"2026-11-26T09:25:35Z\"}}\n"
        );
        let s = s.unwrap().unwrap();
        assert_eq!(
            (s.percent, s.eta_seconds, s.step()),
            (Some(45), Some(795), Some(9.0))
        );
    }

    #[test]
    fn an_empty_report_is_accepted_and_changes_nothing() {
        assert_eq!(post("{}"), (ok("{}".into()), Some(None)));
    }

    #[test]
    fn wrong_types_are_an_invalid_payload() {
        for body in [
            "",
            "not json",
            r#"{"trainerStatus":{"progressPercentage":45.5,"lastUpdatedTime":"2026-11-26T10:25:35Z"}}"#,
            r#"{"trainerStatus":{"progressPercentage":"45","lastUpdatedTime":"2026-11-26T10:25:35Z"}}"#,
            r#"{"trainerStatus":{"estimatedRemainingSeconds":3000000000,"lastUpdatedTime":"2026-11-26T10:25:35Z"}}"#,
            r#"{"trainerStatus":{"metrics":[{"name":"loss","value":0.2}],"lastUpdatedTime":"2026-11-26T10:25:35Z"}}"#,
            r#"{"trainerStatus":{"lastUpdatedTime":"yesterday"}}"#,
            r#"[1,2]"#,
        ] {
            let (a, s) = post(body);
            assert_eq!(
                a.body,
                "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Invalid payload\",\"reason\":\"Invalid\",\"code\":422}\n",
                "{body}"
            );
            assert_eq!((a.code, s), (422, None), "{body}");
        }
    }

    #[test]
    fn the_crd_rules_are_refused_in_the_api_servers_words() {
        let t = r#""lastUpdatedTime":"2026-11-26T10:25:35Z""#;
        let long = "x".repeat(65);
        let many: Vec<String> = (0..257)
            .map(|i| format!(r#"{{"name":"m{i}","value":"1"}}"#))
            .collect();
        let cases = [
            (
                format!(r#"{{"trainerStatus":{{"progressPercentage":101,{t}}}}}"#),
                "status.trainerStatus.progressPercentage: Invalid value: 101: status.trainerStatus.progressPercentage in body should be less than or equal to 100",
            ),
            (
                format!(r#"{{"trainerStatus":{{"estimatedRemainingSeconds":-1,{t}}}}}"#),
                "status.trainerStatus.estimatedRemainingSeconds: Invalid value: -1: status.trainerStatus.estimatedRemainingSeconds in body should be greater than or equal to 0",
            ),
            (
                format!(
                    r#"{{"trainerStatus":{{"metrics":[{{"name":"{long}","value":"1"}}],{t}}}}}"#
                ),
                "status.trainerStatus.metrics[0].name: Too long: may not be more than 64 bytes",
            ),
            (
                format!(r#"{{"trainerStatus":{{"metrics":[{{"name":"loss","value":""}}],{t}}}}}"#),
                "status.trainerStatus.metrics[0].value: Invalid value: \"\": status.trainerStatus.metrics[0].value in body should be at least 1 chars long",
            ),
            (
                format!(
                    r#"{{"trainerStatus":{{"metrics":[{}],{t}}}}}"#,
                    many.join(",")
                ),
                "status.trainerStatus.metrics: Too many: 257: must have at most 256 items",
            ),
            (
                r#"{"trainerStatus":{"progressPercentage":1}}"#.to_string(),
                "status.trainerStatus: Invalid value: \"object\": lastUpdatedTime is required when trainerStatus is present",
            ),
        ];
        for (body, why) in cases {
            let (a, s) = post(&body);
            assert_eq!((a.code, s), (422, None), "{body}");
            let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
            assert_eq!(v["reason"], "Invalid");
            assert_eq!(
                v["message"],
                format!("TrainJob.trainer.kubeflow.org \"job\" is invalid: {why}")
            );
        }
    }

    #[test]
    fn a_wrong_route_is_not_found_and_a_wrong_token_forbidden() {
        let e = endpoint();
        let req = |method, path: &str, auth: Option<&'static [u8]>| {
            answer(
                &e,
                &Request {
                    method,
                    path,
                    authorization: auth,
                    body: b"{}",
                },
            )
            .0
        };
        let good: Option<&[u8]> = Some(b"Bearer s3cret");
        assert_eq!(req("GET", &e.path, good).code, 404);
        assert_eq!(req("POST", &format!("{}/", e.path), good).code, 404);
        assert_eq!(
            req("POST", &status_path("other", "job"), good).body,
            "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Not found\",\"reason\":\"NotFound\",\"code\":404}\n"
        );
        for auth in [
            None,
            Some(&b"Bearer s3cre"[..]),
            Some(&b"Bearer s3cretX"[..]),
            Some(&b"Basic s3cret"[..]),
            Some(&b"s3cret"[..]),
            Some(&b"Bearer s3cret extra"[..]),
        ] {
            let a = req("POST", &e.path, auth);
            assert_eq!(
                a.body,
                "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Forbidden\",\"reason\":\"Forbidden\",\"code\":403}\n",
                "{auth:?}"
            );
        }
        assert_eq!(req("POST", &e.path, Some(b"bearer  s3cret")).code, 200);
    }

    #[test]
    fn the_step_is_current_step_or_step_when_a_number() {
        let s = |m: &[(&str, &str)]| TrainerStatus {
            metrics: m
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            ..TrainerStatus::default()
        };
        assert_eq!(s(&[("step", "7"), ("current_step", "9")]).step(), Some(9.0));
        assert_eq!(s(&[("step", "7")]).step(), Some(7.0));
        assert_eq!(
            s(&[("current_step", "nine"), ("step", "7")]).step(),
            Some(7.0)
        );
        assert_eq!(s(&[("loss", "0.1")]).step(), None);
    }

    /// A step is a count: `12.5`, a negative number or one past 2^53 is a metric only.
    #[test]
    fn a_step_is_a_whole_number() {
        let s = |v: &str| TrainerStatus {
            metrics: vec![("current_step".into(), v.into())],
            ..TrainerStatus::default()
        };
        assert_eq!(s("12.5").step(), None);
        assert_eq!(s("-3").step(), None);
        assert_eq!(s("1e300").step(), None);
        assert_eq!(s("NaN").step(), None);
        assert_eq!(s("12").step(), Some(12.0));
        assert_eq!(s(" 12.0 ").step(), Some(12.0));
        let half = TrainerStatus {
            metrics: vec![
                ("current_step".into(), "12.5".into()),
                ("step".into(), "7".into()),
            ],
            ..TrainerStatus::default()
        };
        assert_eq!(half.step(), Some(7.0));
        let (a, kept) = post(
            r#"{"trainerStatus":{"metrics":[{"name":"current_step","value":"12.5"}],"lastUpdatedTime":"2026-11-26T10:25:35Z"}}"#,
        );
        let kept = kept.unwrap().unwrap();
        assert_eq!(
            (a.code, kept.step(), kept.metrics),
            (200, None, vec![("current_step".into(), "12.5".into())])
        );
    }

    /// The CRD takes any time to the end of 9999, as the API server writes it.
    #[test]
    fn the_last_second_of_9999_is_a_time() {
        for (sent, echoed) in [
            ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"),
            ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59Z"),
            ("9999-12-31T23:59:59+01:00", "9999-12-31T22:59:59Z"),
            ("1969-07-20T20:17:40Z", "1969-07-20T20:17:40Z"),
            ("2026-11-26t10:25:35-00:00", "2026-11-26T10:25:35Z"),
        ] {
            let (a, s) = post(&format!(
                r#"{{"trainerStatus":{{"lastUpdatedTime":"{sent}"}}}}"#
            ));
            assert_eq!(
                a.body,
                format!("{{\"trainerStatus\":{{\"lastUpdatedTime\":\"{echoed}\"}}}}\n"),
                "{sent}"
            );
            assert_eq!(s.unwrap().unwrap().updated, echoed);
        }
        for past in [
            "9999-12-31T23:59:59-00:01",
            "10000-01-01T00:00:00Z",
            "2026-11-26T10:25:35",
            "2026-11-26",
        ] {
            let (a, s) = post(&format!(
                r#"{{"trainerStatus":{{"lastUpdatedTime":"{past}"}}}}"#
            ));
            assert_eq!((a, s), (invalid_payload(), None), "{past}");
        }
    }

    /// trainlet's own bounds, beyond the CRD's: refused as the CRD's are.
    #[test]
    fn a_time_remaining_past_ten_years_and_unprintable_metrics_are_refused() {
        let t = r#""lastUpdatedTime":"2026-11-26T10:25:35Z""#;
        for (body, why) in [
            (
                format!(r#"{{"trainerStatus":{{"estimatedRemainingSeconds":315360001,{t}}}}}"#),
                "status.trainerStatus.estimatedRemainingSeconds: Invalid value: 315360001: status.trainerStatus.estimatedRemainingSeconds in body should be less than or equal to 315360000",
            ),
            (
                format!(
                    r#"{{"trainerStatus":{{"metrics":[{{"name":"loss\u001b[2J","value":"1"}}],{t}}}}}"#
                ),
                "status.trainerStatus.metrics[0].name: Invalid value: U+001B: status.trainerStatus.metrics[0].name may hold no control or invisible character",
            ),
        ] {
            let (a, s) = post(&body);
            assert_eq!((a.code, s), (422, None), "{body}");
            let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
            assert_eq!(
                v["message"],
                format!("TrainJob.trainer.kubeflow.org \"job\" is invalid: {why}")
            );
        }
        let (a, _) = post(&format!(
            r#"{{"trainerStatus":{{"estimatedRemainingSeconds":315360000,{t}}}}}"#
        ));
        assert_eq!(a.code, 200);
    }
}
