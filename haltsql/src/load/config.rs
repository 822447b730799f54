//! `kind: Config` documents.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::Session;
use super::bundle::{
    BundleSource, Prefix, S3Access, S3Credentials, SourceAuth, parse_auth, parse_bundle_source,
    parse_s3_access,
};
use super::fields::{Secret, abs_path, bucket, check_url, url};
use super::names::is_dns1123_subdomain;
use super::policy::LoadedPolicy;
use super::tree::Node;
use super::walk::{Doc, Map, Str, index, join};

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

/// Smallest `limits.max_request_bytes` (1 KiB).
pub const MIN_REQUEST_BYTES: i64 = 1024;
/// Largest `limits.max_request_bytes` (16 MiB).
pub const MAX_REQUEST_BYTES: i64 = 16 * 1024 * 1024;
/// Default `limits.max_request_bytes` (64 KiB).
pub const DEFAULT_REQUEST_BYTES: u64 = 65536;
/// Default `limits.header_read_timeout_seconds`.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: u64 = 10;
/// Default `limits.idle_timeout_seconds`.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u64 = 60;
/// Default `limits.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 1024;
/// Default `limits.max_requests_in_flight`.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: u64 = 256;

/// A fully loaded and checked Config, with every placeholder resolved.
///
/// With [`LoadOptions::root`](super::LoadOptions::root) set, every absolute
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

/// `server.auth`.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// Requests without a token use `default_policy`.
    pub allow_unauthenticated: bool,
    /// Bearer tokens.
    pub tokens: Vec<TokenConfig>,
    /// OIDC providers.
    pub oidc: Vec<OidcProvider>,
    /// mTLS identities.
    pub mtls_identities: Vec<MtlsIdentity>,
}

/// One bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenConfig {
    /// The token's name (for audit events).
    pub name: String,
    /// The policy the token selects.
    pub policy: String,
    /// SHA-256 of the token (decoded from the 64 hex digits).
    pub sha256: [u8; 32],
}

impl TokenConfig {
    /// The hash as lower-case hex.
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }
}

/// How an OIDC provider selects the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OidcPolicy {
    /// `policy`: one policy for every token of the provider.
    Fixed(String),
    /// `policy_claim`: the claim that names the policy.
    Claim(String),
}

/// One `server.auth.oidc` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcProvider {
    /// `issuer` (an https URL).
    pub issuer: String,
    /// `audience`.
    pub audience: String,
    /// `policy` or `policy_claim`.
    pub policy: OidcPolicy,
    /// `jwks_file`: keys from a file (an absolute path) or the JWKS JSON
    /// itself (a value starting with `{`) instead of the issuer.
    pub jwks_file: Option<FileOrContent>,
}

/// What an mTLS identity matches in the client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MtlsMatch {
    /// The subject distinguished name.
    Subject(String),
    /// A DNS subject alternative name.
    DnsName(String),
    /// A URI subject alternative name (for example a SPIFFE ID).
    Uri(String),
}

/// One `server.auth.mtls.identities` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtlsIdentity {
    /// What to match.
    pub matcher: MtlsMatch,
    /// The policy it selects.
    pub policy: String,
}

/// `server.admin`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminConfig {
    /// `server.admin.listen`: an admin listener, off when absent.
    pub listen: Option<SocketAddr>,
}

/// `reload`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadConfig {
    /// Reload when the config or policy files change.
    pub watch: bool,
}

/// `limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Largest request body; larger bodies get 413.
    pub max_request_bytes: u64,
    /// Seconds a request line and headers may take to arrive, counted from
    /// the accept (or the end of the previous response on a kept-alive
    /// connection); then the connection is closed.
    pub header_read_timeout_seconds: u64,
    /// Seconds a connection may go without a byte moving either way while
    /// a request is read or answered; then it is closed.
    pub idle_timeout_seconds: u64,
    /// Open connections per listener; past it, the connection that has
    /// waited longest for its headers is closed to make room, or the new
    /// one gets a 503 and is closed when every connection is busy.
    pub max_connections: u64,
    /// `POST /v1/verify` requests being read or answered at once; past it,
    /// 503 at once. Bounds body memory to this times `max_request_bytes`.
    pub max_requests_in_flight: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_bytes: DEFAULT_REQUEST_BYTES,
            header_read_timeout_seconds: DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
        }
    }
}

/// `logging.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// error
    Error,
    /// warn
    Warn,
    /// info (the default)
    Info,
    /// debug
    Debug,
    /// trace
    Trace,
}

impl LogLevel {
    /// The name as written in configs (and as tracing filters take it).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// `logging.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// JSON lines (the default).
    Json,
    /// Human-readable text.
    Text,
}

/// `logging`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingConfig {
    /// Level, default info.
    pub level: LogLevel,
    /// Format, default json.
    pub format: LogFormat,
}

/// `audit`.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditConfig {
    /// Put the raw SQL into audit events (default false: only its SHA-256).
    pub log_raw_sql: bool,
    /// Where events go; default `[stdout]`, never empty.
    pub sinks: Vec<AuditSink>,
    /// How events reach the remote sinks (s3, gcs, elasticsearch, kafka).
    pub delivery: DeliveryConfig,
}

