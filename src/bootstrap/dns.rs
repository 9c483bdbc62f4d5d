//! `--address dns`: the files name peers by their DNS names, and cluster DNS trails the
//! pods by seconds to tens of seconds, even with `publishNotReadyAddresses`. Init waits
//! until each name resolves to its pod's current IP, so that the framework's first
//! connection does not fail on a name that does not resolve yet (or resolves to the
//! pod that was replaced).
//!
//! The decision is pure ([`unresolved`]): what each name resolved to and the IP it
//! should, in; ready or which peers are not and why, out. The lookups (the system
//! resolver, as the framework will use it) are the edge ([`wait_until_resolved`]).

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use thiserror::Error;
use tracing::info;

use crate::Code;
use crate::cluster::{Cluster, address};

/// One name to check: whose it is, the name, and the IP it must resolve to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// `worker/1`.
    pub peer: String,
    pub name: String,
    pub ip: IpAddr,
}

/// What a name resolved to: its addresses, or the resolver's error.
pub type Got = Result<Vec<IpAddr>, String>;

/// A peer whose name does not resolve to its pod IP yet, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub want: Want,
    pub got: Got,
}

impl fmt::Display for Unresolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Want { peer, name, ip } = &self.want;
        write!(
            f,
            "peer {peer} ({name}) does not resolve to its pod IP {ip} yet ("
        )?;
        match &self.got {
            Ok(ips) if ips.is_empty() => write!(f, "resolves to nothing")?,
            Ok(ips) => {
                let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
                write!(f, "resolves to {}", ips.join(", "))?;
            }
            Err(why) => write!(f, "lookup failed: {why}")?,
        }
        write!(f, ")")
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum DnsError {
    /// `--timeout` passed with names that do not resolve to their pods yet.
    #[error("{} after {}: {}", list(unresolved), humantime::format_duration(*waited), advice(unresolved))]
    Timeout {
        waited: Duration,
        unresolved: Vec<Unresolved>,
    },
}

impl DnsError {
    pub fn code(&self) -> Code {
        Code::NotReady
    }
}

