//! The ValidatingAdmissionPolicy beside the mutation: a pod that opts in with settings
//! missing or bad is refused at admission, with a message that names the annotation and
//! its value, instead of starting with a broken init container in every replica. The
//! mutation does not match such a pod (the same checks are its match condition), so
//! this message is what the user sees.

use super::cel::cel_string;
use super::settings::{LABEL, PREFIX, Setting, Settings, WRAP, annotation};

/// Each check of the ValidatingAdmissionPolicy: CEL that holds for a good pod, and
/// a CEL expression of the message, which names the annotation and its value.
pub(super) fn checks(settings: &Settings) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let text = |t: String| cel_string(&t);
    for flag in &settings.required {
        out.push((
            format!("{} != ''", annotation(flag)),
            text(format!(
                "a pod labelled {LABEL}=true needs the annotation {PREFIX}{flag}"
            )),
        ));
    }
    let known: Vec<&str> = settings
        .init
        .iter()
        .chain(&settings.exec)
        .filter_map(Setting::flag)
        .chain([WRAP])
        .collect();
    let known_keys = known
        .iter()
        .map(|f| cel_string(&format!("{PREFIX}{f}")))
        .collect::<Vec<_>>()
        .join(", ");
    let unknown =
        format!("variables.a.filter(k, k.startsWith('{PREFIX}') && !(k in [{known_keys}]))");
    out.push((
        format!("size({unknown}) == 0"),
        format!(
            "'unknown annotation ' + {unknown}[0] + {}",
            text(format!(
                ": trainlet's settings are {PREFIX}<flag> for the flags {} (docs/admission.md)",
                known.join(", ")
            ))
        ),
    ));
    let bad = |flag: &str, value: &str, hint: String| {
        format!(
            "{} + {value} + {}",
            text(format!("invalid annotation {PREFIX}{flag} \"")),
            text(format!("\": {hint}"))
        )
    };
    for s in settings.init.iter().chain(&settings.exec) {
        match s {
            Setting::Value { flag, pattern, .. } => {
                let value = annotation(flag);
                out.push((
                    format!("{value} == '' || {value}.matches({})", cel_string(pattern)),
                    bad(flag, &value, hint(flag, pattern)),
                ));
            }
            Setting::Switch { flag } => {
                let value = annotation(flag);
                out.push((
                    format!("{value} in ['', 'true', 'false']"),
                    bad(flag, &value, "give \"true\" or \"false\"".to_string()),
                ));
            }
            Setting::Each { flag, pattern } => {
                let value = annotation(flag);
                out.push((
                    format!(
                        "{value}.split(';').map(s, s.trim()).filter(s, s != '').all(s, s.matches({}))",
                        cel_string(pattern)
                    ),
                    bad(
                        flag,
                        &value,
                        format!("give --{flag}'s TYPE=SELECTOR, several separated by ';'"),
                    ),
                ));
            }
            Setting::Fixed(_) => {}
        }
    }
    out.push((
        "variables.wrap == '' || object.spec.containers.exists(c, c.name == variables.wrap && has(c.command) && size(c.command) > 0)".to_string(),
        bad(
            WRAP,
            "variables.wrap",
            "name a container of this pod that sets `command` (trainlet cannot see an image's ENTRYPOINT)".to_string(),
        ),
    ));
    for s in &settings.exec {
        if let Some(flag) = s.flag() {
            out.push((
                format!("variables.wrap != '' || {} == ''", annotation(flag)),
                text(format!(
                    "the annotation {PREFIX}{flag} acts on the command of the container that {PREFIX}{WRAP} names: add {PREFIX}{WRAP}"
                )),
            ));
        }
    }
    out
}

/// What a valid value is: the choices of a pattern `^(a|b|c)$`, else the flag's help.
pub(super) fn hint(flag: &str, pattern: &str) -> String {
    let choices = pattern
        .strip_prefix("^(")
        .and_then(|p| p.strip_suffix(")$"))
        .filter(|p| {
            p.chars()
                .all(|c| c.is_ascii_lowercase() || c == '-' || c == '|')
        });
    match choices {
        Some(c) => format!(
            "give one of {}",
            c.split('|').collect::<Vec<_>>().join(", ")
        ),
        None => format!("give a value as --{flag} takes it (`trainlet inject --help`)"),
    }
}

/// A match condition sees no `variables`: theirs are spelt out.
pub(super) fn valid_expression(settings: &Settings) -> String {
    let a = "(has(object.metadata.annotations) ? object.metadata.annotations : {})";
    let wrap = format!(
        "{a}[?{}].orValue('')",
        cel_string(&format!("{PREFIX}{WRAP}"))
    );
    checks(settings)
        .into_iter()
        .map(|(e, _)| format!("({e})"))
        .collect::<Vec<_>>()
        .join(" &&\n        ")
        .replace("variables.wrap", &wrap)
        .replace("variables.a", a)
}

pub(super) fn validations(settings: &Settings) -> String {
    let mut out = String::from("  validations:\n");
    for (e, m) in checks(settings) {
        out.push_str(&format!(
            "    - expression: >-\n        {e}\n      messageExpression: >-\n        {m}\n      reason: Invalid\n"
        ));
    }
    out.trim_end().to_string()
}
