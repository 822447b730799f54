//! The CRDs against the real API server: they install, every CEL and range
//! rule rejects what it should with a readable message, the guide's samples
//! are accepted, defaults are applied, raw sections are preserved, the
//! printer columns, the scale subresource and `kubectl explain` work.
//!
//! Needs the local cluster (`make cluster-up`); fails when it is absent.

use crate::support;

use std::sync::OnceLock;
use std::time::Duration;

use crate::support::TestNamespace;
use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use serde_json::{Value, json};

/// Applies the generated CRDs once per test process and waits until served.
fn ensure_crds() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| support::Cluster::Full.ensure_crds());
}

fn policy_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::erase::<HaltSQLPolicy>(&()),
    )
}

fn server_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::erase::<HaltSQLServer>(&()),
    )
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    let value = json!({
        "apiVersion": "haltsql.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    });
    match serde_json::from_value(value) {
        Ok(obj) => obj,
        Err(err) => panic!("bad test object: {err}"),
    }
}

/// Creates the object for real, retrying while the new CRD is not served yet.
async fn create(api: &Api<DynamicObject>, obj: &DynamicObject) -> Result<DynamicObject, String> {
    create_with(api, obj, false).await
}

async fn create_with(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
    dry_run: bool,
) -> Result<DynamicObject, String> {
    let params = PostParams {
        dry_run,
        ..Default::default()
    };
    let mut tries = 0;
    loop {
        match api.create(&params, obj).await {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(status)) if status.code == 404 && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "unexpected error: {status:?}");
                return Err(status.message.clone());
            }
            Err(err) => panic!("create failed: {err}"),
        }
    }
}

/// Asserts that the API server rejects `spec` with a message containing each
/// of `expected`.
async fn rejects(api: &Api<DynamicObject>, kind: &str, spec: Value, expected: &[&str]) {
    match create_with(api, &object(kind, "rejected", spec.clone()), true).await {
        Ok(_) => panic!("{kind} with spec {spec} was accepted"),
        Err(message) => {
            for want in expected {
                assert!(
                    message.contains(want),
                    "{kind} spec {spec}: message {message:?} lacks {want:?}"
                );
            }
        }
    }
}

async fn accepts(api: &Api<DynamicObject>, kind: &str, spec: Value) -> DynamicObject {
    match create_with(api, &object(kind, "accepted", spec.clone()), true).await {
        Ok(obj) => obj,
        Err(message) => panic!("{kind} with spec {spec} was rejected: {message}"),
    }
}

const POLICY_DOC: &str = "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: p\ntables:\n  t:\n    columns: [a]\n";
const KEY: &str = "MCowBQYDK2VwAyEAfcQ9p2U7GuAiEv64CrY47vsSFegSoAsgE8jLpcHIVE0=";

fn oci() -> Value {
    json!({"ref": "ghcr.io/corp/p:prod"})
}

