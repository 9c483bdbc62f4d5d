//! How inject walks one YAML document to its pod templates: a workload's template
//! (Job, JobSet, Deployment, ...), a bare Pod, or a List of them; and the notes and
//! errors it gives on the way.

use super::{
    Ctx, Node, Note, TransformError, descend, describe, is_jobset, kind_name, selectors, service,
    template_path, workload_identity,
};

impl Ctx<'_> {
    /// Says where no `--job` selector can match the pods of `template` (of the
    /// workload `name`, a `kind`).
    fn check_selectors(
        &mut self,
        template: &Node,
        kind: &str,
        name: &str,
        rjob: Option<&str>,
        what: &str,
    ) {
        let own = match template.get("metadata").and_then(|m| m.get("labels")) {
            Some(Node::Map(entries)) => entries
                .iter()
                .filter_map(|(k, v)| Some((k.text.clone(), v.as_str()?.to_string())))
                .collect(),
            _ => Default::default(),
        };
        let labels = selectors::PodLabels::of(kind, name, rjob, own);
        if let Some(n) = selectors::unmatched(&labels, &self.cfg.init_args) {
            self.note(what.to_string(), n);
        }
    }

    pub(super) fn note(&mut self, what: String, text: impl Into<String>) {
        self.notes.push(Note {
            doc: self.doc,
            what,
            text: text.into(),
        });
    }

    pub(super) fn shape(&self, what: &str, why: impl Into<String>) -> TransformError {
        TransformError::Shape {
            doc: self.doc,
            what: what.to_string(),
            why: why.into(),
        }
    }

    pub(super) fn document(&mut self, node: &mut Node) -> Result<(), TransformError> {
        let what = describe(node);
        let (av, kind) = type_of(node);
        if kind == "List" || kind.ends_with("List") && node.get("items").is_some() {
            let Some(Node::Seq(items)) = node.get_mut("items") else {
                self.note(what, "no items; passed through unchanged");
                return Ok(());
            };
            let mut n = 0;
            for item in items.iter_mut() {
                n += usize::from(self.resource(item)?);
            }
            if n == 0 {
                self.note(
                    what,
                    "no pod template in its items; passed through unchanged",
                );
            }
            return Ok(());
        }
        if template_path(av, kind).is_none() && !is_jobset(av, kind) {
            if (av, kind) == ("v1", "Service") {
                self.services.saw_service(node);
            }
            self.note(what, "no pod template; passed through unchanged");
            return Ok(());
        }
        self.resource(node)?;
        Ok(())
    }

    /// Injects every replicated job's pod template of a JobSet.
    fn jobset(&mut self, node: &mut Node, what: String) -> Result<bool, TransformError> {
        let path = ["template", "spec", "template"];
        let owner = kind_name(node).1;
        self.identity = workload_identity(node);
        let Some(Node::Seq(rjobs)) = node
            .get_mut("spec")
            .and_then(|s| s.get_mut("replicatedJobs"))
        else {
            self.note(what, "has no spec.replicatedJobs; passed through unchanged");
            return Ok(false);
        };
        let mut changed = false;
        let mut found = false;
        for rjob in rjobs.iter_mut() {
            if descend(rjob, &path).is_none() {
                continue;
            }
            found = true;
            let before = rjob.clone();
            let rjob_name = rjob.get("name").and_then(Node::as_str).map(str::to_string);
            let template = descend(rjob, &path).expect("found above");
            self.pod_template(template, &what)?;
            self.check_selectors(template, "JobSet", &owner, rjob_name.as_deref(), &what);
            if self.cfg.failure_policy
                && let Some(job_spec) = descend(rjob, &["template", "spec"])
            {
                self.failure_policy(job_spec, &what)?;
            }
            changed |= *rjob != before;
        }
        if !found {
            self.note(
                what,
                "has no spec.replicatedJobs[*].template.spec.template; passed through unchanged",
            );
            return Ok(false);
        }
        self.note(
            what,
            if changed {
                "injected"
            } else {
                "already injected; unchanged"
            },
        );
        Ok(true)
    }

    /// Injects one resource; false (with a note) when it has no pod template.
    fn resource(&mut self, node: &mut Node) -> Result<bool, TransformError> {
        let what = describe(node);
        let (av, kind) = type_of(node);
        if is_jobset(av, kind) {
            return self.jobset(node, what);
        }
        let Some(path) = template_path(av, kind) else {
            if (av, kind) == ("v1", "Service") {
                self.services.saw_service(node);
            }
            self.note(what, "no pod template; passed through unchanged");
            return Ok(false);
        };
        let is_job = (av, kind) == ("batch/v1", "Job");
        let whole = node.clone();
        self.identity = workload_identity(&whole);
        let mut template = &mut *node;
        for key in path {
            match template.get_mut(key) {
                Some(t @ Node::Map(_)) => template = t,
                _ => {
                    self.note(
                        what,
                        format!("has no {}; passed through unchanged", path.join(".")),
                    );
                    return Ok(false);
                }
            }
        }
        self.pod_template(template, &what)?;
        let (kind, name) = kind_name(&whole);
        self.check_selectors(template, &kind, &name, None, &what);
        if service::dns(&self.cfg.init_args)
            && let Some(n) = self.services.saw_workload(&whole, template, &what)
        {
            self.note(what.clone(), n);
        }
        if self.cfg.failure_policy
            && is_job
            && let Some(job_spec) = descend(node, &["spec"])
        {
            self.failure_policy(job_spec, &what)?;
        }
        self.note(
            what,
            if *node == whole {
                "already injected; unchanged"
            } else {
                "injected"
            },
        );
        Ok(true)
    }
}

/// A document's apiVersion and kind, or empty strings.
fn type_of(node: &Node) -> (&str, &str) {
    let get = |key: &str| node.get(key).and_then(Node::as_str).unwrap_or_default();
    (get("apiVersion"), get("kind"))
}
