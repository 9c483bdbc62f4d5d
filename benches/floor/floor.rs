//! The floor: the least a Rust program can do for what `trainlet init` waits for, so
//! that the bench can say how far trainlet is above it (`TRAINLET_BENCH_ONLY=floor`,
//! benches/trainlet/floor.rs).
//!
//! It is built like trainlet: `cargo build --release --example floor`, the release
//! profile itself (size-optimised, fat LTO, one codegen unit, stripped, `panic =
//! "abort"`; a bench target would be built as a test, with unwinding), the same crates
//! with the same features (kube's client and runtime over rustls, k8s-openapi, tokio),
//! a current-thread runtime as trainlet's commands start one (src/cmd/mod.rs), and a
//! client made from the kubeconfig file as src/kube.rs makes it
//! (`Kubeconfig::read_from`, `Config::from_custom_kubeconfig`). The bench starts it like
//! an agent, under the same `/usr/bin/time`, with the same kubeconfig, namespace and
//! label selector.
//!
//! It watches the job's pods (kube-runtime's `watcher` with the label selector, in the
//! namespace, with its default list-then-watch and default backoff: what a bare kube-rs
//! program writes; trainlet asks for the initial state as watch events, which changes
//! the requests, not the latency measured after the last pod's status) and exits on the event that makes the last of the `--expect` pods
//! Running with a pod IP. It resolves nothing, renders nothing and writes no file but
//! one: the bench measures an agent's end by the mtime of a file it writes (trainlet's
//! `tf_config.json`), so the floor creates an empty `done` in `--output-dir` at that
//! event, the least that gives the bench the same measurement.
//!
//! An example target (Cargo.toml) under benches/, so that `cargo install` and the top
//! level of the repository stay as they are.
//!
//! Usage: `floor --kubeconfig FILE --namespace NS --selector SEL --expect N --output-dir DIR`

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Config};

/// The command line, read by hand: a bare program has no clap.
struct Args {
    kubeconfig: PathBuf,
    namespace: String,
    selector: String,
    expect: usize,
    output_dir: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut kc, mut ns, mut sel, mut expect, mut out) = (None, None, None, None, None);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--kubeconfig" => kc = Some(PathBuf::from(value)),
            "--namespace" => ns = Some(value),
            "--selector" => sel = Some(value),
            "--expect" => expect = Some(value.parse().map_err(|e| format!("--expect: {e}"))?),
            "--output-dir" => out = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let need = |name: &str| format!("{name} is required");
    Ok(Args {
        kubeconfig: kc.ok_or_else(|| need("--kubeconfig"))?,
        namespace: ns.ok_or_else(|| need("--namespace"))?,
        selector: sel.ok_or_else(|| need("--selector"))?,
        expect: expect.ok_or_else(|| need("--expect"))?,
        output_dir: out.ok_or_else(|| need("--output-dir"))?,
    })
}

/// Running with a pod IP: the state the bench's kubelet player puts every pod in at once
/// (trainlet also counts a pod still in its init containers with an address; the
/// player makes none).
fn is_up(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            && s.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty())
    })
}

/// `pod` into `up` or out of it, by name.
fn note(up: &mut HashSet<String>, pod: &Pod) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if is_up(pod) {
        up.insert(name);
    } else {
        up.remove(&name);
    }
}

async fn run(a: Args) -> Result<(), String> {
    let kc = Kubeconfig::read_from(&a.kubeconfig).map_err(|e| e.to_string())?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let client = Client::try_from(config).map_err(|e| e.to_string())?;
    let api: Api<Pod> = Api::namespaced(client, &a.namespace);
    let cfg = watcher::Config::default().labels(&a.selector);
    let mut events = watcher(api, cfg).default_backoff().boxed();
    // The pods up; while a (re)list is under way, the list's own set, swapped in at its end.
    let mut up = HashSet::new();
    let mut listing: Option<HashSet<String>> = None;
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => listing = Some(HashSet::new()),
            Ok(Event::InitApply(p)) => note(listing.get_or_insert_default(), &p),
            Ok(Event::InitDone) => up = listing.take().unwrap_or_default(),
            Ok(Event::Apply(p)) => note(&mut up, &p),
            Ok(Event::Delete(p)) => {
                up.remove(p.metadata.name.as_deref().unwrap_or_default());
            }
            Err(e) => eprintln!("floor: watching pods failed, retrying: {e}"),
        }
        if listing.is_none() && up.len() >= a.expect {
            // The end the bench measures: this file's mtime.
            std::fs::File::create(a.output_dir.join("done")).map_err(|e| e.to_string())?;
            return Ok(());
        }
    }
    Err("the watch ended".into())
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("floor: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the runtime");
    match rt.block_on(run(a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: {e}");
            ExitCode::FAILURE
        }
    }
}
