use super::*;
use crate::report::probe::ports::ConflictReason;
use crate::stall::observation::FailedObservation;
use crate::stall::progress::{Metric, Reported};

fn sample() -> Observation {
    Observation {
        version: VERSION,
        epoch: "812-1763800000123".into(),
        interval_ms: 5000,
        exited: None,
        gpu: GpuObservation {
            unavailable: None,
            driver: Some("550.54.15".into()),
            devices: (0..4)
                .map(|i| GpuDevice {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "Fake GPU".into(),
                    memory_total_bytes: 16 << 30,
                    mig: None,
                })
                .collect(),
            seen: 4,
            lost: None,
            faulty: vec![],
            xid_watch: None,
        },
        xids: vec![XidCountObservation {
            error: XidError {
                gpu: 2,
                uuid: "GPU-2".into(),
                xid: 79,
            },
            count: 2,
        }],
        ports: vec![PortEntry {
            port: 8470,
            state: PortState::Conflict {
                reason: ConflictReason::ForeignProcess,
                owner: Some(Owner {
                    pid: 7,
                    comm: "nc".into(),
                }),
            },
        }],
        kills: vec![KillObservation {
            seq: 1,
            time: "2026-11-22T10:00:00Z".into(),
            process: Some(Owner {
                pid: 812,
                comm: "python".into(),
            }),
            group: false,
            memory_usage: Some(1 << 30),
            memory_peak: None,
            memory_limit: Some("1Gi".into()),
        }],
        errors: BTreeMap::new(),
        restart: Some(RestartObservation {
            restarts: 1,
            note: "restarting python (1 of 3) in 10s: the cluster changed (stale: worker/1 10.0.0.7 → none)".into(),
            waiting: true,
        }),
        progress: Some(ProgressObservation {
            at_ms: Some(1_763_800_000_000),
            step: Some(145.0),
            stalled: true,
            silent: false,
            since_ms: Some(1_763_800_000_000),
            stalls: 1,
            restarts: 1,
            after_ms: Some(300_000),
            note: "no progress for 5m; last step 145 in \"step 145\"".into(),
            reported: Some(Reported {
                percent: Some(45),
                eta_seconds: Some(795),
                metrics: vec![Metric {
                    name: "loss".into(),
                    value: "0.23".into(),
                }],
            }),
            started_ms: Some(1_763_799_000_000),
            down: false,
            failed: Some(FailedObservation {
                since_ms: 1_763_798_900_000,
                note: "pod w-1 (worker/1, rank 1): torchrun exited with code 1".into(),
            }),
            stuck_at: vec!["load_batch (data.py:41) ← train_step (train.py:88)".into()],
        }),
    }
}

fn json(o: &Observation) -> Vec<u8> {
    serde_json::to_vec(o).unwrap()
}

#[test]
fn an_observation_round_trips_exactly() {
    let o = sample();
    assert_eq!(parse(&json(&o), "exec.json"), Ok(o.clone()));
    assert_eq!(o.gpu_info().count(), 4);
    assert_eq!(o.xids[0].count, 2);
    assert!(o.port_states()[&8470].is_conflict());
    let unavailable = Observation {
        gpu: GpuObservation {
            unavailable: Some(Unavailable::InitFailed {
                why: "Unknown Error".into(),
            }),
            devices: vec![],
            ..o.gpu.clone()
        },
        ..o
    };
    let back = parse(&json(&unavailable), "exec.json").unwrap();
    assert_eq!(
        back.gpu_info().nvml_status(),
        "unavailable: init failed: Unknown Error"
    );
}

