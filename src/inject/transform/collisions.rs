//! What inject refuses in a pod template: a container or volume of the user's under one
//! of the names inject adds, or a mount of the user's where inject mounts its own.

use super::own::{is_injected_container, is_injected_volume, normal_path};
use super::parts::name_of;
use super::{
    Ctx, INIT_CONTAINER, Node, OBSERVED_VOLUME, SHM_VOLUME, SIDECAR, TOKEN_VOLUME, TransformError,
    VOLUME,
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
}
