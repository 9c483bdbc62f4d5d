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

use crate::report::probe::gpu::events::XidWatch;
use crate::report::probe::gpu::xid::XidError;
use crate::report::probe::gpu::{GpuDevice, GpuFault, GpuInfo, Unavailable};
use crate::report::probe::oom::OomKill;
use crate::report::probe::ports::{Owner, PortEntry, PortState};
pub use crate::stall::observation::ProgressObservation;

mod validate;

pub use validate::parse;

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