/// A GPU fault and the XID watch travel from exec to the sidecar, bounded like the
/// rest.
#[test]
fn gpu_faults_and_the_xid_watch_round_trip_and_are_bounded() {
    use crate::report::probe::gpu::events::Unwatched;
    use crate::report::probe::gpu::{FaultKind, GpuFault};
    let mut o = sample();
    o.gpu.devices.remove(2);
    o.gpu.faulty = vec![GpuFault {
        index: 2,
        uuid: "GPU-2".into(),
        fault: FaultKind::ResetRequired,
        why: "device requires a reset before it can be used again".into(),
    }];
    o.gpu.xid_watch = Some(XidWatch {
        watched: vec![0, 1, 3],
        unwatched: vec![Unwatched {
            gpu: 2,
            uuid: "GPU-2".into(),
            why: "the requested operation is not available on the target device".into(),
        }],
    });
    let back = parse(&json(&o), "exec.json").unwrap();
    assert_eq!(back, o);
    assert_eq!(back.gpu_info().faulty, o.gpu.faulty);
    let mut hostile = o.clone();
    hostile.gpu.faulty[0].why = "reset \u{202E}me".into();
    assert_eq!(
        parse(&json(&hostile), "exec.json").unwrap_err().to_string(),
        "exec.json: gpu.faulty.why holds an invisible or reordering character (U+202E)"
    );
    let mut many = o;
    many.gpu.faulty = vec![many.gpu.faulty[0].clone(); MAX_DEVICES + 1];
    assert_eq!(
        parse(&json(&many), "exec.json").unwrap_err().to_string(),
        "exec.json: more than 64 faulty GPUs"
    );
}

#[test]
fn garbage_oversized_and_hostile_observations_are_rejected_with_a_reason() {
    let r = |b: &[u8]| parse(b, "exec.json").unwrap_err();
    assert_eq!(r(b"\x00\xffnot json").reason(), "malformed");
    assert_eq!(
        r(b"{\"version\":1").to_string(),
        "exec.json is not an observation of format 1: truncated JSON at line 1 column 12"
    );
    assert_eq!(r(&vec![b' '; MAX_BYTES + 1]).reason(), "too-large");
    // An unknown field: not this format.
    let mut v: serde_json::Value = serde_json::from_slice(&json(&sample())).unwrap();
    v["token"] = "stolen".into();
    assert_eq!(r(v.to_string().as_bytes()).reason(), "malformed");
    let bad = |f: &dyn Fn(&mut Observation)| {
        let mut o = sample();
        f(&mut o);
        r(&json(&o))
    };
    assert_eq!(
        bad(&|o| o.version = 2).to_string(),
        "exec.json: format 2 is not 1"
    );
    assert_eq!(bad(&|o| o.epoch = "../x".into()).reason(), "invalid");
    assert_eq!(
        bad(&|o| o.gpu.devices[0].name = "Fake\nGPU".into()).to_string(),
        "exec.json: gpu.devices.name holds control characters"
    );
    // Text that hides or reorders what a person reads in kubectl describe: a
    // right-to-left override, a zero-width space, a line separator, a BOM.
    for (c, code) in [
        ('\u{202E}', "202E"),
        ('\u{200B}', "200B"),
        ('\u{2028}', "2028"),
        ('\u{FEFF}', "FEFF"),
    ] {
        assert_eq!(
            bad(&|o| o.gpu.devices[0].name = format!("NVIDIA {c}H100")).to_string(),
            format!(
                "exec.json: gpu.devices.name holds an invisible or reordering character (U+{code})"
            )
        );
        assert_eq!(
            bad(&|o| {
                o.errors.insert("gpu".into(), format!("failed{c}"));
            })
            .reason(),
            "invalid"
        );
    }
    // Where the ranks are: bounded in count and length, printable.
    assert_eq!(
        bad(&|o| o.progress.as_mut().unwrap().stuck_at = vec!["x (a.py:1)".into(); 9]).to_string(),
        "exec.json: progress.where has 9 places, more than 8"
    );
    assert_eq!(
        bad(&|o| o.progress.as_mut().unwrap().stuck_at = vec!["x".repeat(1025)]).to_string(),
        "exec.json: progress.where is longer than 1024 bytes"
    );
    assert_eq!(
        bad(&|o| o.progress.as_mut().unwrap().stuck_at = vec!["x\u{1b}[2J".into()]).to_string(),
        "exec.json: progress.where holds control characters"
    );
    // Letters of any script are fine.
    let mut o = sample();
    o.gpu.devices[0].name = "NVIDIA H100 — 加速器 é".into();
    assert!(parse(&json(&o), "exec.json").is_ok());
    assert_eq!(
        bad(&|o| o.gpu.devices[0].uuid = "x".repeat(97)).to_string(),
        "exec.json: gpu.devices.uuid is longer than 96 bytes"
    );
    assert_eq!(
        bad(&|o| o.gpu.devices = vec![o.gpu.devices[0].clone(); 65]).to_string(),
        "exec.json: more than 64 GPUs"
    );
    assert_eq!(
        bad(&|o| o.kills.push(o.kills[0].clone())).to_string(),
        "exec.json: kills are not numbered in increasing order"
    );
    assert_eq!(
        bad(&|o| o.kills[0].time = "yesterday".into()).to_string(),
        "exec.json: a kill's time is not RFC 3339"
    );
    assert_eq!(
        bad(&|o| o.ports[0].port = 0).to_string(),
        "exec.json: port 0"
    );
    assert_eq!(
        bad(&|o| o.interval_ms = 0).to_string(),
        "exec.json: interval_ms is not between 100 and 3600000"
    );
}

