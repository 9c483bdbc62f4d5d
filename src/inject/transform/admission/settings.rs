//! The settings a pod gives in its annotations (`trainlet.io/<flag>`), as the CLI layer
//! describes them: the flags `inject` writes, in its order, with their defaults and the
//! shape of a valid value.

use super::cel::cel_string;

/// The label a pod opts in with.
pub const LABEL: &str = "trainlet.io/inject";
/// The prefix of the annotations that carry the settings: `trainlet.io/<flag>`.
pub const PREFIX: &str = "trainlet.io/";
/// The annotation that names the container to wrap (`inject --wrap`).
pub const WRAP: &str = "wrap";
/// The policies' and bindings' name.
pub const NAME: &str = "trainlet-inject";

/// One setting, read from the annotation `trainlet.io/<flag>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `--flag=VALUE`, unless the value is the flag's default (`inject` writes only
    /// what differs). `pattern`: what a valid value matches (RE2), for the validation.
    Value {
        flag: &'static str,
        default: Option<String>,
        pattern: &'static str,
    },
    /// `--flag` when the annotation is `"true"`.
    Switch { flag: &'static str },
    /// One `--flag=ITEM` per `;`-separated item (repeatable flags such as `--job`).
    Each {
        flag: &'static str,
        pattern: &'static str,
    },
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
}

/// What the policy needs besides `inject`'s config: the settings of `trainlet init`
/// and of the wrapped `trainlet exec`, each in the order `inject` writes them; the
/// sidecar's port.
#[derive(Debug, Clone)]
pub struct Settings {
    pub init: Vec<Setting>,
    pub exec: Vec<Setting>,
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
