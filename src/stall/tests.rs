use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::progress::*;
use super::rule::*;
use super::watching::*;
use crate::testing::budget;

fn lines(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut s = LineScanner::default();
    let mut out = Vec::new();
    for c in chunks {
        let mut each = Vec::new();
        s.feed_rev(c, |l| {
            each.push(l.to_vec());
            false
        });
        out.extend(each.into_iter().rev());
    }
    out
}

#[test]
fn lines_end_at_newlines_and_carriage_returns_across_chunks() {
    assert_eq!(
        lines(&[
            b"step 1\nst",
            b"ep 2\r\n",
            b"10%|##  |\r20%|####|\r",
            b"tail"
        ]),
        [
            b"step 1".to_vec(),
            b"step 2".to_vec(),
            b"10%|##  |".to_vec(),
            b"20%|####|".to_vec()
        ]
    );
}

#[test]
fn a_line_without_end_keeps_at_most_max_line_bytes() {
    let mut s = LineScanner::default();
    let mut got = Vec::new();
    for _ in 0..1024 {
        s.feed_rev(&[b'x'; 10 * 1024], |l| {
            got.push(l.len());
            false
        });
        assert!(s.line.capacity() <= 2 * MAX_LINE);
    }
    s.feed_rev(b"\n", |l| {
        got.push(l.len());
        false
    });
    assert_eq!(got, [MAX_LINE]);
}

#[test]
fn the_pattern_picks_the_lines_and_its_first_group_is_the_step() {
    let p = Pattern::new(Some(r"step (\d+)")).unwrap();
    assert_eq!(p.progress(b"epoch 1 step 145 loss 0.3"), Some(Some(145.0)));
    assert_eq!(p.progress(b"loading data"), None);
    let words = Pattern::new(Some(r"loss=(\w+)")).unwrap();
    assert_eq!(words.progress(b"loss=nan"), Some(None));
    assert_eq!(
        Pattern::new(None).unwrap().progress(b"anything"),
        Some(None)
    );
    assert_eq!(
        Pattern::new(Some("step (")).unwrap_err(),
        "error: unclosed group"
    );
}

#[test]
fn progress_keeps_the_last_step_and_line() {
    let p = Pattern::new(Some(r"step (\d+)|eval")).unwrap();
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let mut pr = Progress::default();
    pr.on_line(&p, b"step 3 loss 1.0", t(10));
    pr.on_line(&p, b"eval", t(11));
    pr.on_line(&p, b"noise", t(12));
    assert_eq!(
        pr,
        Progress {
            at: Some(t(11)),
            signalled: Some(t(11)),
            step: Some(3.0),
            line: "eval".into(),
            stepped: false,
            reported: None,
        }
    );
}

/// A report to the Kubeflow endpoint is progress at the time exec takes it; its step,
/// when it gives one that is a count, is the step; only 16 of its metrics are kept.
#[test]
fn a_report_is_progress_and_its_step_the_step() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let metrics: Vec<Metric> = (0..20)
        .map(|i| Metric {
            name: format!("m{i}"),
            value: "1".into(),
        })
        .collect();
    let mut pr = Progress::default();
    let reported = Reported {
        percent: Some(40),
        eta_seconds: Some(795),
        metrics,
    };
    pr.on_report(reported.clone(), Some(120.0), t(10));
    assert_eq!((pr.at, pr.step), (Some(t(10)), Some(120.0)));
    let kept = pr.reported.clone().unwrap();
    assert_eq!(
        (kept.percent, kept.metrics.len()),
        (Some(40), MAX_REPORTED_METRICS)
    );
    assert_eq!(kept.metrics[15].name, "m15");
    // No step, or one that is no count: the step stays, the time moves.
    pr.on_report(Reported::default(), None, t(11));
    pr.on_report(Reported::default(), Some(-1.0), t(12));
    assert_eq!((pr.at, pr.step), (Some(t(12)), Some(120.0)));
    assert_eq!(pr.reported, Some(Reported::default()));
}

/// A step is a count: what is not (negative, NaN, infinite, past 2^53, where the
/// issue saw `last step -5` and a 309-digit step) is no step, and the line is
/// progress all the same.
#[test]
fn only_counts_are_steps() {
    let p = Pattern::new(Some(r"step (\S+)")).unwrap();
    for no in ["-5", "NaN", "inf", "-inf", "1e308", "9007199254740994"] {
        assert_eq!(
            p.progress(format!("step {no}").as_bytes()),
            Some(None),
            "{no}"
        );
    }
    assert_eq!(p.progress(b"step 9007199254740992"), Some(Some(MAX_STEP)));
    assert_eq!(p.progress(b"step 2.5"), Some(Some(2.5)));
    let zero = p.progress(b"step -0").unwrap().unwrap();
    assert!(zero == 0.0 && zero.is_sign_positive());
    assert_eq!(format!("{}", step(1e6).unwrap()), "1000000");
}

