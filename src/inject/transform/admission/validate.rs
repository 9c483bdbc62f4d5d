//! The ValidatingAdmissionPolicy beside the mutation: a pod that opts in with settings
//! missing or bad is refused at admission, with a message that names the annotation and
//! its value, instead of starting with a broken init container in every replica. The
//! mutation does not match such a pod (the same checks are its match condition), so
//! this message is what the user sees.
//!
//! The checks are `inject`'s: each setting's [`Rule`], then what `inject` checks across
//! settings (`--expect` types among the jobs', job types with names of their own,
//! `trainlet exec`'s settings only with a wrapped container, `--on-stall` only with
//! `--stall-after`, `--permanent-exit-codes` only with `--on-failure restart`), then the
//! pod's own names that inject refuses to overwrite. Every check is bounded by the size
//! checks before it, so its cost stays small whatever a pod carries.

use super::cel::cel_string;
use super::rule::{MAX_ITEMS, Rule};
use super::settings::{LABEL, PREFIX, Setting, Settings, WRAP, annotation};
use crate::inject::transform::{
    BINARY, INIT_CONTAINER, OBSERVED_VOLUME, SHM_VOLUME, SIDECAR, TOKEN_VOLUME, VOLUME,
};

/// What the policies show of a value in a message: its first 64 characters, line
/// breaks written as `\n` (the API server refuses a message with a line break).
fn shown(value: &str) -> String {
    format!(
        "(size({value}) > 64 ? {value}.substring(0, 64) + '…' : {value}).replace('\\\\', '\\\\\\\\').replace('\\n', '\\\\n').replace('\\r', '\\\\r')"
    )
}

/// Whether a pod is one that `trainlet inject` (or the policy) already gave trainlet:
/// it has trainlet's init container, running trainlet's binary. Such a pod is left as it
/// is, also with the label.
pub(super) fn injected() -> String {
    format!(
        "has(object.spec.initContainers) && object.spec.initContainers.exists(c, c.name == {} && has(c.command) && size(c.command) == 2 && c.command[0] == {} && c.command[1] == 'init')",
        cel_string(INIT_CONTAINER),
        cel_string(BINARY)
    )
}

/// Each check of the ValidatingAdmissionPolicy: CEL that holds for a good pod, and
/// a CEL expression of the message, which names the annotation and its value.
pub(super) fn checks(
    settings: &Settings,
    output_dir: &str,
    observations_dir: &str,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let text = |t: String| cel_string(&t);
    let label = format!("object.metadata.labels[{}]", cel_string(LABEL));
    out.push((
        format!("{label} == 'true'"),
        format!(
            "{} + {} + {}",
            text(format!("invalid label {LABEL} \"")),
            shown(&label),
            text("\": give \"true\" to add trainlet, or \"false\" (or no label) for none".into())
        ),
    ));
    for flag in &settings.required {
        out.push((
            format!("{} != ''", annotation(flag)),
            text(format!(
                "a pod labelled {LABEL}=true needs the annotation {PREFIX}{flag}"
            )),
        ));
    }
    out.push(unknown(settings));
    let all = || settings.all();
    // Sizes first: every later check of a value is vacuous past its size.
    for s in all() {
        if let (Some(flag), Some(rule)) = (s.flag(), s.rule()) {
            let v = annotation(flag);
            out.push((
                format!("size({v}) <= {}", rule.max_len()),
                format!(
                    "{} + {} + {} + string(size({v})) + {}",
                    text(format!("invalid annotation {PREFIX}{flag} \"")),
                    shown(&v),
                    text("\": ".into()),
                    text(format!(" characters, at most {} allowed", rule.max_len()))
                ),
            ));
        }
    }
    for s in all() {
        out.extend(value_check(s));
    }
    out.extend(across(settings));
    out.extend(collisions(output_dir, observations_dir));
    out
}

/// An annotation `trainlet.io/…` that names no setting: a typo would be ignored.
fn unknown(settings: &Settings) -> (String, String) {
    let known: Vec<&str> = settings
        .all()
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
    (
        format!("size({unknown}) == 0"),
        format!(
            "'unknown annotation ' + {} + {}",
            shown(&format!("{unknown}[0]")),
            cel_string(&format!(
                ": trainlet's settings are {PREFIX}<flag> for the flags {} (docs/admission.md)",
                known.join(", ")
            ))
        ),
    )
}

/// The message of a value that breaks its setting's rule.
fn bad(flag: &str, value: &str, hint: &str) -> String {
    format!(
        "{} + {} + {}",
        cel_string(&format!("invalid annotation {PREFIX}{flag} \"")),
        shown(value),
        cel_string(&format!("\": {hint}"))
    )
}

