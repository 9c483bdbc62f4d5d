//! The `trainlet exec` in front of the wrapped container's command: inject's own,
//! which a later inject replaces, and the user's, which it keeps.

use super::own::{flag_name, is_alias_env};
use super::parts::name_of;
use super::{EXEC_FLAGS, InjectConfig, Node, OBSERVED_VOLUME};
use crate::flags;

/// The names of the wrapped container's `trainlet exec` settings that inject owns
/// (`parts::exec_env` writes them), besides the aliases of `own::alias_env`.
pub(super) const EXEC_ENV: [&str; 3] = [
    "TRAINLET_OUTPUT_DIR",
    "TRAINLET_METRICS_ADDR",
    "TRAINLET_OBSERVATIONS",
];

/// The wrapped container's settings of `trainlet exec` that inject owns: removed and
/// added again, so that their order and values never depend on an earlier inject.
pub(super) fn is_exec_env(e: &Node) -> bool {
    name_of(e).is_some_and(|n| EXEC_ENV.contains(&n)) || is_alias_env(e)
}

/// A container an earlier inject wrapped (it mounts the handover) that this one does
/// not: its wrapper, the handover and exec's settings are taken out again. Whether it
/// was one. The downward API's POD_NAME and the like stay: they may be the user's.
pub(super) fn unwrap_earlier(c: &mut Node) -> bool {
    let Some(Node::Seq(mounts)) = c.get_mut("volumeMounts") else {
        return false;
    };
    let before = mounts.len();
    mounts.retain(|m| name_of(m) != Some(OBSERVED_VOLUME));
    if mounts.len() == before {
        return false;
    }
    if let Some(Node::Seq(env)) = c.get_mut("env") {
        env.retain(|e| !is_exec_env(e));
    }
    let command: Option<Vec<String>> = c.get("command").and_then(Node::as_seq).and_then(|items| {
        items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect()
    });
    if let Some(command) = command
        && let Wrapper::Own { original, .. } = Wrapper::of(&command)
    {
        c.set(
            "command",
            Node::Seq(original.iter().map(Node::str).collect()),
        );
    }
    true
}

/// `<install-to>/trainlet exec <exec flags> -- <command>`.
pub(super) fn own_wrapper(cfg: &InjectConfig, command: &[String]) -> Vec<String> {
    [
        format!("{}/trainlet", cfg.install_to),
        flags::EXEC.to_string(),
    ]
    .into_iter()
    .chain(cfg.exec_args.iter().cloned())
    .chain(["--".to_string()])
    .chain(command.iter().cloned())
    .collect()
}

/// A user's own exec flags and this inject's: the user's all stay; this inject's
/// are added where the user's do not set them (`--report` among them). Gives the flags,
/// those added, and the user's that differ from this inject's.
pub(super) fn users_flags(
    own: &[String],
    inject: &[String],
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let value_of = |name: &str| -> Option<String> {
        own.iter().enumerate().find_map(|(i, a)| {
            let rest = a.strip_prefix("--")?;
            match rest.split_once('=') {
                Some((n, v)) if n == name => Some(v.to_string()),
                None if rest == name => Some(
                    own.get(i + 1)
                        .filter(|v| !v.starts_with("--"))
                        .cloned()
                        .unwrap_or_default(),
                ),
                _ => None,
            }
        })
    };
    let mut kept = own.to_vec();
    let (mut added, mut ignored) = (Vec::new(), Vec::new());
    for a in inject {
        let Some(name) = flag_name(a) else { continue };
        let value = a.split_once('=').map_or("", |(_, v)| v);
        match value_of(name) {
            None => added.push(a.clone()),
            Some(v) if v == value || name == flags::REPORT => {}
            Some(v) => ignored.push(format!("--{name}={v}")),
        }
    }
    // --report last: the user's flags first, as they wrote them, and an inject's own
    // wrapper begins with --report, so this one is never taken for it.
    added.sort_by_key(|a| flag_name(a) == Some(flags::REPORT));
    kept.extend(added.iter().cloned());
    (kept, added, ignored)
}

