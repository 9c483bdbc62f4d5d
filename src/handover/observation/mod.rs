//! The observation handover: `trainlet exec --report --observations DIR` in the training
//! container writes what only it can see; the `trainlet` sidecar reads it and is the
//! pod's only reporter.
//!
//! Only the training container sees its GPUs (the NVIDIA runtime gives the sidecar,
//! which requests none, no device), CMD's processes and their OOM victims, and which
//! process owns a port. Only the sidecar needs API credentials. So exec hands its
//! observations over and the sidecar merges them with what it sees itself (pod status,
//! the pod spec's GPU limit and ports) into one report, with one set of Events.
//!
//! The channel is one file, `DIR/exec.json`, replaced atomically (written beside,
//! then renamed) on every change and at least once per interval. A file carries
//! *state*, not a stream of messages: each version is the whole current observation,
//! with cumulative counters (OOM kills numbered, XIDs counted). So either side can
//! restart at any time without a handshake: a restarted sidecar reads the latest
//! version at once; a restarted exec starts a new `epoch`, which the sidecar tells
//! from the old one; nothing queues up unread as in a socket, and the sidecar needs no
//! listening socket the training container could flood. The sidecar mounts the
//! directory read-only (a second emptyDir, separate from the cluster files the
//! training container only reads), so it cannot be led to write anything there.
//!
//! The training container is less trusted than the sidecar: [`parse`] bounds the size
//! and every string and list, and rejects what is not exactly this format. What it
//! returns is the only way an observation reaches the report.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::file::{self, ReadError};
use crate::render::OutputError;
use crate::text::is_invisible;

use crate::kubeflow::bounds;
use crate::report::probe::gpu::events::XidWatch;
use crate::report::probe::gpu::xid::XidError;
use crate::report::probe::gpu::{GpuDevice, GpuFault, GpuInfo, Unavailable};
use crate::report::probe::oom::OomKill;
use crate::report::probe::ports::{Owner, PortEntry, PortState};
pub use crate::stall::observation::ProgressObservation;
use crate::stall::progress::{MAX_REPORTED_METRICS, Reported};

/// The file's name in the observations directory.
pub const FILE: &str = "exec.json";
/// The format's version: a reader rejects any other.
pub const VERSION: u32 = 1;
/// The largest observation accepted. A full one (8 GPUs, 20 kills, 64 ports) is
/// about 8 KiB.
pub const MAX_BYTES: usize = 64 * 1024;
/// Bounds on what one observation may hold.
const MAX_DEVICES: usize = 64;
const MAX_XIDS: usize = 256;
const MAX_PORTS: usize = 1024;
const MAX_KILLS: usize = crate::report::probe::oom::ledger::KEEP_KILLS;
const MAX_ERRORS: usize = 8;
/// Longest string in an observation (a UUID is 40, a comm 15, an NVML error ~200).
pub const MAX_TEXT: usize = 512;

/// Everything exec observed, as of one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    pub version: u32,
    /// Which run of exec wrote it (`<pid>-<start in ms>`): a new epoch is a
    /// restarted exec, whose counters start again from zero.
    pub epoch: String,
    /// How often exec rewrites the file while CMD runs.
    pub interval_ms: u64,
    /// CMD's exit code (or 128+signal) once it has ended: the last version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited: Option<i32>,
    pub gpu: GpuObservation,
    /// Every XID since exec started, counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<XidCountObservation>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortEntry>,
    /// The most recent OOM kills among CMD's processes, numbered from 1 per epoch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kills: Vec<KillObservation>,
    /// Probes that failed, by probe.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
    /// `--on-peer-change restart`: exec's restarts of CMD, and whether it waits for
    /// the sidecar to move the cluster files to the replacements ([`peers`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartObservation>,
    /// `--stall-after` / `--progress-pattern`: CMD's progress and stalls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressObservation>,
}