/// `audit.delivery`: the queue and batches of each remote sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryConfig {
    /// Events a remote sink's queue holds before new events are dropped
    /// (and counted); 1 to 1000000, default 10000.
    pub queue_events: u64,
    /// Events sent in one batch (object, bulk request, produce request);
    /// 1 to 10000, default 500.
    pub batch_events: u64,
    /// The longest an event waits for its batch to fill, in milliseconds;
    /// 10 to 60000, default 1000.
    pub flush_interval_ms: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            queue_events: 10_000,
            batch_events: 500,
            flush_interval_ms: 1000,
        }
    }
}

/// Kafka SASL mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    /// PLAIN
    Plain,
    /// SCRAM-SHA-256
    ScramSha256,
    /// SCRAM-SHA-512
    ScramSha512,
}

/// Kafka SASL settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSasl {
    /// `mechanism`.
    pub mechanism: SaslMechanism,
    /// `username`.
    pub username: String,
    /// `password`.
    pub password: Secret,
}

/// A file setting that takes either a path or the file's content.
///
/// With the operator's Secret references, `${file:...}` placeholders resolve
/// to a file's *content*, so keys such as `ca_file` accept both: a value
/// that starts with `-----BEGIN` (PEM) or `{` (JSON) is content, anything
/// else must be an absolute path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOrContent {
    /// An absolute path (rooted when the options have a root).
    Path(PathBuf),
    /// The content itself.
    Content(Secret),
}

/// Kafka TLS settings (`tls: true` or `tls: {...}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaTls {
    /// `ca_file`: PEM CA certificates to trust instead of the system roots.
    pub ca: Option<FileOrContent>,
    /// `cert_file`: PEM client certificate chain (with `key_file`).
    pub cert: Option<FileOrContent>,
    /// `key_file`: PEM client private key (with `cert_file`).
    pub key: Option<FileOrContent>,
}

/// Where an Elasticsearch sink writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EsTarget {
    /// `index`: a plain index.
    Index(String),
    /// `data_stream`: a data stream (documents are created, never updated).
    DataStream(String),
}

/// One `audit.sinks` entry.
#[derive(Debug, Clone, PartialEq)]
pub enum AuditSink {
    /// `{type: stdout}`: JSON lines on standard output.
    Stdout,
    /// `{type: file, path}`: JSON lines appended to a file.
    File {
        /// Absolute path.
        path: PathBuf,
    },
    /// `{type: s3, bucket, prefix?, region?, endpoint?, credentials?}`.
    S3 {
        /// Bucket.
        bucket: String,
        /// Object key prefix.
        prefix: Option<String>,
        /// Region.
        region: Option<String>,
        /// Endpoint URL (S3-compatible stores).
        endpoint: Option<String>,
        /// Credentials, default from the environment.
        credentials: S3Credentials,
    },
    /// `{type: gcs, bucket, prefix?, credentials_file?}`.
    Gcs {
        /// Bucket.
        bucket: String,
        /// Object name prefix.
        prefix: Option<String>,
        /// Service account key (a path or the JSON itself); default: the
        /// ambient credentials.
        credentials_file: Option<FileOrContent>,
    },
    /// `{type: elasticsearch, url, index | data_stream, auth?}`.
    Elasticsearch {
        /// Base URL.
        url: String,
        /// `index` or `data_stream`.
        target: EsTarget,
        /// Authentication, default none.
        auth: SourceAuth,
    },
    /// `{type: kafka, brokers, topic, tls?, sasl?}`.
    Kafka {
        /// `host:port` entries.
        brokers: Vec<String>,
        /// Topic.
        topic: String,
        /// TLS settings; `None` with `tls: false` (the default is TLS with
        /// the system roots).
        tls: Option<KafkaTls>,
        /// SASL authentication.
        sasl: Option<KafkaSasl>,
    },
}

impl AuditSink {
    /// The `type` as written.
    pub fn type_name(&self) -> &'static str {
        match self {
            AuditSink::Stdout => "stdout",
            AuditSink::File { .. } => "file",
            AuditSink::S3 { .. } => "s3",
            AuditSink::Gcs { .. } => "gcs",
            AuditSink::Elasticsearch { .. } => "elasticsearch",
            AuditSink::Kafka { .. } => "kafka",
        }
    }
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

/// A reference to a policy, checked once every policy entry is known.
struct PolicyRef {
    name: Str,
}

fn policy_ref(
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
    refs: &mut Vec<PolicyRef>,
) -> Option<String> {
    let s = doc.nonempty(node, path)?;
    if !is_dns1123_subdomain(&s.value) {
        doc.error_str(
            &s,
            format!(
                "invalid policy name {}: must be a lower-case DNS-1123 subdomain",
                s.shown()
            ),
        );
        return None;
    }
    let v = s.value.clone();
    refs.push(PolicyRef { name: s });
    Some(v)
}

/// A `policies[]` entry being loaded.
struct FileEntry {
    policy: Option<LoadedPolicy>,
    node: Str,
    path: String,
}

