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

use super::own::alias_env;
use super::parts::{
    downward_env, exec_env, init_container, mount, mount_of, observed_volume, token_volume, volume,
};
use super::wrapper::EXEC_ENV;
use crate::inject::yaml::to_json;

mod cel;
mod document;
mod host;
mod params;
mod rule;
mod settings;
mod validate;

use super::{DEFAULT_TOKEN_PREFIX, EXEC_FLAGS, InjectConfig, OBSERVED_VOLUME, launcher};
use crate::flags;
pub use cel::cel;
use cel::cel_string;
use cel::raw;
pub use document::policy_yaml;
use host::{host_variables, policy_sidecar};
pub use rule::{MAX_ITEMS, MAX_JOB_LEN, MAX_LEN, Rule};
use settings::annotation;
pub use settings::{LABEL, NAME, PREFIX, Setting, Settings, WRAP};

/// The CEL value of a setting: its annotation; for `framework`, the annotation or,
/// where it is absent, what the wrapped command's launcher asks for
/// (`variables.framework`), as `inject` without `--framework` infers it; for
/// `master-port` and `metrics-addr`, the annotation or, on hostNetwork, the ports
/// chosen as inject chooses them ([`host_variables`]).
fn value(flag: &str) -> String {
    match flag {
        flags::FRAMEWORK => "variables.framework".to_string(),
        flags::MASTER_PORT => "variables.masterPort".to_string(),
        flags::METRICS_ADDR => "variables.metricsAddr".to_string(),
        _ => annotation(flag),
    }
}

/// The variables that read the wrapped container's command and args as
/// [`launcher::line`] does (past a `trainlet exec … --`, joined by spaces, its first
/// [`launcher::MAX_LINE`] characters), and the frameworks: the annotation's, or where
/// it is absent, those its launchers ask for ([`launcher::cel_value`]), as `inject`
/// infers them. After [`command_variables`], whose `cmd`, `isExec` and `original` they
/// read.
fn framework_variables() -> String {
    let joined = "((variables.isExec ? variables.original : variables.cmd) + \
object.spec.containers.filter(c, c.name == variables.wrap).map(c, has(c.args) ? c.args : [])[0]).join(' ')";
    let max = launcher::MAX_LINE;
    format!(
        r#"    - name: line
      expression: >-
        variables.wrap == '' ? '' :
        [{joined}].map(l, size(l) > {max} ? l.substring(0, {max}) : l)[0]
    - name: framework
      expression: >-
        {annotation} != '' ? {annotation} : variables.wrap == '' ? '' :
        {inferred}
"#,
        annotation = annotation(flags::FRAMEWORK),
        inferred = launcher::cel_value("variables.line", cel_string),
    )
}

