//! What `status` reads: the Job or JobSet, the pods that the selectors match, and those
//! pods' Events. A get and a few lists, nothing watched, nothing written.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client};
use serde_json::Value;

use super::{Kind, NewestEvents};
use crate::kube::{KubeError, classify};

/// Events are listed this many at a time, so that a namespace with many of them is
/// read in bounded pieces; of each page only the newest Event per pod is kept.
const EVENTS_PAGE: u32 = 500;

fn resource(kind: Kind) -> (ApiResource, &'static str) {
    match kind {
        Kind::Job => (ApiResource::erase::<Job>(&()), "jobs.batch"),
        Kind::JobSet => (
            ApiResource {
                group: "jobset.x-k8s.io".into(),
                version: "v1alpha2".into(),
                api_version: "jobset.x-k8s.io/v1alpha2".into(),
                kind: "JobSet".into(),
                plural: "jobsets".into(),
            },
            "jobsets.jobset.x-k8s.io",
        ),
    }
}

/// The Job or JobSet `name` in `namespace` as JSON, or `None` where there is none (a
/// cluster without the JobSet CRD has no JobSet either).
pub async fn object(
    client: &Client,
    namespace: &str,
    kind: Kind,
    name: &str,
) -> Result<Option<Value>, KubeError> {
    let (ar, resource) = resource(kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    match api.get(name).await {
        Ok(obj) => Ok(Some(serde_json::to_value(obj).expect("plain data"))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(classify(&e, "get", resource, namespace)),
    }
}

/// The pods any of `selectors` matches in `namespace`, each once.
pub async fn pods(
    client: &Client,
    namespace: &str,
    selectors: &[String],
) -> Result<Vec<Pod>, KubeError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for sel in selectors {
        let list = api
            .list(&ListParams::default().labels(sel))
            .await
            .map_err(|e| classify(&e, "list", "pods", namespace))?;
        for p in list {
            if seen.insert(p.metadata.uid.clone().unwrap_or_default()) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The newest Event (events.k8s.io/v1; the kubelet's and trainlet's alike) about each
/// of `pods`: the namespace's Events about pods, read a page at a time.
pub async fn events(
    client: &Client,
    namespace: &str,
    pods: &[Pod],
) -> Result<Vec<Event>, KubeError> {
    let mut newest = NewestEvents::new(pods);
    if pods.is_empty() {
        return Ok(newest.into_events());
    }
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut params = ListParams::default()
        .fields("regarding.kind=Pod")
        .limit(EVENTS_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| classify(&e, "list", "events.events.k8s.io", namespace))?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        for e in page.items {
            newest.add(e);
        }
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(newest.into_events()),
        }
    }
}
