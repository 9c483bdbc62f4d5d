//! The output files of `trainlet init`, rendered by pure functions, and the atomic
//! writer that puts them in place.
//!
//! - `tf_config.json`: exactly the TF_CONFIG value, compact, `cluster` keys sorted, so
//!   every pod of a job writes a byte-identical `cluster` section.
//! - `trainlet.env`: `export` lines, single-quoted, safe to `source` from any shell:
//!   TF_CONFIG and the variables of the frameworks selected (see [`crate::render::frameworks`],
//!   which renders the other frameworks' files).
//! - `cluster.json`: the full picture for people and for `trainlet master`, with the
//!   rank order every framework shares.
//!
//! TensorFlow's `evaluator` gets its own `task` but is left out of `cluster`: it
//! evaluates checkpoints beside the training cluster, as in Estimator's `RunConfig`
//! ("evaluator is not part of training cluster") and Kubeflow's first TFJob
//! controller. TensorFlow accepts a TF_CONFIG whose task is an evaluator missing from
//! `cluster` (`multi_worker_util._validate_cluster_spec`, since tensorflow#34516).
//!
//! Each file is written to a temporary file in the same directory and renamed into
//! place, so a reader (or a rerun after `kill -9`) never sees half a file.
//! `tf_config.json` is written last: its presence means the set is complete.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cluster::drift::Moved;
use crate::cluster::published::Coordination;
pub mod frameworks;
pub mod rehost;

use crate::cluster::{Cluster, Peer, Task, address};
use frameworks::{envfile, ranks::EVALUATOR};
use rehost::{Move, rehost};

pub const TF_CONFIG_FILE: &str = "tf_config.json";
pub const ENV_FILE: &str = "trainlet.env";
pub const CLUSTER_FILE: &str = "cluster.json";
/// The sidecar's word to exec on where the cluster stands (`report::handover::peers`).
pub const PEERS_FILE: &str = "peers.json";
/// The binary `init --install-to` copies.
pub const BINARY_FILE: &str = "trainlet";
/// Everything trainlet writes with [`write_atomic`], apart from the `<type>.host` files.
const WRITTEN: [&str; 9] = [
    TF_CONFIG_FILE,
    ENV_FILE,
    CLUSTER_FILE,
    PEERS_FILE,
    BINARY_FILE,
    frameworks::TORCH_FILE,
    frameworks::JAX_FILE,
    frameworks::MPI_FILE,
    frameworks::HOSTFILE,
];
/// The random part of a temporary file's name: `.{name}.` and this many alphanumerics.
const TEMP_RANDOM: usize = 6;

#[derive(Debug, Error)]
pub enum OutputError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid trainlet output: {why}")]
    Invalid { path: PathBuf, why: String },
}

impl OutputError {
    /// A local file problem: internal, unless the message's hint helps the user.
    pub fn code(&self) -> crate::Code {
        crate::Code::Internal
    }
}

/// TF_CONFIG, with fields in the order TensorFlow and Kubeflow write them.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct TfConfig {
    pub cluster: BTreeMap<String, Vec<String>>,
    pub task: Task,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub environment: Option<String>,
}

impl TfConfig {
    pub fn new(cluster: &Cluster, task: Task, environment: Option<String>) -> Self {
        TfConfig {
            cluster: cluster
                .spec()
                .into_iter()
                .filter(|(t, _)| *t != EVALUATOR)
                .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
                .collect(),
            task,
            environment,
        }
    }

    /// The own task's server port: the port its process is about to listen on.
    pub fn own_port(&self) -> Option<u16> {
        address::port(
            self.cluster
                .get(&self.task.task_type)?
                .get(self.task.index)?,
        )
    }

    /// Compact JSON, the exact value of the TF_CONFIG variable.
    pub fn render(&self) -> String {
        serde_json::to_string(self).expect("TF_CONFIG is plain data")
    }
}

/// TensorFlow's variables, which lead `trainlet.env` and CMD's environment.
pub fn tf_env(tf: &TfConfig) -> Vec<(String, String)> {
    vec![
        ("TF_CONFIG".into(), tf.render()),
        ("TRAINLET_TASK_TYPE".into(), tf.task.task_type.clone()),
        ("TRAINLET_TASK_INDEX".into(), tf.task.index.to_string()),
    ]
}

