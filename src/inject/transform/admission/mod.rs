//! The MutatingAdmissionPolicy that does at a pod's creation what `inject` does to its
//! template, for the Jobs that never pass through `inject` (charts, Kueue, Argo,
//! notebooks): a pod labelled `trainlet.io/inject: "true"` gets trainlet's init
//! container, sidecar, volumes, ServiceAccount and wrapped command, with the settings
//! its `trainlet.io/<flag>` annotations give. No webhook, no server, no certificate:
//! CEL in the API server (Kubernetes 1.36+, or 1.34-1.35 with the
//! `MutatingAdmissionPolicy` gate).
//!
//! One source of truth: every object the policy adds is built here by the very
//! functions that build `inject`'s ([`super::parts`]) and turned into typed CEL
//! literals; only the arguments, which come from the pod's annotations, are CEL
//! expressions, built from the table of settings the CLI layer hands over (the flags
//! `inject` writes, in its order, with their defaults). The integration test
//! `tests/it/admission.rs` proves that the API server's result and `inject`'s are the
//! same pod.
//!
//! What the policy does beyond `inject`: the API server's ServiceAccount admission has
//! already mounted the default token (`kube-api-access-*`) into every container when the
//! policy runs; the policy removes it, as `automountServiceAccountToken: false` would
//! have kept it out. A ValidatingAdmissionPolicy next to it rejects a pod that opts in
//! with settings missing or bad, naming the annotation.

use serde_json::Value;

use super::parts::{
    downward_env, exec_env, init_container, mount, mount_of, observed_volume, scrape_annotations,
    sidecar, token_volume, volume,
};
use crate::inject::yaml::to_json;

mod cel;
mod settings;
mod validate;

use super::{INIT_CONTAINER, InjectConfig, OBSERVED_VOLUME, SIDECAR};
use crate::flags;
pub use cel::cel;
use cel::{cel_string, raw};
use settings::annotation;
pub use settings::{LABEL, NAME, PREFIX, Setting, Settings, WRAP};
use validate::{valid_expression, validations};

/// The CEL list of arguments that `settings` give.
fn args(settings: &[Setting]) -> String {
    let parts: Vec<String> = settings
        .iter()
        .map(|s| match s {
            Setting::Value { flag, default, .. } => {
                let value = annotation(flag);
                let skip = match default {
                    Some(d) => format!("{value} == '' || {value} == {}", cel_string(d)),
                    None => format!("{value} == ''"),
                };
                format!("({skip} ? [] : ['--{flag}=' + {value}])")
            }
            Setting::Switch { flag } => {
                format!("({} == 'true' ? ['--{flag}'] : [])", annotation(flag))
            }
            Setting::Each { flag, .. } => format!(
                "{}.split(';').map(s, s.trim()).filter(s, s != '').map(s, '--{flag}=' + s)",
                annotation(flag)
            ),
            Setting::Fixed(arg) => format!("[{}]", cel_string(arg)),
        })
        .collect();
    if parts.is_empty() {
        "[]".to_string()
    } else {
        parts.join(" + ")
    }
}

/// `cfg` with a container to wrap or none: what trainlet's own containers mount
/// depends on it.
fn shape(cfg: &InjectConfig, wrapped: bool) -> InjectConfig {
    let mut c = cfg.clone();
    c.wrap = wrapped.then(|| "wrapped".to_string());
    c
}

/// One trainlet container (JSON) with `args` replaced by the CEL expression `expr`.
fn with_args(mut c: Value, expr: &str) -> Value {
    if let Value::Object(m) = &mut c {
        let args = raw(expr);
        // `args` right after `command`, where inject puts it.
        let mut out = serde_json::Map::new();
        for (k, v) in std::mem::take(m) {
            let after_command = k == "command";
            if k != "args" {
                out.insert(k, v);
            }
            if after_command {
                out.insert("args".into(), args.clone());
            }
        }
        *m = out;
    }
    c
}

/// JSON patches that append `items` (a CEL list) to the list `field` at `path` (CEL
/// strings), creating it where it is absent. Items are added one by one: the API
/// server cannot turn the pod's own items back into JSON when a list of them is
/// patched whole (the Job controller's `JOB_COMPLETION_INDEX` env var, say).
fn append(field: &str, path: &str, items: &str) -> String {
    format!(
        "(has({field}) ? ({items}).map(x, JSONPatch{{op: \"add\", path: {path} + \"/-\", value: x}}) : [JSONPatch{{op: \"add\", path: {path}, value: {items}}}])"
    )
}

