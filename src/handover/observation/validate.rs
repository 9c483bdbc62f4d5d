//! What [`parse`] accepts from the training container: this format exactly, every
//! string and list bounded, nothing that would mislead a person reading the report.

use super::{
    GpuObservation, KillObservation, MAX_BYTES, MAX_DEVICES, MAX_ERRORS, MAX_KILLS, MAX_PORTS,
    MAX_TEXT, MAX_XIDS, Observation, ProgressObservation, Rejected, VERSION,
};
use crate::kubeflow::bounds;
use crate::report::probe::gpu::Unavailable;
use crate::report::probe::ports::{PortEntry, PortState};
use crate::stall::progress::{MAX_REPORTED_METRICS, Reported};
use crate::text::is_invisible;

/// Parses and validates one observation. Pure: `path` only names it in errors. The
/// error never quotes the content, which may be anything.
pub fn parse(bytes: &[u8], path: &str) -> Result<Observation, Rejected> {
    if bytes.len() > MAX_BYTES {
        return Err(Rejected::TooLarge { path: path.into() });
    }
    let obs: Observation = serde_json::from_slice(bytes).map_err(|e| Rejected::Malformed {
        path: path.into(),
        // serde's message names the field and position, never the value.
        why: format!(
            "{} at line {} column {}",
            classify(&e),
            e.line(),
            e.column()
        ),
    })?;
    validate(&obs).map_err(|why| Rejected::Invalid {
        path: path.into(),
        why,
    })?;
    Ok(obs)
}

fn classify(e: &serde_json::Error) -> &'static str {
    use serde_json::error::Category;
    match e.classify() {
        Category::Io => "read error",
        Category::Syntax => "invalid JSON",
        Category::Data => "unexpected field or type",
        Category::Eof => "truncated JSON",
    }
}

/// Short printable text: no control characters, none that are invisible or reorder
/// what is shown, at most `max` bytes.
fn text(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!("{what} is longer than {max} bytes"));
    }
    if s.chars().any(char::is_control) {
        return Err(format!("{what} holds control characters"));
    }
    if let Some(c) = s.chars().find(|c| is_invisible(*c)) {
        return Err(format!(
            "{what} holds an invisible or reordering character (U+{:04X})",
            u32::from(c)
        ));
    }
    Ok(())
}

fn at_most<T>(what: &str, v: &[T], max: usize) -> Result<(), String> {
    if v.len() > max {
        return Err(format!("more than {max} {what}"));
    }
    Ok(())
}

fn unavailable_text(u: &Unavailable) -> Result<(), String> {
    match u {
        Unavailable::LibraryNotFound { lib, why } => {
            text("gpu.unavailable.lib", lib, MAX_TEXT)?;
            text("gpu.unavailable.why", why, MAX_TEXT)
        }
        Unavailable::InitFailed { why } | Unavailable::QueryFailed { why } => {
            text("gpu.unavailable.why", why, MAX_TEXT)
        }
    }
}

/// The handover's names for a report's fields, in [`bounds::check`]'s errors.
const REPORTED: bounds::Fields = bounds::Fields {
    prefix: "progress.reported",
    percent: "percent",
    eta: "eta_seconds",
    metrics: "metrics",
};

/// What CMD reported, as exec hands it over: within the endpoint's own bounds, and at
/// most the [`MAX_REPORTED_METRICS`] that exec keeps.
fn reported(r: &Reported) -> Result<(), String> {
    let metrics: Vec<(&str, &str)> = r
        .metrics
        .iter()
        .map(|m| (m.name.as_str(), m.value.as_str()))
        .collect();
    let report = bounds::Report {
        percent: r.percent.map(i64::from),
        eta_seconds: r.eta_seconds.map(i64::from),
        metrics: &metrics,
    };
    bounds::check(&REPORTED, &report, MAX_REPORTED_METRICS).map_err(|e| e.to_string())
}

/// Every field of an observation within its bounds.
fn validate(o: &Observation) -> Result<(), String> {
    if o.version != VERSION {
        return Err(format!("format {} is not {VERSION}", o.version));
    }
    if o.epoch.is_empty()
        || o.epoch.len() > 40
        || !o.epoch.bytes().all(|b| b.is_ascii_digit() || b == b'-')
    {
        return Err("epoch is not <pid>-<milliseconds>".into());
    }
    if !(100..=3_600_000).contains(&o.interval_ms) {
        return Err("interval_ms is not between 100 and 3600000".into());
    }
    gpu(&o.gpu)?;
    at_most("XID counts", &o.xids, MAX_XIDS)?;
    for x in &o.xids {
        text("xids.uuid", &x.error.uuid, 96)?;
        if x.count == 0 {
            return Err("an XID count is 0".into());
        }
    }
    ports(&o.ports)?;
    kills(&o.kills)?;
    if o.errors.len() > MAX_ERRORS {
        return Err(format!("more than {MAX_ERRORS} errors"));
    }
    for (k, v) in &o.errors {
        text("errors key", k, 32)?;
        text("errors value", v, MAX_TEXT)?;
    }
    if let Some(r) = &o.restart {
        text("restart.note", &r.note, MAX_TEXT)?;
    }
    if let Some(p) = &o.progress {
        progress(p)?;
    }
    Ok(())
}

