//! The guide's quick start, read from `config/samples/` (the files users
//! apply), never retyped: the HaltSQLPolicy `orders`, the HaltSQLServer
//! `haltsql`, and the token Secret they need.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::paths::repo_root;

pub const POLICY_SAMPLE: &str = "config/samples/haltsql_v1alpha1_haltsqlpolicy.yaml";
pub const SERVER_SAMPLE: &str = "config/samples/haltsql_v1alpha1_haltsqlserver.yaml";
pub const BUNDLE_POLICY_SAMPLE: &str = "config/samples/haltsql_v1alpha1_haltsqlpolicy_bundle.yaml";

/// The token Secret's name and key in the server sample.
pub const TOKEN_SECRET: &str = "haltsql-tokens";
pub const TOKEN_KEY: &str = "orders-agent.sha256";
/// SHA-256 of the token `test`, for tests that never present the token.
pub const TEST_TOKEN_SHA256: &str =
    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// The columns of `app.orders` in the sample policy document.
const SAMPLE_COLUMNS: &str = "columns: [id, status, total_cents]";

/// A sample file that cannot serve as the quick start: missing, not YAML,
/// or edited out of the shape the kit reads.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct FixtureError {
    pub file: String,
    pub problem: String,
}

/// One sample file (a single document), as JSON.
pub fn try_sample(rel: &str) -> Result<Value, FixtureError> {
    let path = repo_root().join(rel);
    let located = |problem: String| FixtureError {
        file: path.display().to_string(),
        problem,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| located(e.to_string()))?;
    serde_yaml::from_str(&text).map_err(|e| located(e.to_string()))
}

/// [`try_sample`] for tests, where a broken sample fails the test.
pub fn sample(rel: &str) -> Value {
    try_sample(rel).unwrap_or_else(|e| panic!("{e}"))
}

/// The HaltSQLPolicy `orders`.
pub fn quick_start_policy() -> Value {
    sample(POLICY_SAMPLE)
}

/// The HaltSQLServer `haltsql` (two replicas, a token, PDB and NetworkPolicy on).
pub fn quick_start_server() -> Value {
    sample(SERVER_SAMPLE)
}

/// The sample policy's document (`orders-agent`), with the given columns
/// of `app.orders`.
pub fn try_quick_start_policy_document(columns: &[&str]) -> Result<String, FixtureError> {
    let shape = |problem: &str| FixtureError {
        file: POLICY_SAMPLE.to_owned(),
        problem: problem.to_owned(),
    };
    let policy = try_sample(POLICY_SAMPLE)?;
    let document = policy["spec"]["policy"]
        .as_str()
        .ok_or_else(|| shape("no inline spec.policy"))?;
    if !document.contains(SAMPLE_COLUMNS) {
        return Err(shape(&format!(
            "the document does not list {SAMPLE_COLUMNS}"
        )));
    }
    Ok(document.replace(
        SAMPLE_COLUMNS,
        &format!("columns: [{}]", columns.join(", ")),
    ))
}

/// [`try_quick_start_policy_document`] for tests.
pub fn quick_start_policy_document(columns: &[&str]) -> String {
    try_quick_start_policy_document(columns).unwrap_or_else(|e| panic!("{e}"))
}

/// The token Secret the server sample references, holding `sha256`.
pub fn token_secret(sha256: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN_SECRET},
        "stringData": {TOKEN_KEY: sha256}
    })
}

/// Creates the token Secret (see [`token_secret`]) in `namespace`.
pub async fn create_token_secret(client: &kube::Client, namespace: &str, sha256: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret: Secret = serde_json::from_value(token_secret(sha256)).expect("a Secret literal");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("create the token Secret in {namespace}: {e}"));
}

/// `object` with `metadata.namespace` set.
pub fn in_namespace(mut object: Value, namespace: &str) -> Value {
    object["metadata"]["namespace"] = json!(namespace);
    object
}

/// One object as YAML, in `namespace` when given.
pub fn yaml_in(object: Value, namespace: Option<&str>) -> String {
    let object = match namespace {
        Some(ns) => in_namespace(object, ns),
        None => object,
    };
    to_yaml(&[object])
}

/// Objects as one multi-document YAML stream.
pub fn to_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_yaml::to_string(o).expect("JSON values serialise as YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The quick start (the policy and the server; the token Secret first when
/// `secret` is given), in `namespace` when given, as YAML.
pub fn quick_start_yaml(namespace: Option<&str>, secret: Option<&str>) -> String {
    secret
        .map(token_secret)
        .into_iter()
        .chain([quick_start_policy(), quick_start_server()])
        .map(|o| yaml_in(o, namespace))
        .collect::<Vec<_>>()
        .join("---\n")
}
