//! The LISTEN sockets of this network namespace through netlink `sock_diag`, filtered to
//! the LISTEN state in the kernel.
//!
//! Reading `/proc/net/tcp{,6}` makes the kernel render every TCP socket of the
//! namespace, established ones included, walking its connection tables: on a node
//! with a few hundred connections that cost 8 ms of CPU per probe, most of an exec
//! reporter's cost at rest in the host's network namespace. A `sock_diag` dump asked
//! for LISTEN sockets only walks the listening table and returns just those. Where
//! netlink is unavailable (a seccomp profile, an old kernel), [`scan`] falls back to
//! `/proc`.

use std::io;

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use netlink_sys::{Socket, SocketAddr};

use std::path::Path;

use super as ports;
use super::{Listener, PortsError};

/// Reads the LISTEN sockets of this network namespace, IPv4 and IPv6: through netlink
/// for the real `/proc`, else, or when netlink fails, from `proc_root`'s files.
pub fn scan(proc_root: &Path) -> Result<Vec<Listener>, PortsError> {
    if proc_root == Path::new("/proc")
        && let Ok(l) = listeners()
    {
        return Ok(l);
    }
    ports::scan_proc(proc_root)
}

/// The LISTEN TCP sockets, IPv4 and IPv6.
pub fn listeners() -> io::Result<Vec<Listener>> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        dump(&mut socket, family, &mut out)?;
    }
    Ok(out)
}

fn dump(socket: &mut Socket, family: u8, out: &mut Vec<Listener>) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::LISTEN,
            socket_id: if family == AF_INET {
                SocketId::new_v4()
            } else {
                SocketId::new_v6()
            },
        })
        .into(),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf[..]);
    socket.send(&buf, 0)?;

    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    let mut receive = vec![0u8; 64 * 1024];
    loop {
        let size = socket.recv(&mut &mut receive[..], 0)?;
        let mut offset = 0;
        while offset < size {
            let message = NetlinkMessage::<SockDiagMessage>::deserialize(&receive[offset..size])
                .map_err(|e| bad(format!("sock_diag: {e}")))?;
            let len = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return Err(bad(format!("sock_diag: {e:?}")));
                }
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                    let h = r.header;
                    out.push(Listener {
                        addr: h.socket_id.source_address,
                        port: h.socket_id.source_port,
                        uid: h.uid,
                        inode: u64::from(h.inode),
                    });
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_the_same_listeners_as_proc() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let v6 = std::net::TcpListener::bind("[::1]:0").ok();
        let mut from_netlink = listeners().unwrap();
        let mut from_proc = ports::scan_proc(Path::new("/proc")).unwrap();
        let key = |l: &Listener| (l.inode, l.port);
        from_netlink.sort_by_key(key);
        from_proc.sort_by_key(key);
        assert_eq!(from_netlink, from_proc);
        let port = v4.local_addr().unwrap().port();
        assert!(from_netlink.iter().any(|l| l.port == port));
        if let Some(v6) = v6 {
            let port = v6.local_addr().unwrap().port();
            assert!(
                from_netlink
                    .iter()
                    .any(|l| l.port == port && l.addr.is_ipv6())
            );
        }
    }
}
