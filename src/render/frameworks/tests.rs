use super::*;
use crate::cluster::Peer;

/// A cluster of `(type, [addresses])`, each task on its own pod.
fn cluster(types: &[(&str, &[&str])]) -> Cluster {
    let mut c = Cluster::default();
    for (t, addrs) in types {
        let peers = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Peer {
                name: format!("{t}-{i}"),
                task_type: t.to_string(),
                index: i,
                address: a.to_string(),
                node: None,
                uid: format!("uid-{t}-{i}"),
                namespace: "ns".into(),
                pod_ip: None,
                slot: String::new(),
                past_init: false,
            })
            .collect();
        c.tasks.insert(t.to_string(), peers);
    }
    c
}

/// [`super::render`] with the ranks it is given in init.
fn render(
    c: &Cluster,
    order: &[&str],
    own: &Task,
    cfg: &FrameworkConfig,
    pod: &PodFacts,
    tf_env: Vec<(String, String)>,
) -> Result<Rendered, FrameworkError> {
    super::render(&Ranks::new(c, order, own), c, order, own, cfg, pod, tf_env)
}

fn task(t: &str, i: usize) -> Task {
    Task {
        task_type: t.into(),
        index: i,
    }
}

fn env_of(r: &Rendered, file: &str) -> Vec<(String, String)> {
    let f = r.files.iter().find(|f| f.name == file).unwrap();
    envfile::parse(&f.contents).unwrap()
}

fn get<'a>(vars: &'a [(String, String)], k: &str) -> &'a str {
    vars.iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{k} not set"))
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// master + 2 workers, worker 1 (rank 2) rendering; types given master first although
/// the cluster's map sorts them the other way.
fn master_workers(cfg: &FrameworkConfig, gpus: u32) -> Rendered {
    let c = cluster(&[
        ("master", &["10.0.0.5:2222"]),
        ("worker", &["10.0.0.6:2222", "10.0.0.7:2222"]),
    ]);
    let pod = PodFacts {
        gpus,
        run_id: "uid-job".into(),
    };
    render(
        &c,
        &["master", "worker"],
        &task("worker", 1),
        cfg,
        &pod,
        vec![],
    )
    .unwrap()
}

