//! The bench report: a markdown table on stdout, `target/bench/results.json`, and an
//! SVG plot of latency and RSS against N. The plot is a few lines of SVG written here:
//! the plotting crates either pull a font stack or a bitmap encoder into every test
//! build, for two small line charts.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::Value;

// The floor scenario's tables (a path from this file's folder, so that
// tests/it/bench_docs.rs, which includes this file, finds it too).
#[path = "floor_report.rs"]
pub mod floor_report;
// The stacks scenario's tables, the same way.
#[path = "stacks_report.rs"]
pub mod stacks_report;

pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0);
    format!(
        "{cpus} cores ({model}), {} GiB RAM, control plane on the same machine",
        mem / 1024 / 1024
    )
}

/// How this run was started: `make bench` and the `TRAINLET_BENCH_*` variables set.
pub fn command() -> String {
    let mut words: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("TRAINLET_BENCH_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    words.sort();
    words.push("make bench".into());
    words.join(" ")
}

pub fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// A ratio with two significant digits however small (0.0061×, not 0.00×).
pub fn ratio(x: f64) -> String {
    if !x.is_finite() {
        return "—".into();
    }
    if x == 0.0 {
        return "0×".into();
    }
    let digits = (1 - x.abs().log10().floor() as i32).max(2) as usize;
    format!("{x:.digits$}×")
}

fn mib(kib: &Value) -> String {
    format!("{:.1}", f(kib) / 1024.0)
}

fn find<'a>(results: &'a Value, tool: &str, n: u64, delay: f64) -> Option<&'a Value> {
    results["resolve"]
        .as_array()?
        .iter()
        .find(|r| r["tool"] == tool && r["n"] == n && (f(&r["delay_s"]) - delay).abs() < 0.5)
}

/// Large jobs: coordinated against every agent watching every peer, same N and shape.
fn scale_table(s: &mut String, results: &Value) {
    let rows: Vec<&Value> = results["scale"].as_array().into_iter().flatten().collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n**Large jobs** (both modes on the same control plane; latency from the last pod's Running status; egress = every response byte the API server sent the job's agents):\n"
    );
    let _ = writeln!(
        s,
        "| N | types | mode | p50 / p99 / max ms | all done ms | peak RSS MiB (median / max) | CPU ms per agent (median) | requests per agent | KiB received per agent | API-server egress per job MiB | egress vs per-agent | failures |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let per_agent = rows
            .iter()
            .find(|o| o["tool"] == "Trainlet" && o["n"] == r["n"] && o["types"] == r["types"]);
        let ratio = match per_agent {
            _ if r["tool"] == "Trainlet" => String::new(),
            Some(p) => format!("{:.2} %", 100.0 * f(&r["egress_kib"]) / f(&p["egress_kib"])),
            None => "(not run)".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} / {:.0} / {:.0} | {:.0} | {} / {} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} |",
            r["n"],
            r["types"],
            if r["tool"] == "Trainlet" {
                "every agent watches all"
            } else {
                "coordinated"
            },
            f(&r["p50_ms"]),
            f(&r["p99_ms"]),
            f(&r["max_ms"]),
            f(&r["all_done_ms"]),
            mib(&r["rss_median_kib"]),
            mib(&r["rss_max_kib"]),
            f(&r["cpu_median_ms"]),
            f(&r["requests_per_agent"]),
            f(&r["bytes_per_agent"]) / 1024.0,
            f(&r["egress_kib"]) / 1024.0,
            ratio,
            r["failures"],
        );
    }
}

