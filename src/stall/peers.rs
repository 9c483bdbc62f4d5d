//! `trainlet.io/progress`: what a pod's reporter publishes of its CMD's progress
//! (`trainlet exec --stall-after`), and what its peers read from it: whether it is
//! stalled, and since when, so that every pod restarts once for one stall.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::observation::ProgressObservation;
use super::progress::Reported;
use crate::stall::group::{PeerFailure, PeerRun};
use crate::time;

/// `trainlet.io/progress`: the last progress (refreshed at most every
/// [`PUBLISH_EVERY`] while nothing else changes), the step, and whether CMD is stalled
/// and since when. Peers read `stalled` and `since` to restart for a stall once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Annotation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<f64>,
    pub stalled: bool,
    /// CMD has shown no progress since it started: published, never a stall by itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub silent: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(default)]
    pub stalls: u64,
    /// The restarts of CMD by exec (a stall, a peer change or a failure asked for
    /// them): what `trainlet status` counts with the containers' restarts.
    #[serde(default, skip_serializing_if = "super::observation::is_zero")]
    pub restarts: u64,
    /// The resolver pod of a coordinated job: the other pods' stalls, which its
    /// followers, watching it alone, would not see otherwise. At most
    /// [`MAX_RELAYED`], the earliest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relayed: Vec<Relayed>,
    /// What CMD last reported through the Kubeflow progress endpoint: `percent`,
    /// `eta_seconds`, `metrics`.
    #[serde(default, flatten)]
    pub reported: Reported,
    /// When CMD's current run started, to the millisecond: the restart barrier of
    /// `--on-failure restart` ([`crate::stall::group`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    /// CMD is stopped for a restart and waits for every rank to stop its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub down: bool,
    /// CMD's last failure that asks every rank to restart (`--on-failure restart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Failed>,
    /// Where CMD's ranks were at the last capture of their stacks, each place once:
    /// what `trainlet status` compares the pods of a stalled job by.
    #[serde(rename = "where", default, skip_serializing_if = "Vec::is_empty")]
    pub stuck_at: Vec<String>,
}

/// A failure that asks every rank of the job to restart: since when (to the
/// millisecond), and the pod's own words for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    pub since: String,
    pub note: String,
}

/// Another pod's stall, as the resolver pod relays it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relayed {
    pub pod: String,
    pub since: String,
    pub stalled: bool,
}

/// The most stalls a resolver pod relays.
pub const MAX_RELAYED: usize = 16;

/// How stale the published last progress may get while nothing else changes: the
/// annotation is a patch of the pod, and a job of a thousand pods that printed every
/// second must not patch them every second.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(60);

/// The annotation for `o`, keeping `previous`'s time of last progress unless it is
/// older than [`PUBLISH_EVERY`] (or half `--stall-after`, if shorter) or the stall
/// state changed.
pub fn annotation(
    o: &ProgressObservation,
    previous: Option<&Annotation>,
    stall_after: Option<Duration>,
    relayed: &[PeerStall],
) -> Annotation {
    let rfc = |t_ms: u64| time::rfc3339_seconds(time::from_ms(t_ms));
    let every = stall_after.map_or(PUBLISH_EVERY, |d| (d / 2).min(PUBLISH_EVERY));
    let fresh = Annotation {
        at: o.at_ms.map(rfc),
        step: o.step,
        stalled: o.stalled,
        silent: o.silent,
        // To the millisecond: peers compare it with when their CMD last started.
        since: o.since_ms.map(|t| time::rfc3339_millis(time::from_ms(t))),
        stalls: o.stalls,
        restarts: o.restarts,
        relayed: relayed
            .iter()
            .take(MAX_RELAYED)
            .map(|s| Relayed {
                pod: s.pod.clone(),
                since: time::rfc3339_millis(s.since),
                stalled: s.ongoing,
            })
            .collect(),
        reported: o.reported.clone().unwrap_or_default(),
        started: o.started_ms.map(|t| time::rfc3339_millis(time::from_ms(t))),
        down: o.down,
        failed: o.failed.as_ref().map(|f| Failed {
            since: time::rfc3339_millis(time::from_ms(f.since_ms)),
            note: f.note.clone(),
        }),
        stuck_at: o.stuck_at.clone(),
    };
    let Some(prev) = previous else {
        return fresh;
    };
    // A pod that goes from silent to making progress says so at once: the pod that
    // speaks for the job's silence reads it.
    if prev.stalled != fresh.stalled
        || prev.stalls != fresh.stalls
        || prev.restarts != fresh.restarts
        || prev.silent != fresh.silent
        || prev.relayed != fresh.relayed
        || prev.reported.percent != fresh.reported.percent
        || prev.started != fresh.started
        || prev.down != fresh.down
        || prev.failed != fresh.failed
        || prev.stuck_at != fresh.stuck_at
    {
        return fresh;
    }
    let prev_ms = prev
        .at
        .as_deref()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .map(time::to_ms);
    match (prev_ms, o.at_ms) {
        (Some(p), Some(now)) if now.saturating_sub(p) < every.as_millis() as u64 => prev.clone(),
        _ => fresh,
    }
}

