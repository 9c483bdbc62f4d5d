use super::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, PodSpec, PodStatus,
};

fn pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    p.spec = Some(PodSpec {
        node_name: Some("node-a".into()),
        ..Default::default()
    });
    p
}

/// The pods as the watch would deliver them.
fn views(pods: &[Pod]) -> Vec<PeerPod> {
    pods.iter().map(PeerPod::from).collect()
}

fn running(mut p: Pod, ip: &str) -> Pod {
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.into()),
        host_ip: Some("192.168.0.1".into()),
        ..Default::default()
    });
    p
}

/// `TYPE=SELECTOR` definitions, as `--job` gives them.
fn jobs_of(defs: &[&str]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for d in defs {
        let (ty, sel) = d.split_once('=').unwrap();
        add_selector(&mut jobs, ty, selector::parse(sel).unwrap());
    }
    jobs
}

fn resolver(jobs: &[&str]) -> Resolver {
    Resolver {
        jobs: jobs_of(jobs),
        port: 8470,
        port_name: None,
        address: AddressMode::PodIp,
        cluster_domain: "cluster.local".into(),
        order: OrderMode::Index,
        ready: ReadyMode::Running,
    }
}

fn complete(a: Assessment) -> Cluster {
    match a {
        Assessment::Complete(c) => c,
        Assessment::Waiting(s) => panic!("not complete: {s:?}"),
    }
}

fn expect(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn tensorflow_parity_name_order() {
    let mut r = resolver(&["worker=job-name=tensorflow"]);
    r.order = OrderMode::Name;
    let pods = [
        running(
            pod("tensorflow-abc123", &[("job-name", "tensorflow")]),
            "10.1.2.3",
        ),
        running(
            pod("tensorflow-def456", &[("job-name", "tensorflow")]),
            "10.1.2.4",
        ),
        running(
            pod("tensorflow-999999", &[("job-name", "tensorflow")]),
            "10.1.2.5",
        ),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 3)])).unwrap());
    assert_eq!(
        c.spec()["worker"],
        ["10.1.2.5:8470", "10.1.2.3:8470", "10.1.2.4:8470"]
    );
}

#[test]
fn selectors_of_one_type_concatenate_in_order() {
    let r = resolver(&["worker=job-name=second", "worker=job-name=first"]);
    let pods = [
        running(pod("a", &[("job-name", "first")]), "10.0.0.1"),
        running(pod("b", &[("job-name", "second")]), "10.0.0.2"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 2)])).unwrap());
    assert_eq!(c.spec()["worker"], ["10.0.0.2:8470", "10.0.0.1:8470"]);
}

#[test]
fn index_annotation_beats_name_and_duplicates_fail() {
    let r = resolver(&["worker=app=x"]);
    let mut pods = Vec::new();
    for (name, idx) in [("zeta", "0"), ("alpha", "2"), ("mid", "1")] {
        let mut p = running(pod(name, &[("app", "x")]), &format!("10.0.0.{idx}"));
        p.metadata.annotations = Some([(order::INDEX_KEYS[0].to_string(), idx.to_string())].into());
        pods.push(p);
    }
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 3)])).unwrap());
    let names: Vec<&str> = c.tasks["worker"].iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["zeta", "mid", "alpha"]);

    pods[1].metadata.annotations =
        Some([(order::INDEX_KEYS[0].to_string(), "0".to_string())].into());
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    assert_eq!(
        r.assess(&refs, &expect(&[("worker", 3)])).unwrap_err(),
        ClusterError::Inconsistent(
            "pods \"zeta\" and \"alpha\" both have index 0 (batch.kubernetes.io/job-completion-index); each index must be used once".into()
        )
    );
}

#[test]
fn terminal_and_terminating_pods_are_not_peers() {
    let r = resolver(&["worker=app=x"]);
    let mut failed = running(pod("w-0-old", &[("app", "x")]), "10.0.0.9");
    failed.status.as_mut().unwrap().phase = Some("Failed".into());
    let mut deleting = running(pod("w-1-old", &[("app", "x")]), "10.0.0.8");
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
    );
    let pods = [
        failed,
        deleting,
        running(pod("w-0", &[("app", "x")]), "10.0.0.1"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 1)])).unwrap());
    assert_eq!(c.spec()["worker"], ["10.0.0.1:8470"]);
}

