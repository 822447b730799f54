//! The manager tests' side of the real `haltsql-operator` binary.

use std::path::PathBuf;

use haltsql_testkit::launcher::Options;
use haltsql_testkit::{Cluster, fixtures};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

/// The operator binary built with these tests.
pub fn operator_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_haltsql-operator"))
}

/// How to start the operator binary: admin credentials on the full cluster,
/// watching `namespaces`.
pub fn options(namespaces: &[&str]) -> Options {
    Options::new(operator_bin(), namespaces)
}

/// Applies the quick start of config/samples (policy and server; the token
/// Secret too when `secret` is given) in `namespace`.
pub fn apply_quickstart(namespace: &str, secret: Option<&str>) {
    Cluster::Full.apply(&fixtures::quick_start_yaml(Some(namespace), secret));
}

/// The admin client of the full cluster, with the CRDs installed.
pub async fn client_with_crds() -> Client {
    let client = Cluster::Full.client().await;
    Cluster::Full.ensure_crds();
    client
}

/// Sets one field of an object by merge patch (admin client).
pub async fn merge_patch<K>(api: &Api<K>, name: &str, patch: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch {name}: {e}"));
}