#[tokio::test]
async fn policy_rules_reject_with_readable_messages() {
    ensure_crds();
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "api-policy-rules").await;
    let api = policy_api(&client, &ns.name);
    let k = "HaltSQLPolicy";
    let one_of = "exactly one of spec.policy or spec.bundleSource must be set";

    rejects(&api, k, json!({}), &[one_of]).await;
    rejects(
        &api,
        k,
        json!({"policy": POLICY_DOC, "bundleSource": {"oci": oci(), "publicKeys": [KEY]}}),
        &[one_of],
    )
    .await;

    // 256 KiB: too many characters, and too many bytes in fewer characters.
    rejects(
        &api,
        k,
        json!({"policy": "a".repeat(262_145)}),
        &["spec.policy", "262144"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"policy": "\u{20ac}".repeat(100_000)}),
        &["the policy document must be at most 256 KiB"],
    )
    .await;
    accepts(&api, k, json!({"policy": "a".repeat(262_144)})).await;

    let locations = "bundleSource needs exactly one of oci, https or s3";
    rejects(
        &api,
        k,
        json!({"bundleSource": {"publicKeys": [KEY]}}),
        &[locations],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"oci": oci(), "https": {"url": "https://x/b"}, "publicKeys": [KEY]}}),
        &[locations],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"gcs": {"bucket": "b", "object": "o"}, "publicKeys": [KEY]}}),
        &[
            "spec.bundleSource.gcs",
            "GCS bundle sources are not supported",
        ],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"oci": oci(), "publicKeys": []}}),
        &["spec.bundleSource.publicKeys", "at least 1 item"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"oci": oci()}}),
        &["spec.bundleSource.publicKeys", "Required value"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"oci": oci(), "publicKeys": [KEY], "pollIntervalSeconds": 9}}),
        &[
            "spec.bundleSource.pollIntervalSeconds",
            "greater than or equal to 10",
        ],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"oci": oci(), "publicKeys": [KEY], "pollIntervalSeconds": 86401}}),
        &[
            "spec.bundleSource.pollIntervalSeconds",
            "less than or equal to 86400",
        ],
    )
    .await;
    for seconds in [10, 86400] {
        accepts(
            &api,
            k,
            json!({"bundleSource": {"oci": oci(), "publicKeys": [KEY], "pollIntervalSeconds": seconds}}),
        )
        .await;
    }
    rejects(
        &api,
        k,
        json!({"bundleSource": {"https": {"url": "http://example.com/b"}, "publicKeys": [KEY]}}),
        &["url must start with https://"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"oci": {"ref": "r", "auth": {"type": "token", "secretName": "s", "usernameKey": "u"}}, "publicKeys": [KEY]}}),
        &["tokenKey goes with type token"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"oci": {"ref": "r", "auth": {"type": "oauth", "secretName": "s"}}, "publicKeys": [KEY]}}),
        &["spec.bundleSource.oci.auth.type", "Unsupported value"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"s3": {"bucket": "b", "key": "k", "credentials": {"source": "static"}}, "publicKeys": [KEY]}}),
        &["credentials with source static need secretName"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"bundleSource": {"s3": {"bucket": "b", "key": "k", "credentials": {"source": "env", "secretName": "s"}}, "publicKeys": [KEY]}}),
        &["only used with source static"],
    )
    .await;
}

#[tokio::test]
async fn policy_forms_are_accepted_and_defaulted() {
    ensure_crds();
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "api-policy-forms").await;
    let api = policy_api(&client, &ns.name);
    let k = "HaltSQLPolicy";

    accepts(&api, k, json!({"policy": POLICY_DOC})).await;
    accepts(
        &api,
        k,
        json!({"bundleSource": {
            "https": {"url": "https://bundles.example/p.tar", "auth": {"type": "token", "secretName": "s", "tokenKey": "t"}},
            "publicKeys": [KEY]}}),
    )
    .await;
    accepts(
        &api,
        k,
        json!({"bundleSource": {
            "s3": {"bucket": "b", "key": "p.tar", "region": "eu-west-1", "endpoint": "https://minio:9000",
                   "credentials": {"source": "static", "secretName": "aws", "sessionTokenKey": "session"}},
            "publicKeys": [KEY], "namePrefix": "prod."}}),
    )
    .await;
    for source in ["env", "web_identity", "instance"] {
        accepts(
            &api,
            k,
            json!({"bundleSource": {"s3": {"bucket": "b", "key": "k", "credentials": {"source": source}}, "publicKeys": [KEY]}}),
        )
        .await;
    }

    let created = match create(
        &api,
        &object(
            "HaltSQLPolicy",
            "defaulted",
            json!({"bundleSource": {"oci": oci(), "publicKeys": [KEY]}}),
        ),
    )
    .await
    {
        Ok(obj) => obj,
        Err(message) => panic!("rejected: {message}"),
    };
    assert_eq!(
        created.data["spec"]["bundleSource"]["pollIntervalSeconds"],
        json!(60)
    );
    // The typed Rust object reads what the API server returns.
    let typed: HaltSQLPolicy = match serde_json::to_value(&created).and_then(serde_json::from_value)
    {
        Ok(p) => p,
        Err(err) => panic!("typed read: {err}"),
    };
    let bundle = typed
        .spec
        .bundle_source
        .as_ref()
        .map(|b| b.poll_interval_seconds());
    assert_eq!(bundle, Some(60));
}

