//! Errors about a spec, shared by both resources.

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