/// JSON patches that remove the default token's mount (`kube-api-access-*`, which the
/// ServiceAccount admission added) from `container` at `path`.
fn unmount(container: &str, path: &str) -> String {
    format!(
        "(has({container}.volumeMounts) ? {container}.volumeMounts.map(m, m.name).filter(n, n.startsWith('kube-api-access-')).map(n, JSONPatch{{op: \"remove\", path: {path} + \"/volumeMounts/\" + string({container}.volumeMounts.map(m, m.name).indexOf(n))}}) : [])"
    )
}

/// The MutatingAdmissionPolicy, its binding, the ValidatingAdmissionPolicy and its
/// binding, as YAML (`manifests/admission/`).
pub fn policy_yaml(cfg: &InjectConfig, settings: &Settings) -> String {
    let containers_ty = "Object.spec.containers";
    let inits_ty = "Object.spec.initContainers";
    let volumes_ty = "Object.spec.volumes";
    let c = |wrapped: bool| shape(cfg, wrapped);
    let init =
        |wrapped: bool| with_args(to_json(&init_container(&c(wrapped))), "variables.initArgs");
    let side = |wrapped: bool| with_args(to_json(&sidecar(&c(wrapped))), "variables.sidecarArgs");
    let trainlet_inits = format!(
        "(variables.wrap != '' ? [{}, {}] : [{}, {}])",
        cel(&init(true), inits_ty),
        cel(&side(true), inits_ty),
        cel(&init(false), inits_ty),
        cel(&side(false), inits_ty),
    );
    let vols = |wrapped: bool| {
        let mut v = vec![to_json(&volume())];
        if wrapped {
            v.push(to_json(&observed_volume()));
        }
        v.push(to_json(&token_volume()));
        cel(&Value::Array(v), volumes_ty)
    };
    let trainlet_volumes = format!("(variables.wrap != '' ? {} : {})", vols(true), vols(false));
    let own_mount = cel(
        &Value::Array(vec![to_json(&mount(&cfg.output_dir, true))]),
        &format!("{containers_ty}.volumeMounts"),
    );
    let observed_mount = cel(
        &Value::Array(vec![to_json(&mount_of(
            OBSERVED_VOLUME,
            &cfg.observations_dir,
            false,
        ))]),
        &format!("{containers_ty}.volumeMounts"),
    );
    let own_env: Vec<Value> = exec_env(cfg).iter().map(to_json).collect();
    let env_ty = format!("{containers_ty}.env");
    // The downward env where the container does not set that variable itself.
    let downward = downward_env()
        .iter()
        .map(to_json)
        .map(|e| {
            format!(
                "((has(object.spec.containers[i].env) ? object.spec.containers[i].env : []).exists(e, e.name == {}) ? [] : [{}])",
                cel_string(e["name"].as_str().unwrap_or_default()),
                cel(&e, &env_ty)
            )
        })
        .collect::<Vec<_>>()
        .join(" + ");
    let wrapper = format!(
        "[{}, {}] + variables.execArgs + ['--']",
        cel_string(&format!("{}/trainlet", cfg.install_to)),
        cel_string(flags::EXEC),
    );
    let sa = cel_string(&cfg.service_account);
    let tf_port = settings.default_port;
    let port = annotation(flags::PORT);
    let framework = annotation(flags::FRAMEWORK);
    let observations = cel_string(&flags::with_value(
        flags::OBSERVATIONS,
        &cfg.observations_dir,
    ));
    let wrap_key = cel_string(&format!("{PREFIX}{WRAP}"));
    let label = cel_string(LABEL);
    let (init_name, sidecar_name) = (cel_string(INIT_CONTAINER), cel_string(SIDECAR));
    let init_args = args(&settings.init);
    let exec_args = format!("['--{}'] + {}", flags::REPORT, args(&settings.exec));
    let unmount_init = unmount(
        "object.spec.initContainers[i]",
        "\"/spec/initContainers/\" + string(i)",
    );
    let unmount = unmount(
        "object.spec.containers[i]",
        "\"/spec/containers/\" + string(i)",
    );
    let container = "object.spec.containers[i]";
    let at = "\"/spec/containers/\" + string(i)";
    let append_mounts = append(
        &format!("{container}.volumeMounts"),
        &format!("{at} + \"/volumeMounts\""),
        &format!("{own_mount} + (variables.names[i] == variables.wrap ? {observed_mount} : [])"),
    );
    let append_env = append(
        &format!("{container}.env"),
        &format!("{at} + \"/env\""),
        &format!("{downward} + {}", cel(&Value::Array(own_env), &env_ty)),
    );
    let scrape = scrape_annotations(cfg)
    .iter()
    .map(|(k, v)| {
        format!(
            "JSONPatch{{op: \"add\", path: \"/metadata/annotations/\" + jsonpatch.escapeKey({}), value: {}}}",
            cel_string(k),
            cel_string(v)
        )
    })
    .collect::<Vec<_>>()
    .join(",\n            ");
    let validations = validations(settings);
    // What both policies match: pods at creation that opt in.
    let opted_in = format!(
        r#"  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
  matchConditions:
    - name: opted-in
      expression: >-
        has(object.metadata.labels) && object.metadata.labels[?{label}].orValue('') == 'true'
"#
    );
    // The variables both policies read the settings with.
    let settings_vars = format!(
        r#"  variables:
    - name: a
      expression: >-
        has(object.metadata.annotations) ? object.metadata.annotations : {{}}
    - name: wrap
      expression: >-
        variables.a[?{wrap_key}].orValue('')
"#
    );
    format!(
        r#"# Generated by `trainlet inject --admission-policy`: edit the flags, not this file.
#
# Adds trainlet to every pod created with the label {LABEL}: "true", as
# `trainlet inject` adds it to a pod template, with the settings in the pod's
# {PREFIX}<flag> annotations (docs/admission.md). Needs Kubernetes 1.36 or later
# (admissionregistration.k8s.io/v1), or 1.34-1.35 with the MutatingAdmissionPolicy
# feature gate and --runtime-config=admissionregistration.k8s.io/v1beta1=true (and
# apiVersion v1beta1 below). The ServiceAccount, Role and RoleBinding of
# manifests/rbac.yaml must exist in the pods' namespace.
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata:
  name: {NAME}
  labels:
    app.kubernetes.io/name: trainlet
spec:
  failurePolicy: Fail
  reinvocationPolicy: Never
{opted_in}    # Already injected (by `trainlet inject`, or an earlier pass): left as it is.
    - name: not-injected
      expression: >-
        !has(object.spec.initContainers) ||
        !object.spec.initContainers.exists(c, c.name == {init_name} || c.name == {sidecar_name})
    # Settings that the ValidatingAdmissionPolicy {NAME} rejects with a message: not
    # mutated, so that its message is what the user sees.
    - name: valid
      expression: >-
        {valid}
{settings_vars}    - name: names
      expression: >-
        object.spec.containers.map(c, c.name)
    - name: initArgs
      expression: >-
        {init_args}
    - name: sidecarArgs
      expression: >-
        ({port} != '' ? ['--port=' + {port}] :
          {framework}.split(',').all(f, f.trim() == '' || f.trim() == 'tensorflow') ? ['--port={tf_port}'] : []) +
        (variables.wrap != '' ? [{observations}] : [])
    - name: execArgs
      expression: >-
        {exec_args}
  mutations:
    # Scrape annotations, trainlet's ServiceAccount, and no token mounted by default.
    - patchType: JSONPatch
      jsonPatch:
        expression: |
          (has(object.metadata.annotations) ? [] :
            [JSONPatch{{op: "add", path: "/metadata/annotations", value: {{}}}}]) +
          [
            {scrape},
            JSONPatch{{op: "add", path: "/spec/automountServiceAccountToken", value: false}}
          ] +
          (!has(object.spec.serviceAccountName) || object.spec.serviceAccountName in ['', 'default'] ?
            [JSONPatch{{op: "add", path: "/spec/serviceAccountName", value: {sa}}},
             JSONPatch{{op: "add", path: "/spec/serviceAccount", value: {sa}}}] : [])
    # The default token's mount out of the user's init containers, before trainlet's
    # go first.
    - patchType: JSONPatch
      jsonPatch:
        expression: |
          !has(object.spec.initContainers) ? [] :
          object.spec.initContainers.map(c, c.name).map(n, object.spec.initContainers.map(c, c.name).indexOf(n)).map(i,
            {unmount_init}).flatten()
    # trainlet-init and the sidecar first, then the user's init containers.
    - patchType: JSONPatch
      jsonPatch:
        expression: |
          !has(object.spec.initContainers) ?
            [JSONPatch{{op: "add", path: "/spec/initContainers", value: {trainlet_inits}}}] :
            [JSONPatch{{op: "add", path: "/spec/initContainers/0", value: ({trainlet_inits})[1]}},
             JSONPatch{{op: "add", path: "/spec/initContainers/0", value: ({trainlet_inits})[0]}}]
    # The volumes: trainlet's, and not the default token's.
    - patchType: JSONPatch
      jsonPatch:
        expression: |
          !has(object.spec.volumes) ?
            [JSONPatch{{op: "add", path: "/spec/volumes", value: {trainlet_volumes}}}] :
            object.spec.volumes.map(v, v.name).filter(n, n.startsWith('kube-api-access-')).map(n,
              JSONPatch{{op: "remove", path: "/spec/volumes/" + string(object.spec.volumes.map(v, v.name).indexOf(n))}}) +
            ({trainlet_volumes}).map(v, JSONPatch{{op: "add", path: "/spec/volumes/-", value: v}})
    # Every container mounts trainlet's files read-only and not the default token; the
    # one that {PREFIX}{WRAP} names runs its command under `trainlet exec`.
    - patchType: JSONPatch
      jsonPatch:
        expression: |
          variables.names.map(n, variables.names.indexOf(n)).map(i,
            {unmount} +
            {append_mounts}).flatten() +
          variables.names.map(n, variables.names.indexOf(n)).filter(i, variables.names[i] == variables.wrap).map(i,
            [JSONPatch{{op: "add", path: "/spec/containers/" + string(i) + "/command",
               value: {wrapper} + object.spec.containers[i].command}}] +
            {append_env}).flatten()
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata:
  name: {NAME}
  labels:
    app.kubernetes.io/name: trainlet
spec:
  policyName: {NAME}
---
# Rejects a pod that opts in with settings missing or bad, naming the annotation: a
# pod started broken would fail in its init container instead, once per pod of the
# job.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {NAME}
  labels:
    app.kubernetes.io/name: trainlet
spec:
  failurePolicy: Fail
{opted_in}{settings_vars}{validations}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {NAME}
  labels:
    app.kubernetes.io/name: trainlet
spec:
  policyName: {NAME}
  validationActions: [Deny]
"#,
        valid = valid_expression(settings),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::cel::RAW;
    use super::validate::hint;
    use super::*;

    #[test]
    fn objects_become_typed_literals_and_maps_stay_maps() {
        let v = json!({
            "name": "trainlet-init",
            "args": format!("{RAW}variables.initArgs"),
            "resources": {"limits": {"cpu": "50m"}},
            "securityContext": {"capabilities": {"drop": ["ALL"]}, "runAsUser": 65532},
            "env": [{"name": "A", "value": "say \"hi\"\n"}],
        });
        assert_eq!(
            cel(&v, "Object.spec.initContainers"),
            "Object.spec.initContainers{name: \"trainlet-init\", args: variables.initArgs, \
             resources: Object.spec.initContainers.resources{limits: {\"cpu\": \"50m\"}}, \
             securityContext: Object.spec.initContainers.securityContext{capabilities: \
             Object.spec.initContainers.securityContext.capabilities{drop: [\"ALL\"]}, runAsUser: 65532}, \
             env: [Object.spec.initContainers.env{name: \"A\", value: \"say \\\"hi\\\"\\n\"}]}"
        );
    }

    #[test]
    fn each_setting_becomes_its_flag_unless_absent_or_the_default() {
        let settings = [
            Setting::Each {
                flag: "job",
                pattern: ".",
            },
            Setting::Value {
                flag: "order",
                default: Some("index".into()),
                pattern: ".",
            },
            Setting::Fixed("--install-to=/etc/trainlet/bin".into()),
            Setting::Switch { flag: "preflight" },
        ];
        let a = |f: &str| format!("variables.a[?\"trainlet.io/{f}\"].orValue('')");
        assert_eq!(
            args(&settings),
            format!(
                "{}.split(';').map(s, s.trim()).filter(s, s != '').map(s, '--job=' + s) + \
                 ({o} == '' || {o} == \"index\" ? [] : ['--order=' + {o}]) + \
                 [\"--install-to=/etc/trainlet/bin\"] + \
                 ({} == 'true' ? ['--preflight'] : [])",
                a("job"),
                a("preflight"),
                o = a("order"),
            )
        );
        assert_eq!(args(&[]), "[]");
    }

    #[test]
    fn a_hint_lists_the_choices_of_an_enumeration() {
        assert_eq!(
            hint("on-stall", "^(report|restart|exit)$"),
            "give one of report, restart, exit"
        );
        assert_eq!(
            hint("expect", "^[A-Za-z0-9_.-]+=[0-9]+$"),
            "give a value as --expect takes it (`trainlet inject --help`)"
        );
    }

    /// Match conditions cannot read `variables`: the validity check spells them out.
    #[test]
    fn the_match_condition_reads_no_variables() {
        let settings = Settings {
            init: vec![Setting::Switch { flag: "preflight" }],
            exec: vec![Setting::Value {
                flag: "stall-after",
                default: None,
                pattern: "^.+$",
            }],
            required: vec!["job"],
            default_port: 8470,
        };
        let e = valid_expression(&settings);
        assert!(!e.contains("variables."), "{e}");
        assert!(e.contains("trainlet.io/stall-after"), "{e}");
    }
}