#[tokio::test]
async fn server_rules_reject_with_readable_messages() {
    ensure_crds();
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "api-server-rules").await;
    let api = server_api(&client, &ns.name);
    let k = "HaltSQLServer";
    let base = || json!({"image": "haltsql:dev", "policies": [{"name": "p"}]});
    let with = |key: &str, value: Value| {
        let mut spec = base();
        spec[key] = value;
        spec
    };

    rejects(
        &api,
        k,
        json!({"policies": [{"name": "p"}]}),
        &["spec.image", "Required value"],
    )
    .await;
    rejects(
        &api,
        k,
        json!({"image": "i"}),
        &["spec.policies", "Required value"],
    )
    .await;
    rejects(
        &api,
        k,
        with("policies", json!([])),
        &["spec.policies", "at least 1 item"],
    )
    .await;
    let many: Vec<Value> = (0..257).map(|i| json!({"name": format!("p{i}")})).collect();
    rejects(
        &api,
        k,
        with("policies", json!(many)),
        &["spec.policies", "at most 256 item"],
    )
    .await;
    let enough: Vec<Value> = (0..256).map(|i| json!({"name": format!("p{i}")})).collect();
    accepts(&api, k, with("policies", json!(enough))).await;
    rejects(
        &api,
        k,
        with("policies", json!([{"name": "p"}, {"name": "p"}])),
        &["spec.policies[1]", "Duplicate value"],
    )
    .await;
    rejects(
        &api,
        k,
        with("replicas", json!(-1)),
        &["spec.replicas", "greater than or equal to 0"],
    )
    .await;
    accepts(&api, k, with("replicas", json!(0))).await;
    rejects(
        &api,
        k,
        with(
            "podDisruptionBudget",
            json!({"enabled": true, "minAvailable": 1, "maxUnavailable": "50%"}),
        ),
        &[
            "spec.podDisruptionBudget",
            "set at most one of minAvailable and maxUnavailable",
        ],
    )
    .await;
    rejects(
        &api,
        k,
        with("service", json!({"port": 0})),
        &["spec.service.port", "greater than or equal to 1"],
    )
    .await;
    rejects(
        &api,
        k,
        with("service", json!({"port": 65536})),
        &["spec.service.port", "less than or equal to 65535"],
    )
    .await;
    rejects(
        &api,
        k,
        with("service", json!({"type": "ExternalName"})),
        &["spec.service.type", "Unsupported value"],
    )
    .await;
    rejects(
        &api,
        k,
        with("config", json!({"maxRequestBytes": 1023})),
        &[
            "spec.config.maxRequestBytes",
            "greater than or equal to 1024",
        ],
    )
    .await;
    rejects(
        &api,
        k,
        with("config", json!({"maxRequestBytes": 16_777_217})),
        &[
            "spec.config.maxRequestBytes",
            "less than or equal to 16777216",
        ],
    )
    .await;
    rejects(
        &api,
        k,
        with("config", json!({"logLevel": "verbose"})),
        &["spec.config.logLevel", "Unsupported value"],
    )
    .await;
    rejects(
        &api,
        k,
        with("tls", json!({"secretName": "tls", "minVersion": "1.1"})),
        &["spec.tls.minVersion", "Unsupported value"],
    )
    .await;
    rejects(
        &api,
        k,
        with(
            "auth",
            json!({"mtls": {"identities": [{"subject": "CN=a", "policy": "p"}]}}),
        ),
        &["auth.mtls.identities need tls with clientAuth optional or required"],
    )
    .await;
    let mut mtls_ok = with(
        "auth",
        json!({"mtls": {"identities": [{"subject": "CN=a", "policy": "p"}]}}),
    );
    mtls_ok["tls"] = json!({"secretName": "tls", "clientAuth": "required"});
    accepts(&api, k, mtls_ok).await;
    rejects(
        &api,
        k,
        with(
            "auth",
            json!({"tokens": [
                {"name": "a", "policy": "p", "sha256SecretRef": {"name": "s", "key": "a"}},
                {"name": "a", "policy": "p", "sha256SecretRef": {"name": "s", "key": "b"}}]}),
        ),
        &["spec.auth.tokens[1]", "Duplicate value"],
    )
    .await;
    rejects(
        &api,
        k,
        with(
            "auth",
            json!({"tokens": [{"name": "a", "policy": "p", "sha256SecretRef": {"name": "s"}}]}),
        ),
        &["spec.auth.tokens[0].sha256SecretRef.key", "Required value"],
    )
    .await;
}

