//! How inject knows what it added before: by shape, never by a name alone (a user's
//! volume, container or variable may carry one of trainlet's names); and what an
//! earlier inject set that this one does not.

use super::InjectConfig;
use super::parts::name_of;
use super::parts::{
    downward_env, observed_volume, resources, shm_volume, sidecar_args, token_volume, volume,
};
use super::{
    BINARY, INIT_CONTAINER, Node, OBSERVED_VOLUME, SHM_VOLUME, SIDECAR, TOKEN_VOLUME, VOLUME, yaml,
};
use crate::flags;

/// A container inject added: it runs trainlet's `init` or `sidecar`, with the pod's
/// identity from the downward API as its only env and only trainlet's volumes
/// mounted. Fields the API server adds (`imagePullPolicy`, …) do not matter.
pub(super) fn is_injected_container(c: &Node) -> bool {
    let runs_trainlet = match c.get("command") {
        Some(Node::Seq(cmd)) => {
            cmd.len() == 2
                && cmd.first().and_then(Node::as_str) == Some(BINARY)
                && matches!(cmd.get(1).and_then(Node::as_str), Some("init" | "sidecar"))
        }
        _ => false,
    };
    let env_is_ours = match c.get("env") {
        Some(Node::Seq(env)) => {
            let ours = downward_env();
            env.len() == ours.len() && env.iter().zip(&ours).all(|(u, o)| same_env(u, o))
        }
        _ => false,
    };
    let mounts_are_ours = match c.get("volumeMounts") {
        Some(Node::Seq(mounts)) => mounts
            .iter()
            .all(|m| matches!(name_of(m), Some(VOLUME | OBSERVED_VOLUME | TOKEN_VOLUME))),
        _ => false,
    };
    runs_trainlet && env_is_ours && mounts_are_ours
}

/// A volume inject added: exactly what it writes under that name (for the
/// `--shm-size` volume, of any size).
pub(super) fn is_injected_volume(name: &str, v: &Node) -> bool {
    let ours = match name {
        VOLUME => volume(),
        OBSERVED_VOLUME => observed_volume(),
        TOKEN_VOLUME => token_volume(),
        SHM_VOLUME => match v
            .get("emptyDir")
            .and_then(|e| e.get("sizeLimit"))
            .and_then(Node::as_str)
        {
            Some(size) => shm_volume(size),
            None => return false,
        },
        _ => return false,
    };
    as_sent(v) == as_sent(&ours)
}

/// A node as JSON, without the `apiVersion: v1` the API server adds to every
/// `fieldRef`: what inject wrote, also when it comes back from `kubectl get -o yaml`.
fn as_sent(n: &Node) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                if let Some(serde_json::Value::Object(f)) = o.get_mut("fieldRef")
                    && f.get("apiVersion").and_then(|a| a.as_str()) == Some("v1")
                {
                    f.remove("apiVersion");
                }
                o.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v = yaml::to_json(n);
    strip(&mut v);
    v
}

/// The same variable from the same field of the downward API (the API server may
/// add `apiVersion: v1` to the fieldRef).
pub(super) fn same_env(a: &Node, b: &Node) -> bool {
    as_sent(a) == as_sent(b)
}

/// trainlet's own variable for the pod's name or namespace (`--pod-name`,
/// `--pod-namespace` of exec), where the user's container has `POD_NAME` or
/// `POD_NAMESPACE` of its own. `POD_UID` has none: trainlet does not read it.
pub(super) fn alias_env(name: &str) -> Option<(&'static str, Node)> {
    let (alias, path) = match name {
        "POD_NAME" => ("TRAINLET_POD_NAME", "metadata.name"),
        "POD_NAMESPACE" => ("TRAINLET_POD_NAMESPACE", "metadata.namespace"),
        _ => return None,
    };
    let node = Node::map([
        ("name", Node::str(alias)),
        (
            "valueFrom",
            Node::map([("fieldRef", Node::map([("fieldPath", Node::str(path))]))]),
        ),
    ]);
    Some((alias, node))
}

/// One that [`alias_env`] writes.
pub(super) fn is_alias_env(e: &Node) -> bool {
    ["POD_NAME", "POD_NAMESPACE"]
        .iter()
        .filter_map(|n| alias_env(n))
        .any(|(_, a)| same_env(e, &a))
}

