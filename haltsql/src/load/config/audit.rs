//! `audit`: the sinks every decision is written to and how events reach the
//! remote ones.

use std::path::PathBuf;

use super::bundle_source::{S3Access, S3Credentials, SourceAuth, parse_auth, parse_s3_access};
use crate::load::Session;
use crate::load::fields::{Content, FileOrContent, Secret, abs_path, bucket, file_or_content, url};
use crate::load::tree::{Node, ScalarKind, Value};
use crate::load::walk::{Doc, Map, index, join};

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

/// `audit`: whether raw SQL is logged, the sinks and their delivery.
pub(super) fn parse_audit(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
) -> Option<AuditConfig> {
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
        "s3" => parse_s3_sink(doc, m, path),
        "gcs" => parse_gcs_sink(session, doc, m, path),
        "elasticsearch" => parse_elasticsearch_sink(doc, node, m, path),
        "kafka" => parse_kafka_sink(session, doc, m, path),
        _ => None,
    };
    if doc.errors.len() != before {
        return None;
    }
    sink
}

/// `{type: s3, ...}`.
fn parse_s3_sink(doc: &mut Doc<'_>, m: Map<'_>, path: &str) -> Option<AuditSink> {
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

/// `{type: gcs, ...}`.
fn parse_gcs_sink(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    m: Map<'_>,
    path: &str,
) -> Option<AuditSink> {
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

/// `{type: elasticsearch, ...}`: exactly one of `index` and `data_stream`; no credentials over http://.
fn parse_elasticsearch_sink(
    doc: &mut Doc<'_>,
    node: &Node,
    m: Map<'_>,
    path: &str,
) -> Option<AuditSink> {
    let u = m
        .req(doc, "url")
        .and_then(|n| url(doc, n, &join(path, "url"), &["https", "http"]));
    let target = match (m.get("index"), m.get("data_stream")) {
        (Some(n), None) => es_name(doc, n, &join(path, "index"), "index").map(EsTarget::Index),
        (None, Some(n)) => {
            es_name(doc, n, &join(path, "data_stream"), "data stream").map(EsTarget::DataStream)
        }
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

/// `{type: kafka, ...}`: no SASL PLAIN without TLS.
fn parse_kafka_sink(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    m: Map<'_>,
    path: &str,
) -> Option<AuditSink> {
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

/// Kafka `tls`: a boolean, or `{ca_file?, cert_file?, key_file?}` (TLS on).
/// Returns `Some(None)` for `tls: false`.
fn parse_kafka_tls(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
) -> Option<Option<KafkaTls>> {
    if !matches!(node.value, Value::Map(_)) {
        if let Value::Scalar(s) = &node.value
            && let ScalarKind::Bool(b) = s.kind()
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
