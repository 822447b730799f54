//! What both controllers share: the client, the reflector stores, the
//! validator, metrics, backoff and the operator's settings (with their
//! defaults).

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use crate::api::{HaltSQLPolicy, HaltSQLServer};
use crate::controllers::backoff::Backoff;
use crate::controllers::judgement::Judged;
use crate::controllers::metrics::Metrics;
use crate::controllers::policy::validator::Validator;
use crate::controllers::server::PendingSince;
use crate::controllers::status_patch::{OwnWrites, patch_status};
use crate::render::RenderSettings;

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "haltsql-operator";

// The defaults of the settings, in one place: the flags and the offline
// `render` command refer to these.
/// Default of `--rollout-deadline-seconds`.
pub const DEFAULT_ROLLOUT_DEADLINE: Duration = Duration::from_secs(180);
/// Default of `--validator-timeout-seconds`.
pub const DEFAULT_VALIDATOR_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `--resync-seconds`.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(600);
/// Default of `--concurrency`.
pub const DEFAULT_CONCURRENCY: u16 = 32;
/// A failed reconcile is retried after this, doubling per failure in a row...
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// ... up to this.
const LONGEST_RETRY: Duration = Duration::from_secs(300);

/// Operator settings from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `haltsql` CLI used to validate policies.
    pub haltsql_binary: PathBuf,
    /// Namespaces to watch; `None` watches all.
    pub watch_namespaces: Option<Vec<String>>,
    /// How long one `haltsql validate` run may take.
    pub validator_timeout: Duration,
    /// How long a rollout may go without completing before `RolloutFailed`.
    pub rollout_deadline: Duration,
    /// Periodic re-reconcile of every object, so missed events are caught up.
    pub resync: Duration,
    /// Reconciles that may run at once in each controller, over every
    /// watched namespace together.
    pub concurrency: u16,
    /// `haltsql validate` processes that may run at once (all scopes together).
    pub validator_concurrency: usize,
}

impl Settings {
    pub fn new(haltsql_binary: PathBuf) -> Self {
        Self {
            haltsql_binary,
            watch_namespaces: None,
            validator_timeout: DEFAULT_VALIDATOR_TIMEOUT,
            rollout_deadline: DEFAULT_ROLLOUT_DEADLINE,
            resync: DEFAULT_RESYNC,
            concurrency: DEFAULT_CONCURRENCY,
            validator_concurrency: default_validator_concurrency(),
        }
    }

    /// What rendering takes from these settings.
    pub fn render_settings(&self) -> RenderSettings {
        RenderSettings {
            rollout_deadline: Some(self.rollout_deadline),
        }
    }
}

/// One validator run per core the operator may use.
pub fn default_validator_concurrency() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Caches of the objects the server controller owns. Only objects labelled
/// `app.kubernetes.io/managed-by: haltsql-operator` are cached; all but
/// Deployments (whose status matters) as metadata only.
#[derive(Clone)]
pub struct OwnedStores {
    pub deployments: Store<Deployment>,
    pub config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub services: Store<PartialObjectMeta<Service>>,
    pub pod_disruption_budgets: Store<PartialObjectMeta<PodDisruptionBudget>>,
    pub network_policies: Store<PartialObjectMeta<NetworkPolicy>>,
    /// The Deployments' ReplicaSets (they carry the pod template's labels):
    /// which per-configuration ConfigMaps are still in use.
    pub replica_sets: Store<PartialObjectMeta<ReplicaSet>>,
}

/// Every store of one watched scope.
pub struct ScopeStores {
    pub policies: Store<HaltSQLPolicy>,
    pub servers: Store<HaltSQLServer>,
    pub owned: OwnedStores,
}

impl ScopeStores {
    /// Stores that no watch fills: for a context that reconciles objects
    /// handed to it directly (the tests do).
    pub fn unwatched() -> Self {
        use kube::runtime::reflector::store;
        Self {
            policies: store().0,
            servers: store().0,
            owned: OwnedStores {
                deployments: store().0,
                config_maps: store().0,
                services: store().0,
                pod_disruption_budgets: store().0,
                network_policies: store().0,
                replica_sets: store().0,
            },
        }
    }
}

