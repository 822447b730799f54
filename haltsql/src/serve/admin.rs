//! The admin listener (`server.admin.listen`): plain HTTP, no
//! authentication, for operators and scrapers inside the pod's network.
//!
//! - `GET /metrics`: the Prometheus series (as on the health listener);
//! - `GET /config`: a summary of the config in use, as JSON;
//! - `GET /bundles`: each bundle source's state, as JSON;
//! - `GET /healthz`, `GET /readyz`.
//!
//! Nothing secret is ever shown: no token or hash, no key, password,
//! session token or credential, and no placeholder's resolved content. A
//! `jwks_file` or sink file given as content shows as `"content"`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::app::{self, AppState, ReloadStats};
use crate::load::{
    AuditSink, BundleLocation, ClientAuth, FileOrContent, LoadedConfig, MtlsMatch, OidcPolicy,
    TlsVersion,
};

pub fn admin_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(app::metrics))
        .route("/config", get(config))
        .route("/bundles", get(bundles))
        .route("/healthz", get(app::healthz))
        .route("/readyz", get(app::readyz))
        .fallback(app::not_found)
        .with_state(state)
}

async fn config(State(state): State<Arc<AppState>>) -> Response {
    let stats = state.reload_stats().clone();
    axum::Json(summary(&state.current_config(), &stats)).into_response()
}

async fn bundles(State(state): State<Arc<AppState>>) -> Response {
    let v = state
        .bundles
        .as_ref()
        .map_or(Value::Array(Vec::new()), |b| b.state_json());
    axum::Json(v).into_response()
}

fn file_or_content(f: &FileOrContent) -> Value {
    match f {
        FileOrContent::Path(p) => json!(p.display().to_string()),
        FileOrContent::Content(_) => json!("content"),
    }
}

/// The config without its secrets.
pub fn summary(c: &LoadedConfig, reload: &ReloadStats) -> Value {
    let tls = c.server.tls.as_ref().map(|t| {
        json!({
            "cert_file": t.cert_file.display().to_string(),
            "client_ca_file": t.client_ca_file.as_ref().map(|p| p.display().to_string()),
            "client_auth": match t.client_auth {
                ClientAuth::None => "none",
                ClientAuth::Optional => "optional",
                ClientAuth::Required => "required",
            },
            "min_version": match t.min_version {
                TlsVersion::Tls12 => "1.2",
                TlsVersion::Tls13 => "1.3",
            },
        })
    });
    let a = &c.server.auth;
    let tokens: Vec<Value> = a
        .tokens
        .iter()
        .map(|t| json!({"name": t.name, "policy": t.policy}))
        .collect();
    let oidc: Vec<Value> = a
        .oidc
        .iter()
        .map(|o| {
            let mut v = json!({
                "issuer": o.issuer,
                "audience": o.audience,
                "keys": o.jwks_file.as_ref().map_or(json!("discovery"), file_or_content),
            });
            match &o.policy {
                OidcPolicy::Fixed(p) => v["policy"] = json!(p),
                OidcPolicy::Claim(cl) => v["policy_claim"] = json!(cl),
            }
            v
        })
        .collect();
    let mtls: Vec<Value> = a
        .mtls_identities
        .iter()
        .map(|m| {
            let (k, v) = match &m.matcher {
                MtlsMatch::Subject(s) => ("subject", s),
                MtlsMatch::DnsName(s) => ("dns_name", s),
                MtlsMatch::Uri(s) => ("uri", s),
            };
            json!({k: v, "policy": m.policy})
        })
        .collect();
    let sources: Vec<Value> = c
        .bundle_sources
        .iter()
        .map(|b| {
            let location = match &b.location {
                BundleLocation::Oci { reference, .. } => json!({"oci": reference}),
                BundleLocation::Https { url, .. } => {
                    // A query string may carry a signature: never shown.
                    json!({"https": url.split('?').next().unwrap_or_default()})
                }
                BundleLocation::S3 { bucket, key, .. } => {
                    json!({"s3": {"bucket": bucket, "key": key}})
                }
            };
            json!({
                "name": b.name,
                "location": location,
                "name_prefix": b.name_prefix,
                "poll_interval_seconds": b.poll_interval_seconds,
                "public_keys": b.public_keys.len(),
            })
        })
        .collect();
    let sinks: Vec<Value> = c
        .audit
        .sinks
        .iter()
        .map(|s| match s {
            AuditSink::File { path } => json!({"type": "file", "path": path.display().to_string()}),
            other => json!({"type": other.type_name()}),
        })
        .collect();
    json!({
        "file": c.file.display().to_string(),
        "sha256": c.sha256,
        "inputs": c.inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "listeners": {
            "api": c.server.listen.to_string(),
            "health": c.server.health_listen.map(|a| a.to_string()),
            "admin": c.server.admin.listen.map(|a| a.to_string()),
            "tls": tls,
        },
        "auth": {
            "allow_unauthenticated": a.allow_unauthenticated,
            "tokens": tokens,
            "oidc": oidc,
            "mtls_identities": mtls,
        },
        "policies": c.policies.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
        "default_policy": c.default_policy,
        "bundle_sources": sources,
        "reload": {
            "watch": c.reload.watch,
            "successes": reload.successes,
            "failures": reload.failures,
            "last_success_unix": ReloadStats::unix(reload.last_success),
            "last_failure_unix": ReloadStats::unix(reload.last_failure),
            "last_errors": reload.last_errors,
            "restart_required": reload.restart_required,
        },
        "limits": {
            "max_request_bytes": c.limits.max_request_bytes,
            "header_read_timeout_seconds": c.limits.header_read_timeout_seconds,
            "idle_timeout_seconds": c.limits.idle_timeout_seconds,
            "max_connections": c.limits.max_connections,
            "max_requests_in_flight": c.limits.max_requests_in_flight,
        },
        "logging": {"level": c.logging.level.as_str()},
        "audit": {"log_raw_sql": c.audit.log_raw_sql, "sinks": sinks},
    })
}