struct BundleEntry {
    source: Option<BundleSource>,
    name: Option<Str>,
    prefix: Prefix,
    path: String,
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
        .and_then(|n| parse_server(session, doc, n, &mut refs));

    // policies
    let mut files: Vec<FileEntry> = Vec::new();
    let mut bundles: Vec<BundleEntry> = Vec::new();
    // Set when a policies[] entry could not be read at all.
    let mut incomplete = false;
    if let Some(list) = m.req(doc, "policies")
        && let Some(items) = doc.seq(list, "policies")
    {
        if items.is_empty() {
            doc.error(list, "policies", "must list at least one policy");
        }
        for (i, item) in items.iter().enumerate() {
            let path = index("policies", i);
            let Some(em) = doc.map(item, &path, &["file", "bundle_source"]) else {
                incomplete = true;
                continue;
            };
            match (em.get("file"), em.get("bundle_source")) {
                (Some(_), Some(_)) | (None, None) => {
                    incomplete = true;
                    doc.error(
                        item,
                        &path,
                        "exactly one of file or bundle_source is required",
                    );
                }
                (Some(f), None) => {
                    let fpath = join(&path, "file");
                    if let Some(s) = doc.nonempty(f, &fpath) {
                        let policy = load_policy_entry(session, doc, &s, file);
                        files.push(FileEntry {
                            policy,
                            node: s,
                            path: fpath,
                        });
                    } else {
                        incomplete = true;
                    }
                }
                (None, Some(b)) => {
                    let bpath = join(&path, "bundle_source");
                    let (source, name, prefix) = parse_bundle_source(session, doc, b, &bpath);
                    bundles.push(BundleEntry {
                        source,
                        name,
                        prefix,
                        path: bpath,
                    });
                }
            }
        }
    }

    let default_policy = m
        .get("default_policy")
        .and_then(|n| policy_ref(doc, n, "default_policy", &mut refs));

    let reload = match m.get("reload") {
        None => Some(ReloadConfig::default()),
        Some(n) => doc.map(n, "reload", &["watch"]).and_then(|rm| {
            Some(ReloadConfig {
                watch: match rm.get("watch") {
                    None => false,
                    Some(w) => doc.bool(w, "reload.watch")?,
                },
            })
        }),
    };

    let limits = match m.get("limits") {
        None => Some(LimitsConfig::default()),
        Some(n) => doc
            .map(
                n,
                "limits",
                &[
                    "max_request_bytes",
                    "header_read_timeout_seconds",
                    "idle_timeout_seconds",
                    "max_connections",
                    "max_requests_in_flight",
                ],
            )
            .and_then(|lm| {
                let d = LimitsConfig::default();
                let mut int = |key: &str, default: u64, min: i64, max: i64| match lm.get(key) {
                    None => Some(default),
                    Some(v) => doc
                        .int(v, &format!("limits.{key}"), min, max)
                        .and_then(|v| u64::try_from(v).ok()),
                };
                let max_request_bytes = int(
                    "max_request_bytes",
                    d.max_request_bytes,
                    MIN_REQUEST_BYTES,
                    MAX_REQUEST_BYTES,
                );
                let header_read_timeout_seconds = int(
                    "header_read_timeout_seconds",
                    d.header_read_timeout_seconds,
                    1,
                    300,
                );
                let idle_timeout_seconds =
                    int("idle_timeout_seconds", d.idle_timeout_seconds, 1, 3600);
                let max_connections = int("max_connections", d.max_connections, 1, 100_000);
                let max_requests_in_flight = int(
                    "max_requests_in_flight",
                    d.max_requests_in_flight,
                    1,
                    100_000,
                );
                Some(LimitsConfig {
                    max_request_bytes: max_request_bytes?,
                    header_read_timeout_seconds: header_read_timeout_seconds?,
                    idle_timeout_seconds: idle_timeout_seconds?,
                    max_connections: max_connections?,
                    max_requests_in_flight: max_requests_in_flight?,
                })
            }),
    };

    let logging = match m.get("logging") {
        None => Some(LoggingConfig {
            level: LogLevel::Info,
            format: LogFormat::Json,
        }),
        Some(n) => parse_logging(doc, n),
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
        Some(n) => parse_audit(session, doc, n),
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
    check_policy_names(doc, &files, &bundles, &refs, incomplete);

    if doc.errors.len() != before {
        return None;
    }
    let policies = files
        .into_iter()
        .map(|f| f.policy)
        .collect::<Option<Vec<_>>>()?;
    let bundle_sources = bundles
        .into_iter()
        .map(|b| b.source)
        .collect::<Option<Vec<_>>>()?;
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
    let super::tree::Value::Map(entries) = &server.value else {
        return None;
    };
    let auth = entries
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == "auth"))?;
    let super::tree::Value::Map(entries) = &auth.1.value else {
        return None;
    };
    entries
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == key))
        .map(|(_, v)| v)
}

