//! The settings the admission policy reads from a pod's annotations, and the rule of a
//! valid value of each: one table, from which the policy's checks are generated and by
//! which `inject` checks what it writes (`admission::Settings::check_args`).

use super::super::defaults;
use super::super::values::{Flag, Framework};
use super::MAX_DURATION;
use super::report::MIN_STALL_AFTER;
use crate::flags as f;
use crate::inject::transform::admission::{Rule, Setting, Settings};
use std::time::Duration;

/// The settings the policy reads from a pod's annotations, with what a valid value of
/// each is: the flags `inject` writes into `trainlet init`, `trainlet exec` and the
/// sidecar, in its order ([`init_flags`], [`exec_flags`]), each with its default, which is not
/// written. `inject` checks what it writes by the same rules.
pub(super) fn settings(install_to: &str) -> Settings {
    Settings {
        init: init_settings(install_to),
        exec: exec_settings(),
        // The sidecar's: on hostNetwork, where none is given, the policy chooses one as
        // inject does (`inject::transform::hostnet`).
        sidecar: vec![value(
            f::METRICS_ADDR,
            Some(defaults::metrics_addr()),
            Rule::Addr,
        )],
        required: vec![f::JOB],
        default_port: defaults::PORT,
    }
}

/// The highest count a setting takes (more is a typo, not a job).
const BILLION: u64 = 999_999_999;

/// A TCP port.
fn port() -> Rule {
    Rule::Count {
        words: &[],
        min: 1,
        max: u16::MAX.into(),
    }
}

/// A duration of at least `min`.
fn duration(min: Duration) -> Rule {
    Rule::Duration {
        min,
        max: MAX_DURATION,
    }
}

/// A flag's value, with its default (not written) and its rule.
fn value(flag: &'static str, default: Option<String>, rule: Rule) -> Setting {
    Setting::Value {
        flag,
        default,
        rule,
    }
}

/// `trainlet init`'s settings, in inject's order: the cluster's, then the
/// frameworks'.
fn init_settings(install_to: &str) -> Vec<Setting> {
    let mut init = cluster_settings(install_to);
    init.extend(framework_settings());
    init
}

/// How `trainlet init` finds and waits for the cluster.
fn cluster_settings(install_to: &str) -> Vec<Setting> {
    vec![
        Setting::Each {
            flag: f::JOB,
            rule: Rule::Jobs,
        },
        value(f::EXPECT, None, Rule::Expect),
        value(f::PORT, None, port()),
        // A container port's name (IANA_SVC_NAME): what else would name no port.
        value(
            f::PORT_NAME,
            None,
            Rule::Text("[a-z0-9](?:[a-z0-9-]{0,13}[a-z0-9])?"),
        ),
        value(
            f::ADDRESS,
            Some(defaults::ADDRESS.name()),
            Rule::Choice(&["pod-ip", "host-ip", "dns"]),
        ),
        value(
            f::CLUSTER_DOMAIN,
            Some(defaults::CLUSTER_DOMAIN.to_string()),
            Rule::Text("[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?"),
        ),
        value(
            f::ORDER,
            Some(defaults::ORDER.name()),
            Rule::Choice(&["index", "name"]),
        ),
        value(
            f::READY,
            Some(defaults::READY.name()),
            Rule::Choice(&["running", "ready"]),
        ),
        // TensorFlow's rpc layers: grpc, grpc+verbs, grpc+mpi.
        value(
            f::RPC_LAYER,
            Some(defaults::RPC_LAYER.to_string()),
            Rule::Text("[a-z][a-z0-9+]{0,31}"),
        ),
        value(f::ENVIRONMENT, None, Rule::Text("[A-Za-z0-9_.-]{1,64}")),
        Setting::Fixed(f::with_value(f::INSTALL_TO, install_to)),
        value(
            f::TIMEOUT,
            Some(defaults::TIMEOUT.to_string()),
            duration(Duration::ZERO),
        ),
        value(
            f::COORDINATE,
            Some(defaults::COORDINATE.name()),
            Rule::Choice(&["auto", "always", "never"]),
        ),
        value(
            f::COORDINATE_FROM,
            Some(defaults::COORDINATE_FROM.to_string()),
            Rule::Count {
                words: &[],
                min: 2,
                max: BILLION,
            },
        ),
    ]
}

/// What `trainlet init` writes for the frameworks.
fn framework_settings() -> Vec<Setting> {
    vec![
        Setting::Switch { flag: f::PREFLIGHT },
        value(
            f::FRAMEWORK,
            Some(Framework::Tensorflow.name()),
            Rule::Choices(&["tensorflow", "pytorch", "jax", "mpi"]),
        ),
        value(
            f::NPROC_PER_NODE,
            Some(defaults::NPROC_PER_NODE.to_string()),
            Rule::Count {
                words: &["auto", "gpu", "cpu"],
                min: 1,
                max: BILLION,
            },
        ),
        value(
            f::SLOTS,
            None,
            Rule::Count {
                words: &["gpu"],
                min: 1,
                max: BILLION,
            },
        ),
        value(f::MASTER_PORT, None, port()),
        value(f::COORDINATOR_PORT, None, port()),
        value(f::NNODES, None, Rule::Span),
    ]
}

/// `trainlet exec`'s settings, in inject's order.
fn exec_settings() -> Vec<Setting> {
    vec![
        value(
            f::ON_PEER_CHANGE,
            Some(defaults::ON_PEER_CHANGE.name()),
            Rule::Choice(&["report", "restart", "exit"]),
        ),
        value(
            f::MAX_RESTARTS,
            Some(defaults::MAX_RESTARTS.to_string()),
            Rule::Count {
                words: &[],
                min: 0,
                max: BILLION,
            },
        ),
        value(
            f::RESTART_GRACE,
            Some(defaults::RESTART_GRACE.to_string()),
            duration(Duration::ZERO),
        ),
        value(f::STALL_AFTER, None, duration(MIN_STALL_AFTER)),
        value(
            f::ON_STALL,
            Some(defaults::ON_STALL.name()),
            Rule::Choice(&["report", "restart", "exit"]),
        ),
        value(
            f::STALL_SCOPE,
            Some(defaults::STALL_SCOPE.name()),
            Rule::Choice(&["auto", "job", "pod"]),
        ),
        value(f::PROGRESS_PATTERN, None, Rule::Pattern),
        value(
            f::ON_FAILURE,
            Some(defaults::ON_FAILURE.name().to_string()),
            Rule::Choice(&["exit", "restart"]),
        ),
        value(f::PERMANENT_EXIT_CODES, None, Rule::Codes),
    ]
}