#[tokio::test]
async fn server_defaults_and_raw_sections() {
    ensure_crds();
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "api-server-defaults").await;
    let api = server_api(&client, &ns.name);

    let created = match create(
        &api,
        &object(
            "HaltSQLServer",
            "minimal",
            json!({"image": "haltsql:dev", "policies": [{"name": "p"}]}),
        ),
    )
    .await
    {
        Ok(obj) => obj,
        Err(message) => panic!("rejected: {message}"),
    };
    let spec = &created.data["spec"];
    assert_eq!(spec["replicas"], json!(2));
    assert_eq!(spec["automountServiceAccountToken"], json!(false));
    assert_eq!(spec["service"], json!({"type": "ClusterIP", "port": 8080}));
    assert_eq!(
        spec["resources"],
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
    assert!(spec.get("podDisruptionBudget").is_none());
    assert!(spec.get("networkPolicy").is_none());

    // Raw sections come back exactly as given, unknown keys included.
    let raw = json!({
        "image": "haltsql:dev",
        "policies": [{"name": "p"}],
        "config": {
            "telemetry": {"otlp": {"endpoint": "http://otel:4317", "headers": {"x": {"secretKeyRef": {"name": "otel", "key": "h"}}}}},
            "opa": {"url": "http://opa:8181", "nested": [1, {"a": true}]},
            "admin": {"listen": "127.0.0.1:9090"},
            "secrets": {"vault": {"address": "https://vault:8200", "auth": {"kubernetes": {"role": "haltsql"}}}}
        },
        "auth": {
            "oidc": [{"issuer": "https://idp", "audience": "haltsql", "policy_claim": "haltsql_policy", "extra": {"k": [1, 2]}}],
            "mtls": {"identities": [{"dns_name": "agent.svc", "policy": "p"}]}
        },
        "tls": {"secretName": "tls", "clientAuth": "optional", "minVersion": "1.3"},
        "audit": {
            "logRawSQL": true,
            "sinks": [
                {"type": "elasticsearch", "url": "https://es:9200", "data_stream": "logs-haltsql-prod",
                 "auth": {"api_key": {"secretKeyRef": {"name": "es-credentials", "key": "api-key"}}}},
                {"type": "kafka", "brokers": ["kafka:9093"], "topic": "haltsql.audit",
                 "tls": {"ca_file": {"secretKeyRef": {"name": "kafka-tls", "key": "ca.crt"}}},
                 "sasl": {"mechanism": "scram-sha-512", "username": "haltsql",
                          "password": {"secretKeyRef": {"name": "kafka-credentials", "key": "password"}}}}
            ]
        }
    });
    let created = match create(&api, &object("HaltSQLServer", "raw", raw.clone())).await {
        Ok(obj) => obj,
        Err(message) => panic!("rejected: {message}"),
    };
    for key in ["config", "auth", "audit", "tls"] {
        assert_eq!(created.data["spec"][key], raw[key], "{key}");
    }
    // The typed object round-trips the raw sections too.
    let typed: HaltSQLServer = match serde_json::to_value(&created).and_then(serde_json::from_value)
    {
        Ok(s) => s,
        Err(err) => panic!("typed read: {err}"),
    };
    let back = match serde_json::to_value(&typed.spec) {
        Ok(v) => v,
        Err(err) => panic!("serialize: {err}"),
    };
    for key in ["config", "auth", "audit", "tls"] {
        assert_eq!(back[key], raw[key], "{key}");
    }
}

/// Reads a sample from config/samples into the given namespace.
fn sample(file: &str) -> DynamicObject {
    let path = support::repo_root().join("config/samples").join(file);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) => panic!("{}: {err}", path.display()),
    };
    match serde_yaml::from_str(&text) {
        Ok(obj) => obj,
        Err(err) => panic!("{}: {err}", path.display()),
    }
}

#[tokio::test]
async fn samples_are_accepted() {
    ensure_crds();
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "api-samples").await;
    for (file, api) in [
        (
            "haltsql_v1alpha1_haltsqlpolicy.yaml",
            policy_api(&client, &ns.name),
        ),
        (
            "haltsql_v1alpha1_haltsqlpolicy_bundle.yaml",
            policy_api(&client, &ns.name),
        ),
        (
            "haltsql_v1alpha1_haltsqlserver.yaml",
            server_api(&client, &ns.name),
        ),
    ] {
        if let Err(message) = create(&api, &sample(file)).await {
            panic!("{file} rejected: {message}");
        }
    }
    // The quick-start server keeps every field it was given.
    let server = sample("haltsql_v1alpha1_haltsqlserver.yaml");
    let stored = match server_api(&client, &ns.name).get("haltsql").await {
        Ok(obj) => obj,
        Err(err) => panic!("get: {err}"),
    };
    for key in ["replicas", "image", "policies", "auth", "networkPolicy"] {
        assert_eq!(stored.data["spec"][key], server.data["spec"][key], "{key}");
    }
    assert_eq!(
        stored.data["spec"]["podDisruptionBudget"],
        json!({"enabled": true})
    );
}

