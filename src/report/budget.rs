//! Fitting the report into its annotation budget: the largest truthful report that fits
//! in [`REPORT_MAX`] bytes, whatever the input.
//!
//! Every string is first cut to [`TEXT_MAX`] bytes, whoever handed it over (a flag, a
//! process name, NVML's device names, a kernel message), so no one field can take the
//! budget. If the report is still too large, items are dropped one at a time, and only
//! while it is: first the details (free ports, GPU devices, the XID counts, whose sum
//! the metric keeps, the OOM sources, probe errors, the oldest OOM kills), then, from
//! the larger of the two, conflicting ports and reasons, so that a pod with 200
//! conflicts still shows as many of them as fit.
//! `truncated: true` says something was cut or dropped, and only then.
//!
//! It works on the JSON value, so a field added to the report later is bounded too.

use serde_json::Value;

/// The most `trainlet.io/report` may hold (annotations share a 256 KiB budget per
/// object; trainlet keeps to a small part of it).
pub const REPORT_MAX: usize = 16 * 1024;
/// The most bytes of any one string in the report.
pub const TEXT_MAX: usize = 512;

/// Renders `report` (a JSON object) in at most `max` bytes.
pub fn fit(mut report: Value, max: usize) -> String {
    let mut truncated = cap_strings(&mut report, TEXT_MAX);
    if truncated || len(&report) > max {
        truncated = true;
        set_truncated(&mut report);
    }
    if truncated && len(&report) > max {
        shed(&mut report, max);
    }
    let json = report.to_string();
    if json.len() <= max {
        return json;
    }
    // Only a report whose fixed part alone exceeds the budget gets here; keep what says
    // whether to look.
    let mut last = serde_json::Map::new();
    for key in ["health", "mode"] {
        if let Some(v) = report.get(key) {
            last.insert(key.into(), v.clone());
        }
    }
    last.insert("truncated".into(), Value::Bool(true));
    Value::Object(last).to_string()
}

/// [`fit`] for a report already rendered: what the outbox does when the pod's other
/// annotations leave less than [`REPORT_MAX`].
pub fn refit(report: &str, max: usize) -> String {
    match serde_json::from_str::<Value>(report) {
        Ok(v) => fit(v, max),
        Err(_) => crate::publish::truncate(report, max),
    }
}

fn len(v: &Value) -> usize {
    // Value's Display writes compact JSON, byte for byte what serde_json::to_string does.
    v.to_string().len()
}

fn set_truncated(report: &mut Value) {
    if let Value::Object(m) = report {
        m.insert("truncated".into(), Value::Bool(true));
    }
}

/// Cuts every string (and object key) longer than `max` bytes on a character boundary,
/// marking the cut with `...`. Returns whether anything was cut.
fn cap_strings(v: &mut Value, max: usize) -> bool {
    match v {
        Value::String(s) if s.len() > max => {
            *s = crate::publish::truncate(s, max);
            true
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |cut, item| cap_strings(item, max) | cut),
        Value::Object(map) => {
            let mut cut = false;
            if map.keys().any(|k| k.len() > max) {
                let old = std::mem::take(map);
                for (k, val) in old {
                    let k = if k.len() > max {
                        cut = true;
                        crate::publish::truncate(&k, max)
                    } else {
                        k
                    };
                    map.insert(k, val);
                }
            }
            map.values_mut()
                .fold(cut, |cut, val| cap_strings(val, max) | cut)
        }
        _ => false,
    }
}

/// Which end of a list goes first.
#[derive(Clone, Copy)]
enum End {
    Front,
    Back,
}

/// Drops items while the report is over budget: the details first, then conflicting
/// ports and reasons, the larger first.
fn shed(report: &mut Value, max: usize) {
    let mut size = len(report);
    let is_free_port = |p: &Value| p.get("state").and_then(Value::as_str) != Some("conflict");
    // Free (or listening, or unknown) ports say least: every one of them first.
    size = drop_while(
        report,
        &["ports"],
        End::Back,
        Some(&is_free_port),
        size,
        max,
    );
    for (path, end) in [
        (&["gpu", "devices"][..], End::Back),
        (&["gpu", "xid_errors"][..], End::Back),
        (&["oom", "sources"][..], End::Back),
        (&["errors"][..], End::Back),
        (&["oom", "recent"][..], End::Front),
    ] {
        size = drop_while(report, path, end, None, size, max);
    }
    // Each list's bytes are counted once and then kept up to date, so shedding stays
    // linear in the number of items.
    let mut ports = bytes_at(report, &["ports"]);
    let mut reasons = bytes_at(report, &["reasons"]);
    while size > max && (ports > 0 || reasons > 0) {
        let (path, bytes): (&[&str], &mut usize) = if ports >= reasons {
            (&["ports"], &mut ports)
        } else {
            (&["reasons"], &mut reasons)
        };
        match drop_one(report, path, End::Back, None) {
            Some(n) => {
                size -= n;
                *bytes = bytes.saturating_sub(n);
            }
            None => *bytes = 0,
        }
    }
}

