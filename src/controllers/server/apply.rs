//! Writing owned objects: only when the desired spec hash differs from the
//! live one, never over an object this server does not control.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::controllers::context::FIELD_MANAGER;
use crate::controllers::metrics::Metrics;
use crate::render::SPEC_HASH_ANNOTATION;

/// What to do with one owned object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The live object has the desired spec hash.
    UpToDate,
    /// Missing, or controlled by this server with another spec hash.
    Apply,
    /// The name is taken by an object this server does not control.
    Conflict(String),
}

/// Whether `meta` carries a controller owner reference to the server with this uid.
pub fn controlled_by(meta: &ObjectMeta, server_uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == server_uid)
}

fn spec_hash(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(SPEC_HASH_ANNOTATION)
        .map(String::as_str)
}

/// Decides what to do with `desired`, given the cached live metadata. A cache
/// miss is confirmed with a GET, since the cache holds only labelled objects
/// and a foreign object with the same name must be found.
pub async fn plan<K>(
    api: &Api<K>,
    cached: Option<ObjectMeta>,
    desired: &K,
    server_uid: &str,
) -> Result<Plan, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let live = match cached {
        Some(meta) => Some(meta),
        None => api
            .get_metadata_opt(&desired.name_any())
            .await?
            .map(|m| m.metadata),
    };
    let Some(live) = live else {
        return Ok(Plan::Apply);
    };
    if !controlled_by(&live, server_uid) {
        return Ok(Plan::Conflict(format!(
            "{} {} exists and is not controlled by this HaltSQLServer; it is left untouched",
            K::kind(&Default::default()),
            desired.name_any()
        )));
    }
    if spec_hash(&live).is_some() && spec_hash(&live) == spec_hash(desired.meta()) {
        Ok(Plan::UpToDate)
    } else {
        Ok(Plan::Apply)
    }
}

/// Server-side applies the whole desired object as the operator's field manager.
pub async fn apply<K>(api: &Api<K>, desired: &K, metrics: &Metrics) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&desired.name_any(), &params, &Patch::Apply(desired))
        .await?;
    let kind = K::kind(&Default::default()).into_owned();
    tracing::info!(%kind, object = %desired.name_any(), "applied");
    metrics.write(&kind, "apply");
    Ok(())
}

/// Deletes an object this server controls that is no longer wanted (a disabled
/// PodDisruptionBudget or NetworkPolicy). Foreign objects are never deleted.
pub async fn delete_if_controlled<K>(
    api: &Api<K>,
    name: &str,
    cached: Option<ObjectMeta>,
    server_uid: &str,
    metrics: &Metrics,
) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let Some(meta) = cached else { return Ok(()) };
    if !controlled_by(&meta, server_uid) {
        return Ok(());
    }
    let mut params = DeleteParams::background();
    params.preconditions = Some(kube::api::Preconditions {
        uid: meta.uid.clone(),
        resource_version: None,
    });
    match api.delete(name, &params).await {
        Ok(_) => {
            metrics.write(&K::kind(&Default::default()), "delete");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
