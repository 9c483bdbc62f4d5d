//! Prometheus metrics and the admin HTTP server of the reporters.
//!
//! The metrics live in one prometheus-client registry, encoded for each scrape; the
//! admin server that serves them, with `/livez` and `/readyz`, is [`serve`].

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use thiserror::Error;

use crate::Code;

mod serve;

pub use serve::{
    HEADER_READ_TIMEOUT, MAX_BUFFER, MAX_CONNECTIONS, Readiness, bind, bind_or_any_port, serve,
    to_classic_text,
};

/// The OpenMetrics content type that Prometheus negotiates.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format, for clients that do not ask for OpenMetrics.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl MetricsError {
    /// The address is taken: a port conflict, like any other.
    pub fn code(&self) -> Code {
        Code::PortConflict
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabel {
    pub container: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabel {
    pub port: String,
}

/// One GPU, labelled as dcgm-exporter labels its series (`gpu`, `UUID`, `modelName`
/// there), so that trainlet's series can be joined with dcgm-exporter's on the UUID.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabel {
    pub gpu: String,
    pub uuid: String,
    pub model: String,
}

/// One GPU's XID: counted per GPU and XID, so repeats are not lost.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XidLabel {
    pub gpu: String,
    pub uuid: String,
    pub xid: String,
}

/// Why an observation from the training container was rejected.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

/// Every metric trainlet exports, registered once.
pub struct Metrics {
    registry: Registry,
    pub gpus: Gauge,
    pub gpus_expected: Gauge,
    pub gpu_info: Family<GpuLabel, Gauge>,
    pub gpu_xid_errors: Family<XidLabel, Counter>,
    pub gpu_xid_watched: Gauge,
    pub oom_kills: Family<ContainerLabel, Counter>,
    pub port_conflict: Family<PortLabel, Gauge>,
    pub health: Gauge,
    pub annotation_patches: Counter,
    pub api_errors: Counter,
    pub probes: Counter,
    pub admin_refused: Counter,
    pub observations: Counter,
    pub cluster_stale: Gauge,
    pub restarts: Counter,
    pub progress: ProgressMetrics,
    pub observations_rejected: Family<ReasonLabel, Counter>,
    pub events_dropped: Family<ReasonLabel, Counter>,
}

/// CMD's progress and stalls (`trainlet exec --stall-after`, `--progress-pattern`).
#[derive(Debug, Default)]
pub struct ProgressMetrics {
    pub last_progress: Family<ContainerLabel, Gauge<f64, AtomicU64>>,
    pub progress_step: Family<ContainerLabel, Gauge<f64, AtomicU64>>,
    pub stalled: Family<ContainerLabel, Gauge>,
    pub silent: Family<ContainerLabel, Gauge>,
    pub stalls: Counter,
    /// What CMD reports through the Kubeflow progress endpoint.
    pub reported_percent: Family<ContainerLabel, Gauge>,
    pub reported_eta: Family<ContainerLabel, Gauge>,
    pub reported_metric: Family<MetricLabel, Gauge<f64, AtomicU64>>,
    /// The names that have a series: at most [`MAX_REPORTED_NAMES`].
    reported_names: std::sync::Mutex<std::collections::HashSet<MetricLabel>>,
}

/// The most series of reported metrics: the names are CMD's to choose, and every new
/// one would be a series for as long as the process lives.
pub const MAX_REPORTED_NAMES: usize = 64;

impl ProgressMetrics {
    /// `container`'s last report, as series: its percentage, time remaining and
    /// numeric metrics (`(name, value)`). A report replaces the one before entirely,
    /// as in Trainer: a series it omits is removed, or a time remaining or a loss
    /// that CMD no longer reports would be read as current. A new name past
    /// [`MAX_REPORTED_NAMES`] series gets none.
    pub fn set_reported(
        &self,
        container: &str,
        percent: Option<u8>,
        eta_seconds: Option<u32>,
        metrics: &[(&str, f64)],
    ) {
        let label = ContainerLabel {
            container: container.to_string(),
        };
        for (family, value) in [
            (&self.reported_percent, percent.map(i64::from)),
            (&self.reported_eta, eta_seconds.map(i64::from)),
        ] {
            if let Some(v) = value {
                family.get_or_create(&label).set(v);
            } else {
                family.remove(&label);
            }
        }
        let Ok(mut names) = self.reported_names.lock() else {
            return;
        };
        names.retain(|l| {
            let kept = l.container != container || metrics.iter().any(|(n, _)| *n == l.name);
            if !kept {
                self.reported_metric.remove(l);
            }
            kept
        });
        for (name, value) in metrics {
            let label = MetricLabel {
                container: container.to_string(),
                name: name.to_string(),
            };
            if !names.contains(&label) && names.len() >= MAX_REPORTED_NAMES {
                continue;
            }
            names.insert(label.clone());
            self.reported_metric.get_or_create(&label).set(*value);
        }
    }
}