/// The progress of a hostile or broken exec: a time past 9999 (once a heartbeat's
/// mtime, which crashed the sidecar as it wrote it) and steps that are no count.
#[test]
fn progress_times_past_9999_and_steps_that_are_no_count_are_rejected() {
    let bad = |f: &dyn Fn(&mut ProgressObservation)| {
        let mut o = sample();
        f(o.progress.as_mut().unwrap());
        parse(&json(&o), "exec.json")
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let year_10000_ms = 253_402_300_800_000;
    assert_eq!(
        bad(&|p| p.at_ms = Some(year_10000_ms)),
        Err("exec.json: progress.at_ms is past the year 9999".into())
    );
    assert_eq!(
        bad(&|p| p.since_ms = Some(u64::MAX)),
        Err("exec.json: progress.since_ms is past the year 9999".into())
    );
    assert_eq!(bad(&|p| p.at_ms = Some(year_10000_ms - 1)), Ok(()));
    for step in [-5.0, 1e308, 9_007_199_254_740_994.0] {
        assert_eq!(
            bad(&|p| p.step = Some(step)),
            Err("exec.json: progress.step is not a step: a number from 0 to 2^53".into()),
            "{step}"
        );
    }
    assert_eq!(bad(&|p| p.step = Some(0.0)), Ok(()));
}

/// What CMD reported to the Kubeflow endpoint comes through exec, which the training
/// container controls: the sidecar takes it only within the endpoint's own bounds
/// (`kubeflow::bounds::check`, the same check), and at most the 16 metrics exec keeps.
#[test]
fn reported_progress_past_its_bounds_is_rejected() {
    let bad = |f: &dyn Fn(&mut Reported)| {
        let mut o = sample();
        f(o.progress.as_mut().unwrap().reported.as_mut().unwrap());
        parse(&json(&o), "exec.json")
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let metric = |name: &str, value: &str| Metric {
        name: name.into(),
        value: value.into(),
    };
    assert_eq!(bad(&|r| r.percent = Some(100)), Ok(()));
    assert_eq!(
        bad(&|r| r.percent = Some(101)),
        Err("exec.json: progress.reported.percent: Invalid value: 101: progress.reported.percent in body should be less than or equal to 100".into())
    );
    assert_eq!(bad(&|r| r.eta_seconds = Some(315_360_000)), Ok(()));
    assert_eq!(
        bad(&|r| r.eta_seconds = Some(u32::MAX)),
        Err("exec.json: progress.reported.eta_seconds: Invalid value: 4294967295: progress.reported.eta_seconds in body should be less than or equal to 315360000".into())
    );
    assert_eq!(
        bad(&|r| r.metrics = vec![metric("m", "1"); 17]),
        Err(
            "exec.json: progress.reported.metrics: Too many: 17: must have at most 16 items".into()
        )
    );
    assert_eq!(bad(&|r| r.metrics = vec![metric("m", "1"); 16]), Ok(()));
    assert_eq!(
        bad(&|r| r.metrics = vec![metric("loss\u{1b}[2J", "1")]),
        Err("exec.json: progress.reported.metrics[0].name: Invalid value: U+001B: progress.reported.metrics[0].name may hold no control or invisible character".into())
    );
    assert_eq!(
        bad(&|r| r.metrics = vec![metric("loss", &"9".repeat(65))]),
        Err("exec.json: progress.reported.metrics[0].value: Too long: may not be more than 64 bytes".into())
    );
    assert_eq!(
        bad(&|r| r.metrics = vec![metric("loss", "1"), metric(&"n".repeat(256), "1")]),
        Err(
            "exec.json: progress.reported.metrics[1].name: Too long: may not be more than 64 bytes"
                .into()
        )
    );
    assert_eq!(
        bad(&|r| r.metrics = vec![metric(&"ü".repeat(64), "1")]),
        Ok(())
    );
    assert_eq!(
        bad(&|r| r.metrics = vec![metric("", "1")]),
        Err("exec.json: progress.reported.metrics[0].name: Invalid value: \"\": progress.reported.metrics[0].name in body should be at least 1 chars long".into())
    );
}

/// The report is part of the handover's format: a field exec does not write, in the
/// report or in one of its metrics, is refused as anywhere else in it (the error names
/// where, right after the field's name).
#[test]
fn unknown_fields_inside_the_report_are_rejected() {
    let with = |key: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_slice(&json(&sample())).unwrap();
        f(&mut v["progress"]["reported"]);
        let text = serde_json::to_string(&v).unwrap();
        let column = text.find(key).map_or(0, |i| i + key.len());
        let got = parse(text.as_bytes(), "exec.json")
            .map(|_| ())
            .map_err(|e| e.to_string());
        (got, column)
    };
    assert_eq!(with("", &|_| {}).0, Ok(()));
    for (key, f) in [
        (
            "\"extra\"",
            &(|r: &mut serde_json::Value| r["extra"] = 1.into()) as &dyn Fn(&mut serde_json::Value),
        ),
        ("\"unit\"", &|r| r["metrics"][0]["unit"] = "s".into()),
    ] {
        let (got, column) = with(key, f);
        assert!(column > 0, "{key}");
        assert_eq!(
            got,
            Err(format!(
                "exec.json is not an observation of format 1: unexpected field or type at line 1 column {column}"
            )),
            "{key}"
        );
    }
}

#[test]
fn news_announces_each_kill_and_xid_once_per_epoch() {
    let mut p = Published::default();
    let o = sample();
    let n = news(&mut p, &o);
    assert_eq!(n.kills.len(), 1);
    assert_eq!(n.xids, [(o.xids[0].error.clone(), 2)]);
    assert_eq!(
        n.restart.as_deref(),
        Some(
            "restarting python (1 of 3) in 10s: the cluster changed (stale: worker/1 10.0.0.7 → none)"
        )
    );
    // The same version again (a re-read): nothing new.
    assert_eq!(news(&mut p, &o), News::default());
    // One more occurrence and one more kill.
    let mut o2 = o.clone();
    o2.xids[0].count = 3;
    o2.kills.push(KillObservation {
        seq: 2,
        ..o.kills[0].clone()
    });
    let n = news(&mut p, &o2);
    assert_eq!(n.kills.iter().map(|k| k.seq).collect::<Vec<_>>(), [2]);
    assert_eq!(n.xids, [(o.xids[0].error.clone(), 1)]);
    // A restarted exec: a new epoch whose counters start again.
    let mut o3 = o.clone();
    o3.epoch = "900-1763800099000".into();
    let n = news(&mut p, &o3);
    assert_eq!(n.kills.len(), 1);
    assert_eq!(n.xids[0].1, 2);
    assert_eq!(p.epoch, "900-1763800099000");
}

#[test]
fn the_reader_takes_the_file_and_refuses_links_fifos_and_giants() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read(dir.path()), Ok(None));
    write(dir.path(), &sample()).unwrap();
    assert_eq!(read(dir.path()).unwrap().unwrap().observation, sample());
    let target = dir.path().join("secret");
    std::fs::write(&target, "token").unwrap();
    let f = dir.path().join(FILE);
    std::fs::remove_file(&f).unwrap();
    std::os::unix::fs::symlink(&target, &f).unwrap();
    assert_eq!(read(dir.path()).unwrap_err().reason(), "not-a-file");
    std::fs::remove_file(&f).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&f)
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(read(dir.path()).unwrap_err().reason(), "not-a-file");
    std::fs::remove_file(&f).unwrap();
    std::fs::write(&f, vec![b'{'; MAX_BYTES + 10]).unwrap();
    assert_eq!(read(dir.path()).unwrap_err().reason(), "too-large");
}

#[tokio::test]
async fn the_watch_wakes_when_a_new_version_is_renamed_in() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = crate::watch::FileWatch::entry(dir.path(), FILE).unwrap();
    std::fs::write(dir.path().join("other"), "x").unwrap();
    write(dir.path(), &sample()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), w.wait())
        .await
        .expect("woken within 5 s")
        .unwrap();
}