fn load_policy_entry(
    session: &mut Session<'_>,
    doc: &mut Doc<'_>,
    s: &Str,
    config_file: &Path,
) -> Option<LoadedPolicy> {
    let rel = Path::new(&s.value);
    let path = if rel.is_absolute() {
        super::fs::rooted(session.opts.root.as_deref(), rel)
    } else {
        config_file.parent().unwrap_or(Path::new("")).join(rel)
    };
    session.load_policy_from_config(doc, s, &path)
}

fn check_policy_names(
    doc: &mut Doc<'_>,
    files: &[FileEntry],
    bundles: &[BundleEntry],
    refs: &[PolicyRef],
    incomplete: bool,
) {
    // Duplicate names among file policies.
    let mut names: BTreeMap<&str, &FileEntry> = BTreeMap::new();
    for f in files {
        let Some(p) = &f.policy else { continue };
        if let Some(prev) = names.get(p.name.as_str()) {
            doc.error_str(
                &f.node,
                format!(
                    "policy name {:?} is already loaded by {} (two policies with one name)",
                    p.name, prev.path
                ),
            );
        } else {
            names.insert(&p.name, f);
        }
    }
    // Bundle source names and prefixes.
    let mut bundle_names: BTreeMap<&str, &BundleEntry> = BTreeMap::new();
    for b in bundles {
        if let Some(n) = &b.name {
            if let Some(prev) = bundle_names.get(n.value.as_str()) {
                doc.error_str(
                    n,
                    format!(
                        "bundle source name {} is already used by {}",
                        n.shown(),
                        prev.path
                    ),
                );
            } else {
                bundle_names.insert(&n.value, b);
            }
        }
    }
    // The contract sets no rule on prefixes beyond references: bundles
    // without a prefix, overlapping prefixes and file policies whose name
    // starts with a prefix are all accepted. Whether two policies end up
    // with one name can only be known when the bundles are fetched, and
    // the server checks it then.
    // References.
    let every_bundle_prefixed = bundles.iter().all(|b| !matches!(b.prefix, Prefix::Absent));
    let any_invalid = bundles.iter().any(|b| matches!(b.prefix, Prefix::Invalid));
    // A policy file that did not load (already reported) may be the one a
    // reference names: do not add a misleading second error.
    let all_files_loaded = !incomplete && files.iter().all(|f| f.policy.is_some());
    for r in refs {
        let name = &r.name.value;
        if names.contains_key(name.as_str()) {
            continue;
        }
        if !every_bundle_prefixed || any_invalid || !all_files_loaded {
            // A bundle without a (valid) prefix may bring any name: such
            // references are checked when the bundle is fetched.
            continue;
        }
        let via_bundle = bundles.iter().any(|b| {
            b.prefix
                .valid()
                .is_some_and(|p| name.len() > p.value.len() && name.starts_with(&p.value))
        });
        if via_bundle {
            continue;
        }
        let mut known: Vec<String> = names.keys().map(|k| format!("{k:?}")).collect();
        known.extend(
            bundles
                .iter()
                .filter_map(|b| b.prefix.valid().map(|p| format!("{:?}*", p.value))),
        );
        let known = if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        };
        doc.error_str(
            &r.name,
            format!(
                "policy {} is not loaded by this config (loaded: {known})",
                r.name.shown()
            ),
        );
    }
}

