//! The reason of every Event trainlet sends, spelled once: monitoring matches on these
//! (`kubectl get events --field-selector reason=…`, the alert rules), so each is a
//! contract, and each Event is built from this type, never from a literal.

/// An Event's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    // init
    PeersResolved,
    PeerWaitTimeout,
    ClusterTooLarge,
    ClusterNotPublished,
    PeerUnreachable,
    // the reporters' own annotations
    AnnotationsTooLarge,
    // the cluster after the start
    PeerLost,
    PeerReplaced,
    // the training container
    OomKill,
    PortConflict,
    Stalled,
    Restarting,
    // the GPUs
    GpuCountMismatch,
    GpuUnavailable,
    GpuLost,
    GpuResetRequired,
    GpuXidError,
}

impl Reason {
    /// The reason as the API server stores it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::PeersResolved => "PeersResolved",
            Reason::PeerWaitTimeout => "PeerWaitTimeout",
            Reason::ClusterTooLarge => "ClusterTooLarge",
            Reason::ClusterNotPublished => "ClusterNotPublished",
            Reason::PeerUnreachable => "PeerUnreachable",
            Reason::AnnotationsTooLarge => "AnnotationsTooLarge",
            Reason::PeerLost => "PeerLost",
            Reason::PeerReplaced => "PeerReplaced",
            Reason::OomKill => "OOMKill",
            Reason::PortConflict => "PortConflict",
            Reason::Stalled => "Stalled",
            Reason::Restarting => "Restarting",
            Reason::GpuCountMismatch => "GPUCountMismatch",
            Reason::GpuUnavailable => "GPUUnavailable",
            Reason::GpuLost => "GPULost",
            Reason::GpuResetRequired => "GPUResetRequired",
            Reason::GpuXidError => "GPUXidError",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason.
    const ALL: [Reason; 17] = [
        Reason::PeersResolved,
        Reason::PeerWaitTimeout,
        Reason::ClusterTooLarge,
        Reason::ClusterNotPublished,
        Reason::PeerUnreachable,
        Reason::AnnotationsTooLarge,
        Reason::PeerLost,
        Reason::PeerReplaced,
        Reason::OomKill,
        Reason::PortConflict,
        Reason::Stalled,
        Reason::Restarting,
        Reason::GpuCountMismatch,
        Reason::GpuUnavailable,
        Reason::GpuLost,
        Reason::GpuResetRequired,
        Reason::GpuXidError,
    ];

    /// Each reason is a CamelCase word of its own, and no two are spelled alike.
    #[test]
    fn every_reason_is_spelled_once_in_camel_case() {
        let all: Vec<&str> = ALL.iter().map(|r| r.as_str()).collect();
        let mut unique = all.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), all.len());
        for r in all {
            assert!(r.chars().next().unwrap().is_ascii_uppercase(), "{r}");
            assert!(r.chars().all(|c| c.is_ascii_alphabetic()), "{r}");
        }
        assert_eq!(Reason::OomKill.to_string(), "OOMKill");
    }
}