/// The header line of `kubectl get`, split into column names.
fn kubectl_header(ns: &str, resource: &str) -> Vec<String> {
    let out = support::run_ok(
        support::Cluster::Full
            .kubectl()
            .args(["get", resource, "-n", ns]),
    );
    out.lines()
        .next()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The server-side Table of a resource (what `kubectl get` prints), with the
/// objects included, so that cells and objects are read atomically even when
/// an operator updates the status concurrently.
async fn table(client: &Client, ns: &str, plural: &str) -> Value {
    let uri = format!("/apis/haltsql.dev/v1alpha1/namespaces/{ns}/{plural}?includeObject=Object");
    let request = http::Request::get(uri)
        .header(
            http::header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .body(Vec::new());
    let request = match request {
        Ok(r) => r,
        Err(err) => panic!("request: {err}"),
    };
    let text = match client.request_text(request).await {
        Ok(t) => t,
        Err(err) => panic!("table of {plural}: {err}"),
    };
    match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(err) => panic!("table json: {err}: {text}"),
    }
}

fn condition_field(obj: &Value, type_: &str, field: &str) -> Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .map(|c| c[field].clone())
        .unwrap_or(Value::Null)
}

/// Column names and the first row's cells (without the age) with its object.
fn first_row(table: &Value) -> (Vec<String>, Vec<Value>, Value) {
    let names = table["columnDefinitions"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_uppercase))
                .collect()
        })
        .unwrap_or_default();
    let row = &table["rows"][0];
    let cells = row["cells"].as_array().cloned().unwrap_or_default();
    (names, cells, row["object"].clone())
}

#[tokio::test]
async fn printer_columns_match_the_guide() {
    ensure_crds();
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "api-columns").await;
    let policies = policy_api(&client, &ns.name);
    let servers = server_api(&client, &ns.name);
    if let Err(m) = create(&policies, &sample("haltsql_v1alpha1_haltsqlpolicy.yaml")).await {
        panic!("{m}");
    }
    if let Err(m) = create(&servers, &sample("haltsql_v1alpha1_haltsqlserver.yaml")).await {
        panic!("{m}");
    }
    // An operator may run against this cluster and rewrite the status at any
    // time; the table is compared with the object returned alongside it.
    let now = "2026-01-01T00:00:00Z";
    let cond = |t: &str, s: &str, r: &str| json!({"type": t, "status": s, "reason": r, "message": "", "lastTransitionTime": now, "observedGeneration": 1});
    let status = json!({"status": {
        "observedGeneration": 1, "policyName": "orders-agent", "contentHash": "ab",
        "conditions": [cond("Valid", "True", "Validated"), cond("Synced", "False", "RollingOut")]}});
    if let Err(err) = policies
        .patch_status("orders", &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        panic!("patch policy status: {err}");
    }
    let status = json!({"status": {
        "observedGeneration": 1, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2,
        "selector": "app.kubernetes.io/instance=haltsql",
        "conditions": [cond("Available", "False", "Unavailable"), cond("Ready", "False", "Unavailable")]}});
    if let Err(err) = servers
        .patch_status("haltsql", &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        panic!("patch server status: {err}");
    }

    assert_eq!(
        kubectl_header(&ns.name, "haltsqlpolicies"),
        ["NAME", "POLICY", "VALID", "SYNCED", "AGE"]
    );
    assert_eq!(
        kubectl_header(&ns.name, "haltsqlservers"),
        ["NAME", "REPLICAS", "READY", "STATUS", "AGE"]
    );

    let (names, cells, obj) = first_row(&table(&client, &ns.name, "haltsqlpolicies").await);
    assert_eq!(names, ["NAME", "POLICY", "VALID", "SYNCED", "AGE"]);
    assert_eq!(cells[0], json!("orders"));
    assert_eq!(cells[1], obj["status"]["policyName"]);
    assert_eq!(cells[2], condition_field(&obj, "Valid", "status"));
    assert_eq!(cells[3], condition_field(&obj, "Synced", "status"));
    assert_eq!(cells[1], json!("orders-agent"));
    assert!(
        matches!(cells[2].as_str(), Some("True" | "False" | "Unknown")),
        "{cells:?}"
    );

    let (names, cells, obj) = first_row(&table(&client, &ns.name, "haltsqlservers").await);
    assert_eq!(names, ["NAME", "REPLICAS", "READY", "STATUS", "AGE"]);
    assert_eq!(cells[0], json!("haltsql"));
    assert_eq!(cells[1], json!(2));
    assert_eq!(cells[1], obj["spec"]["replicas"]);
    assert_eq!(cells[2], obj["status"]["readyReplicas"]);
    assert_eq!(cells[3], condition_field(&obj, "Ready", "reason"));
    assert!(cells[3].is_string(), "{cells:?}");

    // Short names and the category work as well.
    assert_eq!(kubectl_header(&ns.name, "hsp")[..2], ["NAME", "POLICY"]);
    assert_eq!(kubectl_header(&ns.name, "hss")[..2], ["NAME", "REPLICAS"]);
    let out = support::run_ok(
        support::Cluster::Full
            .kubectl()
            .args(["get", "haltsql", "-n", &ns.name, "-o", "name"]),
    );
    assert!(out.contains("haltsqlpolicy.haltsql.dev/orders"), "{out}");
    assert!(out.contains("haltsqlserver.haltsql.dev/haltsql"), "{out}");
}

