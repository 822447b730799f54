//! Starts the watches, the shared reflector stores and both controllers.
//!
//! Every resource is watched once per scope (see [`scope`]: all namespaces,
//! the namespaces of `--watch-namespaces` through one cluster-wide watch per
//! kind, or each of them); the root streams are polled here, and both
//! controllers subscribe to them. Owned kinds are watched with the
//! `managed-by` label selector only, so unrelated objects are never cached.

mod requeue;
mod scope;
mod watches;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::channel::mpsc;
use futures::future::{BoxFuture, FutureExt};
use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{ObjectRef, ReflectHandle};
use tracing::{debug, warn};

use crate::api::{HaltSQLPolicy, HaltSQLServer};
use crate::controllers::context::{Context, OwnedStores, PassLimits, ScopeStores, Settings};
use crate::controllers::metrics::Metrics;
use crate::controllers::policy::{self, Validator};
use crate::controllers::server;
use crate::render::{MANAGED_BY, MANAGED_BY_LABEL};
use requeue::{
    Requeues, SyncedInputs, on_owned_deleted, on_policy_deleted, on_replica_set_deleted,
    on_server_deleted, policies_to_requeue,
};
use scope::Scope;
pub use watches::RuntimeError;
use watches::{Shared, drive, watch};

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
    let scopes = scope::scopes(&client, settings.watch_namespaces.as_deref()).await;
    readiness.scopes_total.store(scopes.len(), Ordering::SeqCst);
    let validator = Arc::new(Validator::new(
        settings.haltsql_binary.clone(),
        settings.validator_timeout,
        settings.validator_concurrency,
        metrics.clone(),
    ));
    let operator_wide = OperatorWide {
        validator,
        pass_limits: Arc::new(PassLimits::new(settings.concurrency)),
    };
    let runs = scopes.into_iter().map(|scope| {
        run_scope(
            client.clone(),
            scope,
            operator_wide.clone(),
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

/// What every scope shares, so that its bounds are the operator's: one
/// validator (runs at once, verdict cache) and one bound on passes.
#[derive(Clone)]
struct OperatorWide {
    validator: Arc<Validator>,
    pass_limits: Arc<PassLimits>,
}

/// The shared stores of one scope, one per watched kind.
struct SharedStores {
    policies: Shared<HaltSQLPolicy>,
    servers: Shared<HaltSQLServer>,
    deployments: Shared<Deployment>,
    config_maps: Shared<PartialObjectMeta<ConfigMap>>,
    services: Shared<PartialObjectMeta<Service>>,
    pdbs: Shared<PartialObjectMeta<PodDisruptionBudget>>,
    network_policies: Shared<PartialObjectMeta<NetworkPolicy>>,
    /// No subscriber: only a deleted ReplicaSet matters (it may free a
    /// ConfigMap), and that comes through its delete hook.
    replica_sets: Shared<PartialObjectMeta<ReplicaSet>>,
}

impl SharedStores {
    fn new() -> Self {
        Self {
            policies: Shared::new(),
            servers: Shared::new(),
            deployments: Shared::new(),
            config_maps: Shared::new(),
            services: Shared::new(),
            pdbs: Shared::new(),
            network_policies: Shared::new(),
            replica_sets: Shared::new(),
        }
    }

    fn readers(&self) -> ScopeStores {
        ScopeStores {
            policies: self.policies.reader.clone(),
            servers: self.servers.reader.clone(),
            owned: OwnedStores {
                deployments: self.deployments.reader.clone(),
                config_maps: self.config_maps.reader.clone(),
                services: self.services.reader.clone(),
                pod_disruption_budgets: self.pdbs.reader.clone(),
                network_policies: self.network_policies.reader.clone(),
                replica_sets: self.replica_sets.reader.clone(),
            },
        }
    }

    /// The root watch streams, each filling its store and reporting
    /// deletions to its hook. Consumes the writers.
    fn into_root_streams(
        self,
        client: &Client,
        scope: &Scope,
        ctx: &Arc<Context>,
        requeues: &Requeues,
        synced_inputs: &Arc<SyncedInputs>,
    ) -> Vec<BoxFuture<'static, ()>> {
        let (ns, all) = (scope, scope.watcher_config());
        let owned = all
            .clone()
            .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let to_servers = || requeues.servers.clone();
        vec![
            drive(
                watch(client, ns, owned.clone(), self.replica_sets.writer),
                "replicasets",
                on_replica_set_deleted(to_servers()),
            ),
            drive(
                watch(client, ns, all.clone(), self.policies.writer),
                "haltsqlpolicies",
                on_policy_deleted(ctx.clone(), to_servers()),
            ),
            drive(
                watch(client, ns, all, self.servers.writer),
                "haltsqlservers",
                on_server_deleted(
                    ctx.clone(),
                    synced_inputs.clone(),
                    requeues.policies.clone(),
                ),
            ),
            drive(
                watch(client, ns, owned.clone(), self.deployments.writer),
                "deployments",
                on_owned_deleted::<Deployment>(to_servers()),
            ),
            drive(
                watch(client, ns, owned.clone(), self.config_maps.writer),
                "configmaps",
                on_owned_deleted::<PartialObjectMeta<ConfigMap>>(to_servers()),
            ),
            drive(
                watch(client, ns, owned.clone(), self.services.writer),
                "services",
                on_owned_deleted::<PartialObjectMeta<Service>>(to_servers()),
            ),
            drive(
                watch(client, ns, owned.clone(), self.pdbs.writer),
                "poddisruptionbudgets",
                on_owned_deleted::<PartialObjectMeta<PodDisruptionBudget>>(to_servers()),
            ),
            drive(
                watch(client, ns, owned, self.network_policies.writer),
                "networkpolicies",
                on_owned_deleted::<PartialObjectMeta<NetworkPolicy>>(to_servers()),
            ),
        ]
    }
}

/// What each controller subscribes to, taken before any root stream is polled.
struct Subscriptions {
    policies_for_policy_controller: ReflectHandle<HaltSQLPolicy>,
    servers_for_policy_controller: ReflectHandle<HaltSQLServer>,
    policies_for_server_controller: ReflectHandle<HaltSQLPolicy>,
    servers_for_server_controller: ReflectHandle<HaltSQLServer>,
    deployments: ReflectHandle<Deployment>,
    config_maps: ReflectHandle<PartialObjectMeta<ConfigMap>>,
    services: ReflectHandle<PartialObjectMeta<Service>>,
    pdbs: ReflectHandle<PartialObjectMeta<PodDisruptionBudget>>,
    network_policies: ReflectHandle<PartialObjectMeta<NetworkPolicy>>,
}

impl Subscriptions {
    fn take(stores: &SharedStores) -> Result<Self, RuntimeError> {
        Ok(Self {
            policies_for_policy_controller: stores.policies.subscribe()?,
            policies_for_server_controller: stores.policies.subscribe()?,
            servers_for_server_controller: stores.servers.subscribe()?,
            servers_for_policy_controller: stores.servers.subscribe()?,
            deployments: stores.deployments.subscribe()?,
            config_maps: stores.config_maps.subscribe()?,
            services: stores.services.subscribe()?,
            pdbs: stores.pdbs.subscribe()?,
            network_policies: stores.network_policies.subscribe()?,
        })
    }
}

/// Logs a failed reconcile at debug: the error policy has logged it already.
async fn log_result<T, E: std::fmt::Display>(controller: &'static str, result: Result<T, E>) {
    if let Err(error) = result {
        debug!(%error, controller, "reconcile failed");
    }
}

async fn run_scope(
    client: Client,
    scope: Scope,
    operator_wide: OperatorWide,
    settings: Settings,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: BoxFuture<'static, ()>,
) -> Result<(), RuntimeError> {
    let shutdown = shutdown.shared();
    let stores = SharedStores::new();
    // Every subscriber exists before any root stream is polled.
    let subscriptions = Subscriptions::take(&stores)?;
    let (to_servers, deleted_servers) = mpsc::unbounded::<ObjectRef<HaltSQLServer>>();
    let (to_policies, deleted_policies) = mpsc::unbounded::<ObjectRef<HaltSQLPolicy>>();
    let requeues = Requeues {
        servers: to_servers,
        policies: to_policies,
    };

    // `haltsql_operator_objects` is computed from these stores at scrape time.
    metrics.observe_stores(
        stores.policies.reader.clone(),
        stores.servers.reader.clone(),
    );
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            scope.request_namespace().map(str::to_owned),
            stores.readers(),
            operator_wide.validator,
            settings.clone(),
            metrics,
        )
        .with_pass_limits(operator_wide.pass_limits)
        .with_server_requeue(requeues.servers.clone()),
    );
    let synced_inputs = Arc::new(SyncedInputs::default());
    let root_streams = stores.into_root_streams(&client, &scope, &ctx, &requeues, &synced_inputs);

    // The bound is the operator's, over every scope (`PassLimits`); no
    // scope needs more than all of it.
    let config = ControllerConfig::default().concurrency(settings.concurrency);
    let Subscriptions {
        policies_for_policy_controller,
        servers_for_policy_controller,
        policies_for_server_controller,
        servers_for_server_controller,
        deployments,
        config_maps,
        services,
        pdbs,
        network_policies,
    } = subscriptions;
    let policy_controller =
        Controller::for_shared_stream(policies_for_policy_controller, ctx.policies.clone())
            .watches_shared_stream(
                servers_for_policy_controller,
                policies_to_requeue(ctx.policies.clone(), synced_inputs),
            )
            .reconcile_on(deleted_policies)
            .with_config(config.clone())
            .graceful_shutdown_on(shutdown.clone())
            .run(policy::reconcile, policy::error_policy, ctx.clone())
            .for_each(|result| log_result("haltsqlpolicy", result));

    let servers_store = ctx.servers.clone();
    let server_controller =
        Controller::for_shared_stream(servers_for_server_controller, ctx.servers.clone())
            .watches_shared_stream(policies_for_server_controller, move |policy| {
                server::servers_referencing(&servers_store, &policy).collect::<Vec<_>>()
            })
            .owns_shared_stream(deployments)
            .owns_shared_stream(config_maps)
            .owns_shared_stream(services)
            .owns_shared_stream(pdbs)
            .owns_shared_stream(network_policies)
            .reconcile_on(deleted_servers)
            .with_config(config)
            .graceful_shutdown_on(shutdown.clone())
            .run(server::reconcile, server::error_policy, ctx.clone())
            .for_each(|result| log_result("haltsqlserver", result));

    // The controllers start only after every store of the scope has synced,
    // and this is the only task that waits for that. A kube 5 store wakes
    // just one of several concurrent `wait_until_ready` callers (its
    // DelayedInit keeps a single waker), so a reconcile or a controller's own
    // startup waiting alongside could hang for good. Once synced, every later
    // wait returns at once.
    let judging = ctx.clone();
    let run = async move {
        tokio::select! {
            synced = ctx.wait_for_stores() => if !synced { return },
            _ = shutdown => return,
        }
        readiness.scopes_synced.fetch_add(1, Ordering::SeqCst);
        futures::future::join3(
            policy_controller,
            server_controller,
            policy::judge_ahead(judging),
        )
        .await;
    };

    let watches = stream::iter(root_streams).for_each_concurrent(None, |stream| stream);
    tokio::select! {
        _ = run => {}
        _ = watches => warn!("watch streams ended"),
    }
    // Keep the senders alive for the controllers' whole life.
    drop(requeues);
    Ok(())
}
