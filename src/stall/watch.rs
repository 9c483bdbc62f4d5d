//! What exec's copy threads share with the agent: the progress they saw in CMD's
//! output, and the heartbeat the agent saw, in one cell.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::progress::{Pattern, Progress, Reported};

/// What the copy threads share with the reporter.
#[derive(Debug, Default)]
pub struct Watch {
    pub pattern: Pattern,
    pub progress: Mutex<Progress>,
}

impl Watch {
    pub fn new(pattern: Pattern) -> Arc<Watch> {
        Arc::new(Watch {
            pattern,
            progress: Mutex::new(Progress::default()),
        })
    }

    /// The last progress, as of now.
    pub fn progress(&self) -> Progress {
        self.progress.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// A report through the Kubeflow endpoint, at `now`.
    pub fn report(&self, reported: Reported, step: Option<f64>, now: SystemTime) {
        if let Ok(mut p) = self.progress.lock() {
            p.on_report(reported, step, now);
        }
    }

    /// The heartbeat file changed, as exec saw at `now`.
    pub fn heartbeat(&self, now: SystemTime) {
        if let Ok(mut p) = self.progress.lock() {
            p.on_heartbeat(now);
        }
    }
}