/// `trainlet.env`, sourced by shells in the main container and read by `trainlet exec`.
pub fn render_env(vars: &[(String, String)]) -> String {
    envfile::render(ENV_FILE, vars)
}

/// `cluster.json`: what `trainlet master` reads, and what a person debugging reads.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClusterFile {
    pub cluster: BTreeMap<String, Vec<String>>,
    pub task: Task,
    pub master: String,
    pub peers: Vec<Peer>,
    /// Every rank's task (`master/0`, `worker/0`, …), rank 0 first: the order of
    /// WORLD_SIZE, the hostfile and JAX's process ids.
    #[serde(default)]
    pub ranks: Vec<String>,
    /// This pod's rank; absent for the evaluator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// Each job type's label selectors, as resolved: what the reporters watch after
    /// the start to tell a replaced or lost peer.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selectors: BTreeMap<String, Vec<String>>,
    /// RFC 3339 time of the resolution.
    pub resolved_at: String,
    /// Seconds spent waiting for the peers.
    pub waited_seconds: f64,
    /// Coordinated mode: this pod's part in watching the job after the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordination: Option<Coordination>,
}

/// What `cluster.json` says beyond the cluster itself.
#[derive(Debug, Clone)]
pub struct ClusterMeta {
    pub rpc_layer: String,
    /// Each job type's label selectors.
    pub selectors: BTreeMap<String, Vec<String>>,
    /// RFC 3339.
    pub resolved_at: String,
    pub waited_seconds: f64,
    pub coordination: Option<Coordination>,
}

/// `grpc://10.0.0.6:8470`, or the bare address when the rpc layer is empty.
pub fn master_url(rpc_layer: &str, address: &str) -> String {
    if rpc_layer.is_empty() {
        address.to_string()
    } else {
        format!("{rpc_layer}://{address}")
    }
}

pub fn render_cluster_file(
    tf: &TfConfig,
    cluster: &Cluster,
    ranks: &frameworks::Ranks,
    meta: &ClusterMeta,
) -> String {
    let own = cluster
        .task(&tf.task.task_type, tf.task.index)
        .map(|p| p.address.as_str())
        .unwrap_or_default();
    let file = ClusterFile {
        cluster: tf.cluster.clone(),
        task: tf.task.clone(),
        master: master_url(&meta.rpc_layer, own),
        peers: cluster.tasks.values().flatten().cloned().collect(),
        ranks: ranks.names(),
        rank: ranks.own,
        selectors: meta.selectors.clone(),
        resolved_at: meta.resolved_at.clone(),
        waited_seconds: (meta.waited_seconds * 1000.0).round() / 1000.0,
        coordination: meta.coordination.clone(),
    };
    let mut s = serde_json::to_string_pretty(&file).expect("plain data");
    s.push('\n');
    s
}