fn value_check(s: &Setting) -> Option<(String, String)> {
    match s {
        Setting::Value { flag, rule, .. } | Setting::Each { flag, rule } => {
            let v = annotation(flag);
            Some((
                format!("{v} == '' || {}", rule.cel(&v)),
                bad(flag, &v, &rule.hint()),
            ))
        }
        Setting::Switch { flag } => {
            let v = annotation(flag);
            Some((
                format!("{v} in ['', 'true', 'false']"),
                bad(flag, &v, "give \"true\" or \"false\""),
            ))
        }
        Setting::Fixed(_) => None,
    }
}

/// A setting's value is there and valid by its rule (the checks across settings read
/// only such values).
fn valid(s: &Setting) -> Option<String> {
    let flag = s.flag()?;
    let v = annotation(flag);
    Some(match s.rule() {
        Some(rule) => format!("({v} != '' && {})", rule.cel_valid(&v)),
        None => format!("{v} != ''"),
    })
}

fn find<'a>(settings: &'a Settings, flag: &str) -> Option<&'a Setting> {
    settings.all().find(|s| s.flag() == Some(flag))
}

/// What inject checks across settings.
fn across(settings: &Settings) -> Vec<(String, String)> {
    let mut out = across_jobs(settings);
    out.extend(across_exec(settings));
    out
}

/// A message of `before`, the annotation's value that `value` (CEL) reads, and `after`.
fn around(before: &str, value: &str, after: &str) -> String {
    format!(
        "{} + {} + {}",
        cel_string(before),
        shown(value),
        cel_string(after)
    )
}

/// `--expect`'s types against `--job`'s, and `--job`'s types against each other.
fn across_jobs(settings: &Settings) -> Vec<(String, String)> {
    use crate::flags as f;
    let mut out = Vec::new();
    let job = annotation(f::JOB);
    let types = format!("{job}.split(';').map(s, s.split('=')[0].trim())");
    if let (Some(jobs), Some(expect)) = (find(settings, f::JOB), find(settings, f::EXPECT)) {
        let (jobs, expect_ok) = (
            valid(jobs).unwrap_or_default(),
            valid(expect).unwrap_or_default(),
        );
        let e = annotation(f::EXPECT);
        let expected = format!("{e}.split(',').map(x, x.split('=')[0])");
        let invalid = format!("invalid annotation {PREFIX}{} \"", f::EXPECT);
        out.push((
            format!("!({jobs} && {expect_ok}) || {expected}.all(t, t in {types})"),
            around(
                &invalid,
                &e,
                &format!("\": every TYPE must be a job type of {PREFIX}{}", f::JOB),
            ),
        ));
        out.push((
            format!("!({jobs} && {expect_ok}) || {expected}.all(t, {expected}.filter(u, u == t).size() == 1)"),
            around(&invalid, &e, "\": a type is given twice"),
        ));
    }
    if let Some(jobs) = find(settings, f::JOB).and_then(valid) {
        // Volcano's names of a type: `-` as `_`, upper-cased (render/frameworks/volcano).
        let name = |t: &str| format!("{t}.replace('-', '_').upperAscii()");
        out.push((
            format!(
                "!{jobs} || {types}.all(a, {types}.all(b, a == b || {} != {}))",
                name("a"),
                name("b")
            ),
            around(
                &format!("invalid annotation {PREFIX}{} \"", f::JOB),
                &job,
                &format!(
                    "\": two job types would write one Volcano host list (a-b and a_b, or a_b and A_B); rename one of them (at most {MAX_ITEMS} types)"
                ),
            ),
        ));
    }
    out
}

/// The wrapped exec's settings: given only with a container to wrap, and those that
/// need another given with it.
fn across_exec(settings: &Settings) -> Vec<(String, String)> {
    use crate::flags as f;
    let mut out = Vec::new();
    out.push((
        "variables.wrap == '' || object.spec.containers.exists(c, c.name == variables.wrap && has(c.command) && size(c.command) > 0)".to_string(),
        bad(
            WRAP,
            "variables.wrap",
            "name a container of this pod that sets `command` (trainlet cannot see an image's ENTRYPOINT)",
        ),
    ));
    for s in &settings.exec {
        if let Setting::Value {
            flag,
            default,
            rule,
        } = s
        {
            let v = annotation(flag);
            // A value equal to the default is none (inject compares numbers as numbers).
            let default = match (default, rule) {
                (None, _) => String::new(),
                (Some(d), Rule::Count { .. }) => {
                    format!(" || ({} && int({v}) == {d})", rule.cel_valid(&v))
                }
                (Some(d), _) => format!(" || {v} == {}", cel_string(d)),
            };
            out.push((
                format!("variables.wrap != '' || {v} == ''{default}"),
                cel_string(&format!(
                    "the annotation {PREFIX}{flag} acts on the command of the container that {PREFIX}{WRAP} names: add {PREFIX}{WRAP}"
                )),
            ));
        }
    }
    let on_stall = annotation(f::ON_STALL);
    out.push((
        format!(
            "{on_stall} in ['', 'report'] || {} != ''",
            annotation(f::STALL_AFTER)
        ),
        around(
            &format!("the annotation {PREFIX}{} \"", f::ON_STALL),
            &on_stall,
            &format!(
                "\" acts on a stall, which {PREFIX}{} defines: add it",
                f::STALL_AFTER
            ),
        ),
    ));
    let codes = annotation(f::PERMANENT_EXIT_CODES);
    out.push((
        format!(
            "{codes} == '' || {} == 'restart'",
            annotation(f::ON_FAILURE)
        ),
        around(
            &format!("the annotation {PREFIX}{} \"", f::PERMANENT_EXIT_CODES),
            &codes,
            &format!(
                "\" names the codes that {PREFIX}{} restart does not retry: add it",
                f::ON_FAILURE
            ),
        ),
    ));
    out
}

