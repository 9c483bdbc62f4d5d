//! A pod template: the names inject owns, its volumes, init containers, sidecar and
//! the training container's mounts, env and (with --wrap) command.

use super::parts::{
    downward_env, init_container, mount, mount_of, observed_volume, plain, shm_volume, sidecar,
    token_volume, volume,
};
use super::{
    BINARY, Ctx, INIT_CONTAINER, Node, OBSERVED_VOLUME, SHM_PATH, SHM_VOLUME, SIDECAR,
    TOKEN_VOLUME, TransformError, VOLUME, yaml,
};
use crate::flags;

impl Ctx<'_> {
    /// Refuses a pod template whose containers or volumes already use one of the
    /// names inject adds, unless inject added them: replacing the user's own would
    /// lose it without a word.
    pub(super) fn foreign_names(&self, spec: &Node, what: &str) -> Result<(), TransformError> {
        for list in ["initContainers", "containers"] {
            let Some(Node::Seq(items)) = spec.get(list) else {
                continue;
            };
            for c in items {
                let name = name_of(c).unwrap_or_default();
                if [INIT_CONTAINER, SIDECAR].contains(&name) && !is_injected_container(c) {
                    return Err(self.shape(
                        what,
                        format!(
                            "{list} has a container {name:?} that trainlet inject did not add; inject adds its own under that name: rename yours"
                        ),
                    ));
                }
            }
        }
        if let Some(Node::Seq(volumes)) = spec.get("volumes") {
            for v in volumes {
                let name = name_of(v).unwrap_or_default();
                if [VOLUME, OBSERVED_VOLUME, TOKEN_VOLUME, SHM_VOLUME].contains(&name)
                    && !is_injected_volume(name, v)
                {
                    return Err(self.shape(
                        what,
                        format!(
                            "has a volume {name:?} that trainlet inject did not add; inject adds its own under that name: rename yours"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Adds trainlet to a pod template (or a Pod): metadata annotations, the volume, the
    /// init container, the sidecar, the mounts, and --wrap.
    pub(super) fn pod_template(&mut self, t: &mut Node, what: &str) -> Result<(), TransformError> {
        let cfg = self.cfg;
        let annotations = t
            .map_entry("metadata")
            .and_then(|m| m.map_entry("annotations"))
            .ok_or_else(|| self.shape(what, "metadata or its annotations is not a mapping"))?;
        annotations.set("prometheus.io/scrape", Node::str("true"));
        annotations.set(
            "prometheus.io/port",
            Node::str(cfg.metrics_port.to_string()),
        );
        annotations.set("prometheus.io/path", Node::str("/metrics"));

        let Some(spec) = t.map_entry("spec") else {
            return Err(self.shape(what, "spec is not a mapping"));
        };
        self.foreign_names(spec, what)?;
        // New keys go before `containers`, where people expect them to be.
        insert_before(
            spec,
            "serviceAccountName",
            "containers",
            Node::Scalar(plain("")),
        );
        insert_before(spec, "initContainers", "containers", Node::Seq(Vec::new()));
        match spec
            .get("serviceAccountName")
            .and_then(Node::as_str)
            .map(str::to_string)
        {
            None => spec.set("serviceAccountName", Node::str(&cfg.service_account)),
            Some(sa) if sa == "default" => {
                spec.set("serviceAccountName", Node::str(&cfg.service_account))
            }
            Some(sa) if sa == cfg.service_account => {}
            Some(sa) => self.note(
                what.to_string(),
                format!(
                    "keeps serviceAccountName {sa:?}: bind trainlet's Role to it (manifests/rbac.yaml binds {:?})",
                    cfg.service_account
                ),
            ),
        }
        // No token in the training container: its code (and every package it installs)
        // could use it to patch any pod of the namespace. trainlet's own containers get
        // a projected one instead (TOKEN_VOLUME).
        insert_before(
            spec,
            "automountServiceAccountToken",
            "initContainers",
            Node::Scalar(plain("false")),
        );
        spec.set("automountServiceAccountToken", Node::Scalar(plain("false")));

        let volumes = spec
            .seq_entry("volumes")
            .ok_or_else(|| self.shape(what, "spec.volumes is not a list"))?;
        upsert_named(volumes, volume(), VOLUME, None);
        if cfg.wrap.is_some() {
            upsert_named(volumes, observed_volume(), OBSERVED_VOLUME, None);
        }
        upsert_named(volumes, token_volume(), TOKEN_VOLUME, None);
        match &cfg.shm_size {
            Some(size) => upsert_named(volumes, shm_volume(size), SHM_VOLUME, None),
            None => volumes.retain(|v| name_of(v) != Some(SHM_VOLUME)),
        }

        // Regular containers: drop a classic sidecar from an earlier inject, mount the
        // volume read-only into the others, and wrap the one named by --wrap.
        let containers = spec
            .seq_entry("containers")
            .ok_or_else(|| self.shape(what, "spec.containers is not a list"))?;
        containers.retain(|c| name_of(c) != Some(SIDECAR));
        for c in containers.iter_mut() {
            let name = name_of(c).unwrap_or_default().to_string();
            self.containers_seen.push(name.clone());
            if !matches!(c, Node::Map(_)) {
                continue;
            }
            let mounts = c.seq_entry("volumeMounts").ok_or_else(|| {
                self.shape(
                    what,
                    format!("volumeMounts of container {name:?} is not a list"),
                )
            })?;
            upsert_named(mounts, mount(&cfg.output_dir, true), VOLUME, None);
            self.shm(mounts, what, &name);
            if cfg.wrap.as_deref() == Some(name.as_str()) {
                upsert_named(
                    mounts,
                    mount_of(OBSERVED_VOLUME, &cfg.observations_dir, false),
                    OBSERVED_VOLUME,
                    None,
                );
                self.wrap(c, what, &name)?;
                *self.wrapped += 1;
            }
        }
        if cfg.classic_sidecar {
            containers.push(sidecar(cfg));
        }

        let inits = spec
            .seq_entry("initContainers")
            .ok_or_else(|| self.shape(what, "spec.initContainers is not a list"))?;
        inits.retain(|c| !matches!(name_of(c), Some(INIT_CONTAINER | SIDECAR)));
        inits.insert(0, init_container(cfg));
        if !cfg.classic_sidecar {
            inits.insert(1, sidecar(cfg));
        }
        Ok(())
    }

    /// `--shm-size`: mounts the memory-backed volume at /dev/shm, unless the container
    /// mounts something else there (its own choice, kept, with a note); without
    /// `--shm-size`, removes the mount an earlier inject added.
    fn shm(&mut self, mounts: &mut Vec<Node>, what: &str, container: &str) {
        let Some(_) = &self.cfg.shm_size else {
            mounts.retain(|m| name_of(m) != Some(SHM_VOLUME));
            return;
        };
        let own = mounts.iter().find(|m| {
            m.get("mountPath").and_then(Node::as_str) == Some(SHM_PATH)
                && name_of(m) != Some(SHM_VOLUME)
        });
        if let Some(own) = own {
            let volume = name_of(own).unwrap_or_default().to_string();
            self.note(
                what.to_string(),
                format!(
                    "keeps container {container:?}'s own {SHM_PATH} (volume {volume:?}); --shm-size applies to the others"
                ),
            );
            return;
        }
        upsert_named(
            mounts,
            mount_of(SHM_VOLUME, SHM_PATH, false),
            SHM_VOLUME,
            None,
        );
    }

    /// `command: [trainlet exec --report -- <command>]`, `args` unchanged, so the
    /// container runs exactly what it ran before, under trainlet.
    pub(super) fn wrap(
        &mut self,
        c: &mut Node,
        what: &str,
        name: &str,
    ) -> Result<(), TransformError> {
        let cfg = self.cfg;
        let exe = format!("{}/trainlet", cfg.install_to);
        let prefix: Vec<&str> = [exe.as_str(), flags::EXEC]
            .into_iter()
            .chain(cfg.exec_args.iter().map(String::as_str))
            .chain(["--"])
            .collect();
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
        // Already wrapped by an earlier inject (maybe with another --install-to or other
        // exec flags): unwrap first, so that injecting again never wraps twice.
        let original = unwrapped(&command);
        let wrapped: Vec<Node> = prefix
            .iter()
            .map(|s| Node::str(*s))
            .chain(original.iter().map(Node::str))
            .collect();
        c.set("command", Node::Seq(wrapped));
        let env = c
            .seq_entry("env")
            .ok_or_else(|| self.shape(what, format!("env of container {name:?} is not a list")))?;
        for e in downward_env() {
            upsert_named(env, e.clone(), name_of(&e).unwrap_or_default(), None);
        }
        // Settings of `trainlet exec` that inject owns: removed and added again, so
        // their order and values never depend on an earlier inject.
        env.retain(|e| {
            !matches!(
                name_of(e),
                Some("TRAINLET_OUTPUT_DIR" | "TRAINLET_METRICS_ADDR" | "TRAINLET_OBSERVATIONS")
            )
        });
        for (name, value) in &cfg.wrap_env {
            env.push(Node::map([
                ("name", Node::str(name)),
                ("value", Node::str(value)),
            ]));
        }
        // exec hands its observations to the sidecar instead of publishing them.
        env.push(Node::map([
            ("name", Node::str("TRAINLET_OBSERVATIONS")),
            ("value", Node::str(&cfg.observations_dir)),
        ]));
        Ok(())
    }
}

/// A container inject added: it runs trainlet's `init` or `sidecar`.
pub(super) fn is_injected_container(c: &Node) -> bool {
    match c.get("command") {
        Some(Node::Seq(cmd)) => {
            cmd.first().and_then(Node::as_str) == Some(BINARY)
                && matches!(cmd.get(1).and_then(Node::as_str), Some("init" | "sidecar"))
        }
        _ => false,
    }
}

/// A volume inject added, by its kind: trainlet's files and the handover are
/// emptyDirs, the token a projected ServiceAccount token.
pub(super) fn is_injected_volume(name: &str, v: &Node) -> bool {
    match name {
        TOKEN_VOLUME => v
            .get("projected")
            .and_then(|p| p.get("sources"))
            .is_some_and(|s| match s {
                Node::Seq(items) => items.iter().any(|i| i.get("serviceAccountToken").is_some()),
                _ => false,
            }),
        _ => v.get("emptyDir").is_some(),
    }
}

/// The command an earlier inject wrapped: `<dir>/trainlet exec <flags> -- CMD...` gives
/// CMD; any other command is itself.
pub(super) fn unwrapped(command: &[String]) -> &[String] {
    match command {
        [exe, exec, rest @ ..] if exe.ends_with("/trainlet") && exec == flags::EXEC => {
            let Some(end) = rest.iter().position(|a| a == "--") else {
                return command;
            };
            let (exec_flags, original) = (&rest[..end], &rest[end + 1..]);
            if original.is_empty() || !exec_flags.iter().all(|f| f.starts_with("--")) {
                return command;
            }
            original
        }
        _ => command,
    }
}

/// Adds `key` (when absent) just before `before`, or at the end.
pub(super) fn insert_before(map: &mut Node, key: &str, before: &str, value: Node) {
    let Node::Map(entries) = map else { return };
    if entries.iter().any(|(k, _)| k.text == key) {
        return;
    }
    let at = entries
        .iter()
        .position(|(k, _)| k.text == before)
        .unwrap_or(entries.len());
    entries.insert(at, (yaml::Scalar::string(key), value));
}

pub(super) fn name_of(n: &Node) -> Option<&str> {
    n.get("name").and_then(Node::as_str)
}

/// Replaces the item named `name` in place, or appends (or inserts at `at`).
pub(super) fn upsert_named(items: &mut Vec<Node>, item: Node, name: &str, at: Option<usize>) {
    if let Some(existing) = items.iter_mut().find(|i| name_of(i) == Some(name)) {
        *existing = item;
    } else if let Some(i) = at {
        items.insert(i.min(items.len()), item);
    } else {
        items.push(item);
    }
}
