//! The HaltSQL operator: CRD types, pure rendering and the two controllers.
pub mod api;
pub mod backoff;
pub mod cli;
pub mod context;
pub mod http;
pub mod leader;
pub mod manifests;
pub mod metrics;
pub mod policy;
pub mod rbac;
pub mod render;
pub mod render_cmd;
pub mod runtime;
pub mod server;
pub mod status_patch;
pub mod telemetry;
