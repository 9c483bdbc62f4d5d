//! The values of trainlet's enumerated flags, as clap offers them and as `--help`
//! describes them. The domain has its own enums, which know nothing of clap; each value
//! here turns into the domain's with `From`, and [`Flag::name`] gives the spelling back
//! for the command lines `inject` writes.

use clap::ValueEnum;

use crate::bootstrap::Coordinate;
use crate::cluster::{AddressMode, OrderMode, ReadyMode};
use crate::logging::LogFormat;
use crate::render::frameworks;
use crate::stall::progress::Scope;
use crate::supervise::policy::{OnPeerChange, OnStall};

/// An unsigned integer type a flag takes, with its largest value for the message.
pub trait Whole: std::str::FromStr {
    const MAX: u64;
}

impl Whole for u16 {
    const MAX: u64 = u16::MAX as u64;
}

impl Whole for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl Whole for usize {
    const MAX: u64 = usize::MAX as u64;
}

/// A whole number in digits only (`--port`, `--max-restarts`): `+80` and ` 80`, which
/// Rust's own parser takes, are refused as the admission policy refuses them in an
/// annotation, so that a value is good for both or for neither.
pub fn whole<T: Whole>(s: &str) -> Result<T, String> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s} is not a whole number in digits"));
    }
    match s.parse() {
        Ok(n) if !s.starts_with('-') => Ok(n),
        _ => Err(format!("{s} is not in 0..={}", T::MAX)),
    }
}

/// `--coordinate-from`: a whole number from 2 on.
pub fn coordinate_from(s: &str) -> Result<usize, String> {
    match whole::<usize>(s)? {
        n if n < 2 => Err("give 2 or more".into()),
        n => Ok(n),
    }
}

/// A flag value's spelling, as clap parses it.
pub trait Flag: ValueEnum {
    fn name(&self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

impl<T: ValueEnum> Flag for T {}

/// `--address`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Address {
    /// The pod IP.
    PodIp,
    /// The node's host IP, for `hostNetwork` pods.
    HostIp,
    /// `<hostname>.<subdomain>.<namespace>.svc.<cluster-domain>`.
    Dns,
}

impl From<Address> for AddressMode {
    fn from(a: Address) -> Self {
        match a {
            Address::PodIp => AddressMode::PodIp,
            Address::HostIp => AddressMode::HostIp,
            Address::Dns => AddressMode::Dns,
        }
    }
}

/// `--order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Order {
    /// The pods' own index (Job completion, StatefulSet, Kubeflow), else natural names.
    Index,
    /// TensorFlow's plain lexicographic order of names.
    Name,
}

impl From<Order> for OrderMode {
    fn from(o: Order) -> Self {
        match o {
            Order::Index => OrderMode::Index,
            Order::Name => OrderMode::Name,
        }
    }
}

/// `--ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Ready {
    /// Running, or still Pending in its init containers, with an address.
    Running,
    /// Also the pod's Ready condition.
    Ready,
}

impl From<Ready> for ReadyMode {
    fn from(r: Ready) -> Self {
        match r {
            Ready::Running => ReadyMode::Running,
            Ready::Ready => ReadyMode::Ready,
        }
    }
}

/// `--coordinate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Coordination {
    /// From 384 pods on, as far as this agent can tell.
    Auto,
    /// Always, also in small jobs.
    Always,
    /// Never: every agent watches every peer.
    Never,
}

impl Coordination {
    /// The domain's value; `from` is `--coordinate-from`, which only `auto` uses.
    pub fn with_threshold(self, from: usize) -> Coordinate {
        match self {
            Coordination::Auto => Coordinate::Auto { from },
            Coordination::Always => Coordinate::Always,
            Coordination::Never => Coordinate::Never,
        }
    }
}

/// `--framework`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Framework {
    /// TF_CONFIG, TRAINLET_TASK_TYPE and TRAINLET_TASK_INDEX, which `trainlet.env`
    /// always holds: choosing it alone (the default) adds nothing else.
    Tensorflow,
    /// torch.env: MASTER_ADDR, WORLD_SIZE, RANK and torchrun's PET_* variables.
    Pytorch,
    /// jax.env: JAX_COORDINATOR_ADDRESS and the process count and id.
    Jax,
    /// mpi.env: TRAINLET_HOSTS for `horovodrun -H` (the hostfile is always written).
    Mpi,
}

impl From<Framework> for frameworks::Framework {
    fn from(f: Framework) -> Self {
        match f {
            Framework::Tensorflow => frameworks::Framework::Tensorflow,
            Framework::Pytorch => frameworks::Framework::Pytorch,
            Framework::Jax => frameworks::Framework::Jax,
            Framework::Mpi => frameworks::Framework::Mpi,
        }
    }
}

