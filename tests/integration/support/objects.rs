//! The operator's objects as the tests build and read them.

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use haltsql_testkit::fixtures;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::json;

/// A HaltSQLPolicy object holding `document`.
pub fn policy_object(name: &str, document: &str) -> HaltSQLPolicy {
    serde_json::from_value(json!({
        "apiVersion": "haltsql.dev/v1alpha1",
        "kind": "HaltSQLPolicy",
        "metadata": {"name": name},
        "spec": {"policy": document}
    }))
    .expect("policy literal")
}

/// The quick-start HaltSQLServer of config/samples (two replicas, a token,
/// PDB and NetworkPolicy on), named `name` and loading the HaltSQLPolicy `policy`.
pub fn quick_start_server(name: &str, policy: &str) -> HaltSQLServer {
    quick_start_server_loading(name, &[policy])
}

/// [`quick_start_server`] loading several HaltSQLPolicies.
pub fn quick_start_server_loading(name: &str, policies: &[&str]) -> HaltSQLServer {
    let mut server = fixtures::quick_start_server();
    server["metadata"] = json!({"name": name});
    server["spec"]["policies"] = policies.iter().map(|p| json!({"name": p})).collect();
    serde_json::from_value(server).expect("the server sample is a HaltSQLServer")
}

/// The server's current per-configuration ConfigMap: the one its
/// `status.configChecksum` names (`None` until both exist).
pub async fn current_config_map(
    servers: &Api<HaltSQLServer>,
    config_maps: &Api<ConfigMap>,
    server: &str,
) -> Option<ConfigMap> {
    let checksum = servers.get(server).await.ok()?.status?.config_checksum?;
    let name = haltsql_operator::render::config_map_name(server, &checksum);
    config_maps.get_opt(&name).await.ok()?
}

/// Names of the server's per-configuration ConfigMaps
/// (`<server>-haltsql-config-<hash>`), sorted.
pub async fn config_map_names(config_maps: &Api<ConfigMap>, server: &str) -> Vec<String> {
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
