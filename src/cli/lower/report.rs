//! The reporter's flags (`sidecar`, `exec --report`) into the engine's `Config`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::super::args::{KubeArgs, ReportArgs, SidecarArgs};
use super::super::defaults;
use super::super::exec_args::{ExecArgs, StallArgs};
use super::super::values::{FailureAction, Flag, PeerChange};
use super::{kube_settings, parse_duration};
use crate::Failure;
use crate::agent::{Config as ReportConfig, ExecConfig, ProbeConfig, PublishConfig, SidecarConfig};
use crate::flags;
use crate::stall::progress::{Pattern, WatchConfig};
use crate::supervise::policy::Policy;

/// `--metrics-addr`: `HOST:PORT`, `[::]:PORT`, or `off`.
fn metrics_addr(value: &str) -> Result<Option<SocketAddr>, Failure> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("off") || v.is_empty() {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| {
        Failure::usage(format!(
            "invalid --metrics-addr {value:?}: use HOST:PORT such as {}, or `off`",
            defaults::metrics_addr()
        ))
    })
}

/// The reporter flags shared by `sidecar` and `exec --report`: no client, no NVML, no
/// socket.
pub fn report_config(r: &ReportArgs, kube: &KubeArgs) -> Result<ReportConfig, Failure> {
    let interval = parse_duration(flags::INTERVAL, &r.interval)?;
    if interval < Duration::from_millis(100) {
        return Err(Failure::usage(format!(
            "invalid --interval {:?}: use at least 100ms, e.g. {}",
            r.interval,
            defaults::INTERVAL
        )));
    }
    let min_patch_interval = parse_duration(flags::MIN_PATCH_INTERVAL, &r.min_patch_interval)?;
    let metrics_addr = metrics_addr(&r.metrics_addr)?;
    if let Some(lib) = &r.nvml_lib
        && lib.as_os_str().is_empty()
    {
        return Err(Failure::usage(
            "invalid --nvml-lib \"\": give the path of libnvidia-ml.so.1",
        ));
    }
    if let Some(dir) = &r.observations
        && !dir.is_dir()
    {
        return Err(Failure::usage(format!(
            "invalid --observations {:?}: no such directory; mount the volume shared with the trainlet sidecar there",
            dir.display().to_string()
        )));
    }
    Ok(ReportConfig {
        kube: kube_settings(kube)?,
        probes: ProbeConfig {
            nvml_lib: r.nvml_lib.clone(),
            expect_gpus: r.expect_gpus,
            container: r.container.clone().filter(|c| !c.is_empty()),
            interval,
            ports: Vec::new(),
        },
        publish: PublishConfig {
            min_patch_interval,
            metrics_addr,
        },
        cluster_file: None,
    })
}

/// `exec --report` (implied by `--on-peer-change restart|exit`): the reporter flags
/// plus what a peer change does. `cluster_file` is init's cluster.json, the peers to
/// watch: there already, or (`resolving`) about to be written by exec's own init.
pub fn exec_report_config(
    a: &ExecArgs,
    cluster_file: Option<&Path>,
    resolving: bool,
) -> Result<(ReportConfig, ExecConfig), Failure> {
    let mut cfg = report_config(&a.report_args, &a.init.kube)?;
    let progress = progress_watch(&a.stall)?;
    let restart = Policy {
        on_change: a.on_peer_change.into(),
        on_stall: a.stall.on_stall.into(),
        on_failure: a.on_failure.into(),
        max_restarts: a.max_restarts,
        grace: parse_duration(flags::RESTART_GRACE, &a.restart_grace)?,
        backoff: parse_duration(flags::RESTART_BACKOFF, &a.restart_backoff)?,
        wait: Some(parse_duration(flags::TIMEOUT, &a.init.output.timeout)?)
            .filter(|t| !t.is_zero()),
    };
    if a.on_peer_change != PeerChange::Report {
        let what = a.on_peer_change.name();
        match cluster_file {
            _ if resolving => {}
            Some(f) if has_selectors(f) => {}
            Some(f) => {
                return Err(Failure::usage(format!(
                    "--on-peer-change {what} needs the peers' selectors, and {} names none (written by an older trainlet init): run this version's trainlet init, or let exec resolve (remove tf_config.json and give --job or --selector)",
                    f.display()
                )));
            }
            None => {
                return Err(Failure::usage(format!(
                    "--on-peer-change {what} needs the peers' selectors: there is no cluster.json in --output-dir {} next to tf_config.json; run trainlet init (or let exec resolve: remove tf_config.json and give --job or --selector)",
                    a.init.output.output_dir.display()
                )));
            }
        }
    }
    if a.permanent_exit_codes.is_some() && a.on_failure != FailureAction::Restart {
        return Err(Failure::usage(format!(
            "--{} names the codes that --{} restart does not retry: pass --{} restart",
            flags::PERMANENT_EXIT_CODES,
            flags::ON_FAILURE,
            flags::ON_FAILURE
        )));
    }
    cfg.cluster_file = cluster_file.map(Path::to_path_buf);
    let own = ExecConfig {
        observations: a.report_args.observations.clone(),
        restart,
        progress,
    };
    Ok((cfg, own))
}

