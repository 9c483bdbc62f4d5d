//! hostNetwork pod templates: every pod of a node shares the node's ports, so two jobs
//! on one node must not both take torchrun's 29500 and the sidecar's 9464. Where no
//! `--master-port`/`--metrics-addr` says otherwise, inject gives each job its own pair,
//! chosen from the job's identity (its namespace and workload name) by [`slot`]: the
//! same job always gets the same pair (a second inject changes nothing), two jobs get
//! different ones with high probability. The admission policy computes the very same
//! number in CEL (`admission::host`), which has no hash function: hence a sum of character
//! codes weighted by position, which CEL can compute with `split`, `indexOf`,
//! `transformList` and `sum`.
//!
//! It also gives such a pod `dnsPolicy: ClusterFirstWithHostNet`: with `ClusterFirst`
//! (what the API server gives a pod that names none) a hostNetwork pod resolves names
//! with the node's resolv.conf, and cluster names do not resolve.

use super::own::{Earlier, flag_name};
use super::{Ctx, InjectConfig, Node, yaml};
use crate::flags;

/// The number of port pairs: a prime, so that two identities that differ in one
/// character always differ in their slot.
pub const SLOTS: u32 = 4493;
/// The first chosen rendezvous port (`--master-port`): ports 20000-24492, above the
/// well-known and the usual services' ports, below Kubernetes' NodePorts (30000-32767)
/// and Linux's ephemeral ports (32768-60999).
pub const MASTER_BASE: u16 = 20000;
/// The first chosen metrics port (`--metrics-addr`): ports 25000-29492, below
/// torchrun's 29500.
pub const METRICS_BASE: u16 = 25000;
/// The characters of Kubernetes names, whose codes the sum weighs (1-based: 0 is any
/// other character).
pub const ALPHABET: &str = "abcdefghijklmnopqrstuvwxyz0123456789-./";
/// Spreads the sums of short names over every slot.
pub const MULTIPLIER: u64 = 7919;
/// The most characters of an identity that count: a namespace (63), `/` and a name
/// (253).
pub const MAX_IDENTITY: usize = 320;
/// What the API server gives a pod without a dnsPolicy, and what hostNetwork pods need.
const CLUSTER_FIRST: &str = "ClusterFirst";
pub const CLUSTER_FIRST_WITH_HOST_NET: &str = "ClusterFirstWithHostNet";

/// The identity of a job: `namespace/name` of its workload (the namespace may be
/// empty: a manifest that names none).
pub fn identity(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The slot of an identity: Σ code(cᵢ)·(i+1) over its first [`MAX_IDENTITY`]
/// characters, times [`MULTIPLIER`], modulo [`SLOTS`].
pub fn slot(identity: &str) -> u32 {
    let sum: u64 = identity
        .chars()
        .take(MAX_IDENTITY)
        .enumerate()
        .map(|(i, c)| ALPHABET.find(c).map_or(0, |p| p as u64 + 1) * (i as u64 + 1))
        .sum();
    u32::try_from(sum * MULTIPLIER % u64::from(SLOTS)).expect("below SLOTS")
}

/// The rendezvous port and the metrics port of a slot.
pub fn ports(slot: u32) -> (u16, u16) {
    let s = u16::try_from(slot % SLOTS).expect("below SLOTS");
    (MASTER_BASE + s, METRICS_BASE + s)
}

/// `--metrics-addr=0.0.0.0:PORT`'s value for a chosen port.
pub fn any_addr(port: u16) -> String {
    format!("0.0.0.0:{port}")
}

/// The port of a listen address `HOST:PORT`.
pub fn addr_port(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok().filter(|p| *p > 0)
}

/// The sidecar's metrics endpoint in one pod template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metrics {
    /// The sidecar's `--metrics-addr`, where it is not the sidecar's default.
    pub addr: Option<String>,
    /// Its port: the sidecar's containerPort, its startup probe's, the scrape
    /// annotation's.
    pub port: u16,
    /// Whether `--metrics-addr` was given: a hostNetwork template then keeps it.
    pub given: bool,
}

/// Whether a pod spec has `hostNetwork: true`.
pub fn is_host_network(spec: &Node) -> bool {
    spec.get("hostNetwork")
        .is_some_and(|h| yaml::to_json(h) == serde_json::Value::Bool(true))
}