#[test]
fn torch_env_is_kubeflows_for_one_process_per_pod() {
    let r = master_workers(&FrameworkConfig::default(), 0);
    assert_eq!(
        env_of(&r, TORCH_FILE),
        pairs(&[
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
            ("WORLD_SIZE", "3"),
            ("RANK", "2"),
            ("PET_NNODES", "3"),
            ("PET_NODE_RANK", "2"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_MASTER_ADDR", "10.0.0.5"),
            ("PET_MASTER_PORT", "29500"),
        ])
    );
}

#[test]
fn only_a_count_of_processes_per_pod_multiplies_the_world_size() {
    // auto: torchrun starts one per GPU; a plain python is one process per pod.
    let r = master_workers(&FrameworkConfig::default(), 4);
    let t = env_of(&r, TORCH_FILE);
    assert_eq!(
        (
            get(&t, "WORLD_SIZE"),
            get(&t, "RANK"),
            get(&t, "PET_NPROC_PER_NODE")
        ),
        ("3", "2", "4")
    );
    let cfg = |nproc| FrameworkConfig {
        nproc,
        ..Default::default()
    };
    let t = env_of(&master_workers(&cfg(Nproc::Count(2)), 4), TORCH_FILE);
    assert_eq!(
        (get(&t, "WORLD_SIZE"), get(&t, "PET_NPROC_PER_NODE")),
        ("6", "2")
    );
    // cpu: torchrun counts them; it counts 1 in WORLD_SIZE, as in Kubeflow.
    let t = env_of(&master_workers(&cfg(Nproc::Cpu), 4), TORCH_FILE);
    assert_eq!(
        (get(&t, "WORLD_SIZE"), get(&t, "PET_NPROC_PER_NODE")),
        ("3", "cpu")
    );
    let t = env_of(&master_workers(&cfg(Nproc::Gpu), 8), TORCH_FILE);
    assert_eq!(
        (get(&t, "WORLD_SIZE"), get(&t, "PET_NPROC_PER_NODE")),
        ("3", "8")
    );
    let c = cluster(&[("worker", &["10.0.0.6:2222"])]);
    assert_eq!(
        render(
            &c,
            &["worker"],
            &task("worker", 0),
            &cfg(Nproc::Gpu),
            &PodFacts::default(),
            vec![]
        )
        .unwrap_err()
        .to_string(),
        "one process per GPU needs a GPU limit, but the training container has no nvidia.com/gpu limit"
    );
}

#[test]
fn a_given_port_is_rank_zeros_port() {
    let cfg = FrameworkConfig {
        torch_port: RendezvousPort::Task,
        jax_port: RendezvousPort::Task,
        ..Default::default()
    };
    let r = master_workers(&cfg, 0);
    assert_eq!(get(&env_of(&r, TORCH_FILE), "MASTER_PORT"), "2222");
    assert_eq!(
        get(&env_of(&r, JAX_FILE), "JAX_COORDINATOR_ADDRESS"),
        "10.0.0.5:2222"
    );
}

/// Each framework its own port: `--master-port` and `--coordinator-port`, and with
/// MPI chosen the named task port is its sshd's, not PyTorch's (before, MASTER_PORT was
/// the sshd's 2222).
#[test]
fn each_framework_listens_on_its_own_port() {
    let cfg = FrameworkConfig {
        torch_port: RendezvousPort::Fixed(29600),
        jax_port: RendezvousPort::Fixed(55600),
        ..Default::default()
    };
    let r = master_workers(&cfg, 0);
    assert_eq!(get(&env_of(&r, TORCH_FILE), "MASTER_PORT"), "29600");
    assert_eq!(
        get(&env_of(&r, JAX_FILE), "JAX_COORDINATOR_ADDRESS"),
        "10.0.0.5:55600"
    );
    let r = master_workers(&FrameworkConfig::default(), 0);
    assert_eq!(get(&env_of(&r, TORCH_FILE), "MASTER_PORT"), "29500");
}

#[test]
fn elastic_hands_the_ranks_to_the_rendezvous() {
    let cfg = FrameworkConfig {
        elastic: Some(Elastic { min: 2, max: 3 }),
        ..Default::default()
    };
    let t = env_of(&master_workers(&cfg, 0), TORCH_FILE);
    assert_eq!(
        t,
        pairs(&[
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
            ("PET_NNODES", "2:3"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_RDZV_ENDPOINT", "10.0.0.5:29500"),
            ("PET_RDZV_ID", "uid-job"),
            ("PET_LOCAL_ADDR", "10.0.0.7"),
        ])
    );
}

#[test]
fn jax_env_has_jaxs_and_kubeflows_names() {
    let r = master_workers(&FrameworkConfig::default(), 0);
    assert_eq!(
        env_of(&r, JAX_FILE),
        pairs(&[
            ("JAX_COORDINATOR_ADDRESS", "10.0.0.5:55527"),
            ("JAX_NUM_PROCESSES", "3"),
            ("JAX_PROCESS_ID", "2"),
            ("COORDINATOR_ADDRESS", "10.0.0.5"),
            ("COORDINATOR_PORT", "55527"),
            ("NUM_PROCESSES", "3"),
            ("PROCESS_ID", "2"),
        ])
    );
}

#[test]
fn hostfile_is_mpi_operators_format_in_rank_order() {
    let r = master_workers(&FrameworkConfig::default(), 0);
    let hostfile = &r
        .files
        .iter()
        .find(|f| f.name == HOSTFILE)
        .unwrap()
        .contents;
    assert_eq!(
        hostfile,
        "10.0.0.5 slots=1\n10.0.0.6 slots=1\n10.0.0.7 slots=1\n"
    );
    let r = master_workers(
        &FrameworkConfig {
            slots: Slots::Count(8),
            ..Default::default()
        },
        4,
    );
    assert_eq!(
        env_of(&r, MPI_FILE),
        pairs(&[("TRAINLET_HOSTS", "10.0.0.5:8,10.0.0.6:8,10.0.0.7:8")])
    );
    // Default: the GPU limit.
    let r = master_workers(&FrameworkConfig::default(), 4);
    assert!(
        r.files
            .iter()
            .any(|f| f.name == HOSTFILE && f.contents.starts_with("10.0.0.5 slots=4\n"))
    );
}

#[test]
fn volcano_lists_every_type_with_its_names() {
    let c = cluster(&[
        ("ps", &["10.0.0.2:2222"]),
        ("data-worker", &["10.0.0.3:2222", "10.0.0.4:2222"]),
    ]);
    let r = render(
        &c,
        &["data-worker", "ps"],
        &task("data-worker", 1),
        &FrameworkConfig::default(),
        &PodFacts::default(),
        vec![],
    )
    .unwrap();
    assert_eq!(
        r.env,
        pairs(&[
            ("VC_DATA_WORKER_HOSTS", "10.0.0.3,10.0.0.4"),
            ("VC_DATA_WORKER_NUM", "2"),
            ("VC_PS_HOSTS", "10.0.0.2"),
            ("VC_PS_NUM", "1"),
            ("VC_TASK_INDEX", "1"),
            ("VK_TASK_INDEX", "1"),
        ])
    );
    let file = |n: &str| {
        r.files
            .iter()
            .find(|f| f.name == n)
            .unwrap()
            .contents
            .clone()
    };
    assert_eq!(file("data_worker.host"), "10.0.0.3\n10.0.0.4");
    assert_eq!(file("ps.host"), "10.0.0.2");
}

#[test]
fn selected_frameworks_fill_the_environment_in_order() {
    let c = cluster(&[("worker", &["10.0.0.6:2222", "10.0.0.7:2222"])]);
    let cfg = FrameworkConfig {
        frameworks: vec![Framework::Tensorflow, Framework::Pytorch, Framework::Mpi],
        ..Default::default()
    };
    let tf = pairs(&[("TF_CONFIG", "{}")]);
    let r = render(
        &c,
        &["worker"],
        &task("worker", 1),
        &cfg,
        &PodFacts::default(),
        tf,
    )
    .unwrap();
    let names: Vec<&str> = r.env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "TF_CONFIG",
            "MASTER_ADDR",
            "MASTER_PORT",
            "WORLD_SIZE",
            "RANK",
            "PET_NNODES",
            "PET_NODE_RANK",
            "PET_NPROC_PER_NODE",
            "PET_MASTER_ADDR",
            "PET_MASTER_PORT",
            "TRAINLET_HOSTS",
            "VC_WORKER_HOSTS",
            "VC_WORKER_NUM",
            "VC_TASK_INDEX",
            "VK_TASK_INDEX",
        ]
    );
    let files: Vec<&str> = r.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        files,
        [TORCH_FILE, JAX_FILE, MPI_FILE, HOSTFILE, "worker.host"]
    );
}

