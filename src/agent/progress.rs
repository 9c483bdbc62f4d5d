//! The reporter's side of the progress watch ([`crate::stall::progress`]).
//!
//! exec: every `--interval` it looks at the heartbeat file and CMD's CPU time, checks
//! for a stall, and on one writes the `Stalled` Event's note (what CMD did over the
//! window: CPU, GPU utilization) and counts it; it acts on a stall (its own, or a
//! peer's from the peer watch or `peers.json`) through the lifecycle. The sidecar
//! publishes what exec handed over. Either publishes `trainlet.io/progress` and the
//! progress metrics.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Engine;
use crate::handover::observation::{MAX_TEXT, ProgressObservation};
use crate::metrics::ContainerLabel;
use crate::stall::peers::annotation;
use crate::stall::progress::{Progress, Reported};
use crate::stall::watching::Watching;

impl Engine {
    /// `standing` (stalled, silent): `None` without `--stall-after`, when nothing is
    /// ever called stalled and `trainlet_stalled` and `trainlet_silent` have no series.
    pub(super) fn set_progress_metrics(&self, p: &Progress, standing: Option<(bool, bool)>) {
        let label = ContainerLabel {
            container: self.container_name(),
        };
        if let Some((stalled, silent)) = standing {
            self.metrics
                .progress
                .stalled
                .get_or_create(&label)
                .set(i64::from(stalled));
            self.metrics
                .progress
                .silent
                .get_or_create(&label)
                .set(i64::from(silent));
        }
        if let Some(at) = p.at {
            let secs = at
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.metrics
                .progress
                .last_progress
                .get_or_create(&label)
                .set(secs);
        }
        if let Some(step) = p.step {
            self.metrics
                .progress
                .progress_step
                .get_or_create(&label)
                .set(step);
        }
        self.set_reported_metrics(&label, p.reported.as_ref());
    }

    /// The last report through the Kubeflow endpoint: its percentage, ETA and numeric
    /// metrics (a value that is no number has no series), in place of the report
    /// before; none before the first (a restarted exec's sidecar keeps no old ones).
    fn set_reported_metrics(&self, label: &ContainerLabel, r: Option<&Reported>) {
        let none = Reported::default();
        let r = r.unwrap_or(&none);
        let numbers: Vec<(&str, f64)> = r
            .metrics
            .iter()
            .filter_map(|m| {
                let v = m.value.trim().parse::<f64>().ok()?;
                v.is_finite().then_some((m.name.as_str(), v))
            })
            .collect();
        self.metrics
            .progress
            .set_reported(&label.container, r.percent, r.eta_seconds, &numbers);
    }

    /// `trainlet.io/progress` as of now, for the annotations: exec's own progress
    /// where it publishes, else (the sidecar) what exec handed over, whose metrics it
    /// serves too.
    pub(super) fn progress_annotation(&mut self) -> Option<String> {
        let o = match (self.own_progress(), self.role.inbox()) {
            (Some(o), _) if !self.role.hands_over() => o,
            (_, Some(inbox)) => {
                let o = inbox.fresh(SystemTime::now())?.progress.clone()?;
                let p = Progress {
                    at: o.at_ms.map(crate::time::from_ms),
                    step: o.step,
                    reported: o.reported.clone(),
                    ..Progress::default()
                };
                self.set_progress_metrics(&p, o.after_ms.map(|_| (o.stalled, o.silent)));
                o
            }
            _ => return None,
        };
        let after = o.after_ms.map(Duration::from_millis);
        let own = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.name.as_deref());
        let relayed = self
            .role
            .peers()
            .map(|p| p.to_relay(own))
            .unwrap_or_default();
        let a = annotation(&o, self.progress.as_ref(), after, &relayed);
        let text = serde_json::to_string(&a).expect("plain data");
        self.progress = Some(a);
        Some(text)
    }
}

impl Engine {
    /// exec's progress as it publishes it or hands it over: the stall watch's, and its
    /// run of CMD for the group restart (`--on-failure restart`); `None` with neither.
    pub(super) fn own_progress(&self) -> Option<ProgressObservation> {
        let e = self.role.exec()?;
        let mut o = match &e.watching {
            Some(w) => observation(w),
            None if e.group.on() => ProgressObservation::default(),
            None => return None,
        };
        e.group.fill(&mut o);
        o.restarts = e.restarts;
        Some(o)
    }
}

/// exec's progress as it hands it over, its note bounded.
pub(super) fn observation(w: &Watching) -> ProgressObservation {
    let mut o = w.observation();
    o.note = crate::publish::truncate(&o.note, MAX_TEXT);
    o
}