pub fn markdown(results: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {}. Command: `{}`.\n",
        results["machine"].as_str().unwrap_or(""),
        results["command"].as_str().unwrap_or("")
    );
    // A run of other scenarios only (TRAINLET_BENCH_ONLY) has no resolve tables.
    let resolved = results["resolve"].as_array().is_some_and(|r| !r.is_empty());
    if resolved {
        let _ = writeln!(
            s,
            "**Resolve** (latency from the last pod's Running status to each agent's `tf_config.json`):\n"
        );
        let _ = writeln!(
            s,
            "| N | trainlet p50 / p99 / max ms | kubectl wait+get p50 / p99 / max ms | p99 ratio | all done: trainlet / kubectl ms | peak RSS MiB: trainlet / kubectl | RSS ratio | CPU ms per agent: trainlet / kubectl | API requests per agent: trainlet / kubectl | KiB sent per agent: trainlet / kubectl | failed agents: trainlet / kubectl |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        let mut ns: Vec<u64> = results["resolve"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| f(&r["delay_s"]) < 0.5)
            .filter_map(|r| r["n"].as_u64())
            .collect();
        ns.sort();
        ns.dedup();
        for n in ns {
            // Without a kubectl run (TRAINLET_BENCH_ONLY), its columns read NaN.
            let null = Value::Null;
            let Some(t) = find(results, "Trainlet", n, 0.0) else {
                continue;
            };
            let k = find(results, "KubectlWait", n, 0.0).unwrap_or(&null);
            // Where every kubectl agent failed, its side has no figures, only the count.
            let k_failures = k["failures"].clone();
            let k = if k_failures.as_u64() == Some(n) {
                &null
            } else {
                k
            };
            let row = format!(
                "| {n} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {} | {:.0} / {:.0} | {} / {} | {} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {} / {} |",
                f(&t["p50_ms"]),
                f(&t["p99_ms"]),
                f(&t["max_ms"]),
                f(&k["p50_ms"]),
                f(&k["p99_ms"]),
                f(&k["max_ms"]),
                ratio(f(&t["p99_ms"]) / f(&k["p99_ms"])),
                f(&t["all_done_ms"]),
                f(&k["all_done_ms"]),
                mib(&t["rss_max_kib"]),
                mib(&k["rss_max_kib"]),
                ratio(f(&t["rss_max_kib"]) / f(&k["rss_max_kib"])),
                f(&t["cpu_median_ms"]),
                f(&k["cpu_median_ms"]),
                f(&t["requests_per_agent"]),
                f(&k["requests_per_agent"]),
                f(&t["bytes_per_agent"]) / 1024.0,
                f(&k["bytes_per_agent"]) / 1024.0,
                t["failures"],
                k_failures,
            );
            let _ = writeln!(s, "{}", row.replace("NaN", "—"));
        }
        let _ = writeln!(
            s,
            "\n**API cost against the wait** (N = 8; requests per agent by verb and resource):\n"
        );
        let _ = writeln!(
            s,
            "| tool | pods Running after | p99 ms | peak RSS MiB | requests per agent | by kind |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for r in results["resolve"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["n"] == 8)
        {
            let kinds: Vec<String> = r["requests_by_kind"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k} {:.1}", f(v)))
                .collect();
            let label = match r["tool"].as_str() {
                Some("Trainlet") => "trainlet init",
                Some("KubectlWait") => "kubectl wait + get",
                _ => "kubectl get, 2 s poll",
            };
            let _ = writeln!(
                s,
                "| {label} | {:.0} s | {:.0} | {} | {:.1} | {} |",
                f(&r["delay_s"]) + 1.0,
                f(&r["p99_ms"]),
                mib(&r["rss_max_kib"]),
                f(&r["requests_per_agent"]),
                kinds.join(", ")
            );
        }
    }
    scale_table(&mut s, results);
    if let Some(fp) = results.get("footprint").filter(|v| !v.is_null()) {
        let _ = writeln!(s, "\n**Footprint**:\n");
        let _ = writeln!(
            s,
            "| release binary | `trainlet --version` | bad-flag exit (code) | `kubectl version --client` |"
        );
        let _ = writeln!(s, "|---|---|---|---|");
        let _ = writeln!(
            s,
            "| {:.1} MiB | {:.1} ms | {:.1} ms ({}) | {:.1} ms |",
            f(&fp["binary_bytes"]) / 1048576.0,
            f(&fp["version_ms"]),
            f(&fp["bad_flag_ms"]),
            fp["bad_flag_exit"],
            f(&fp["kubectl_version_ms"])
        );
    }
    if let Some(v) = results.get("sidecar").filter(|v| !v.is_null()) {
        sidecar_table(&mut s, v);
    }
    if let Some(v) = results.get("oom").filter(|v| !v.is_null()) {
        oom_table(&mut s, v);
    }
    if let Some(v) = results
        .get("peers")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
    {
        peers_table(&mut s, v, &results["peers_sample"]);
    }
    if let Some(v) = results.get("stall").filter(|v| !v.is_null()) {
        stall_table(&mut s, v);
    }
    if let Some(v) = results.get("robustness").filter(|v| !v.is_null()) {
        robustness_table(&mut s, v);
    }
    s
}

/// The median of a list of numbers (the upper one of an even count; NaN, shown as
/// such, of none).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Scenario 7: SIGTERM to exit, an API server outage, 500 slow connections.
fn robustness_table(s: &mut String, v: &Value) {
    let nums = |x: &Value| -> Vec<f64> { x.as_array().into_iter().flatten().map(f).collect() };
    let each = |xs: &[f64]| -> String {
        xs.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let target = f(&v["target_sigterm_ms"]);
    let _ = writeln!(
        s,
        "\n**SIGTERM to exit** (as the kubelet stops a container: exec on a running pod, the sidecar on a pod whose training container has ended; each process started, ready, then sent SIGTERM; the two take turns; the harness looks every 20 ms, so 0 is under 20 ms):\n"
    );
    let _ = writeln!(
        s,
        "| process | exit after SIGTERM, ms (each run) | max | exit codes | target | met |\n|---|---|---|---|---|---|"
    );
    for p in v["sigterm"].as_array().into_iter().flatten() {
        let ms = nums(&p["exit_ms"]);
        let max = ms.iter().copied().fold(0.0, f64::max);
        let mut codes: Vec<String> = p["exit_codes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c.to_string())
            .collect();
        codes.sort();
        codes.dedup();
        let _ = writeln!(
            s,
            "| `{}` | {} | {max:.0} | {} | ≤ {target:.0} ms | {} |",
            p["process"].as_str().unwrap_or(""),
            each(&ms),
            codes.join(", "),
            met(!ms.is_empty() && max <= target)
        );
    }
    let after = nums(&v["after_outage_ms"]);
    let target = f(&v["target_outage_ms"]);
    let worst = after.iter().copied().fold(0.0, f64::max);
    let _ = writeln!(
        s,
        "\n**API server outage** ({} `trainlet init` agents waiting; kube-apiserver away for {:.0} s, back on the same etcd; then the pods turn Running): from the last pod's Running status to the last agent's `tf_config.json` (0 where the file was written before the API server's answer reached the harness)\n",
        v["agents"],
        f(&v["outage_s"])
    );
    let _ = writeln!(
        s,
        "| each round, ms | median | max | failed agents | target | met |\n|---|---|---|---|---|---|\n| {} | {:.0} | {worst:.0} | {} | ≤ {target:.0} ms | {} |",
        each(&after),
        median(&after),
        v["outage_failures"],
        met(!after.is_empty() && worst <= target && v["outage_failures"] == 0)
    );
    let w = &v["slow"];
    let kib = |k: &str| f(&w[k]) / 1024.0;
    let _ = writeln!(
        s,
        "\n**{} slow connections** to a sidecar's metrics endpoint (each sends a 380 KiB request head, 4 KiB every 20 ms, and never ends it):\n",
        w["connections"]
    );
    let _ = writeln!(
        s,
        "| peak RSS before / after (VmHWM) | ratio | `/metrics` answered during the attack | all closed by the server after the last byte | left open | sidecar alive |\n|---|---|---|---|---|---|\n| {:.1} / {:.1} MiB | {} | {} of 3 | {:.0} ms | {} | {} |",
        kib("peak_rss_kib_before"),
        kib("peak_rss_kib_after"),
        ratio(f(&w["peak_rss_kib_after"]) / f(&w["peak_rss_kib_before"])),
        w["metrics_answered"],
        f(&w["all_closed_ms"]),
        w["still_open"],
        if w["alive"] == true { "yes" } else { "**no**" }
    );
}

/// Scenario 6: the stall watch.
fn stall_table(s: &mut String, v: &Value) {
    let nums = |k: &str| -> Vec<f64> { v[k].as_array().into_iter().flatten().map(f).collect() };
    let each = |xs: &[f64]| -> String {
        xs.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "\n**The stall watch: output through exec** (1 GiB of CMD's stdout into a pipe, first byte to end; directly and through `trainlet exec --report --stall-after 10m --progress-pattern`, each side first in every other round; exec's added CPU and peak RSS, from `/usr/bin/time`):\n"
    );
    let _ = writeln!(
        s,
        "| direct GiB/s | through exec GiB/s | ratio (medians) | target | met | exec CPU per GiB | exec peak RSS (1 GiB / nothing) |\n|---|---|---|---|---|---|---|"
    );
    let ratio = f(&v["ratio"]);
    let _ = writeln!(
        s,
        "| {} | {} | {:.2} | ≥ {} | {} | {:.0} ms | {} / {} KiB |",
        each(&nums("direct_gib_s")),
        each(&nums("exec_gib_s")),
        ratio,
        f(&v["target_ratio"]),
        met(ratio >= f(&v["target_ratio"])),
        f(&v["exec_added_cpu_ms_per_gib"]),
        v["exec_peak_rss_kib_1gib"],
        v["exec_peak_rss_kib_empty"],
    );
    // Kept runs of 7 rounds ran each kind's rounds in one block; from 21 rounds on
    // (stall::LINE_ROUNDS), the kinds take turns within each round.
    let turns = v["lines"][0]["direct_gib_s"]
        .as_array()
        .is_some_and(|r| r.len() > 7);
    let _ = writeln!(
        s,
        "\n**The stall watch: lines through exec** (256 MiB of lines of 64 or 200 bytes from `cat` into a pipe, first byte to end; directly and through `trainlet exec --report --stall-after 10m`, with and without `--progress-pattern 'step (\\d+)'`, which every line matches; {}):\n",
        if turns {
            "in each round the four kinds take turns, each side first in every other turn"
        } else {
            "each kind's rounds in a row, each side first in every other round"
        }
    );
    let _ = writeln!(
        s,
        "| line | pattern | runs | direct GiB/s, median (min–max) | through exec GiB/s, median (min–max) | ratio (medians) | target | met |\n|---|---|---|---|---|---|---|---|"
    );
    let spread = |xs: &[f64]| -> String {
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{:.2} ({lo:.2}–{hi:.2})", median(xs))
    };
    for l in v["lines"].as_array().into_iter().flatten() {
        let nums = |k: &str| -> Vec<f64> { l[k].as_array().into_iter().flatten().map(f).collect() };
        let ratio = f(&l["ratio"]);
        let _ = writeln!(
            s,
            "| {} B | {} | {} | {} | {} | {:.3} | ≥ {} | {} |",
            l["line_bytes"],
            if l["pattern"] == true { "yes" } else { "no" },
            nums("direct_gib_s").len(),
            spread(&nums("direct_gib_s")),
            spread(&nums("exec_gib_s")),
            ratio,
            f(&v["target_ratio"]),
            met(ratio >= f(&v["target_ratio"])),
        );
    }
    let _ = writeln!(
        s,
        "\n**The stall watch: hang to group restart** (3 pods, `--stall-after {}s --on-stall restart --interval {}s --restart-backoff {}s`; from the silent pod's last line to each pod's CMD starting again):\n",
        f(&v["stall_after_s"]),
        f(&v["interval_s"]),
        f(&v["backoff_s"])
    );
    if let Some(e) = v["error"].as_str() {
        let _ = writeln!(s, "Failed: {e}.");
        return;
    }
    let beyond = f(&v["beyond_stall_after_s"]);
    // Runs since each pod waits for the others to read their stacks keep that wait:
    // the target is one --interval beyond it.
    let (target, why) = match v["look_s"].as_f64() {
        Some(look) => (
            f(&v["interval_s"]) + look,
            format!("one --interval and the {look} s the pods look at their stacks"),
        ),
        None => (f(&v["interval_s"]), "one --interval".to_string()),
    };
    let _ = writeln!(
        s,
        "| restart after the hang, by pod (s) | slowest, less backoff and --stall-after | target | met |\n|---|---|---|---|\n| {} | {:.2} s | ≤ {} s ({why}) | {} |",
        each(&nums("restart_after_hang_s")),
        beyond,
        target,
        met(beyond <= target)
    );
}

/// Scenario 5: the reporters' peer watch, both modes, per sidecar and for the job.
fn peers_table(s: &mut String, rows: &[Value], sample: &Value) {
    let _ = writeln!(
        s,
        "\n**The sidecars' peer watch** (bytes the API server sent: watch events on pods and responses to pods and Events requests; per sidecar, measured on a sample of {} sidecars; the job's total = N × a sidecar's, or coordinated the resolver's + (N − 1) × a follower's):\n",
        sample
    );
    let _ = writeln!(
        s,
        "| N | mode | a sidecar at start | the resolver's at start | a sidecar per replacement | the resolver's per replacement | job at start | job per replacement | replacement seen by all |\n|---|---|---|---|---|---|---|---|---|"
    );
    let kib = |v: &Value| {
        if v.is_null() {
            "—".to_string()
        } else {
            format!("{:.1} KiB", f(v) / 1024.0)
        }
    };
    for r in rows {
        if let Some(e) = r["error"].as_str() {
            let _ = writeln!(
                s,
                "| {} | {} | failed: {e} |||||||",
                r["n"], r["coordinate"]
            );
            continue;
        }
        let mode = match r["coordinate"].as_str() {
            Some("always") => "coordinated",
            _ => "every peer",
        };
        let _ = writeln!(
            s,
            "| {} | {mode} | {} | {} | {} | {} | {:.1} MiB | {:.2} MiB | {:.1} s |",
            r["n"],
            kib(&r["start_bytes_per_sidecar"]),
            kib(&r["start_bytes_resolver"]),
            kib(&r["replacement_bytes_per_sidecar"]),
            kib(&r["replacement_bytes_resolver"]),
            f(&r["job_start_mib"]),
            f(&r["job_replacement_mib"]),
            f(&r["replacement_seen_s"])
        );
    }
    let mut ratios = Vec::new();
    for r in rows.iter().filter(|r| r["coordinate"] == "always") {
        if let Some(never) = rows
            .iter()
            .find(|x| x["n"] == r["n"] && x["coordinate"] == "never")
        {
            ratios.push(format!(
                "N = {}: {:.3}× at start, {:.3}× per replacement",
                r["n"],
                f(&r["job_start_mib"]) / f(&never["job_start_mib"]),
                f(&r["job_replacement_mib"]) / f(&never["job_replacement_mib"])
            ));
        }
    }
    if !ratios.is_empty() {
        let _ = writeln!(
            s,
            "\nThe job's bytes, coordinated against every peer watched: {}.",
            ratios.join("; ")
        );
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}

/// Scenario 2: the sidecar and exec --report side by side, under the targets.
fn sidecar_table(s: &mut String, v: &Value) {
    let t = &v["targets"];
    let (cpu_t, rss_t, writes_t) = (
        f(&t["cpu_percent_of_core"]),
        f(&t["peak_rss_mib"]),
        f(&t["writes_after_first"]),
    );
    let _ = writeln!(
        s,
        "\n**Sidecar at rest** (a steady pod each, all at once; default `--interval` {} and `--min-patch-interval` {}; measured for {:.0} s from each one's first report):\n",
        v["interval"].as_str().unwrap_or(""),
        v["min_patch_interval"].as_str().unwrap_or(""),
        f(&v["window_s"])
    );
    let _ = writeln!(
        s,
        "| process | CPU, share of one core (ms: utime+stime; schedstat) | peak RSS (VmHWM) | API writes after the first report | API writes in all (patches + Events) | first report after start | threads | health, exit on SIGTERM |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        s,
        "| target | ≤ {cpu_t} % | ≤ {rss_t} MiB | {writes_t} | | | | ok |"
    );
    for p in v["processes"].as_array().into_iter().flatten() {
        let cpu = f(&p["cpu_percent_of_core"]);
        let rss = f(&p["peak_rss_kib"]) / 1024.0;
        let w = f(&p["writes_after_first"]);
        let _ = writeln!(
            s,
            "| `{}` | {cpu:.3} % ({:.0}; {:.1}), {} | {rss:.1} MiB, {} | {w:.0}, {} | {:.0} ({:.0} + {:.0}) | {:.0} ms | {} | {}, {} |",
            p["mode"].as_str().unwrap_or(""),
            f(&p["cpu_ms_stat"]),
            f(&p["cpu_ms_schedstat"]),
            met(cpu <= cpu_t),
            met(rss <= rss_t),
            met(w <= writes_t),
            f(&p["writes_total"]),
            f(&p["patches_total"]),
            f(&p["events_total"]),
            f(&p["first_report_ms"]),
            p["threads"],
            p["health"].as_str().unwrap_or(""),
            p["exit_code"]
        );
    }
    if let Some(why) = v["pid_namespace_unavailable"].as_str() {
        let _ = writeln!(
            s,
            "\nexec --report did not also run in a PID namespace of its own: {why}."
        );
    }
    let kinds = |k: &str| -> String {
        let v: Vec<String> = v[k]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k} {}", f(v)))
            .collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    };
    let api_after = f(&v["api_writes_after_first"]);
    let _ = writeln!(
        s,
        "\nThe API server's own counters, all processes together: {:.0} writes (PATCH pods + POST events) from the start, {api_after:.0} after the last first report ({}). Requests from the start: {}; after the last first report: {}. This machine showed every reporter {} processes in /proc (exec mode reads each one's stat once a second) and {} sockets in /proc/net/tcp{{,6}} (every probe reads them); a pod sees only its own.",
        f(&v["api_writes_total"]),
        met(api_after <= writes_t),
        kinds("api_requests_total"),
        kinds("api_requests_after_first"),
        v["visible_processes"],
        v["visible_sockets"]
    );
    let (tcp, scan) = (f(&v["net_tcp_read_ms"]), f(&v["proc_scan_ms"]));
    let _ = writeln!(
        s,
        "\nWhere the CPU goes (measured here on a thread of the harness): one read of /proc/net/tcp and tcp6, as every port probe does, costs {tcp:.2} ms of CPU (the kernel walks its TCP hash tables, even for an empty tcp6), 12 times a minute at the 5 s interval: {:.0} ms a minute, {:.3} % of a core. One pass over every /proc/<pid>/stat ({} processes), as exec mode's process tree refresh does once a second, costs {scan:.2} ms: {:.0} ms a minute, {:.3} % of a core.",
        tcp * 12.0,
        tcp * 12.0 / 600.0,
        v["visible_processes"],
        scan * 60.0,
        scan * 60.0 / 600.0
    );
}

/// Scenario 3: the latency of real OOM kills, against the target.
/// Paths cut to their last part: the cgroup's directories are the machine's, named by
/// hashes that mean nothing to a reader.
fn without_dirs(text: &str) -> String {
    text.split(' ')
        .map(|w| match w.rsplit_once('/') {
            Some((_, last)) if w.starts_with('/') => format!("…/{last}"),
            _ => w.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn oom_table(s: &mut String, v: &Value) {
    let _ = writeln!(
        s,
        "\n**OOM to annotation** (`trainlet exec --report`, real kernel OOM kills of CMD's child in a memory cgroup; from CMD seeing the victim's exit to `trainlet.io/oom-kills` seen through a watch):\n"
    );
    if let Some(why) = v["skipped"].as_str() {
        let _ = writeln!(s, "Skipped: {why}.");
        return;
    }
    let median = f(&v["median_ms"]);
    let target = f(&v["target_median_ms"]);
    let _ = writeln!(
        s,
        "| kills seen | median | min | max | target (median) | met |\n|---|---|---|---|---|---|"
    );
    let _ = writeln!(
        s,
        "| {} | {:.0} ms | {:.0} ms | {:.0} ms | ≤ {:.0} ms | {} |",
        v["kills"],
        median,
        f(&v["min_ms"]),
        f(&v["max_ms"]),
        target,
        met(median <= target && v["error"].is_null())
    );
    let each: Vec<String> = v["latency_ms"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| format!("{:.0}", f(x)))
        .collect();
    let _ = writeln!(
        s,
        "\nEach kill, ms: {}. Memory limit {} MiB; the next hog starts {} s after an annotation is seen. Victims' exit statuses: {}; the kernel counted {} OOM kills; `trainlet.io/oom-kills` ends at {}; {} of the {} kills in the report name the victim `memhog`; {} OOMKill Events; OOM source: {}; trainlet exited {}.",
        each.join(", "),
        v["memory_limit_mib"],
        f(&v["gap_s"]),
        v["victim_exit_status"],
        v["kernel_oom_kills"],
        v["annotation_final"].as_str().unwrap_or(""),
        v["victims_named"],
        v["recent_listed"],
        v["oom_events"],
        without_dirs(v["oom_source"].as_str().unwrap_or("")),
        v["exit_code"]
    );
    let _ = writeln!(
        s,
        "\n| p99 | target | met | victims named | target | met |\n|---|---|---|---|---|---|\n| {:.0} ms | ≤ {:.0} ms | {} | {} of {} | {} of {} | {} |",
        f(&v["p99_ms"]),
        f(&v["target_p99_ms"]),
        met(v["p99_met"].as_bool() == Some(true)),
        v["victims_named"],
        v["kills"],
        v["kills"],
        v["kills"],
        met(v["all_named"].as_bool() == Some(true))
    );
    if v["to_logged_kill_ms"]
        .as_array()
        .is_some_and(|a| !a.is_empty())
    {
        let _ = writeln!(
            s,
            "\nThe latency split by trainlet's log (medians): from the exit to trainlet logging the kill (the cgroup's eventfd, its counters, naming the victim) {:.0} ms; to the annotation patch answered {:.0} ms; to the watch event {:.0} ms (the log line follows the answer, so this part can be slightly negative).",
            f(&v["median_to_logged_kill_ms"]),
            f(&v["median_to_patched_ms"]),
            f(&v["median_to_watch_ms"])
        );
    }
    if let Some(e) = v["error"].as_str() {
        let _ = writeln!(s, "\n**Error**: {e}.");
    }
}

/// Two panels, p99 latency and peak RSS against N (log2 axis), trainlet vs kubectl.
pub fn svg(results: &Value) -> String {
    let series = |tool: &str, key: &str, scale: f64| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = results["resolve"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["tool"] == tool && f(&r["delay_s"]) < 0.5)
            .map(|r| (f(&r["n"]), f(&r[key]) / scale))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let panels = [
        ("p99 latency (ms)", "p99_ms", 1.0),
        ("peak RSS per agent (MiB)", "rss_max_kib", 1024.0),
    ];
    let (w, h, pad) = (420.0, 300.0, 50.0);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        w * 2.0,
        h + 30.0
    );
    for (pi, (title, key, scale)) in panels.iter().enumerate() {
        let x0 = pi as f64 * w;
        let t = series("Trainlet", key, *scale);
        let k = series("KubectlWait", key, *scale);
        let ymax = t
            .iter()
            .chain(&k)
            .map(|p| p.1)
            .fold(0.0_f64, f64::max)
            .max(1.0)
            * 1.1;
        let (nmin, nmax) = (8f64.log2(), 256f64.log2());
        let px = |n: f64| x0 + pad + (n.log2() - nmin) / (nmax - nmin) * (w - 2.0 * pad);
        let py = |v: f64| h - pad + 20.0 - v / ymax * (h - 2.0 * pad);
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">{title}</text>",
            x0 + w / 2.0
        );
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
            x0 + pad,
            py(0.0),
            x0 + w - pad,
            py(0.0)
        );
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
            x0 + pad,
            py(0.0),
            x0 + pad,
            py(ymax)
        );
        for n in [8.0, 64.0, 256.0] {
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">N={n}</text>",
                px(n),
                py(0.0) + 16.0
            );
        }
        for i in 0..=4 {
            let v = ymax * i as f64 / 4.0;
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v:.0}</text>",
                x0 + pad - 4.0,
                py(v) + 4.0
            );
        }
        for (pts, color, name, dy) in [
            (&t, "#1f77b4", "trainlet init", 0.0),
            (&k, "#d62728", "kubectl wait + get", 16.0),
        ] {
            let path: Vec<String> = pts
                .iter()
                .map(|(n, v)| format!("{:.1},{:.1}", px(*n), py(*v)))
                .collect();
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                path.join(" ")
            );
            for (n, v) in pts.iter() {
                let _ = writeln!(
                    out,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"><title>{v:.1}</title></circle>",
                    px(*n),
                    py(*v)
                );
            }
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>",
                x0 + pad + 10.0,
                40.0 + dy
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// A scenario that keeps a file of its own writes its results to
/// target/bench/`name` (`results-floor.json`), for `cp` into docs/bench/.
pub fn write_own(name: &str, results: &Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(name),
        serde_json::to_string_pretty(results).unwrap(),
    )
    .unwrap();
    eprintln!("bench: wrote {}/{name}", dir.display());
}

