//! A pod template: the names inject owns, its volumes, init containers, sidecar and
//! the training container's mounts, env and (with --wrap) command.

use super::hostnet::is_host_network;
use super::own::{Earlier, normal_path};
use super::parts::name_of;
use super::parts::{
    init_container, mount, mount_of, observed_volume, plain, scrape_annotations, shm_volume,
    sidecar, token_volume, volume,
};
use super::wrapper::unwrap_earlier;
use super::{
    Ctx, DEFAULT_TOKEN_PREFIX, INIT_CONTAINER, InjectConfig, Node, OBSERVED_VOLUME, SHM_PATH,
    SHM_VOLUME, SIDECAR, TOKEN_VOLUME, TransformError, VOLUME, yaml,
};
use crate::flags;

impl Ctx<'_> {
    /// Adds trainlet to a pod template (or a Pod): metadata annotations, the volume, the
    /// init container, the sidecar, the mounts, and --wrap.
    pub(super) fn pod_template(&mut self, t: &mut Node, what: &str) -> Result<(), TransformError> {
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
        // New keys go before `containers`, where people expect them to be.
        insert_before(
            spec,
            "serviceAccountName",
            "containers",
            Node::Scalar(plain("")),
        );
        insert_before(spec, "initContainers", "containers", Node::Seq(Vec::new()));
        let users_sa = self.service_account(spec, what);
        self.volumes(spec, what, users_sa)?;
        let mut dropped = self.containers(spec, what, own, users_sa)?;
        self.init_containers(spec, what, own, users_sa)?;
        dropped.extend(earlier.dropped(own));
        self.note_dropped(what, dropped);
        Ok(())
    }

    /// The pod's ServiceAccount: trainlet's, unless the user's own is named (workload
    /// identity, a cloud bucket's access), which is kept with its token in the pod's
    /// containers, since their code needs it. Whether the user's is kept.
    fn service_account(&mut self, spec: &mut Node, what: &str) -> bool {
        let cfg = self.cfg;
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
        users_sa
    }

    /// trainlet's volumes in, an earlier inject's that this one does not use out, and
    /// the default token's out unless the user's ServiceAccount is kept.
    fn volumes(
        &mut self,
        spec: &mut Node,
        what: &str,
        users_sa: bool,
    ) -> Result<(), TransformError> {
        let cfg = self.cfg;
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
        Ok(())
    }

    /// Regular containers: drop a classic sidecar from an earlier inject, mount the
    /// volume read-only into the others, and wrap the one named by --wrap. The flags of
    /// an earlier inject's wrapper that this one drops.
    fn containers(
        &mut self,
        spec: &mut Node,
        what: &str,
        own: &InjectConfig,
        users_sa: bool,
    ) -> Result<Vec<String>, TransformError> {
        let cfg = self.cfg;
        let mut dropped: Vec<String> = Vec::new();
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
        self.shm_unused(spec, what);
        Ok(dropped)
    }

    /// `--shm-size` where every container has its own /dev/shm: the volume would be
    /// mounted nowhere, so it goes, with a note.
    fn shm_unused(&mut self, spec: &mut Node, what: &str) {
        let used = spec
            .get("containers")
            .and_then(Node::as_seq)
            .into_iter()
            .flatten()
            .any(|c| {
                c.get("volumeMounts")
                    .and_then(Node::as_seq)
                    .is_some_and(|m| m.iter().any(|m| name_of(m) == Some(SHM_VOLUME)))
            });
        if self.cfg.shm_size.is_none() || used {
            return;
        }
        if let Some(Node::Seq(volumes)) = spec.get_mut("volumes") {
            volumes.retain(|v| name_of(v) != Some(SHM_VOLUME));
        }
        self.note(
            what.to_string(),
            format!("adds no {SHM_VOLUME} volume: every container mounts its own {SHM_PATH}"),
        );
    }

    /// trainlet-init and the sidecar first, then the user's init containers (without
    /// the default token's mount unless the user's ServiceAccount is kept).
    fn init_containers(
        &mut self,
        spec: &mut Node,
        what: &str,
        own: &InjectConfig,
        users_sa: bool,
    ) -> Result<(), TransformError> {
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
        if !self.cfg.classic_sidecar {
            inits.insert(1, sidecar(own));
        }
        Ok(())
    }

    /// A note naming the flags of an earlier inject that this one drops, each once.
    fn note_dropped(&mut self, what: &str, mut dropped: Vec<String>) {
        let mut seen = Vec::new();
        dropped.retain(|d| {
            let new = !seen.contains(d);
            seen.push(d.clone());
            new
        });
        if dropped.is_empty() {
            return;
        }
        let it = if dropped.len() == 1 { "it" } else { "them" };
        self.note(
            what.to_string(),
            format!(
                "drops {} of an earlier inject: not in this one's flags, so the default applies; pass {it} again to keep {it}",
                dropped.join(" ")
            ),
        );
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
