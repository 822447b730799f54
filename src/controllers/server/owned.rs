//! The owned objects of one render, each behind the same two steps (plan,
//! then write), so that the reconcile goes over them in one loop.

use std::fmt::Debug;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::apply::{self, Plan};
use crate::controllers::metrics::Metrics;

/// One owned object: its API, what the cache shows under its name, and the
/// desired object (`None`: disabled, so deleted if this server controls it).
pub struct OwnedObject<K> {
    api: Api<K>,
    name: String,
    cached: Option<ObjectMeta>,
    desired: Option<K>,
}

/// A kind the server owns: namespaced, applied whole, sent across tasks.
pub trait OwnedKind:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> OwnedKind for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// The steps every owned kind goes through.
pub trait OwnedStep: Send + Sync {
    /// `Deployment`, `ConfigMap`, ...
    fn kind(&self) -> String;
    /// What to do with the desired object; `None` when it is disabled.
    fn plan<'a>(&'a self, server_uid: &'a str) -> BoxFuture<'a, Result<Option<Plan>, kube::Error>>;
    /// Applies the desired object if `plan` says so, or deletes a disabled
    /// one this server controls.
    fn write<'a>(
        &'a self,
        plan: Option<&'a Plan>,
        server_uid: &'a str,
        metrics: &'a Metrics,
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
}

impl<K: OwnedKind> OwnedStep for OwnedObject<K> {
    fn kind(&self) -> String {
        K::kind(&Default::default()).into_owned()
    }

    fn plan<'a>(&'a self, server_uid: &'a str) -> BoxFuture<'a, Result<Option<Plan>, kube::Error>> {
        async move {
            match &self.desired {
                Some(desired) => apply::plan(&self.api, self.cached.clone(), desired, server_uid)
                    .await
                    .map(Some),
                None => Ok(None),
            }
        }
        .boxed()
    }

    fn write<'a>(
        &'a self,
        plan: Option<&'a Plan>,
        server_uid: &'a str,
        metrics: &'a Metrics,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        async move {
            match (&self.desired, plan) {
                (Some(desired), Some(Plan::Apply)) => {
                    apply::apply(&self.api, desired, metrics).await
                }
                (None, _) => {
                    let cached = self.cached.clone();
                    apply::delete_if_controlled(&self.api, &self.name, cached, server_uid, metrics)
                        .await
                }
                _ => Ok(()),
            }
        }
        .boxed()
    }
}

/// The cached object `namespace/name`.
pub fn cached<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

/// The metadata of the cached object `namespace/name` (a full object or
/// metadata only).
pub fn cached_meta<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<ObjectMeta>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    cached(store, namespace, name).map(|o| o.meta().clone())
}

/// Where a server's owned objects live.
pub struct Namespace<'a> {
    pub client: &'a Client,
    pub name: &'a str,
}

impl Namespace<'_> {
    /// The owned object `name` as one step of the loop, with what `store`
    /// shows under that name.
    pub fn step<K, C>(&self, store: &Store<C>, name: &str, desired: Option<K>) -> Box<dyn OwnedStep>
    where
        K: OwnedKind,
        C: Resource + Clone + 'static,
        C::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        Box::new(OwnedObject {
            api: Api::namespaced(self.client.clone(), self.name),
            name: name.to_owned(),
            cached: cached_meta(store, self.name, name),
            desired,
        })
    }
}