pub fn write(results: &Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(results).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("resolve.svg"), svg(results)).unwrap();
    println!(
        "Commit: {} (kept in the JSON; the pages show no commits)\n{}",
        results["commit"].as_str().unwrap_or(""),
        markdown(results)
    );
    // docs/benchmarks.md as it would read with this run kept as docs/bench/results.json.
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(repo.join("docs/benchmarks.md")).unwrap_or_default();
    let preview = render_blocks(&page, |name| {
        if name == "results.json" {
            return Ok(results.clone());
        }
        load_kept(name)
    });
    match preview {
        Ok(p) => std::fs::write(dir.join("benchmarks.md"), p).unwrap(),
        Err(e) => eprintln!("bench: no preview of docs/benchmarks.md: {e}"),
    }
    eprintln!(
        "bench: wrote {0}/results.json, {0}/resolve.svg and {0}/benchmarks.md (docs/benchmarks.md with this run kept)",
        dir.display()
    );
}

/// The node scenario's variants, as its results name them.
pub const NODE_TRAINLET: &str = "trainlet init container";
pub const NODE_HAND_WRITTEN: &str = "hand-written init container (kubectl wait + get + sh)";

/// A node scenario's `field` in each of its runs of `variant`, in ms: `4145, 3141`.
fn each_run(r: &Value, variant: &str, field: &str) -> String {
    let runs: Vec<String> = r["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["variant"] == variant)
        .map(|x| format!("{:.0}", x[field].as_f64().unwrap_or(f64::NAN)))
        .collect();
    runs.join(", ")
}

/// The markdown of the node scenario.
pub fn node_markdown(r: &Value) -> String {
    let mut s = format!(
        "Machine: {}. Command: `{}`.\n",
        r["machine"].as_str().unwrap_or(""),
        r["command"].as_str().unwrap_or("")
    );
    let m = &r["median_last_written_ms"];
    s += &format!(
        "\n**On the real node** ({}; from `kubectl apply` to the last pod's TF_CONFIG written, median of {} runs each, alternating):\n\n",
        r["job"].as_str().unwrap_or_default(),
        r["rounds"]
    );
    s += "| init container | last TF_CONFIG written, ms (median) | each run, ms |\n|---|---|---|\n";
    for (key, label) in [
        ("trainlet", NODE_TRAINLET),
        ("hand_written", NODE_HAND_WRITTEN),
    ] {
        s += &format!(
            "| {label} | {:.0} | {} |\n",
            m[key].as_f64().unwrap_or(f64::NAN),
            each_run(r, label, "last_written_ms")
        );
    }
    s += &format!(
        "\nRatio (hand-written / trainlet): {:.1}×\n\n",
        m["ratio_hand_written_over_trainlet"]
            .as_f64()
            .unwrap_or(f64::NAN)
    );
    s += &format!(
        "| init container variant | container | peak memory MiB (`{}`), median / max | samples (pods × runs) |\n|---|---|---|---|\n",
        r["cgroup_file"].as_str().unwrap_or_default()
    );
    for p in r["peak_memory"].as_array().into_iter().flatten() {
        let mib = |k: &str| p[k].as_f64().unwrap_or(f64::NAN) / 1048576.0;
        s += &format!(
            "| {} | {} | {:.1} / {:.1} | {} |\n",
            p["variant"].as_str().unwrap_or_default(),
            p["container"].as_str().unwrap_or_default(),
            mib("median_bytes"),
            mib("max_bytes"),
            p["samples"]
        );
    }
    s
}

/// The start of a block of docs/benchmarks.md rendered from a kept run:
/// `<!-- rendered from docs/bench/NAME.json -->`, up to [`BLOCK_END`].
const BLOCK_START: &str = "<!-- rendered from docs/bench/";
const BLOCK_END: &str = "<!-- end of rendered figures -->";

/// A kept run, docs/bench/NAME.
pub fn load_kept(name: &str) -> Result<Value, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/bench")
        .join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The markdown of the recovery scenario: a row per variant, in the order the run
/// lists them.
pub fn recovery_markdown(r: &Value) -> String {
    let mut s = format!(
        "Machine: {}. Kubernetes {}. Command: `{}`.\n",
        r["machine"].as_str().unwrap_or(""),
        r["kubernetes"].as_str().unwrap_or(""),
        r["command"].as_str().unwrap_or("")
    );
    let m = &r["median_recovered_ms"];
    let running = &r["median_new_pods_running_ms"];
    s += &format!(
        "\n**Recovery from a failed rank** ({}; from the kill until every rank printed the first step of a new run, median of {} runs each, alternating):\n\n",
        r["job"].as_str().unwrap_or_default(),
        r["rounds"]
    );
    s += "| recovery | every rank stepping again, ms (median) | each run, ms | new pods Running, ms (median) |\n|---|---|---|---|\n";
    for v in r["variants"].as_array().into_iter().flatten() {
        let key = v["key"].as_str().unwrap_or_default();
        s += &format!(
            "| {} | {:.0} | {} | {} |\n",
            v["label"].as_str().unwrap_or_default(),
            m[key].as_f64().unwrap_or(f64::NAN),
            each_run(r, key, "recovered_ms"),
            running[key]
                .as_f64()
                .map_or("no new pod".to_string(), |ms| format!("{ms:.0}"))
        );
    }
    s += &format!(
        "\nRatio (in place on failure / in place after a replaced pod): {}.\n",
        ratio(
            m["ratio_on_failure_over_replaced"]
                .as_f64()
                .unwrap_or(f64::NAN)
        )
    );
    s
}

/// The pre-flight runs of `n` agents with or without it: their times, ms.
fn preflight_runs(runs: &Value, n: usize, preflight: bool) -> String {
    runs.as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["n"] == n && x["preflight"] == preflight)
        .map(|x| format!("{:.0}", x["all_done_ms"].as_f64().unwrap_or(f64::NAN)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The markdown of the pre-flight scenario.
pub fn preflight_markdown(r: &Value) -> String {
    let mut s = format!(
        "Machine: {}. Command: `{}`.\n",
        r["machine"].as_str().unwrap_or(""),
        r["command"].as_str().unwrap_or("")
    );
    s += &format!(
        "\n**What `--preflight` adds to a job's start** (N `trainlet init` agents, real sockets between them; from the last pod's status until the last agent's file, median of {} runs each, alternating):\n\n",
        r["rounds"]
    );
    s += "| N | without, ms (median) | with `--preflight`, ms (median) | added, ms | each run without / with, ms |\n|---|---|---|---|---|\n";
    let m = r["median_added_ms"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut sizes: Vec<(usize, Value)> = m
        .into_iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v)))
        .collect();
    sizes.sort_by_key(|(n, _)| *n);
    for (n, v) in sizes {
        let each = |pf: bool| preflight_runs(&r["runs"], n, pf);
        s += &format!(
            "| {n} | {:.0} | {:.0} | {:.0} | {} / {} |\n",
            v["without_ms"].as_f64().unwrap_or(f64::NAN),
            v["with_ms"].as_f64().unwrap_or(f64::NAN),
            v["added_ms"].as_f64().unwrap_or(f64::NAN),
            each(false),
            each(true)
        );
    }
    let node = &r["node"];
    if node.is_object() {
        let each = |pf: bool| preflight_runs(&node["runs"], 3, pf);
        s += &format!(
            "\n**On the real node** (a 3-pod Indexed Job through `trainlet inject`, the shipped layout; from `kubectl apply` until the last trainlet-init wrote its file, by the container runtime's log timestamps): {:.0} ms without, {:.0} ms with `--preflight` (medians), {:.0} ms added; each run without / with: {} / {} ms.\n",
            node["without_ms"].as_f64().unwrap_or(f64::NAN),
            node["with_ms"].as_f64().unwrap_or(f64::NAN),
            node["added_ms"].as_f64().unwrap_or(f64::NAN),
            each(false),
            each(true)
        );
    }
    s
}

/// A kept run as markdown: a node scenario's file or a whole run's.
pub fn render(results: &Value) -> String {
    if results.get("median_last_written_ms").is_some() {
        node_markdown(results)
    } else if results.get("median_added_ms").is_some() {
        preflight_markdown(results)
    } else if results.get("median_recovered_ms").is_some() {
        recovery_markdown(results)
    } else if results.get("floor_sizes").is_some() {
        floor_report::markdown(results)
    } else if results.get("stacks_processes").is_some() {
        stacks_report::markdown(results)
    } else {
        markdown(results)
    }
}

/// `doc` with every rendered block made anew from the kept run it names (`load` reads
/// docs/bench/NAME.json): a figure in the page is one of a kept run, never typed.
pub fn render_blocks(
    doc: &str,
    load: impl Fn(&str) -> Result<Value, String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = doc;
    while let Some(at) = rest.find(BLOCK_START) {
        let line_end = rest[at..]
            .find('\n')
            .map(|i| at + i + 1)
            .ok_or("a rendered block's first line has no end")?;
        let name = rest[at + BLOCK_START.len()..line_end]
            .trim_end()
            .strip_suffix(" -->")
            .ok_or("a rendered block's first line does not end with ' -->'")?;
        let end = rest[line_end..]
            .find(BLOCK_END)
            .map(|i| line_end + i)
            .ok_or_else(|| format!("the block of docs/bench/{name} has no '{BLOCK_END}'"))?;
        out.push_str(&rest[..line_end]);
        out.push('\n');
        out.push_str(render(&load(name)?).trim());
        out.push_str("\n\n");
        rest = &rest[end..];
    }
    out.push_str(rest);
    Ok(out)
}
