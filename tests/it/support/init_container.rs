//! A pod's `trainlet-init` container run as the kubelet would run it: the command as
//! the manifest wrote it, in a directory that plays the emptyDir, under the pod's
//! ServiceAccount, after the pod was brought to where init containers run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use serde_json::{Value, json};

use super::*;

/// The command of one pod's `trainlet-init` container, as the kubelet would run it.
///
/// Substituted, and only this:
/// - the program: `/usr/local/bin/trainlet` (the image's path) is the binary under test;
/// - paths under the volume's mount path (`/etc/trainlet`, in args such as
///   `--install-to=/etc/trainlet/bin`) point into a temp dir that plays the emptyDir,
///   and TRAINLET_OUTPUT_DIR is that dir, because --output-dir defaults to the mount
///   path, which does not exist on the test machine;
/// - the downward API env gets the pod's real name, namespace and uid;
/// - TRAINLET_KUBECONFIG is a kubeconfig with a token of the ServiceAccount the pod
///   runs as, in place of the in-cluster service account files.
pub fn init_command(pod: &Pod, volume_dir: &Path, kubeconfig: &Path) -> Command {
    let spec = pod.spec.as_ref().unwrap();
    let c: &Container = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "trainlet-init")
        .expect("a trainlet-init container");
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "trainlet")
        .expect("the trainlet volume is mounted")
        .mount_path
        .clone();
    let map = |s: &str| s.replace(&mount, volume_dir.to_str().unwrap());
    let argv: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect();
    assert_eq!(argv[0], "/usr/local/bin/trainlet", "{argv:?}");
    let mut cmd = trainlet();
    cmd.args(argv[1..].iter().map(|a| map(a)));
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => {
                let path = &from.field_ref.as_ref().expect("fieldRef").field_path;
                match path.as_str() {
                    "metadata.name" => pod.name_any(),
                    "metadata.namespace" => pod.namespace().unwrap(),
                    "metadata.uid" => pod.uid().unwrap(),
                    // The Job controller adds JOB_COMPLETION_INDEX from the label.
                    other => match other
                        .strip_prefix("metadata.labels['")
                        .and_then(|k| k.strip_suffix("']"))
                    {
                        Some(key) => pod.labels()[key].clone(),
                        None => panic!("unexpected downward API field {other}"),
                    },
                }
            }
            _ => panic!("unexpected env {e:?}"),
        };
        cmd.env(&e.name, value);
    }
    cmd.env("TRAINLET_OUTPUT_DIR", volume_dir);
    cmd.env("TRAINLET_KUBECONFIG", kubeconfig);
    cmd
}

/// Plays the scheduler and kubelet up to the moment `trainlet-init` runs: bound,
/// Pending with a pod IP, the init container running and the rest waiting. Every pod of
/// a job sits there at the same time in a cluster, waiting for the others.
pub async fn pending_in_init(kubelet: &Kubelet, pod: &Pod, ip: &str) {
    let name = pod.name_any();
    kubelet.bind(&name, "node-a").await;
    let now = now();
    let spec = pod.spec.as_ref().unwrap();
    let image = |c: &Container| c.image.clone().unwrap_or_default();
    let init_statuses: Vec<Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let state = if c.name == "trainlet-init" {
                json!({"running": {"startedAt": now}})
            } else {
                json!({"waiting": {"reason": "PodInitializing"}})
            };
            json!({"name": c.name, "image": image(c), "imageID": "", "ready": false,
                   "restartCount": 0, "started": c.name == "trainlet-init", "state": state})
        })
        .collect();
    let statuses: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": image(c), "imageID": "", "ready": false,
                   "restartCount": 0, "started": false,
                   "state": {"waiting": {"reason": "PodInitializing"}}})
        })
        .collect();
    kubelet
        .status(
            &name,
            json!({
                "phase": "Pending",
                "podIP": ip, "podIPs": [{"ip": ip}],
                "hostIP": "192.168.0.10", "hostIPs": [{"ip": "192.168.0.10"}],
                "startTime": now,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized", "lastTransitionTime": now}
                ],
                "initContainerStatuses": init_statuses,
                "containerStatuses": statuses
            }),
        )
        .await;
}

/// Runs the `trainlet-init` container of every pod at once, each in its own volume dir,
/// as the ServiceAccount `trainlet`, and returns (pod name, run, volume dir). A run that
/// exits 6 is retried, as the kubelet restarts a failed init container: all these
/// processes share this machine's network namespace, where another test may hold port
/// 8470 for a moment.
pub async fn run_init_containers(
    client: &kube::Client,
    ns: &str,
    pods: &[Pod],
    dir: &Path,
) -> Vec<(String, Run, PathBuf)> {
    run_init_containers_via(client, ns, pods, dir, &|c| c).await
}

/// [`run_init_containers`], each command run through `via` (e.g. with a DNS server of
/// the test's as its resolver: [`super::dns::DnsServer::command`]).
pub async fn run_init_containers_via(
    client: &kube::Client,
    ns: &str,
    pods: &[Pod],
    dir: &Path,
    via: &dyn Fn(Command) -> Command,
) -> Vec<(String, Run, PathBuf)> {
    let kc = sa_kubeconfig(client, ns, "trainlet", dir).await;
    let mut handles = Vec::new();
    for pod in pods {
        assert_eq!(
            pod.spec.as_ref().unwrap().service_account_name.as_deref(),
            Some("trainlet")
        );
        let volume = dir.join(pod.name_any());
        std::fs::create_dir(&volume).unwrap();
        let mut cmd = via(init_command(pod, &volume, &kc));
        let h = tokio::task::spawn_blocking(move || {
            let mut last = None;
            for _ in 0..10 {
                let r = run(&mut cmd);
                if r.code != 6 {
                    return r;
                }
                std::thread::sleep(Duration::from_secs(1));
                last = Some(r);
            }
            last.unwrap()
        });
        handles.push((pod.name_any(), h, volume));
    }
    let mut out = Vec::new();
    for (name, h, volume) in handles {
        let r = tokio::time::timeout(Duration::from_secs(120), h)
            .await
            .unwrap_or_else(|_| panic!("trainlet-init of {name} did not finish in 120s"))
            .unwrap();
        out.push((name, r, volume));
    }
    out
}