/// The last progress a peer published (`at`), if any.
pub fn peer_progress(text: &str) -> Option<SystemTime> {
    let a: Annotation = serde_json::from_str(text).ok()?;
    humantime::parse_rfc3339(a.at.as_deref()?).ok()
}

/// A peer's last published stall, by pod name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerStall {
    pub pod: String,
    /// Since when it made no progress.
    pub since: SystemTime,
    /// Whether it is still stalled (`stalled` in the annotation).
    pub ongoing: bool,
}

/// The stalls a pod's `trainlet.io/progress` tells of: its own (as `pod`), and those it
/// relays as a coordinated job's resolver pod.
pub fn stalls_in(pod: &str, text: &str) -> Vec<PeerStall> {
    let Ok(a) = serde_json::from_str::<Annotation>(text) else {
        return Vec::new();
    };
    let parse = |t: &str| humantime::parse_rfc3339(t).ok();
    let own = a.since.as_deref().and_then(parse).map(|since| PeerStall {
        pod: pod.to_string(),
        since,
        ongoing: a.stalled,
    });
    let relayed = a.relayed.iter().take(MAX_RELAYED).filter_map(|r| {
        Some(PeerStall {
            pod: r.pod.clone(),
            since: parse(&r.since)?,
            ongoing: r.stalled,
        })
    });
    own.into_iter().chain(relayed).collect()
}

/// The failure a pod's `trainlet.io/progress` tells of, if any: the group restart it
/// asks for (`--on-failure restart`).
pub fn failure_in(pod: &str, text: &str) -> Option<PeerFailure> {
    let a: Annotation = serde_json::from_str(text).ok()?;
    let f = a.failed?;
    Some(PeerFailure {
        pod: pod.to_string(),
        since: humantime::parse_rfc3339(&f.since).ok()?,
        note: crate::publish::truncate(&f.note, MAX_FAILURE_NOTE),
    })
}

/// The run of CMD a pod's `trainlet.io/progress` tells of, if it publishes one: when
/// it started, and whether it is stopped for a restart.
pub fn run_in(pod: &str, text: &str) -> Option<PeerRun> {
    let a: Annotation = serde_json::from_str(text).ok()?;
    Some(PeerRun {
        pod: pod.to_string(),
        started: humantime::parse_rfc3339(a.started.as_deref()?).ok()?,
        down: a.down,
    })
}

/// The longest note of a peer's failure that a pod takes: a peer's annotation is
/// another pod's words, and they go into this pod's Event.
pub const MAX_FAILURE_NOTE: usize = 1024;