/// Whether inject chooses rank 0's rendezvous port for these init flags: none is
/// given, and no task port serves as one (`--port`/`--port-name` do, unless MPI is
/// among the frameworks: the task port is then its sshd's).
pub fn chooses_master_port(init_args: &[String]) -> bool {
    let has = |f: &str| init_args.iter().any(|a| flag_name(a) == Some(f));
    let mpi = init_args.iter().any(|a| {
        a.strip_prefix(&format!("--{}=", flags::FRAMEWORK))
            .is_some_and(|v| v.split(',').any(|f| f == "mpi"))
    });
    !has(flags::MASTER_PORT) && (mpi || !(has(flags::PORT) || has(flags::PORT_NAME)))
}

/// `--master-port=PORT` among init flags, where inject writes it: before
/// `--coordinator-port` and `--nnodes`.
fn with_master_port(init_args: &mut Vec<String>, port: u16) {
    let at = init_args
        .iter()
        .position(|a| {
            matches!(flag_name(a), Some(f) if f == flags::COORDINATOR_PORT || f == flags::NNODES)
        })
        .unwrap_or(init_args.len());
    init_args.insert(at, flags::with_value(flags::MASTER_PORT, port));
}

impl Ctx<'_> {
    /// A hostNetwork template's ports: the flags', else an earlier inject's (a second
    /// inject, or a manifest read back from the API server, keeps what the pods run
    /// with), else chosen from the job's identity; with a note that says which.
    pub(super) fn host_ports(&mut self, own: &mut InjectConfig, spec: &Node, what: &str) {
        own.host_network = true;
        let earlier = Earlier::of(spec);
        let (master, metrics) = ports(slot(&self.identity));
        let (mut chosen, mut kept) = (Vec::new(), Vec::new());
        if chooses_master_port(&own.init_args) {
            let port = match earlier
                .init_value(flags::MASTER_PORT)
                .and_then(|v| v.parse().ok())
            {
                Some(p) if p > 0 => {
                    kept.push(flags::with_value(flags::MASTER_PORT, p));
                    p
                }
                _ => {
                    chosen.push(format!(
                        "rank 0's rendezvous port {master} (--{}, MASTER_PORT)",
                        flags::MASTER_PORT
                    ));
                    master
                }
            };
            with_master_port(&mut own.init_args, port);
        }
        if !own.metrics.given {
            let addr = match earlier.sidecar_value(flags::METRICS_ADDR) {
                Some(a) if a.parse::<std::net::SocketAddr>().is_ok() && addr_port(&a).is_some() => {
                    kept.push(flags::with_value(flags::METRICS_ADDR, &a));
                    a
                }
                _ => {
                    chosen.push(format!(
                        "the sidecar's metrics port {metrics} (--{}={})",
                        flags::METRICS_ADDR,
                        any_addr(metrics)
                    ));
                    any_addr(metrics)
                }
            };
            own.metrics.port = addr_port(&addr).unwrap_or(metrics);
            own.metrics.addr = Some(addr);
        }
        let why = "a hostNetwork pod shares the node's ports with every other";
        if !chosen.is_empty() {
            self.note(
                what.to_string(),
                format!(
                    "chooses {} for {:?}: {why}, so each job gets its own (docs/hostnetwork.md); pass --{} or --{} to choose",
                    chosen.join(" and "),
                    self.identity,
                    flags::MASTER_PORT,
                    flags::METRICS_ADDR
                ),
            );
        }
        if !kept.is_empty() {
            self.note(
                what.to_string(),
                format!(
                    "keeps an earlier inject's {}: {why}, and its pods run with these",
                    kept.join(" ")
                ),
            );
        }
    }

    /// `dnsPolicy: ClusterFirstWithHostNet` for a hostNetwork pod that names none, or
    /// `ClusterFirst` (what the API server gives one that names none, and which a
    /// hostNetwork pod runs as the node's resolv.conf); `Default` and `None` are kept.
    pub(super) fn dns_policy(&mut self, spec: &mut Node, what: &str) {
        let current = spec
            .get("dnsPolicy")
            .and_then(Node::as_str)
            .unwrap_or_default()
            .to_string();
        if !["", CLUSTER_FIRST].contains(&current.as_str()) {
            return;
        }
        let value = Node::str(CLUSTER_FIRST_WITH_HOST_NET);
        match spec {
            Node::Map(entries) if current.is_empty() => {
                let at = entries
                    .iter()
                    .position(|(k, _)| k.text == "hostNetwork")
                    .map_or(entries.len(), |i| i + 1);
                entries.insert(at, (yaml::Scalar::string("dnsPolicy"), value));
            }
            _ => spec.set("dnsPolicy", value),
        }
        let was = if current.is_empty() {
            "none".to_string()
        } else {
            current
        };
        self.note(
            what.to_string(),
            format!(
                "sets dnsPolicy {CLUSTER_FIRST_WITH_HOST_NET} (was {was}): a hostNetwork pod otherwise resolves names with the node's resolv.conf, where cluster names do not resolve; set dnsPolicy: Default to keep the node's"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn slots_is_prime_and_the_ranges_avoid_nodeports_and_torchruns_port() {
        assert!(
            (2..SLOTS)
                .take_while(|d| d * d <= SLOTS)
                .all(|d| !SLOTS.is_multiple_of(d))
        );
        let (m_lo, x_lo) = ports(0);
        let (m_hi, x_hi) = ports(SLOTS - 1);
        assert_eq!((m_lo, m_hi), (20000, 24492));
        assert_eq!((x_lo, x_hi), (25000, 29492));
        assert!(m_hi < x_lo && x_hi < 29500);
    }

    #[test]
    fn the_slot_is_fixed_and_tells_one_character_apart() {
        // Pinned: the admission policy computes these in CEL, and a change here
        // changes the ports of every running job's next inject.
        assert_eq!(slot(""), 0);
        assert_eq!(slot("ml/ddp"), 362);
        assert_eq!(slot("ml/train"), slot("ml/train"));
        let base = slot("ml/train-1");
        for other in [
            "ml/train-2",
            "ml/trainx1",
            "ml/train-10",
            "m1/train-1",
            "/train-1",
        ] {
            assert_ne!(slot(other), base, "{other}");
        }
        // Characters outside names' alphabet count as 0, in CEL's indexOf as here.
        assert_eq!(slot("a/B"), slot("a/é"));
    }

    #[test]
    fn the_master_port_is_chosen_unless_a_port_serves_as_one() {
        for (args, chosen) in [
            ("--job=w=a=b", true),
            ("--job=w=a=b --master-port=29501", false),
            ("--job=w=a=b --port=2222", false),
            ("--job=w=a=b --port-name=c10d", false),
            ("--job=w=a=b --port=2222 --framework=pytorch,mpi", true),
        ] {
            assert_eq!(chooses_master_port(&strings(args)), chosen, "{args}");
        }
        let mut a = strings("--job=w=a=b --slots=2 --coordinator-port=1 --nnodes=1:2");
        with_master_port(&mut a, 20001);
        assert_eq!(
            a,
            strings("--job=w=a=b --slots=2 --master-port=20001 --coordinator-port=1 --nnodes=1:2")
        );
    }

    #[test]
    fn addresses_and_their_ports() {
        assert_eq!(addr_port("0.0.0.0:9465"), Some(9465));
        assert_eq!(addr_port("[::]:25000"), Some(25000));
        assert_eq!(addr_port("0.0.0.0:0"), None);
        assert_eq!(any_addr(25001), "0.0.0.0:25001");
    }

    mod props {
        use proptest::prelude::*;

        use super::*;
        use crate::testing::budget;

        proptest! {
            #![proptest_config(budget(64))]

            /// Every identity gets a pair inside the ranges, and a name that differs
            /// in one character gets another pair.
            #[test]
            fn ports_stay_in_range_and_one_character_changes_them(
                ns in "[a-z0-9-]{1,63}", name in "[a-z0-9.-]{1,200}", at in 0usize..200, c in "[a-z0-9.-]"
            ) {
                let id = identity(&ns, &name);
                let (m, x) = ports(slot(&id));
                prop_assert!((MASTER_BASE..MASTER_BASE + SLOTS as u16).contains(&m));
                prop_assert!((METRICS_BASE..METRICS_BASE + SLOTS as u16).contains(&x));
                let mut chars: Vec<char> = name.chars().collect();
                let at = at % chars.len();
                let c = c.chars().next().unwrap();
                prop_assume!(chars[at] != c);
                chars[at] = c;
                let other = identity(&ns, &chars.into_iter().collect::<String>());
                prop_assert_ne!(slot(&other), slot(&id));
            }
        }
    }
}