/// The heartbeat's mtime is CMD's to set, to any value: a change of it is progress at
/// the time exec sees it. A future mtime (which turned the watch off: a CMD silent for
/// 4 s under `--stall-after 1s` exited 0) and one in the year 10000 (which crashed the
/// reporter that wrote it as RFC 3339) move nothing into the future.
#[test]
fn a_heartbeat_counts_when_its_mtime_changes_either_way_at_the_time_exec_sees_it() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let year_10000 = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_800);
    let mut beat = Heartbeat::new(Some(t(100)));
    let mut w = StallWatch::new(Duration::from_secs(1), t(100));
    let mut pr = Progress::default();
    // Unchanged, or unreadable: no news.
    assert!(!beat.changed(Some(t(100))));
    assert!(!beat.changed(None));
    // Set a year ahead at 100.5 s: progress at 100.5 s, not next year.
    assert!(beat.changed(Some(t(100 + 365 * 86_400))));
    let seen = t(100) + Duration::from_millis(500);
    pr.on_heartbeat(seen);
    assert_eq!(pr.at, Some(seen));
    assert_eq!(w.check(&pr, alone(), t(101)), None);
    // Silent from then on: stalled a second later.
    assert!(!beat.changed(Some(t(100 + 365 * 86_400))));
    assert_eq!(
        w.check(&pr, alone(), seen + Duration::from_secs(1)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Own
        })
    );
    // Year 10000, then back into the past: each change is progress, seen now.
    assert!(beat.changed(Some(year_10000)));
    pr.on_heartbeat(t(103));
    assert_eq!(w.check(&pr, alone(), t(103)), Some(Transition::Resumed));
    assert!(!beat.changed(Some(year_10000)));
    assert!(beat.changed(Some(t(5))));
    pr.on_heartbeat(t(104));
    assert_eq!(pr.at, Some(t(104)));
    assert_eq!(
        w.check(&pr, alone(), t(105)),
        Some(Transition::Stalled {
            n: 2,
            kind: StallKind::Own
        })
    );
}

/// exec alone: it speaks for the job, which is this pod (either scope says the same).
fn alone() -> JobView {
    JobView {
        scope: Scope::Job,
        speaks_for_job: true,
        peer_progress: None,
    }
}

#[test]
fn a_stall_is_announced_once_and_clears_on_progress() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let mut w = StallWatch::new(Duration::from_secs(5), t(0));
    let mut pr = Progress::default();
    // Alone and silent from the start: the job made no progress for 5 s.
    assert_eq!(w.check(&pr, alone(), t(4)), None);
    assert!(w.silent());
    assert_eq!(
        w.check(&pr, alone(), t(5)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Job
        })
    );
    assert_eq!(w.check(&pr, alone(), t(9)), None);
    pr.on_line(&Pattern::default(), b"step 1", t(10));
    assert_eq!(w.check(&pr, alone(), t(10)), Some(Transition::Resumed));
    assert!(!w.silent());
    assert_eq!(
        w.check(&pr, alone(), t(16)),
        Some(Transition::Stalled {
            n: 2,
            kind: StallKind::Own
        })
    );
    // A restart: silence counts from it, and progress from before it is no progress.
    w.restart(t(20));
    assert!(!w.stalled());
    assert!(w.silent());
    assert_eq!(w.anchor(&pr), t(20));
    assert_eq!(w.check(&pr, alone(), t(24)), None);
    assert_eq!(
        w.check(&pr, alone(), t(25)),
        Some(Transition::Stalled {
            n: 3,
            kind: StallKind::Job
        })
    );
}

/// Per pod (`--stall-scope pod`): the ranks that never print are silent, never
/// stalled, however long they run: a healthy job of two pods whose rank 0 logs does
/// not restart every `--stall-after`.
#[test]
fn per_pod_a_pod_that_never_prints_is_silent_not_stalled() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let after = Duration::from_secs(5);
    let rank1 = |peer: Option<u64>| JobView {
        scope: Scope::Pod,
        speaks_for_job: false,
        peer_progress: peer.map(t),
    };
    for now in [4, 5, 60, 3600] {
        assert_eq!(
            judge(t(0), None, after, rank1(Some(3)), t(now)),
            Standing::Silent
        );
        // Not even when rank 0 stopped: rank 0 tells that stall itself.
        assert_eq!(
            judge(t(0), None, after, rank1(None), t(now)),
            Standing::Silent
        );
    }
    // Rank 0 silent while rank 1 logs: rank 1's progress since rank 0 started keeps the
    // job alive, and rank 1 tells its own stall when it stops.
    let rank0 = |peer: Option<u64>| JobView {
        scope: Scope::Pod,
        speaks_for_job: true,
        peer_progress: peer.map(t),
    };
    assert_eq!(
        judge(t(10), None, after, rank0(Some(11)), t(100)),
        Standing::Silent
    );
    // No pod of the job made progress since rank 0 started (a peer's progress from
    // before it is an earlier run's): the job is stalled, once, from rank 0.
    assert_eq!(
        judge(t(10), None, after, rank0(Some(9)), t(14)),
        Standing::Silent
    );
    assert_eq!(
        judge(t(10), None, after, rank0(Some(9)), t(15)),
        Standing::Stalled(StallKind::Job)
    );
    assert_eq!(
        judge(t(10), None, after, rank0(None), t(15)),
        Standing::Stalled(StallKind::Job)
    );
}