#[test]
fn waiting_says_what_is_missing_and_why() {
    let r = resolver(&["worker=app=x"]);
    let mut pending = pod("w-1", &[("app", "x")]);
    pending.spec.as_mut().unwrap().node_name = None;
    pending.status = Some(PodStatus {
        phase: Some("Pending".into()),
        conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.".into()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let pods = [running(pod("w-0", &[("app", "x")]), "10.0.0.1"), pending];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let Assessment::Waiting(s) = r.assess(&refs, &expect(&[("worker", 3)])).unwrap() else {
        panic!("complete")
    };
    assert_eq!(
        s[0].describe(),
        "worker: expected 3, ready 1 of 2 live (1 missing); pod \"w-1\" is Pending (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)"
    );
}

#[test]
fn peers_waiting_in_their_init_containers_count() {
    // Every pod of the job runs `trainlet init` at the same time: they are all Pending
    // with a pod IP. Requiring Running would deadlock them.
    let r = resolver(&["worker=app=x"]);
    let mut p = pod("w-0", &[("app", "x")]);
    p.status = Some(PodStatus {
        phase: Some("Pending".into()),
        pod_ip: Some("10.0.0.1".into()),
        init_container_statuses: Some(vec![ContainerStatus {
            name: "trainlet-init".into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let pods = [p];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    complete(r.assess(&refs, &expect(&[("worker", 1)])).unwrap());
}

#[test]
fn own_pod_must_match_exactly_one_type() {
    // cli::lower's tests pin the full messages, with the flags that fix them.
    let r = resolver(&["ps=role=ps", "worker=app=x"]);
    let both = pod("w", &[("app", "x"), ("role", "ps")]);
    assert_eq!(
        r.check_own_pod(&both.metadata).unwrap_err(),
        ClusterError::OwnPodAmbiguous {
            pod: "w".into(),
            types: "ps, worker".into()
        }
    );
    let none = pod("n", &[("app", "y")]);
    assert_eq!(
        r.check_own_pod(&none.metadata).unwrap_err(),
        ClusterError::OwnPodUnmatched {
            pod: "n".into(),
            jobs: "ps: role=ps; worker: app=x".into()
        }
    );
}

#[test]
fn dns_addresses_and_named_ports() {
    let mut r = resolver(&["worker=app=x"]);
    r.address = AddressMode::Dns;
    r.port_name = Some("tfjob-port".into());
    let mut p = running(pod("w-0", &[("app", "x")]), "10.0.0.1");
    let spec = p.spec.as_mut().unwrap();
    spec.hostname = Some("w-0".into());
    spec.subdomain = Some("w".into());
    spec.containers = vec![k8s_openapi::api::core::v1::Container {
        name: "tf".into(),
        ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            name: Some("tfjob-port".into()),
            container_port: 2222,
            ..Default::default()
        }]),
        ..Default::default()
    }];
    let pods = [p];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 1)])).unwrap());
    assert_eq!(c.spec()["worker"], ["w-0.w.ns.svc.cluster.local:2222"]);

    let bare = [running(pod("w-9", &[("app", "x")]), "10.0.0.2")];
    let seen = views(&bare);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    assert_eq!(
        r.assess(&refs, &expect(&[("worker", 1)])).unwrap_err(),
        ClusterError::NoDnsName { pod: "w-9".into() }
    );
}

#[test]
fn ipv6_addresses_are_bracketed() {
    let r = resolver(&["worker=app=x"]);
    let pods = [running(pod("w-0", &[("app", "x")]), "fd00::1")];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 1)])).unwrap());
    assert_eq!(c.spec()["worker"], ["[fd00::1]:8470"]);
}

