//! The metrics endpoint and the health probes.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::controllers::metrics::Metrics;
use crate::controllers::runtime::Readiness;

async fn metrics_handler(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    if readiness.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "stores not synced yet")
    }
}

/// Binds an endpoint's address (at startup, so a taken port fails loudly).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `/metrics` until the process ends.
pub async fn serve_metrics(listener: TcpListener, metrics: Metrics) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(metrics);
    axum::serve(listener, app).await
}

/// Serves `/healthz` (the process is alive) and `/readyz` (stores synced).
pub async fn serve_health(listener: TcpListener, readiness: Readiness) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness);
    axum::serve(listener, app).await
}
