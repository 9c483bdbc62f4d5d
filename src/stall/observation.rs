//! CMD's progress as exec hands it over: the one shape that exec writes for the sidecar
//! (`exec.json`), the sidecar publishes (`trainlet.io/progress`), and peers read.

use serde::{Deserialize, Deserializer, Serialize};

use super::progress::{Metric, Reported};

/// CMD's progress as exec watches it, for the sidecar to publish
/// (`trainlet.io/progress`, the `Stalled` Event, the progress metrics).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressObservation {
    /// The last progress, in ms since the epoch; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// The last step a matching line gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<f64>,
    /// CMD makes no progress now (`--stall-after`).
    pub stalled: bool,
    /// CMD has shown no progress since it started: no stall by itself (the ranks that
    /// never print).
    #[serde(default)]
    pub silent: bool,
    /// Since when CMD is silent, while stalled: its last progress, or its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Stalls since exec started; each is one `Stalled` Event.
    pub stalls: u64,
    /// The restarts of CMD by exec, whatever asked for them (a stall, a peer
    /// change, a failure).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u64,
    /// `--stall-after`, in ms, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_ms: Option<u64>,
    /// The last stall's note (the Event's text).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// What CMD last reported through the Kubeflow progress endpoint.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict"
    )]
    pub reported: Option<Reported>,
    /// When CMD's current run started (ms since the epoch), for the peers' restart
    /// barrier (`--on-failure restart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// CMD is stopped for a restart and waits for every rank to stop its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub down: bool,
    /// CMD's last failure that asks the job for a restart (`--on-failure restart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<FailedObservation>,
    /// Where CMD's ranks were at the last capture of their Python stacks (a stall of
    /// this pod or of the job): each place once, in rank order, at most
    /// [`crate::stacks::summary::MAX_PLACES`] ([`crate::stacks::summary::places`]).
    #[serde(rename = "where", default, skip_serializing_if = "Vec::is_empty")]
    pub stuck_at: Vec<String>,
}

/// For serde: a count of zero is left out.
pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A failure of CMD that asks every rank of the job to restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedObservation {
    /// When CMD ended, in ms since the epoch.
    pub since_ms: u64,
    /// The pod, its task and rank, how CMD ended and its root cause.
    pub note: String,
}

/// `reported` as the sidecar reads it from exec: a field this version does not write,
/// in the report or in one of its metrics, is refused, as every unknown field of the
/// handover is. [`Reported`] itself takes unknown fields: it is flattened into
/// `trainlet.io/progress`, which peers of another version read, and a peer that could
/// not read it would miss a stall. The struct literal below stops compiling when
/// `Reported` gains a field, so the two cannot drift apart.
fn strict<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Reported>, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        #[serde(default)]
        percent: Option<u8>,
        #[serde(default)]
        eta_seconds: Option<u32>,
        #[serde(default)]
        metrics: Vec<StrictMetric>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct StrictMetric {
        name: String,
        value: String,
    }
    let Some(Strict {
        percent,
        eta_seconds,
        metrics,
    }) = Option::<Strict>::deserialize(d)?
    else {
        return Ok(None);
    };
    Ok(Some(Reported {
        percent,
        eta_seconds,
        metrics: metrics
            .into_iter()
            .map(|StrictMetric { name, value }| Metric { name, value })
            .collect(),
    }))
}
