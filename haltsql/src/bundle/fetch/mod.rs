//! Fetching a bundle and its signature from OCI, https or S3.
//!
//! A fetcher only downloads; the caller verifies the signature before
//! anything downloaded is used. Every fetch is conditional on the version
//! the caller already serves (manifest digest or ETag), so an unchanged
//! source costs one small request.

pub mod http;
pub mod https;
pub mod oci;
pub mod s3;
pub mod sigv4;

use thiserror::Error;

use super::archive::MAX_BUNDLE_BYTES;
use super::sign::MAX_SIGNATURE_BYTES;
use crate::load::BundleLocation;

#[derive(Debug, Error)]
pub enum FetchError {
    #[error("cannot set up the HTTP client: {0}")]
    Setup(String),
    #[error("invalid URL {0}")]
    Url(String),
    #[error("{0}")]
    Network(String),
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: larger than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("{0}")]
    Protocol(String),
    #[error("{0}")]
    Unsupported(String),
}

impl FetchError {
    /// A short label for the error counter.
    pub fn reason(&self) -> &'static str {
        match self {
            FetchError::TooLarge { .. } => "too_large",
            FetchError::Status {
                status: 401 | 403, ..
            } => "unauthorized",
            FetchError::Status { status: 404, .. } => "not_found",
            FetchError::Protocol(_) => "protocol",
            _ => "unreachable",
        }
    }
}

/// What a fetch found.
#[derive(Debug)]
pub enum Fetched {
    /// The source still has the version the caller serves.
    Unchanged,
    /// A (possibly) new bundle, not yet verified.
    New(Download),
}

/// A downloaded bundle.
#[derive(Debug)]
pub struct Download {
    /// The source's version (manifest digest or ETag), if it has one.
    pub version: Option<String>,
    pub bundle: Vec<u8>,
    pub signature: Vec<u8>,
}

/// A fetcher for one source.
pub enum Fetcher {
    Oci(oci::Oci),
    Https(https::Https),
    S3(s3::S3),
}

impl Fetcher {
    pub fn new(location: &BundleLocation) -> Result<Self, FetchError> {
        let client = http::Http::new()?;
        Ok(match location {
            BundleLocation::Oci {
                reference,
                plain_http,
                auth,
            } => Fetcher::Oci(oci::Oci::new(client, reference, *plain_http, auth.clone())?),
            BundleLocation::Https { url, auth } => {
                Fetcher::Https(https::Https::new(client, url, auth.clone()))
            }
            BundleLocation::S3 {
                bucket,
                key,
                region,
                endpoint,
                credentials,
            } => Fetcher::S3(s3::S3::new(
                client,
                bucket,
                key,
                region.as_deref(),
                endpoint.as_deref(),
                credentials,
            )?),
        })
    }

    /// Fetches, conditional on `known` (the version the caller serves).
    pub async fn fetch(&mut self, known: Option<&str>) -> Result<Fetched, FetchError> {
        match self {
            Fetcher::Oci(f) => f.fetch(known).await,
            Fetcher::Https(f) => f.fetch(known).await,
            Fetcher::S3(f) => f.fetch(known).await,
        }
    }
}

/// Largest bundle body read.
pub(crate) const BUNDLE_LIMIT: u64 = MAX_BUNDLE_BYTES;
/// Largest signature body read.
pub(crate) const SIGNATURE_LIMIT: u64 = MAX_SIGNATURE_BYTES;
/// Largest manifest or token answer read.
pub(crate) const SMALL_LIMIT: u64 = 1024 * 1024;
