//! The HaltSQL operator: CRD types, pure rendering and the two controllers.
pub mod api;
pub mod manifests;
pub mod rbac;
pub mod render;
