//! The resolver pod's reporter publishes the cluster again (coordinated mode): when the
//! peer watch sees a task's pod lost or replaced, `trainlet.io/resolution` on the own
//! pod gets the cluster as it stands now, with a higher generation. The other pods'
//! reporters watch only this pod; a replacement pod's `trainlet init` finds itself in
//! it within seconds.
//!
//! What is published is compared by content with what the pod carries, so a restarted
//! reporter, or one that evaluates again before its patch is out, publishes nothing
//! twice; the generation is only ever raised.

use tracing::{info, warn};

use super::Engine;
use crate::cluster::published::{self, ANNOTATION, Resolution};
use crate::event::Event;
use crate::reason::Reason;

#[derive(Default)]
pub(super) struct Republish {
    /// The content last encoded and its text: the same content keeps the same text.
    last: Option<(Resolution, String)>,
    /// Why the last encoding failed, once announced.
    failed: Option<String>,
}

impl Republish {
    /// Why the cluster cannot be published again, while it cannot: the pod is degraded.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }
}

impl Engine {
    /// The resolution the own pod should carry now; `None` where this is not the
    /// resolver pod's reporter, or before its peer watch has listed every peer.
    pub(super) fn resolution(&mut self) -> Option<String> {
        let (cluster, lost, types) = self.role.peers()?.republish()?;
        let wanted = Resolution {
            cluster,
            generation: 0,
            lost,
        };
        if let Some((content, text)) = &self.republish.last
            && content.same_content(&wanted)
        {
            return Some(text.clone());
        }
        let namespace = self.link.as_ref().map(|l| l.id.namespace.clone())?;
        // What the pod carries: as the own pod's watch last showed it (another agent of
        // this pod, exec's init resolving again, may have published since), else as
        // this reporter last patched it.
        let carried_text = self
            .view
            .pod
            .as_ref()
            .and_then(|p| p.metadata.annotations.as_ref()?.get(ANNOTATION).cloned())
            .or_else(|| self.outbox.carried(ANNOTATION).map(str::to_string));
        let carried = carried_text
            .as_deref()
            .and_then(|t| published::decode(t, &namespace).ok());
        if let (Some(c), Some(text)) = (&carried, &carried_text)
            && c.same_content(&wanted)
        {
            self.republish.last = Some((c.clone(), text.clone()));
            return Some(text.clone());
        }
        let previous = [
            carried.as_ref().map(|c| c.generation),
            self.republish.last.as_ref().map(|(c, _)| c.generation),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
        let now_ms = crate::time::now_ms();
        let generation = published::next_generation(previous, now_ms);
        let order: Vec<&str> = types.iter().map(String::as_str).collect();
        match published::encode(&wanted.cluster, &order, generation, &wanted.lost) {
            Ok(text) => {
                info!(
                    generation,
                    lost = ?wanted.lost,
                    bytes = text.len(),
                    "publishing the cluster again for the other pods"
                );
                self.republish.failed = None;
                self.republish.last = Some((
                    Resolution {
                        generation,
                        ..wanted
                    },
                    text.clone(),
                ));
                self.outbox.hurry();
                Some(text)
            }
            Err(e) => {
                let note = format!(
                    "cannot publish the cluster again for the other pods: {e}; they keep the cluster published before"
                );
                if self.republish.failed.as_deref() != Some(note.as_str()) {
                    warn!("{note}");
                    self.record(Event::warning(Reason::ClusterTooLarge, note.clone()), true);
                    self.republish.failed = Some(note);
                }
                carried_text
            }
        }
    }
}