fn parse_server(
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
        Some(n) => parse_auth_section(session, doc, n, refs, tls.as_ref().and_then(|t| t.as_ref())),
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

fn parse_auth_section(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    refs: &mut Vec<PolicyRef>,
    tls: Option<&TlsConfig>,
) -> Option<AuthConfig> {
    let m = doc.map(
        node,
        "server.auth",
        &["allow_unauthenticated", "tokens", "oidc", "mtls"],
    )?;
    let before = doc.errors.len();
    let mut auth = AuthConfig::default();
    if let Some(n) = m.get("allow_unauthenticated") {
        auth.allow_unauthenticated = doc
            .bool(n, "server.auth.allow_unauthenticated")
            .unwrap_or(false);
    }

    if let Some(list) = m.get("tokens")
        && let Some(items) = doc.seq(list, "server.auth.tokens")
    {
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        let mut hashes: BTreeMap<[u8; 32], String> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let path = index("server.auth.tokens", i);
            let Some(tm) = doc.map(item, &path, &["name", "policy", "sha256"]) else {
                continue;
            };
            let name = tm
                .req(doc, "name")
                .and_then(|n| doc.nonempty(n, &join(&path, "name")));
            if let Some(n) = &name {
                if !super::names::is_token_name(&n.value) {
                    doc.error_str(
                        n,
                        format!(
                            "invalid token name {}: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 253 characters",
                            n.shown()
                        ),
                    );
                } else if let Some(prev) = names.get(&n.value) {
                    doc.error_str(
                        n,
                        format!("token name {} is already used by {prev}", n.shown()),
                    );
                } else {
                    names.insert(n.value.clone(), path.clone());
                }
            }
            let policy = tm
                .req(doc, "policy")
                .and_then(|n| policy_ref(doc, n, &join(&path, "policy"), refs));
            let hash = tm.req(doc, "sha256").and_then(|n| {
                let s = doc.string(n, &join(&path, "sha256"))?;
                let ok = s.value.len() == 64
                    && s.value.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                let bytes = ok.then(|| hex::decode(&s.value).ok()).flatten();
                let Some(arr) = bytes.and_then(|b| <[u8; 32]>::try_from(b).ok()) else {
                    doc.error_str(
                        &s,
                        "must be 64 lower-case hex digits (the SHA-256 of the token, as printed by haltsql hash-token)",
                    );
                    return None;
                };
                if let Some(prev) = hashes.get(&arr) {
                    doc.error_str(
                        &s,
                        format!("the same token hash as {prev}: a token must select exactly one policy"),
                    );
                    return None;
                }
                hashes.insert(arr, path.clone());
                Some(arr)
            });
            if let (Some(name), Some(policy), Some(sha256)) = (name, policy, hash) {
                auth.tokens.push(TokenConfig {
                    name: name.value,
                    policy,
                    sha256,
                });
            }
        }
    }

    if let Some(list) = m.get("oidc")
        && let Some(items) = doc.seq(list, "server.auth.oidc")
    {
        for (i, item) in items.iter().enumerate() {
            let path = index("server.auth.oidc", i);
            let Some(om) = doc.map(
                item,
                &path,
                &["issuer", "audience", "policy", "policy_claim", "jwks_file"],
            ) else {
                continue;
            };
            let issuer = om.req(doc, "issuer").and_then(|n| {
                let s = doc.nonempty(n, &join(&path, "issuer"))?;
                match check_url(&s.value, &["https"]) {
                    Ok(()) => Some(s.value),
                    Err(e) => {
                        doc.error_str(&s, format!("invalid issuer {}: {e}", s.shown()));
                        None
                    }
                }
            });
            let audience = om
                .req(doc, "audience")
                .and_then(|n| doc.nonempty(n, &join(&path, "audience")));
            let policy = match (om.get("policy"), om.get("policy_claim")) {
                (Some(p), None) => {
                    policy_ref(doc, p, &join(&path, "policy"), refs).map(OidcPolicy::Fixed)
                }
                (None, Some(c)) => doc
                    .nonempty(c, &join(&path, "policy_claim"))
                    .map(|s| OidcPolicy::Claim(s.value)),
                _ => {
                    doc.error(
                        item,
                        &path,
                        "exactly one of policy or policy_claim is required",
                    );
                    None
                }
            };
            let jwks = match om.get("jwks_file") {
                None => Some(None),
                Some(n) => {
                    file_or_content(session, doc, n, &join(&path, "jwks_file"), Content::Jwks)
                        .map(Some)
                }
            };
            if let (Some(issuer), Some(audience), Some(policy), Some(jwks_file)) =
                (issuer, audience, policy, jwks)
            {
                auth.oidc.push(OidcProvider {
                    issuer,
                    audience: audience.value,
                    policy,
                    jwks_file,
                });
            }
        }
    }

    if let Some(mt) = m.get("mtls")
        && let Some(mm) = doc.map(mt, "server.auth.mtls", &["identities"])
        && let Some(list) = mm.get("identities")
        && let Some(items) = doc.seq(list, "server.auth.mtls.identities")
    {
        if !items.is_empty() {
            let ok = tls.is_some_and(|t| t.client_auth != ClientAuth::None);
            if !ok {
                doc.error(
                    list,
                    "server.auth.mtls.identities",
                    "mTLS identities need server.tls with client_auth optional or required",
                );
            }
        }
        for (i, item) in items.iter().enumerate() {
            let path = index("server.auth.mtls.identities", i);
            let Some(im) = doc.map(item, &path, &["subject", "dns_name", "uri", "policy"]) else {
                continue;
            };
            let present: Vec<&str> = ["subject", "dns_name", "uri"]
                .into_iter()
                .filter(|k| im.has(k))
                .collect();
            let matcher = if present.len() != 1 {
                doc.error(
                    item,
                    &path,
                    "exactly one of subject, dns_name or uri is required",
                );
                None
            } else {
                let key = present[0];
                im.get(key)
                    .and_then(|n| doc.nonempty(n, &join(&path, key)))
                    .map(|s| match key {
                        "subject" => MtlsMatch::Subject(s.value),
                        "dns_name" => MtlsMatch::DnsName(s.value),
                        _ => MtlsMatch::Uri(s.value),
                    })
            };
            let policy = im
                .req(doc, "policy")
                .and_then(|n| policy_ref(doc, n, &join(&path, "policy"), refs));
            if let (Some(matcher), Some(policy)) = (matcher, policy) {
                auth.mtls_identities.push(MtlsIdentity { matcher, policy });
            }
        }
    }

    (doc.errors.len() == before).then_some(auth)
}