/// `--on-failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailureAction {
    /// End with CMD's code: the pod fails, and the Job controller decides.
    Exit,
    /// Start CMD again in place, in every pod of the job.
    Restart,
}

impl FailureAction {
    /// The value as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FailureAction::Exit => "exit",
            FailureAction::Restart => "restart",
        }
    }
}

impl From<FailureAction> for crate::supervise::policy::OnFailure {
    fn from(f: FailureAction) -> Self {
        match f {
            FailureAction::Exit => crate::supervise::policy::OnFailure::Exit,
            FailureAction::Restart => crate::supervise::policy::OnFailure::Restart,
        }
    }
}

/// `--on-peer-change`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerChange {
    /// Report the stale cluster (Events, `trainlet.io/cluster`, the metric); CMD runs on.
    Report,
    /// Stop CMD, wait for the cluster, rewrite the files, start CMD again.
    Restart,
    /// Stop CMD and exit 7, so the Job controller replaces the pod and its init
    /// resolves the new cluster.
    Exit,
}

impl From<PeerChange> for OnPeerChange {
    fn from(p: PeerChange) -> Self {
        match p {
            PeerChange::Report => OnPeerChange::Report,
            PeerChange::Restart => OnPeerChange::Restart,
            PeerChange::Exit => OnPeerChange::Exit,
        }
    }
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Logs {
    /// Lines for people.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl From<Logs> for LogFormat {
    fn from(l: Logs) -> Self {
        match l {
            Logs::Text => LogFormat::Text,
            Logs::Json => LogFormat::Json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Digits only, as the admission policy takes a number; clap's words otherwise.
    #[test]
    fn whole_numbers_are_digits_within_their_type() {
        assert_eq!(whole::<u16>("080"), Ok(80));
        assert_eq!(
            whole::<u16>("70000"),
            Err("70000 is not in 0..=65535".into())
        );
        assert_eq!(
            whole::<u32>("-1"),
            Err("-1 is not in 0..=4294967295".into())
        );
        for bad in ["+80", " 80", "8o", "", "1e3"] {
            assert_eq!(
                whole::<u16>(bad),
                Err(format!("{bad} is not a whole number in digits"))
            );
        }
        assert_eq!(coordinate_from("1"), Err("give 2 or more".into()));
        assert_eq!(coordinate_from("384"), Ok(384));
    }

    /// The domain's names of its values are the flags' spellings.
    #[test]
    fn every_value_is_spelled_as_the_domain_names_it() {
        for f in Framework::value_variants() {
            assert_eq!(frameworks::Framework::from(*f).name(), f.name());
        }
        assert_eq!(Address::HostIp.name(), "host-ip");
        assert_eq!(Coordination::Never.name(), "never");
        assert_eq!(PeerChange::Restart.name(), "restart");
    }
}

/// `status --output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// A table of the pods and the verdict.
    Table,
    /// `{"state":…,"verdict":…,"pods":[…]}`.
    Json,
}

/// `exec --on-stall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Stall {
    /// The `Stalled` Event, `trainlet.io/progress` and the metrics; CMD runs on.
    Report,
    /// Stop CMD and start it again, in every pod of the job.
    Restart,
    /// Stop CMD and exit 8, so that the Job controller replaces the pod.
    Exit,
}

/// `exec --stall-scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StallScope {
    /// `job`; with a `ps` type in the cluster (TensorFlow's ParameterServerStrategy,
    /// whose workers train asynchronously), also each pod whose CMD signalled progress
    /// (the heartbeat file, a --progress-pattern match, a Kubeflow report) and then made
    /// none for --stall-after: parameter servers print start-up lines, then serve in
    /// silence.
    Auto,
    /// The job is stalled when no pod of it made progress for --stall-after; rank 0's
    /// pod says so. A pod that is quiet while another makes progress is only silent.
    Job,
    /// Each pod is stalled when its CMD made progress and then none for --stall-after,
    /// whatever the other pods do.
    Pod,
}

impl From<StallScope> for Option<Scope> {
    fn from(s: StallScope) -> Self {
        match s {
            StallScope::Auto => None,
            StallScope::Job => Some(Scope::Job),
            StallScope::Pod => Some(Scope::Pod),
        }
    }
}

impl From<Stall> for OnStall {
    fn from(s: Stall) -> Self {
        match s {
            Stall::Report => OnStall::Report,
            Stall::Restart => OnStall::Restart,
            Stall::Exit => OnStall::Exit,
        }
    }
}
