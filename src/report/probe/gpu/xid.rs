//! GPU XID errors, as NVML's event API reports them: what the common ones mean, which
//! make a GPU unusable until it is reset (those turn the pod `degraded`), and a ledger
//! that counts every occurrence, so that repeats are not lost the way a "last value"
//! gauge loses them.
//!
//! Meanings follow NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors): the
//! critical ones are those whose recovery is a GPU reset or a node drain.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What an XID means, for the ones people meet most; `None` for the rest.
pub fn meaning(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup, due to a previous error",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => return None,
    })
}

/// Whether the GPU needs a reset (or the node a drain) after this XID.
pub fn is_critical(xid: u64) -> bool {
    matches!(xid, 48 | 62 | 64 | 74 | 79 | 95 | 119 | 120 | 140)
}

/// One XID error on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct XidError {
    pub gpu: u32,
    pub uuid: String,
    pub xid: u64,
}

impl XidError {
    /// `GPU 2 (GPU-…) reported XID 79 (GPU has fallen off the bus)`.
    pub fn message(&self) -> String {
        let what = meaning(self.xid)
            .map(|m| format!(" ({m})"))
            .unwrap_or_default();
        format!(
            "GPU {} ({}) reported XID {}{what}",
            self.gpu, self.uuid, self.xid
        )
    }
}

/// The most distinct (GPU, XID) pairs counted each on its own: 8 GPUs with 8 kinds of
/// XID each. A node has a handful of GPUs and sees a few kinds of XID; the training
/// container, whose `trainlet exec` hands its XIDs over, could invent a new GPU UUID
/// for every one, and each pair is a metric series and a report entry.
pub const MAX_KEYS: usize = 64;

/// Every XID seen since trainlet started, counted by GPU and XID; past [`MAX_KEYS`]
/// pairs, new pairs are counted together in `other`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct XidLedger {
    pub counts: BTreeMap<XidError, u64>,
    /// Occurrences of pairs beyond [`MAX_KEYS`].
    pub other: u64,
}

impl XidLedger {
    /// Counts one occurrence; returns how many of this GPU and XID there have been.
    pub fn record(&mut self, e: XidError) -> u64 {
        self.add(e, 1)
    }

    /// Counts `n` occurrences; returns the pair's count, or `other`'s when the pair is
    /// beyond [`MAX_KEYS`] (then [`XidLedger::kept`] is false for it).
    pub fn add(&mut self, e: XidError, n: u64) -> u64 {
        if self.counts.len() >= MAX_KEYS && !self.counts.contains_key(&e) {
            self.other = self.other.saturating_add(n);
            return self.other;
        }
        let c = self.counts.entry(e).or_insert(0);
        *c = c.saturating_add(n);
        *c
    }

    /// Whether the pair is counted on its own.
    pub fn kept(&self, e: &XidError) -> bool {
        self.counts.contains_key(e)
    }

    /// The critical ones, each once: why the pod is degraded.
    pub fn critical(&self) -> impl Iterator<Item = &XidError> {
        self.counts.keys().filter(|e| is_critical(e.xid))
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum::<u64>() + self.other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(gpu: u32, xid: u64) -> XidError {
        XidError {
            gpu,
            uuid: format!("GPU-{gpu}"),
            xid,
        }
    }

    #[test]
    fn pairs_past_the_cap_are_counted_together() {
        let mut l = XidLedger::default();
        for g in 0..MAX_KEYS as u32 {
            l.record(xid(g, 79));
        }
        let new = xid(1000, 79);
        assert_eq!(l.record(new.clone()), 1);
        assert_eq!(l.add(xid(1001, 13), 5), 6);
        assert!(!l.kept(&new));
        assert_eq!(l.counts.len(), MAX_KEYS);
        assert_eq!(l.other, 6);
        assert_eq!(l.total(), MAX_KEYS as u64 + 6);
        // A pair already kept is still counted on its own.
        assert_eq!(l.record(xid(3, 79)), 2);
    }

    #[test]
    fn repeats_are_counted_and_critical_ones_listed_once() {
        let mut l = XidLedger::default();
        assert_eq!(l.record(xid(2, 79)), 1);
        assert_eq!(l.record(xid(2, 79)), 2);
        assert_eq!(l.record(xid(0, 13)), 1);
        assert_eq!(l.total(), 3);
        assert_eq!(l.critical().collect::<Vec<_>>(), [&xid(2, 79)]);
    }

    #[test]
    fn messages_name_the_gpu_and_the_meaning() {
        assert_eq!(
            xid(2, 79).message(),
            "GPU 2 (GPU-2) reported XID 79 (GPU has fallen off the bus)"
        );
        assert_eq!(xid(0, 1234).message(), "GPU 0 (GPU-0) reported XID 1234");
        assert!(is_critical(48) && is_critical(79) && !is_critical(13) && !is_critical(31));
    }
}