fn parse_logging(doc: &mut Doc<'_>, node: &Node) -> Option<LoggingConfig> {
    let m = doc.map(node, "logging", &["level", "format"])?;
    let level = match m.get("level") {
        None => Some(LogLevel::Info),
        Some(n) => doc
            .choice(
                n,
                "logging.level",
                &["error", "warn", "info", "debug", "trace"],
            )
            .map(|v| match v.as_str() {
                "error" => LogLevel::Error,
                "warn" => LogLevel::Warn,
                "debug" => LogLevel::Debug,
                "trace" => LogLevel::Trace,
                _ => LogLevel::Info,
            }),
    };
    let format = match m.get("format") {
        None => Some(LogFormat::Json),
        Some(n) => doc.choice(n, "logging.format", &["json", "text"]).map(|v| {
            if v == "text" {
                LogFormat::Text
            } else {
                LogFormat::Json
            }
        }),
    };
    Some(LoggingConfig {
        level: level?,
        format: format?,
    })
}

/// The sink types and the keys each takes (besides `type`).
const SINK_KEYS: &[(&str, &[&str])] = &[
    ("stdout", &["type"]),
    ("file", &["type", "path"]),
    (
        "s3",
        &[
            "type",
            "bucket",
            "prefix",
            "region",
            "endpoint",
            "credentials",
        ],
    ),
    ("gcs", &["type", "bucket", "prefix", "credentials_file"]),
    (
        "elasticsearch",
        &["type", "url", "index", "data_stream", "auth"],
    ),
    ("kafka", &["type", "brokers", "topic", "tls", "sasl"]),
];

fn parse_audit(session: &Session<'_>, doc: &mut Doc<'_>, node: &Node) -> Option<AuditConfig> {
    let m = doc.map(node, "audit", &["log_raw_sql", "sinks", "delivery"])?;
    let before = doc.errors.len();
    let log_raw_sql = match m.get("log_raw_sql") {
        None => false,
        Some(n) => doc.bool(n, "audit.log_raw_sql").unwrap_or(false),
    };
    let delivery = match m.get("delivery") {
        None => DeliveryConfig::default(),
        Some(n) => parse_delivery(doc, n).unwrap_or_default(),
    };
    let mut sinks = Vec::new();
    match m.get("sinks") {
        None => sinks.push(AuditSink::Stdout),
        Some(list) => {
            if let Some(items) = doc.seq(list, "audit.sinks") {
                if items.is_empty() {
                    doc.error(
                        list,
                        "audit.sinks",
                        "must list at least one sink (every decision is audited)",
                    );
                }
                for (i, item) in items.iter().enumerate() {
                    let path = index("audit.sinks", i);
                    if let Some(sink) = parse_sink(session, doc, item, &path) {
                        if sinks.contains(&sink) {
                            doc.error(item, &path, "duplicate sink");
                        } else {
                            sinks.push(sink);
                        }
                    }
                }
            }
        }
    }
    (doc.errors.len() == before).then_some(AuditConfig {
        log_raw_sql,
        sinks,
        delivery,
    })
}

fn parse_delivery(doc: &mut Doc<'_>, node: &Node) -> Option<DeliveryConfig> {
    let m = doc.map(
        node,
        "audit.delivery",
        &["queue_events", "batch_events", "flush_interval_ms"],
    )?;
    let d = DeliveryConfig::default();
    let mut int = |key: &str, default: u64, min: i64, max: i64| match m.get(key) {
        None => Some(default),
        Some(v) => doc
            .int(v, &format!("audit.delivery.{key}"), min, max)
            .and_then(|v| u64::try_from(v).ok()),
    };
    let queue_events = int("queue_events", d.queue_events, 1, 1_000_000);
    let batch_events = int("batch_events", d.batch_events, 1, 10_000);
    let flush_interval_ms = int("flush_interval_ms", d.flush_interval_ms, 10, 60_000);
    Some(DeliveryConfig {
        queue_events: queue_events?,
        batch_events: batch_events?,
        flush_interval_ms: flush_interval_ms?,
    })
}

