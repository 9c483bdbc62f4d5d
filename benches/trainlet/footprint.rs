//! Scenario 4: the binary's size and cold start, next to kubectl's.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Footprint {
    pub binary_bytes: u64,
    pub version_ms: f64,
    pub bad_flag_ms: f64,
    pub bad_flag_exit: i32,
    pub kubectl_version_ms: f64,
}

/// Median wall time of `runs` cold starts.
fn median_ms(runs: usize, mut make: impl FnMut() -> Command) -> (f64, i32) {
    let mut times = Vec::new();
    let mut code = 0;
    for _ in 0..runs {
        let mut cmd = make();
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null());
        let t = Instant::now();
        code = cmd.status().unwrap().code().unwrap_or(-1);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], code)
}

pub fn measure(bin: &Path) -> Footprint {
    let (version_ms, _) = median_ms(21, || {
        let mut c = Command::new(bin);
        c.arg("--version");
        c
    });
    let (bad_flag_ms, bad_flag_exit) = median_ms(21, || {
        let mut c = Command::new(bin);
        c.args(["init", "--bogus"]);
        c
    });
    let (kubectl_version_ms, _) = median_ms(21, || {
        let mut c = Command::new("kubectl");
        c.args(["version", "--client"]);
        c
    });
    Footprint {
        binary_bytes: std::fs::metadata(bin).unwrap().len(),
        version_ms,
        bad_flag_ms,
        bad_flag_exit,
        kubectl_version_ms,
    }
}
