//! Runs every scenario on one private control plane and writes the report.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::footprint;
use crate::node;
use crate::oom;
use crate::peers;
use crate::preflight;
use crate::recovery;
use crate::report;
use crate::resolve::{self, Tool};
use crate::robustness;
use crate::sidecar;
use crate::stall;
use crate::support;

pub async fn run_all() {
    // TRAINLET_BENCH_ONLY=resolve,kubectl,delayed,footprint,sidecar,oom,peers,stall,robustness,node,recovery,preflight picks scenarios
    // (and whether the kubectl baselines run) for quick iterations; all by default.
    let only: Option<String> = std::env::var("TRAINLET_BENCH_ONLY").ok();
    let want = |s: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == s));
    // Only the ServiceAccount controller (a namespace's default ServiceAccount): the
    // garbage collector's periodic discovery would show in the API server's counters.
    let cp = support::PrivateControlPlane::start_with("bench", Some("serviceaccount"));
    let client = support::client_from(&cp.kubeconfig).await;
    let bin = Path::new(env!("CARGO_BIN_EXE_trainlet"));
    let sizes: Vec<usize> = std::env::var("TRAINLET_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![8, 64, 256]);

    let mut resolves = Vec::new();
    let mut scaled = Vec::new();
    if want("resolve") {
        for (i, &n) in sizes.iter().enumerate() {
            // Which tool runs first alternates from size to size.
            let mut tools = [Tool::Trainlet, Tool::KubectlWait];
            if i % 2 == 1 {
                tools.reverse();
            }
            for tool in tools {
                if tool != Tool::Trainlet && !want("kubectl") {
                    continue;
                }
                eprintln!("bench: resolve N={n} with {}", tool.label());
                resolves.push(
                    resolve::run(&client, &cp.kubeconfig, bin, tool, n, Duration::ZERO).await,
                );
            }
            if n == 8 && want("kubectl") {
                eprintln!("bench: resolve N=8 with {}", Tool::KubectlPoll.label());
                resolves.push(
                    resolve::run(
                        &client,
                        &cp.kubeconfig,
                        bin,
                        Tool::KubectlPoll,
                        8,
                        Duration::ZERO,
                    )
                    .await,
                );
            }
        }
    }
    if want("scale") {
        // Large jobs, both modes side by side: coordinated at every size, every agent
        // watching every peer up to TRAINLET_BENCH_PER_AGENT_MAX (that mode's cost
        // grows with N², on two cores).
        let scale: Vec<usize> = std::env::var("TRAINLET_BENCH_SCALE")
            .ok()
            .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
            .unwrap_or_else(|| vec![256, 512, 1024]);
        let per_agent_max: usize = std::env::var("TRAINLET_BENCH_PER_AGENT_MAX")
            .ok()
            .map(|s| s.parse().unwrap())
            .unwrap_or(512);
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
                        resolve::run_shaped(
                            &client,
                            &cp.kubeconfig,
                            bin,
                            tool,
                            n,
                            types,
                            Duration::ZERO,
                        )
                        .await,
                    );
                }
            }
        }
    }
    if want("delayed") {
        for tool in [Tool::Trainlet, Tool::KubectlWait, Tool::KubectlPoll] {
            eprintln!(
                "bench: resolve N=8, pods up after 20 s, with {}",
                tool.label()
            );
            resolves.push(
                resolve::run(
                    &client,
                    &cp.kubeconfig,
                    bin,
                    tool,
                    8,
                    Duration::from_secs(20),
                )
                .await,
            );
        }
    }
    let rest = if want("sidecar") {
        eprintln!(
            "bench: sidecar and exec --report at rest, {} s",
            sidecar::WINDOW.as_secs()
        );
        Some(sidecar::run(&client, &cp.kubeconfig).await)
    } else {
        None
    };
    let oom_latency = if want("oom") {
        eprintln!("bench: OOM to annotation, {} kernel OOM kills", oom::KILLS);
        Some(oom::run(&client, &cp.kubeconfig).await)
    } else {
        None
    };
    let mut peer_watch = Vec::new();
    if want("peers") {
        // The reporters' peer watch for the life of the job, both modes.
        let sizes: Vec<usize> = std::env::var("TRAINLET_BENCH_PEER_SIZES")
            .ok()
            .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
            .unwrap_or_else(|| vec![64, 256, 1024]);
        for &n in &sizes {
            for coordinate in ["never", "always"] {
                eprintln!("bench: the sidecars' peer watch, N={n}, --coordinate {coordinate}");
                peer_watch.push(peers::run(&client, &cp.kubeconfig, n, coordinate).await);
            }
        }
    }
    let stall_watch = if want("stall") {
        eprintln!("bench: the stall watch: 1 GiB through exec, and a hang to the group restart");
        Some(stall::run(&client, &cp.kubeconfig).await)
    } else {
        None
    };
    let robust = if want("robustness") {
        eprintln!("bench: SIGTERM to exit, an API server outage, 500 slow connections");
        Some(robustness::run(&client, &cp.kubeconfig).await)
    } else {
        None
    };
    let preflighted = if want("preflight") {
        eprintln!("bench: what --preflight adds to a job's start");
        Some(preflight::run(&client, &cp.kubeconfig, bin, &[64, 256]).await)
    } else {
        None
    };
    let foot = want("footprint").then(|| footprint::measure(bin));
    // On the real node (root; its own control plane): skipped, and said so, where
    // something it needs is missing.
    let on_node = if want("node") {
        eprintln!("bench: on the real node, trainlet's init container against a hand-written one");
        node::run().await
    } else {
        None
    };
    // The same node: recovery from a failed rank, four ways.
    let recovered = if want("recovery") {
        eprintln!(
            "bench: recovery from a failed rank: in place on failure, after a replaced pod, recreating every pod, a JobSet's restart"
        );
        recovery::run().await
    } else {
        None
    };

    let results = json!({
        "machine": report::machine(),
        "commit": report::commit(),
        "command": report::command(),
        "resolve": resolves,
        "scale": scaled,
        "footprint": foot,
        "sidecar": rest,
        "oom": oom_latency,
        "peers": peer_watch,
        "peers_sample": peers::SAMPLE + 1,
        "stall": stall_watch,
        "robustness": robust,
        "node": on_node,
        "recovery": recovered,
        "preflight": preflighted,
    });
    report::write(&results);
    if let Some(n) = &on_node {
        println!("{}", report::node_markdown(n));
    }
    if let Some(r) = &recovered {
        println!("{}", report::recovery_markdown(r));
    }
    if let Some(p) = &preflighted {
        println!("{}", report::preflight_markdown(p));
    }
}
