//! The second phase of parsing, as ripgrep's low and high args: clap's [`args`] in,
//! the validated configs of the domain out (`ClusterConfig`, `InitConfig`, the
//! reporter's `Config`, kube's `Settings`, `InjectConfig`). Nothing here talks to the
//! API server, loads a library or binds a socket; the few file checks are there to
//! catch a missing volume mount before a long wait.
//!
//! Every error that names a flag is written here, or in [`super::explain`] for the
//! errors that surface only at run time.
//!
//! [`args`]: super::args

mod admission;
mod cluster;
mod inject;
mod report;
mod settings;
mod status;

use std::time::Duration;

use tracing_subscriber::EnvFilter;

use super::args::KubeArgs;
use crate::Failure;
use crate::flags;
use crate::inject::transform::admission::Rule;
use crate::kube;

pub use admission::admission_config;
pub use cluster::{cluster_config, framework_config, init_config, master_query};
pub use inject::inject_config;
pub use report::{
    exec_permanent_codes, exec_report_config, progress_watch, report_config, sidecar_config,
};
pub use status::status_target;

/// The longest duration any flag takes: a year. A longer one is a slip of the
/// keyboard, and one near `u64::MAX` seconds overflowed the clock arithmetic that
/// waits for it, aborting exec and leaving CMD without its parent.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration such as `500ms`, `10s`, `10m` or `1h 30m`, at most
/// [`MAX_DURATION`]; a bare `0` is zero.
pub fn parse_duration(flag: &str, value: &str) -> Result<Duration, Failure> {
    let v = value.trim();
    if v == "0" {
        return Ok(Duration::ZERO);
    }
    let zero = if flag == flags::TIMEOUT {
        "; 0 means no limit"
    } else {
        ""
    };
    let d = humantime::parse_duration(v).map_err(|e| {
        Failure::usage(format!(
            "invalid --{flag} {value:?}: {e} (use e.g. 30s, 10m or 1h{zero})"
        ))
    })?;
    if d > MAX_DURATION {
        return Err(Failure::usage(format!(
            "invalid --{flag} {value:?}: use at most 365d (a year), e.g. 30s, 10m or 1h{zero}"
        )));
    }
    Ok(d)
}

/// `--log-level`, in tracing's EnvFilter syntax.
///
/// kube's client logs every failed request at ERROR ("failed with error client error
/// (Connect)") and returns the error, which trainlet then reports in its own words: a
/// failure would print two lines. So that log is off unless the filter names
/// `kube_client`. py-spy, which reads CMD's stacks, logs each step of every read at
/// INFO: only its warnings, unless the filter names `py_spy`.
pub fn log_filter(value: &str) -> Result<EnvFilter, Failure> {
    let mut filter = EnvFilter::try_new(value)
        .map_err(|e| Failure::usage(format!("invalid --log-level {value:?}: {e}")))?;
    if !value.contains("py_spy") {
        for quiet in ["py_spy=warn", "remoteprocess=warn"] {
            filter = filter.add_directive(quiet.parse().expect("a valid directive"));
        }
    }
    Ok(if value.contains("kube_client") {
        filter
    } else {
        filter.add_directive(
            "kube_client::client::builder=off"
                .parse()
                .expect("a valid directive"),
        )
    })
}

/// How to reach the API server and who "self" is; the environment's defaults
/// ($POD_NAME, the service account) are applied by `kube` when they are needed.
pub fn kube_settings(a: &KubeArgs) -> Result<kube::Settings, Failure> {
    if let Some(ns) = &a.pod_namespace {
        namespace(flags::POD_NAMESPACE, ns)?;
    }
    Ok(kube::Settings {
        kubeconfig: a.kubeconfig.clone(),
        pod_name: a.pod_name.clone(),
        pod_namespace: a.pod_namespace.clone(),
    })
}

/// A namespace name is a DNS label (RFC 1123): one the API server would refuse is a
/// usage error now, not a wait until the timeout.
pub(super) fn namespace(flag: &str, ns: &str) -> Result<(), Failure> {
    if crate::cluster::is_dns_label(ns) {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "invalid --{flag} {ns:?}: a namespace is a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
        )))
    }
}

