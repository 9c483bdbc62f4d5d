//! What init tells its pod: the own task, and on the resolver of a coordinated job the
//! whole cluster for the followers, in one patch that must fit beside the pod's other
//! annotations and must arrive.

use std::collections::BTreeMap;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use super::{Found, InitError, Role};
use crate::cluster::Resolver;
use crate::cluster::published::{self, ANNOTATION, Coordination, CoordinationRole};
use crate::publish::{self, PublishError, Publisher, keys};

/// The annotations to write and the part `cluster.json` records.
pub(super) struct Plan {
    pub annotation: BTreeMap<String, Option<String>>,
    pub coordination: Option<Coordination>,
}

/// The resolver's patch carries the task and, for the followers, the whole cluster; it
/// must fit beside the pod's other annotations, checked before anything is written,
/// since the followers would wait for it until their timeout.
pub(super) fn plan(
    target: Option<&Role>,
    resolver: &Resolver,
    own: &Pod,
    namespace: &str,
    found: &Found,
) -> Result<Plan, InitError> {
    let task = &found.task;
    let mut annotation = BTreeMap::from([(
        keys::TASK.to_string(),
        Some(format!("{}/{}", task.task_type, task.index)),
    )]);
    let types: Vec<String> = resolver.jobs.iter().map(|j| j.task_type.clone()).collect();
    let coordination = match target {
        None | Some(Role::Alone) => None,
        Some(Role::Resolver) => {
            let previous = own
                .annotations()
                .get(ANNOTATION)
                .and_then(|t| published::decode(t, namespace).ok())
                .map_or(0, |r| r.generation);
            let generation = published::next_generation(previous, now_ms());
            let order: Vec<&str> = types.iter().map(String::as_str).collect();
            let text = published::encode(&found.cluster, &order, generation, &[])
                .map_err(|e| InitError::TooLarge(e.to_string()))?;
            annotation.insert(ANNOTATION.to_string(), Some(text));
            publish::check_total(own.annotations(), &annotation)
                .map_err(|e| InitError::TooLarge(e.to_string()))?;
            Some(Coordination {
                role: CoordinationRole::Resolver,
                resolver: None,
                types,
                generation,
            })
        }
        Some(Role::Follower { selector }) => Some(Coordination {
            role: CoordinationRole::Follower,
            resolver: Some(selector.clone()),
            types,
            generation: found.followed.unwrap_or(0),
        }),
    };
    Ok(Plan {
        annotation,
        coordination,
    })
}

/// The followers wait for this patch: a passing API error must not strand them
/// (5 tries, 200 ms doubling), and one that stays (RBAC, validation) ends init with it,
/// not with a success the followers would wait on until their timeout.
pub(super) async fn publish(
    publisher: &Publisher,
    annotation: &BTreeMap<String, Option<String>>,
) -> Result<(), InitError> {
    if let Some(Some(text)) = annotation.get(ANNOTATION) {
        tracing::info!(
            bytes = text.len(),
            "publishing the cluster for the other agents"
        );
    }
    let retry = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_factor(2.0)
        .with_max_times(4);
    (|| publisher.annotate(annotation))
        .retry(retry)
        .when(|e: &PublishError| matches!(e, PublishError::Kube(k) if k.is_transient()))
        .notify(|e, delay| warn!("could not publish the cluster ({e}); retrying in {delay:?}"))
        .await
        .map_err(|e| InitError::Publish(e.to_string()))
}

use crate::time::now_ms;
