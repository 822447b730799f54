//! Writing the status subresource of our own resources, the one way both
//! controllers do it.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::{ObjectRef, Store};

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::controllers::metrics::Metrics;

/// How long a pass waits for the cache to show our own last status write
/// (it holds a reconcile slot meanwhile, so not long).
const CATCH_UP_WAIT: Duration = Duration::from_millis(50);
/// A pass that still sees a stale cache after that looks again this soon,
/// unless the write's watch event brings it sooner.
pub const STALE_RECHECK: Duration = Duration::from_millis(100);

/// The resourceVersion each of our status writes replaced, per object, until
/// the cache shows a newer one. A pass over the replaced version (a requeue
/// that comes before the watch delivers our own write) could only end in a
/// 409, so it waits for the cache instead.
#[derive(Debug, Default)]
pub struct OwnWrites {
    replaced: Mutex<HashMap<String, String>>,
}

impl OwnWrites {
    /// True while `obj` is the version one of our writes replaced.
    pub fn is_stale<K: Resource>(&self, obj: &K) -> bool
    where
        K::DynamicType: Default,
    {
        let key = object_key(obj);
        let mut replaced = self.replaced.lock().unwrap_or_else(|e| e.into_inner());
        match (replaced.get(&key), obj.meta().resource_version.as_deref()) {
            (Some(old), Some(current)) if old == current => true,
            (Some(_), _) => {
                replaced.remove(&key);
                false
            }
            (None, _) => false,
        }
    }

    /// `obj` as the cache shows it once it shows our last write (at once,
    /// usually: the watch event is on its way), or `None` if it still does
    /// not after [`CATCH_UP_WAIT`].
    pub async fn caught_up<K>(&self, store: &Store<K>, obj: Arc<K>) -> Option<Arc<K>>
    where
        K: Resource + Clone,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        if !self.is_stale(&*obj) {
            return Some(obj);
        }
        let deadline = Instant::now() + CATCH_UP_WAIT;
        let reference = ObjectRef::from_obj(&*obj);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
            match store.get(&reference) {
                Some(current) if !self.is_stale(&*current) => return Some(current),
                Some(_) => {}
                // Deleted meanwhile: the delete event brings what follows.
                None => return None,
            }
        }
        None
    }

    fn record<K: Resource>(&self, obj: &K)
    where
        K::DynamicType: Default,
    {
        if let Some(version) = obj.meta().resource_version.clone() {
            let mut replaced = self.replaced.lock().unwrap_or_else(|e| e.into_inner());
            replaced.insert(object_key(obj), version);
        }
    }

    /// Forgets a deleted object.
    pub fn forget<K: Resource>(&self, obj: &K)
    where
        K::DynamicType: Default,
    {
        let mut replaced = self.replaced.lock().unwrap_or_else(|e| e.into_inner());
        replaced.remove(&object_key(obj));
    }
}

fn object_key<K: Resource>(obj: &K) -> String
where
    K::DynamicType: Default,
{
    format!(
        "{}/{}/{}",
        K::kind(&Default::default()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

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
    own_writes: &OwnWrites,
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
    own_writes.record(obj);
    Ok(())
}