fn parse_sink(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
) -> Option<AuditSink> {
    let types: Vec<&str> = SINK_KEYS.iter().map(|(t, _)| *t).collect();
    let m = doc.open_map(node, path)?;
    let ty = m
        .req(doc, "type")
        .and_then(|n| doc.choice(n, &join(path, "type"), &types))?;
    let keys = SINK_KEYS
        .iter()
        .find(|(t, _)| *t == ty)
        .map_or(&[][..], |(_, k)| k);
    let m = doc.map(node, path, keys)?;
    let before = doc.errors.len();
    let sink = match ty.as_str() {
        "stdout" => Some(AuditSink::Stdout),
        "file" => m
            .req(doc, "path")
            .and_then(|n| abs_path(session, doc, n, &join(path, "path")))
            .map(|path| AuditSink::File { path }),
        "s3" => {
            let bucket = m
                .req(doc, "bucket")
                .and_then(|n| bucket(doc, n, &join(path, "bucket"), 63));
            let prefix = m
                .get("prefix")
                .and_then(|n| doc.nonempty(n, &join(path, "prefix")))
                .map(|s| s.value);
            let S3Access {
                region,
                endpoint,
                credentials,
            } = parse_s3_access(doc, &m, path);
            Some(AuditSink::S3 {
                bucket: bucket?,
                prefix,
                region,
                endpoint,
                credentials: credentials?,
            })
        }
        "gcs" => {
            let bucket = m
                .req(doc, "bucket")
                .and_then(|n| bucket(doc, n, &join(path, "bucket"), 222));
            let prefix = m
                .get("prefix")
                .and_then(|n| doc.nonempty(n, &join(path, "prefix")))
                .map(|s| s.value);
            let credentials_file = m.get("credentials_file").and_then(|n| {
                file_or_content(
                    session,
                    doc,
                    n,
                    &join(path, "credentials_file"),
                    Content::Json,
                )
            });
            Some(AuditSink::Gcs {
                bucket: bucket?,
                prefix,
                credentials_file,
            })
        }
        "elasticsearch" => {
            let u = m
                .req(doc, "url")
                .and_then(|n| url(doc, n, &join(path, "url"), &["https", "http"]));
            let target = match (m.get("index"), m.get("data_stream")) {
                (Some(n), None) => {
                    es_name(doc, n, &join(path, "index"), "index").map(EsTarget::Index)
                }
                (None, Some(n)) => es_name(doc, n, &join(path, "data_stream"), "data stream")
                    .map(EsTarget::DataStream),
                _ => {
                    doc.error(
                        node,
                        path,
                        "exactly one of index or data_stream is required",
                    );
                    None
                }
            };
            let auth = match m.get("auth") {
                None => Some(SourceAuth::None),
                Some(n) => parse_auth(doc, n, &join(path, "auth"), true),
            };
            if let (Some(u), Some(a)) = (&u, &auth)
                && u.starts_with("http://")
                && !matches!(a, SourceAuth::None)
                && let Some(n) = m.get("auth")
            {
                doc.error(
                    n,
                    &join(path, "auth"),
                    "credentials would be sent in clear text over http://; use an https:// URL",
                );
            }
            Some(AuditSink::Elasticsearch {
                url: u?,
                target: target?,
                auth: auth?,
            })
        }
        "kafka" => {
            let bpath = join(path, "brokers");
            let brokers = m.req(doc, "brokers").and_then(|n| {
                let items = doc.strings(n, &bpath)?;
                if items.is_empty() {
                    doc.error(n, &bpath, "must list at least one broker");
                    return None;
                }
                let mut out = Vec::new();
                for s in items {
                    if host_port_ok(&s.value) {
                        out.push(s.value);
                    } else {
                        doc.error_str(
                            &s,
                            format!("invalid broker {}: expected HOST:PORT", s.shown()),
                        );
                    }
                }
                Some(out)
            });
            let topic = m.req(doc, "topic").and_then(|n| {
                let s = doc.nonempty(n, &join(path, "topic"))?;
                let ok = s.value.len() <= 249
                    && s.value != "."
                    && s.value != ".."
                    && s.value
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
                if ok {
                    Some(s.value)
                } else {
                    doc.error_str(
                        &s,
                        format!(
                            "invalid topic {}: letters, digits, '.', '_' and '-', at most 249",
                            s.shown()
                        ),
                    );
                    None
                }
            });
            let tls = match m.get("tls") {
                None => Some(Some(KafkaTls::default())),
                Some(n) => parse_kafka_tls(session, doc, n, &join(path, "tls")),
            };
            let sasl = match m.get("sasl") {
                None => Some(None),
                Some(n) => parse_sasl(doc, n, &join(path, "sasl")).map(Some),
            };
            if tls == Some(None)
                && matches!(&sasl, Some(Some(s)) if s.mechanism == SaslMechanism::Plain)
                && let Some(n) = m.get("sasl")
            {
                doc.error(
                    n,
                    &join(path, "sasl"),
                    "SASL PLAIN without TLS would send the password in clear text",
                );
            }
            Some(AuditSink::Kafka {
                brokers: brokers?,
                topic: topic?,
                tls: tls?,
                sasl: sasl?,
            })
        }
        _ => None,
    };
    if doc.errors.len() != before {
        return None;
    }
    sink
}

/// An Elasticsearch index or data stream name.
fn es_name(doc: &mut Doc<'_>, node: &Node, path: &str, what: &str) -> Option<String> {
    let s = doc.nonempty(node, path)?;
    let ok = s.value.len() <= 255
        && !s.value.starts_with(['-', '_', '+', '.'])
        && s.value.bytes().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.' | b'+')
        });
    if ok {
        Some(s.value)
    } else {
        doc.error_str(
            &s,
            format!(
                "invalid {what} name {}: at most 255 lower-case letters, digits, '-', '_', '.', '+', not starting with '-', '_', '+' or '.'",
                s.shown()
            ),
        );
        None
    }
}

/// What the content form of a [`FileOrContent`] holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Content {
    /// PEM certificates.
    Certificates,
    /// A PEM private key.
    PrivateKey,
    /// A JSON object (a service account key).
    Json,
    /// A JSON Web Key Set (a JSON object with a `keys` array).
    Jwks,
}