/// Handed to every reconcile of both controllers (one per watched scope).
pub struct Context {
    pub client: Client,
    /// The namespace this context watches, `None` for all.
    pub namespace: Option<String>,
    pub policies: Store<HaltSQLPolicy>,
    pub servers: Store<HaltSQLServer>,
    pub owned: OwnedStores,
    /// Shared by every scope, so its run limit and cache are the operator's.
    pub validator: Arc<Validator>,
    pub metrics: Metrics,
    pub policy_backoff: Backoff,
    pub server_backoff: Backoff,
    pub settings: Settings,
    /// Publishes Kubernetes Events about the servers.
    pub recorder: Recorder,
    /// Our status writes the stores have not shown yet.
    pub own_writes: OwnWrites,
    /// Servers holding off a `PolicyPendingValidation` report.
    pub pending_since: PendingSince,
    /// How many passes of each controller may run at once.
    pub pass_limits: Arc<PassLimits>,
    /// Policy judgements ahead of the status writes that report them.
    pub judged: Judged,
    /// Asks the server controller for a pass (`None`: nobody listens, as in
    /// a context the tests reconcile with directly).
    server_requeue: Option<UnboundedSender<ObjectRef<HaltSQLServer>>>,
}

/// How many passes of each controller may run at once, shared by every
/// scope: with one scope per namespace, a bound per scope would let fifty
/// namespaces put fifty times as many writes in flight at the API server.
#[derive(Debug)]
pub struct PassLimits {
    pub policy: Semaphore,
    pub server: Semaphore,
}

impl PassLimits {
    pub fn new(concurrency: u16) -> Self {
        let permits = usize::from(concurrency.max(1));
        Self {
            policy: Semaphore::new(permits),
            server: Semaphore::new(permits),
        }
    }
}

impl Context {
    /// A context over the given stores and validator, with fresh backoff
    /// state and event recorder.
    pub fn new(
        client: Client,
        namespace: Option<String>,
        stores: ScopeStores,
        validator: Arc<Validator>,
        settings: Settings,
        metrics: Metrics,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace,
            policies: stores.policies,
            servers: stores.servers,
            owned: stores.owned,
            validator,
            metrics,
            policy_backoff: Backoff::new(FIRST_RETRY, LONGEST_RETRY),
            server_backoff: Backoff::new(FIRST_RETRY, LONGEST_RETRY),
            pass_limits: Arc::new(PassLimits::new(settings.concurrency)),
            settings,
            own_writes: OwnWrites::default(),
            pending_since: PendingSince::default(),
            judged: Judged::default(),
            server_requeue: None,
        }
    }

    /// Sends the servers that a judgement concerns to `requeue`, the server
    /// controller's queue.
    pub fn with_server_requeue(
        mut self,
        requeue: UnboundedSender<ObjectRef<HaltSQLServer>>,
    ) -> Self {
        self.server_requeue = Some(requeue);
        self
    }

    /// Asks the server controller for a pass over each of `servers`.
    pub fn requeue_servers(&self, servers: impl IntoIterator<Item = ObjectRef<HaltSQLServer>>) {
        let Some(requeue) = &self.server_requeue else {
            return;
        };
        for server in servers {
            // Closed only while the operator stops; nothing to do then.
            let _ = requeue.unbounded_send(server);
        }
    }

    /// Shares `limits` with the other scopes' contexts instead of a bound of
    /// this context's own.
    pub fn with_pass_limits(mut self, limits: Arc<PassLimits>) -> Self {
        self.pass_limits = limits;
        self
    }

    /// Writes `new` as the status of `obj`, whose status was read as `old`
    /// (see [`patch_status`]).
    pub async fn write_status<K, S>(
        &self,
        obj: &K,
        old: Option<&S>,
        new: &S,
    ) -> Result<(), kube::Error>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
        S: Serialize,
    {
        patch_status(&self.client, obj, old, new, &self.metrics, &self.own_writes).await
    }

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

/// The key backoff and logs use for an object.
pub fn object_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}
