//! Starts the watches, the shared reflector stores and both controllers.
//!
//! Every resource is watched once per scope (all namespaces, or each namespace
//! of `--watch-namespaces`); the root streams are polled here, and both
//! controllers subscribe to them. Owned kinds are watched with the
//! `managed-by` label selector only, so unrelated objects are never cached.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::channel::mpsc;
use futures::future::{BoxFuture, FutureExt};
use futures::{StreamExt, stream};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use crate::api::{HaltSQLPolicy, HaltSQLServer};
use crate::controllers::context::{Context, OwnedStores, ScopeStores, Settings};
use crate::controllers::metrics::Metrics;
use crate::controllers::policy::{self, Validator};
use crate::controllers::server;
use crate::render::{MANAGED_BY, MANAGED_BY_LABEL};

/// Objects a subscriber may fall behind by before the root stream waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot subscribe to a shared store")]
    Subscribe,
}

/// Counts the scopes whose stores are synced; `/readyz` reads it.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    scopes_total: Arc<AtomicUsize>,
    scopes_synced: Arc<AtomicUsize>,
    standby: Arc<AtomicBool>,
}

impl Readiness {
    /// True once every scope's stores have synced and its controllers run, or
    /// while this replica stands by for the leader lease (readiness must not
    /// depend on leadership, or a second replica would never become ready).
    pub fn is_ready(&self) -> bool {
        if self.standby.load(Ordering::SeqCst) {
            return true;
        }
        let total = self.scopes_total.load(Ordering::SeqCst);
        total > 0 && self.scopes_synced.load(Ordering::SeqCst) >= total
    }

    /// Marks this replica as waiting for the leader lease (or not any more).
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::SeqCst);
    }
}

/// Runs both controllers until `shutdown` resolves; in-flight reconciles drain first.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RuntimeError> {
    let shutdown = shutdown.shared();
    let scopes: Vec<Option<String>> = match &settings.watch_namespaces {
        Some(namespaces) => namespaces.iter().cloned().map(Some).collect(),
        None => vec![None],
    };
    readiness.scopes_total.store(scopes.len(), Ordering::SeqCst);
    let validator = Arc::new(Validator::new(
        settings.haltsql_binary.clone(),
        settings.validator_timeout,
        settings.validator_concurrency,
        metrics.clone(),
    ));
    let runs = scopes.into_iter().map(|namespace| {
        run_scope(
            client.clone(),
            namespace,
            validator.clone(),
            settings.clone(),
            metrics.clone(),
            readiness.clone(),
            shutdown.clone().boxed(),
        )
    });
    for result in futures::future::join_all(runs).await {
        result?;
    }
    Ok(())
}

fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
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
struct Shared<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    reader: Store<K>,
    writer: Writer<K>,
}

impl<K> Shared<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    fn new() -> Self {
        let (reader, writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        Self { reader, writer }
    }

    fn subscribe(&self) -> Result<ReflectHandle<K>, RuntimeError> {
        self.writer.subscribe().ok_or(RuntimeError::Subscribe)
    }
}

/// Polls a root watch stream into its store, reporting deletions (which shared
/// subscribers never see) to `on_delete`.
fn drive<K, S>(
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

fn watch_full<K>(
    client: &Client,
    namespace: Option<&str>,
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
    watcher(scoped_api::<K>(client, namespace), config)
        .default_backoff()
        .modify(forget_managed_fields)
        .reflect_shared(shared)
}

fn watch_meta<K>(
    client: &Client,
    namespace: Option<&str>,
    config: watcher::Config,
    shared: Writer<PartialObjectMeta<K>>,
) -> impl futures::Stream<Item = Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>>
+ Send
+ 'static
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
    // An Api over PartialObjectMeta makes metadata-only list and watch requests.
    watcher(
        scoped_api::<PartialObjectMeta<K>>(client, namespace),
        config,
    )
    .default_backoff()
    .modify(forget_managed_fields)
    .reflect_shared(shared)
}

