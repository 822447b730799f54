//! The HTTP routes: `POST /v1/verify`, `GET /healthz`, `GET /readyz`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_LENGTH, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;

use super::auth::Authenticator;
use super::bundles::Bundles;
use crate::audit::AuditLog;
use crate::engine::pool::VerifyPool;

/// The policy set in use: `None` until every bundle source has a bundle;
/// swapped whole when a new bundle is accepted.
pub type AuthSlot = Arc<RwLock<Option<Arc<Authenticator>>>>;

pub struct AppState {
    pub auth: AuthSlot,
    pub bundles: Option<Arc<Bundles>>,
    pub max_request_bytes: usize,
    pub pool: VerifyPool,
    pub audit: AuditLog,
    pub ready: AtomicBool,
}

impl AppState {
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

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not found")
}

async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
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

/// Prometheus text format: the bundle state (empty without bundle sources).
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut out = String::new();
    if let Some(b) = &state.bundles {
        b.metrics(&mut out);
    }
    state.audit.metrics(&mut out);
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

#[derive(Deserialize)]
struct VerifyRequest {
    sql: String,
}

async fn verify(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let Some(auth) = state.current_auth() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the policies are not loaded yet (bundle sources)",
        );
    };
    let caller = match auth.authenticate(&headers) {
        Ok(c) => c,
        Err(e) => {
            let mut r = error(StatusCode::UNAUTHORIZED, e.message());
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
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
    let decision = match state
        .pool
        .verify(Arc::clone(&caller.policy), sql.clone())
        .await
    {
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
