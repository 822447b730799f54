//! `limits`: request size, timeouts and connection caps.

use crate::load::tree::Node;
use crate::load::walk::Doc;

/// Smallest `limits.max_request_bytes` (1 KiB).
pub const MIN_REQUEST_BYTES: i64 = 1024;

/// Largest `limits.max_request_bytes` (16 MiB).
pub const MAX_REQUEST_BYTES: i64 = 16 * 1024 * 1024;

/// Default `limits.max_request_bytes` (64 KiB).
pub const DEFAULT_REQUEST_BYTES: u64 = 65536;

/// Default `limits.header_read_timeout_seconds`.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: u64 = 10;

/// Default `limits.idle_timeout_seconds`.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u64 = 60;

/// Default `limits.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 1024;

/// Default `limits.max_requests_in_flight`.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: u64 = 256;

/// `limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Largest request body; larger bodies get 413.
    pub max_request_bytes: u64,
    /// Seconds a request line and headers may take to arrive, counted from
    /// the accept (or the end of the previous response on a kept-alive
    /// connection); then the connection is closed.
    pub header_read_timeout_seconds: u64,
    /// Seconds a connection may go without a byte moving either way while
    /// a request is read or answered; then it is closed.
    pub idle_timeout_seconds: u64,
    /// Open connections per listener; past it, the connection that has
    /// waited longest for its headers is closed to make room, or the new
    /// one gets a 503 and is closed when every connection is busy.
    pub max_connections: u64,
    /// `POST /v1/verify` requests being read or answered at once; past it,
    /// 503 at once. Bounds body memory to this times `max_request_bytes`.
    pub max_requests_in_flight: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_bytes: DEFAULT_REQUEST_BYTES,
            header_read_timeout_seconds: DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
        }
    }
}

/// `limits`.
pub(super) fn parse_limits(doc: &mut Doc<'_>, node: &Node) -> Option<LimitsConfig> {
    let lm = doc.map(
        node,
        "limits",
        &[
            "max_request_bytes",
            "header_read_timeout_seconds",
            "idle_timeout_seconds",
            "max_connections",
            "max_requests_in_flight",
        ],
    )?;
    let d = LimitsConfig::default();
    let mut int = |key: &str, default: u64, min: i64, max: i64| match lm.get(key) {
        None => Some(default),
        Some(v) => doc
            .int(v, &format!("limits.{key}"), min, max)
            .and_then(|v| u64::try_from(v).ok()),
    };
    let max_request_bytes = int(
        "max_request_bytes",
        d.max_request_bytes,
        MIN_REQUEST_BYTES,
        MAX_REQUEST_BYTES,
    );
    let header_read_timeout_seconds = int(
        "header_read_timeout_seconds",
        d.header_read_timeout_seconds,
        1,
        300,
    );
    let idle_timeout_seconds = int("idle_timeout_seconds", d.idle_timeout_seconds, 1, 3600);
    let max_connections = int("max_connections", d.max_connections, 1, 100_000);
    let max_requests_in_flight = int(
        "max_requests_in_flight",
        d.max_requests_in_flight,
        1,
        100_000,
    );
    Some(LimitsConfig {
        max_request_bytes: max_request_bytes?,
        header_read_timeout_seconds: header_read_timeout_seconds?,
        idle_timeout_seconds: idle_timeout_seconds?,
        max_connections: max_connections?,
        max_requests_in_flight: max_requests_in_flight?,
    })
}