/// The peer stall a pod's CMD restarts for, if any: the earliest of the others' that
/// this CMD was not already restarted for (`acted`, the stalls known at its last
/// restart) and that is either still going on or began after this CMD `started`.
///
/// A stall still going on counts even if it began before this CMD started: the pod
/// that hangs at the rendezvous before a slower peer has even started is the common
/// case, and that peer's CMD waits on it too. One that has ended and began before is
/// old news, the one an earlier restart (or an earlier pod) already answered.
pub fn to_act_on<'a>(
    stalls: &'a [PeerStall],
    own: Option<&str>,
    started: SystemTime,
    acted: &[PeerStall],
) -> Option<&'a PeerStall> {
    stalls
        .iter()
        .filter(|s| Some(s.pod.as_str()) != own)
        .filter(|s| !acted.iter().any(|a| a.pod == s.pod && a.since == s.since))
        .filter(|s| s.ongoing || s.since > started)
        .min_by_key(|s| s.since)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn obs(at_s: Option<u64>, stalled: bool, stalls: u64) -> ProgressObservation {
        ProgressObservation {
            at_ms: at_s.map(|s| s * 1000),
            step: Some(3.0),
            stalled,
            silent: false,
            since_ms: stalled.then_some(1_000_000),
            stalls,
            after_ms: None,
            note: String::new(),
            reported: None,
            ..Default::default()
        }
    }
    /// A new percentage is published at once; new metrics alone wait with the time.
    #[test]
    fn a_reported_percentage_is_news_and_published_with_the_metrics() {
        let with = |at: u64, percent: u8, loss: &str| {
            let mut o = obs(Some(at), false, 0);
            o.reported = Some(Reported {
                percent: Some(percent),
                eta_seconds: Some(60),
                metrics: vec![super::super::progress::Metric {
                    name: "loss".into(),
                    value: loss.into(),
                }],
            });
            o
        };
        let first = annotation(&with(1_000, 40, "0.5"), None, None, &[]);
        assert_eq!(
            serde_json::to_string(&first).unwrap(),
            r#"{"at":"1970-01-01T00:16:40Z","step":3.0,"stalled":false,"stalls":0,"percent":40,"eta_seconds":60,"metrics":[{"name":"loss","value":"0.5"}]}"#
        );
        assert_eq!(
            annotation(&with(1_010, 40, "0.4"), Some(&first), None, &[]),
            first
        );
        let next = annotation(&with(1_010, 41, "0.4"), Some(&first), None, &[]);
        assert_eq!(
            (next.at.as_deref(), next.reported.percent),
            (Some("1970-01-01T00:16:50Z"), Some(41))
        );
        assert_eq!(next.reported.metrics[0].value, "0.4");
    }

    /// A restart of CMD is published at once, with the count `trainlet status` adds to
    /// the containers' restarts.
    #[test]
    fn a_restart_is_news_and_counted() {
        let first = annotation(&obs(Some(1_000), false, 0), None, None, &[]);
        let mut o = obs(Some(1_010), false, 0);
        o.restarts = 2;
        let next = annotation(&o, Some(&first), None, &[]);
        assert_eq!(
            serde_json::to_string(&next).unwrap(),
            r#"{"at":"1970-01-01T00:16:50Z","step":3.0,"stalled":false,"stalls":0,"restarts":2}"#
        );
    }

    #[test]
    fn the_annotation_refreshes_the_time_only_so_often() {
        let first = annotation(
            &obs(Some(1_000), false, 0),
            None,
            Some(Duration::from_secs(600)),
            &[],
        );
        assert_eq!(
            serde_json::to_string(&first).unwrap(),
            r#"{"at":"1970-01-01T00:16:40Z","step":3.0,"stalled":false,"stalls":0}"#
        );
        // 30 s later: kept (every 60 s at most).
        assert_eq!(
            annotation(
                &obs(Some(1_030), false, 0),
                Some(&first),
                Some(Duration::from_secs(600)),
                &[]
            ),
            first
        );
        // A short --stall-after refreshes at half of it.
        let short = annotation(
            &obs(Some(1_006), false, 0),
            Some(&first),
            Some(Duration::from_secs(10)),
            &[],
        );
        assert_eq!(short.at.as_deref(), Some("1970-01-01T00:16:46Z"));
        // A stall is published at once, with since when.
        let stalled = annotation(
            &obs(Some(1_001), true, 1),
            Some(&first),
            Some(Duration::from_secs(600)),
            &[],
        );
        assert_eq!(
            serde_json::to_string(&stalled).unwrap(),
            r#"{"at":"1970-01-01T00:16:41Z","step":3.0,"stalled":true,"since":"1970-01-01T00:16:40.000Z","stalls":1}"#
        );
        assert_eq!(
            stalls_in("w-1", &serde_json::to_string(&stalled).unwrap()),
            [stall("w-1", 1000, true)]
        );
        let ended = r#"{"stalled":false,"since":"1970-01-01T00:16:40.000Z","stalls":1}"#;
        assert_eq!(stalls_in("w-1", ended), [stall("w-1", 1000, false)]);
        assert_eq!(
            stalls_in("w-1", &serde_json::to_string(&first).unwrap()),
            []
        );
        assert_eq!(stalls_in("w-1", "not json"), []);
    }

    /// A pod that starts making progress after a silence publishes it at once, whatever
    /// the refresh interval: the pod that speaks for the job's silence reads it.
    #[test]
    fn the_end_of_a_silence_is_published_at_once() {
        let silent = ProgressObservation {
            silent: true,
            ..obs(None, false, 0)
        };
        let first = annotation(&silent, None, Some(Duration::from_secs(600)), &[]);
        assert_eq!(
            serde_json::to_string(&first).unwrap(),
            r#"{"step":3.0,"stalled":false,"silent":true,"stalls":0}"#
        );
        let spoke = annotation(&obs(Some(1_000), false, 0), Some(&first), None, &[]);
        assert_eq!(
            serde_json::to_string(&spoke).unwrap(),
            r#"{"at":"1970-01-01T00:16:40Z","step":3.0,"stalled":false,"stalls":0}"#
        );
        assert_eq!(
            peer_progress(&serde_json::to_string(&spoke).unwrap()),
            Some(UNIX_EPOCH + Duration::from_secs(1000))
        );
        assert_eq!(peer_progress(&serde_json::to_string(&first).unwrap()), None);
    }

    /// A coordinated job's followers watch the resolver pod alone: it relays the other
    /// pods' stalls, and a follower reads them as its peers'.
    #[test]
    fn the_resolver_pod_relays_the_other_pods_stalls() {
        let relayed = [stall("w-7", 1_000, true), stall("w-3", 990, false)];
        let a = annotation(&obs(Some(1_000), false, 0), None, None, &relayed);
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(
            text,
            r#"{"at":"1970-01-01T00:16:40Z","step":3.0,"stalled":false,"stalls":0,"relayed":[{"pod":"w-7","since":"1970-01-01T00:16:40.000Z","stalled":true},{"pod":"w-3","since":"1970-01-01T00:16:30.000Z","stalled":false}]}"#
        );
        assert_eq!(stalls_in("w-0", &text), relayed.to_vec());
        // A change of what is relayed is published at once.
        let next = annotation(&obs(Some(1_001), false, 0), Some(&a), None, &relayed[..1]);
        assert_eq!(next.relayed.len(), 1);
        // The resolver's own stall comes first, under its name.
        let own = annotation(&obs(Some(1_001), true, 1), None, None, &relayed[..1]);
        assert_eq!(
            stalls_in("w-0", &serde_json::to_string(&own).unwrap()),
            [stall("w-0", 1_000, true), stall("w-7", 1_000, true)]
        );
        assert_eq!(stalls_in("w-0", "not json"), []);
    }

    /// A progress time past year 9999 (a heartbeat's mtime, once) is written as the end
    /// of 9999, not a panic of the reporter.
    #[test]
    fn times_past_year_9999_are_published_as_its_end() {
        let year_10000_ms = 253_402_300_800_000;
        let o = ProgressObservation {
            at_ms: Some(year_10000_ms),
            since_ms: Some(u64::MAX),
            ..obs(None, true, 1)
        };
        assert_eq!(
            serde_json::to_string(&annotation(&o, None, None, &[])).unwrap(),
            r#"{"at":"9999-12-31T23:59:59Z","step":3.0,"stalled":true,"since":"9999-12-31T23:59:59.999Z","stalls":1}"#
        );
    }

    fn stall(pod: &str, since_s: u64, ongoing: bool) -> PeerStall {
        PeerStall {
            pod: pod.into(),
            since: UNIX_EPOCH + Duration::from_secs(since_s),
            ongoing,
        }
    }

    #[test]
    fn a_peer_stall_is_acted_on_once_whether_it_began_before_or_after_cmd_started() {
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        let pick = |stalls: &[PeerStall], started, acted: &[PeerStall]| {
            to_act_on(stalls, Some("w-2"), t(started), acted).map(|s| s.pod.clone())
        };
        // Still stalled, since before this CMD started (a peer that hung at the
        // rendezvous before this pod came up): acted on.
        assert_eq!(
            pick(&[stall("w-1", 10, true)], 12, &[]).as_deref(),
            Some("w-1")
        );
        // Ended, and began before this CMD started: old news.
        assert_eq!(pick(&[stall("w-1", 10, false)], 12, &[]), None);
        // Ended after a short stall this pod's watch only saw the end of: acted on.
        assert_eq!(
            pick(&[stall("w-1", 14, false)], 12, &[]).as_deref(),
            Some("w-1")
        );
        // Once: not again after the restart it caused, ongoing or not.
        let acted = [stall("w-1", 10, true)];
        assert_eq!(pick(&[stall("w-1", 10, true)], 20, &acted), None);
        assert_eq!(pick(&[stall("w-1", 10, false)], 20, &acted), None);
        // A new stall of the same pod is another.
        assert_eq!(
            pick(&[stall("w-1", 25, true)], 20, &acted).as_deref(),
            Some("w-1")
        );
        // Its own is exec's own to see; the earliest of several first.
        assert_eq!(pick(&[stall("w-2", 13, true)], 12, &[]), None);
        let several = [stall("w-3", 16, true), stall("w-0", 15, true)];
        assert_eq!(pick(&several, 12, &[]).as_deref(), Some("w-0"));
    }
}
