//! `status`'s flags into the job to show.

use super::super::args::StatusArgs;
use super::namespace;
use crate::Failure;
use crate::cluster::{is_dns_label, selector};
use crate::flags;
use crate::status::Target;

/// The job `status` shows: a name (`job/NAME`, `jobset/NAME`, `NAME`) or selectors,
/// never both, each checked as the API server would.
pub fn status_target(a: &StatusArgs) -> Result<Target, Failure> {
    if let Some(ns) = &a.namespace {
        namespace(flags::NAMESPACE, ns)?;
    }
    let selectors: Vec<String> = a
        .selectors
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for s in &selectors {
        selector::parse(s)
            .map_err(|why| Failure::usage(format!("invalid --{} {s:?}: {why}", flags::SELECTOR)))?;
    }
    let target = match (&a.target, selectors.is_empty()) {
        (None, true) => {
            return Err(Failure::usage(format!(
                "name the job (job/NAME, jobset/NAME or NAME) or give --{} SELECTOR",
                flags::SELECTOR
            )));
        }
        (Some(t), false) => {
            return Err(Failure::usage(format!(
                "give the job {t:?} or --{}, not both",
                flags::SELECTOR
            )));
        }
        (None, false) => return Ok(Target::Selectors(selectors)),
        (Some(t), true) => t,
    };
    let (kind, name) = match target.split_once('/') {
        Some((kind, name)) => (Some(kind), name),
        None => (None, target.as_str()),
    };
    // A label value: what the Job and JobSet controllers copy the name into.
    if !is_dns_label(name) {
        return Err(Failure::usage(format!(
            "invalid job {target:?}: a Job's or JobSet's name is at most 63 lowercase letters, digits and '-'"
        )));
    }
    match kind {
        None => Ok(Target::Either(name.to_string())),
        Some("job" | "jobs" | "job.batch") => Ok(Target::Job(name.to_string())),
        Some("jobset" | "jobsets" | "jobset.jobset.x-k8s.io") => {
            Ok(Target::JobSet(name.to_string()))
        }
        Some(other) => Err(Failure::usage(format!(
            "invalid job {target:?}: {other:?} is not job or jobset"
        ))),
    }
}
