//! One evaluation: the latest observations through the pure [`State`], then the
//! metrics, the Events and the annotations that changed.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use tracing::{info, warn};

use super::{Engine, Mode};
use crate::flags;
use crate::metrics::{ContainerLabel, GpuLabel, PortLabel};
use crate::peers::drift as peer_watch;
use crate::report::document::{Health, Report};
use crate::report::pod;
use crate::report::probe::gpu::{Expected, GpuStatus};
use crate::report::probe::ports::PortState;
use crate::report::state::{Observed, Step};

impl Engine {
    /// Builds the report from the latest observations, updates the metrics, and
    /// schedules what changed.
    pub(super) fn evaluate(&mut self) {
        let container = self.container_name();
        let expected = pod::expected_gpus(self.cfg.probes.expect_gpus, self.training());
        let mut sources = self.probes.oom.sources();
        if self.link.is_some() {
            sources.push("pod status".into());
        }
        let mut errors = self.probe_errors();
        // A sidecar reports the GPUs and ports the training container's trainlet exec
        // observed; from its own NVML only when it has (or had: their loss is news)
        // GPUs of its own; else the count is unknown, which is no problem to announce.
        let now = SystemTime::now();
        let exec_gpu;
        let mut ports = Cow::Borrowed(&self.probes.listeners.states);
        let mut unknown = None;
        let (gpu, gpus_seen, gpu_lost, xid_watch) =
            match self.role.inbox().and_then(|i| i.fresh(now)) {
                Some(o) => {
                    exec_gpu = o.gpu_info();
                    ports.to_mut().extend(o.port_states());
                    for (k, v) in &o.errors {
                        errors.insert(format!("exec {k}"), v.clone());
                    }
                    sources.push(format!(
                        "trainlet exec in container {container} (observations)"
                    ));
                    (
                        &exec_gpu,
                        o.gpu.seen,
                        o.gpu.lost.as_deref(),
                        o.gpu.xid_watch.as_ref(),
                    )
                }
                None => {
                    unknown = self.gpus_unknown(now);
                    (
                        &self.probes.gpus.info,
                        self.probes.gpus.seen,
                        self.probes.gpus.lost.as_deref(),
                        self.probes.gpus.watch.as_ref(),
                    )
                }
            };
        let mark = self.exec_mark();
        let unpublished = self
            .republish
            .failed()
            .or_else(|| self.outbox.unpublished())
            .map(str::to_string);
        let step = self.state.step(Observed {
            mode: self.role.mode().as_str(),
            container: &container,
            since: &self.clock.since,
            gpu,
            expected: expected.as_ref(),
            ports: ports.as_ref(),
            oom_total: self.probes.oom.ledger.total,
            oom_by_container: &self.probes.oom.ledger.by_container,
            oom_recent: &self.probes.oom.ledger.kills,
            oom_sources: sources,
            errors,
            gpus_seen,
            gpu_lost,
            xids: &self.probes.gpus.xids,
            xid_watch,
            gpu_unknown: unknown.as_deref(),
            exec: mark.as_ref(),
            // A pod on its way out (deleted, or stopped by its Job's success policy)
            // says nothing of its peers going too: the job is ending, not breaking.
            cluster: self
                .role
                .peers()
                .and_then(|p| p.drift.as_deref())
                .filter(|_| !self.view.deleting()),
            unpublished: unpublished.as_deref(),
        });
        self.update_metrics(&step.report, expected.as_ref(), &ports, container);
        self.publish(step);
        self.schedule();
    }

    /// A sidecar without GPUs of its own and without fresh observations from exec:
    /// why the count is unknown.
    fn gpus_unknown(&self, now: SystemTime) -> Option<String> {
        if self.role.mode() != Mode::Sidecar || self.probes.gpus.own() {
            return None;
        }
        Some(match self.role.inbox() {
            Some(i) => i.why_unknown(&self.probes.gpus.info.nvml_status(), now),
            None => format!(
                "this sidecar has no GPU of its own (NVML: {}) and no observations from trainlet exec (--{})",
                self.probes.gpus.info.nvml_status(),
                flags::OBSERVATIONS
            ),
        })
    }

    /// One evaluation's outcome into the outbox: its Events, and the annotations (the
    /// report, the resolution, the progress) once the first report need not wait.
    fn publish(&mut self, step: Step) {
        if let Some(summary) = &step.summary {
            info!(devices = ?step.report.gpu.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), "report: {summary}");
        }
        for event in step.events {
            warn!(reason = event.reason.as_str(), "{}", event.note);
            self.record(event, false);
        }
        if step.urgent {
            self.outbox.hurry();
        }
        if self.first_report_waits() {
            return;
        }
        let mut annotations = step.annotations;
        if let Some(text) = self.resolution() {
            annotations.insert(crate::cluster::published::ANNOTATION.into(), Some(text));
        }
        if let Some(text) = self.progress_annotation() {
            annotations.insert(crate::publish::keys::PROGRESS.into(), Some(text));
        }
        self.outbox.want(annotations);
        self.once.evaluated = true;
    }

    /// The first report waits (a little) for the peer watch's first list, so that it
    /// already says whether the cluster is current, and for NVML's event registration,
    /// so that it says which GPUs are watched: one patch, not two.
    fn first_report_waits(&self) -> bool {
        let peers_pending = self.role.peers().is_some_and(|p| p.drift.is_none())
            && self.clock.at.elapsed() < peer_watch::FIRST_LIST_WAIT;
        let gpus_pending = self.probes.gpus.registering()
            && self.clock.at.elapsed() < super::gpu::REGISTRATION_WAIT;
        peers_pending || gpus_pending
    }

    pub(super) fn schedule(&mut self) {
        let settled = self.outbox.schedule(Instant::now());
        // Without a link (exec outside a pod) the metrics are the report.
        if self.once.evaluated && (settled || self.link.is_none()) {
            self.ready.set();
        }
    }

    /// The gauges from a new report. The training container's OOM counter exists from
    /// the start, at 0, so that rate() and alerts work before the first kill.
    fn update_metrics(
        &self,
        report: &Report,
        expected: Option<&Expected>,
        ports: &BTreeMap<u16, PortState>,
        container: String,
    ) {
        let m = &self.metrics;
        m.gpus.set(match report.gpu.status {
            GpuStatus::Unknown => -1,
            _ => i64::from(report.gpu.count),
        });
        m.gpus_expected
            .set(expected.map_or(0, |e| i64::from(e.count)));
        m.health.set(i64::from(report.health == Health::Ok));
        if let Some(c) = &report.cluster {
            m.cluster_stale.set(i64::from(!c.is_current()));
        }
        // No await between clear and set: a scrape on this thread never sees a gap.
        m.gpu_info.clear();
        for d in &report.gpu.devices {
            m.gpu_info
                .get_or_create(&GpuLabel {
                    gpu: d.index.to_string(),
                    uuid: d.uuid.clone(),
                    model: d.name.clone(),
                })
                .set(1);
        }
        drop(m.oom_kills.get_or_create(&ContainerLabel { container }));
        // No await between clear and set: a scrape on this thread never sees a gap.
        m.port_conflict.clear();
        for (port, state) in ports.iter() {
            m.port_conflict
                .get_or_create(&PortLabel {
                    port: port.to_string(),
                })
                .set(i64::from(state.is_conflict()));
        }
    }
}
