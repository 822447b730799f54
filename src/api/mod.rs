//! The custom resources of the operator: `HaltSQLPolicy` and `HaltSQLServer`
//! (`haltsql.dev/v1alpha1`), their status types and condition helpers.
//!
//! The CRD schemas are generated from these types (`cargo run --bin crdgen`),
//! so the doc comments on fields are what `kubectl explain` prints.

pub mod conditions;
mod free_form;
pub mod policy;
pub mod server;
mod spec_error;

pub use conditions::*;
pub use free_form::RawObject;
pub use policy::*;
pub use server::*;
pub use spec_error::SpecError;

/// The API group of both resources.
pub const GROUP: &str = "haltsql.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of both resources.
pub const API_VERSION: &str = "haltsql.dev/v1alpha1";
