//! `--wrap`: the training container's command under `trainlet exec`, and the env that
//! exec reads the pod from.

use super::own::{alias_env, dropped_flags, same_env};
use super::parts::{downward_env, exec_env, name_of};
use super::wrapper::{Wrapper, is_exec_env, own_wrapper, users_flags};
use super::{Ctx, Node, TransformError};
use crate::flags;

impl Ctx<'_> {
    /// `command: [trainlet exec --report -- <command>]`, `args` unchanged, so the
    /// container runs exactly what it ran before, under trainlet. A command an earlier
    /// inject wrapped is unwrapped first (its exec flags give way to this inject's, and
    /// those it drops land in `dropped`); the user's own `trainlet exec` is kept with
    /// its flags.
    pub(super) fn wrap(
        &mut self,
        c: &mut Node,
        what: &str,
        name: &str,
        dropped: &mut Vec<String>,
    ) -> Result<(), TransformError> {
        let command = self.command_of(c, what, name)?;
        let wrapped = match Wrapper::of(&command) {
            Wrapper::Own { flags, original } => {
                dropped.extend(dropped_flags(flags, &self.cfg.exec_args));
                own_wrapper(self.cfg, original)
            }
            Wrapper::Users {
                exe,
                flags,
                original,
            } => self.keep_users_exec(what, name, exe, flags, original),
            Wrapper::None => own_wrapper(self.cfg, &command),
        };
        c.set(
            "command",
            Node::Seq(wrapped.iter().map(Node::str).collect()),
        );
        let env = c
            .seq_entry("env")
            .ok_or_else(|| self.shape(what, format!("env of container {name:?} is not a list")))?;
        self.wrap_env(env, what, name);
        Ok(())
    }

    /// The container's command, which inject needs: without one, the image's
    /// entrypoint runs, which inject cannot see.
    fn command_of(&self, c: &Node, what: &str, name: &str) -> Result<Vec<String>, TransformError> {
        let command: Vec<String> = match c.get("command") {
            None => Vec::new(),
            Some(n) if n.is_null() => Vec::new(),
            Some(Node::Seq(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    self.shape(
                        what,
                        format!("command of container {name:?} is not a list of strings"),
                    )
                })?,
            Some(_) => {
                return Err(
                    self.shape(what, format!("command of container {name:?} is not a list"))
                );
            }
        };
        if command.is_empty() {
            return Err(TransformError::ImplicitEntrypoint {
                doc: self.doc,
                what: what.to_string(),
                container: name.to_string(),
            });
        }
        Ok(command)
    }

    /// The user's own `trainlet exec`, kept with its flags, with this inject's added
    /// where the user's has none; a note says which.
    fn keep_users_exec(
        &mut self,
        what: &str,
        name: &str,
        exe: &str,
        flags: &[String],
        original: &[String],
    ) -> Vec<String> {
        let (kept, added, ignored) = users_flags(flags, &self.cfg.exec_args);
        let mut text = format!(
            "keeps container {name:?}'s own `trainlet exec` and its flags{}",
            if added.is_empty() {
                String::new()
            } else {
                format!(", adding {}", added.join(" "))
            }
        );
        if !ignored.is_empty() {
            text.push_str(&format!(
                "; its own {} stay{} over this inject's",
                ignored.join(" "),
                if ignored.len() == 1 { "s" } else { "" }
            ));
        }
        self.note(what.to_string(), text);
        [exe.to_string(), flags::EXEC.to_string()]
            .into_iter()
            .chain(kept)
            .chain(["--".to_string()])
            .chain(original.iter().cloned())
            .collect()
    }

    /// The wrapped container's env: exec's settings (removed and added again, so that
    /// their order and values never depend on an earlier inject) and the pod's fields
    /// through the downward API, the user's own variables of those names kept.
    fn wrap_env(&mut self, env: &mut Vec<Node>, what: &str, name: &str) {
        env.retain(|e| !is_exec_env(e));
        let (mut kept, mut aliases) = (Vec::new(), Vec::new());
        for e in downward_env() {
            let env_name = name_of(&e).unwrap_or_default().to_string();
            match env.iter_mut().find(|u| name_of(u) == Some(&env_name)) {
                None => env.push(e),
                Some(u) if same_env(u, &e) => *u = e,
                // The user's own: kept, and trainlet exec reads the pod's from its
                // TRAINLET_ variable, which wins over the plain one.
                Some(_) => match alias_env(&env_name) {
                    Some((alias, node)) => {
                        kept.push(format!("{env_name} (its trainlet exec reads {alias})"));
                        aliases.push(node);
                    }
                    None => kept.push(env_name),
                },
            }
        }
        env.extend(aliases);
        if !kept.is_empty() {
            self.note(
                what.to_string(),
                format!("keeps container {name:?}'s own {}", kept.join(", ")),
            );
        }
        env.extend(exec_env(self.cfg));
    }
}
