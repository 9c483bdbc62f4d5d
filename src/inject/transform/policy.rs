//! `--failure-policy`: trainlet's podFailurePolicy rules, merged after the user's own.

use super::template::name_of;
use super::{Ctx, INIT_CONTAINER, Node, SIDECAR, TransformError, descend};
use crate::flags;

impl Ctx<'_> {
    /// `--failure-policy`: the Job fails at once on a permanent exit code of
    /// trainlet-init or of the training container, ignores disruptions, and counts the
    /// rest against backoffLimit (`crate::exit::INIT_PERMANENT`, `CMD_PERMANENT`).
    pub(super) fn failure_policy(
        &mut self,
        job_spec: &mut Node,
        what: &str,
    ) -> Result<(), TransformError> {
        let Some(pod) = descend(job_spec, &["template", "spec"]) else {
            return Err(self.shape(what, "spec.template.spec is not a mapping"));
        };
        let training = self
            .cfg
            .wrap
            .clone()
            .or_else(|| match pod.get("containers") {
                Some(Node::Seq(cs)) => cs
                    .iter()
                    .filter_map(name_of)
                    .find(|n| *n != SIDECAR)
                    .map(str::to_string),
                _ => None,
            });
        let Some(training) = training else {
            return Err(self.shape(
                what,
                format!(
                    "--{}: the pod template has no container",
                    flags::FAILURE_POLICY
                ),
            ));
        };
        match pod.get("restartPolicy").and_then(Node::as_str) {
            Some("Never") => {}
            other => {
                self.note(
                    what.to_string(),
                    format!(
                        "restartPolicy {} -> Never, which podFailurePolicy requires: a failed pod is replaced by a new pod (with a new IP)",
                        other.unwrap_or("Always")
                    ),
                );
                pod.set("restartPolicy", Node::str("Never"));
            }
        }
        let ours = pod_failure_policy(&training);
        let Some(Node::Seq(our_rules)) = ours.get("rules").cloned() else {
            unreachable!("pod_failure_policy has rules")
        };
        let user_rules: Vec<Node> = match job_spec.get("podFailurePolicy") {
            None => Vec::new(),
            Some(p) => match p.get("rules") {
                Some(Node::Seq(rules)) => rules
                    .iter()
                    .filter(|r| !our_rules.contains(r))
                    .cloned()
                    .collect(),
                _ => {
                    return Err(self.shape(what, "spec.podFailurePolicy.rules is not a list"));
                }
            },
        };
        // The user's rules first: Kubernetes applies the first rule that matches, so
        // what they decided for an exit code stands; trainlet's follow for the rest.
        let merged: Vec<Node> = user_rules.iter().cloned().chain(our_rules).collect();
        if merged.len() > MAX_FAILURE_RULES {
            return Err(self.shape(
                what,
                format!(
                    "--{}: with trainlet's 3 rules after its {} own, spec.podFailurePolicy would have {} rules, more than the {MAX_FAILURE_RULES} Kubernetes allows",
                    flags::FAILURE_POLICY,
                    user_rules.len(),
                    merged.len()
                ),
            ));
        }
        let mut policy = job_spec.get("podFailurePolicy").cloned().unwrap_or(ours);
        let unchanged = policy.get("rules") == Some(&Node::Seq(merged.clone()));
        policy.set("rules", Node::Seq(merged));
        if !user_rules.is_empty() && !unchanged {
            self.note(
                what.to_string(),
                format!(
                    "--{} keeps the {} podFailurePolicy rule{} it had first (the first rule that matches applies) and adds trainlet's after {}",
                    flags::FAILURE_POLICY,
                    user_rules.len(),
                    if user_rules.len() == 1 { "" } else { "s" },
                    if user_rules.len() == 1 { "it" } else { "them" }
                ),
            );
        }
        job_spec.set("podFailurePolicy", policy);
        Ok(())
    }
}

/// The most rules a Job's podFailurePolicy may have (`maxPodFailurePolicyRules` in
/// k8s.io/kubernetes `pkg/apis/batch/validation`).
pub(super) const MAX_FAILURE_RULES: usize = 20;

/// The rules of `--failure-policy`, from `crate::exit`'s permanent codes.
pub(super) fn pod_failure_policy(training: &str) -> Node {
    let codes = |v: &[i32]| Node::seq(v.iter().map(|c| Node::int(i64::from(*c))));
    let fail_on = |container: &str, values: &[i32]| {
        Node::map([
            ("action", Node::str("FailJob")),
            (
                "onExitCodes",
                Node::map([
                    ("containerName", Node::str(container)),
                    ("operator", Node::str("In")),
                    ("values", codes(values)),
                ]),
            ),
        ])
    };
    Node::map([(
        "rules",
        Node::seq([
            // Preemption, eviction by a drain or a taint: not the job's fault.
            Node::map([
                ("action", Node::str("Ignore")),
                (
                    "onPodConditions",
                    Node::seq([Node::map([
                        ("type", Node::str("DisruptionTarget")),
                        ("status", Node::str("True")),
                    ])]),
                ),
            ]),
            fail_on(INIT_CONTAINER, &crate::exit::INIT_PERMANENT),
            fail_on(training, &crate::exit::CMD_PERMANENT),
        ]),
    )])
}
