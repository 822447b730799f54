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

/// `apiVersion` of both resources (the `#[kube(group, version)]` of each
/// must be literals; a test checks that they agree with this).
pub const API_VERSION: &str = "haltsql.dev/v1alpha1";

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    #[test]
    fn both_resources_have_the_api_version() {
        assert_eq!(HaltSQLPolicy::api_version(&()), API_VERSION);
        assert_eq!(HaltSQLServer::api_version(&()), API_VERSION);
    }
}
