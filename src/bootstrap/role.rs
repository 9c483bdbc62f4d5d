//! An agent's part in its job, decided before it waits ([`role`]) and, once the job's
//! size is known, for the life of the job ([`coordination_target`], [`coordinates`]):
//! alone (watching every peer), the resolver (task 0 of the first type, which publishes
//! the cluster), or a follower of the resolver pod.

use k8s_openapi::api::core::v1::Pod;

use crate::cluster::{ClusterConfig, order};

/// Whether the agents of a job coordinate (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coordinate {
    /// From `from` pods on (`--coordinate-from`, [`COORDINATE_FROM`] by default), as
    /// far as this agent can tell.
    Auto {
        from: usize,
    },
    Always,
    Never,
}

/// `auto` coordinates jobs of at least this many pods (docs/large-jobs.md). At 256 pods
/// every agent watching every peer still finished sooner on the bench (p99 0.4–0.7 s
/// against 0.9–2.1 s coordinated: the followers wait for one more hop) at about
/// 400 MiB of API-server egress per job; at 512 it sent 1.7–2 GiB and took 3.6–13 s,
/// where coordinated took 2–3 s. The threshold sits between the two.
pub const COORDINATE_FROM: usize = 384;

/// This agent's part in its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Watches every peer itself.
    Alone,
    /// Task 0 of the first type: watches every peer, and publishes the cluster when
    /// the job coordinates.
    Resolver,
    /// Watches only the resolver pod, found by `selector`.
    Follower { selector: String },
}

/// Where this pod would stand if its job coordinates: task 0 of the first type resolves,
/// every other pod follows it. Coordination needs pods that carry their index as a
/// label (Indexed Jobs, StatefulSets, Kubeflow), the index order, and a first type found
/// by one selector, so that `<selector>,<index label>=0` names task 0. `None` where it
/// is not possible; also for `--coordinate never`.
pub fn coordination_target(coordinate: Coordinate, cfg: &ClusterConfig, own: &Pod) -> Option<Role> {
    let resolver = &cfg.resolver;
    let first = resolver.jobs.first()?;
    let (Some((index, key)), [selector]) = (
        order::label_index(&own.metadata),
        first.selectors.as_slice(),
    ) else {
        return None;
    };
    if coordinate == Coordinate::Never || resolver.order != crate::cluster::OrderMode::Index {
        return None;
    }
    // In a JobSet every Job numbers its pods from 0: task 0 is pod 0 of Job 0 of the
    // replicated job.
    let jobset = order::in_jobset(&own.metadata).then_some(order::jobset::JOB_INDEX);
    let job_index = jobset.and_then(|k| {
        own.metadata
            .labels
            .as_ref()?
            .get(k)?
            .trim()
            .parse::<u64>()
            .ok()
    });
    if jobset.is_some() && job_index.is_none() {
        return None;
    }
    if index == 0
        && job_index.unwrap_or(0) == 0
        && resolver.types_of(&own.metadata) == [first.task_type.as_str()]
    {
        return Some(Role::Resolver);
    }
    let selector = match jobset {
        Some(k) => format!("{selector},{key}=0,{k}=0"),
        None => format!("{selector},{key}=0"),
    };
    Some(Role::Follower { selector })
}

/// Decides how to wait from what this agent knows before it waits: its own pod, the
/// configuration, and the expected counts. The resolver always watches every peer (it
/// publishes once it knows the job is large). `auto` follows when `--expect` says the
/// job is large, or this pod's own index does; an agent that cannot tell watches every
/// peer, which gives the same files.
pub fn role(coordinate: Coordinate, cfg: &ClusterConfig, own: &Pod) -> Role {
    let Some(target) = coordination_target(coordinate, cfg, own) else {
        return Role::Alone;
    };
    let index = order::label_index(&own.metadata).map_or(0, |(i, _)| i);
    let known: usize = cfg.expected.values().sum();
    let all_known = cfg
        .resolver
        .jobs
        .iter()
        .all(|j| cfg.expected.contains_key(&j.task_type));
    let large = match coordinate {
        Coordinate::Auto { from } => (all_known && known >= from) || index >= from as u64,
        _ => false,
    };
    match target {
        Role::Resolver => Role::Resolver,
        _ if coordinate == Coordinate::Always || large => target,
        _ => Role::Alone,
    }
}

