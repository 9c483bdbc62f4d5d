//! The GPUs as this reporter sees them: NVML's answer at each probe, the most it has
//! shown at once (fewer later is a loss), and NVML's events (XID errors, a lost GPU)
//! from the thread that blocks on them.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tracing::warn;

use super::{Engine, observations};
use crate::event::Event;
use crate::reason::Reason;
use crate::report::probe::gpu::events::{self as gpu_events, GpuEvent, XidWatch};
use crate::report::probe::gpu::xid::XidLedger;
use crate::report::probe::gpu::{GpuInfo, GpuProbe};

/// How long the first report waits for the event thread's registration, so that it
/// already says which GPUs are watched: one patch, not two.
pub(super) const REGISTRATION_WAIT: Duration = Duration::from_secs(1);

pub(super) struct Gpus {
    lib: Option<PathBuf>,
    probe: GpuProbe,
    /// The latest probe.
    pub(super) info: GpuInfo,
    /// The most GPUs NVML has shown at once: fewer later means GPUs were lost.
    pub(super) seen: u32,
    /// Why NVML's event thread said a GPU was lost, if it did.
    pub(super) lost: Option<String>,
    pub(super) xids: XidLedger,
    /// Which GPUs NVML's event API watches, once the event thread has registered.
    pub(super) watch: Option<XidWatch>,
    events: Option<UnboundedReceiver<GpuEvent>>,
    events_stop: Arc<AtomicBool>,
}

impl Gpus {
    pub(super) fn new(lib: Option<PathBuf>) -> Gpus {
        Gpus {
            probe: GpuProbe::new(lib.clone()),
            lib,
            info: GpuInfo {
                devices: Vec::new(),
                driver: None,
                nvml: Ok(()),
                faulty: Vec::new(),
            },
            seen: 0,
            lost: None,
            xids: XidLedger::default(),
            watch: None,
            events: None,
            events_stop: Arc::new(AtomicBool::new(false)),
        }
    }

    pub(super) fn probe(&mut self) {
        self.info = self.probe.probe();
        if self.info.nvml.is_ok() {
            self.seen = self.seen.max(self.info.count());
        }
    }

    /// Each GPU's utilization now, for the `Stalled` Event.
    pub(super) fn utilization(&mut self) -> Vec<u32> {
        self.probe.utilization()
    }

    /// Starts the NVML event thread (XID errors, a lost GPU).
    pub(super) fn watch_events(&mut self) {
        let (tx, rx) = unbounded_channel();
        gpu_events::spawn(self.lib.clone(), tx, self.events_stop.clone());
        self.events = Some(rx);
    }

    pub(super) fn stop_events(&mut self) {
        self.events_stop.store(true, Ordering::Relaxed);
        self.events = None;
    }

    /// The next NVML event, or never when the thread is not running.
    pub(super) async fn next_event(&mut self) -> Option<GpuEvent> {
        match &mut self.events {
            Some(rx) => {
                let ev = rx.recv().await;
                if ev.is_none() {
                    // The thread ended (no NVML, or a lost GPU).
                    self.events = None;
                }
                ev
            }
            None => std::future::pending().await,
        }
    }

    /// Whether this reporter has GPUs of its own to speak of: NVML showed some (now or
    /// before: `seen` never falls), or the event thread said they were lost. GPUs that
    /// were seen and are gone stay its own, so that their loss is announced (GPULost,
    /// and GPUUnavailable or GPUCountMismatch against the limit): a sidecar that took a
    /// probe showing none for "no GPU of its own" reported the count `unknown` from
    /// then on and never announced the loss, whenever its probe saw it before NVML's
    /// event thread did, or alone (no event watch, NVML failing as a whole).
    pub(super) fn own(&self) -> bool {
        self.seen > 0 || self.lost.is_some()
    }

    /// Whether the event thread runs but has not yet said which GPUs it watches.
    pub(super) fn registering(&self) -> bool {
        self.events.is_some() && self.watch.is_none()
    }
}

impl Engine {
    /// One XID error is one Warning Event and one count; a lost GPU is announced by
    /// the next evaluation.
    pub(super) fn on_gpu_event(&mut self, ev: GpuEvent) {
        match ev {
            GpuEvent::Watch(w) => {
                self.metrics.gpu_xid_watched.set(w.watched.len() as i64);
                self.probes.gpus.watch = Some(w);
            }
            GpuEvent::Xid(e) => {
                let n = self.probes.gpus.xids.record(e.clone());
                warn!(count = n, "{}", e.message());
                self.metrics
                    .gpu_xid_errors
                    .get_or_create(&observations::xid_label(&e, self.probes.gpus.xids.kept(&e)))
                    .inc();
                self.record(Event::warning(Reason::GpuXidError, e.message()), true);
            }
            GpuEvent::Lost { why } => {
                self.probes.gpus.lost = Some(why);
                self.probes.gpus.events = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::probe::gpu::{GpuDevice, Unavailable};

    fn showing(n: u32) -> GpuInfo {
        GpuInfo {
            devices: (0..n)
                .map(|i| GpuDevice {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "Fake GPU".into(),
                    memory_total_bytes: 16 << 30,
                    mig: None,
                })
                .collect(),
            driver: None,
            nvml: Ok(()),
            faulty: Vec::new(),
        }
    }

    /// GPUs that were seen and are gone are still this reporter's own: their loss is
    /// announced (GPULost), not hidden as a count the sidecar cannot tell.
    #[test]
    fn gpus_seen_once_stay_own_when_nvml_shows_none() {
        let mut g = Gpus::new(None);
        assert!(!g.own(), "nothing probed yet");
        g.info = GpuInfo::unavailable(Unavailable::LibraryNotFound {
            lib: "libnvidia-ml.so.1".into(),
            why: "not found".into(),
        });
        assert!(!g.own(), "a sidecar without NVML has no GPU of its own");
        g.info = showing(4);
        g.seen = 4;
        assert!(g.own());
        // NVML fails after it worked ("GPU is lost" for the count, or "Failed to
        // initialize NVML: Unknown Error" once the device nodes are gone).
        g.info = GpuInfo::unavailable(Unavailable::QueryFailed {
            why: "GPU is lost".into(),
        });
        assert!(g.own());
        // NVML answers but every GPU's own queries fail.
        g.info = showing(0);
        assert!(g.own());
        // The event thread said so before any probe showed a GPU.
        let mut g = Gpus::new(None);
        g.lost = Some("NVML reports the GPU is lost".into());
        assert!(g.own());
    }
}
