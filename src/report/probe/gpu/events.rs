//! NVML's event API, waited on in a thread of its own: `nvmlEventSetWait` blocks, and
//! the reporter's loop must not. The thread loads NVML itself (as the probe does),
//! registers every GPU for XID errors, and sends what it sees to the loop. NVML's wait
//! sleeps in the kernel until an event or the timeout, so at rest the thread wakes once
//! per [`WAIT_MS`]; nothing joins it, and the process's exit ends it.
//!
//! An event set sees only what happens after registration: an XID from before trainlet
//! started is never reported. A GPU NVML will not register (`NVML_ERROR_NOT_SUPPORTED`
//! on some platforms and vGPUs, `NVML_ERROR_NO_PERMISSION`) is left out, the others are
//! still watched, and the loop is told once which are watched ([`XidWatch`]); counts and
//! health come from the probe's polling either way.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError as NvmlXid;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{debug, warn};

use super::xid::XidError;
use serde::{Deserialize, Serialize};

/// Which GPUs NVML's event API watches for XID errors, as registration left them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidWatch {
    /// The indices of the GPUs registered.
    pub watched: Vec<u32>,
    /// The GPUs left out, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unwatched: Vec<Unwatched>,
}

/// A GPU NVML's event API does not watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unwatched {
    pub gpu: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    pub why: String,
}

impl XidWatch {
    /// The log line for GPUs left out: `XID errors are not watched on GPU 1
    /// (GPU-…): …; GPU counts and health are still polled`; `None` when all are
    /// watched.
    pub fn warning(&self) -> Option<String> {
        if self.unwatched.is_empty() {
            return None;
        }
        let gpus: Vec<String> = self
            .unwatched
            .iter()
            .map(|u| {
                let name = if u.uuid.is_empty() {
                    format!("GPU {}", u.gpu)
                } else {
                    format!("GPU {} ({})", u.gpu, u.uuid)
                };
                format!("{name}: {}", u.why)
            })
            .collect();
        Some(format!(
            "XID errors are not watched on {}; GPU counts and health are still polled",
            gpus.join("; ")
        ))
    }
}

/// The longest single wait: how often an idle thread checks whether to stop.
pub const WAIT_MS: u32 = 5000;

/// What the event thread saw.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuEvent {
    /// Registration is done: which GPUs are watched. Sent once, first.
    Watch(XidWatch),
    Xid(XidError),
    /// NVML answered "GPU is lost" while waiting.
    Lost {
        why: String,
    },
}

/// Starts the thread; it ends when `stop` is set, when NVML cannot be loaded or has no
/// event support (then there is nothing to wait for), or after it reported a lost GPU.
pub fn spawn(lib: Option<PathBuf>, tx: UnboundedSender<GpuEvent>, stop: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || run(lib, &tx, &stop));
    if let Err(e) = spawned {
        warn!("cannot start the NVML event thread: {e}; XID errors are not watched");
    }
}

fn run(lib: Option<PathBuf>, tx: &UnboundedSender<GpuEvent>, stop: &AtomicBool) {
    let nvml = match super::open(lib.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            debug!("no NVML event thread: {e}");
            return;
        }
    };
    let (set, uuids, unwatched) = match register(&nvml) {
        Ok(r) => r,
        Err(e) => {
            warn!(
                "cannot register for NVML events: {e}; XID errors are not watched, GPU counts and health are still polled"
            );
            return;
        }
    };
    let watch = XidWatch {
        watched: uuids.iter().map(|(i, _)| *i).collect(),
        unwatched,
    };
    if let Some(w) = watch.warning() {
        warn!("{w}");
    }
    if tx.send(GpuEvent::Watch(watch)).is_err() {
        return;
    }
    let Some(set) = set else {
        debug!("no GPU is watched for XID events");
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        match set.wait(WAIT_MS) {
            Ok(data) => {
                let Some(xid) = data.event_data else { continue };
                let gpu = data.device.index().unwrap_or(u32::MAX);
                let uuid = uuids
                    .iter()
                    .find(|(i, _)| *i == gpu)
                    .map(|(_, u)| u.clone())
                    .unwrap_or_default();
                let xid = match xid {
                    NvmlXid::Value(v) => v,
                    NvmlXid::Unknown => 999,
                };
                if tx.send(GpuEvent::Xid(XidError { gpu, uuid, xid })).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(NvmlError::GpuLost) => {
                let _ = tx.send(GpuEvent::Lost {
                    why: "NVML reports the GPU is lost".into(),
                });
                return;
            }
            Err(e) => {
                warn!("waiting for NVML events failed: {e}; retrying in 5 s");
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    }
}

/// An event set (none when no GPU could be registered), the index and UUID of each
/// GPU registered in it, and the GPUs left out.
type Registered<'n> = (Option<EventSet<'n>>, Vec<(u32, String)>, Vec<Unwatched>);

/// An event set with every GPU that supports XID events and that NVML registers.
/// A failed registration frees the set (nvml-wrapper releases it), so the GPUs before
/// the one that failed are registered again in a new set: at most one new set per GPU
/// left out.
fn register(nvml: &Nvml) -> Result<Registered<'_>, NvmlError> {
    let mut left_out: Vec<Unwatched> = Vec::new();
    'attempt: loop {
        let mut set = nvml.create_event_set()?;
        let mut uuids = Vec::new();
        for i in 0..nvml.device_count()? {
            if left_out.iter().any(|u| u.gpu == i) {
                continue;
            }
            let mut leave = |uuid: String, why: String| {
                left_out.push(Unwatched { gpu: i, uuid, why });
            };
            let d = match nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => {
                    leave(String::new(), e.to_string());
                    continue;
                }
            };
            let uuid = d.uuid().unwrap_or_default();
            match d.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                Ok(_) => {
                    leave(uuid, "NVML offers no XID events for it".into());
                    continue;
                }
                Err(e) => {
                    leave(uuid, e.to_string());
                    continue;
                }
            }
            match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => set = s,
                Err(e) => {
                    leave(uuid, e.error.to_string());
                    continue 'attempt;
                }
            }
            uuids.push((i, uuid));
        }
        left_out.sort_by_key(|u| u.gpu);
        let set = (!uuids.is_empty()).then_some(set);
        return Ok((set, uuids, left_out));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_left_out_are_named_once_in_one_line() {
        let all = XidWatch {
            watched: vec![0, 1],
            unwatched: vec![],
        };
        assert_eq!(all.warning(), None);
        let some = XidWatch {
            watched: vec![0],
            unwatched: vec![
                Unwatched {
                    gpu: 1,
                    uuid: "GPU-1".into(),
                    why: "the requested operation is not available on the target device".into(),
                },
                Unwatched {
                    gpu: 2,
                    uuid: String::new(),
                    why: "GPU is lost".into(),
                },
            ],
        };
        assert_eq!(
            some.warning().unwrap(),
            "XID errors are not watched on GPU 1 (GPU-1): the requested operation is not available on the target device; GPU 2: GPU is lost; GPU counts and health are still polled"
        );
        assert_eq!(
            serde_json::to_string(&some).unwrap(),
            r#"{"watched":[0],"unwatched":[{"gpu":1,"uuid":"GPU-1","why":"the requested operation is not available on the target device"},{"gpu":2,"why":"GPU is lost"}]}"#
        );
    }
}