/// `--permanent-exit-codes` of exec, else the training container's permanent codes.
pub fn exec_permanent_codes(a: &ExecArgs) -> Result<Vec<i32>, Failure> {
    match a.permanent_exit_codes.as_deref() {
        Some(spec) => super::permanent_exit_codes(spec),
        None => Ok(crate::exit::CMD_PERMANENT.to_vec()),
    }
}

/// Whether a cluster.json lists the selectors it was resolved with.
fn has_selectors(f: &Path) -> bool {
    crate::render::read_cluster_file(f).is_ok_and(|c| !c.selectors.is_empty())
}

/// `sidecar`: the reporter flags plus the ports to watch, the node's cgroups and
/// `--exit-with-main`.
pub fn sidecar_config(a: &SidecarArgs) -> Result<(ReportConfig, SidecarConfig), Failure> {
    let mut cfg = report_config(&a.report, &a.kube)?;
    if let Some(p) = a.ports.iter().find(|p| **p == 0) {
        return Err(Failure::usage(format!(
            "invalid --port {p}: give the container port to watch, e.g. {}",
            defaults::PORT
        )));
    }
    cfg.probes.ports = a.ports.clone();
    if let Some(root) = &a.cgroup_root
        && !root.is_dir()
    {
        return Err(Failure::usage(format!(
            "invalid --cgroup-root {}: not a directory (mount the node's /sys/fs/cgroup there read-only)",
            root.display()
        )));
    }
    cfg.cluster_file = match a.cluster_file.as_deref().map(str::trim) {
        None => Some(Path::new(defaults::OUTPUT_DIR).join(crate::render::CLUSTER_FILE)),
        Some("" | "off") => None,
        Some(f) => Some(f.into()),
    };
    let own = SidecarConfig {
        cgroup_root: a.cgroup_root.clone(),
        exit_with_main: a.exit_with_main,
        observations: a.report.observations.clone(),
    };
    Ok((cfg, own))
}

/// The shortest `--stall-after`: a silence is seen every `--interval`, and one shorter
/// than a second is no hang.
pub const MIN_STALL_AFTER: Duration = Duration::from_secs(1);

/// `--stall-after`, `--on-stall`, `--progress-pattern`: `None` when CMD's progress is
/// not watched. `inject` checks them the same way before it writes them.
pub fn progress_watch(a: &StallArgs) -> Result<Option<WatchConfig>, Failure> {
    let stall_after = a
        .stall_after
        .as_deref()
        .map(|d| parse_duration(flags::STALL_AFTER, d))
        .transpose()?;
    if stall_after.is_some_and(|d| d < MIN_STALL_AFTER) {
        return Err(Failure::usage(format!(
            "invalid --{} {:?}: use at least 1s, e.g. 10m",
            flags::STALL_AFTER,
            a.stall_after.as_deref().unwrap_or_default()
        )));
    }
    if a.on_stall != defaults::ON_STALL && stall_after.is_none() {
        return Err(Failure::usage(format!(
            "--{} {} acts on a stall, which --{} defines: pass --{} DURATION",
            flags::ON_STALL,
            a.on_stall.name(),
            flags::STALL_AFTER,
            flags::STALL_AFTER
        )));
    }
    let pattern = Pattern::new(a.progress_pattern.as_deref()).map_err(|why| {
        Failure::usage(format!(
            "invalid --{} {:?}: {why}",
            flags::PROGRESS_PATTERN,
            a.progress_pattern.as_deref().unwrap_or_default()
        ))
    })?;
    Ok(
        (stall_after.is_some() || a.progress_pattern.is_some()).then_some(WatchConfig {
            stall_after,
            pattern,
            heartbeat: None,
            scope: a.stall_scope.into(),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_addresses() {
        assert_eq!(metrics_addr("off").unwrap(), None);
        assert_eq!(
            metrics_addr("0.0.0.0:9464").unwrap(),
            Some("0.0.0.0:9464".parse().unwrap())
        );
        assert_eq!(
            metrics_addr("[::]:9464").unwrap(),
            Some("[::]:9464".parse().unwrap())
        );
        let e = metrics_addr("localhost").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --metrics-addr \"localhost\": use HOST:PORT such as 0.0.0.0:9464, or `off`"
        );
    }

    /// `--stall-after 1ms` was accepted; u64::MAX seconds aborted exec. `inject` calls
    /// the same check.
    #[test]
    fn stall_after_is_from_a_second_to_a_year() {
        let watch = |d: &str| {
            progress_watch(&StallArgs {
                stall_after: Some(d.into()),
                on_stall: defaults::ON_STALL,
                stall_scope: defaults::STALL_SCOPE,
                progress_pattern: None,
            })
            .map(|w| w.and_then(|w| w.stall_after))
            .map_err(|f| (f.code, f.message))
        };
        assert_eq!(watch("1s"), Ok(Some(Duration::from_secs(1))));
        assert_eq!(watch("365d"), Ok(Some(super::super::MAX_DURATION)));
        for d in ["1ms", "999ms", "0"] {
            assert_eq!(
                watch(d),
                Err((
                    crate::Code::Usage,
                    format!("invalid --stall-after {d:?}: use at least 1s, e.g. 10m")
                ))
            );
        }
        assert_eq!(
            watch("18446744073709551615s"),
            Err((
                crate::Code::Usage,
                "invalid --stall-after \"18446744073709551615s\": use at most 365d (a year), e.g. 30s, 10m or 1h".into()
            ))
        );
    }
}