/// A metric CMD reported by name (at most 16 names a report).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MetricLabel {
    pub container: String,
    pub name: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("trainlet");
        let m = Metrics {
            gpus: Gauge::default(),
            gpus_expected: Gauge::default(),
            gpu_info: Family::default(),
            gpu_xid_errors: Family::default(),
            gpu_xid_watched: Gauge::default(),
            oom_kills: Family::default(),
            port_conflict: Family::default(),
            health: Gauge::default(),
            annotation_patches: Counter::default(),
            api_errors: Counter::default(),
            probes: Counter::default(),
            admin_refused: Counter::default(),
            observations: Counter::default(),
            cluster_stale: Gauge::default(),
            restarts: Counter::default(),
            progress: ProgressMetrics::default(),
            observations_rejected: Family::default(),
            events_dropped: Family::default(),
            registry: Registry::default(),
        };
        m.register_gpus(&mut registry);
        m.register_pod(&mut registry);
        m.register_job(&mut registry);
        m.register_handover(&mut registry);
        Metrics { registry, ..m }
    }

    /// The GPUs NVML sees, and their XID errors.
    fn register_gpus(&self, registry: &mut Registry) {
        registry.register(
            "gpus",
            "GPUs visible through NVML in the training container; -1 while unknown (a sidecar without GPUs or observations from trainlet exec)",
            self.gpus.clone(),
        );
        registry.register(
            "gpus_expected",
            "GPUs expected: the training container's nvidia.com/gpu limit or --expect-gpus (0 when none)",
            self.gpus_expected.clone(),
        );
        registry.register(
            "gpu_info",
            "1 for each GPU visible through NVML, by index, UUID and model",
            self.gpu_info.clone(),
        );
        registry.register(
            "gpu_xid_errors",
            "XID errors NVML reported since trainlet started, by GPU and XID; past 64 distinct GPU and XID pairs, the rest are counted with gpu, uuid and xid \"other\"",
            self.gpu_xid_errors.clone(),
        );
        registry.register(
            "gpu_xid_watched",
            "GPUs NVML's event API watches for XID errors (0 until registered, and where NVML registers none: counts and health are still polled)",
            self.gpu_xid_watched.clone(),
        );
    }

    /// The pod's own health: OOM kills, ports, and the reporter's work with the API server.
    fn register_pod(&self, registry: &mut Registry) {
        registry.register(
            "oom_kills",
            "OOM kills observed since trainlet started, by container",
            self.oom_kills.clone(),
        );
        registry.register(
            "port_conflict",
            "1 when a watched port is in conflict, else 0",
            self.port_conflict.clone(),
        );
        registry.register(
            "health",
            "1 when the pod is ok, 0 when degraded",
            self.health.clone(),
        );
        registry.register(
            "annotation_patches",
            "Annotation patches sent to the API server",
            self.annotation_patches.clone(),
        );
        registry.register(
            "api_errors",
            "Failed Kubernetes API calls (patches, Events, the pod watch)",
            self.api_errors.clone(),
        );
        registry.register(
            "probes",
            "Probes of the pod (GPUs, listening ports, OOM kills, the handover), one per --interval: a count that stops moving is a reporter that hangs",
            self.probes.clone(),
        );
        registry.register(
            "admin_connections_refused",
            "Admin connections closed at once because 1024 were already open",
            self.admin_refused.clone(),
        );
    }

    /// The job as exec sees it: its cluster, CMD's restarts and progress.
    fn register_job(&self, registry: &mut Registry) {
        registry.register(
            "cluster_stale",
            "1 while a task of the cluster this pod was given is lost or held by another pod (the peer watch), else 0",
            self.cluster_stale.clone(),
        );
        registry.register(
            "restarts",
            "Restarts of CMD by trainlet exec: --on-peer-change restart after a peer was lost or replaced, --on-stall restart after a stall",
            self.restarts.clone(),
        );
        registry.register(
            "last_progress_timestamp_seconds",
            "When CMD last made progress (trainlet exec --stall-after or --progress-pattern), by container",
            self.progress.last_progress.clone(),
        );
        registry.register(
            "progress_step",
            "The last step a --progress-pattern line gave, by container",
            self.progress.progress_step.clone(),
        );
        registry.register(
            "stalled",
            "1 while CMD is stalled: no progress for trainlet exec --stall-after, by container",
            self.progress.stalled.clone(),
        );
        registry.register(
            "silent",
            "1 while CMD has shown no progress since it started (trainlet exec --stall-after): a rank that never prints, which is no stall by itself; by container",
            self.progress.silent.clone(),
        );
        registry.register(
            "stalls",
            "Stalls of CMD: no progress for trainlet exec --stall-after",
            self.progress.stalls.clone(),
        );
        registry.register(
            "reported_progress_percent",
            "The progress percentage CMD last reported through the Kubeflow progress endpoint, by container",
            self.progress.reported_percent.clone(),
        );
        registry.register(
            "reported_remaining_seconds",
            "The estimated time remaining CMD last reported through the Kubeflow progress endpoint, by container",
            self.progress.reported_eta.clone(),
        );
        registry.register(
            "reported_metric",
            "A numeric metric CMD last reported through the Kubeflow progress endpoint, by container and name",
            self.progress.reported_metric.clone(),
        );
    }

    /// The handover from exec to the sidecar, the Event budget, and the build.
    fn register_handover(&self, registry: &mut Registry) {
        registry.register(
            "observations",
            "New versions of trainlet exec's observations the sidecar accepted",
            self.observations.clone(),
        );
        registry.register(
            "observations_rejected",
            "Observations from the training container the sidecar rejected, by reason (too-large, not-a-file, unreadable, malformed, invalid, restart-unexplained)",
            self.observations_rejected.clone(),
        );
        registry.register(
            "events_dropped",
            "Events not emitted because the Event budget (a burst of 10, then one per 6 s) was spent, by reason",
            self.events_dropped.clone(),
        );
        registry.register(
            "build",
            "trainlet's version",
            Info::new(VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
    }

    /// The OpenMetrics text of every metric, ending in `# EOF`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two hostNetwork pods on one node share the node's ports: the second reporter
    /// serves on another port, and says why, instead of exiting 6.
    #[tokio::test]
    async fn a_taken_metrics_port_falls_back_to_a_free_one() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let (l, taken) = bind_or_any_port(addr).unwrap();
        let got = l.local_addr().unwrap();
        assert_eq!(got.ip(), addr.ip());
        assert_ne!(got.port(), addr.port());
        let e = taken.expect("the taken port is reported");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot serve metrics on {addr}: ")),
            "{e}"
        );
        // A free port is bound as it is.
        drop(held);
        let (l, taken) = bind_or_any_port(addr).unwrap();
        assert_eq!((l.local_addr().unwrap(), taken.is_none()), (addr, true));
    }

    /// Each report replaces the last: what the new one omits has no series any more,
    /// and another container's series are its own.
    #[test]
    fn a_report_replaces_the_series_of_the_one_before() {
        let m = Metrics::new();
        let p = &m.progress;
        // Sorted: a family's series come in no fixed order.
        let series = |m: &Metrics| -> Vec<String> {
            let mut s: Vec<String> = m
                .encode()
                .lines()
                .filter(|l| l.starts_with("trainlet_reported_"))
                .map(String::from)
                .collect();
            s.sort();
            s
        };
        p.set_reported("other", Some(5), None, &[("loss", 2.0)]);
        p.set_reported(
            "trainer",
            Some(40),
            Some(u32::MAX),
            &[("loss", 0.25), ("acc", 0.5)],
        );
        p.set_reported("trainer", Some(50), None, &[("acc", 0.75)]);
        assert_eq!(
            series(&m),
            [
                "trainlet_reported_metric{container=\"other\",name=\"loss\"} 2.0",
                "trainlet_reported_metric{container=\"trainer\",name=\"acc\"} 0.75",
                "trainlet_reported_progress_percent{container=\"other\"} 5",
                "trainlet_reported_progress_percent{container=\"trainer\"} 50",
            ]
        );
        p.set_reported("trainer", None, None, &[]);
        p.set_reported("other", None, Some(7), &[]);
        assert_eq!(
            series(&m),
            ["trainlet_reported_remaining_seconds{container=\"other\"} 7"]
        );
    }

    #[test]
    fn metric_names_and_format() {
        let m = Metrics::new();
        m.gpus.set(4);
        m.oom_kills
            .get_or_create(&ContainerLabel {
                container: "trainer".into(),
            })
            .inc();
        m.port_conflict
            .get_or_create(&PortLabel {
                port: "8470".into(),
            })
            .set(1);
        m.gpu_info
            .get_or_create(&GpuLabel {
                gpu: "0".into(),
                uuid: "GPU-aaaa".into(),
                model: "NVIDIA H100 80GB HBM3".into(),
            })
            .set(1);
        let text = m.encode();
        for line in [
            "# TYPE trainlet_gpu_info gauge",
            "trainlet_gpu_info{gpu=\"0\",uuid=\"GPU-aaaa\",model=\"NVIDIA H100 80GB HBM3\"} 1",
            "# TYPE trainlet_gpus gauge",
            "trainlet_gpus 4",
            "trainlet_gpus_expected 0",
            "# TYPE trainlet_oom_kills counter",
            "trainlet_oom_kills_total{container=\"trainer\"} 1",
            "trainlet_port_conflict{port=\"8470\"} 1",
            "trainlet_health 0",
            "trainlet_annotation_patches_total 0",
            "trainlet_api_errors_total 0",
            "trainlet_probes_total 0",
            &format!(
                "trainlet_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn classic_text_names_families_like_their_samples() {
        let m = Metrics::new();
        m.annotation_patches.inc();
        let text = to_classic_text(&m.encode());
        for line in [
            "# HELP trainlet_annotation_patches_total Annotation patches sent to the API server.",
            "# TYPE trainlet_annotation_patches_total counter",
            "trainlet_annotation_patches_total 1",
            "# TYPE trainlet_build_info gauge",
            "# TYPE trainlet_gpus gauge",
            "trainlet_gpus 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("# EOF"));
        assert!(!text.contains("# TYPE trainlet_oom_kills counter"));
    }

    #[test]
    fn readiness_latches() {
        let r = Readiness::default();
        assert!(!r.is_ready());
        r.clone().set();
        assert!(r.is_ready());
    }
}
