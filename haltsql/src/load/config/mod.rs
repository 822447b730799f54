//! `kind: Config` documents: [`parse_config`] reads the top level and hands
//! each section to its own module.

use std::path::{Path, PathBuf};

use super::Session;
use super::policy::LoadedPolicy;
use super::tree::{Node, Value};
use super::walk::{Doc, Map};

mod audit;
mod auth;
mod bundle_source;
mod limits;
mod logging;
mod policies;
mod reload;
mod server;

pub use audit::{
    AuditConfig, AuditSink, DeliveryConfig, EsTarget, KafkaSasl, KafkaTls, SaslMechanism,
};
pub use auth::{AuthConfig, MtlsIdentity, MtlsMatch, OidcPolicy, OidcProvider, TokenConfig};
pub use bundle_source::{
    BundleLocation, BundleSource, S3Credentials, SourceAuth, parse_ed25519_public_key,
};
pub use limits::{
    DEFAULT_HEADER_READ_TIMEOUT_SECONDS, DEFAULT_IDLE_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUESTS_IN_FLIGHT, DEFAULT_REQUEST_BYTES, LimitsConfig, MAX_REQUEST_BYTES,
    MIN_REQUEST_BYTES,
};
pub use logging::{LogFormat, LogLevel, LoggingConfig};
pub use reload::ReloadConfig;
pub use server::{AdminConfig, ClientAuth, ServerConfig, TlsConfig, TlsVersion};

use policies::PolicyRef;

/// Top-level keys of a Config document.
pub(crate) const CONFIG_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "server",
    "policies",
    "default_policy",
    "reload",
    "limits",
    "logging",
    "telemetry",
    "opa",
    "secrets",
    "audit",
];

/// A fully loaded and checked Config, with every placeholder resolved.
///
/// With [`LoadOptions::root`](crate::load::LoadOptions::root) set, every absolute
/// path in it (TLS files, audit file, ...) is already rooted.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The config file as named.
    pub file: PathBuf,
    /// Lower-case hex SHA-256 of the config file's bytes.
    pub sha256: String,
    /// Every file this config was loaded from: the config itself, its
    /// policy and catalog files, and the files its `${file:...}`
    /// placeholders read (what `reload.watch` watches).
    pub inputs: Vec<PathBuf>,
    /// `server`.
    pub server: ServerConfig,
    /// The policies loaded from `policies[].file`, in config order.
    pub policies: Vec<LoadedPolicy>,
    /// The `policies[].bundle_source` entries (checked, not fetched).
    pub bundle_sources: Vec<BundleSource>,
    /// `default_policy`.
    pub default_policy: Option<String>,
    /// `reload`.
    pub reload: ReloadConfig,
    /// `limits`.
    pub limits: LimitsConfig,
    /// `logging`.
    pub logging: LoggingConfig,
    /// `audit`.
    pub audit: AuditConfig,
}

impl LoadedConfig {
    /// A file policy by name.
    pub fn policy(&self, name: &str) -> Option<&LoadedPolicy> {
        self.policies.iter().find(|p| p.name == name)
    }
}

/// Checks a Config document and loads the policy files it names.
pub(crate) fn parse_config(
    session: &mut Session<'_>,
    doc: &mut Doc<'_>,
    root: &Node,
    file: &Path,
    sha256: &str,
) -> Option<LoadedConfig> {
    let m = doc.map(root, "", CONFIG_KEYS)?;
    let before = doc.errors.len();
    let mut refs: Vec<PolicyRef> = Vec::new();

    let server = m
        .req(doc, "server")
        .and_then(|n| server::parse_server(session, doc, n, &mut refs));
    let entries = policies::parse_policies(session, doc, m, file);
    let default_policy = m
        .get("default_policy")
        .and_then(|n| policies::policy_ref(doc, n, "default_policy", &mut refs));
    let reload = match m.get("reload") {
        None => Some(ReloadConfig::default()),
        Some(n) => reload::parse_reload(doc, n),
    };
    let limits = match m.get("limits") {
        None => Some(LimitsConfig::default()),
        Some(n) => limits::parse_limits(doc, n),
    };
    let logging = match m.get("logging") {
        None => Some(LoggingConfig {
            level: LogLevel::Info,
            format: LogFormat::Json,
        }),
        Some(n) => logging::parse_logging(doc, n),
    };
    for key in ["telemetry", "opa", "secrets"] {
        if let Some(n) = m.get(key) {
            // Reserved: no settings are defined yet, so any key is unknown.
            doc.map(n, key, &[]);
        }
    }
    let audit = match m.get("audit") {
        None => Some(AuditConfig {
            log_raw_sql: false,
            sinks: vec![AuditSink::Stdout],
            delivery: DeliveryConfig::default(),
        }),
        Some(n) => audit::parse_audit(session, doc, n),
    };

    // Cross-checks.
    if let Some(server) = &server
        && server.auth.allow_unauthenticated
        && default_policy.is_none()
        && let Some(k) = auth_node(m, "allow_unauthenticated")
    {
        doc.error(
            k,
            "server.auth.allow_unauthenticated",
            "allow_unauthenticated needs default_policy (the policy for requests without a token)",
        );
    }
    policies::check_policy_names(doc, &entries, &refs);

    if doc.errors.len() != before {
        return None;
    }
    let (policies, bundle_sources) = entries.into_loaded()?;
    Some(LoadedConfig {
        file: file.to_path_buf(),
        sha256: sha256.to_string(),
        inputs: session.input_files(),
        server: server?,
        policies,
        bundle_sources,
        default_policy,
        reload: reload?,
        limits: limits?,
        logging: logging?,
        audit: audit?,
    })
}

/// The node of `server.auth.<key>`, for locating cross-check errors.
fn auth_node<'n>(m: Map<'n>, key: &str) -> Option<&'n Node> {
    let server = m.get("server")?;
    let Value::Map(entries) = &server.value else {
        return None;
    };
    let auth = entries
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == "auth"))?;
    let Value::Map(entries) = &auth.1.value else {
        return None;
    };
    entries
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == key))
        .map(|(_, v)| v)
}
