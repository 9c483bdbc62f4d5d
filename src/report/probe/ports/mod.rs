//! Port conflicts: who listens on the training container's ports.
//!
//! The LISTEN sockets come from `/proc/net/tcp` and `/proc/net/tcp6`, which show the
//! network namespace of the reading process: the pod's, since every container of a pod
//! shares it (or the node's, with `hostNetwork: true`). A socket's owner is found by
//! its inode in `/proc/<pid>/fd`, where the process is visible at all (the own
//! container, or every container with `shareProcessNamespace`).
//!
//! A watched port is in **conflict** when
//! 1. a visible process that is not part of the training container holds it (in exec
//!    mode: a process outside CMD's tree);
//! 2. it was already listening before the training container started (a native
//!    sidecar starts first and sees it; exec mode scans before it spawns CMD);
//! 3. with `hostNetwork: true`, an invisible process held it before the container
//!    started: something else on the node.
//!
//! Parsing and classification are pure; only [`scan`] and [`owners`] read `/proc`.

pub mod listeners;
pub mod sock_diag;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// TCP state 0x0A in `/proc/net/tcp`.
const TCP_LISTEN: u8 = 0x0A;

#[derive(Debug, Error)]
pub enum PortsError {
    #[error(
        "cannot read {path}: {source} (is /proc mounted? the ports probe needs the pod's /proc/net)"
    )]
    Read {
        path: String,
        source: std::io::Error,
    },
}

/// One LISTEN socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub addr: IpAddr,
    pub port: u16,
    pub uid: u32,
    pub inode: u64,
}

/// Parses the text of `/proc/net/tcp` or `/proc/net/tcp6` and keeps the LISTEN
/// sockets. Lines that do not parse are skipped: the kernel's format has been stable
/// for decades, but a parser of a kernel file must never take the reporter down.
pub fn parse_proc_net_tcp(text: &str) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(parse_tcp_line)
        .filter(|(state, _)| *state == TCP_LISTEN)
        .map(|(_, l)| l)
        .collect()
}

/// `   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000  0 12345 ...`
fn parse_tcp_line(line: &str) -> Option<(u8, Listener)> {
    let mut f = line.split_whitespace();
    let _sl = f.next()?;
    let local = f.next()?;
    let _remote = f.next()?;
    let state = u8::from_str_radix(f.next()?, 16).ok()?;
    let _queues = f.next()?;
    let _timer = f.next()?;
    let _retransmits = f.next()?;
    let uid = f.next()?.parse().ok()?;
    let _timeout = f.next()?;
    let inode = f.next()?.parse().ok()?;
    let (addr, port) = local.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let addr = parse_hex_addr(addr)?;
    Some((
        state,
        Listener {
            addr,
            port,
            uid,
            inode,
        },
    ))
}

/// The kernel prints an address as 32-bit words, each in the host's byte order
/// (`%08X` of the in-memory word): 127.0.0.1 is `0100007F` on x86.
fn parse_hex_addr(hex: &str) -> Option<IpAddr> {
    let word = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::to_ne_bytes);
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(hex)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(&hex[i * 8..i * 8 + 8])?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

/// The inode of a `/proc/<pid>/fd/<n>` link target such as `socket:[12345]`.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// A process that holds a socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    pub comm: String,
}

/// What is known about one listener on a watched port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerFacts {
    pub inode: u64,
    /// The owning process, when it is visible.
    pub owner: Option<Owner>,
    /// Whether the owner is part of the training container: `None` when that cannot
    /// be told (the owner is invisible, or its container is unknown).
    pub in_training: Option<bool>,
    /// trainlet itself: its own metrics port, for example.
    pub is_self: bool,
    /// First seen before the training container started.
    pub seen_before_start: bool,
}

/// Why a port is in conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConflictReason {
    /// A visible process outside the training container holds it.
    ForeignProcess,
    /// It was listening before the training container started.
    BeforeStart,
    /// hostNetwork, and an invisible process held it before the container started.
    HostNetwork,
}

/// The state of one watched port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum PortState {
    Free,
    Listening {
        #[serde(skip_serializing_if = "Option::is_none")]
        owner: Option<Owner>,
    },
    Conflict {
        reason: ConflictReason,
        #[serde(skip_serializing_if = "Option::is_none")]
        owner: Option<Owner>,
    },
    /// `/proc/net` could not be read.
    Unknown {
        error: String,
    },
}

