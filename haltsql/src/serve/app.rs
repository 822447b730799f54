//! The HTTP routes: `POST /v1/verify`, `GET /healthz`, `GET /readyz`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_LENGTH, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;

use super::auth::{AuthSlot, Authenticator};
use super::bundles::Bundles;
use super::identity::PeerIdentity;
use crate::audit::AuditLog;
use crate::engine::pool::VerifyPool;
use crate::load::LoadedConfig;

/// What the admin listener and `/metrics` show about reloads.
#[derive(Debug, Default, Clone)]
pub struct ReloadStats {
    pub successes: u64,
    pub failures: u64,
    pub last_success: Option<SystemTime>,
    pub last_failure: Option<SystemTime>,
    /// The located errors of the last failure (cleared by a success).
    pub last_errors: Vec<String>,
    /// Settings changed by reloads that need a restart to apply.
    pub restart_required: Vec<String>,
}

impl ReloadStats {
    pub fn unix(t: Option<SystemTime>) -> Option<u64> {
        t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
    }
}

pub struct AppState {
    pub auth: AuthSlot,
    pub bundles: Option<Arc<Bundles>>,
    /// The OIDC key caches (kept across policy-set rebuilds).
    pub oidc: Arc<super::oidc::Sources>,
    /// The API listener's TLS settings (replaced by a reload).
    pub tls: Option<super::tls::TlsSlot>,
    /// The config in use (replaced by a reload).
    pub config: RwLock<Arc<LoadedConfig>>,
    pub reloads: Mutex<ReloadStats>,
    pub max_request_bytes: usize,
    pub pool: VerifyPool,
    pub audit: AuditLog,
    pub ready: AtomicBool,
}

impl AppState {
    pub fn current_config(&self) -> Arc<LoadedConfig> {
        Arc::clone(
            &self
                .config
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    pub fn reload_stats(&self) -> MutexGuard<'_, ReloadStats> {
        self.reloads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The policy set of this moment (a request keeps the one it started with).
    pub fn current_auth(&self) -> Option<Arc<Authenticator>> {
        self.auth
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The API router (also answers the health routes).
pub fn api_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/verify", post(verify))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// The plain-HTTP health router: `/healthz` and `/readyz` only.
pub fn health_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

pub(crate) async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not found")
}

pub(crate) async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

pub(crate) async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if !state.ready.load(Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response();
    }
    if let Some(b) = &state.bundles
        && !b.ready()
    {
        let mut reasons = b.not_ready_reasons();
        if reasons.is_empty() {
            reasons.push("the bundles do not make a usable policy set (see the log)".to_string());
        }
        let body = format!("not ready\n{}\n", reasons.join("\n"));
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

/// Prometheus text format: the config in use, reloads and the bundle
/// state (no bundle series without bundle sources).
pub fn metrics_text(state: &AppState) -> String {
    let mut out = String::new();
    let config = state.current_config();
    let stats = state.reload_stats().clone();
    let _ = writeln!(
        out,
        "# HELP haltsql_config_info The config in use (SHA-256 of the config file).\n# TYPE haltsql_config_info gauge\nhaltsql_config_info{{sha256=\"{}\"}} 1",
        config.sha256
    );
    let _ = writeln!(
        out,
        "# HELP haltsql_config_reloads_total Config reloads by result (a failure keeps the previous config).\n# TYPE haltsql_config_reloads_total counter\nhaltsql_config_reloads_total{{result=\"success\"}} {}\nhaltsql_config_reloads_total{{result=\"failure\"}} {}",
        stats.successes, stats.failures
    );
    if let Some(t) = ReloadStats::unix(stats.last_success) {
        let _ = writeln!(
            out,
            "# HELP haltsql_config_last_reload_success_timestamp_seconds When the config was last reloaded.\n# TYPE haltsql_config_last_reload_success_timestamp_seconds gauge\nhaltsql_config_last_reload_success_timestamp_seconds {t}"
        );
    }
    if let Some(b) = &state.bundles {
        b.metrics(&mut out);
    }
    state.audit.metrics(&mut out);
    out
}

pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let out = metrics_text(&state);
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// How long an early answer waits for the rest of a body it will not use.
const DISCARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads and drops a request body (at most `limit` bytes, for at most
/// [`DISCARD_TIMEOUT`]) before an answer that does not need it. Answering
/// first makes HTTP/2 end the stream with RST_STREAM(NO_ERROR), which the
/// RFC allows but curl 7.88 reports as a failed transfer (exit 92) instead
/// of the 401; over HTTP/1.1 the connection is closed with unread data.
async fn discard(body: Body, limit: usize) {
    let _ = tokio::time::timeout(DISCARD_TIMEOUT, Limited::new(body, limit).collect()).await;
}

#[derive(Deserialize)]
struct VerifyRequest {
    sql: String,
}

async fn verify(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<Arc<PeerIdentity>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(auth) = state.current_auth() else {
        discard(body, state.max_request_bytes).await;
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the policies are not loaded yet (bundle sources)",
        );
    };
    let peer = peer.as_ref().map(|Extension(p)| p.as_ref());
    let caller = match auth.authenticate(&headers, peer).await {
        Ok(c) => c,
        Err(e) => {
            discard(body, state.max_request_bytes).await;
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::UNAUTHORIZED);
            let mut r = error(status, e.message());
            if status == StatusCode::UNAUTHORIZED {
                r.headers_mut()
                    .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            } else if status == StatusCode::SERVICE_UNAVAILABLE {
                r.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static("5"));
            }
            return r;
        }
    };
    let limit = state.max_request_bytes;
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit);
    }
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(limit),
        Err(_) => return error(StatusCode::BAD_REQUEST, "cannot read the request body"),
    };
    let req: VerifyRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("expected a JSON object with a string \"sql\": {e}"),
            );
        }
    };
    let sql = req.sql;
    let decision = match state.pool.verify(&caller.policy, &sql).await {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "verify failed");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the verify engine is unavailable",
            );
        }
    };
    if let Err(e) = state.audit.record(caller.token.as_deref(), &sql, &decision) {
        // No audit event, no decision.
        tracing::error!(error = %e, "audit write failed");
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot write the audit event",
        );
    }
    tracing::debug!(
        token = caller.token.as_deref().unwrap_or("-"),
        policy = %decision.policy,
        allowed = decision.allowed,
        "verify"
    );
    (StatusCode::OK, axum::Json(decision)).into_response()
}

fn too_large(limit: usize) -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request body larger than {limit} bytes"),
    )
}