#[tokio::test]
async fn kubectl_scale_changes_spec_replicas() {
    ensure_crds();
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "api-scale").await;
    let servers = server_api(&client, &ns.name);
    let obj = object(
        "HaltSQLServer",
        "x",
        json!({"image": "haltsql:dev", "policies": [{"name": "p"}]}),
    );
    if let Err(m) = create(&servers, &obj).await {
        panic!("{m}");
    }
    support::Cluster::Full.kubectl_ok(&[
        "scale",
        "haltsqlserver/x",
        "--replicas=3",
        "-n",
        &ns.name,
    ]);
    let stored = match servers.get("x").await {
        Ok(obj) => obj,
        Err(err) => panic!("get: {err}"),
    };
    assert_eq!(stored.data["spec"]["replicas"], json!(3));

    // The scale subresource maps spec.replicas, status.replicas and
    // status.selector. An operator may rewrite the status concurrently, so
    // compare with the object read right after, until both agree.
    let status = json!({"status": {"replicas": 3, "selector": "app.kubernetes.io/instance=x"}});
    if let Err(err) = servers
        .patch_status("x", &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        panic!("patch status: {err}");
    }
    let scale_api: Api<HaltSQLServer> = Api::namespaced(client.clone(), &ns.name);
    let mut agreed = false;
    for _ in 0..50 {
        let scale = match scale_api.get_scale("x").await {
            Ok(s) => s,
            Err(err) => panic!("get scale: {err}"),
        };
        let server = match scale_api.get("x").await {
            Ok(s) => s,
            Err(err) => panic!("get: {err}"),
        };
        assert_eq!(scale.spec.as_ref().and_then(|s| s.replicas), Some(3));
        let status = server.status.unwrap_or_default();
        let scale_status = scale.status.unwrap_or_default();
        if scale_status.replicas == status.replicas.unwrap_or(0)
            && scale_status.selector == status.selector
            && status.selector.is_some()
        {
            agreed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        agreed,
        "the scale subresource does not reflect status.replicas/selector"
    );
}

#[tokio::test]
async fn kubectl_explain_prints_the_doc_comments() {
    ensure_crds();
    // Make sure the cluster answers before shelling out.
    let _client = support::Cluster::Full.client().await;
    let crd = HaltSQLServer::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("podDisruptionBudget"))
        .and_then(|s| s.description.clone());
    let Some(doc) = schema else {
        panic!("podDisruptionBudget has no description in the CRD")
    };
    assert!(doc.contains("minAvailable"), "{doc}");

    // Discovery may lag right after the CRD was installed.
    let mut out = String::new();
    for _ in 0..50 {
        let result = support::Cluster::Full
            .kubectl()
            .args(["explain", "haltsqlserver.spec.podDisruptionBudget"])
            .output();
        match result {
            Ok(o) if o.status.success() => {
                out = String::from_utf8_lossy(&o.stdout).into_owned();
                break;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(200)),
            Err(err) => panic!("kubectl: {err}"),
        }
    }
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words(&out).contains(&words(&doc)),
        "kubectl explain output lacks the doc text {doc:?}:\n{out}"
    );
    for field in ["enabled", "minAvailable", "maxUnavailable"] {
        assert!(out.contains(field), "{out}");
    }
}
