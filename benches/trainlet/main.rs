//! `make bench`: trainlet against what users write today, side by side, in one run, on
//! one private control plane (so no other test's requests pollute the API server's
//! counters).
//!
//! Scenarios:
//! 1. resolve: N agents start before any pod runs; the kubelet player marks the pods
//!    Running in random order over about a second. Latency is from the moment the API
//!    server was sent the last pod's Running status to the mtime of each agent's
//!    `tf_config.json`. Peak RSS comes from `/usr/bin/time -f %M` (a child spawned
//!    straight from this harness would report the harness's RSS), API requests and
//!    bytes from the API server's own `/metrics`.
//!    Baseline: `kubectl wait` + `kubectl get` + shell, each kubectl a cold process with
//!    its own empty discovery cache, as in a fresh init container. At N=8 also a 2 s
//!    `kubectl get` polling loop (k8s-wait-for), and a variant where the pods come up
//!    after 20 s, to show that trainlet's API cost does not grow with the wait.
//! 2. sidecar at rest: `trainlet sidecar` and `trainlet exec --report` (also in a PID
//!    namespace of its own, as in a container) on steady pods for 60 s at the default
//!    intervals: CPU share of one core and VmHWM from /proc, API writes from the API
//!    server's `/metrics` and the reporters' own counters (sidecar.rs).
//! 3. OOM-to-annotation latency: 10 real kernel OOM kills of CMD's child in a memory
//!    cgroup under `exec --report`, from CMD seeing the exit to the annotation seen
//!    through a watch (oom.rs).
//! 4. footprint.
//! 5. the sidecars' peer watch for the life of a job, every peer watched against
//!    coordinated, at N = 64, 256 and 1,024: bytes per sidecar at start and per peer
//!    replaced (peers.rs).
//! 6. the stall watch: CMD's output through exec against CMD writing directly, and
//!    the time from a hang to the group's restart against `--stall-after` (stall.rs).
//! 7. robustness: SIGTERM to exit, the last agent after a 5 s API server outage, and a
//!    sidecar's memory under 500 slow connections (robustness.rs).
//! 8. on the real node (tests/node/up, root): from `kubectl apply` of a 1 ps + 3 worker
//!    job to the last pod's TF_CONFIG written, trainlet's init container against a
//!    hand-written kubectl one, and each container's peak memory from the kubelet's
//!    cgroup (node.rs; `target/bench/results-node.json`).
//! 9. recovery, on the same node: from a rank's failure until every rank trains again,
//!    in place on failure, in place after a replaced pod, recreating every pod, and a
//!    JobSet's own restart (recovery.rs; `target/bench/results-recovery.json`).
//! 10. the pre-flight: what `init --preflight` adds to a job's start at N = 64 and 256,
//!     with real sockets between the agents (preflight.rs;
//!     `target/bench/results-preflight.json`).
//! 11. the floor: `trainlet init` against a bare kube-rs watch of the job's pods built
//!     like it (benches/floor/floor.rs), at N = 8, 32 and 64, five rounds each: p99 and
//!     peak RSS against the project's goal of 2× and 8 MiB (floor.rs;
//!     `target/bench/results-floor.json`).
//! 12. where CMD is stuck: `trainlet stacks` of 16 Python processes under exec, against
//!     `py-spy dump` of each, and exec's memory before and after (stacks.rs;
//!     `target/bench/results-stacks.json`).
//!
//! Output: a markdown table on stdout, `target/bench/results.json` and
//! `target/bench/resolve.svg`. A run is kept by copying its JSON into docs/bench/;
//! `make bench-docs` then renders docs/benchmarks.md's figures from the kept files
//! (tests/it/bench_docs.rs fails while the page differs from them).

// The integration tests' support code (tests/it/main.rs explains the layout): both at
// this crate's root, as there, so `report_support` reaches `crate::support` in both.
#[path = "../../tests/it/support/mod.rs"]
#[allow(unused_imports)]
mod support;

#[path = "../../tests/it/report_support.rs"]
mod report_support;

mod agents;
mod floor;
mod footprint;
mod metrics;
mod node;
mod oom;
mod peers;
mod preflight;
mod recovery;
mod report;
mod resolve;
mod robustness;
mod scenarios;
mod sidecar;
mod stacks;
mod stall;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(scenarios::run_all());
}
