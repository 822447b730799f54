//! TLS settings for the API listener: rustls (ring provider). The
//! handshakes run in the connection tasks of [`super::conn`], off the
//! accept loop and within the header-read timeout.

use std::path::Path;
use std::sync::{Arc, RwLock};

use pki_types::pem::PemObject;
use pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use thiserror::Error;

use crate::load::{ClientAuth, TlsConfig, TlsVersion};

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: pki_types::pem::Error,
    },
    #[error("{what} {path} holds no PEM {kind}")]
    Empty {
        what: &'static str,
        path: String,
        kind: &'static str,
    },
    #[error("client_auth is {0} but no client_ca_file is set")]
    NoClientCa(&'static str),
    #[error("client CA file {path}: {source}")]
    ClientCa { path: String, source: rustls::Error },
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Read {
            what,
            path: path.display().to_string(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.display().to_string(),
            kind: "certificate",
        });
    }
    Ok(certs)
}

/// The TLS settings in use, replaced by a reload (a handshake uses the
/// settings of the moment it starts).
pub type TlsSlot = Arc<RwLock<Arc<rustls::ServerConfig>>>;

/// The settings of this moment.
pub fn current(slot: &TlsSlot) -> Arc<rustls::ServerConfig> {
    Arc::clone(
        &slot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// The files of `server.tls`, for `reload.watch`.
pub fn files(tls: &TlsConfig) -> Vec<std::path::PathBuf> {
    let mut out = vec![tls.cert_file.clone(), tls.key_file.clone()];
    out.extend(tls.client_ca_file.clone());
    out
}

/// Build the rustls server configuration from `server.tls`.
pub fn server_config(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&'static rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let certs = read_certs(&tls.cert_file, "certificate file")?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file).map_err(|source| TlsError::Read {
        what: "key file",
        path: tls.key_file.display().to_string(),
        source,
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)?;
    let builder = match tls.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        mode => {
            let label = if mode == ClientAuth::Optional {
                "optional"
            } else {
                "required"
            };
            let ca_path = tls
                .client_ca_file
                .as_ref()
                .ok_or(TlsError::NoClientCa(label))?;
            let mut roots = RootCertStore::empty();
            for c in read_certs(ca_path, "client CA file")? {
                roots.add(c).map_err(|source| TlsError::ClientCa {
                    path: ca_path.display().to_string(),
                    source,
                })?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let verifier = if mode == ClientAuth::Optional {
                verifier.allow_unauthenticated().build()?
            } else {
                verifier.build()?
            };
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