/// The server that controls an owned object, from its controller owner reference.
fn controlling_server<K: Resource>(obj: &K) -> Option<ObjectRef<HaltSQLServer>> {
    let owner = obj.meta().owner_references.as_ref()?.iter().find(|o| {
        o.controller == Some(true)
            && o.kind == "HaltSQLServer"
            && o.api_version == crate::api::API_VERSION
    })?;
    let mut reference = ObjectRef::new(&owner.name);
    if let Some(ns) = obj.meta().namespace.as_deref() {
        reference = reference.within(ns);
    }
    Some(reference)
}

async fn run_scope(
    client: Client,
    namespace: Option<String>,
    validator: Arc<Validator>,
    settings: Settings,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: BoxFuture<'static, ()>,
) -> Result<(), RuntimeError> {
    let shutdown = shutdown.shared();
    let ns = namespace.as_deref();
    let owned_selector =
        watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));

    let policies = Shared::<HaltSQLPolicy>::new();
    let servers = Shared::<HaltSQLServer>::new();
    let deployments = Shared::<Deployment>::new();
    let config_maps = Shared::<PartialObjectMeta<ConfigMap>>::new();
    let services = Shared::<PartialObjectMeta<Service>>::new();
    let pdbs = Shared::<PartialObjectMeta<PodDisruptionBudget>>::new();
    let network_policies = Shared::<PartialObjectMeta<NetworkPolicy>>::new();
    // No subscriber: only a deleted ReplicaSet matters (it may free a
    // ConfigMap), and that comes through the delete hook below.
    let replica_sets = Shared::<PartialObjectMeta<ReplicaSet>>::new();

    // Every subscriber exists before any root stream is polled.
    let policies_for_policy_controller = policies.subscribe()?;
    let policies_for_server_controller = policies.subscribe()?;
    let servers_for_server_controller = servers.subscribe()?;
    let servers_for_policy_controller = servers.subscribe()?;
    let deployment_changes = deployments.subscribe()?;
    let config_map_changes = config_maps.subscribe()?;
    let service_changes = services.subscribe()?;
    let pdb_changes = pdbs.subscribe()?;
    let network_policy_changes = network_policies.subscribe()?;

    let (requeue_server, deleted_for_servers) = mpsc::unbounded::<ObjectRef<HaltSQLServer>>();
    let (requeue_policy, deleted_for_policies) = mpsc::unbounded::<ObjectRef<HaltSQLPolicy>>();

    // `haltsql_operator_objects` is computed from these stores at scrape time.
    metrics.observe_stores(policies.reader.clone(), servers.reader.clone());

    let ctx = Arc::new(Context::new(
        client.clone(),
        namespace.clone(),
        ScopeStores {
            policies: policies.reader.clone(),
            servers: servers.reader.clone(),
            owned: OwnedStores {
                deployments: deployments.reader.clone(),
                config_maps: config_maps.reader.clone(),
                services: services.reader.clone(),
                pod_disruption_budgets: pdbs.reader.clone(),
                network_policies: network_policies.reader.clone(),
                replica_sets: replica_sets.reader.clone(),
            },
        },
        validator,
        settings.clone(),
        metrics.clone(),
    ));

    let synced_inputs = Arc::new(SyncedInputs::default());

    // A deleted policy changes what its servers render; a deleted server changes
    // its policies' Synced; a deleted owned object must be re-created at once.
    let drivers = {
        let servers_store = servers.reader.clone();
        let to_servers = requeue_server.clone();
        let policy_ctx = ctx.clone();
        let policy_deleted = move |policy: &HaltSQLPolicy| {
            policy_ctx.own_writes.forget(policy);
            for server in server::servers_referencing(&servers_store, policy) {
                let _ = to_servers.unbounded_send(server);
            }
        };
        let to_policies = requeue_policy.clone();
        let synced_inputs = synced_inputs.clone();
        let server_ctx = ctx.clone();
        let server_deleted = move |server: &HaltSQLServer| {
            synced_inputs.forget(server);
            server_ctx.own_writes.forget(server);
            for policy in policy::policies_referenced_by(server) {
                let _ = to_policies.unbounded_send(policy);
            }
        };
        let owned_deleted = |to_servers: mpsc::UnboundedSender<ObjectRef<HaltSQLServer>>| {
            move |obj: &dyn OwnerLookup| {
                if let Some(server) = obj.controlling_server() {
                    let _ = to_servers.unbounded_send(server);
                }
            }
        };
        let deployment_deleted = owned_deleted(requeue_server.clone());
        let config_map_deleted = owned_deleted(requeue_server.clone());
        let service_deleted = owned_deleted(requeue_server.clone());
        let pdb_deleted = owned_deleted(requeue_server.clone());
        let network_policy_deleted = owned_deleted(requeue_server.clone());
        // A ReplicaSet is controlled by the Deployment, which has the server's name.
        let replica_set_deleted = {
            let to_servers = requeue_server.clone();
            move |rs: &PartialObjectMeta<ReplicaSet>| {
                let deployment = rs.metadata.owner_references.iter().flatten().find(|o| {
                    o.controller == Some(true)
                        && o.kind == "Deployment"
                        && o.api_version == "apps/v1"
                });
                if let (Some(owner), Some(ns)) = (deployment, rs.metadata.namespace.as_deref()) {
                    let _ = to_servers.unbounded_send(ObjectRef::new(&owner.name).within(ns));
                }
            }
        };
        vec![
            drive(
                watch_meta(&client, ns, owned_selector.clone(), replica_sets.writer),
                "replicasets",
                replica_set_deleted,
            ),
            drive(
                watch_full(&client, ns, watcher::Config::default(), policies.writer),
                "haltsqlpolicies",
                policy_deleted,
            ),
            drive(
                watch_full(&client, ns, watcher::Config::default(), servers.writer),
                "haltsqlservers",
                server_deleted,
            ),
            drive(
                watch_full(&client, ns, owned_selector.clone(), deployments.writer),
                "deployments",
                move |o: &Deployment| deployment_deleted(o),
            ),
            drive(
                watch_meta(&client, ns, owned_selector.clone(), config_maps.writer),
                "configmaps",
                move |o: &PartialObjectMeta<ConfigMap>| config_map_deleted(o),
            ),
            drive(
                watch_meta(&client, ns, owned_selector.clone(), services.writer),
                "services",
                move |o: &PartialObjectMeta<Service>| service_deleted(o),
            ),
            drive(
                watch_meta(&client, ns, owned_selector.clone(), pdbs.writer),
                "poddisruptionbudgets",
                move |o: &PartialObjectMeta<PodDisruptionBudget>| pdb_deleted(o),
            ),
            drive(
                watch_meta(&client, ns, owned_selector, network_policies.writer),
                "networkpolicies",
                move |o: &PartialObjectMeta<NetworkPolicy>| network_policy_deleted(o),
            ),
        ]
    };

    let controller_config = ControllerConfig::default().concurrency(settings.concurrency);
    let policy_controller =
        Controller::for_shared_stream(policies_for_policy_controller, policies.reader.clone())
            .watches_shared_stream(servers_for_policy_controller, {
                // A policy a server just dropped is not in its spec any more,
                // but still in its appliedPolicies: requeue both. Only when
                // those changed, though: most server writes (replica counts,
                // conditions) say nothing about a policy's Synced.
                let policies = policies.reader.clone();
                let synced_inputs = synced_inputs.clone();
                move |server| {
                    if !synced_inputs.changed(&server) {
                        return Vec::new();
                    }
                    policy::policies_affected_by(&server, &policies).collect::<Vec<_>>()
                }
            })
            .reconcile_on(deleted_for_policies)
            .with_config(controller_config.clone())
            .graceful_shutdown_on(shutdown.clone())
            .run(policy::reconcile, policy::error_policy, ctx.clone())
            .for_each(|result| async move {
                if let Err(error) = result {
                    debug!(%error, controller = "haltsqlpolicy", "reconcile failed");
                }
            });

    let servers_store = servers.reader.clone();
    let server_controller =
        Controller::for_shared_stream(servers_for_server_controller, servers.reader.clone())
            .watches_shared_stream(policies_for_server_controller, move |policy| {
                server::servers_referencing(&servers_store, &policy).collect::<Vec<_>>()
            })
            .owns_shared_stream(deployment_changes)
            .owns_shared_stream(config_map_changes)
            .owns_shared_stream(service_changes)
            .owns_shared_stream(pdb_changes)
            .owns_shared_stream(network_policy_changes)
            .reconcile_on(deleted_for_servers)
            .with_config(controller_config)
            .graceful_shutdown_on(shutdown.clone())
            .run(server::reconcile, server::error_policy, ctx.clone())
            .for_each(|result| async move {
                if let Err(error) = result {
                    debug!(%error, controller = "haltsqlserver", "reconcile failed");
                }
            });

    // The controllers start only after every store of the scope has synced,
    // and this is the only task that waits for that. A kube 5 store wakes
    // just one of several concurrent `wait_until_ready` callers (its
    // DelayedInit keeps a single waker), so a reconcile or a controller's own
    // startup waiting alongside could hang for good. Once synced, every later
    // wait returns at once.
    let run = {
        let ctx = ctx.clone();
        let readiness = readiness.clone();
        let shutdown = shutdown.clone();
        async move {
            tokio::select! {
                synced = ctx.wait_for_stores() => if !synced { return },
                _ = shutdown => return,
            }
            readiness.scopes_synced.fetch_add(1, Ordering::SeqCst);
            futures::future::join(policy_controller, server_controller).await;
        }
    };

    let watches = stream::iter(drivers).for_each_concurrent(None, |driver| driver);
    tokio::select! {
        _ = run => {}
        _ = watches => warn!("watch streams ended"),
    }
    // Keep the senders alive for the controllers' whole life.
    drop((requeue_server, requeue_policy));
    Ok(())
}

