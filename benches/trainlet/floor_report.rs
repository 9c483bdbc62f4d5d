//! The markdown of the floor scenario (floor.rs), from its results: a module of the
//! report, so that `make bench-docs` renders a kept run of it like any other.

use std::fmt::Write as _;

use serde_json::Value;

use super::{met, ratio};

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn mib(kib: &Value) -> String {
    format!("{:.1}", num(kib) / 1024.0)
}

fn bytes_mib(bytes: &Value) -> String {
    format!("{:.1}", num(bytes) / 1048576.0)
}

/// One side's row: percentiles, each round's p99, peak RSS, CPU, failures.
fn side_row(s: &mut String, n: &Value, label: &str, v: &Value) {
    let rounds: Vec<String> = v["p99_each_round_ms"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| format!("{:.0}", num(x)))
        .collect();
    let _ = writeln!(
        s,
        "| {n} | {label} | {:.0} | {:.0} | {} | {} / {} | {:.0} | {} of {} |",
        num(&v["p50_ms"]),
        num(&v["p99_ms"]),
        rounds.join(", "),
        mib(&v["rss_median_kib"]),
        mib(&v["rss_max_kib"]),
        num(&v["cpu_median_ms"]),
        v["failures"],
        num(&v["agents"]) + num(&v["failures"]),
    );
}

/// The command a run was made with, without the variables that name another build of
/// trainlet (a path outside the repository, a commit): the JSON keeps them.
fn command(c: &str) -> String {
    c.split_whitespace()
        .filter(|w| !w.starts_with("TRAINLET_BENCH_BIN"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The markdown of a floor run.
pub fn markdown(r: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {}. Command: `{}`. trainlet: a {} MiB binary; the floor: a {} MiB binary.\n",
        r["machine"].as_str().unwrap_or(""),
        command(r["command"].as_str().unwrap_or("")),
        bytes_mib(&r["trainlet_bin_bytes"]),
        bytes_mib(&r["floor_bin_bytes"]),
    );
    let _ = writeln!(
        s,
        "**The floor** (N agents wait for N pods that the kubelet player marks Running in random order; latency from the last Running status to each agent's file: trainlet's `tf_config.json`, the floor's empty `done`; percentiles over every agent of {} rounds, the side that runs first alternating; peak RSS from `/usr/bin/time`):\n",
        r["rounds"]
    );
    s += "| N | tool | p50 ms | p99 ms | p99 of each round, ms | peak RSS MiB, median / max | CPU ms per agent (median) | failed agents |\n|---|---|---|---|---|---|---|---|\n";
    let sizes: Vec<&Value> = r["floor_sizes"].as_array().into_iter().flatten().collect();
    for v in &sizes {
        side_row(&mut s, &v["n"], "trainlet init", &v["trainlet"]);
        side_row(&mut s, &v["n"], "floor: bare kube-rs watch", &v["floor"]);
    }
    let _ = writeln!(
        s,
        "\n| N | p99 ratio (trainlet / floor) | target | met | p50 ratio | peak RSS difference MiB, median / max | target | met |\n|---|---|---|---|---|---|---|---|"
    );
    for v in &sizes {
        let _ = writeln!(
            s,
            "| {} | {} | ≤ {}× | {} | {} | {:+.1} / {:+.1} | ≤ {} MiB | {} |",
            v["n"],
            ratio(num(&v["p99_ratio"])),
            r["p99_target"],
            met(v["p99_met"] == true),
            ratio(num(&v["p50_ratio"])),
            num(&v["rss_median_diff_mib"]),
            num(&v["rss_max_diff_mib"]),
            r["rss_target_mib"],
            met(v["rss_met"] == true),
        );
    }
    s
}
