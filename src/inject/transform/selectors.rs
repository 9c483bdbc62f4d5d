//! Whether `--job`'s selectors can find a template's pods. A selector that matches none
//! of them (`job-name=llm-dp` for a Job named `llm-ddp`) is accepted by every parser and
//! fails only at run time, when each pod's init waits out its `--timeout` for peers it
//! never sees; inject says so at once. Pure: a template's labels, those its controller
//! adds, and the selectors in; a verdict out.

use std::collections::BTreeMap;

use crate::cluster::selector::{self, Expression};

/// The labels a pod of a template will carry: the template's own and the known ones
/// its controller adds, and the keys the controller sets to values inject cannot know
/// (an index, a uid, a hash; a key ending in `/` stands for its whole prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodLabels {
    pub known: BTreeMap<String, String>,
    pub unknown: Vec<&'static str>,
}

impl PodLabels {
    /// The labels of a pod that `kind` named `name` makes of a template with `own`
    /// labels (a JobSet's pods: of its replicated job `rjob`).
    pub fn of(kind: &str, name: &str, rjob: Option<&str>, own: BTreeMap<String, String>) -> Self {
        const JOB: [&str; 3] = [
            "controller-uid",
            "batch.kubernetes.io/controller-uid",
            "batch.kubernetes.io/job-completion-index",
        ];
        let (known, unknown): (Vec<(&str, &str)>, Vec<&'static str>) = match kind {
            "Job" => (
                vec![("batch.kubernetes.io/job-name", name), ("job-name", name)],
                JOB.to_vec(),
            ),
            "CronJob" => (
                vec![],
                [&JOB[..], &["job-name", "batch.kubernetes.io/job-name"]].concat(),
            ),
            "StatefulSet" => (
                vec![],
                vec![
                    "statefulset.kubernetes.io/pod-name",
                    "apps.kubernetes.io/pod-index",
                    "controller-revision-hash",
                ],
            ),
            "Deployment" => (vec![], vec!["pod-template-hash"]),
            "JobSet" => (
                vec![
                    ("jobset.sigs.k8s.io/jobset-name", name),
                    (
                        "jobset.sigs.k8s.io/replicatedjob-name",
                        rjob.unwrap_or_default(),
                    ),
                ],
                [
                    &JOB[..],
                    &[
                        "job-name",
                        "batch.kubernetes.io/job-name",
                        "jobset.sigs.k8s.io/",
                    ],
                ]
                .concat(),
            ),
            _ => (vec![], vec![]),
        };
        let mut labels = own;
        for (k, v) in known {
            labels.insert(k.to_string(), v.to_string());
        }
        PodLabels {
            known: labels,
            unknown,
        }
    }

    fn is_unknown(&self, key: &str) -> bool {
        !self.known.contains_key(key)
            && self
                .unknown
                .iter()
                .any(|u| *u == key || (u.ends_with('/') && key.starts_with(u)))
    }

    /// Whether a pod with these labels may match `sel`: false only where one of its
    /// requirements is certainly false.
    pub fn may_match(&self, sel: &selector::Selector) -> bool {
        sel.clone().into_iter().all(|e| {
            let key = match &e {
                Expression::In(k, _)
                | Expression::NotIn(k, _)
                | Expression::Equal(k, _)
                | Expression::NotEqual(k, _)
                | Expression::Exists(k)
                | Expression::DoesNotExist(k) => k,
            };
            if self.is_unknown(key) {
                return true;
            }
            let value = self.known.get(key);
            match &e {
                Expression::In(_, set) => value.is_some_and(|v| set.contains(v)),
                Expression::NotIn(_, set) => value.is_none_or(|v| !set.contains(v)),
                Expression::Equal(_, want) => value == Some(want),
                Expression::NotEqual(_, want) => value != Some(want),
                Expression::Exists(_) => value.is_some(),
                Expression::DoesNotExist(_) => value.is_none(),
            }
        })
    }
}

/// The note for a template none of whose pods any of `--job`'s selectors (the
/// `--job=TYPE=SELECTOR` arguments) can match; `None` where one can, or no selector
/// parses (init's own check reports that).
pub fn unmatched(labels: &PodLabels, init_args: &[String]) -> Option<String> {
    let selectors: Vec<(String, selector::Selector)> = init_args
        .iter()
        .filter_map(|a| a.strip_prefix("--job="))
        .filter_map(|j| j.split_once('='))
        .filter_map(|(_, s)| selector::parse(s).ok().map(|p| (s.trim().to_string(), p)))
        .collect();
    if selectors.is_empty() || selectors.iter().any(|(_, s)| labels.may_match(s)) {
        return None;
    }
    let shown: Vec<String> = labels
        .known
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let written: Vec<&str> = selectors.iter().map(|(s, _)| s.as_str()).collect();
    Some(format!(
        "no --job selector ({}) matches this template's pods, whose labels are {}: their init would wait out --timeout for peers it never finds",
        written.join("; "),
        if shown.is_empty() {
            "none".to_string()
        } else {
            shown.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::labels;

    fn job(sel: &str) -> Vec<String> {
        vec![format!("--job=worker={sel}")]
    }

    #[test]
    fn a_jobs_own_name_is_a_label_of_its_pods() {
        let pods = PodLabels::of("Job", "llm-ddp", None, labels(&[("app", "llm")]));
        assert_eq!(
            unmatched(&pods, &job("batch.kubernetes.io/job-name=llm-ddp")),
            None
        );
        assert_eq!(unmatched(&pods, &job("app=llm,!gpu")), None);
        assert_eq!(
            unmatched(&pods, &job("job-name=llm-dp")).unwrap(),
            "no --job selector (job-name=llm-dp) matches this template's pods, whose labels are app=llm, batch.kubernetes.io/job-name=llm-ddp, job-name=llm-ddp: their init would wait out --timeout for peers it never finds"
        );
    }

    #[test]
    fn what_a_controller_sets_later_may_match_anything() {
        let sts = PodLabels::of("StatefulSet", "w", None, labels(&[("app", "w")]));
        assert_eq!(
            unmatched(&sts, &job("apps.kubernetes.io/pod-index=0")),
            None
        );
        let cron = PodLabels::of("CronJob", "nightly", None, labels(&[]));
        assert_eq!(unmatched(&cron, &job("job-name=nightly-123")), None);
        let js = PodLabels::of("JobSet", "train", Some("workers"), labels(&[]));
        assert_eq!(unmatched(&js, &job("jobset.sigs.k8s.io/job-index=0")), None);
        assert_eq!(
            unmatched(&js, &job("jobset.sigs.k8s.io/replicatedjob-name=workers")),
            None
        );
        assert!(unmatched(&js, &job("jobset.sigs.k8s.io/replicatedjob-name=ps")).is_some());
    }

    #[test]
    fn one_type_that_matches_is_enough() {
        let pods = PodLabels::of("Job", "t", None, labels(&[("role", "ps")]));
        let args = vec![
            "--job=worker=role=worker".to_string(),
            "--job=ps=role=ps".to_string(),
        ];
        assert_eq!(unmatched(&pods, &args), None);
        assert!(unmatched(&pods, &args[..1]).is_some());
        // Each requirement kind, certainly false.
        for sel in [
            "role!=ps",
            "role notin (ps)",
            "!role",
            "missing",
            "role in (a)",
        ] {
            assert!(unmatched(&pods, &job(sel)).is_some(), "{sel}");
        }
    }
}
