//! Render errors: spec problems the reconciler reports as
//! `ConfigRendered=False` / `InvalidConfig` (or, for a policy's validation
//! document, `Valid=False` / `InvalidSpec`), with the message as written here.

use crate::api::SpecError;

/// Why a HaltSQLServer (or a policy's validation document) cannot be
/// rendered. Every message names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The object has no `metadata.name`.
    #[error("metadata.name is not set")]
    MissingName,

    /// The server's name cannot name the owned objects.
    #[error("metadata.name: {name:?} {reason}")]
    InvalidServerName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A reference to a policy name that no referenced HaltSQLPolicy defines.
    #[error(
        "{field}: {name:?} is not defined by any referenced HaltSQLPolicy (defined: {defined})"
    )]
    UndefinedPolicy {
        /// The referring field, e.g. `spec.auth.tokens[0].policy`.
        field: String,
        /// The name referred to.
        name: String,
        /// The names that are defined, e.g. `orders-agent, prod.*`.
        defined: String,
    },

    /// Two referenced HaltSQLPolicy objects define the same policy name.
    #[error(
        "spec.policies: HaltSQLPolicy {first:?} and HaltSQLPolicy {second:?} both define the policy {name:?}"
    )]
    DuplicatePolicyName {
        /// The policy document's `metadata.name`.
        name: String,
        /// The first HaltSQLPolicy object.
        first: String,
        /// The second HaltSQLPolicy object.
        second: String,
    },

    /// mTLS identities without client certificates.
    #[error(
        "spec.auth.mtls.identities: mTLS identities need spec.tls with clientAuth optional or required"
    )]
    MtlsWithoutClientAuth,

    /// `allowUnauthenticated` without the policy unauthenticated requests use.
    #[error(
        "spec.config.allowUnauthenticated: true needs spec.config.defaultPolicy (the policy for requests without a token)"
    )]
    UnauthenticatedWithoutDefaultPolicy,

    /// The ConfigMap would exceed the size the operator allows.
    #[error(
        "the rendered ConfigMap {name} holds {size} bytes, over the limit of {limit} bytes (900 KiB); reference fewer or smaller inline policies, or use a bundleSource for large policy sets"
    )]
    ConfigMapTooLarge {
        /// ConfigMap name.
        name: String,
        /// Bytes of its data keys and values.
        size: usize,
        /// The limit.
        limit: usize,
    },

    /// A Secret reference that cannot be mounted.
    #[error("{field}: {message}")]
    InvalidSecretRef {
        /// Where the reference is, e.g. `spec.audit.sinks[0].auth.password`.
        field: String,
        /// What is wrong.
        message: String,
    },

    /// Any other field the operator cannot render.
    #[error("{field}: {message}")]
    InvalidField {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },

    /// A referenced HaltSQLPolicy's spec is malformed (the API server
    /// normally rejects this).
    #[error("HaltSQLPolicy {object:?}: {source}")]
    PolicySpec {
        /// The HaltSQLPolicy object name.
        object: String,
        /// The problem.
        source: SpecError,
    },

    /// The server spec is malformed (the API server normally rejects this).
    #[error("{0}")]
    Spec(#[from] SpecError),

    /// Serializing a rendered document failed (a bug, not a user error).
    #[error("internal error: cannot serialize {what}: {message}")]
    Serialize {
        /// The document.
        what: String,
        /// The serializer's message.
        message: String,
    },
}