/// What NVML gave exec.
fn gpu(g: &GpuObservation) -> Result<(), String> {
    if let Some(u) = &g.unavailable {
        unavailable_text(u)?;
    }
    if let Some(d) = &g.driver {
        text("gpu.driver", d, 64)?;
    }
    if let Some(l) = &g.lost {
        text("gpu.lost", l, MAX_TEXT)?;
    }
    at_most("GPUs", &g.devices, MAX_DEVICES)?;
    if g.seen as usize > MAX_DEVICES {
        return Err(format!("gpu.seen is more than {MAX_DEVICES}"));
    }
    for d in &g.devices {
        text("gpu.devices.uuid", &d.uuid, 96)?;
        text("gpu.devices.name", &d.name, 96)?;
    }
    at_most("faulty GPUs", &g.faulty, MAX_DEVICES)?;
    for f in &g.faulty {
        text("gpu.faulty.uuid", &f.uuid, 96)?;
        text("gpu.faulty.why", &f.why, MAX_TEXT)?;
    }
    if let Some(w) = &g.xid_watch {
        at_most("watched GPUs", &w.watched, MAX_DEVICES)?;
        at_most("unwatched GPUs", &w.unwatched, MAX_DEVICES)?;
        for u in &w.unwatched {
            text("gpu.xid_watch.unwatched.uuid", &u.uuid, 96)?;
            text("gpu.xid_watch.unwatched.why", &u.why, MAX_TEXT)?;
        }
    }
    Ok(())
}

/// The ports exec probed, and who holds them.
fn ports(ports: &[PortEntry]) -> Result<(), String> {
    at_most("ports", ports, MAX_PORTS)?;
    for p in ports {
        if p.port == 0 {
            return Err("port 0".into());
        }
        let owner = match &p.state {
            PortState::Listening { owner } | PortState::Conflict { owner, .. } => owner.as_ref(),
            PortState::Unknown { error } => {
                text("ports.error", error, MAX_TEXT)?;
                None
            }
            PortState::Free => None,
        };
        if let Some(o) = owner {
            text("ports.owner.comm", &o.comm, 64)?;
        }
    }
    Ok(())
}

/// The OOM kills exec saw, numbered in increasing order.
fn kills(kills: &[KillObservation]) -> Result<(), String> {
    at_most("kills", kills, MAX_KILLS)?;
    let mut last = 0;
    for k in kills {
        if k.seq <= last {
            return Err("kills are not numbered in increasing order".into());
        }
        last = k.seq;
        humantime::parse_rfc3339(&k.time)
            .map_err(|_| "a kill's time is not RFC 3339".to_string())?;
        if let Some(p) = &k.process {
            text("kills.process.comm", &p.comm, 64)?;
        }
        if let Some(l) = &k.memory_limit {
            text("kills.memory_limit", l, 32)?;
        }
    }
    Ok(())
}

/// CMD's progress as exec's stall watch sees it.
fn progress(p: &ProgressObservation) -> Result<(), String> {
    text("progress.note", &p.note, MAX_TEXT)?;
    if p.stuck_at.len() > crate::stacks::summary::MAX_PLACES {
        return Err(format!(
            "progress.where has {} places, more than {}",
            p.stuck_at.len(),
            crate::stacks::summary::MAX_PLACES
        ));
    }
    for place in &p.stuck_at {
        text("progress.where", place, crate::stacks::summary::MAX_PLACE)?;
    }
    if let Some(f) = &p.failed {
        text("progress.failed.note", &f.note, MAX_TEXT)?;
    }
    if p.step
        .is_some_and(|s| crate::stall::progress::step(s).is_none())
    {
        return Err("progress.step is not a step: a number from 0 to 2^53".into());
    }
    if let Some(r) = &p.reported {
        reported(r)?;
    }
    // Times RFC 3339 cannot write are no times exec hands over.
    for (what, t) in [
        ("progress.at_ms", p.at_ms),
        ("progress.since_ms", p.since_ms),
        ("progress.started_ms", p.started_ms),
        (
            "progress.failed.since_ms",
            p.failed.as_ref().map(|f| f.since_ms),
        ),
    ] {
        if t.is_some_and(|t| t > crate::time::MAX_MS) {
            return Err(format!("{what} is past the year 9999"));
        }
    }
    Ok(())
}