/// A mount path as the kubelet reads it: `/dev/shm/` is `/dev/shm`.
pub(super) fn normal_path(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        p => p,
    }
}

/// What an earlier inject set in a pod template, to say what this one drops.
pub(super) struct Earlier {
    init: Vec<String>,
    sidecar: Vec<String>,
    resources: Option<serde_json::Value>,
    shm: Option<String>,
}

impl Earlier {
    /// Read before anything changes (and after `Ctx::refuse_collisions`: every
    /// container and volume under trainlet's names is inject's).
    pub(super) fn of(spec: &Node) -> Earlier {
        let find = |list: &str, name: &str| -> Option<&Node> {
            spec.get(list)
                .and_then(Node::as_seq)
                .and_then(|items| items.iter().find(|c| name_of(c) == Some(name)))
        };
        let args = |c: Option<&Node>| -> Vec<String> {
            c.and_then(|c| c.get("args"))
                .and_then(Node::as_seq)
                .map(|a| {
                    a.iter()
                        .filter_map(Node::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let sidecar = find("initContainers", SIDECAR).or_else(|| find("containers", SIDECAR));
        Earlier {
            init: args(find("initContainers", INIT_CONTAINER)),
            sidecar: args(sidecar),
            resources: sidecar.and_then(|c| c.get("resources")).map(yaml::to_json),
            shm: find("volumes", SHM_VOLUME)
                .and_then(|v| v.get("emptyDir"))
                .and_then(|e| e.get("sizeLimit"))
                .and_then(Node::as_str)
                .map(str::to_string),
        }
    }

    /// The value of `--flag=VALUE` among the earlier init container's arguments.
    pub(super) fn init_value(&self, flag: &str) -> Option<String> {
        value_of(&self.init, flag)
    }

    /// The value of `--flag=VALUE` among the earlier sidecar's arguments.
    pub(super) fn sidecar_value(&self, flag: &str) -> Option<String> {
        value_of(&self.sidecar, flag)
    }

    /// The flags of inject that gave what an earlier inject set and `cfg` does not.
    pub(super) fn dropped(&self, cfg: &InjectConfig) -> Vec<String> {
        let mut out = dropped_flags(&self.init, &cfg.init_args);
        for d in dropped_flags(&self.sidecar, &sidecar_args(cfg)) {
            match flag_name(&d) {
                // Follows --wrap, which is not a setting of the pod template.
                Some(f) if f == flags::OBSERVATIONS => {}
                // Follows init's --port (whose drop init's flags note), or the
                // frameworks: TensorFlow's port, which nobody passed.
                Some(f) if f == flags::PORT => {}
                Some(f) if f == flags::EXIT_WITH_MAIN => {
                    out.push(flags::long(flags::CLASSIC_SIDECAR));
                }
                _ => out.push(d),
            }
        }
        if let Some(old) = &self.resources
            && *old != yaml::to_json(&resources(&cfg.resources))
            && let (Some(cpu), Some(memory)) = (
                old["requests"]["cpu"].as_str(),
                old["requests"]["memory"].as_str(),
            )
        {
            out.push(flags::with_value(
                flags::RESOURCES,
                format!("cpu={cpu},memory={memory}"),
            ));
        }
        if let (Some(size), None) = (&self.shm, &cfg.shm_size) {
            out.push(flags::with_value(flags::SHM_SIZE, size));
        }
        out
    }
}

/// The value of the last `--flag=VALUE` in `args`.
fn value_of(args: &[String], flag: &str) -> Option<String> {
    let prefix = format!("--{flag}=");
    args.iter()
        .rev()
        .find_map(|a| a.strip_prefix(&prefix))
        .map(str::to_string)
}

/// `--name` of `--name=value` or `--name`; none for anything else.
pub(super) fn flag_name(arg: &str) -> Option<&str> {
    let rest = arg.strip_prefix("--").filter(|r| !r.is_empty())?;
    Some(rest.split_once('=').map_or(rest, |(n, _)| n))
}

/// The flags of `old` whose names `new` does not have.
pub(super) fn dropped_flags(old: &[String], new: &[String]) -> Vec<String> {
    let names: Vec<&str> = new.iter().filter_map(|a| flag_name(a)).collect();
    old.iter()
        .filter(|a| flag_name(a).is_some_and(|n| !names.contains(&n)))
        .cloned()
        .collect()
}