/// Writes `contents` to `dir/name` through a temporary file and a rename, with mode
/// 0644 so that a main container running as another user can read it. Readers see the
/// old file or the new one, never a part.
pub fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> Result<(), OutputError> {
    let path = dir.join(name);
    let err = |source| OutputError::Write {
        path: path.clone(),
        source,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .rand_bytes(TEMP_RANDOM)
        .tempfile_in(dir)
        .map_err(err)?;
    tmp.write_all(contents).map_err(err)?;
    // No fsync: the readers are other processes of the same pod, which see the renamed
    // file complete through the page cache, also after a kill -9. Durability across a
    // node crash buys nothing for an emptyDir, and three fsyncs per agent were the tail
    // of the resolve latency when a whole job finished at once (make bench).
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(err)?;
    tmp.persist(&path).map_err(|e| err(e.error))?;
    Ok(())
}

/// Whether a file name is one that trainlet writes: [`WRITTEN`] or `<type>.host`.
fn is_written(name: &str) -> bool {
    let host_file = name.strip_suffix(".host").is_some_and(|t| {
        !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    WRITTEN.contains(&name) || host_file
}

/// Whether a file name is one of [`write_atomic`]'s temporary files, which a run killed
/// between creating and renaming it leaves behind: `.tf_config.json.a1B2c3`. Nothing
/// else matches, so a clean-up never touches a file that is not trainlet's.
pub fn is_leftover(file: &str) -> bool {
    let Some((name, random)) = file.strip_prefix('.').and_then(|f| f.rsplit_once('.')) else {
        return false;
    };
    is_written(name)
        && random.len() == TEMP_RANDOM
        && random.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Removes the temporary files that an earlier, killed run left in `dir`, so that a
/// retry starts clean. Best effort: returns the files removed.
pub fn remove_leftovers(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| e.file_name().to_str().is_some_and(is_leftover))
        .map(|e| e.path())
        .filter(|p| std::fs::remove_file(p).is_ok())
        .collect()
}

/// Moves replaced tasks to their replacements in every file init wrote into `dir`
/// ([`crate::render::rehost`]): each file is rewritten atomically, `cluster.json` last
/// and with each moved task's pod name and UID, so that a reader of it sees the new
/// cluster only once everything else is there. In coordinated mode `generation` is that of the
/// resolution the moves come from, which `cluster.json` then records.
pub fn rehost_outputs(
    dir: &Path,
    moved: &[Moved],
    generation: Option<u64>,
) -> Result<(), OutputError> {
    let moves: Vec<Move> = moved.iter().map(|m| m.host.clone()).collect();
    let names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|source| OutputError::Read {
            path: dir.to_path_buf(),
            source,
        })?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| is_written(n) && ![CLUSTER_FILE, PEERS_FILE, BINARY_FILE].contains(&n.as_str()))
        .collect();
    for name in names {
        let path = dir.join(&name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let new = rehost(&text, &moves);
        if new != text {
            write_atomic(dir, &name, new.as_bytes())?;
        }
    }
    let path = dir.join(CLUSTER_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| OutputError::Read {
        path: path.clone(),
        source,
    })?;
    let mut file: ClusterFile =
        serde_json::from_str(&rehost(&text, &moves)).map_err(|e| OutputError::Invalid {
            path: path.clone(),
            why: e.to_string(),
        })?;
    for p in &mut file.peers {
        let task = format!("{}/{}", p.task_type, p.index);
        if let Some(m) = moved.iter().find(|m| m.task == task) {
            p.name = m.pod.clone();
            p.uid = m.uid.clone();
        }
    }
    if let (Some(c), Some(g)) = (file.coordination.as_mut(), generation) {
        c.generation = g;
    }
    let mut out = serde_json::to_string_pretty(&file).expect("plain data");
    out.push('\n');
    write_atomic(dir, CLUSTER_FILE, out.as_bytes())
}

/// Reads the variables of a `trainlet.env` written earlier by the init container.
pub fn read_env(path: &Path) -> Result<Vec<(String, String)>, OutputError> {
    let raw = std::fs::read_to_string(path).map_err(|source| OutputError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    envfile::parse(&raw).map_err(|why| OutputError::Invalid {
        path: path.to_path_buf(),
        why,
    })
}

/// Reads a TF_CONFIG written earlier, e.g. by the init container, for `trainlet exec`.
pub fn read_tf_config(path: &Path) -> Result<(String, TfConfig), OutputError> {
    let raw = std::fs::read_to_string(path).map_err(|source| OutputError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let tf: TfConfig = serde_json::from_str(raw.trim()).map_err(|e| OutputError::Invalid {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    Ok((raw.trim().to_string(), tf))
}

pub fn read_cluster_file(path: &Path) -> Result<ClusterFile, OutputError> {
    let raw = std::fs::read_to_string(path).map_err(|source| OutputError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&raw).map_err(|e| OutputError::Invalid {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cluster {
        let peer = |t: &str, i: usize, a: &str| Peer {
            name: format!("{t}-{i}"),
            task_type: t.into(),
            index: i,
            address: a.into(),
            node: Some("n1".into()),
            uid: format!("u-{t}-{i}"),
            namespace: "ns".into(),
            pod_ip: None,
            slot: format!("job/{t}/{i}"),
            past_init: false,
        };
        let mut c = Cluster::default();
        c.tasks.insert(
            "worker".into(),
            vec![
                peer("worker", 0, "10.0.0.6:8470"),
                peer("worker", 1, "10.0.0.7:8470"),
            ],
        );
        c.tasks
            .insert("ps".into(), vec![peer("ps", 0, "10.0.0.5:8470")]);
        c
    }

    #[test]
    fn tf_config_is_exact_and_sorted() {
        let task = Task {
            task_type: "worker".into(),
            index: 1,
        };
        let tf = TfConfig::new(&cluster(), task.clone(), None);
        assert_eq!(
            tf.render(),
            r#"{"cluster":{"ps":["10.0.0.5:8470"],"worker":["10.0.0.6:8470","10.0.0.7:8470"]},"task":{"type":"worker","index":1}}"#
        );
        let tf = TfConfig::new(&cluster(), task, Some("cloud".into()));
        assert!(
            tf.render()
                .ends_with(r#""task":{"type":"worker","index":1},"environment":"cloud"}"#)
        );
    }

    #[test]
    fn env_file_is_safely_quoted() {
        let tf = TfConfig::new(
            &cluster(),
            Task {
                task_type: "ps".into(),
                index: 0,
            },
            Some("it's".into()),
        );
        let env = render_env(&tf_env(&tf));
        assert!(env.contains(r#"export TF_CONFIG='{"cluster":"#), "{env}");
        assert!(env.contains(r#""environment":"it'\''s"}'"#), "{env}");
        assert!(env.ends_with("export TRAINLET_TASK_TYPE='ps'\nexport TRAINLET_TASK_INDEX='0'\n"));
        assert!(env.starts_with("# Written by trainlet init. Source it: . trainlet.env\n"));
    }

    #[test]
    fn cluster_file_names_master_and_peers() {
        let tf = TfConfig::new(
            &cluster(),
            Task {
                task_type: "worker".into(),
                index: 0,
            },
            None,
        );
        let c = cluster();
        let ranks = frameworks::Ranks::new(&c, &["ps", "worker"], &tf.task);
        let s = render_cluster_file(
            &tf,
            &c,
            &ranks,
            &ClusterMeta {
                rpc_layer: "grpc".into(),
                selectors: BTreeMap::new(),
                resolved_at: "2026-01-01T00:00:00Z".into(),
                waited_seconds: 3.21234,
                coordination: None,
            },
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["master"], "grpc://10.0.0.6:8470");
        assert_eq!(v["peers"][0]["name"], "ps-0");
        assert_eq!(v["peers"].as_array().unwrap().len(), 3);
        assert_eq!(v["waited_seconds"], 3.212);
        assert_eq!(
            v["ranks"],
            serde_json::json!(["ps/0", "worker/0", "worker/1"])
        );
        assert_eq!(v["rank"], 1);
        // Each pod's slot, for the peer watch to know its replacement by; a file from
        // before slots reads as none.
        assert_eq!(v["peers"][2]["slot"], "job/worker/1");
        let read: ClusterFile = serde_json::from_str(&s).unwrap();
        assert_eq!(read.peers[2].slot, "job/worker/1");
        let mut old = v.clone();
        old["peers"][2].as_object_mut().unwrap().remove("slot");
        let read: ClusterFile = serde_json::from_value(old).unwrap();
        assert_eq!(read.peers[2].slot, "");
    }

    /// The sidecar's move of a replaced task: every file init wrote names the new
    /// host, cluster.json also the new pod; nothing else changes.
    #[test]
    fn rehost_outputs_moves_every_file_and_the_pod_in_cluster_json() {
        let dir = tempfile::tempdir().unwrap();
        let c = cluster();
        let tf = TfConfig::new(
            &c,
            Task {
                task_type: "worker".into(),
                index: 0,
            },
            None,
        );
        let ranks = frameworks::Ranks::new(&c, &["ps", "worker"], &tf.task);
        let meta = ClusterMeta {
            rpc_layer: "grpc".into(),
            selectors: BTreeMap::new(),
            resolved_at: "t".into(),
            waited_seconds: 0.0,
            coordination: Some(Coordination {
                role: crate::cluster::published::CoordinationRole::Follower,
                resolver: Some("job-name=w,batch.kubernetes.io/job-completion-index=0".into()),
                types: vec!["ps".into(), "worker".into()],
                generation: 4,
            }),
        };
        let file = render_cluster_file(&tf, &c, &ranks, &meta);
        write_atomic(dir.path(), CLUSTER_FILE, file.as_bytes()).unwrap();
        write_atomic(dir.path(), TF_CONFIG_FILE, tf.render().as_bytes()).unwrap();
        write_atomic(dir.path(), "worker.host", b"10.0.0.6\n10.0.0.7\n").unwrap();
        write_atomic(dir.path(), "notes.txt", b"10.0.0.7").unwrap();
        let moved = [Moved {
            task: "worker/1".to_string(),
            host: Move {
                from: "10.0.0.7".into(),
                to: "10.0.0.17".into(),
            },
            pod: "worker-1-b".to_string(),
            uid: "u-worker-1-b".to_string(),
        }];
        rehost_outputs(dir.path(), &moved, Some(9)).unwrap();
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        assert_eq!(
            read(TF_CONFIG_FILE),
            r#"{"cluster":{"ps":["10.0.0.5:8470"],"worker":["10.0.0.6:8470","10.0.0.17:8470"]},"task":{"type":"worker","index":0}}"#
        );
        assert_eq!(read("worker.host"), "10.0.0.6\n10.0.0.17\n");
        // Not a file trainlet wrote: left alone.
        assert_eq!(read("notes.txt"), "10.0.0.7");
        let f = read_cluster_file(&dir.path().join(CLUSTER_FILE)).unwrap();
        let w1 = f
            .peers
            .iter()
            .find(|p| p.task_type == "worker" && p.index == 1)
            .unwrap();
        assert_eq!(
            (w1.name.as_str(), w1.uid.as_str(), w1.address.as_str()),
            ("worker-1-b", "u-worker-1-b", "10.0.0.17:8470")
        );
        assert_eq!(f.cluster["worker"], ["10.0.0.6:8470", "10.0.0.17:8470"]);
        assert_eq!(f.coordination.unwrap().generation, 9);
        assert_eq!(f.peers.iter().filter(|p| p.name == "worker-0").count(), 1);
    }

    #[test]
    fn atomic_write_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), "a.json", b"{}").unwrap();
        write_atomic(dir.path(), "a.json", b"{\"x\":1}").unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.json"]);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.json")).unwrap(),
            "{\"x\":1}"
        );
    }

    #[test]
    fn only_trainlets_own_temporary_files_are_leftovers() {
        for ok in [
            ".tf_config.json.a1B2c3",
            ".cluster.json.XXXXXX",
            ".trainlet.env.000000",
            ".trainlet.Zz9Zz9",
            ".torch.env.a1B2c3",
            ".hostfile.a1B2c3",
            ".data_worker.host.a1B2c3",
        ] {
            assert!(is_leftover(ok), "{ok}");
        }
        for not in [
            "tf_config.json",
            ".tf_config.json",
            ".tf_config.json.a1B2c",
            ".tf_config.json.a1B2c3d",
            ".tf_config.json.a1B2c-",
            ".model.ckpt.a1B2c3",
            ".trainlet.a1B2c3.tmp",
            "trainlet.a1B2c3",
            ".host.a1B2c3",
            ".my-notes.host.a1B2c3",
        ] {
            assert!(!is_leftover(not), "{not}");
        }
    }

    #[test]
    fn leftovers_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            ".cluster.json.Ab3dE9",
            ".trainlet.q1w2e3",
            "keep.txt",
            ".keep.a1b2c3",
        ] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        write_atomic(dir.path(), TF_CONFIG_FILE, b"{}").unwrap();
        let mut removed: Vec<String> = remove_leftovers(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        removed.sort();
        assert_eq!(removed, [".cluster.json.Ab3dE9", ".trainlet.q1w2e3"]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".keep.a1b2c3", "keep.txt", "tf_config.json"]);
    }
}