/// The pod's own containers, volumes and mounts under the names and paths inject adds:
/// inject refuses them rather than replace the user's, and so does the policy (the
/// API server would otherwise refuse a duplicate name without saying why).
fn collisions(output_dir: &str, observations_dir: &str) -> Vec<(String, String)> {
    let text = |t: &str| cel_string(t);
    let names = format!("[{}, {}]", cel_string(INIT_CONTAINER), cel_string(SIDECAR));
    let mut out = Vec::new();
    for list in ["initContainers", "containers"] {
        let items = format!("object.spec.{list}");
        let taken = format!("{items}.filter(c, c.name in {names})");
        out.push((
            format!("!has({items}) || size({taken}) == 0"),
            format!(
                "{} + {taken}[0].name + {}",
                text(&format!("{list} has a container \"")),
                text("\" that trainlet inject did not add; inject adds its own under that name: rename yours")
            ),
        ));
    }
    let volumes = format!(
        "[{}]",
        [VOLUME, OBSERVED_VOLUME, TOKEN_VOLUME, SHM_VOLUME]
            .map(cel_string)
            .join(", ")
    );
    let taken = format!("object.spec.volumes.filter(v, v.name in {volumes})");
    out.push((
        format!("!has(object.spec.volumes) || size({taken}) == 0"),
        format!(
            "{} + {taken}[0].name + {}",
            text("has a volume \""),
            text("\" that trainlet inject did not add; inject adds its own under that name: rename yours (and the volumeMounts that use it)")
        ),
    ));
    let at = |dir: &str| {
        format!(
            "m.mountPath.matches({})",
            cel_string(&format!("^{}/*$", regex_literal(dir)))
        )
    };
    let own = format!("[{}, {}]", cel_string(VOLUME), cel_string(OBSERVED_VOLUME));
    let mounts_at = |cond: &str, dir: &str| {
        format!(
            "object.spec.containers.filter(c, {cond}has(c.volumeMounts) && c.volumeMounts.exists(m, !(m.name in {own}) && {}))",
            at(dir)
        )
    };
    for (cond, dir, fix) in [
        (
            "",
            output_dir,
            "where inject mounts trainlet's files (--output-dir): mount yours elsewhere".to_string(),
        ),
        (
            "c.name == variables.wrap && ",
            observations_dir,
            "where inject mounts the wrapped command's handover to the sidecar (--wrap): mount yours elsewhere".to_string(),
        ),
    ] {
        let found = mounts_at(cond, dir);
        out.push((
            format!("size({found}) == 0"),
            format!(
                "{} + {found}[0].name + {}",
                text("container \""),
                text(&format!("\" mounts a volume of its own at {dir}, {fix}"))
            ),
        ));
    }
    out
}

/// `s` with the characters a regex gives a meaning escaped.
fn regex_literal(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let meta = "\\.+*?()|[]{}^$".contains(c);
            meta.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// A match condition sees no `variables`: theirs are spelt out.
pub(super) fn valid_expression(
    settings: &Settings,
    output_dir: &str,
    observations_dir: &str,
) -> String {
    let a = "(has(object.metadata.annotations) ? object.metadata.annotations : {})";
    let wrap = format!(
        "{a}[?{}].orValue('')",
        cel_string(&format!("{PREFIX}{WRAP}"))
    );
    checks(settings, output_dir, observations_dir)
        .into_iter()
        .map(|(e, _)| format!("({e})"))
        .collect::<Vec<_>>()
        .join(" &&\n        ")
        .replace("variables.wrap", &wrap)
        .replace("variables.a", a)
}

pub(super) fn validations(settings: &Settings, output_dir: &str, observations_dir: &str) -> String {
    let mut out = String::from("  validations:\n");
    for (e, m) in checks(settings, output_dir, observations_dir) {
        out.push_str(&format!(
            "    - expression: >-\n        {e}\n      messageExpression: >-\n        {m}\n      reason: Invalid\n"
        ));
    }
    out.trim_end().to_string()
}