/// The CEL list of arguments that `settings` give.
fn args(settings: &[Setting]) -> String {
    let parts: Vec<String> = settings
        .iter()
        .map(|s| match s {
            Setting::Value { flag, default, .. } => {
                let value = value(flag);
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

/// JSON patches that remove the items of `list` (CEL, present) at `path` (a CEL
/// string) for which `pred` (CEL over `x`) holds. A JSON patch applies its operations in
/// order, so each removal's index is the item's own less the removals before it (the
/// same index for all of them removed the wrong items: a user's volume once). Linear
/// in the list. Its variables are `j`, `k` and `x`: `path` may use an enclosing `i`.
fn remove_where(list: &str, path: &str, pred: &str) -> String {
    format!(
        "{list}.transformList(j, x, {pred}, j).transformList(k, j, JSONPatch{{op: \"remove\", path: {path} + \"/\" + string(j - k)}})"
    )
}

/// JSON patches that remove the default token's mounts (`kube-api-access-*`, which the
/// ServiceAccount admission added) from the container `c` at `path`.
fn unmount(path: &str) -> String {
    format!(
        "(has(c.volumeMounts) ? {} : [])",
        remove_where(
            "c.volumeMounts",
            &format!("{path} + \"/volumeMounts\""),
            &token()
        )
    )
}

/// CEL: `x` is the default token's volume or mount.
fn token() -> String {
    format!("x.name.startsWith({})", cel_string(DEFAULT_TOKEN_PREFIX))
}

/// CEL: the env var `x` is the downward API's `path`, as inject writes it (the API
/// server has given its fieldRef `apiVersion: v1`).
fn downward(x: &str, path: &str) -> String {
    format!(
        "(has({x}.valueFrom) && has({x}.valueFrom.fieldRef) && {x}.valueFrom.fieldRef.fieldPath == {} && (!has({x}.valueFrom.fieldRef.apiVersion) || {x}.valueFrom.fieldRef.apiVersion == 'v1'))",
        cel_string(path)
    )
}

/// The wrapped container's env, as inject makes it ([`super::template`]'s `wrap`):
/// trainlet's own settings taken out and added again; POD_NAME, POD_NAMESPACE and
/// POD_UID from the downward API where the container has none; where it has its own
/// POD_NAME or POD_NAMESPACE, trainlet's alias (TRAINLET_POD_NAME) beside it; then
/// exec's settings. Patches for the container `c` at `at`.
fn wrapped_env(cfg: &InjectConfig, at: &str) -> String {
    let env_ty = "Object.spec.containers.env";
    let entries: Vec<(String, String, Value)> = downward_env()
        .iter()
        .map(to_json)
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            let path = e["valueFrom"]["fieldRef"]["fieldPath"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (name, path, e)
        })
        .collect();
    let first = |name: &str| format!("c.env.filter(e, e.name == {})[0]", cel_string(name));
    let has = |name: &str| {
        format!(
            "(has(c.env) && c.env.exists(e, e.name == {}))",
            cel_string(name)
        )
    };
    let missing = entries
        .iter()
        .map(|(name, _, e)| format!("({} ? [] : [{}])", has(name), cel(e, env_ty)))
        .collect::<Vec<_>>()
        .join(" + ");
    let aliases = entries
        .iter()
        .filter_map(|(name, path, _)| {
            let (_, node) = alias_env(name)?;
            Some(format!(
                "({} && !{} ? [{}] : [])",
                has(name),
                downward(&first(name), path),
                cel(&to_json(&node), env_ty)
            ))
        })
        .collect::<Vec<_>>()
        .join(" + ");
    let own: Vec<Value> = exec_env(cfg).iter().map(to_json).collect();
    // What inject takes out first (`wrapper::is_exec_env`).
    let ours = EXEC_ENV.map(cel_string).join(", ");
    let alias_of = entries
        .iter()
        .filter_map(|(name, path, _)| {
            let (alias, _) = alias_env(name)?;
            Some(format!(
                "(x.name == {} && {})",
                cel_string(alias),
                downward("x", path)
            ))
        })
        .collect::<Vec<_>>()
        .join(" || ");
    let remove = format!(
        "(has(c.env) ? {} : [])",
        remove_where(
            "c.env",
            &format!("{at} + \"/env\""),
            &format!("x.name in [{ours}] || {alias_of}")
        )
    );
    let add = append(
        "c.env",
        &format!("{at} + \"/env\""),
        &format!(
            "{missing} + {aliases} + {}",
            cel(&Value::Array(own), env_ty)
        ),
    );
    format!("{remove} + {add}")
}

/// The variables that make the wrapped container's command, as inject does
/// ([`super::wrapper`]): a command that already runs a user's own `trainlet exec` keeps
/// it and its flags, with this policy's flags added where the user set none (`--report`
/// last); one that an earlier inject wrapped is unwrapped first; any other gets
/// `trainlet exec … --` in front.
fn command_variables(cfg: &InjectConfig) -> String {
    let wrapper = format!(
        "[{}, {}] + variables.execArgs + ['--']",
        cel_string(&format!("{}/trainlet", cfg.install_to)),
        cel_string(flags::EXEC),
    );
    let exec_flags = EXEC_FLAGS.map(cel_string).join(", ");
    let report = cel_string(&flags::long(flags::REPORT));
    format!(
        r#"    - name: cmd
      expression: >-
        object.spec.containers.filter(c, c.name == variables.wrap)[0].command
    - name: isExec
      expression: >-
        size(variables.cmd) >= 4 && variables.cmd[1] == {exec} &&
        (variables.cmd[0] == 'trainlet' || variables.cmd[0].endsWith('/trainlet')) &&
        '--' in variables.cmd && variables.cmd.indexOf('--') < size(variables.cmd) - 1
    - name: userFlags
      expression: >-
        variables.cmd.slice(2, variables.cmd.indexOf('--'))
    - name: original
      expression: >-
        variables.cmd.slice(variables.cmd.indexOf('--') + 1, size(variables.cmd))
    - name: isOwn
      expression: >-
        variables.cmd[0].startsWith('/') && size(variables.userFlags) > 0 && variables.userFlags[0] == {report} &&
        variables.userFlags.slice(1, size(variables.userFlags)).all(a, a.startsWith('--') && a.contains('=')) &&
        variables.userFlags.slice(1, size(variables.userFlags)).map(a, [{exec_flags}].indexOf(a.substring(2).split('=')[0])).all(k, x, x >= 0 && (k == 0 || variables.userFlags.slice(1, size(variables.userFlags)).map(a, [{exec_flags}].indexOf(a.substring(2).split('=')[0]))[k - 1] < x))
    - name: userNames
      expression: >-
        variables.userFlags.filter(a, a.startsWith('--')).map(a, a.substring(2).split('=')[0])
    - name: added
      expression: >-
        variables.execArgs.filter(a, !(a.substring(2).split('=')[0] in variables.userNames))
    - name: command
      expression: >-
        !variables.isExec ? {wrapper} + variables.cmd :
        variables.isOwn ? {wrapper} + variables.original :
        variables.cmd.slice(0, 1) + [{exec}] + variables.userFlags + variables.added.filter(a, a != {report}) +
        variables.added.filter(a, a == {report}) + ['--'] + variables.original
"#,
        exec = cel_string(flags::EXEC),
    )
}

/// trainlet's init container and sidecar, first in the pod's init containers: a CEL
/// list of the two, as inject makes them for a pod with a wrapped container or none,
/// on hostNetwork or not.
fn trainlet_inits(cfg: &InjectConfig) -> String {
    let ty = "Object.spec.initContainers";
    let init = |wrapped: bool| {
        with_args(
            to_json(&init_container(&shape(cfg, wrapped))),
            "variables.initArgs",
        )
    };
    let side = |wrapped: bool| {
        format!(
            "(variables.hostNetwork ? {} : {})",
            cel(&policy_sidecar(cfg, wrapped, true), ty),
            cel(&policy_sidecar(cfg, wrapped, false), ty)
        )
    };
    format!(
        "(variables.wrap != '' ? [{}, {}] : [{}, {}])",
        cel(&init(true), ty),
        side(true),
        cel(&init(false), ty),
        side(false),
    )
}

/// trainlet's volumes, as a CEL list.
fn trainlet_volumes() -> String {
    let vols = |wrapped: bool| {
        let mut v = vec![to_json(&volume())];
        if wrapped {
            v.push(to_json(&observed_volume()));
        }
        v.push(to_json(&token_volume()));
        cel(&Value::Array(v), "Object.spec.volumes")
    };
    format!("(variables.wrap != '' ? {} : {})", vols(true), vols(false))
}

/// The patches of every container: the default token's mount out, trainlet's files
/// in (read-only), and for the wrapped one the handover, the command and the env.
fn containers_patch(cfg: &InjectConfig) -> String {
    let mounts_ty = "Object.spec.containers.volumeMounts";
    let own_mount = cel(
        &Value::Array(vec![to_json(&mount(&cfg.output_dir, true))]),
        mounts_ty,
    );
    let observed_mount = cel(
        &Value::Array(vec![to_json(&mount_of(
            OBSERVED_VOLUME,
            &cfg.observations_dir,
            false,
        ))]),
        mounts_ty,
    );
    let at = "\"/spec/containers/\" + string(i)";
    let mounts = append(
        "c.volumeMounts",
        &format!("{at} + \"/volumeMounts\""),
        &format!("{own_mount} + (c.name == variables.wrap ? {observed_mount} : [])"),
    );
    format!(
        "object.spec.containers.transformList(i, c, (variables.usersSA ? [] : {unmount}) + {mounts}).flatten() +
          object.spec.containers.transformList(i, c, c.name == variables.wrap,
            [JSONPatch{{op: \"add\", path: {at} + \"/command\", value: variables.command}}] +
            {env}).flatten()",
        unmount = unmount(at),
        env = wrapped_env(cfg, at),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::cel::RAW;
    use super::validate::valid_expression;
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
                rule: Rule::Jobs,
            },
            Setting::Value {
                flag: "order",
                default: Some("index".into()),
                rule: Rule::Choice(&["index", "name"]),
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

    /// `framework` is the annotation's, else the launchers': the pattern `inject`
    /// matches with the regex crate, as a CEL string, over the text `launcher::line`
    /// makes; every other setting is its annotation.
    #[test]
    fn the_framework_is_the_annotations_or_else_the_launchers() {
        use crate::render::frameworks::Framework;
        assert_eq!(value("framework"), "variables.framework");
        assert_eq!(value("order"), annotation("order"));
        let v = framework_variables();
        for f in [Framework::Pytorch, Framework::Mpi] {
            let matches = format!(
                "variables.line.matches({})",
                cel_string(&launcher::framework_pattern(f))
            );
            assert!(v.contains(&matches), "{v}");
        }
        assert!(
            v.contains(".map(l, size(l) > 4096 ? l.substring(0, 4096) : l)[0]"),
            "{v}"
        );
        assert!(
            v.contains(&format!(
                "{a} != '' ? {a} : variables.wrap == '' ? '' :",
                a = annotation("framework")
            )),
            "{v}"
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
                rule: Rule::Pattern,
            }],
            sidecar: Vec::new(),
            required: vec!["job"],
            default_port: 8470,
        };
        let e = valid_expression(&settings, "/etc/trainlet", "/run/trainlet-observed");
        assert!(!e.contains("variables."), "{e}");
        assert!(e.contains("trainlet.io/stall-after"), "{e}");
    }
}
