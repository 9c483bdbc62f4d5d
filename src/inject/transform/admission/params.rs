//! The policy's parameter object: the image and resources of trainlet's containers, in
//! a ConfigMap ([`NAME`] in [`PARAMS_NAMESPACE`]) that the MutatingAdmissionPolicy
//! reads through its binding's `paramRef`, so that a cluster admin changes the image
//! in one field (`kubectl edit`, a kustomize patch, a Helm value) instead of
//! generating the policy again. `trainlet inject --admission-policy` prints it with
//! the values of `--image` and `--resources`.
//!
//! A parameter object that is missing or bad refuses nothing and injects nothing: the
//! binding's `parameterNotFoundAction: Allow` skips the policy without one, and the
//! policy's match conditions skip it with a bad one (an evaluation error would refuse
//! the pod, `failurePolicy: Fail`). The ValidatingAdmissionPolicy [`PARAMS_CHECK`]
//! then warns whoever created the pod (kubectl prints it; the audit log keeps it):
//! the pod opted in with valid settings and came out without trainlet.

use super::super::Resources;
use super::cel::{RAW, cel_string};
use super::settings::{NAME, PARAM_CPU, PARAM_IMAGE, PARAM_MEMORY, PARAMS_CHECK, PARAMS_NAMESPACE};
use super::validate::injected;
use super::{InjectConfig, LABEL};
use crate::inject::quantity;

/// The longest image reference the policy takes.
const MAX_IMAGE: usize = 1024;

/// The parameter object's data, or an empty map where it has none.
const DATA: &str = "(has(params.data) ? params.data : {})";

/// A key of the parameter object, or `""`.
fn param(key: &str) -> String {
    format!("{DATA}[?{}].orValue('')", cel_string(key))
}

/// `cfg` as the policy builds trainlet's containers from it: the image and resources
/// are the parameter object's (the policy's `image`, `cpu` and `memory` variables).
pub(super) fn parametrized(cfg: &InjectConfig) -> InjectConfig {
    let var = |name: &str| format!("{RAW}variables.{name}");
    InjectConfig {
        image: var(PARAM_IMAGE),
        resources: Resources {
            cpu: var(PARAM_CPU),
            memory: var(PARAM_MEMORY),
        },
        ..cfg.clone()
    }
}

/// The policy's variables that hold the parameters.
pub(super) fn variables() -> String {
    [PARAM_IMAGE, PARAM_CPU, PARAM_MEMORY]
        .iter()
        .map(|key| {
            format!(
                "    - name: {key}\n      expression: >-\n        {}\n",
                param(key)
            )
        })
        .collect()
}

/// CEL that holds when the parameter object is good: an image reference without
/// spaces, and the quantities that `inject --resources` takes (memory not in
/// millibytes).
pub(super) fn valid() -> String {
    let quantity = |key: &str| {
        let v = param(key);
        format!(
            "{v}.matches({}) && size({v}) <= {}",
            cel_string(quantity::PATTERN),
            quantity::MAX_LEN
        )
    };
    let image = param(PARAM_IMAGE);
    let memory = param(PARAM_MEMORY);
    format!(
        "{image}.matches('^[^\\\\s]+$') && size({image}) <= {MAX_IMAGE} && ({}) && ({}) && !{memory}.endsWith('m')",
        quantity(PARAM_CPU),
        quantity(PARAM_MEMORY),
    )
}

/// The binding's `paramRef`: the one parameter object, and no refusal without it.
pub(super) fn param_ref() -> String {
    format!(
        "  paramRef:
    name: {NAME}
    namespace: {PARAMS_NAMESPACE}
    parameterNotFoundAction: Allow
"
    )
}

/// The parameter object's namespace and the object, with `cfg`'s image and resources.
pub(super) fn object(cfg: &InjectConfig) -> String {
    format!(
        r#"# The policy's parameters: the image and resources of trainlet's containers. Change
# them here (one field; a kustomize patch or a Helm value reaches it), not in the
# policy. Missing or bad, the policy injects nothing and refuses nothing, and
# {PARAMS_CHECK} warns of each pod that opted in.
apiVersion: v1
kind: Namespace
metadata:
  name: {PARAMS_NAMESPACE}
  labels:
    app.kubernetes.io/name: trainlet
    pod-security.kubernetes.io/enforce: restricted
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {NAME}
  namespace: {PARAMS_NAMESPACE}
  labels:
    app.kubernetes.io/name: trainlet
data:
  {PARAM_IMAGE}: {image}
  {PARAM_CPU}: {cpu}
  {PARAM_MEMORY}: {memory}
"#,
        image = cel_string(&cfg.image),
        cpu = cel_string(&cfg.resources.cpu),
        memory = cel_string(&cfg.resources.memory),
    )
}

/// The ValidatingAdmissionPolicy that warns of a pod that opted in with valid
/// settings (`valid`, the mutating policy's condition) and came out without trainlet,
/// and its binding: warnings and audit annotations only, never a refusal.
pub(super) fn check(constraints: &str, valid: &str, metadata: &str) -> String {
    let label = cel_string(LABEL);
    let message = cel_string(&format!(
        "trainlet.io/inject: this pod was not injected: the MutatingAdmissionPolicy {NAME} needs its parameter object, the ConfigMap {PARAMS_NAMESPACE}/{NAME}, with a valid {PARAM_IMAGE}, {PARAM_CPU} and {PARAM_MEMORY} (kubectl get configmap -n {PARAMS_NAMESPACE} {NAME} -o yaml)"
    ));
    format!(
        r#"# Warns whoever creates a pod that opted in with valid settings and still has no
# trainlet (the parameter object {PARAMS_NAMESPACE}/{NAME} missing or bad): never
# refuses it.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
{metadata}spec:
  failurePolicy: Ignore
{constraints}  matchConditions:
    - name: opted-in
      expression: >-
        (has(object.metadata.labels) ? object.metadata.labels : {{}})[?{label}].orValue('') == 'true'
    - name: valid
      expression: >-
        {valid}
  validations:
    - expression: >-
        {injected}
      message: {message}
      reason: Invalid
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
{metadata}spec:
  policyName: {PARAMS_CHECK}
  validationActions: [Warn, Audit]
"#,
        injected = injected(),
    )
}
