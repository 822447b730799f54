//! The operator's runtime, running in the test process itself.

use std::time::Duration;

use haltsql_operator::controllers::context::Settings;
use haltsql_operator::controllers::metrics::Metrics;
use haltsql_operator::controllers::runtime::Readiness;
use haltsql_testkit::paths::haltsql_bin;
use haltsql_testkit::{Cluster, TestNamespace, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

/// A namespace of its own on `cluster` (CRDs installed) and both controllers
/// watching it in this process.
pub async fn start_in_new_namespace(
    cluster: Cluster,
    prefix: &str,
    adjust: impl FnOnce(&mut Settings),
) -> (Client, TestNamespace, Operator) {
    cluster.ensure_crds();
    let client = cluster.client().await;
    let ns = TestNamespace::new_in(&client, cluster, prefix).await;
    let operator = Operator::start(&client, &[&ns.name], adjust);
    (client, ns, operator)
}

/// Both controllers in this process, watching only the given namespaces (so
/// tests in parallel never reconcile each other's objects).
pub struct Operator {
    pub metrics: Metrics,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Operator {
    /// Starts both controllers with test-friendly settings; `adjust` may change them.
    pub fn start(client: &Client, namespaces: &[&str], adjust: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = Settings::new(haltsql_bin());
        settings.watch_namespaces = Some(namespaces.iter().map(|s| s.to_string()).collect());
        settings.validator_timeout = Duration::from_secs(20);
        adjust(&mut settings);
        let metrics = Metrics::new().expect("metrics");
        let readiness = Readiness::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let client = client.clone();
            let metrics = metrics.clone();
            let readiness = readiness.clone();
            async move {
                let shutdown = async move {
                    let _ = stopped.await;
                };
                haltsql_operator::controllers::runtime::run(
                    client, settings, metrics, readiness, shutdown,
                )
                .await
                .expect("operator runtime");
            }
        });
        Operator {
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// API writes the operator made so far, by `kind/verb`.
    pub fn writes(&self) -> u64 {
        self.metrics
            .registry
            .gather()
            .iter()
            .filter(|f| f.name() == "haltsql_operator_api_writes_total")
            .flat_map(|f| {
                f.get_metric()
                    .iter()
                    .map(|m| m.get_counter().value() as u64)
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// Reconciles of `controller` (`haltsqlpolicy`, `haltsqlserver`) that
    /// ended with `result`.
    pub fn reconciles(&self, controller: &str, result: &str) -> u64 {
        self.metrics
            .registry
            .gather()
            .iter()
            .filter(|f| f.name() == "haltsql_operator_reconciles_total")
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| {
                let label = |name: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map(|l| l.value().to_owned())
                };
                label("controller").as_deref() == Some(controller)
                    && label("result").as_deref() == Some(result)
            })
            .map(|m| m.get_counter().value() as u64)
            .sum()
    }

    /// Stops the controllers, letting in-flight reconciles finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Plays the Deployment controller (envtest runs none): every replica of the
/// Deployment's current generation updated and available.
pub async fn complete_rollout(deployments: &Api<Deployment>, name: &str) {
    let deployment = eventually("the Deployment", Duration::from_secs(30), || async {
        deployments.get(name).await.ok()
    })
    .await;
    let replicas = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let status = serde_json::json!({"status": {
        "observedGeneration": deployment.metadata.generation,
        "replicas": replicas, "updatedReplicas": replicas,
        "readyReplicas": replicas, "availableReplicas": replicas,
    }});
    deployments
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("deployment status");
}
