//! Shared helpers for the tests that run against the local control plane
//! (`hack/cluster.sh`). Tests fail, never skip, when the cluster is absent.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Which local control plane a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cluster {
    /// etcd + kube-apiserver + controller-manager + scheduler + kwok.
    Full,
    /// etcd + kube-apiserver only: nothing acts on Deployments but the test.
    Envtest,
    /// The control plane plus a real node (containerd, kubelet, kube-proxy):
    /// pods run as containers (`hack/cluster.sh up node`).
    Node,
    /// Like `Full`, for the fault suite alone, which restarts its API server
    /// and etcd (`hack/cluster.sh up chaos`).
    Chaos,
}

impl Cluster {
    pub fn kubeconfig(self) -> PathBuf {
        let (var, default) = match self {
            Cluster::Full => ("HALTSQL_TEST_KUBECONFIG", ".cluster/full/kubeconfig"),
            Cluster::Envtest => ("HALTSQL_ENVTEST_KUBECONFIG", ".cluster/envtest/kubeconfig"),
            Cluster::Node => ("HALTSQL_NODE_KUBECONFIG", ".cluster/node/kubeconfig"),
            Cluster::Chaos => ("HALTSQL_CHAOS_KUBECONFIG", ".cluster/chaos/kubeconfig"),
        };
        std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join(default))
    }
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `haltsql` CLI built from this workspace (`HALTSQL_BIN` overrides).
pub fn haltsql_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("HALTSQL_BIN") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let path = target.join("debug").join("haltsql");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p haltsql` or set HALTSQL_BIN",
        path.display()
    );
    path
}

/// A client for the given local cluster; panics with a hint when it is not running.
pub async fn client_for(cluster: Cluster) -> Client {
    let path = cluster.kubeconfig();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {} ({e}); start the cluster with `make cluster-up` (or `make test`)",
            path.display()
        )
    });
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig of the local cluster is usable");
    let client = Client::try_from(config).expect("client from the local kubeconfig");
    client.apiserver_version().await.unwrap_or_else(|e| {
        panic!(
            "the {cluster:?} cluster at {} does not answer: {e}",
            path.display()
        )
    });
    client
}

/// A client for the full local cluster.
pub async fn client() -> Client {
    client_for(Cluster::Full).await
}

/// `bin/kubectl` pointed at the given cluster.
pub fn kubectl_for(cluster: Cluster) -> Command {
    let mut cmd = Command::new(repo_root().join("bin/kubectl"));
    cmd.arg("--kubeconfig").arg(cluster.kubeconfig());
    cmd
}

pub fn kubectl() -> Command {
    kubectl_for(Cluster::Full)
}

/// Runs a command and returns its stdout, panicking with its stderr on failure.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace of its own for one test, deleted (without waiting) when dropped.
pub struct TestNamespace {
    pub name: String,
    cluster: Cluster,
}

impl TestNamespace {
    pub async fn new(client: &Client, prefix: &str) -> Self {
        Self::new_in(client, Cluster::Full, prefix).await
    }

    pub async fn new_in(client: &Client, cluster: Cluster, prefix: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"haltsql.dev/test": "true"}}
        }))
        .expect("namespace literal");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        TestNamespace { name, cluster }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("HALTSQL_TEST_KEEP_NAMESPACES").is_some() {
            return;
        }
        let _ = kubectl_for(self.cluster)
            .args([
                "delete",
                "namespace",
                &self.name,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

/// Polls `check` until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes an object, ignoring "not found".
pub async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("delete {name}: {e}"),
    }
}

pub fn path_exists(path: &Path) -> bool {
    path.exists()
}

/// Installs (or updates) the CRDs from `crds/` in the given cluster and waits
/// until they are established. Idempotent; safe to call from every test.
pub fn ensure_crds(cluster: Cluster) {
    run_ok(
        kubectl_for(cluster)
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(repo_root().join("crds")),
    );
    run_ok(kubectl_for(cluster).args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/haltsqlpolicies.haltsql.dev",
        "crd/haltsqlservers.haltsql.dev",
    ]));
}

/// The operator's runtime, running in this test process and watching only the
/// given namespaces (so tests in parallel never reconcile each other's objects).
pub struct Operator {
    pub metrics: haltsql_operator::controllers::metrics::Metrics,
    pub readiness: haltsql_operator::controllers::runtime::Readiness,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Operator {
    /// Starts both controllers with test-friendly settings; `adjust` may change them.
    pub fn start(
        client: &Client,
        namespaces: &[&str],
        adjust: impl FnOnce(&mut haltsql_operator::controllers::context::Settings),
    ) -> Self {
        let mut settings = haltsql_operator::controllers::context::Settings::new(haltsql_bin());
        settings.watch_namespaces = Some(namespaces.iter().map(|s| s.to_string()).collect());
        settings.validator_timeout = Duration::from_secs(20);
        adjust(&mut settings);
        let metrics = haltsql_operator::controllers::metrics::Metrics::new().expect("metrics");
        let readiness = haltsql_operator::controllers::runtime::Readiness::default();
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
            readiness,
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

/// The guide's quick-start policy document, with the given columns.
pub fn quick_start_policy_document(columns: &[&str]) -> String {
    format!(
        "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: orders-agent\ndialect: postgres\nsearch_path: [app]\nstatements:\n  allow: [select]\nrequire_limit:\n  max: 100\ntables:\n  app.orders:\n    columns: [{}]\n",
        columns.join(", ")
    )
}

/// A HaltSQLPolicy object holding `document`.
pub fn policy_object(name: &str, document: &str) -> haltsql_operator::api::HaltSQLPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "haltsql.dev/v1alpha1",
        "kind": "HaltSQLPolicy",
        "metadata": {"name": name},
        "spec": {"policy": document}
    }))
    .expect("policy literal")
}

/// The guide's quick-start HaltSQLServer (two replicas, a token, PDB and NetworkPolicy on).
pub fn quick_start_server(name: &str, policy: &str) -> haltsql_operator::api::HaltSQLServer {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "haltsql.dev/v1alpha1",
        "kind": "HaltSQLServer",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "image": "ghcr.io/haltsql/haltsql:0.0.1",
            "policies": [{"name": policy}],
            "auth": {"tokens": [{
                "name": "orders-agent",
                "policy": "orders-agent",
                "sha256SecretRef": {"name": "haltsql-tokens", "key": "orders-agent.sha256"}
            }]},
            "podDisruptionBudget": {"enabled": true},
            "networkPolicy": {"enabled": true, "ingressFrom": [{"podSelector": {"matchLabels": {"app": "orders-agent"}}}]}
        }
    }))
    .expect("server literal")
}

/// The status of the condition `type_` on an object's status conditions, as
/// `(status, reason)`.
pub fn condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<(String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// The server's current per-configuration ConfigMap: the one its
/// `status.configChecksum` names (`None` until both exist).
pub async fn current_config_map(
    servers: &Api<haltsql_operator::api::HaltSQLServer>,
    config_maps: &Api<k8s_openapi::api::core::v1::ConfigMap>,
    server: &str,
) -> Option<k8s_openapi::api::core::v1::ConfigMap> {
    let checksum = servers.get(server).await.ok()?.status?.config_checksum?;
    let name = haltsql_operator::render::config_map_name(server, &checksum);
    config_maps.get_opt(&name).await.ok()?
}

/// Names of the server's per-configuration ConfigMaps
/// (`<server>-haltsql-config-<hash>`), sorted.
pub async fn config_map_names(
    config_maps: &Api<k8s_openapi::api::core::v1::ConfigMap>,
    server: &str,
) -> Vec<String> {
    let prefix = format!("{}-", haltsql_operator::render::config_map_prefix(server));
    let mut names: Vec<String> = config_maps
        .list_metadata(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("list ConfigMaps: {e}"))
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|n| n.starts_with(&prefix))
        .collect();
    names.sort();
    names
}