/// What a policy's `Synced` reads from each server (the policies it
/// references and its appliedPolicies), as last seen, so that server events
/// that change neither requeue no policy.
#[derive(Default)]
struct SyncedInputs {
    last_seen: std::sync::Mutex<std::collections::HashMap<ObjectRef<HaltSQLServer>, u64>>,
}

impl SyncedInputs {
    /// Records the server's inputs; true if they differ from the last seen.
    fn changed(&self, server: &HaltSQLServer) -> bool {
        use std::hash::Hasher;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for reference in &server.spec.policies {
            hasher.write(reference.name.as_bytes());
            hasher.write_u8(0);
        }
        hasher.write_u8(1);
        if let Some(applied) = server
            .status
            .as_ref()
            .and_then(|s| s.applied_policies.as_ref())
        {
            for policy in applied {
                hasher.write(policy.name.as_bytes());
                hasher.write_u8(0);
                hasher.write(policy.content_hash.as_bytes());
                hasher.write_u8(0);
            }
        }
        let fingerprint = hasher.finish();
        let mut last_seen = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        last_seen.insert(ObjectRef::from_obj(server), fingerprint) != Some(fingerprint)
    }

    fn forget(&self, server: &HaltSQLServer) {
        let mut last_seen = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        last_seen.remove(&ObjectRef::from_obj(server));
    }
}

/// Owned objects of any kind, for the delete hook.
trait OwnerLookup {
    fn controlling_server(&self) -> Option<ObjectRef<HaltSQLServer>>;
}

impl<K: Resource> OwnerLookup for K {
    fn controlling_server(&self) -> Option<ObjectRef<HaltSQLServer>> {
        controlling_server(self)
    }
}

impl Context {
    /// Waits until every store of this scope has listed its objects once.
    /// Returns false if a store's writer went away (the operator is stopping).
    pub async fn wait_for_stores(&self) -> bool {
        let results = futures::join!(
            self.policies.wait_until_ready(),
            self.servers.wait_until_ready(),
            self.owned.deployments.wait_until_ready(),
            self.owned.config_maps.wait_until_ready(),
            self.owned.services.wait_until_ready(),
            self.owned.pod_disruption_budgets.wait_until_ready(),
            self.owned.network_policies.wait_until_ready(),
            self.owned.replica_sets.wait_until_ready(),
        );
        results.0.is_ok()
            && results.1.is_ok()
            && results.2.is_ok()
            && results.3.is_ok()
            && results.4.is_ok()
            && results.5.is_ok()
            && results.6.is_ok()
            && results.7.is_ok()
    }
}