/// Per pod: a pod that printed and stopped is stalled, whatever the others do (the
/// worker of asynchronous training that hangs alone).
#[test]
fn per_pod_a_pod_that_printed_and_stopped_is_stalled() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let after = Duration::from_secs(5);
    let any = JobView {
        scope: Scope::Pod,
        speaks_for_job: false,
        peer_progress: Some(t(100)),
    };
    assert_eq!(
        judge(t(0), Some(t(3)), after, any, t(7)),
        Standing::Progressing
    );
    assert_eq!(
        judge(t(0), Some(t(3)), after, any, t(8)),
        Standing::Stalled(StallKind::Own)
    );
    // Progress from before this run of CMD counts for nothing.
    assert_eq!(
        judge(t(10), Some(t(3)), after, any, t(100)),
        Standing::Silent
    );
    // A clock that went back is no silence.
    assert_eq!(
        judge(t(0), Some(t(3)), after, any, t(1)),
        Standing::Progressing
    );
}

#[test]
fn the_note_says_what_was_seen() {
    let p = Progress {
        at: None,
        signalled: None,
        step: Some(145.0),
        line: "step 145 loss 0.3".into(),
        stepped: true,
        reported: None,
    };
    assert_eq!(
        stalled_note(Duration::from_millis(5400), &p, Some(99.6), &[97, 100]),
        "no progress for 5s; last step 145 in \"step 145 loss 0.3\"; CMD used 100% of a core over the window; GPU utilization 97% 100%"
    );
    assert_eq!(
        stalled_note(
            Duration::from_secs(600),
            &Progress::default(),
            Some(0.2),
            &[]
        ),
        "no progress for 10m; no progress output yet; CMD used 0% of a core over the window"
    );
}

/// The step is said to be in the line only when that line gave it (the issue saw
/// `last step -5 in "step NaN"`); a silence under a second is said in ms, not `0s`.
#[test]
fn the_note_quotes_the_step_with_its_own_line_and_short_silences_in_ms() {
    let p = Pattern::new(Some(r"step (\S+)")).unwrap();
    let t = SystemTime::UNIX_EPOCH;
    let mut pr = Progress::default();
    pr.on_line(&p, b"step 7", t);
    pr.on_line(&p, b"step -5", t);
    pr.on_line(&p, b"step NaN", t);
    assert_eq!(
        stalled_note(Duration::from_millis(800), &pr, None, &[]),
        "no progress for 800ms; last step 7; last output \"step NaN\""
    );
    pr.on_line(&p, b"step 8.0", t);
    assert_eq!(
        stalled_note(Duration::from_millis(61_900), &pr, None, &[]),
        "no progress for 1m 1s; last step 8 in \"step 8.0\""
    );
    assert_eq!(for_people(Duration::ZERO), "0ms");
    assert_eq!(for_people(Duration::from_millis(999)), "999ms");
    assert_eq!(for_people(Duration::from_millis(1999)), "1s");
}

#[test]
fn quotes_are_cut_and_clean() {
    assert_eq!(
        quote(b"\x1b[1mbold\x1b[0m \xff ok\t"),
        "[1mbold[0m \u{fffd} ok"
    );
    let long = quote(&[b'a'; 500]);
    assert_eq!(long.chars().count(), MAX_QUOTE + 1);
    assert!(long.ends_with('…'));
}

proptest! {
    #![proptest_config(budget(128))]

    /// However a stream is cut into chunks, the same lines come out, each cut to
    /// MAX_LINE bytes.
    #[test]
    fn chunking_does_not_change_the_lines(text in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'a'), Just(b'b')], 0..600), cuts in proptest::collection::vec(0usize..600, 0..8)) {
        let whole = lines(&[&text]);
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= text.len()).collect();
        cuts.sort_unstable();
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut from = 0;
        for c in cuts {
            parts.push(&text[from..c]);
            from = c;
        }
        parts.push(&text[from..]);
        prop_assert_eq!(lines(&parts), whole.clone());
        for l in &whole {
            prop_assert!(l.len() <= MAX_LINE && !l.is_empty());
        }
    }
}

