//! NVML's event API, waited on in a thread of its own: `nvmlEventSetWait` blocks, and
//! the reporter's loop must not. The thread loads NVML itself (as the probe does),
//! registers every GPU for XID errors, and sends what it sees to the loop. NVML's wait
//! sleeps in the kernel until an event or the timeout, so at rest the thread wakes once
//! per [`WAIT_MS`]; nothing joins it, and the process's exit ends it.

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

/// The longest single wait: how often an idle thread checks whether to stop.
pub const WAIT_MS: u32 = 5000;

/// What the event thread saw.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuEvent {
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
    let (set, uuids) = match register(&nvml) {
        Ok(Some(r)) => r,
        Ok(None) => {
            debug!("no GPU supports XID events");
            return;
        }
        Err(e) => {
            warn!("cannot register for NVML events: {e}; XID errors are not watched");
            return;
        }
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

/// An event set, and the index and UUID of each GPU registered in it.
type Registered<'n> = (EventSet<'n>, Vec<(u32, String)>);

/// An event set with every GPU that supports XID events, and each GPU's UUID.
fn register(nvml: &Nvml) -> Result<Option<Registered<'_>>, NvmlError> {
    let mut set = nvml.create_event_set()?;
    let mut uuids = Vec::new();
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        if !d
            .supported_event_types()?
            .contains(EventTypes::CRITICAL_XID_ERROR)
        {
            continue;
        }
        set = d
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| e.error)?;
        uuids.push((i, d.uuid()?));
    }
    Ok((!uuids.is_empty()).then_some((set, uuids)))
}