#[test]
fn elastic_completes_with_the_minimum_of_ready_pods() {
    let r = resolver(&["worker=app=w"]);
    let w = |n: &str| pod(n, &[("app", "w")]);
    let pods = [
        running(w("w-0"), "10.0.0.1"),
        w("w-1"),
        running(w("w-2"), "10.0.0.3"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess_at_least(&refs, 2, "uid-w-2").unwrap());
    let addrs: Vec<&str> = c.tasks["worker"]
        .iter()
        .map(|p| p.address.as_str())
        .collect();
    assert_eq!(addrs, ["10.0.0.1:8470", "10.0.0.3:8470"]);
    let Assessment::Waiting(s) = r.assess_at_least(&refs, 3, "uid-w-2").unwrap() else {
        panic!("complete with 2 of 3");
    };
    // Enough are ready, but not this pod: it is no task of that cluster, so it waits.
    assert!(matches!(
        r.assess_at_least(&refs, 2, "uid-w-1").unwrap(),
        Assessment::Waiting(_)
    ));
    assert_eq!(
        describe(&s),
        "worker: expected 3, ready 2 of 3 live; pod \"w-1\" is Pending (not scheduled yet)"
    );
}

#[test]
fn jobset_pods_order_by_job_then_index() {
    let r = resolver(&["worker=app=w"]);
    let w = |n: &str, job: &str, i: &str| {
        pod(
            n,
            &[
                ("app", "w"),
                ("jobset.sigs.k8s.io/job-global-index", job),
                ("batch.kubernetes.io/job-completion-index", i),
            ],
        )
    };
    let pods = [
        running(w("js-w-1-1", "1", "1"), "10.0.0.4"),
        running(w("js-w-0-1", "0", "1"), "10.0.0.2"),
        running(w("js-w-1-0", "1", "0"), "10.0.0.3"),
        running(w("js-w-0-0", "0", "0"), "10.0.0.1"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 4)])).unwrap());
    let names: Vec<&str> = c.tasks["worker"].iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["js-w-0-0", "js-w-0-1", "js-w-1-0", "js-w-1-1"]);

    let dup = [
        running(w("a", "1", "0"), "10.0.0.1"),
        running(w("b", "1", "0"), "10.0.0.2"),
    ];
    let seen = views(&dup);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    assert_eq!(
        r.assess(&refs, &expect(&[("worker", 2)])).unwrap_err(),
        ClusterError::Inconsistent(
            "pods \"a\" and \"b\" both have index 0 (batch.kubernetes.io/job-completion-index) in Job 1 (jobset.sigs.k8s.io/job-global-index); each index must be used once".into()
        )
    );
}

/// A pod of an Indexed Job, its index as the Job controller labels it.
fn indexed(name: &str, index: &str) -> Pod {
    pod(
        name,
        &[
            ("app", "w"),
            ("batch.kubernetes.io/job-name", "w"),
            ("batch.kubernetes.io/job-completion-index", index),
        ],
    )
}

fn with_phase(mut p: Pod, phase: &str) -> Pod {
    p.status.get_or_insert_with(Default::default).phase = Some(phase.into());
    p
}

/// A pod whose init starts after a peer completed its index (a slow node, a late
/// replacement) counts that peer at its last address: the Job controller runs a
/// completed index no more, and waiting for it would last until --timeout.
#[test]
fn a_completed_index_counts_at_its_last_address() {
    let r = resolver(&["worker=app=w"]);
    let pods = [
        with_phase(running(indexed("w-0-aaaa", "0"), "10.0.0.1"), "Succeeded"),
        running(indexed("w-1-bbbb", "1"), "10.0.0.2"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 2)])).unwrap());
    assert_eq!(c.spec()["worker"], ["10.0.0.1:8470", "10.0.0.2:8470"]);
    let done = &c.tasks["worker"][0];
    assert_eq!(
        (done.name.as_str(), done.slot.as_str(), done.past_init),
        ("w-0-aaaa", "job/w/0", true)
    );
    // Its DNS record went with it: nothing to wait for. The live peer's stays.
    assert_eq!(done.pod_ip, None);
    assert_eq!(c.tasks["worker"][1].pod_ip.as_deref(), Some("10.0.0.2"));
    assert_eq!(
        r.own_task(&c, "uid-w-1-bbbb", "w-1-bbbb", None).unwrap(),
        Task {
            task_type: "worker".into(),
            index: 1
        }
    );

    // With --ready ready: a completed pod is never Ready again, and still counts.
    let mut ready = r.clone();
    ready.ready = ReadyMode::Ready;
    let mut live = running(indexed("w-1-bbbb", "1"), "10.0.0.2");
    live.status.as_mut().unwrap().conditions =
        Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
    let mut done = with_phase(running(indexed("w-0-aaaa", "0"), "10.0.0.1"), "Succeeded");
    done.status.as_mut().unwrap().conditions =
        Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("PodCompleted".into()),
            ..Default::default()
        }]);
    let seen = views(&[done, live]);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(ready.assess(&refs, &expect(&[("worker", 2)])).unwrap());
    assert_eq!(c.spec()["worker"], ["10.0.0.1:8470", "10.0.0.2:8470"]);
}

