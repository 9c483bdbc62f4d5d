//! Scenario 11: the floor. `trainlet init` against the least a kube-rs program does for
//! the same wait (benches/floor/floor.rs: a bare watch of the job's pods that exits when
//! the last one is Running with an address), both as agents of the resolve scenario
//! (resolve.rs): N of them wait, the kubelet player marks the pods Running in random
//! order, and each agent's latency runs from the last Running status to the mtime of the
//! file it writes; peak RSS from `/usr/bin/time`. At each N, [`ROUNDS`] rounds of one
//! run each, the side that runs first alternating, so that the p99 of the pooled agents
//! is not one noisy moment of this machine's. The project's goal: trainlet's p99 within
//! [`P99_TARGET`]× the floor's and its peak RSS within [`RSS_TARGET_MIB`] MiB of it.
//! Writes target/bench/results-floor.json.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kube::Client;
use serde_json::{Value, json};

use crate::report::{self, median};
use crate::resolve::{self, Outcome, Tool, percentile};

pub const ROUNDS: usize = 5;
pub const P99_TARGET: f64 = 2.0;
pub const RSS_TARGET_MIB: f64 = 8.0;

/// The sizes: `TRAINLET_BENCH_FLOOR_SIZES`, else 8, 32 and 64.
pub fn sizes() -> Vec<usize> {
    std::env::var("TRAINLET_BENCH_FLOOR_SIZES")
        .ok()
        .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![8, 32, 64])
}

/// The floor's executable, built by `cargo build --release --example floor` with the
/// cargo that runs this bench, and named by cargo's own report of the artifact
/// (`--message-format=json`), not by a guessed path: it is wherever the target
/// directory is (`CARGO_TARGET_DIR` included). Fresh, this takes a moment.
pub fn build() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let out = Command::new(cargo)
        .args(["build", "--release", "--example", "floor"])
        .args(["--message-format=json", "--manifest-path"])
        .arg(&manifest)
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo to build the floor");
    assert!(out.status.success(), "cargo could not build the floor");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "floor")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo named no executable for the floor")
}

/// The trainlet binary's commit: `TRAINLET_BENCH_BIN_COMMIT` for a binary given by
/// `TRAINLET_BENCH_BIN`, else this checkout's, naming what of the binary's sources
/// (src/, Cargo.toml, Cargo.lock) differs from it.
fn trainlet_commit() -> String {
    if let Ok(c) = std::env::var("TRAINLET_BENCH_BIN_COMMIT") {
        return c;
    }
    if std::env::var_os("TRAINLET_BENCH_BIN").is_some() {
        return "unknown (TRAINLET_BENCH_BIN)".into();
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_string())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]);
    // Each line is `XY PATH`: the status letters (one may be a space), then the path.
    let status = git(&[
        "status",
        "--porcelain",
        "--",
        "src",
        "Cargo.toml",
        "Cargo.lock",
    ]);
    let mut changed: Vec<&str> = status
        .lines()
        .filter_map(|l| l.get(3..))
        .map(|p| if p.starts_with("src/") { "src/" } else { p })
        .collect();
    changed.dedup();
    if changed.is_empty() {
        head
    } else {
        format!("{head}, with uncommitted changes to {}", changed.join(", "))
    }
}

fn size_of(bin: &Path) -> u64 {
    std::fs::metadata(bin).map(|m| m.len()).unwrap_or(0)
}

/// One tool's runs at one N, pooled: percentiles over every agent of every round.
fn side(runs: &[&Outcome]) -> Value {
    let mut latency: Vec<f64> = runs.iter().flat_map(|r| r.latency_ms.clone()).collect();
    latency.sort_by(f64::total_cmp);
    let mut rss: Vec<u64> = runs.iter().flat_map(|r| r.rss_kib.clone()).collect();
    rss.sort();
    let cpu: Vec<f64> = runs.iter().map(|r| r.cpu_median_ms).collect();
    json!({
        "agents": latency.len(),
        "failures": runs.iter().map(|r| r.failures).sum::<usize>(),
        "p50_ms": percentile(&latency, 50.0),
        "p99_ms": percentile(&latency, 99.0),
        "max_ms": latency.last().copied().unwrap_or(f64::NAN),
        "p99_each_round_ms": runs.iter().map(|r| r.p99_ms).collect::<Vec<_>>(),
        "rss_median_kib": rss.get(rss.len() / 2).copied().unwrap_or(0),
        "rss_max_kib": rss.last().copied().unwrap_or(0),
        "cpu_median_ms": median(&cpu),
    })
}

/// The two sides at one N and trainlet's distance from the floor.
fn summary(n: usize, runs: &[Outcome]) -> Value {
    let of = |tool: Tool| -> Vec<&Outcome> {
        runs.iter().filter(|r| r.n == n && r.tool == tool).collect()
    };
    let (t, f) = (side(&of(Tool::Trainlet)), side(&of(Tool::Floor)));
    let num = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mib = |k: &str| (num(&t, k) - num(&f, k)) / 1024.0;
    let p99_ratio = num(&t, "p99_ms") / num(&f, "p99_ms");
    let (rss_median_diff, rss_max_diff) = (mib("rss_median_kib"), mib("rss_max_kib"));
    json!({
        "n": n,
        "trainlet": t,
        "floor": f,
        "p99_ratio": p99_ratio,
        "p50_ratio": num(&t, "p50_ms") / num(&f, "p50_ms"),
        "rss_median_diff_mib": rss_median_diff,
        "rss_max_diff_mib": rss_max_diff,
        "p99_met": p99_ratio <= P99_TARGET,
        "rss_met": rss_median_diff <= RSS_TARGET_MIB && rss_max_diff <= RSS_TARGET_MIB,
    })
}

/// Every size, [`ROUNDS`] rounds, trainlet (`bin`) and the floor taking turns to run
/// first; writes target/bench/results-floor.json and returns it.
pub async fn run(client: &Client, kc: &Path, bin: &Path) -> Value {
    eprintln!("bench: building the floor (cargo build --release --example floor)");
    let floor = build();
    let mut runs = Vec::new();
    let sizes = sizes();
    for (i, &n) in sizes.iter().enumerate() {
        for round in 0..ROUNDS {
            let mut tools = [Tool::Trainlet, Tool::Floor];
            if (i + round) % 2 == 1 {
                tools.reverse();
            }
            for tool in tools {
                eprintln!("bench: floor N={n} round {round}: {}", tool.label());
                let exe = if tool == Tool::Floor { &floor } else { bin };
                runs.push(resolve::run(client, kc, exe, tool, n, Duration::ZERO).await);
            }
        }
    }
    let result = json!({
        "machine": report::machine(),
        "commit": report::commit(),
        "command": report::command(),
        "trainlet_commit": trainlet_commit(),
        "trainlet_bin_bytes": size_of(bin),
        "floor_bin_bytes": size_of(&floor),
        "rounds": ROUNDS,
        "p99_target": P99_TARGET,
        "rss_target_mib": RSS_TARGET_MIB,
        "floor_sizes": sizes.iter().map(|&n| summary(n, &runs)).collect::<Vec<_>>(),
        "runs": runs,
    });
    crate::report::write_own("results-floor.json", &result);
    result
}