/// Drops items (those `only` selects) from one end of the list or object at `path`
/// while the report is over `max`; returns the new size.
fn drop_while(
    report: &mut Value,
    path: &[&str],
    end: End,
    only: Option<&dyn Fn(&Value) -> bool>,
    mut size: usize,
    max: usize,
) -> usize {
    while size > max {
        match drop_one(report, path, end, only) {
            Some(n) => size -= n,
            None => break,
        }
    }
    size
}

fn at<'a>(v: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| v.get_mut(*k))
}

fn bytes_at(report: &mut Value, path: &[&str]) -> usize {
    match at(report, path) {
        Some(Value::Array(a)) if !a.is_empty() => serde_json::to_string(a).map_or(0, |s| s.len()),
        _ => 0,
    }
}

/// Removes one item; returns the bytes that saves (the item and its comma), exactly.
fn drop_one(
    report: &mut Value,
    path: &[&str],
    end: End,
    only: Option<&dyn Fn(&Value) -> bool>,
) -> Option<usize> {
    let comma = |n: usize| usize::from(n > 1);
    match at(report, path)? {
        Value::Array(items) => {
            let n = items.len();
            let pick = |i: &usize| only.is_none_or(|f| f(&items[*i]));
            let i = match end {
                End::Front => (0..n).find(pick)?,
                End::Back => (0..n).rev().find(pick)?,
            };
            let item = items.remove(i);
            Some(len(&item) + comma(n))
        }
        Value::Object(map) => {
            let n = map.len();
            let key = match end {
                End::Front => map.keys().next()?.clone(),
                End::Back => map.keys().next_back()?.clone(),
            };
            let val = map.remove(&key)?;
            // "key":value
            Some(Value::String(key).to_string().len() + 1 + len(&val) + comma(n))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conflict(port: u16) -> Value {
        json!({"port": port, "state": "conflict", "reason": "foreign-process", "owner": {"pid": 4242, "comm": "nc"}})
    }

    #[test]
    fn a_report_that_fits_is_untouched() {
        let r = json!({"health": "ok", "reasons": [], "ports": [{"port": 8470, "state": "free"}]});
        assert_eq!(fit(r.clone(), REPORT_MAX), r.to_string());
    }

    #[test]
    fn a_long_flag_value_is_cut_not_the_budget() {
        let nvml = format!("unavailable: library {} not found", "/x".repeat(60_000));
        let r = json!({"health": "degraded", "reasons": [nvml.clone()], "gpu": {"nvml": nvml}, "container": "c".repeat(120_000)});
        let out = fit(r, REPORT_MAX);
        assert!(out.len() <= 3 * TEXT_MAX + 200, "{}", out.len());
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["truncated"], true);
        assert_eq!(v["gpu"]["nvml"].as_str().unwrap().len(), TEXT_MAX);
        assert!(v["gpu"]["nvml"].as_str().unwrap().ends_with("..."));
    }

    #[test]
    fn two_hundred_conflicts_keep_as_many_ports_and_reasons_as_fit() {
        let ports: Vec<Value> = (1000..1200).map(conflict).collect();
        let reasons: Vec<String> = (1000..1200)
            .map(|p| format!("port {p} is held by process nc (pid 4242), which is not part of container trainer; trainer cannot listen on it"))
            .collect();
        let r = json!({"health": "degraded", "reasons": reasons, "ports": ports, "gpu": {"devices": [{"index": 0}]}});
        let out = fit(r, REPORT_MAX);
        assert!(out.len() <= REPORT_MAX);
        assert!(out.len() > REPORT_MAX - 300, "budget used: {}", out.len());
        let v: Value = serde_json::from_str(&out).unwrap();
        let kept_ports = v["ports"].as_array().unwrap().len();
        let kept_reasons = v["reasons"].as_array().unwrap().len();
        assert!(kept_ports >= 40, "{kept_ports}");
        assert!(kept_reasons >= 40, "{kept_reasons}");
        // The first ones are kept, in order; the details went first.
        assert_eq!(v["ports"][0]["port"], 1000);
        assert_eq!(v["gpu"]["devices"], json!([]));
        assert_eq!(v["truncated"], true);
    }

    #[test]
    fn free_ports_go_before_conflicts_and_old_kills_before_new() {
        let mut ports: Vec<Value> = (1..=300)
            .map(|p| json!({"port": p, "state": "free"}))
            .collect();
        ports.push(conflict(8470));
        let kills: Vec<Value> = (0..20)
            .map(|i| json!({"time": i, "note": "x".repeat(400)}))
            .collect();
        let r = json!({"health": "degraded", "reasons": ["r"], "ports": ports, "oom": {"recent": kills, "sources": ["pod status"]}});
        let out = fit(r, REPORT_MAX);
        assert!(
            out.len() <= REPORT_MAX && out.len() > REPORT_MAX - 40,
            "{}",
            out.len()
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        // Free ports went from the end, only as many as needed; the conflict and every
        // kill stayed.
        let ports = v["ports"].as_array().unwrap();
        assert!(ports.len() > 200 && ports.len() < 301, "{}", ports.len());
        assert_eq!(ports.last().unwrap(), &conflict(8470));
        assert_eq!(v["oom"]["recent"].as_array().unwrap().len(), 20);

        // With more kills than fit beside the conflict, the oldest go first.
        let kills: Vec<Value> = (0..60)
            .map(|i| json!({"time": i, "note": "x".repeat(400)}))
            .collect();
        let r = json!({"health": "degraded", "ports": [{"port": 1, "state": "free"}, conflict(8470)], "oom": {"recent": kills}});
        let v: Value = serde_json::from_str(&fit(r, REPORT_MAX)).unwrap();
        assert_eq!(v["ports"], json!([conflict(8470)]));
        let recent = v["oom"]["recent"].as_array().unwrap();
        assert!(recent.len() > 30 && recent.len() < 60, "{}", recent.len());
        assert_eq!(recent.last().unwrap()["time"], 59, "the newest kill stays");
    }

    mod properties {
        use super::*;
        use crate::testing::budget;
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            // Mostly short, sometimes far over the cap of one string.
            prop_oneof![
                8 => proptest::collection::vec(any::<char>(), 0..40).prop_map(String::from_iter),
                1 => (0usize..40_000).prop_map(|n| "x".repeat(n)),
                1 => (0usize..3_000).prop_map(|n| "é\"\\\u{1F600}".repeat(n)),
            ]
        }

        /// A report-shaped value: the fields the report has, with arbitrary text and
        /// list lengths.
        fn report() -> impl Strategy<Value = Value> {
            (
                text(),
                proptest::collection::vec(text(), 0..40),
                // Many ports, so that ports alone can exceed the budget; their owners'
                // names are short, as /proc's comm is.
                proptest::collection::vec((any::<u16>(), any::<bool>(), "[a-z]{1,15}"), 0..300),
                proptest::collection::vec(text(), 0..20),
                proptest::collection::vec(text(), 0..25),
                proptest::collection::btree_map(text(), text(), 0..6),
            )
                .prop_map(|(container, reasons, ports, devices, kills, errors)| {
                    serde_json::json!({
                        "health": "degraded",
                        "reasons": reasons,
                        "mode": "sidecar",
                        "container": container,
                        "gpu": {"count": devices.len(), "nvml": "ok", "devices": devices.iter().map(|d| serde_json::json!({"name": d})).collect::<Vec<_>>()},
                        "ports": ports.iter().map(|(p, c, comm)| serde_json::json!({"port": p, "state": if *c { "conflict" } else { "free" }, "owner": {"comm": comm}})).collect::<Vec<_>>(),
                        "oom": {"kills": kills.len(), "sources": ["pod status"], "recent": kills.iter().map(|k| serde_json::json!({"process": {"comm": k}})).collect::<Vec<_>>()},
                        "errors": errors,
                    })
                })
        }

        proptest! {
            #![proptest_config(budget(128))]

            #[test]
            fn never_more_than_the_budget_and_truncated_only_when_cut(r in report()) {
                let before = r.to_string();
                let out = fit(r, REPORT_MAX);
                prop_assert!(out.len() <= REPORT_MAX, "{} bytes", out.len());
                let v: Value = serde_json::from_str(&out).unwrap();
                prop_assert_eq!(&v["health"], "degraded");
                // Nothing cut: the very same JSON, and no `truncated`.
                prop_assert_eq!(v.get("truncated").is_some(), out != before);
            }
        }
    }
}
