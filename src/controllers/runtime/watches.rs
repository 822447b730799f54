//! The watch plumbing of one scope: an API per scope, shared stores with
//! their writers, and the root streams that fill them.

use std::fmt::Debug;
use std::hash::Hash;

use futures::StreamExt;
use futures::future::{self, BoxFuture, FutureExt};
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::reflector::{self, ReflectHandle, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::warn;

use super::scope::Scope;

/// Objects a subscriber may fall behind by before the root stream waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot subscribe to a shared store")]
    Subscribe,
}

pub(super) fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A shared store with its writer and the subscriptions handed out before polling.
pub(super) struct Shared<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    pub(super) reader: Store<K>,
    pub(super) writer: Writer<K>,
}

impl<K> Shared<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    pub(super) fn new() -> Self {
        let (reader, writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        Self { reader, writer }
    }

    pub(super) fn subscribe(&self) -> Result<ReflectHandle<K>, RuntimeError> {
        self.writer.subscribe().ok_or(RuntimeError::Subscribe)
    }
}

/// Polls a root watch stream into its store, reporting deletions (which shared
/// subscribers never see) to `on_delete`.
pub(super) fn drive<K, S>(
    stream: S,
    what: &'static str,
    on_delete: impl Fn(&K) + Send + 'static,
) -> BoxFuture<'static, ()>
where
    K: Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Delete(obj)) => on_delete(&obj),
                Ok(_) => {}
                Err(error) => warn!(%error, resource = what, "watch failed; retrying with backoff"),
            }
        }
    }
    .boxed()
}

/// The caches never read managedFields, often the largest part of an object.
fn forget_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// The watch of one kind in the scope, filling its shared store. Over
/// `PartialObjectMeta<K>`, the list and watch requests are metadata-only.
pub(super) fn watch<K>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
    shared: Writer<K>,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let in_scope = scope.clone();
    watcher(scoped_api::<K>(client, scope.request_namespace()), config)
        .default_backoff()
        .filter(move |event| future::ready(in_scope.keeps_event(event)))
        .modify(forget_managed_fields)
        .reflect_shared(shared)
}
