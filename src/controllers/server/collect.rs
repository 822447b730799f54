//! Garbage collection of per-configuration ConfigMaps.
//!
//! Every rendered configuration has its own immutable ConfigMap, so a pod of
//! an older ReplicaSet that restarts during a stalled rollout mounts the
//! configuration it was made for, not the new one. A ConfigMap may go only
//! when no ReplicaSet of the server's Deployment uses it any more: the
//! Deployment controller deletes an old ReplicaSet only once it has no pods
//! (beyond `revisionHistoryLimit`), so this also covers the pods.
//!
//! The caches decide whether there may be something to collect (no API call
//! in the steady state); the decision itself is made on fresh reads: the
//! Deployment (whose controller must have seen its latest template, or a
//! ReplicaSet for an older template may still appear) and then the
//! ReplicaSets listed from the API server.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use tracing::{debug, info};

use super::apply::controlled_by;
use crate::controllers::metrics::Metrics;
use crate::render::{
    CONFIG_HASH_LABEL, INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, config_map_prefix,
};

/// Which configuration a ReplicaSet's pods mount: its config-hash label, or
/// (no label: made by an operator version before per-configuration
/// ConfigMaps) the one mutable ConfigMap of that time.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Uses {
    Hash(String),
    Legacy,
}

fn uses(labels: Option<&std::collections::BTreeMap<String, String>>) -> Uses {
    match labels.and_then(|l| l.get(CONFIG_HASH_LABEL)) {
        Some(hash) => Uses::Hash(hash.clone()),
        None => Uses::Legacy,
    }
}

/// A ConfigMap this server controls that is not its current one.
#[derive(Clone, Debug)]
struct Candidate {
    name: String,
    uid: Option<String>,
    uses: Uses,
}

/// The server's ConfigMaps other than `current`: those with a config-hash
/// label, and the legacy `<server>-haltsql-config`.
fn candidates(
    config_maps: &Store<PartialObjectMeta<ConfigMap>>,
    namespace: &str,
    server: &str,
    server_uid: &str,
    current: &str,
) -> Vec<Candidate> {
    let legacy = config_map_prefix(server);
    config_maps
        .state()
        .iter()
        .map(|cm| &cm.metadata)
        .filter(|m| m.namespace.as_deref() == Some(namespace))
        .filter(|m| controlled_by(m, server_uid))
        .filter_map(|m| {
            let name = m.name.clone()?;
            if name == current {
                return None;
            }
            let uses = match m.labels.as_ref().and_then(|l| l.get(CONFIG_HASH_LABEL)) {
                Some(hash) => Uses::Hash(hash.clone()),
                None if name == legacy => Uses::Legacy,
                None => return None,
            };
            Some(Candidate {
                name,
                uid: m.uid.clone(),
                uses,
            })
        })
        .collect()
}

/// Whether a ReplicaSet (by its metadata) belongs to the server's pods: its
/// instance label names the server. Ownership is not checked on purpose: an
/// orphaned ReplicaSet with the server's labels still runs its pods.
fn of_server(meta: &ObjectMeta, namespace: &str, server: &str) -> bool {
    meta.namespace.as_deref() == Some(namespace)
        && meta
            .labels
            .as_ref()
            .and_then(|l| l.get(INSTANCE_LABEL))
            .is_some_and(|i| i == server)
}

fn cached_uses(
    replica_sets: &Store<PartialObjectMeta<ReplicaSet>>,
    namespace: &str,
    server: &str,
) -> BTreeSet<Uses> {
    replica_sets
        .state()
        .iter()
        .map(|rs| &rs.metadata)
        .filter(|m| of_server(m, namespace, server))
        .map(|m| uses(m.labels.as_ref()))
        .collect()
}

/// Stores and clients the collection reads.
pub struct Collect<'a> {
    pub config_maps: &'a Store<PartialObjectMeta<ConfigMap>>,
    pub replica_sets: &'a Store<PartialObjectMeta<ReplicaSet>>,
    pub config_map_api: &'a Api<ConfigMap>,
    pub deployment_api: &'a Api<Deployment>,
    pub replica_set_api: &'a Api<ReplicaSet>,
    pub metrics: &'a Metrics,
}

/// Deletes the server's ConfigMaps that neither `current` nor any ReplicaSet
/// uses. Returns how many it deleted.
pub async fn collect_config_maps(
    c: &Collect<'_>,
    namespace: &str,
    server: &str,
    server_uid: &str,
    current: &str,
) -> Result<usize, kube::Error> {
    let candidates = candidates(c.config_maps, namespace, server, server_uid, current);
    if candidates.is_empty() {
        return Ok(0);
    }
    let cached = cached_uses(c.replica_sets, namespace, server);
    if candidates.iter().all(|cand| cached.contains(&cand.uses)) {
        debug!(
            candidates = candidates.len(),
            "every other ConfigMap is used by a cached ReplicaSet"
        );
        return Ok(0);
    }

    // Something may be unused: decide on fresh reads.
    let Some(deployment) = c.deployment_api.get_opt(server).await? else {
        return Ok(0);
    };
    let generation = deployment.metadata.generation;
    let observed = deployment
        .status
        .as_ref()
        .and_then(|s| s.observed_generation);
    if generation.is_none() || observed < generation {
        // The Deployment controller has not yet acted on the latest template:
        // it may still create a ReplicaSet for an older one.
        debug!(
            ?generation,
            ?observed,
            "Deployment not yet observed; ConfigMaps not collected"
        );
        return Ok(0);
    }
    let mut in_use: BTreeSet<Uses> = BTreeSet::new();
    if let Some(template) = deployment.spec.as_ref().map(|s| &s.template) {
        in_use.insert(uses(
            template.metadata.as_ref().and_then(|m| m.labels.as_ref()),
        ));
    }
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY},{INSTANCE_LABEL}={server}");
    let listed = c
        .replica_set_api
        .list_metadata(&ListParams::default().labels(&selector))
        .await?;
    in_use.extend(
        listed
            .items
            .iter()
            .filter(|rs| of_server(&rs.metadata, namespace, server))
            .map(|rs| uses(rs.metadata.labels.as_ref())),
    );

    let mut deleted = 0;
    for cand in candidates
        .iter()
        .filter(|cand| !in_use.contains(&cand.uses))
    {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: cand.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match c.config_map_api.delete(&cand.name, &params).await {
            Ok(_) => {
                info!(config_map = %cand.name, "no ReplicaSet uses this configuration any more; deleted");
                c.metrics.write("ConfigMap", "delete");
                deleted += 1;
            }
            // Gone already, or replaced by another object of that name (409:
            // the uid precondition failed): nothing of ours to delete.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn unlabelled_replica_sets_use_the_legacy_config_map() {
        assert_eq!(uses(None), Uses::Legacy);
        let labels = BTreeMap::from([(CONFIG_HASH_LABEL.to_owned(), "abc".to_owned())]);
        assert_eq!(uses(Some(&labels)), Uses::Hash("abc".to_owned()));
    }

    #[test]
    fn replica_sets_of_other_servers_do_not_count() {
        let meta = |ns: &str, instance: &str| ObjectMeta {
            namespace: Some(ns.to_owned()),
            labels: Some(BTreeMap::from([(
                INSTANCE_LABEL.to_owned(),
                instance.to_owned(),
            )])),
            ..Default::default()
        };
        assert!(of_server(&meta("a", "hs"), "a", "hs"));
        assert!(!of_server(&meta("a", "other"), "a", "hs"));
        assert!(!of_server(&meta("b", "hs"), "a", "hs"));
    }
}
