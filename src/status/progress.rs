//! The PROGRESS and ETA cells: `trainlet.io/progress` in a few words.

use serde_json::Value;

use super::text::clock;

/// `trainlet.io/progress` in a few words: the percentage CMD reported, then the last
/// step and when, or since when CMD is stalled.
pub(super) fn progress(p: &Value, today: &str) -> String {
    let words = progress_words(p, today);
    match p["percent"].as_u64().filter(|n| *n <= 100) {
        Some(n) if words.is_empty() => format!("{n}%"),
        Some(n) => format!("{n}%, {words}"),
        None => words,
    }
}

/// The time remaining CMD reported, `1h2m3s`.
pub(super) fn eta(p: &Value) -> String {
    p["eta_seconds"]
        .as_u64()
        .map(|s| {
            humantime::format_duration(std::time::Duration::from_secs(s))
                .to_string()
                .replace(' ', "")
        })
        .unwrap_or_default()
}

fn progress_words(p: &Value, today: &str) -> String {
    let clock = |k: &str| p[k].as_str().map(|t| clock(t, today));
    let step = p["step"]
        .as_f64()
        .and_then(crate::stall::progress::step)
        .map(|s| format!("step {s}"));
    if p["stalled"] == true {
        let since = clock("since").unwrap_or_default();
        return match step {
            Some(step) => format!("stalled since {since} ({step})"),
            None => format!("stalled since {since}"),
        };
    }
    // No progress since CMD started: the ranks that never print, which is no stall.
    if p["silent"] == true {
        return "silent".into();
    }
    match (step, clock("at")) {
        (Some(step), Some(at)) => format!("{step} at {at}"),
        (None, Some(at)) => format!("output at {at}"),
        (Some(step), None) => step,
        (None, None) => String::new(),
    }
}
