//! Signed policy bundles: the archive format, signatures, the `bundle`
//! subcommands and the fetchers `haltsql serve` polls.
//!
//! A bundle is a gzip-compressed tar archive (`bundle.tar.gz`) holding a
//! `manifest.json` and one or more `kind: Policy` documents. A detached
//! signature file (`bundle.tar.gz.sig`) carries an Ed25519 signature over the
//! SHA-256 of the whole archive, so every byte that is served is covered.
//! `haltsql/README.md` ("Policy bundles") is the reference.

pub mod archive;
pub mod cache;
pub mod cli;
pub mod fetch;
pub mod sign;

pub use archive::{Bundle, BundleError, build_dir, open};
pub use sign::{SignatureFile, VerifyError, sign_bytes, verify_bytes};

/// Media type of the archive (OCI layer, HTTP Content-Type).
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.haltsql.bundle.v1.tar+gzip";
/// Media type of the detached signature.
pub const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.haltsql.bundle.signature.v1+json";
/// Suffix of the signature next to an https or s3 bundle.
pub const SIGNATURE_SUFFIX: &str = ".sig";