/// A path or the content itself (see [`FileOrContent`]). Error messages
/// never show content.
fn file_or_content(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
    content: Content,
) -> Option<FileOrContent> {
    let s = doc.nonempty(node, path)?;
    let text = s.value.trim_start();
    let form = match content {
        Content::Certificates => "PEM certificates (-----BEGIN CERTIFICATE-----)",
        Content::PrivateKey => "a PEM private key (-----BEGIN PRIVATE KEY-----)",
        Content::Json => "the service account key JSON",
        Content::Jwks => "a JWKS JSON document ({\"keys\": [...]})",
    };
    let is_content = match content {
        Content::Json | Content::Jwks => text.starts_with('{'),
        _ => text.starts_with("-----BEGIN"),
    };
    if is_content {
        let ok = match content {
            Content::Json => {
                serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
            }
            Content::Jwks => serde_json::from_str::<serde_json::Value>(text)
                .is_ok_and(|v| v.get("keys").is_some_and(serde_json::Value::is_array)),
            Content::Certificates => pem_labels(text)
                .is_some_and(|l| !l.is_empty() && l.iter().all(|l| *l == "CERTIFICATE")),
            Content::PrivateKey => pem_labels(text).is_some_and(|l| {
                l.len() == 1 && l[0].ends_with("PRIVATE KEY") && l[0] != "ENCRYPTED PRIVATE KEY"
            }),
        };
        if !ok {
            doc.error_str(
                &s,
                format!("the content is not {form}; expected an absolute path or {form}"),
            );
            return None;
        }
        return Some(FileOrContent::Content(Secret::new(s.value)));
    }
    if !Path::new(&s.value).is_absolute() || s.value.contains('\0') {
        doc.error_str(
            &s,
            format!(
                "{} is not an absolute path; expected an absolute path or {form}",
                s.shown()
            ),
        );
        return None;
    }
    Some(FileOrContent::Path(super::fs::rooted(
        session.opts.root.as_deref(),
        Path::new(&s.value),
    )))
}

/// The labels of the PEM blocks in `text` (`-----BEGIN L-----` ...
/// `-----END L-----`), or `None` when the framing is broken or there is
/// text outside the blocks. The base64 inside is not decoded here.
fn pem_labels(text: &str) -> Option<Vec<&str>> {
    let mut labels = Vec::new();
    let mut open: Option<&str> = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() {
            continue;
        }
        if let Some(l) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            if open.is_some() {
                return None;
            }
            open = Some(l);
        } else if let Some(l) = line
            .strip_prefix("-----END ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            if open != Some(l) {
                return None;
            }
            labels.push(l);
            open = None;
        } else if open.is_none() {
            return None;
        }
    }
    open.is_none().then_some(labels)
}

/// Kafka `tls`: a boolean, or `{ca_file?, cert_file?, key_file?}` (TLS on).
/// Returns `Some(None)` for `tls: false`.
fn parse_kafka_tls(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
) -> Option<Option<KafkaTls>> {
    if !matches!(node.value, super::tree::Value::Map(_)) {
        if let super::tree::Value::Scalar(s) = &node.value
            && let super::tree::ScalarKind::Bool(b) = s.kind()
        {
            return Some(b.then(KafkaTls::default));
        }
        doc.error(
            node,
            path,
            format!(
                "expected true, false or a mapping {{ca_file, cert_file, key_file}}, found {}",
                node.type_name()
            ),
        );
        return None;
    }
    let m = doc.map(node, path, &["ca_file", "cert_file", "key_file"])?;
    let before = doc.errors.len();
    let get = |doc: &mut Doc<'_>, key: &str, content: Content| {
        m.get(key)
            .and_then(|n| file_or_content(session, doc, n, &join(path, key), content))
    };
    let tls = KafkaTls {
        ca: get(doc, "ca_file", Content::Certificates),
        cert: get(doc, "cert_file", Content::Certificates),
        key: get(doc, "key_file", Content::PrivateKey),
    };
    for (have, missing) in [("cert_file", "key_file"), ("key_file", "cert_file")] {
        if m.has(have) && !m.has(missing) {
            doc.error(
                node,
                &join(path, missing),
                format!("required with {have} (a client certificate needs both)"),
            );
        }
    }
    (doc.errors.len() == before).then_some(Some(tls))
}

fn host_port_ok(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
    };
    port_ok && host_ok
}

fn parse_sasl(doc: &mut Doc<'_>, node: &Node, path: &str) -> Option<KafkaSasl> {
    let m = doc.map(node, path, &["mechanism", "username", "password"])?;
    let mechanism = m
        .req(doc, "mechanism")
        .and_then(|n| {
            doc.choice(
                n,
                &join(path, "mechanism"),
                &["plain", "scram-sha-256", "scram-sha-512"],
            )
        })
        .map(|v| match v.as_str() {
            "scram-sha-256" => SaslMechanism::ScramSha256,
            "scram-sha-512" => SaslMechanism::ScramSha512,
            _ => SaslMechanism::Plain,
        });
    let username = m
        .req(doc, "username")
        .and_then(|n| doc.nonempty(n, &join(path, "username")));
    let password = m
        .req(doc, "password")
        .and_then(|n| doc.nonempty(n, &join(path, "password")));
    Some(KafkaSasl {
        mechanism: mechanism?,
        username: username?.value,
        password: Secret::new(password?.value),
    })
}
