//! The markdown of the stacks scenario (stacks.rs), from its results: a module of the
//! report, so that `make bench-docs` renders a kept run of it like any other.

use std::fmt::Write as _;

use serde_json::Value;

use super::{met, ratio};

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Each round's seconds, in milliseconds.
fn rounds_ms(v: &Value) -> String {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| format!("{:.0}", num(x) * 1e3))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The markdown of a stacks run.
pub fn markdown(r: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {}. Command: `{}`.\n",
        r["machine"].as_str().unwrap_or(""),
        r["command"].as_str().unwrap_or(""),
    );
    let _ = writeln!(
        s,
        "**Where CMD is stuck** ({} Python processes under `trainlet exec --report`, each {} frames deep; {} rounds; py-spy's CLI: `{}`):\n",
        r["stacks_processes"],
        r["depth"],
        r["rounds"],
        r["py_spy"].as_str().unwrap_or(""),
    );
    s += "| way | median ms | each round, ms | against trainlet stacks |\n|---|---|---|---|\n";
    let rows = [
        (
            "`trainlet stacks` (exec reads every process, without pausing)",
            "trainlet_stacks_s",
            "trainlet_median_s",
            None,
        ),
        (
            "`py-spy dump --pid` of each, one after the other (each paused)",
            "py_spy_paused_s",
            "py_spy_paused_median_s",
            Some("ratio_to_paused"),
        ),
        (
            "`py-spy dump --nonblocking --pid` of each, one after the other",
            "py_spy_nonblocking_s",
            "py_spy_nonblocking_median_s",
            Some("ratio_to_nonblocking"),
        ),
    ];
    for (label, each, median, against) in rows {
        let against = against
            .map(|k| format!("trainlet takes {}", ratio(num(&r[k]))))
            .unwrap_or_else(|| "—".into());
        let _ = writeln!(
            s,
            "| {label} | {:.0} | {} | {against} |",
            num(&r[median]) * 1e3,
            rounds_ms(&r[each]),
        );
    }
    let _ = writeln!(
        s,
        "\n| goal | figure | target | met |\n|---|---|---|---|\n| every capture of {} processes | slowest {:.0} ms | ≤ {:.0} ms | {} |\n| exec's peak RSS (VmHWM) grows | {:.1} → {:.1} MiB: {:+.1} MiB | ≤ {} MiB | {} |",
        r["stacks_processes"],
        r["trainlet_stacks_s"]
            .as_array()
            .into_iter()
            .flatten()
            .map(num)
            .fold(0.0, f64::max)
            * 1e3,
        num(&r["time_target_s"]) * 1e3,
        met(r["time_met"] == true),
        num(&r["exec_hwm_before_kib"]) / 1024.0,
        num(&r["exec_hwm_after_kib"]) / 1024.0,
        num(&r["exec_hwm_growth_mib"]),
        r["rss_target_mib"],
        met(r["rss_met"] == true),
    );
    if let Some(e) = r["error"].as_str() {
        let _ = writeln!(s, "\nError: {e}");
    }
    s
}