/// One watched port and its state: as the report lists it, and as exec hands it over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortEntry {
    pub port: u16,
    #[serde(flatten)]
    pub state: PortState,
}

impl PortState {
    pub fn is_conflict(&self) -> bool {
        matches!(self, PortState::Conflict { .. })
    }
}

/// Classifies one port from the facts about its listeners (IPv4 and IPv6 sockets, or
/// several SO_REUSEPORT ones). One conflicting listener makes the port a conflict.
pub fn classify(listeners: &[ListenerFacts], host_network: bool) -> PortState {
    let mut listening = None;
    for l in listeners {
        if l.is_self {
            listening.get_or_insert(l.owner.clone());
            continue;
        }
        if l.in_training == Some(false) {
            return PortState::Conflict {
                reason: ConflictReason::ForeignProcess,
                owner: l.owner.clone(),
            };
        }
        if l.seen_before_start && l.in_training != Some(true) {
            let reason = if host_network && l.owner.is_none() {
                ConflictReason::HostNetwork
            } else {
                ConflictReason::BeforeStart
            };
            return PortState::Conflict {
                reason,
                owner: l.owner.clone(),
            };
        }
        if listening
            .as_ref()
            .is_none_or(|o: &Option<Owner>| o.is_none())
        {
            listening = Some(l.owner.clone());
        }
    }
    match listening {
        Some(owner) => PortState::Listening { owner },
        None => PortState::Free,
    }
}

/// The Event message for a conflict: what holds the port and why it matters.
pub fn conflict_message(port: u16, state: &PortState, container: &str) -> String {
    let PortState::Conflict { reason, owner } = state else {
        return format!("port {port} has no conflict");
    };
    let who = owner
        .as_ref()
        .map(|o| format!("process {} (pid {})", o.comm, o.pid));
    match (reason, who) {
        (ConflictReason::ForeignProcess, Some(w)) => format!(
            "port {port} is held by {w}, which is not part of container {container}; {container} cannot listen on it"
        ),
        (ConflictReason::ForeignProcess, None) => {
            format!("port {port} is held by a process that is not part of container {container}")
        }
        (ConflictReason::BeforeStart, Some(w)) => format!(
            "port {port} was already held by {w} before container {container} started; {container} cannot listen on it"
        ),
        (ConflictReason::BeforeStart, None) => format!(
            "port {port} was already listening before container {container} started; {container} cannot listen on it"
        ),
        (ConflictReason::HostNetwork, _) => format!(
            "port {port} is already in use on the node (hostNetwork: true) by a process outside this pod, since before container {container} started"
        ),
    }
}

/// Reads the LISTEN sockets from `net/tcp` and `net/tcp6` under `proc_root`: the
/// fallback of `sock_diag::scan`. A missing `tcp6` (IPv6 disabled) is not an error.
pub fn scan_proc(proc_root: &Path) -> Result<Vec<Listener>, PortsError> {
    let mut out = Vec::new();
    for (name, required) in [("net/tcp", true), ("net/tcp6", false)] {
        let path = proc_root.join(name);
        match read_large(&path) {
            Ok(text) => out.extend(parse_proc_net_tcp(&text)),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(PortsError::Read {
                    path: path.display().to_string(),
                    source,
                });
            }
        }
    }
    Ok(out)
}

/// Reads a `/proc` file in large chunks. The kernel renders `/proc/net/tcp` anew for
/// every read(2), and std's small first reads (32 bytes, doubling) cost a dozen
/// renderings where one or two do.
fn read_large(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Finds the visible processes that hold these socket inodes, by walking
/// `/proc/<pid>/fd`. Processes that vanish or deny access are skipped: ownership is
/// best effort. Stops as soon as every inode has an owner.
pub fn owners(proc_root: &Path, inodes: &HashSet<u64>) -> HashMap<u64, Owner> {
    let mut found = HashMap::new();
    if inodes.is_empty() {
        return found;
    }
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let Some(inode) = target.to_str().and_then(socket_inode) else {
                continue;
            };
            if inodes.contains(&inode) && !found.contains_key(&inode) {
                found.insert(
                    inode,
                    Owner {
                        pid,
                        comm: comm(proc_root, pid),
                    },
                );
            }
        }
        if found.len() == inodes.len() {
            break;
        }
    }
    found
}