fn list(u: &[Unresolved]) -> String {
    u.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What usually makes a pod's name not resolve: no headless Service named after the
/// pods' subdomain, or one that publishes only ready pods (the training container is
/// not ready while init runs).
fn advice(u: &[Unresolved]) -> String {
    let services: BTreeSet<(&str, &str)> = u
        .iter()
        .filter_map(|u| {
            let mut labels = u.want.name.split('.');
            let _host = labels.next()?;
            Some((labels.next()?, labels.next()?))
        })
        .collect();
    let named = services
        .iter()
        .map(|(svc, ns)| format!("{svc} in namespace {ns}"))
        .collect::<Vec<_>>()
        .join(" and ");
    format!(
        "is there a headless Service named {named} with publishNotReadyAddresses: true (trainlet inject --address dns adds one), and does the pod's DNS reach it?"
    )
}

/// The names to check: every peer whose pod IP is known, with the host of its address.
/// The own task's IP is the own pod's (`own_ip`): a follower's cluster carries no IPs,
/// and its own name must resolve as well.
pub fn wants(cluster: &Cluster, own: Option<(&str, &str)>) -> Vec<Want> {
    let mut out = Vec::new();
    for (ty, peers) in &cluster.tasks {
        for p in peers {
            let ip = p
                .pod_ip
                .as_deref()
                .or_else(|| own.filter(|(uid, _)| *uid == p.uid).map(|(_, ip)| ip));
            let Some(ip) = ip.and_then(|ip| ip.parse::<IpAddr>().ok()) else {
                continue;
            };
            out.push(Want {
                peer: format!("{ty}/{}", p.index),
                name: address::host(&p.address).to_string(),
                ip,
            });
        }
    }
    out
}

/// The peers whose name does not resolve to their pod IP, in the order of `wants`.
///
/// A name is resolved when its pod IP is among its addresses and no other address of
/// the same family is: a stale record beside the new one would send some connections
/// to the old pod. A dual-stack pod's address of the other family is not compared
/// (`status.podIP` is one of them).
pub fn unresolved(wants: &[Want], got: &[Got]) -> Vec<Unresolved> {
    wants
        .iter()
        .zip(got)
        .filter(|(w, g)| match g {
            Ok(ips) => {
                let same: BTreeSet<&IpAddr> = ips
                    .iter()
                    .filter(|ip| ip.is_ipv4() == w.ip.is_ipv4())
                    .collect();
                same != BTreeSet::from([&w.ip])
            }
            Err(_) => true,
        })
        .map(|(w, g)| Unresolved {
            want: w.clone(),
            got: g.clone(),
        })
        .collect()
}

/// How long one lookup may take: a resolver that does not answer is asked again.
const PER_TRY: Duration = Duration::from_secs(2);
/// The longest pause between rounds of lookups.
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// How often the peer waited for is logged.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Looks the names up until each resolves to its pod IP, or `timeout` (`None`: never)
/// passes since `start`.
pub async fn wait_until_resolved(
    wants: &[Want],
    start: Instant,
    timeout: Option<Duration>,
) -> Result<(), DnsError> {
    let mut pause = Duration::from_millis(100);
    let mut logged: Option<Instant> = None;
    loop {
        let got = futures::future::join_all(wants.iter().map(|w| lookup(&w.name))).await;
        let left = unresolved(wants, &got);
        if left.is_empty() {
            if logged.is_some() {
                info!("every peer's DNS name resolves to its pod IP");
            }
            return Ok(());
        }
        let waited = start.elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            return Err(DnsError::Timeout {
                waited: timeout.unwrap_or(waited),
                unresolved: left,
            });
        }
        if logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            info!("waiting for DNS: {}", list(&left));
            logged = Some(Instant::now());
        }
        let rest = timeout.map_or(pause, |t| t.saturating_sub(waited));
        tokio::time::sleep(pause.min(rest)).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// The system resolver's answer for a name, as the framework will get it.
async fn lookup(name: &str) -> Got {
    match tokio::time::timeout(PER_TRY, tokio::net::lookup_host((name, 0))).await {
        Ok(Ok(addrs)) => {
            let mut ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            ips.sort();
            ips.dedup();
            Ok(ips)
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer in {}",
            humantime::format_duration(PER_TRY)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(peer: &str, name: &str, ip: &str) -> Want {
        Want {
            peer: peer.into(),
            name: name.into(),
            ip: ip.parse().unwrap(),
        }
    }

    fn ips(s: &[&str]) -> Got {
        Ok(s.iter().map(|s| s.parse().unwrap()).collect())
    }

    const W0: &str = "w-0.ml.ns.svc.cluster.local";
    const W1: &str = "w-1.ml.ns.svc.cluster.local";

    #[test]
    fn a_name_is_resolved_when_it_gives_exactly_its_pod_ip() {
        let wants = [
            want("worker/0", W0, "10.0.0.6"),
            want("worker/1", W1, "10.0.0.7"),
        ];
        assert_eq!(
            unresolved(&wants, &[ips(&["10.0.0.6"]), ips(&["10.0.0.7"])]),
            vec![]
        );
        // A dual-stack pod's other address does not count against it.
        assert_eq!(
            unresolved(&wants[..1], &[ips(&["10.0.0.6", "fd00::6"])]),
            vec![]
        );
        let left = unresolved(
            &wants,
            &[
                ips(&["10.0.0.6", "10.0.0.3"]),
                Err("failed to lookup address information: Name or service not known".into()),
            ],
        );
        assert_eq!(
            left.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec![
                "peer worker/0 (w-0.ml.ns.svc.cluster.local) does not resolve to its pod IP 10.0.0.6 yet (resolves to 10.0.0.6, 10.0.0.3)",
                "peer worker/1 (w-1.ml.ns.svc.cluster.local) does not resolve to its pod IP 10.0.0.7 yet (lookup failed: failed to lookup address information: Name or service not known)",
            ]
        );
        assert_eq!(
            unresolved(&wants[1..], &[ips(&[])])[0].to_string(),
            "peer worker/1 (w-1.ml.ns.svc.cluster.local) does not resolve to its pod IP 10.0.0.7 yet (resolves to nothing)"
        );
        assert_eq!(unresolved(&wants[1..], &[ips(&["10.0.0.3"])]).len(), 1);
    }

    #[test]
    fn the_timeout_names_the_peers_and_the_service() {
        let e = DnsError::Timeout {
            waited: Duration::from_secs(300),
            unresolved: unresolved(&[want("worker/1", W1, "10.0.0.7")], &[ips(&["10.0.0.3"])]),
        };
        assert_eq!(
            e.to_string(),
            "peer worker/1 (w-1.ml.ns.svc.cluster.local) does not resolve to its pod IP 10.0.0.7 yet (resolves to 10.0.0.3) after 5m: is there a headless Service named ml in namespace ns with publishNotReadyAddresses: true (trainlet inject --address dns adds one), and does the pod's DNS reach it?"
        );
        assert_eq!(e.code(), Code::NotReady);
    }

    #[test]
    fn wants_take_the_peers_ips_and_the_own_pods() {
        use crate::cluster::Peer;
        let peer = |i: usize, ip: Option<&str>| Peer {
            name: format!("w-{i}"),
            task_type: "worker".into(),
            index: i,
            address: format!("w-{i}.ml.ns.svc.cluster.local:2222"),
            node: None,
            uid: format!("u{i}"),
            namespace: "ns".into(),
            pod_ip: ip.map(Into::into),
            slot: String::new(),
            past_init: false,
        };
        let cluster = Cluster {
            tasks: [(
                "worker".to_string(),
                vec![peer(0, None), peer(1, Some("10.0.0.7")), peer(2, None)],
            )]
            .into(),
        };
        assert_eq!(
            wants(&cluster, Some(("u0", "10.0.0.6"))),
            vec![
                want("worker/0", W0, "10.0.0.6"),
                want("worker/1", W1, "10.0.0.7"),
            ]
        );
    }
}
