//! The loops of trainlet wait on many sources at once in one `select!`, and several of
//! them may be absent (no peer watch without `cluster.json`, no NVML events without
//! NVML, no inotify on some volumes). [`next_or_pending`] makes an absent source a
//! branch that never fires, instead of one copy of that match per source.

use futures::{Stream, StreamExt};

/// The next item of `stream`, or never (pending forever) when there is none.
pub async fn next_or_pending<S: Stream + Unpin>(stream: &mut Option<S>) -> Option<S::Item> {
    match stream {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}
