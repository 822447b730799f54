//! The custom resources of the operator: `HaltSQLPolicy` and `HaltSQLServer`
//! (`haltsql.dev/v1alpha1`), their status types and condition helpers.
//!
//! The CRD schemas are generated from these types (`cargo run --bin crdgen`),
//! so the doc comments on fields are what `kubectl explain` prints.

pub mod conditions;
pub mod policy;
pub mod server;

use schemars::{Schema, SchemaGenerator, json_schema};

pub use conditions::*;
pub use policy::*;
pub use server::*;

/// The API group of both resources.
pub const GROUP: &str = "haltsql.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of both resources.
pub const API_VERSION: &str = "haltsql.dev/v1alpha1";

/// Errors about a spec that the API server should have rejected already
/// (for objects that bypassed the CRD schema, e.g. in unit tests).
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// Neither or both of `spec.policy` and `spec.bundleSource` are set.
    #[error("exactly one of spec.policy or spec.bundleSource must be set")]
    PolicySource,
    /// Not exactly one of `oci`, `https`, `s3` is set.
    #[error("spec.bundleSource needs exactly one of oci, https or s3")]
    BundleLocation,
    /// Both `minAvailable` and `maxUnavailable` are set.
    #[error("spec.podDisruptionBudget: set at most one of minAvailable and maxUnavailable")]
    PdbBudget,
}

/// Schema for a free-form object whose content is kept as given.
pub(crate) fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema for a list of free-form objects whose content is kept as given.
pub(crate) fn free_form_object_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true
        }
    })
}

/// A free-form object (raw haltsql configuration section).
pub type RawObject = serde_json::Map<String, serde_json::Value>;
