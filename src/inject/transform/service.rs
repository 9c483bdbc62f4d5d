//! `--address dns`: pods get DNS names only through a headless Service named after their
//! subdomain (a StatefulSet's `serviceName`), and a Job's pods only with a subdomain.
//! Inject gives a Job without one its own name as subdomain, and adds the headless
//! Service (`publishNotReadyAddresses: true`, so that the names resolve while init
//! waits, before the pods are ready) where the manifests have none.

use std::collections::BTreeMap;

use super::super::yaml::Node;

/// Whether inject writes `--address dns` into init's flags.
pub(super) fn dns(init_args: &[String]) -> bool {
    init_args.iter().any(|a| a == "--address=dns")
}

/// A namespace as written (`None`: the one `kubectl apply` uses) and a name.
type Key = (Option<String>, String);

/// What the manifests have and need of headless Services.
#[derive(Debug, Default)]
pub(super) struct Services {
    /// Every Service in the input, and whether it is headless.
    have: BTreeMap<Key, bool>,
    /// Each Service the pods' DNS names need, with the labels common to the pod
    /// templates that need it (its selector) and the first workload that needs it.
    need: BTreeMap<Key, (BTreeMap<String, String>, String)>,
}

fn namespace(node: &Node) -> Option<String> {
    node.get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Node::as_str)
        .map(str::to_string)
}

fn name(node: &Node) -> Option<&str> {
    node.get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Node::as_str)
}

impl Services {
    /// Records a Service of the input.
    pub(super) fn saw_service(&mut self, node: &Node) {
        let Some(n) = name(node) else { return };
        let headless = node
            .get("spec")
            .and_then(|s| s.get("clusterIP"))
            .and_then(Node::as_str)
            == Some("None");
        self.have.insert((namespace(node), n.to_string()), headless);
    }

    /// Records the Service a workload's pods need for their DNS names, giving a Job's
    /// pod template its name as subdomain where it has none. Returns a note when it
    /// set the subdomain.
    pub(super) fn saw_workload(
        &mut self,
        resource: &Node,
        template: &mut Node,
        what: &str,
    ) -> Option<String> {
        let mut note = None;
        let kind = resource
            .get("kind")
            .and_then(Node::as_str)
            .unwrap_or_default();
        let service = match kind {
            "StatefulSet" => resource
                .get("spec")
                .and_then(|s| s.get("serviceName"))
                .and_then(Node::as_str)
                .map(str::to_string),
            _ => {
                let spec = template.map_entry("spec")?;
                match spec.get("subdomain").and_then(Node::as_str) {
                    Some(s) if !s.is_empty() => Some(s.to_string()),
                    _ if kind == "Job" => {
                        let n = name(resource)?.to_string();
                        spec.set("subdomain", Node::str(n.clone()));
                        note = Some(format!(
                            "set the pod template's subdomain to {n:?}: --address dns needs one for the pods' DNS names"
                        ));
                        Some(n)
                    }
                    _ => None,
                }
            }
        }?;
        let labels: BTreeMap<String, String> =
            match template.get("metadata").and_then(|m| m.get("labels")) {
                Some(Node::Map(entries)) => entries
                    .iter()
                    .filter_map(|(k, v)| Some((k.text.clone(), v.as_str()?.to_string())))
                    .collect(),
                _ => BTreeMap::new(),
            };
        self.need
            .entry((namespace(resource), service))
            .and_modify(|(common, _)| common.retain(|k, v| labels.get(k) == Some(v)))
            .or_insert_with(|| (labels, what.to_string()));
        note
    }

    /// For each Service needed and missing: the Service to add (if one can be), what
    /// the note is about, and the note.
    pub(super) fn missing(&self) -> Vec<(Option<Node>, String, String)> {
        let mut out = Vec::new();
        for ((ns, svc), (labels, what)) in &self.need {
            match self.have.get(&(ns.clone(), svc.clone())) {
                Some(true) => continue,
                Some(false) => out.push((None, what.clone(), format!(
                    "Service {svc:?} is not headless (clusterIP: None), so the pods of {what} get no DNS names under it; make it headless for --address dns"
                ))),
                None if labels.is_empty() => out.push((None, what.clone(), format!(
                    "no headless Service {svc:?} added for {what}: its pod templates share no label to select them by; add one with clusterIP: None and publishNotReadyAddresses: true for --address dns"
                ))),
                None => {
                    let mut metadata = vec![("name", Node::str(svc.clone()))];
                    if let Some(ns) = ns {
                        metadata.push(("namespace", Node::str(ns.clone())));
                    }
                    let service = Node::map([
                        ("apiVersion", Node::str("v1")),
                        ("kind", Node::str("Service")),
                        ("metadata", Node::map(metadata)),
                        (
                            "spec",
                            Node::map([
                                ("clusterIP", Node::str("None")),
                                ("publishNotReadyAddresses", Node::Scalar(super::parts::plain("true"))),
                                (
                                    "selector",
                                    Node::map(
                                        labels.iter().map(|(k, v)| (k.clone(), Node::str(v.clone()))),
                                    ),
                                ),
                            ]),
                        ),
                    ]);
                    out.push((
                        Some(service),
                        format!("v1 Service {svc:?}"),
                        format!(
                            "added: the DNS names of the pods of {what} need a headless Service (--address dns)"
                        ),
                    ));
                }
            }
        }
        out
    }
}
