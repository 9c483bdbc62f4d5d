//! Runs every scenario on one private control plane and writes the report.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use serde_json::{Value, json};

use crate::floor;
use crate::footprint;
use crate::node;
use crate::oom;
use crate::peers;
use crate::preflight;
use crate::recovery;
use crate::report;
use crate::resolve::{self, Outcome, Tool};
use crate::robustness;
use crate::sidecar;
use crate::stacks;
use crate::stall;
use crate::support;

/// What the scenarios on the private control plane are given.
struct Bench<'a> {
    client: Client,
    kc: &'a Path,
    /// The trainlet binary measured.
    bin: &'a Path,
    /// TRAINLET_BENCH_ONLY.
    only: Option<String>,
}

impl Bench<'_> {
    fn want(&self, s: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|x| x == s))
    }
}

/// The sizes in the environment variable `var` (`8,64`), else `default`.
fn sizes(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// Resolve: trainlet against `kubectl wait` at every size, and the 2 s polling loop
/// at N = 8.
async fn resolve_runs(b: &Bench<'_>) -> Vec<Outcome> {
    let mut resolves = Vec::new();
    for (i, &n) in sizes("TRAINLET_BENCH_SIZES", &[8, 64, 256])
        .iter()
        .enumerate()
    {
        // Which tool runs first alternates from size to size.
        let mut tools = [Tool::Trainlet, Tool::KubectlWait];
        if i % 2 == 1 {
            tools.reverse();
        }
        for tool in tools {
            if tool != Tool::Trainlet && !b.want("kubectl") {
                continue;
            }
            eprintln!("bench: resolve N={n} with {}", tool.label());
            resolves.push(resolve::run(&b.client, b.kc, b.bin, tool, n, Duration::ZERO).await);
        }
        if n == 8 && b.want("kubectl") {
            let tool = Tool::KubectlPoll;
            eprintln!("bench: resolve N=8 with {}", tool.label());
            resolves.push(resolve::run(&b.client, b.kc, b.bin, tool, 8, Duration::ZERO).await);
        }
    }
    resolves
}

/// Large jobs, both modes side by side: coordinated at every size, every agent
/// watching every peer up to TRAINLET_BENCH_PER_AGENT_MAX (that mode's cost grows with
/// N², on two cores).
async fn scale_runs(b: &Bench<'_>) -> Vec<Outcome> {
    let per_agent_max: usize = std::env::var("TRAINLET_BENCH_PER_AGENT_MAX")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or(512);
    let mut scaled = Vec::new();
    let scale = sizes("TRAINLET_BENCH_SCALE", &[256, 512, 1024]);
    for (i, &n) in scale.iter().enumerate() {
        for types in [1, 2] {
            // Which mode runs first alternates from one shape to the next.
            let mut tools = [Tool::TrainletCoordinated, Tool::Trainlet];
            if (i + types) % 2 == 0 {
                tools.reverse();
            }
            for tool in tools {
                if tool == Tool::Trainlet && n > per_agent_max {
                    continue;
                }
                eprintln!("bench: scale N={n}, {types} type(s), {}", tool.label());
                scaled.push(
                    resolve::run_shaped(&b.client, b.kc, b.bin, tool, n, types, Duration::ZERO)
                        .await,
                );
            }
        }
    }
    scaled
}

/// N = 8 with the pods up only after 20 s: trainlet's API cost does not grow with the
/// wait.
async fn delayed_runs(b: &Bench<'_>) -> Vec<Outcome> {
    let mut runs = Vec::new();
    for tool in [Tool::Trainlet, Tool::KubectlWait, Tool::KubectlPoll] {
        eprintln!(
            "bench: resolve N=8, pods up after 20 s, with {}",
            tool.label()
        );
        let delay = Duration::from_secs(20);
        runs.push(resolve::run(&b.client, b.kc, b.bin, tool, 8, delay).await);
    }
    runs
}

/// The reporters' peer watch for the life of the job, both modes.
async fn peer_runs(b: &Bench<'_>) -> Vec<peers::Outcome> {
    let mut peer_watch = Vec::new();
    for n in sizes("TRAINLET_BENCH_PEER_SIZES", &[64, 256, 1024]) {
        for coordinate in ["never", "always"] {
            eprintln!("bench: the sidecars' peer watch, N={n}, --coordinate {coordinate}");
            peer_watch.push(peers::run(&b.client, b.kc, n, coordinate).await);
        }
    }
    peer_watch
}

/// Every scenario's results, `null` (or empty) where it did not run.
#[derive(Default)]
struct Runs {
    resolve: Vec<Outcome>,
    scale: Vec<Outcome>,
    sidecar: Value,
    oom: Value,
    peers: Vec<peers::Outcome>,
    stall: Value,
    robustness: Value,
    preflight: Value,
    floor: Value,
    stacks: Value,
    footprint: Value,
    node: Value,
    recovery: Value,
}

/// The resolve scenarios and the reporters' on the private control plane.
async fn agent_runs(b: &Bench<'_>, r: &mut Runs) {
    if b.want("resolve") {
        r.resolve = resolve_runs(b).await;
    }
    if b.want("scale") {
        r.scale = scale_runs(b).await;
    }
    if b.want("delayed") {
        r.resolve.extend(delayed_runs(b).await);
    }
    if b.want("sidecar") {
        eprintln!(
            "bench: sidecar and exec --report at rest, {} s",
            sidecar::WINDOW.as_secs()
        );
        r.sidecar = json!(sidecar::run(&b.client, b.kc).await);
    }
    if b.want("oom") {
        eprintln!("bench: OOM to annotation, {} kernel OOM kills", oom::KILLS);
        r.oom = json!(oom::run(&b.client, b.kc).await);
    }
    if b.want("peers") {
        r.peers = peer_runs(b).await;
    }
}

/// The stall watch, robustness, the pre-flight, the floor, the stacks and the footprint.
async fn more_runs(b: &Bench<'_>, r: &mut Runs) {
    let (client, kc) = (&b.client, b.kc);
    if b.want("stall") {
        eprintln!("bench: the stall watch: 1 GiB through exec, and a hang to the group restart");
        r.stall = json!(stall::run(client, kc).await);
    }
    if b.want("robustness") {
        eprintln!("bench: SIGTERM to exit, an API server outage, 500 slow connections");
        r.robustness = json!(robustness::run(client, kc).await);
    }
    if b.want("preflight") {
        eprintln!("bench: what --preflight adds to a job's start");
        r.preflight = preflight::run(client, kc, b.bin, &[64, 256]).await;
    }
    if b.want("floor") {
        eprintln!("bench: trainlet init against the floor, a bare kube-rs watch");
        r.floor = floor::run(client, kc, b.bin).await;
    }
    if b.want("stacks") {
        eprintln!(
            "bench: trainlet stacks against py-spy dump, {} Python processes",
            stacks::PROCESSES
        );
        r.stacks = stacks::run(client, kc, b.bin).await;
    }
    if b.want("footprint") {
        r.footprint = json!(footprint::measure(b.bin));
    }
}

/// The scenarios on the real node (root; a control plane of its own): skipped, and
/// said so, where something they need is missing.
async fn node_runs(b: &Bench<'_>, r: &mut Runs) {
    if b.want("node") {
        eprintln!("bench: on the real node, trainlet's init container against a hand-written one");
        r.node = json!(node::run().await);
    }
    // The same node: recovery from a failed rank, four ways.
    if b.want("recovery") {
        eprintln!(
            "bench: recovery from a failed rank: in place on failure, after a replaced pod, recreating every pod, a JobSet's restart"
        );
        r.recovery = json!(recovery::run().await);
    }
}

pub async fn run_all() {
    // TRAINLET_BENCH_ONLY=resolve,kubectl,delayed,footprint,sidecar,oom,peers,stall,robustness,node,recovery,preflight,floor,stacks picks scenarios
    // (and whether the kubectl baselines run) for quick iterations; all by default.
    // Only the ServiceAccount controller (a namespace's default ServiceAccount): the
    // garbage collector's periodic discovery would show in the API server's counters.
    let cp = support::PrivateControlPlane::start_with("bench", Some("serviceaccount"));
    // TRAINLET_BENCH_BIN: another trainlet binary to measure with this harness (an older
    // commit's, built in a worktree); by default the one cargo built for this bench.
    let bin = std::env::var_os("TRAINLET_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_trainlet")));
    let b = Bench {
        client: support::client_from(&cp.kubeconfig).await,
        kc: &cp.kubeconfig,
        bin: &bin,
        only: std::env::var("TRAINLET_BENCH_ONLY").ok(),
    };
    let mut r = Runs::default();
    agent_runs(&b, &mut r).await;
    more_runs(&b, &mut r).await;
    node_runs(&b, &mut r).await;

    let results = json!({
        "machine": report::machine(),
        "commit": report::commit(),
        "command": report::command(),
        "resolve": r.resolve,
        "scale": r.scale,
        "footprint": r.footprint,
        "sidecar": r.sidecar,
        "oom": r.oom,
        "peers": r.peers,
        "peers_sample": peers::SAMPLE + 1,
        "stall": r.stall,
        "robustness": r.robustness,
        "node": r.node,
        "recovery": r.recovery,
        "preflight": r.preflight,
    });
    report::write(&results);
    // The scenarios that keep a file of their own print their tables here.
    let own = |v: &Value, markdown: fn(&Value) -> String| (!v.is_null()).then(|| markdown(v));
    let tables = [
        own(&r.node, report::node_markdown),
        own(&r.recovery, report::recovery_markdown),
        own(&r.preflight, report::preflight_markdown),
        own(&r.floor, report::floor_report::markdown),
        own(&r.stacks, report::stacks_report::markdown),
    ];
    for table in tables.into_iter().flatten() {
        println!("{table}");
    }
}
