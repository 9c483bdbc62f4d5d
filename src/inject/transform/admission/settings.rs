//! The settings a pod gives in its annotations (`trainlet.io/<flag>`), as the CLI layer
//! describes them: the flags `inject` writes, in its order, with their defaults and the
//! shape of a valid value.

use super::cel::cel_string;
use super::rule::Rule;

/// The label a pod opts in with.
pub const LABEL: &str = "trainlet.io/inject";
/// The prefix of the annotations that carry the settings: `trainlet.io/<flag>`.
pub const PREFIX: &str = "trainlet.io/";
/// The annotation that names the container to wrap (`inject --wrap`).
pub const WRAP: &str = "wrap";
/// The policies' and bindings' name, and their parameter object's.
pub const NAME: &str = "trainlet-inject";
/// The namespace of the policy's parameter object (a ConfigMap named [`NAME`]): the
/// image and resources of trainlet's containers, which a cluster admin changes there
/// without generating the policy again.
pub const PARAMS_NAMESPACE: &str = "trainlet-system";
/// The parameter object's keys.
pub const PARAM_IMAGE: &str = "image";
pub const PARAM_CPU: &str = "cpu";
pub const PARAM_MEMORY: &str = "memory";
/// The name of the ValidatingAdmissionPolicy that warns of a pod left uninjected for
/// want of a valid parameter object.
pub const PARAMS_CHECK: &str = "trainlet-inject-parameters";

/// One setting, read from the annotation `trainlet.io/<flag>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `--flag=VALUE`, unless the value is the flag's default (`inject` writes only
    /// what differs), valid by `rule`.
    Value {
        flag: &'static str,
        default: Option<String>,
        rule: Rule,
    },
    /// `--flag` when the annotation is `"true"`.
    Switch { flag: &'static str },
    /// One `--flag=ITEM` per `;`-separated item (repeatable flags such as `--job`); the
    /// whole value valid by `rule`.
    Each { flag: &'static str, rule: Rule },
    /// Always written, from no annotation (`--install-to`).
    Fixed(String),
}

impl Setting {
    pub(super) fn flag(&self) -> Option<&'static str> {
        match self {
            Setting::Value { flag, .. } | Setting::Switch { flag } | Setting::Each { flag, .. } => {
                Some(flag)
            }
            Setting::Fixed(_) => None,
        }
    }

    /// The rule of a setting that takes a value.
    pub(super) fn rule(&self) -> Option<&Rule> {
        match self {
            Setting::Value { rule, .. } | Setting::Each { rule, .. } => Some(rule),
            Setting::Switch { .. } | Setting::Fixed(_) => None,
        }
    }
}

/// What the policy needs besides `inject`'s config: the settings of `trainlet init`,
/// of the wrapped `trainlet exec` and of the sidecar, each in the order `inject` writes
/// them; the sidecar's port.
#[derive(Debug, Clone)]
pub struct Settings {
    pub init: Vec<Setting>,
    pub exec: Vec<Setting>,
    /// The sidecar's own (`--metrics-addr`), written after inject's.
    pub sidecar: Vec<Setting>,
    /// The annotations that must be there (`job`).
    pub required: Vec<&'static str>,
    /// The task port the sidecar watches where no `port` is annotated and every
    /// framework is TensorFlow's.
    pub default_port: u16,
}

/// The annotation's value, or `""`.
pub(super) fn annotation(flag: &str) -> String {
    format!(
        "variables.a[?{}].orValue('')",
        cel_string(&format!("{PREFIX}{flag}"))
    )
}

/// A value that `inject` would write and the policy would refuse: the flag, the
/// value, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub flag: &'static str,
    pub value: String,
    pub why: String,
}

impl Settings {
    /// Every setting read from an annotation or written always, init's first.
    pub fn all(&self) -> impl Iterator<Item = &Setting> {
        self.init.iter().chain(&self.exec).chain(&self.sidecar)
    }

    /// Checks the arguments `inject` writes (`--flag=value`) by the rules the policy
    /// checks the same settings' annotations with, so that a value passes both or
    /// neither. The items of a repeated flag (`--job`) are checked as the one
    /// annotation that would carry them, joined by `;`.
    pub fn check_args(&self, args: &[String]) -> Result<(), Refused> {
        for s in self.all() {
            let (Some(flag), Some(rule)) = (s.flag(), s.rule()) else {
                continue;
            };
            let prefix = format!("--{flag}=");
            let values: Vec<&str> = args
                .iter()
                .filter_map(|a| a.strip_prefix(&prefix))
                .collect();
            if values.is_empty() {
                continue;
            }
            let value = match s {
                Setting::Each { .. } => values.join(";"),
                _ => values.concat(),
            };
            rule.check(&value).map_err(|why| Refused {
                flag,
                value: value.clone(),
                why,
            })?;
        }
        Ok(())
    }
}
