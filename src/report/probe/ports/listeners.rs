//! Port probing: which watched ports have listeners, who owns them, and whether that is
//! a conflict for the training container. Sockets are remembered between probes, so a
//! socket's owner is looked up once and "was it there before the container started"
//! stays known.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::report::Mode;
use crate::report::pod::PodView;
use crate::report::probe::oom::{ProcStat, procs};
use crate::report::probe::ports::sock_diag;
use crate::report::probe::ports::{self, ListenerFacts, Owner, PortState};

/// What is remembered about a listening socket between probes.
#[derive(Debug, Clone)]
struct SocketMemo {
    first_seen: SystemTime,
    owner: Option<Owner>,
}

/// What a probe needs to know about the pod and CMD.
pub struct Context<'a> {
    pub mode: Mode,
    pub view: &'a PodView,
    /// The training container's name.
    pub container: &'a str,
    /// Exec mode: CMD's process tree.
    pub tree: &'a BTreeMap<u32, ProcStat>,
}

pub struct Listeners {
    proc_root: PathBuf,
    self_pid: u32,
    sockets: HashMap<u64, SocketMemo>,
    /// Exec mode: the sockets that listened before CMD was started.
    pre_spawn: HashSet<u64>,
    /// The state of every watched port, after the last probe.
    pub states: BTreeMap<u16, PortState>,
    /// Why the sockets could not be read, if they could not.
    pub error: Option<String>,
}

impl Listeners {
    pub fn new(proc_root: &Path) -> Listeners {
        Listeners {
            proc_root: proc_root.to_path_buf(),
            self_pid: std::process::id(),
            sockets: HashMap::new(),
            pre_spawn: HashSet::new(),
            states: BTreeMap::new(),
            error: None,
        }
    }

    /// Exec mode, before CMD exists: who already listens (such a port is a conflict).
    pub fn before_spawn(&mut self) {
        if let Ok(l) = sock_diag::scan(&self.proc_root) {
            self.pre_spawn = l.iter().map(|l| l.inode).collect();
        }
    }

    /// Whether a visible process belongs to the training container. Exec mode: it is
    /// in CMD's tree. Sidecar: its cgroup names the training container's ID; without
    /// that ID, only the sidecar's own processes are known not to belong.
    fn in_training(&self, pid: u32, own_cgroup: &Option<String>, cx: &Context<'_>) -> Option<bool> {
        match cx.mode {
            // The tree is a snapshot of the last --interval: a process CMD forked
            // since (a trainer that bound its port at once) is looked up in /proc.
            Mode::Exec => Some(
                cx.tree.contains_key(&pid) || procs::is_under(&self.proc_root, pid, self.self_pid),
            ),
            Mode::Sidecar => {
                let cg =
                    std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup"))
                        .ok()?;
                match cx.view.container_id(cx.container) {
                    Some(id) => Some(cg.contains(&id)),
                    None if own_cgroup.as_deref() == Some(cg.as_str()) => Some(false),
                    None => None,
                }
            }
        }
    }

    /// Probes the watched ports.
    pub fn probe(&mut self, watched: &[u16], cx: &Context<'_>) {
        if watched.is_empty() {
            self.states.clear();
            self.error = None;
            return;
        }
        let listeners = match sock_diag::scan(&self.proc_root) {
            Ok(l) => {
                self.error = None;
                l
            }
            Err(e) => {
                let msg = e.to_string();
                self.states = watched
                    .iter()
                    .map(|p| (*p, PortState::Unknown { error: msg.clone() }))
                    .collect();
                self.error = Some(msg);
                return;
            }
        };
        let by_port = ports::by_port(&listeners, watched);
        let live: HashSet<u64> = by_port.values().flatten().map(|l| l.inode).collect();
        self.sockets.retain(|inode, _| live.contains(inode));
        let new: HashSet<u64> = live
            .iter()
            .filter(|i| !self.sockets.contains_key(i))
            .copied()
            .collect();
        if !new.is_empty() {
            let owners = ports::owners(&self.proc_root, &new);
            let now = SystemTime::now();
            for inode in new {
                self.sockets.insert(
                    inode,
                    SocketMemo {
                        first_seen: now,
                        owner: owners.get(&inode).cloned(),
                    },
                );
            }
        }
        let own_cgroup = std::fs::read_to_string(self.proc_root.join("self/cgroup")).ok();
        let started_at = cx.view.started_at(cx.container);
        let host_network = cx.view.host_network();
        let mut states = BTreeMap::new();
        for (port, ls) in by_port {
            let facts: Vec<ListenerFacts> = ls
                .iter()
                .map(|l| {
                    let memo = &self.sockets[&l.inode];
                    let owner = memo.owner.clone();
                    let is_self = owner.as_ref().is_some_and(|o| o.pid == self.self_pid);
                    let in_training = owner
                        .as_ref()
                        .filter(|_| !is_self)
                        .and_then(|o| self.in_training(o.pid, &own_cgroup, cx));
                    let seen_before_start = match cx.mode {
                        Mode::Exec => self.pre_spawn.contains(&l.inode),
                        Mode::Sidecar => before_start(memo.first_seen, started_at),
                    };
                    ListenerFacts {
                        inode: l.inode,
                        owner,
                        in_training,
                        is_self,
                        seen_before_start,
                    }
                })
                .collect();
            states.insert(port, ports::classify(&facts, host_network));
        }
        self.states = states;
    }
}

/// Whether a listener the sidecar first saw at `first_seen` was there before the
/// training container started, judged once the pod gives the container's start (the
/// kubelet's time, to the second, the API's precision): first seen before that second
/// began, it was there before; within it or later, it is the container's own (sshd or
/// a fast trainer binds within milliseconds of its container's start). Until the pod
/// gives the start, nothing is judged: the sidecar's view of the pod lags the kubelet,
/// so "not started yet" may be stale, and a port only matters to a container that runs;
/// meanwhile `trainlet exec`, which scans before it starts the command and sees the
/// owners the sidecar may not, hands over its own verdict.
fn before_start(first_seen: SystemTime, started_at: Option<SystemTime>) -> bool {
    started_at.is_some_and(|s| first_seen < s)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_listener_is_before_the_start_by_the_kubelets_second_once_the_pod_gives_it() {
        let t = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        // Not started as far as the pod says: not judged yet.
        assert!(!before_start(t(500), None));
        // Started at 10.7 s, given as 10 s: seen at 9.9 s, it was there before; seen at
        // 10.2 s, it is the container's own.
        assert!(before_start(t(9_900), Some(t(10_000))));
        assert!(!before_start(t(10_200), Some(t(10_000))));
        assert!(!before_start(t(12_000), Some(t(10_000))));
    }

    /// exec's tree is a snapshot of the last `--interval`: a listener CMD forked after
    /// it (a trainer that binds at once) is CMD's, not a foreign process.
    #[test]
    fn a_listener_forked_after_the_tree_snapshot_is_cmds() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let script = format!(
            "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\ns.listen()\nprint('up',flush=True)\ntime.sleep(30)"
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "up\n");
        let view = PodView::default();
        let empty = BTreeMap::new();
        let cx = Context {
            mode: Mode::Exec,
            view: &view,
            container: "trainer",
            tree: &empty,
        };
        let mut listeners = Listeners::new(Path::new("/proc"));
        listeners.probe(&[port], &cx);
        let state = listeners.states[&port].clone();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            matches!(&state, PortState::Listening { owner: Some(o) } if o.pid == child.id()),
            "{state:?}"
        );
    }
}