/// `--permanent-exit-codes 1,2,42`: codes from 1 to 255 in digits, separated by `,`
/// without spaces: what the admission policy admits in `trainlet.io/permanent-exit-codes`
/// ([`Rule::Codes`]), since inject writes the value as given into the wrapped exec.
/// Returned sorted and each once, as Kubernetes wants a rule's `onExitCodes.values`.
/// 0 is success, which Kubernetes refuses in an `In` rule.
pub fn permanent_exit_codes(spec: &str) -> Result<Vec<i32>, Failure> {
    let bad = |why: String| {
        Failure::usage(format!(
            "invalid --{} {spec:?}: {why}",
            flags::PERMANENT_EXIT_CODES
        ))
    };
    if spec.split(',').any(|c| c.trim() == "0") {
        return Err(bad("0 is success, never a failure".to_string()));
    }
    Rule::Codes.check(spec).map_err(bad)?;
    let mut codes: Vec<i32> = spec
        .split(',')
        .map(|c| c.parse().expect("Rule::Codes admits digits only"))
        .collect();
    codes.sort_unstable();
    codes.dedup();
    Ok(codes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn durations() {
        assert_eq!(parse_duration(flags::TIMEOUT, "0").unwrap().as_secs(), 0);
        assert_eq!(
            parse_duration(flags::TIMEOUT, "10m").unwrap().as_secs(),
            600
        );
        assert_eq!(
            parse_duration(flags::TIMEOUT, "1h 30m").unwrap().as_secs(),
            5400
        );
        let e = parse_duration(flags::TIMEOUT, "soon").unwrap_err();
        assert_eq!(e.code, Code::Usage);
        assert!(
            e.message.starts_with("invalid --timeout \"soon\""),
            "{}",
            e.message
        );
    }

    /// u64::MAX seconds passed once and overflowed exec's clock arithmetic.
    #[test]
    fn durations_past_a_year_are_refused_naming_the_flag() {
        assert_eq!(
            parse_duration(flags::STALL_AFTER, "365d").unwrap(),
            MAX_DURATION
        );
        for (flag, value) in [
            (flags::STALL_AFTER, "18446744073709551615s"),
            (flags::INTERVAL, "18446744073709551615s"),
            (flags::RESTART_GRACE, "18446744073709551615s"),
            (flags::RESTART_BACKOFF, "366d"),
        ] {
            let e = parse_duration(flag, value).unwrap_err();
            assert_eq!(e.code, Code::Usage);
            assert_eq!(
                e.message,
                format!(
                    "invalid --{flag} {value:?}: use at most 365d (a year), e.g. 30s, 10m or 1h"
                )
            );
        }
        assert_eq!(
            parse_duration(flags::TIMEOUT, "400d").unwrap_err().message,
            "invalid --timeout \"400d\": use at most 365d (a year), e.g. 30s, 10m or 1h; 0 means no limit"
        );
    }

    mod properties {
        use super::*;
        use crate::testing::budget;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(budget(512))]

            #[test]
            fn durations_never_panic_and_fail_as_usage(text in "\\PC{0,40}") {
                if let Err(f) = parse_duration(flags::TIMEOUT, &text) {
                    prop_assert_eq!(f.code, Code::Usage);
                    prop_assert!(f.message.starts_with("invalid --timeout "));
                    prop_assert!(!f.message.contains('\n'));
                }
            }

            /// Exact up to a year; refused past it.
            #[test]
            fn durations_in_each_unit_are_exact(n in 1u64..100_000, unit in prop_oneof![Just(("ms", 1u64)), Just(("s", 1000)), Just(("m", 60_000)), Just(("h", 3_600_000))]) {
                let d = parse_duration(flags::INTERVAL, &format!("{n}{}", unit.0));
                if u128::from(n * unit.1) <= MAX_DURATION.as_millis() {
                    prop_assert_eq!(d.unwrap().as_millis(), u128::from(n * unit.1));
                } else {
                    prop_assert_eq!(d.unwrap_err().code, Code::Usage);
                }
            }
        }
    }
}
