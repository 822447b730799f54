//! `server`: listeners, TLS and the admin listener (authentication is in
//! [`super::auth`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::auth::{AuthConfig, parse_auth};
use super::policies::PolicyRef;
use crate::load::Session;
use crate::load::fields::abs_path;
use crate::load::tree::Node;
use crate::load::walk::{Doc, Str};

/// `server`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `server.listen`: the API listener.
    pub listen: SocketAddr,
    /// `server.health_listen`: plain HTTP, `/healthz` and `/readyz` only.
    pub health_listen: Option<SocketAddr>,
    /// `server.tls`.
    pub tls: Option<TlsConfig>,
    /// `server.auth`.
    pub auth: AuthConfig,
    /// `server.admin`.
    pub admin: AdminConfig,
}

/// `server.tls.client_auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificates are requested.
    None,
    /// Client certificates are verified when presented.
    Optional,
    /// Client certificates are required.
    Required,
}

/// `server.tls.min_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2 (the default).
    Tls12,
    /// TLS 1.3.
    Tls13,
}

/// `server.tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM CA bundle for client certificates; present unless `client_auth` is none.
    pub client_ca_file: Option<PathBuf>,
    /// Client certificate mode, default none.
    pub client_auth: ClientAuth,
    /// Lowest TLS version, default 1.2.
    pub min_version: TlsVersion,
}

/// `server.admin`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminConfig {
    /// `server.admin.listen`: an admin listener, off when absent.
    pub listen: Option<SocketAddr>,
}

fn socket_addr(doc: &mut Doc<'_>, node: &Node, path: &str) -> Option<(SocketAddr, Str)> {
    let s = doc.nonempty(node, path)?;
    match s.value.parse::<SocketAddr>() {
        Ok(a) => Some((a, s)),
        Err(_) => {
            doc.error_str(
                &s,
                format!(
                    "invalid address {}: expected IP:PORT, for example 0.0.0.0:8080 or [::]:8080",
                    s.shown()
                ),
            );
            None
        }
    }
}

/// `server`: the listeners, TLS, authentication and the admin listener.
pub(super) fn parse_server(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    refs: &mut Vec<PolicyRef>,
) -> Option<ServerConfig> {
    let m = doc.map(
        node,
        "server",
        &["listen", "health_listen", "tls", "auth", "admin"],
    )?;
    let before = doc.errors.len();
    let listen = m
        .req(doc, "listen")
        .and_then(|n| socket_addr(doc, n, "server.listen"));
    let health = m
        .get("health_listen")
        .and_then(|n| socket_addr(doc, n, "server.health_listen"));
    let tls = match m.get("tls") {
        None => Some(None),
        Some(n) => parse_tls(session, doc, n).map(Some),
    };
    let mut admin = AdminConfig::default();
    let mut admin_addr = None;
    if let Some(n) = m.get("admin")
        && let Some(am) = doc.map(n, "server.admin", &["listen"])
        && let Some(l) = am.get("listen")
    {
        admin_addr = socket_addr(doc, l, "server.admin.listen");
        admin.listen = admin_addr.as_ref().map(|a| a.0);
    }
    // Listeners must not collide (port 0 asks for any free port).
    if let Some((l, _)) = &listen {
        for other in [&health, &admin_addr].into_iter().flatten() {
            if other.0.port() != 0 && other.0 == *l {
                doc.error_str(&other.1, "must differ from server.listen");
            }
        }
    }
    if let (Some((h, _)), Some((a, astr))) = (&health, &admin_addr)
        && a.port() != 0
        && a == h
    {
        doc.error_str(astr, "must differ from server.health_listen");
    }

    let auth = match m.get("auth") {
        None => Some(AuthConfig::default()),
        Some(n) => {
            let client_certificates = tls
                .as_ref()
                .and_then(|t| t.as_ref())
                .is_some_and(|t| t.client_auth != ClientAuth::None);
            parse_auth(session, doc, n, refs, client_certificates)
        }
    };
    if doc.errors.len() != before {
        return None;
    }
    Some(ServerConfig {
        listen: listen?.0,
        health_listen: health.map(|h| h.0),
        tls: tls?,
        auth: auth?,
        admin,
    })
}

/// `server.tls`.
fn parse_tls(session: &Session<'_>, doc: &mut Doc<'_>, node: &Node) -> Option<TlsConfig> {
    let m = doc.map(
        node,
        "server.tls",
        &[
            "cert_file",
            "key_file",
            "client_ca_file",
            "client_auth",
            "min_version",
        ],
    )?;
    let before = doc.errors.len();
    let cert = m
        .req(doc, "cert_file")
        .and_then(|n| abs_path(session, doc, n, "server.tls.cert_file"));
    let key = m
        .req(doc, "key_file")
        .and_then(|n| abs_path(session, doc, n, "server.tls.key_file"));
    let client_auth = match m.get("client_auth") {
        None => Some(ClientAuth::None),
        Some(n) => doc
            .choice(
                n,
                "server.tls.client_auth",
                &["none", "optional", "required"],
            )
            .map(|v| match v.as_str() {
                "optional" => ClientAuth::Optional,
                "required" => ClientAuth::Required,
                _ => ClientAuth::None,
            }),
    };
    let ca = match m.get("client_ca_file") {
        Some(n) => abs_path(session, doc, n, "server.tls.client_ca_file"),
        None => {
            if matches!(
                client_auth,
                Some(ClientAuth::Optional | ClientAuth::Required)
            ) {
                doc.error(
                    node,
                    "server.tls.client_ca_file",
                    "required unless client_auth is none",
                );
            }
            None
        }
    };
    let min_version = match m.get("min_version") {
        None => Some(TlsVersion::Tls12),
        Some(n) => {
            // Accept the unquoted YAML floats 1.2 and 1.3 as well.
            let text = n.as_scalar().filter(|s| s.plain).map(|s| s.text.as_str());
            match text {
                Some("1.2") => Some(TlsVersion::Tls12),
                Some("1.3") => Some(TlsVersion::Tls13),
                _ => doc
                    .choice(n, "server.tls.min_version", &["1.2", "1.3"])
                    .map(|v| {
                        if v == "1.3" {
                            TlsVersion::Tls13
                        } else {
                            TlsVersion::Tls12
                        }
                    }),
            }
        }
    };
    if doc.errors.len() != before {
        return None;
    }
    Some(TlsConfig {
        cert_file: cert?,
        key_file: key?,
        client_ca_file: ca,
        client_auth: client_auth?,
        min_version: min_version?,
    })
}