/// A container's command, as inject sees a `trainlet exec` in front of it.
pub(super) enum Wrapper<'a> {
    /// `/…/trainlet exec --report [--flag=value …] -- CMD`, with only the flags inject
    /// writes in the order it writes them: an earlier inject's.
    Own {
        flags: &'a [String],
        original: &'a [String],
    },
    /// Any other `trainlet exec [flags] -- CMD`: the user's own.
    Users {
        exe: &'a str,
        flags: &'a [String],
        original: &'a [String],
    },
    None,
}

impl<'a> Wrapper<'a> {
    pub(super) fn of(command: &'a [String]) -> Wrapper<'a> {
        let [exe, exec, rest @ ..] = command else {
            return Wrapper::None;
        };
        if exec != flags::EXEC || !(exe == "trainlet" || exe.ends_with("/trainlet")) {
            return Wrapper::None;
        }
        let Some(end) = rest.iter().position(|a| a == "--") else {
            return Wrapper::None;
        };
        let (exec_flags, original) = (&rest[..end], &rest[end + 1..]);
        if original.is_empty() {
            return Wrapper::None;
        }
        if exe.starts_with('/') && is_own_exec_flags(exec_flags) {
            Wrapper::Own {
                flags: exec_flags,
                original,
            }
        } else {
            Wrapper::Users {
                exe,
                flags: exec_flags,
                original,
            }
        }
    }
}

/// `--report`, then `--flag=value` of [`EXEC_FLAGS`] in that order, each once.
fn is_own_exec_flags(args: &[String]) -> bool {
    let [report, rest @ ..] = args else {
        return false;
    };
    if *report != flags::long(flags::REPORT) {
        return false;
    }
    let mut next = 0;
    for a in rest {
        let Some((name, _)) = a.strip_prefix("--").and_then(|r| r.split_once('=')) else {
            return false;
        };
        let Some(i) = EXEC_FLAGS[next..].iter().position(|f| *f == name) else {
            return false;
        };
        next += i + 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::{Wrapper, users_flags};

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    fn kind(command: &str) -> &'static str {
        match Wrapper::of(&words(command)) {
            Wrapper::Own { .. } => "own",
            Wrapper::Users { .. } => "user's",
            Wrapper::None => "none",
        }
    }

    #[test]
    fn an_earlier_injects_wrapper_is_told_from_the_users_own_by_its_shape() {
        for (command, want) in [
            ("/etc/trainlet/bin/trainlet exec --report -- python", "own"),
            (
                "/run/t/bin/trainlet exec --report --on-peer-change=restart --max-restarts=5 --stall-after=10m -- python",
                "own",
            ),
            // Out of inject's order, not as --flag=value, --report not first, a
            // relative path, or a flag inject does not write: the user's.
            (
                "/etc/trainlet/bin/trainlet exec --report --stall-after=10m --on-peer-change=restart -- python",
                "user's",
            ),
            (
                "/etc/trainlet/bin/trainlet exec --report --stall-after 10m -- python",
                "user's",
            ),
            (
                "/etc/trainlet/bin/trainlet exec --stall-after=10m --report -- python",
                "user's",
            ),
            ("trainlet exec --report -- python", "user's"),
            (
                "/etc/trainlet/bin/trainlet exec --report --restart-backoff=5s -- python",
                "user's",
            ),
            ("python train.py", "none"),
            ("/etc/trainlet/bin/trainlet exec --report --", "none"),
            ("/usr/bin/trainlet init --job=w=a=b", "none"),
        ] {
            assert_eq!(kind(command), want, "{command}");
        }
    }

    #[test]
    fn the_users_flags_stay_and_inject_adds_only_what_they_lack() {
        let (flags, added, ignored) = users_flags(
            &words("--on-peer-change=restart --stall-after 30m"),
            &words("--report --stall-after=10m --max-restarts=5"),
        );
        assert_eq!(
            flags,
            words("--on-peer-change=restart --stall-after 30m --max-restarts=5 --report")
        );
        assert_eq!(added, words("--max-restarts=5 --report"));
        assert_eq!(ignored, words("--stall-after=30m"));
        let (flags, added, ignored) = users_flags(
            &words("--report=true --stall-after=10m"),
            &words("--report --stall-after=10m"),
        );
        assert_eq!(flags, words("--report=true --stall-after=10m"));
        assert!(added.is_empty() && ignored.is_empty());
    }
}