#[test]
fn a_chunks_last_progress_is_its_last_progress_line_with_the_last_step_before_it() {
    let steps = Pattern::new(Some(r"step (\d+)|eval")).unwrap();
    let mut s = LineScanner::default();
    assert_eq!(
        s.last_progress(b"step 3 loss 1\nloading\neval\nnoise\n", &steps),
        Some(ChunkProgress {
            line: "eval".into(),
            step: Some(3.0),
            stepped: false
        })
    );
    let any = Pattern::new(None).unwrap();
    assert_eq!(
        s.last_progress(b"a\nb\nc\nhalf", &any),
        Some(ChunkProgress {
            line: "c".into(),
            step: None,
            stepped: false
        })
    );
    // The line the chunk before began ends here.
    assert_eq!(
        s.last_progress(b" done\n", &any).map(|p| p.line),
        Some("half done".into())
    );
    assert_eq!(s.last_progress(b"loading\n", &steps), None);
}

#[test]
fn without_a_group_no_line_gives_a_step_so_the_last_line_is_enough() {
    assert!(!Pattern::new(None).unwrap().has_steps());
    assert!(!Pattern::new(Some("eval")).unwrap().has_steps());
    assert!(Pattern::new(Some(r"step (\d+)")).unwrap().has_steps());
}

proptest! {
    /// Looking from the end finds what reading every line in order would.
    #[test]
    fn a_chunks_last_progress_is_what_reading_it_in_order_gives(
        picks in prop::collection::vec(0usize..5, 0..40),
        pattern in prop::sample::select(vec![None, Some(r"step (\d+)|eval"), Some("eval")]),
    ) {
        const LINES: [&str; 5] = ["step 1", "step 22", "eval", "noise", "step x"];
        let chunk: String = picks.iter().map(|&i| format!("{}\n", LINES[i])).collect();
        let p = Pattern::new(pattern).unwrap();
        let mut want: Option<ChunkProgress> = None;
        let mut step = None;
        for &i in &picks {
            if let Some(s) = p.progress(LINES[i].as_bytes()) {
                step = s.or(step);
                want = Some(ChunkProgress { line: LINES[i].into(), step, stepped: s.is_some() });
            }
        }
        prop_assert_eq!(LineScanner::default().last_progress(chunk.as_bytes(), &p), want);
    }
}

/// The check at the moment `due` names finds the stall: exec checks then, not up to an
/// `--interval` later. Progress moves the moment; a stalled run has none, and neither
/// does a run past its moment that is only silent (a rank that never prints), so
/// nothing wakes exec again and again for it.
#[test]
fn a_stall_is_due_when_the_check_at_that_moment_finds_it() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let mut w = StallWatch::new(Duration::from_secs(5), t(0));
    let mut pr = Progress::default();
    assert_eq!(w.due(&pr), Some(t(5)));
    assert_eq!(w.check(&pr, alone(), t(5) - Duration::from_millis(1)), None);
    pr.on_line(&Pattern::default(), b"step 1", t(3));
    assert_eq!(w.due(&pr), Some(t(8)));
    assert_eq!(w.check(&pr, alone(), t(7)), None);
    assert_eq!(
        w.check(&pr, alone(), w.due(&pr).unwrap()),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Own
        })
    );
    assert_eq!(w.due(&pr), None);
    // Restarted: due from the restart, and progress from before it is none.
    w.restart(t(20));
    assert_eq!(w.due(&pr), Some(t(25)));
    // A rank that speaks not for the job stays silent past its moment: a due in the
    // past, which exec does not wait for.
    let other = JobView {
        scope: Scope::Job,
        speaks_for_job: false,
        peer_progress: None,
    };
    assert_eq!(w.check(&pr, other, t(25)), None);
    assert!(w.silent());
    assert_eq!(w.due(&pr), None);
}

/// A line printed just after CMD started, seen by the check only after it judged the
/// silent run (the output is read on its own thread), moves the moment a stall would
/// begin to a few milliseconds after that check: due still, even once exec gets to it
/// late, so the stall is told when it begins, not at the next `--interval`.
#[test]
fn progress_seen_after_a_check_makes_a_later_moment_due_even_when_it_has_passed() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let ms = Duration::from_millis;
    let mut w = StallWatch::new(Duration::from_secs(10), t(0));
    let mut pr = Progress::default();
    assert_eq!(w.due(&pr), Some(t(10)));
    pr.on_line(&Pattern::default(), b"step 1", t(0) + ms(20));
    assert_eq!(w.check(&pr, alone(), t(10) + ms(1)), None);
    assert_eq!(w.due(&pr), Some(t(10) + ms(20)));
    // exec gets there at 10.5 s: the note then says the silence it measured.
    assert_eq!(
        w.check(&pr, alone(), t(10) + ms(500)),
        Some(Transition::Stalled {
            n: 1,
            kind: StallKind::Own
        })
    );
}
