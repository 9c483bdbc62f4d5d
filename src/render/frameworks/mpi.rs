//! MPI's host lists, for `mpirun`, DeepSpeed and Horovod.
//! - `hostfile`: one line per pod in rank order, `<address> slots=<n>`, the format of
//!   mpi-operator's `/etc/mpi/hostfile` for OpenMPI (`newConfigMap` in
//!   kubeflow/mpi-operator's `mpi_job_controller.go`) and of DeepSpeed's hostfile
//!   (`_parse_hostfile`: `^(\S+)\s+slots=(\d+)`).
//! - `TRAINLET_HOSTS=addr:n,addr:n`, for `horovodrun -H` (`parse_hosts`). An IPv6
//!   address is written in brackets, `[fd00::1]:8`: bare, `fd00::1:8` would read as
//!   host `fd00::1:8` or `fd00::1` with 8 slots alike. Horovod's `-H` parser splits on
//!   `:` and takes neither; with IPv6 pod IPs give it the hostfile
//!   (`horovodrun --hostfile`), or use `--address dns`.

use super::ranks::Ranks;
use crate::cluster::address;

/// `hostfile`: newline-terminated lines, as mpi-operator writes them.
pub fn hostfile(ranks: &Ranks, slots: u32) -> String {
    ranks
        .tasks
        .iter()
        .map(|p| format!("{} slots={slots}\n", address::host(&p.address)))
        .collect()
}

/// The variables of `mpi.env`.
pub fn vars(ranks: &Ranks, slots: u32) -> Vec<(String, String)> {
    let hosts: Vec<String> = ranks
        .tasks
        .iter()
        .map(|p| format!("{}:{slots}", address::bracketed(address::host(&p.address))))
        .collect();
    vec![("TRAINLET_HOSTS".to_string(), hosts.join(","))]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Cluster, Peer, Task};
    use crate::render::rehost::{Move, rehost};

    /// IPv6 hosts are bracketed, so the host and the slots cannot be confused, and a
    /// replaced host moves in TRAINLET_HOSTS as it does in the other files.
    #[test]
    fn ipv6_hosts_are_bracketed_and_move() {
        let mut c = Cluster::default();
        let peer = |i: usize, a: &str| Peer {
            name: format!("w-{i}"),
            task_type: "worker".into(),
            index: i,
            address: a.into(),
            node: None,
            uid: format!("u{i}"),
            namespace: "ns".into(),
            pod_ip: None,
            slot: String::new(),
            past_init: false,
        };
        c.tasks.insert(
            "worker".into(),
            vec![
                peer(0, "[fd00::10]:2222"),
                peer(1, "[fd00::1]:2222"),
                peer(2, "10.0.0.7:2222"),
            ],
        );
        let own = Task {
            task_type: "worker".into(),
            index: 0,
        };
        let ranks = Ranks::new(&c, &["worker"], &own);
        let hosts = vars(&ranks, 1).remove(0).1;
        assert_eq!(hosts, "[fd00::10]:1,[fd00::1]:1,10.0.0.7:1");
        assert_eq!(
            hostfile(&ranks, 1),
            "fd00::10 slots=1\nfd00::1 slots=1\n10.0.0.7 slots=1\n"
        );
        let moved = rehost(
            &format!("export TRAINLET_HOSTS='{hosts}'\n"),
            &[Move {
                from: "fd00::1".into(),
                to: "fd00::21".into(),
            }],
        );
        assert_eq!(
            moved,
            "export TRAINLET_HOSTS='[fd00::10]:1,[fd00::21]:1,10.0.0.7:1'\n"
        );
    }
}
