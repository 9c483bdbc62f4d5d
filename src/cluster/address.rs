//! The `host:port` form of a task's address, one way for everything that writes or reads
//! it: the cluster (TF_CONFIG's addresses), the own port check, and the other
//! frameworks' files (which want the host and the port apart).

/// `host:port`, with an IPv6 host in brackets.
pub fn join(host: &str, port: u16) -> String {
    format!("{}:{port}", bracketed(host))
}

/// A host to put before `:<something>`: an IPv6 address in brackets, so that the `:`
/// after it cannot be taken for part of it (`[fd00::1]:8`, not `fd00::1:8`).
pub fn bracketed(host: &str) -> std::borrow::Cow<'_, str> {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]").into()
    } else {
        host.into()
    }
}

/// The host part of a `host:port` address, without IPv6 brackets.
pub fn host(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The port part of a `host:port` address.
pub fn port(address: &str) -> Option<u16> {
    address.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_ports_and_brackets() {
        assert_eq!(host("10.0.0.1:2222"), "10.0.0.1");
        assert_eq!(host("[fd00::1]:2222"), "fd00::1");
        assert_eq!(
            host("w-0.w.ns.svc.cluster.local:2222"),
            "w-0.w.ns.svc.cluster.local"
        );
        assert_eq!(join("fd00::1", 29500), "[fd00::1]:29500");
        assert_eq!(join("[fd00::1]", 29500), "[fd00::1]:29500");
        assert_eq!(join("10.0.0.1", 29500), "10.0.0.1:29500");
        assert_eq!(port("[fd00::1]:2222"), Some(2222));
        assert_eq!(port("10.0.0.1"), None);
    }
}
