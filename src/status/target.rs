//! What `trainlet status` reads first: the Job or JobSet itself, and how to say it is
//! missing.

use serde_json::Value;

use super::text::cell;

/// A Job's pods carry this label (set by the Job controller).
pub const JOB_LABEL: &str = "batch.kubernetes.io/job-name";
/// A JobSet's pods carry this label.
pub const JOBSET_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";

/// Which pods make the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Job's pods, by the label its controller sets.
    Job(String),
    /// A JobSet's pods.
    JobSet(String),
    /// A Job's pods, or where none match, a JobSet's.
    Either(String),
    /// The pods of any of these selectors.
    Selectors(Vec<String>),
}

/// What a job's name can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Job,
    JobSet,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Job => "Job",
            Kind::JobSet => "JobSet",
        }
    }

    /// The selector of the pods of the `Kind` named `name`, by the label its controller
    /// sets.
    pub fn selector(self, name: &str) -> String {
        match self {
            Kind::Job => format!("{}={name}", JOB_LABEL),
            Kind::JobSet => format!("{}={name}", JOBSET_LABEL),
        }
    }
}

/// How `status` finds the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Get the object `name` as each kind in turn: the first that exists is the job,
    /// and its pods are the ones its controller labels.
    Named { name: String, kinds: Vec<Kind> },
    /// No object: the pods of these selectors, named so in the verdict.
    Pods {
        what: String,
        selectors: Vec<String>,
    },
}

impl Target {
    pub fn lookup(&self) -> Lookup {
        let named = |name: &str, kinds: Vec<Kind>| Lookup::Named {
            name: name.to_string(),
            kinds,
        };
        match self {
            Target::Job(n) => named(n, vec![Kind::Job]),
            Target::JobSet(n) => named(n, vec![Kind::JobSet]),
            Target::Either(n) => named(n, vec![Kind::Job, Kind::JobSet]),
            Target::Selectors(s) => Lookup::Pods {
                what: cell(&format!("pods of {}", s.join("; "))),
                selectors: s.clone(),
            },
        }
    }
}

/// The one line of a named job that does not exist: `no Job or JobSet "mnist" in
/// namespace "ml"`, and what to check.
pub fn not_found(name: &str, kinds: &[Kind], namespace: &str) -> String {
    let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    format!(
        "no {} {name:?} in namespace {namespace:?}: check the name and --{}",
        kinds.join(" or "),
        crate::flags::NAMESPACE
    )
}

/// What the Job or JobSet object says about the whole job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    /// `Job mnist`, `JobSet mnist`.
    pub what: String,
    /// `spec.suspend`: Kueue creates Jobs and JobSets suspended and resumes them when it
    /// admits them; until then no pod exists.
    pub suspended: bool,
    /// The Kueue queue it waits in (its `kueue.x-k8s.io/queue-name` label).
    pub queue: String,
    /// A `Complete` (Job) or `Completed` (JobSet) condition that is True.
    pub complete: bool,
    /// A `Failed` condition that is True: its reason and message.
    pub failed: Option<String>,
}

impl Owner {
    /// The object of `kind`, as the API server returned it (JSON).
    pub fn of(kind: Kind, obj: &Value) -> Owner {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let condition = |types: &[&str]| {
            obj["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| {
                    c["status"] == "True" && types.iter().any(|t| c["type"].as_str() == Some(t))
                })
        };
        let failed = condition(&["Failed"]).map(|c| {
            let reason = c["reason"].as_str().unwrap_or("Failed");
            match c["message"].as_str().filter(|m| !m.is_empty()) {
                Some(m) => cell(&format!("{reason}: {m}")),
                None => cell(reason),
            }
        });
        Owner {
            what: format!("{} {}", kind.as_str(), cell(name)),
            suspended: obj["spec"]["suspend"] == true,
            queue: cell(
                obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
                    .as_str()
                    .unwrap_or_default(),
            ),
            complete: condition(&["Complete", "Completed"]).is_some(),
            failed,
        }
    }
}