/// A process's command name, or `?` when it is gone.
pub fn comm(proc_root: &Path, pid: u32) -> String {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Groups listeners by port, for the watched ports only.
pub fn by_port(listeners: &[Listener], watched: &[u16]) -> BTreeMap<u16, Vec<Listener>> {
    let mut out: BTreeMap<u16, Vec<Listener>> = watched.iter().map(|p| (*p, Vec::new())).collect();
    for l in listeners {
        if let Some(v) = out.get_mut(&l.port) {
            v.push(l.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Verbatim from a Linux 6.x host (trailing spaces included), x86-64.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode                                                     
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1061 1 000000003fc36278 100 0 0 10 0                      
   1: 0100007F:211E 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 27174 2 0000000088f31540 100 0 0 10 0                     
   2: 0100007F:97B1 0100007F:D2A1 01 00000000:00000000 00:00000000 00000000     0        0 28024 2 00000000ec959d3f 20 4 30 10 -1                    
   3: 0A00020F:0050 0A000201:C350 06 00000000:00000000 03:00000F2E 00000000     0        0 0 3 00000000d1b3e71e                                      
";

    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 45678 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:2382 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 45679 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:211E 0000000000000000FFFF00000100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 45680 1 0000000000000000 20 4 30 10 -1
   3: B80D0120000000000000000001000000:1A0B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 45681 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn parses_ipv4_listeners_only() {
        let l = parse_proc_net_tcp(TCP);
        assert_eq!(
            l,
            vec![
                Listener {
                    addr: "0.0.0.0".parse().unwrap(),
                    port: 2024,
                    uid: 0,
                    inode: 1061
                },
                Listener {
                    addr: "127.0.0.1".parse().unwrap(),
                    port: 8478,
                    uid: 1000,
                    inode: 27174
                },
            ]
        );
    }

    #[test]
    fn parses_ipv6_listeners_including_loopback_and_global() {
        let l = parse_proc_net_tcp(TCP6);
        let got: Vec<(String, u16, u32, u64)> = l
            .iter()
            .map(|l| (l.addr.to_string(), l.port, l.uid, l.inode))
            .collect();
        assert_eq!(
            got,
            vec![
                ("::".to_string(), 8080, 0, 45678),
                ("::1".to_string(), 9090, 999, 45679),
                ("2001:db8::1".to_string(), 6667, 0, 45681),
            ]
        );
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let text = "header\nnot a socket line\n   0: ZZZ:1F90 0:0 0A\n   1: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1\n";
        let l = parse_proc_net_tcp(text);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].port, l[0].inode), (22, 77));
        assert!(parse_proc_net_tcp("").is_empty());
    }

    #[test]
    fn socket_links() {
        assert_eq!(socket_inode("socket:[45678]"), Some(45678));
        assert_eq!(socket_inode("pipe:[45678]"), None);
        assert_eq!(socket_inode("/dev/null"), None);
        assert_eq!(socket_inode("socket:[]"), None);
    }

    fn facts(owner: Option<(u32, &str)>, in_training: Option<bool>, before: bool) -> ListenerFacts {
        ListenerFacts {
            inode: 1,
            owner: owner.map(|(pid, comm)| Owner {
                pid,
                comm: comm.into(),
            }),
            in_training,
            is_self: false,
            seen_before_start: before,
        }
    }

    #[test]
    fn classification_covers_the_three_conflict_cases() {
        assert_eq!(classify(&[], false), PortState::Free);
        // CMD's own listener.
        let own = facts(Some((10, "python")), Some(true), false);
        assert_eq!(
            classify(std::slice::from_ref(&own), false),
            PortState::Listening {
                owner: Some(Owner {
                    pid: 10,
                    comm: "python".into()
                })
            }
        );
        // Even when it was first seen early, a listener of the training container is fine.
        let own_early = facts(Some((10, "python")), Some(true), true);
        assert!(!classify(&[own_early], false).is_conflict());
        // 1. A visible foreign process.
        let foreign = facts(Some((20, "nc")), Some(false), false);
        assert_eq!(
            classify(&[own.clone(), foreign], false),
            PortState::Conflict {
                reason: ConflictReason::ForeignProcess,
                owner: Some(Owner {
                    pid: 20,
                    comm: "nc".into()
                })
            }
        );
        // 2. Listening before the container started, owner unknown.
        let early = facts(None, None, true);
        assert_eq!(
            classify(std::slice::from_ref(&early), false),
            PortState::Conflict {
                reason: ConflictReason::BeforeStart,
                owner: None
            }
        );
        // 3. The same with hostNetwork: something on the node.
        assert_eq!(
            classify(&[early], true),
            PortState::Conflict {
                reason: ConflictReason::HostNetwork,
                owner: None
            }
        );
        // An invisible owner that appeared after the start is the container's own.
        assert_eq!(
            classify(&[facts(None, None, false)], true),
            PortState::Listening { owner: None }
        );
        // trainlet itself (its metrics port) is never a conflict.
        let mut me = facts(Some((1, "trainlet")), Some(false), true);
        me.is_self = true;
        assert!(!classify(&[me], false).is_conflict());
    }

    #[test]
    fn conflict_messages_say_what_holds_the_port() {
        let s = PortState::Conflict {
            reason: ConflictReason::ForeignProcess,
            owner: Some(Owner {
                pid: 4242,
                comm: "nc".into(),
            }),
        };
        assert_eq!(
            conflict_message(8470, &s, "trainer"),
            "port 8470 is held by process nc (pid 4242), which is not part of container trainer; trainer cannot listen on it"
        );
        let s = PortState::Conflict {
            reason: ConflictReason::HostNetwork,
            owner: None,
        };
        assert_eq!(
            conflict_message(2222, &s, "tf"),
            "port 2222 is already in use on the node (hostNetwork: true) by a process outside this pod, since before container tf started"
        );
    }

    #[test]
    fn states_serialize_for_the_report() {
        let s = PortState::Conflict {
            reason: ConflictReason::BeforeStart,
            owner: None,
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"state":"conflict","reason":"before-start"}"#
        );
        assert_eq!(
            serde_json::to_string(&PortState::Free).unwrap(),
            r#"{"state":"free"}"#
        );
    }

    #[test]
    fn by_port_keeps_watched_ports_even_when_free() {
        let l = parse_proc_net_tcp(TCP);
        let m = by_port(&l, &[2024, 9999]);
        assert_eq!(m[&2024].len(), 1);
        assert!(m[&9999].is_empty());
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn scan_reads_this_namespace() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let all = scan_proc(Path::new("/proc")).unwrap();
        let mine: Vec<_> = all.iter().filter(|l| l.port == port).collect();
        assert_eq!(mine.len(), 1, "{all:?}");
        let inodes = HashSet::from([mine[0].inode]);
        let o = owners(Path::new("/proc"), &inodes);
        assert_eq!(o[&mine[0].inode].pid, std::process::id());
    }

    mod properties {
        use super::*;
        use crate::testing::budget;
        use proptest::prelude::*;

        /// A `/proc/net/tcp` line as the kernel writes it.
        fn line(sl: usize, ip: u32, port: u16, state: u8, uid: u32, inode: u64) -> String {
            format!(
                "{sl:4}: {:08X}:{port:04X} 00000000:0000 {state:02X} 00000000:00000000 00:00000000 00000000 {uid:5} 0 {inode} 1 0000000000000000 100 0 0 10 0",
                u32::from_ne_bytes(ip.to_be_bytes())
            )
        }

        proptest! {
            #![proptest_config(budget(512))]

            #[test]
            fn never_panics(text in "\\PC{0,300}") {
                let _ = parse_proc_net_tcp(&text);
            }

            #[test]
            fn never_panics_on_near_misses(text in "( *[0-9A-F:]{0,12} ){0,14}\n?( *[0-9A-F:]{0,12} ){0,14}") {
                let _ = parse_proc_net_tcp(&format!("header\n{text}"));
            }

            #[test]
            fn exactly_the_listeners_are_read(
                rows in proptest::collection::vec((any::<u32>(), any::<u16>(), prop_oneof![Just(0x0Au8), 1u8..=0x0B], any::<u32>(), any::<u64>()), 0..40)
            ) {
                let mut text = String::from("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n");
                for (i, (ip, port, state, uid, inode)) in rows.iter().enumerate() {
                    text.push_str(&line(i, *ip, *port, *state, *uid, *inode));
                    text.push('\n');
                }
                let want: Vec<Listener> = rows
                    .iter()
                    .filter(|r| r.2 == TCP_LISTEN)
                    .map(|(ip, port, _, uid, inode)| Listener {
                        addr: IpAddr::V4(Ipv4Addr::from(*ip)),
                        port: *port,
                        uid: *uid,
                        inode: *inode,
                    })
                    .collect();
                prop_assert_eq!(parse_proc_net_tcp(&text), want);
            }
        }
    }
}
