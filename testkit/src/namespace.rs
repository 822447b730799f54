//! A namespace of its own for each test, so tests share the clusters.

use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::cluster::Cluster;

/// A namespace of its own for one test, deleted (without waiting) when dropped
/// unless `HALTSQL_TEST_KEEP_NAMESPACES` is set.
pub struct TestNamespace {
    pub name: String,
    cluster: Cluster,
}

impl TestNamespace {
    /// A new namespace `<prefix>-<pid>-<n>` on the full cluster.
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
        delete_unless_kept(self.cluster.kubectl(), &self.name);
    }
}

/// Deletes a test's namespace without waiting, unless
/// `HALTSQL_TEST_KEEP_NAMESPACES` is set (to look at what a failed test left).
pub fn delete_unless_kept(mut kubectl: std::process::Command, name: &str) {
    if std::env::var_os("HALTSQL_TEST_KEEP_NAMESPACES").is_some() {
        return;
    }
    let _ = kubectl
        .args([
            "delete",
            "namespace",
            name,
            "--wait=false",
            "--ignore-not-found",
        ])
        .output();
}