#[test]
fn the_evaluator_is_no_rank() {
    let c = cluster(&[
        ("chief", &["10.0.0.1:2222"]),
        ("worker", &["10.0.0.2:2222"]),
        ("evaluator", &["10.0.0.3:2222"]),
    ]);
    let order = ["chief", "worker", "evaluator"];
    let ranks = Ranks::new(&c, &order, &task("evaluator", 0));
    assert_eq!(ranks.names(), ["chief/0", "worker/0"]);
    assert_eq!(ranks.own, None);
    let ranks = Ranks::new(&c, &order, &task("worker", 0));
    assert_eq!(ranks.own, Some(1));
}

#[test]
fn no_rank_zero_fails_only_the_frameworks_that_need_one() {
    let c = cluster(&[("master", &[]), ("worker", &["10.0.0.6:2222"])]);
    let cfg = |f| FrameworkConfig {
        frameworks: vec![f],
        ..Default::default()
    };
    let run = |f| {
        render(
            &c,
            &["master", "worker"],
            &task("worker", 0),
            &cfg(f),
            &PodFacts::default(),
            vec![],
        )
    };
    let e = run(Framework::Pytorch).unwrap_err();
    assert_eq!(
        e.to_string(),
        "pytorch needs a rank 0, but the first job type \"master\" has no task; list the type of rank 0 first"
    );
    assert_eq!(e.code(), Code::Inconsistent);
    assert!(run(Framework::Jax).is_err());
    let r = run(Framework::Tensorflow).unwrap();
    assert!(!r.files.iter().any(|f| f.name == TORCH_FILE));
    assert!(r.files.iter().any(|f| f.name == HOSTFILE));
}

#[test]
fn a_task_listens_on_its_frameworks_ports_not_on_tf_configs() {
    let env = |pairs: &[(&str, &str)]| pairs_of(pairs);
    // TensorFlow alone: its TF_CONFIG port.
    assert_eq!(
        listen_ports(&env(&[("TF_CONFIG", "{}")]), Some(8470)),
        [8470]
    );
    // PyTorch: rank 0 listens on MASTER_PORT, the others on nothing known.
    let torch = |rank: &str| {
        env(&[
            ("TF_CONFIG", "{}"),
            ("MASTER_PORT", "29500"),
            ("RANK", rank),
        ])
    };
    assert_eq!(listen_ports(&torch("0"), Some(8470)), [29500]);
    assert!(listen_ports(&torch("1"), Some(8470)).is_empty());
    // torchrun: the node rank.
    let run = env(&[("MASTER_PORT", "29500"), ("PET_NODE_RANK", "0")]);
    assert_eq!(listen_ports(&run, Some(8470)), [29500]);
    // JAX: process 0's coordinator.
    let jax = env(&[("COORDINATOR_PORT", "1234"), ("PROCESS_ID", "0")]);
    assert_eq!(listen_ports(&jax, None), [1234]);
}

fn pairs_of(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, x)| (k.to_string(), x.to_string()))
        .collect()
}