/// Where a live pod holds the index (a Job made again under its name), the completed pod
/// is the past: the live one is the task, and is waited for. Two completed pods of one
/// index count once; a completed pod with no index, or one being deleted, is no peer.
#[test]
fn a_completed_index_gives_way_to_a_live_pod_and_counts_once() {
    let r = resolver(&["worker=app=w"]);
    let done = |n: &str, i: &str, ip: &str| with_phase(running(indexed(n, i), ip), "Succeeded");
    let pods = [
        done("w-0-aaaa", "0", "10.0.0.1"),
        running(indexed("w-0-cccc", "0"), "10.0.0.3"),
        running(indexed("w-1-bbbb", "1"), "10.0.0.2"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 2)])).unwrap());
    assert_eq!(c.spec()["worker"], ["10.0.0.3:8470", "10.0.0.2:8470"]);

    let pods = [
        done("w-0-aaaa", "0", "10.0.0.1"),
        indexed("w-0-cccc", "0"),
        running(indexed("w-1-bbbb", "1"), "10.0.0.2"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let Assessment::Waiting(s) = r.assess(&refs, &expect(&[("worker", 2)])).unwrap() else {
        panic!("complete without the live pod of index 0");
    };
    assert_eq!(
        describe(&s),
        "worker: expected 2, ready 1 of 2 live; pod \"w-0-cccc\" is Pending (not scheduled yet)"
    );

    let pods = [
        done("w-0-aaaa", "0", "10.0.0.1"),
        done("w-0-dddd", "0", "10.0.0.4"),
        running(indexed("w-1-bbbb", "1"), "10.0.0.2"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 2)])).unwrap());
    assert_eq!(c.tasks["worker"].len(), 2);
    assert_eq!(c.tasks["worker"][1].address, "10.0.0.2:8470");

    let mut deleting = done("w-0-aaaa", "0", "10.0.0.1");
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
    );
    let plain = with_phase(
        running(pod("w-9", &[("app", "w")]), "10.0.0.9"),
        "Succeeded",
    );
    let pods = [
        deleting,
        plain,
        running(indexed("w-1-bbbb", "1"), "10.0.0.2"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let c = complete(r.assess(&refs, &expect(&[("worker", 1)])).unwrap());
    assert_eq!(c.spec()["worker"], ["10.0.0.2:8470"]);
}

/// Elastic jobs: a completed pod joins no rendezvous, and is not counted toward MIN.
#[test]
fn elastic_leaves_completed_pods_out() {
    let r = resolver(&["worker=app=w"]);
    let pods = [
        with_phase(running(indexed("w-0-aaaa", "0"), "10.0.0.1"), "Succeeded"),
        running(indexed("w-1-bbbb", "1"), "10.0.0.2"),
    ];
    let seen = views(&pods);
    let refs: Vec<&PeerPod> = seen.iter().collect();
    let Assessment::Waiting(s) = r.assess_at_least(&refs, 2, "uid-w-1-bbbb").unwrap() else {
        panic!("a completed pod counted toward MIN");
    };
    assert_eq!(
        describe(&s),
        "worker: expected 2, ready 1 of 1 live (1 missing)"
    );
}
