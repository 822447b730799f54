//! Where the watches look: one cluster-wide watch per kind when the RBAC
//! allows it, otherwise one per watched namespace and kind.
//!
//! Each watch is a connection of its own with its own list, store and
//! buffers: with `--watch-namespaces` over 10 namespaces, per-namespace
//! watches cost 80 of them. An identity that may list and watch every kind
//! everywhere therefore gets one cluster-wide watch per kind, whose events
//! are filtered to the listed namespaces before any store sees them. With
//! RoleBindings in the watched namespaces only, the watches stay namespaced.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tracing::{debug, info};

use crate::api::{HaltSQLPolicy, HaltSQLServer};

/// Objects per list page of a filtered scope. Its lists also return the
/// other namespaces' objects, and a page is decoded whole before the filter
/// drops them: smaller pages keep that passing memory near what a
/// namespace's own list costs.
const FILTERED_PAGE_SIZE: u32 = 100;

/// The namespaces one set of watches covers.
#[derive(Clone, Debug)]
pub enum Scope {
    /// Every namespace.
    All,
    /// One namespace, with namespaced requests.
    Namespace(String),
    /// Cluster-wide requests, keeping only the objects in these namespaces.
    Filtered(Arc<HashSet<String>>),
}

impl Scope {
    /// The namespace of the scope's requests; `None` for cluster-wide ones.
    pub fn request_namespace(&self) -> Option<&str> {
        match self {
            Scope::Namespace(ns) => Some(ns),
            Scope::All | Scope::Filtered(_) => None,
        }
    }

    /// The watcher settings of this scope's lists and watches.
    pub fn watcher_config(&self) -> watcher::Config {
        match self {
            Scope::Filtered(_) => watcher::Config::default().page_size(FILTERED_PAGE_SIZE),
            Scope::All | Scope::Namespace(_) => watcher::Config::default(),
        }
    }

    /// Whether an object in `namespace` belongs to this scope.
    pub fn keeps(&self, namespace: Option<&str>) -> bool {
        match self {
            Scope::Filtered(namespaces) => namespace.is_some_and(|ns| namespaces.contains(ns)),
            Scope::All | Scope::Namespace(_) => true,
        }
    }

    /// Whether a watch event belongs to this scope (list markers always do).
    pub fn keeps_event<K: Resource>(
        &self,
        event: &Result<watcher::Event<K>, watcher::Error>,
    ) -> bool {
        match event {
            Ok(
                watcher::Event::Apply(obj)
                | watcher::Event::InitApply(obj)
                | watcher::Event::Delete(obj),
            ) => self.keeps(obj.meta().namespace.as_deref()),
            _ => true,
        }
    }
}

/// The scopes to watch: everything without `--watch-namespaces`, else one
/// filtered cluster-wide scope if the RBAC allows it, else one per namespace.
pub async fn scopes(client: &Client, watch_namespaces: Option<&[String]>) -> Vec<Scope> {
    match watch_namespaces {
        None => vec![Scope::All],
        Some([namespace]) => vec![Scope::Namespace(namespace.clone())],
        Some(namespaces) if may_watch_cluster_wide(client).await => {
            info!("the RBAC allows cluster-wide watches: one watch per kind");
            vec![Scope::Filtered(Arc::new(
                namespaces.iter().cloned().collect(),
            ))]
        }
        Some(namespaces) => namespaces.iter().cloned().map(Scope::Namespace).collect(),
    }
}

/// (group, plural) of every kind the operator watches.
fn watched_resources() -> [(String, String); 8] {
    fn of<K: Resource<DynamicType = ()>>() -> (String, String) {
        (K::group(&()).into_owned(), K::plural(&()).into_owned())
    }
    [
        of::<HaltSQLPolicy>(),
        of::<HaltSQLServer>(),
        of::<Deployment>(),
        of::<ReplicaSet>(),
        of::<ConfigMap>(),
        of::<Service>(),
        of::<PodDisruptionBudget>(),
        of::<NetworkPolicy>(),
    ]
}

/// True if this identity may list and watch every watched kind in every
/// namespace; any doubt (an error, a denial) means no.
async fn may_watch_cluster_wide(client: &Client) -> bool {
    let reviews = Api::<SelfSubjectAccessReview>::all(client.clone());
    let checks = watched_resources()
        .into_iter()
        .flat_map(|(group, resource)| {
            ["list", "watch"].map(|verb| ResourceAttributes {
                group: Some(group.clone()),
                resource: Some(resource.clone()),
                verb: Some(verb.to_owned()),
                ..ResourceAttributes::default()
            })
        })
        .map(|attributes| {
            let reviews = reviews.clone();
            async move {
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(attributes),
                        ..SelfSubjectAccessReviewSpec::default()
                    },
                    ..SelfSubjectAccessReview::default()
                };
                match reviews.create(&PostParams::default(), &review).await {
                    Ok(answer) => answer.status.is_some_and(|status| status.allowed),
                    Err(error) => {
                        debug!(%error, "cannot review the operator's access; watching per namespace");
                        false
                    }
                }
            }
        });
    futures::future::join_all(checks)
        .await
        .into_iter()
        .all(|allowed| allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filtered_scope_keeps_only_its_namespaces() {
        let scope = Scope::Filtered(Arc::new(["a".to_owned()].into_iter().collect()));
        assert!(scope.keeps(Some("a")));
        assert!(!scope.keeps(Some("b")));
        assert!(!scope.keeps(None));
        assert_eq!(scope.request_namespace(), None);
        assert!(Scope::Namespace("b".to_owned()).keeps(Some("b")));
        assert!(Scope::All.keeps(Some("b")));
    }
}
