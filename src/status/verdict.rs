//! The one-line verdict of `status`: what the Job or JobSet says of itself, or what its
//! pods say together (running, waiting, stalled, failed), naming the pods that decide
//! it.

use super::{CELL_MAX, Owner, PodRow, State, VERDICT_PODS_MAX, bound};
use crate::cluster::drift::ClusterStatus;

/// The verdict that the Job or JobSet itself gives, before its pods: suspended (not
/// admitted), failed or complete. `None` when it is running and its pods tell.
pub fn owner_verdict(owner: &Owner, rows: &[PodRow]) -> Option<(State, String)> {
    let what = &owner.what;
    let left = match rows.len() {
        0 => String::new(),
        1 => "; 1 pod left".to_string(),
        n => format!("; {n} pods left"),
    };
    if let Some(why) = &owner.failed {
        return Some((
            State::Failing,
            format!("{what}: failing: failed: {why}{left}"),
        ));
    }
    if owner.complete {
        // Its pods all there and succeeded: they say so, as a Job whose pods are read.
        let (state, line) = verdict(what, rows);
        if state == State::Completed {
            return Some((state, line));
        }
        return Some((State::Completed, format!("{what}: completed{left}")));
    }
    if owner.suspended {
        let queue = if owner.queue.is_empty() {
            String::new()
        } else {
            format!(" in Kueue queue {}", owner.queue)
        };
        return Some((
            State::NotAdmitted,
            format!("{what}: not admitted: suspended{queue} (spec.suspend: true){left}"),
        ));
    }
    None
}

/// The job's state and its line: the worst state any pod is in, and the pods that put
/// it there (the first few of them, and how many more).
pub fn verdict(what: &str, rows: &[PodRow]) -> (State, String) {
    let n = rows.len();
    if n == 0 {
        return (State::Empty, format!("{what}: no pods match"));
    }
    let names = |pick: &dyn Fn(&PodRow) -> Option<String>| -> Vec<String> {
        rows.iter().filter_map(pick).collect()
    };
    let failed = names(&|r: &PodRow| {
        r.phase
            .starts_with("Failed")
            .then(|| format!("{} {}", r.pod, r.phase))
    });
    if !failed.is_empty() {
        return (
            State::Failing,
            format!(
                "{what}: failing: {} of {n} pods failed: {}",
                failed.len(),
                some_of(&failed)
            ),
        );
    }
    let succeeded = rows.iter().filter(|r| r.phase == "Succeeded").count();
    if succeeded == n {
        return (
            State::Completed,
            format!("{what}: completed: {n} pods succeeded"),
        );
    }
    let degraded = names(&|r: &PodRow| {
        let stale = ClusterStatus::parse(&r.cluster).is_some_and(|c| !c.is_current());
        (r.health == "degraded" || stale || r.stalled).then(|| {
            let mut why = r.reasons.clone();
            if stale && !why.iter().any(|w| w.starts_with("cluster")) {
                why.push(format!("cluster {}", r.cluster));
            }
            if r.stalled {
                why.push(r.progress.clone());
            }
            format!("{} ({})", r.pod, bound(&why.join("; "), CELL_MAX))
        })
    });
    if !degraded.is_empty() {
        return (
            State::Degraded,
            format!("{what}: degraded: {}", some_of(&degraded)),
        );
    }
    let waiting = names(&|r: &PodRow| {
        (r.phase != "Running" && r.phase != "Succeeded").then(|| format!("{} {}", r.pod, r.phase))
    });
    if !waiting.is_empty() {
        return (
            State::Starting,
            format!(
                "{what}: starting: {} of {n} pods running; waiting for {}",
                n - waiting.len() - succeeded,
                some_of(&waiting)
            ),
        );
    }
    let running = n - succeeded;
    let current = |r: &PodRow| ClusterStatus::parse(&r.cluster).is_some_and(|c| c.is_current());
    let cluster = if rows.iter().any(current) {
        ", cluster current"
    } else {
        ""
    };
    (
        State::Healthy,
        format!("{what}: healthy: {running} pods running{cluster}"),
    )
}

/// At most [`VERDICT_PODS_MAX`] of `items`, joined, and how many more there are.
fn some_of(items: &[String]) -> String {
    let shown = items.iter().take(VERDICT_PODS_MAX).cloned();
    let mut out: Vec<String> = shown.collect();
    if items.len() > VERDICT_PODS_MAX {
        out.push(format!("and {} more", items.len() - VERDICT_PODS_MAX));
    }
    out.join(", ")
}