/// Whether a resolved job of `peers` pods coordinates: `always`, or `auto` from its
/// threshold on. What the resolver publishes by, and what every agent
/// records for its reporters once it knows the job's size.
pub fn coordinates(coordinate: Coordinate, peers: usize) -> bool {
    match coordinate {
        Coordinate::Always => true,
        Coordinate::Auto { from } => peers >= from,
        Coordinate::Never => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUTO: Coordinate = Coordinate::Auto {
        from: COORDINATE_FROM,
    };
    use crate::cluster::selector;
    use crate::cluster::{AddressMode, Job, Namespaces, OrderMode, ReadyMode, Resolver};

    fn cfg(expected: &[(&str, usize)]) -> ClusterConfig {
        let job = |t: &str, s: &str| Job {
            task_type: t.into(),
            selectors: vec![selector::parse(s).unwrap()],
        };
        ClusterConfig {
            resolver: Resolver {
                jobs: vec![job("ps", "role=ps"), job("worker", "role=worker")],
                port: 8470,
                port_name: None,
                address: AddressMode::PodIp,
                cluster_domain: "cluster.local".into(),
                order: OrderMode::Index,
                ready: ReadyMode::Running,
            },
            expected: expected.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
            task_override: None,
            rpc_layer: "grpc".into(),
            environment: None,
            namespaces: Namespaces::Own,
        }
    }

    fn own(role: &str, index: Option<u64>) -> Pod {
        let mut labels = std::collections::BTreeMap::from([("role".to_string(), role.to_string())]);
        if let Some(i) = index {
            labels.insert(order::INDEX_KEYS[0].to_string(), i.to_string());
        }
        let mut p = Pod::default();
        p.metadata.labels = Some(labels);
        p
    }

    const FOLLOW_PS0: &str = "role=ps,batch.kubernetes.io/job-completion-index=0";

    #[test]
    fn task_0_of_the_first_type_resolves() {
        let c = cfg(&[]);
        assert_eq!(role(AUTO, &c, &own("ps", Some(0))), Role::Resolver);
        assert_eq!(
            role(Coordinate::Always, &c, &own("ps", Some(0))),
            Role::Resolver
        );
        // Index 0 of another type is a follower.
        assert_eq!(
            role(Coordinate::Always, &c, &own("worker", Some(0))),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
    }

    #[test]
    fn in_a_jobset_task_0_is_pod_0_of_job_0() {
        let c = cfg(&[]);
        let in_job = |role: &str, index: u64, job: Option<u64>| {
            let mut p = own(role, Some(index));
            let labels = p.metadata.labels.as_mut().unwrap();
            labels.insert(order::jobset::GLOBAL_INDEX.into(), "3".into());
            if let Some(j) = job {
                labels.insert(order::jobset::JOB_INDEX.into(), j.to_string());
            }
            p
        };
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("ps", 0, Some(0))),
            Role::Resolver
        );
        let follow = Role::Follower {
            selector: format!("{FOLLOW_PS0},{}=0", order::jobset::JOB_INDEX),
        };
        // Pod 0 of the replicated job's second Job follows.
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("ps", 0, Some(1))),
            follow
        );
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("worker", 5, Some(0))),
            follow
        );
        // Without the job index label, nothing names task 0: every agent watches all.
        assert_eq!(
            role(Coordinate::Always, &c, &in_job("ps", 0, None)),
            Role::Alone
        );
    }

    #[test]
    fn auto_follows_only_when_the_job_is_known_to_be_large() {
        let small = cfg(&[("ps", 1), ("worker", 300)]);
        let large = cfg(&[("ps", 1), ("worker", 383)]);
        let half = cfg(&[("worker", 1000)]);
        let w = own("worker", Some(5));
        assert_eq!(role(AUTO, &small, &w), Role::Alone);
        assert_eq!(
            role(AUTO, &large, &w),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
        // Not every count known: only this pod's own index can tell.
        assert_eq!(role(AUTO, &half, &w), Role::Alone);
        assert_eq!(
            role(AUTO, &half, &own("worker", Some(384))),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
    }

    #[test]
    fn auto_coordinates_from_its_threshold() {
        let four = cfg(&[("ps", 1), ("worker", 3)]);
        let w = own("worker", Some(1));
        let from = |n| Coordinate::Auto { from: n };
        assert_eq!(
            role(from(4), &four, &w),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
        assert_eq!(role(from(5), &four, &w), Role::Alone);
        // An index at the threshold tells on its own.
        assert_eq!(
            role(from(5), &cfg(&[("worker", 9)]), &own("worker", Some(5))),
            Role::Follower {
                selector: FOLLOW_PS0.into()
            }
        );
        assert!(coordinates(from(4), 4));
        assert!(!coordinates(from(5), 4));
        assert!(coordinates(AUTO, 384) && !coordinates(AUTO, 383));
        assert!(coordinates(Coordinate::Always, 1) && !coordinates(Coordinate::Never, 10_000));
    }

    #[test]
    fn coordination_needs_index_labels_index_order_and_one_first_selector() {
        let c = cfg(&[("ps", 1), ("worker", 1000)]);
        assert_eq!(
            role(Coordinate::Always, &c, &own("worker", None)),
            Role::Alone
        );
        assert_eq!(
            role(Coordinate::Never, &c, &own("worker", Some(3))),
            Role::Alone
        );
        let mut by_name = c.clone();
        by_name.resolver.order = OrderMode::Name;
        assert_eq!(
            role(Coordinate::Always, &by_name, &own("worker", Some(3))),
            Role::Alone
        );
        let mut two = c.clone();
        two.resolver.jobs[0]
            .selectors
            .push(selector::parse("role=chief").unwrap());
        assert_eq!(
            role(Coordinate::Always, &two, &own("worker", Some(3))),
            Role::Alone
        );
    }
}