/// exec's restarts after a peer change, for the sidecar to announce and answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartObservation {
    /// Restarts begun since exec started; each is one `Restarting` Event.
    pub restarts: u32,
    /// The last restart's note (the Event's text).
    pub note: String,
    /// CMD is stopped and exec waits for the files of the complete cluster.
    pub waiting: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuObservation {
    /// Why NVML cannot be used; absent when it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<Unavailable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default)]
    pub devices: Vec<GpuDevice>,
    /// The most GPUs NVML has shown at once since exec started.
    pub seen: u32,
    /// NVML's event thread reported the GPUs lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
    /// GPUs NVML counts whose queries fail (lost, needing a reset).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faulty: Vec<GpuFault>,
    /// Which GPUs NVML's event API watches, once registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_watch: Option<XidWatch>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidCountObservation {
    pub error: XidError,
    pub count: u64,
}

/// One OOM kill of one of CMD's processes (the cgroup's counter rose).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillObservation {
    /// 1 for the epoch's first kill, and so on: what the sidecar has published is a
    /// number, so no kill is announced twice.
    pub seq: u64,
    pub time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Owner>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub group: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_usage: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
}

/// Why an observation was rejected. The label of
/// `trainlet_observations_rejected_total{reason}` is [`Rejected::reason`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Rejected {
    #[error("{path} is larger than {MAX_BYTES} bytes")]
    TooLarge { path: String },
    #[error("{path} is not a regular file")]
    NotAFile { path: String },
    #[error("cannot read {path}: {why}")]
    Unreadable { path: String, why: String },
    #[error("{path} is not an observation of format {VERSION}: {why}")]
    Malformed { path: String, why: String },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
}

impl Rejected {
    pub fn reason(&self) -> &'static str {
        match self {
            Rejected::TooLarge { .. } => "too-large",
            Rejected::NotAFile { .. } => "not-a-file",
            Rejected::Unreadable { .. } => "unreadable",
            Rejected::Malformed { .. } => "malformed",
            Rejected::Invalid { .. } => "invalid",
        }
    }
}

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
    let g = &o.gpu;
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
    at_most("XID counts", &o.xids, MAX_XIDS)?;
    for x in &o.xids {
        text("xids.uuid", &x.error.uuid, 96)?;
        if x.count == 0 {
            return Err("an XID count is 0".into());
        }
    }
    at_most("ports", &o.ports, MAX_PORTS)?;
    for p in &o.ports {
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
    at_most("kills", &o.kills, MAX_KILLS)?;
    let mut last = 0;
    for k in &o.kills {
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
        text("progress.note", &p.note, MAX_TEXT)?;
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
    }
    Ok(())
}

/// Writes one observation: a temporary file in `dir`, then a rename over [`FILE`], so
/// the sidecar reads the old version or the new one, never a part.
pub fn write(dir: &Path, o: &Observation) -> Result<(), OutputError> {
    let json = serde_json::to_vec(o).expect("an observation serializes");
    file::write(dir, FILE, &json)
}

/// One version read from the directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub observation: Observation,
    /// When it was written (the file's mtime): how fresh it is.
    pub written: SystemTime,
}

/// Reads and validates `dir/`[`FILE`], bounded and guarded ([`file::read_bounded`]).
/// `Ok(None)`: there is none (yet).
pub fn read(dir: &Path) -> Result<Option<Version>, Rejected> {
    let path = dir.join(FILE);
    let name = path.display().to_string();
    let (bytes, written) = match file::read_bounded(&path, MAX_BYTES) {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(None),
        Err(ReadError::NotAFile) => return Err(Rejected::NotAFile { path: name }),
        Err(ReadError::TooLarge) => return Err(Rejected::TooLarge { path: name }),
        Err(ReadError::Unreadable(e)) => {
            return Err(Rejected::Unreadable {
                path: name,
                why: e.to_string(),
            });
        }
    };
    let observation = parse(&bytes, &name)?;
    Ok(Some(Version {
        observation,
        written,
    }))
}

impl Observation {
    /// What NVML showed exec.
    pub fn gpu_info(&self) -> GpuInfo {
        GpuInfo {
            devices: self.gpu.devices.clone(),
            driver: self.gpu.driver.clone(),
            nvml: self.gpu.unavailable.clone().map_or(Ok(()), Err),
            faulty: self.gpu.faulty.clone(),
        }
    }

