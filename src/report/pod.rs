//! Pure facts about the own pod, as the reporters need them: which container is the
//! training container, what it asks for (GPUs, memory, ports), and where it stands
//! (not started, running since, finished for good).

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

use super::probe::gpu::Expected;
use crate::flags;

/// The extended resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The prefix of the NVIDIA device plugin's MIG resources (`mixed` strategy), e.g.
/// `nvidia.com/mig-1g.10gb`: each unit is one MIG device.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Whether a container is trainlet's own: named `trainlet...`, or running
/// `trainlet sidecar`.
pub fn is_trainlet_container(c: &Container) -> bool {
    if c.name.starts_with("trainlet") {
        return true;
    }
    let words: Vec<&str> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
        .collect();
    words.iter().any(|w| w.ends_with("trainlet")) && words.contains(&"sidecar")
}

/// The training container: `--container`, else the first container that is not
/// trainlet's.
pub fn training_container<'a>(pod: &'a Pod, name: Option<&str>) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    match name {
        Some(n) => spec.containers.iter().find(|c| c.name == n),
        None => spec.containers.iter().find(|c| !is_trainlet_container(c)),
    }
}

/// The expected GPU count: `--expect-gpus`, else the training container's
/// `resources.limits["nvidia.com/gpu"]` plus its `nvidia.com/mig-<profile>` limits
/// (NVML shows each MIG device as one device: see [`super::probe::gpu`]). A limit
/// that is not a whole number is left out; none at all is no expectation.
pub fn expected_gpus(flag: Option<u32>, container: Option<&Container>) -> Option<Expected> {
    if let Some(n) = flag {
        return Some(Expected {
            count: n,
            source: flags::long(flags::EXPECT_GPUS),
        });
    }
    let limits = container?.resources.as_ref()?.limits.as_ref()?;
    let mut count = 0u32;
    let mut sources = Vec::new();
    // BTreeMap order: nvidia.com/gpu before nvidia.com/mig-*.
    for (name, q) in limits {
        if name != GPU_RESOURCE && !name.starts_with(MIG_RESOURCE_PREFIX) {
            continue;
        }
        let Ok(n) = q.0.trim().parse::<u32>() else {
            continue;
        };
        count = count.saturating_add(n);
        sources.push(format!("resources.limits[\"{name}\"]"));
    }
    (!sources.is_empty()).then(|| Expected {
        count,
        source: sources.join(" + "),
    })
}

/// The container's TCP containerPorts.
pub fn container_ports(c: &Container) -> Vec<u16> {
    let mut v: Vec<u16> = c
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p != 0)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The memory limit of a container as written in its spec (`2Gi`).
pub fn memory_limit(c: &Container) -> Option<String> {
    Some(
        c.resources
            .as_ref()?
            .limits
            .as_ref()?
            .get("memory")?
            .0
            .clone(),
    )
}

/// What the own pod says about the training container, from the latest watch event.
#[derive(Debug, Clone, Default)]
pub struct PodView {
    pub pod: Option<Pod>,
}

impl PodView {
    /// Whether the own pod is being deleted.
    pub fn deleting(&self) -> bool {
        self.pod
            .as_ref()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    }

