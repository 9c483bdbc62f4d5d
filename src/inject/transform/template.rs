//! A pod template: the names inject owns, its volumes, init containers, sidecar and
//! the training container's mounts, env and (with --wrap) command.

use super::hostnet::is_host_network;
use super::own::{
    Earlier, alias_env, dropped_flags, is_injected_container, is_injected_volume, normal_path,
    same_env,
};
use super::parts::name_of;
use super::parts::{
    downward_env, exec_env, init_container, mount, mount_of, observed_volume, plain,
    scrape_annotations, shm_volume, sidecar, token_volume, volume,
};
use super::wrapper::{Wrapper, is_exec_env, own_wrapper, unwrap_earlier, users_flags};
use super::{
    Ctx, DEFAULT_TOKEN_PREFIX, INIT_CONTAINER, InjectConfig, Node, OBSERVED_VOLUME, SHM_PATH,
    SHM_VOLUME, SIDECAR, TOKEN_VOLUME, TransformError, VOLUME, yaml,
};
use crate::flags;

impl Ctx<'_> {
    /// Refuses a pod template whose containers or volumes already use one of the
    /// names inject adds, unless inject added them (by their shape, never by the name
    /// alone): replacing the user's own would lose it without a word. Refuses a
    /// container that mounts something of its own where inject mounts trainlet's
    /// volumes: the API server rejects two mounts at one path.
    pub(super) fn refuse_collisions(&self, spec: &Node, what: &str) -> Result<(), TransformError> {
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
                            "has a volume {name:?} that trainlet inject did not add; inject adds its own under that name: rename yours (and the volumeMounts that use it)"
                        ),
                    ));
                }
            }
        }
        let Some(Node::Seq(containers)) = spec.get("containers") else {
            return Ok(());
        };
        for c in containers.iter().filter(|c| !is_injected_container(c)) {
            let name = name_of(c).unwrap_or_default();
            let Some(Node::Seq(mounts)) = c.get("volumeMounts") else {
                continue;
            };
            for m in mounts {
                let volume = name_of(m).unwrap_or_default();
                if [VOLUME, OBSERVED_VOLUME].contains(&volume) {
                    continue;
                }
                let Some(path) = m.get("mountPath").and_then(Node::as_str) else {
                    continue;
                };
                let path = normal_path(path);
                let fix = if path == self.cfg.output_dir {
                    format!(
                        "where inject mounts trainlet's files (--{}): give inject another --{}, e.g. /run/trainlet, or mount yours elsewhere",
                        flags::OUTPUT_DIR,
                        flags::OUTPUT_DIR
                    )
                } else if self.cfg.wrap.as_deref() == Some(name)
                    && path == self.cfg.observations_dir
                {
                    format!(
                        "where inject mounts the wrapped command's handover to the sidecar (--{}): mount yours elsewhere",
                        flags::WRAP
                    )
                } else {
                    continue;
                };
                return Err(self.shape(
                    what,
                    format!("container {name:?} mounts volume {volume:?} at {path}, {fix}"),
                ));
            }
        }
        Ok(())
    }

    /// Adds trainlet to a pod template (or a Pod): metadata annotations, the volume, the
    /// init container, the sidecar, the mounts, and --wrap.
    pub(super) fn pod_template(&mut self, t: &mut Node, what: &str) -> Result<(), TransformError> {
        let cfg = self.cfg;
        let own = &self.template_config(t, what)?;
        let annotations = t
            .map_entry("metadata")
            .and_then(|m| m.map_entry("annotations"))
            .ok_or_else(|| self.shape(what, "metadata or its annotations is not a mapping"))?;
        for (key, value) in scrape_annotations(own) {
            annotations.set(key, Node::str(value));
        }

        let Some(spec) = t.map_entry("spec") else {
            return Err(self.shape(what, "spec is not a mapping"));
        };
        if own.host_network {
            self.dns_policy(spec, what);
        }
        let earlier = Earlier::of(spec);
        let mut dropped: Vec<String> = Vec::new();
        // New keys go before `containers`, where people expect them to be.
        insert_before(
            spec,
            "serviceAccountName",
            "containers",
            Node::Scalar(plain("")),
        );
        insert_before(spec, "initContainers", "containers", Node::Seq(Vec::new()));
        // The user's own ServiceAccount (workload identity, a cloud bucket's access) is
        // kept, and with it its token in the pod's containers, which their code needs.
        let users_sa = match spec
            .get("serviceAccountName")
            .and_then(Node::as_str)
            .map(str::to_string)
        {
            None => {
                spec.set("serviceAccountName", Node::str(&cfg.service_account));
                false
            }
            Some(sa) if sa == "default" => {
                spec.set("serviceAccountName", Node::str(&cfg.service_account));
                false
            }
            Some(sa) if sa == cfg.service_account => false,
            Some(sa) => {
                self.note(
                    what.to_string(),
                    format!(
                        "keeps serviceAccountName {sa:?} and its token in the pod's containers: bind trainlet's Role to it (manifests/rbac.yaml binds {:?}); the token then has trainlet's rights too (docs/security.md)",
                        cfg.service_account
                    ),
                );
                true
            }
        };
        // Else no token in the training container: its code (and every package it
        // installs) could use it to patch any pod of the namespace. trainlet's own
        // containers get a projected one instead (TOKEN_VOLUME).
        if !users_sa {
            insert_before(
                spec,
                "automountServiceAccountToken",
                "initContainers",
                Node::Scalar(plain("false")),
            );
            spec.set("automountServiceAccountToken", Node::Scalar(plain("false")));
        }

        let volumes = spec
            .seq_entry("volumes")
            .ok_or_else(|| self.shape(what, "spec.volumes is not a list"))?;
        upsert_named(volumes, volume(), VOLUME, None);
        match cfg.wrap {
            Some(_) => upsert_named(volumes, observed_volume(), OBSERVED_VOLUME, None),
            None => volumes.retain(|v| name_of(v) != Some(OBSERVED_VOLUME)),
        }
        upsert_named(volumes, token_volume(), TOKEN_VOLUME, None);
        let tokens: Vec<String> = volumes
            .iter()
            .filter_map(name_of)
            .filter(|n| !users_sa && n.starts_with(DEFAULT_TOKEN_PREFIX))
            .map(str::to_string)
            .collect();
        volumes.retain(|v| !name_of(v).is_some_and(|n| tokens.iter().any(|t| t == n)));
        if !tokens.is_empty() {
            self.note(
                what.to_string(),
                format!(
                    "drops the default token's volume {} and its mounts (a pod read back from the API server): only trainlet's own containers get a token",
                    tokens.join(", ")
                ),
            );
        }
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
            if !users_sa {
                drop_default_token(mounts);
            }
            upsert_named(mounts, mount(&cfg.output_dir, true), VOLUME, None);
            self.shm(mounts, what, &name);
            if cfg.wrap.as_deref() == Some(name.as_str()) {
                upsert_named(
                    mounts,
                    mount_of(OBSERVED_VOLUME, &cfg.observations_dir, false),
                    OBSERVED_VOLUME,
                    None,
                );
                self.wrap(c, what, &name, &mut dropped)?;
                *self.wrapped += 1;
            } else if unwrap_earlier(c) {
                dropped.push(flags::with_value(flags::WRAP, &name));
            }
        }
        if cfg.classic_sidecar {
            containers.push(sidecar(own));
        }
        // `--shm-size` where every container has its own /dev/shm: the volume would be
        // mounted nowhere.
        let shm_used = containers.iter().any(|c| {
            c.get("volumeMounts")
                .and_then(Node::as_seq)
                .is_some_and(|m| m.iter().any(|m| name_of(m) == Some(SHM_VOLUME)))
        });
        if cfg.shm_size.is_some() && !shm_used {
            if let Some(Node::Seq(volumes)) = spec.get_mut("volumes") {
                volumes.retain(|v| name_of(v) != Some(SHM_VOLUME));
            }
            self.note(
                what.to_string(),
                format!("adds no {SHM_VOLUME} volume: every container mounts its own {SHM_PATH}"),
            );
        }

        let inits = spec
            .seq_entry("initContainers")
            .ok_or_else(|| self.shape(what, "spec.initContainers is not a list"))?;
        inits.retain(|c| !matches!(name_of(c), Some(INIT_CONTAINER | SIDECAR)));
        for c in inits.iter_mut().filter(|_| !users_sa) {
            if let Some(Node::Seq(mounts)) = c.get_mut("volumeMounts") {
                drop_default_token(mounts);
            }
        }
        inits.insert(0, init_container(own));
        if !cfg.classic_sidecar {
            inits.insert(1, sidecar(own));
        }
        dropped.extend(earlier.dropped(own));
        let mut seen = Vec::new();
        dropped.retain(|d| {
            let new = !seen.contains(d);
            seen.push(d.clone());
            new
        });
        if !dropped.is_empty() {
            let it = if dropped.len() == 1 { "it" } else { "them" };
            self.note(
                what.to_string(),
                format!(
                    "drops {} of an earlier inject: not in this one's flags, so the default applies; pass {it} again to keep {it}",
                    dropped.join(" ")
                ),
            );
        }
        Ok(())
    }

    /// This inject's config for one pod template: with the frameworks the wrapped
    /// command's launcher asks for, where `--framework` is not given, and on
    /// hostNetwork with the ports of [`super::hostnet`]. Refuses the template's
    /// collisions first.
    fn template_config(&mut self, t: &Node, what: &str) -> Result<InjectConfig, TransformError> {
        let spec = match t.get("spec") {
            Some(spec @ Node::Map(_)) => spec,
            _ => return Err(self.shape(what, "spec is not a mapping")),
        };
        self.refuse_collisions(spec, what)?;
        let mut own = self
            .infer_frameworks(spec, what)
            .unwrap_or_else(|| self.cfg.clone());
        if is_host_network(spec) {
            self.host_ports(&mut own, spec, what);
        }
        Ok(own)
    }

    /// Without `--framework`: this inject's config with the frameworks that the wrapped
    /// container's launcher asks for, and a note that names them, the container and
    /// the launcher; `None` where it names no launcher (or nothing is wrapped), and
    /// this inject's config stays.
    fn infer_frameworks(&mut self, spec: &Node, what: &str) -> Option<InjectConfig> {
        let cfg = self.cfg;
        let name = cfg.wrap.as_deref()?;
        let c = spec
            .get("containers")
            .and_then(Node::as_seq)?
            .iter()
            .find(|c| name_of(c) == Some(name))?;
        let strings = |key: &str| -> Vec<String> {
            c.get(key)
                .and_then(Node::as_seq)
                .map(|items| {
                    items
                        .iter()
                        .filter_map(Node::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (inferred, seen) = cfg.inferred(&strings("command"), &strings("args"))?;
        self.note(
            what.to_string(),
            format!(
                "infers --{} {} from container {name:?}'s command ({}): pass --{} to choose",
                flags::FRAMEWORK,
                seen.value(),
                seen.launchers.join(", "),
                flags::FRAMEWORK
            ),
        );
        Some(inferred)
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
            m.get("mountPath").and_then(Node::as_str).map(normal_path) == Some(SHM_PATH)
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
        let cfg = self.cfg;
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
        let wrapped = match Wrapper::of(&command) {
            Wrapper::Own { flags, original } => {
                dropped.extend(dropped_flags(flags, &cfg.exec_args));
                own_wrapper(cfg, original)
            }
            Wrapper::Users {
                exe,
                flags,
                original,
            } => {
                let (kept, added, ignored) = users_flags(flags, &cfg.exec_args);
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
            Wrapper::None => own_wrapper(cfg, &command),
        };
        c.set(
            "command",
            Node::Seq(wrapped.iter().map(Node::str).collect()),
        );
        let env = c
            .seq_entry("env")
            .ok_or_else(|| self.shape(what, format!("env of container {name:?} is not a list")))?;
        // Settings of `trainlet exec` that inject owns: removed and added again, so
        // their order and values never depend on an earlier inject.
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
        env.extend(exec_env(cfg));
        Ok(())
    }
}

/// Takes the default token's mounts out of a container's `volumeMounts`.
fn drop_default_token(mounts: &mut Vec<Node>) {
    mounts.retain(|m| !name_of(m).is_some_and(|n| n.starts_with(DEFAULT_TOKEN_PREFIX)));
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