    /// The ports exec watched, by port.
    pub fn port_states(&self) -> BTreeMap<u16, PortState> {
        self.ports
            .iter()
            .map(|p| (p.port, p.state.clone()))
            .collect()
    }
}

impl KillObservation {
    /// The kill as the ledger records it, in the training container.
    pub fn to_kill(&self, container: &str) -> OomKill {
        OomKill {
            time: self.time.clone(),
            container: container.to_string(),
            source: "cgroup",
            process: self
                .process
                .as_ref()
                .map(|p| crate::report::probe::oom::ProcStat {
                    pid: p.pid,
                    comm: p.comm.clone(),
                    state: '?',
                    ppid: 0,
                    rss_bytes: 0,
                    cpu_ticks: 0,
                }),
            group: self.group,
            memory_usage: self.memory_usage,
            memory_peak: self.memory_peak,
            memory_limit: self.memory_limit.clone(),
            restart_count: None,
            exit_code: None,
        }
    }

    /// A kill as exec hands it over, numbered.
    pub fn from_kill(seq: u64, k: &OomKill) -> KillObservation {
        KillObservation {
            seq,
            time: k.time.clone(),
            process: k.process.as_ref().map(|p| Owner {
                pid: p.pid,
                comm: p.comm.clone(),
            }),
            group: k.group,
            memory_usage: k.memory_usage,
            memory_peak: k.memory_peak,
            memory_limit: k.memory_limit.clone(),
        }
    }
}

/// What the sidecar has already published from one epoch of exec, so that a version
/// read again (or after a restart of either side) announces only what is new.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Published {
    pub epoch: String,
    /// The highest kill number announced.
    pub kills: u64,
    /// The XID counts announced.
    pub xids: BTreeMap<XidError, u64>,
    /// The restarts announced.
    pub restarts: u32,
    /// The stalls announced.
    pub stalls: u64,
}

/// What a new version adds to what was published: the kills to announce, and each
/// XID's new occurrences. A new epoch starts from nothing. Pure.
pub fn news(published: &mut Published, o: &Observation) -> News {
    if published.epoch != o.epoch {
        *published = Published {
            epoch: o.epoch.clone(),
            ..Published::default()
        };
    }
    let kills: Vec<KillObservation> = o
        .kills
        .iter()
        .filter(|k| k.seq > published.kills)
        .cloned()
        .collect();
    if let Some(k) = kills.last() {
        published.kills = k.seq;
    }
    let mut xids = Vec::new();
    for x in &o.xids {
        let seen = published.xids.entry(x.error.clone()).or_insert(0);
        if x.count > *seen {
            xids.push((x.error.clone(), x.count - *seen));
            *seen = x.count;
        }
    }
    // Counts are cumulative within an epoch: what this version no longer lists is not
    // kept, so the record stays as small as one observation (at most 256 entries).
    let listed: std::collections::BTreeSet<&XidError> = o.xids.iter().map(|x| &x.error).collect();
    published.xids.retain(|e, _| listed.contains(e));
    let restart = o
        .restart
        .as_ref()
        .filter(|r| r.restarts > published.restarts)
        .map(|r| {
            published.restarts = r.restarts;
            r.note.clone()
        });
    let stall = o
        .progress
        .as_ref()
        .filter(|p| p.stalls > published.stalls)
        .map(|p| {
            published.stalls = p.stalls;
            p.note.clone()
        });
    News {
        kills,
        xids,
        restart,
        stall,
    }
}

/// What one version adds: see [`news`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct News {
    pub kills: Vec<KillObservation>,
    /// Each XID with its number of new occurrences.
    pub xids: Vec<(XidError, u64)>,
    /// A restart of CMD begun since: its note, for the `Restarting` Event.
    pub restart: Option<String>,
    /// A stall begun since: its note, for the `Stalled` Event.
    pub stall: Option<String>,
}

#[cfg(test)]
mod tests;