    /// The training container: the named one, else the first that is not trainlet's.
    pub fn container<'a>(&'a self, name: Option<&str>) -> Option<&'a Container> {
        training_container(self.pod.as_ref()?, name)
    }

    /// The status of a container, by name.
    pub fn status(&self, name: &str) -> Option<&ContainerStatus> {
        self.pod
            .as_ref()?
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find(|s| s.name == name)
    }

    pub fn host_network(&self) -> bool {
        self.pod
            .as_ref()
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }

    /// When the container's current run started, or its last run, once it has ended:
    /// a watch that lags the kubelet may first see a short run (a launcher done in
    /// seconds) already terminated, and what listened in that run was still its own.
    pub fn started_at(&self, container: &str) -> Option<SystemTime> {
        let state = self.status(container)?.state.as_ref()?;
        let t = match (&state.running, &state.terminated) {
            (Some(r), _) => r.started_at.as_ref()?,
            (None, Some(t)) => t.started_at.as_ref()?,
            (None, None) => return None,
        };
        Some(SystemTime::from(t.0))
    }

    /// The container's runtime ID without its `containerd://` scheme.
    pub fn container_id(&self, container: &str) -> Option<String> {
        let id = self.status(container)?.container_id.clone()?;
        let id = id
            .split_once("://")
            .map_or(id.as_str(), |(_, i)| i)
            .to_string();
        (!id.is_empty()).then_some(id)
    }

    /// Whether the container has terminated for good, so a classic sidecar may exit and
    /// let the Job complete: the pod is finished, or the container terminated and the
    /// restart policy will not start it again.
    pub fn finished(&self, container: &str) -> bool {
        let Some(pod) = &self.pod else {
            return false;
        };
        if matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) {
            return true;
        }
        let restart = pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always");
        let Some(st) = self.status(container) else {
            return false;
        };
        let Some(t) = st.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
            return false;
        };
        match restart {
            "Never" => true,
            "OnFailure" => t.exit_code == 0,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(json: serde_json::Value) -> Container {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn pod_spec_helpers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "trainlet", "image": "trainlet:1", "args": ["sidecar"]},
                {"name": "trainer", "image": "tf:2", "ports": [{"containerPort": 2222}, {"containerPort": 8470}, {"containerPort": 53, "protocol": "UDP"}],
                 "resources": {"limits": {"nvidia.com/gpu": "4", "memory": "2Gi"}}}
            ]}
        }))
        .unwrap();
        let c = training_container(&pod, None).unwrap();
        assert_eq!(c.name, "trainer");
        assert_eq!(
            training_container(&pod, Some("trainlet")).unwrap().name,
            "trainlet"
        );
        assert!(training_container(&pod, Some("nope")).is_none());
        assert_eq!(container_ports(c), vec![2222, 8470]);
        assert_eq!(expected_gpus(None, Some(c)).unwrap().count, 4);
        assert_eq!(
            expected_gpus(Some(2), Some(c)).unwrap().source,
            "--expect-gpus"
        );
        assert_eq!(memory_limit(c), Some("2Gi".into()));
        let mig = container(serde_json::json!({"name": "trainer", "image": "x",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": "2", "memory": "2Gi"}}}));
        assert_eq!(
            expected_gpus(None, Some(&mig)),
            Some(Expected {
                count: 2,
                source: "resources.limits[\"nvidia.com/mig-1g.10gb\"]".into()
            })
        );
        let mixed = container(serde_json::json!({"name": "trainer", "image": "x",
            "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1", "nvidia.com/gpu": "1",
                "nvidia.com/mig-1g.10gb": "2", "nvidia.com/gpu-memory": "4"}}}));
        assert_eq!(
            expected_gpus(None, Some(&mixed)),
            Some(Expected {
                count: 4,
                source: "resources.limits[\"nvidia.com/gpu\"] + resources.limits[\"nvidia.com/mig-1g.10gb\"] + resources.limits[\"nvidia.com/mig-2g.20gb\"]".into()
            })
        );
        let none = container(serde_json::json!({"name": "trainer", "image": "x",
            "resources": {"limits": {"memory": "2Gi"}}}));
        assert_eq!(expected_gpus(None, Some(&none)), None);
        let side = container(
            serde_json::json!({"name": "reporter", "image": "x", "command": ["/bin/trainlet"], "args": ["sidecar", "--interval", "5s"]}),
        );
        assert!(is_trainlet_container(&side));
        let exec = container(
            serde_json::json!({"name": "main", "image": "x", "command": ["/trainlet/trainlet", "exec", "--report", "--", "python"]}),
        );
        assert!(!is_trainlet_container(&exec));
    }

    #[test]
    fn a_container_is_finished_only_when_it_will_not_restart() {
        let pod = |restart: &str, exit: i32| {
            PodView {
            pod: Some(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "p"},
                    "spec": {"restartPolicy": restart, "containers": [{"name": "trainer", "image": "x"}]},
                    "status": {"phase": "Running", "containerStatuses": [{
                        "name": "trainer", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": exit}}
                    }]}
                }))
                .unwrap(),
            ),
        }
        };
        assert!(pod("Never", 1).finished("trainer"));
        assert!(pod("OnFailure", 0).finished("trainer"));
        assert!(!pod("OnFailure", 1).finished("trainer"));
        assert!(!pod("Always", 0).finished("trainer"));
        assert!(!PodView::default().finished("trainer"));
    }

    /// The MPI example's launcher ran for two seconds: the sidecar's lagging watch saw
    /// it only terminated, and took the port its trainer had listened on for one held
    /// before the container started.
    #[test]
    fn a_terminated_container_still_gives_when_its_run_started() {
        let view = |state: serde_json::Value| PodView {
            pod: Some(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "mpi", "image": "x"}]},
                    "status": {"containerStatuses": [{
                        "name": "mpi", "image": "x", "imageID": "", "ready": false,
                        "restartCount": 0, "state": state
                    }]}
                }))
                .unwrap(),
            ),
        };
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let running = view(serde_json::json!({"running": {"startedAt": "2027-01-15T08:00:00Z"}}));
        let ended = view(serde_json::json!({"terminated": {"exitCode": 0,
            "startedAt": "2027-01-15T08:00:00Z", "finishedAt": "2027-01-15T08:00:02Z"}}));
        let waiting = view(serde_json::json!({"waiting": {"reason": "ContainerCreating"}}));
        assert_eq!(running.started_at("mpi"), Some(at));
        assert_eq!(ended.started_at("mpi"), Some(at));
        assert_eq!(waiting.started_at("mpi"), None);
        assert_eq!(PodView::default().started_at("mpi"), None);
    }
}
