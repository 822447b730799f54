//! The HaltSQLPolicy and HaltSQLServer controllers and what they share: the
//! watches and stores ([`runtime`]), the [`context`] every reconcile gets,
//! what a policy was judged to be ([`judgement`]), per-object [`backoff`],
//! status writes ([`status_patch`]) and the operator's [`metrics`] registry
//! (the manager serves it; everything it counts but the leader gauge
//! happens here).
pub mod backoff;
pub mod context;
pub mod judgement;
pub mod metrics;
pub mod policy;
pub mod reconcile;
pub mod runtime;
pub mod server;
pub mod status_patch;
