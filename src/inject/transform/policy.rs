//! `--failure-policy`: trainlet's podFailurePolicy rules, merged after the user's own.

use super::parts::name_of;
use super::{Ctx, INIT_CONTAINER, Node, SIDECAR, TransformError, descend};
use crate::flags;

impl Ctx<'_> {
    /// `--failure-policy`: the Job fails at once on a permanent exit code of
    /// trainlet-init or of the training container, ignores disruptions, and counts the
    /// rest against backoffLimit (`crate::exit::INIT_PERMANENT`, `CMD_PERMANENT` or
    /// `--permanent-exit-codes`; see [`permanent_codes`]).
    pub(super) fn failure_policy(
        &mut self,
        job_spec: &mut Node,
        what: &str,
    ) -> Result<(), TransformError> {
        let Some(pod) = descend(job_spec, &["template", "spec"]) else {
            return Err(self.shape(what, "spec.template.spec is not a mapping"));
        };
        let training = self.training_container(pod, what)?;
        self.never_restart(pod, what);
        let codes = self.codes(pod, what, &training);
        let ours = pod_failure_policy(&training, &codes);
        let Some(Node::Seq(our_rules)) = ours.get("rules").cloned() else {
            unreachable!("pod_failure_policy has rules")
        };
        let user_rules = self.user_rules(job_spec, what, &training, &our_rules)?;
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

    /// The container whose exit codes the rules read: the one `--wrap` names, or the
    /// template's first that is not trainlet's.
    fn training_container(&self, pod: &Node, what: &str) -> Result<String, TransformError> {
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
        training.ok_or_else(|| {
            self.shape(
                what,
                format!(
                    "--{}: the pod template has no container",
                    flags::FAILURE_POLICY
                ),
            )
        })
    }

    /// `restartPolicy: Never`, which podFailurePolicy requires, with a note where it was
    /// not.
    fn never_restart(&mut self, pod: &mut Node, what: &str) {
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
    }

    /// The exit codes that fail the Job: `--permanent-exit-codes`, or trainlet's, less
    /// 1 where the container runs a launcher itself (a note says so).
    fn codes(&mut self, pod: &Node, what: &str, training: &str) -> Vec<i32> {
        // The command of a container that runs a launcher itself; one that --wrap names
        // runs under `trainlet exec`, which tells the launcher's exits apart.
        let argv = match (&self.cfg.wrap, pod.get("containers")) {
            (None, Some(Node::Seq(cs))) => cs
                .iter()
                .find(|c| name_of(c) == Some(training))
                .map(argv_of),
            _ => None,
        };
        let codes = permanent_codes(self.cfg.permanent_exit_codes.as_deref(), argv.as_deref());
        if self.cfg.permanent_exit_codes.is_none() && codes != crate::exit::CMD_PERMANENT {
            self.note(
                what.to_string(),
                format!(
                    "--{}: container {training:?} runs {}, a launcher that exits 1 for any worker's failure, transient ones too: its exit 1 is counted, not permanent (--wrap {training} tells them apart)",
                    flags::FAILURE_POLICY,
                    argv.as_deref().and_then(<[String]>::first).map_or("", String::as_str)
                ),
            );
        }
        codes
    }

    /// The Job's own podFailurePolicy rules, less trainlet's: this inject's, and those
    /// an inject before `--permanent-exit-codes` wrote with its default codes.
    fn user_rules(
        &self,
        job_spec: &Node,
        what: &str,
        training: &str,
        our_rules: &[Node],
    ) -> Result<Vec<Node>, TransformError> {
        let default_rules: Vec<Node> = [None, Some(LAUNCHER_PROBE)]
            .into_iter()
            .map(|probe| {
                let argv = probe.map(|p| vec![p.to_string()]);
                pod_failure_policy(training, &permanent_codes(None, argv.as_deref()))
            })
            .filter_map(|p| match p.get("rules") {
                Some(Node::Seq(rules)) => Some(rules.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        match job_spec.get("podFailurePolicy") {
            None => Ok(Vec::new()),
            Some(p) => match p.get("rules") {
                Some(Node::Seq(rules)) => Ok(rules
                    .iter()
                    .filter(|r| !our_rules.contains(r) && !default_rules.contains(r))
                    .cloned()
                    .collect()),
                _ => Err(self.shape(what, "spec.podFailurePolicy.rules is not a list")),
            },
        }
    }
}

/// The most rules a Job's podFailurePolicy may have (`maxPodFailurePolicyRules` in
/// k8s.io/kubernetes `pkg/apis/batch/validation`).
pub(super) const MAX_FAILURE_RULES: usize = 20;

/// A container's command line: its `command`, then its `args`.
fn argv_of(container: &Node) -> Vec<String> {
    ["command", "args"]
        .iter()
        .filter_map(|k| match container.get(k) {
            Some(Node::Seq(items)) => Some(items),
            _ => None,
        })
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// The training container's permanent codes: the user's (`--permanent-exit-codes`),
/// else `crate::exit::CMD_PERMANENT`, without 1 when the container runs a launcher
/// itself (`argv`, not under `trainlet exec`, which tells a launcher's exit 1 apart).
pub(super) fn permanent_codes(explicit: Option<&[i32]>, argv: Option<&[String]>) -> Vec<i32> {
    if let Some(codes) = explicit {
        return codes.to_vec();
    }
    let launcher = argv
        .and_then(crate::supervise::launcher::launcher)
        .is_some();
    crate::exit::CMD_PERMANENT
        .iter()
        .copied()
        .filter(|c| !(launcher && *c == 1))
        .collect()
}

/// A command line that is a launcher, for the rules an earlier inject wrote for one.
const LAUNCHER_PROBE: &str = "torchrun";

/// The rules of `--failure-policy`: trainlet-init's permanent codes
/// (`crate::exit::INIT_PERMANENT`) and the training container's `codes`.
pub(super) fn pod_failure_policy(training: &str, codes: &[i32]) -> Node {
    let seq = |v: &[i32]| Node::seq(v.iter().map(|c| Node::int(i64::from(*c))));
    let fail_on = |container: &str, values: &[i32]| {
        Node::map([
            ("action", Node::str("FailJob")),
            (
                "onExitCodes",
                Node::map([
                    ("containerName", Node::str(container)),
                    ("operator", Node::str("In")),
                    ("values", seq(values)),
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
            fail_on(training, codes),
        ]),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_launchers_exit_1_is_not_permanent_unless_the_user_says_so() {
        assert_eq!(permanent_codes(None, None), [1, 2, 126, 127, 128, 139]);
        let python = argv("python train.py");
        assert_eq!(
            permanent_codes(None, Some(&python)),
            [1, 2, 126, 127, 128, 139]
        );
        let torchrun = argv("torchrun --nproc-per-node 8 train.py");
        assert_eq!(
            permanent_codes(None, Some(&torchrun)),
            [2, 126, 127, 128, 139]
        );
        // Under trainlet exec, which maps a launcher's transient exit 1 to 9.
        let wrapped = argv("/etc/trainlet/bin/trainlet exec --report -- torchrun train.py");
        assert_eq!(
            permanent_codes(None, Some(&wrapped)),
            [1, 2, 126, 127, 128, 139]
        );
        assert_eq!(permanent_codes(Some(&[1, 42]), Some(&torchrun)), [1, 42]);
    }
}
