//! A real DNS server for `--address dns`: UDP on a loopback address of its own, port 53
//! (what resolv.conf can name), answering A queries from a table the test rewrites, and
//! a command runner that points the system resolver of one process at it (a private
//! mount namespace with its own /etc/resolv.conf). The process's resolver is the real
//! one (glibc's getaddrinfo), as in a pod.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Records = Arc<Mutex<BTreeMap<String, Ipv4Addr>>>;

pub struct DnsServer {
    pub addr: Ipv4Addr,
    records: Records,
    stop: Arc<AtomicBool>,
    resolv: tempfile::NamedTempFile,
}

impl DnsServer {
    /// Listens on 127.53.x.y:53 (needs root, which the tests have).
    pub fn start() -> DnsServer {
        let (socket, addr) = (0..50)
            .find_map(|_| {
                let n = rand::random::<u16>();
                let addr = Ipv4Addr::new(127, 53, (n >> 8) as u8, (n as u8).max(1));
                UdpSocket::bind((addr, 53)).ok().map(|s| (s, addr))
            })
            .expect("bind a DNS server on 127.53.x.y:53 (the tests need root)");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let records: Records = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (records.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !s.load(Ordering::Relaxed) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                if let Some(reply) = answer(&buf[..n], &r.lock().unwrap()) {
                    let _ = socket.send_to(&reply, peer);
                }
            }
        });
        let resolv = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            resolv.path(),
            format!("nameserver {addr}\noptions timeout:1 attempts:1\n"),
        )
        .unwrap();
        DnsServer {
            addr,
            records,
            stop,
            resolv,
        }
    }

    /// `name` resolves to `ip` from now on.
    pub fn set(&self, name: &str, ip: &str) {
        self.records
            .lock()
            .unwrap()
            .insert(name.to_ascii_lowercase(), ip.parse().unwrap());
    }

    /// `cmd`, run with this server as its only nameserver: in a private mount namespace
    /// where /etc/resolv.conf is a file naming it.
    pub fn command(&self, cmd: &Command) -> Command {
        in_mount_namespace(cmd, self.resolv.path())
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn in_mount_namespace(cmd: &Command, resolv: &Path) -> Command {
    let mut out = Command::new("unshare");
    out.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#)
        .arg(resolv)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    out
}

/// The reply to one query: the A record of a known name, no record of another type
/// for it, NXDOMAIN for an unknown name.
fn answer(q: &[u8], records: &BTreeMap<String, Ipv4Addr>) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *q.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question = &q[12..i + 4];
    let ip = records.get(&labels.join("."));
    let a = ip.filter(|_| qtype == 1);
    let rcode = if ip.is_none() { 3 } else { 0 };
    let mut r = Vec::new();
    r.extend_from_slice(&q[..2]);
    r.extend_from_slice(&(0x8180u16 | rcode).to_be_bytes());
    r.extend_from_slice(&1u16.to_be_bytes());
    r.extend_from_slice(&u16::from(a.is_some()).to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(question);
    if let Some(ip) = a {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}
