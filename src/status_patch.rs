//! Writing the status subresource of our own resources, the one way both
//! controllers do it.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::metrics::Metrics;

/// A merge patch of the status subresource carrying the resourceVersion that
/// was read, so a concurrent change fails with 409 instead of being
/// overwritten. Fields the new status drops are sent as `null`, since a merge
/// patch leaves fields it does not mention alone.
pub async fn patch_status<K, S>(
    client: &kube::Client,
    obj: &K,
    old: Option<&S>,
    new: &S,
    metrics: &Metrics,
) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    S: Serialize,
{
    let mut body = serde_json::to_value(new).map_err(kube::Error::SerdeError)?;
    if let (Some(new), Some(old)) = (body.as_object_mut(), old)
        && let serde_json::Value::Object(old) =
            serde_json::to_value(old).map_err(kube::Error::SerdeError)?
    {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": obj.resource_version() },
        "status": body,
    });
    let namespace = obj.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    api.patch_status(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    metrics.write(&K::kind(&Default::default()), "status");
    Ok(())
}
