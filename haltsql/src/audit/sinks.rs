//! The remote sinks: where a batch goes and how a failure is classified
//! (retry, or refused for good).

use bytes::Bytes;

use super::batch::{Batch, SendError, object_name};
use super::{AuditError, elasticsearch, gcs, kafka};
use crate::bundle::fetch::FetchError;
use crate::bundle::fetch::http::Http;
use crate::bundle::fetch::s3::S3;
use crate::load::AuditSink;

/// A remote sink, ready to send.
pub enum Target {
    S3 { client: S3, prefix: String },
    Gcs(Box<gcs::Gcs>),
    Elasticsearch(elasticsearch::Elasticsearch),
    Kafka(Box<kafka::Kafka>),
}

/// A random id of this process, in object names and Kafka record keys, so
/// that the chains of several replicas writing to one place can be told
/// apart.
pub fn process_id() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Time-based fallback: still distinct between restarts.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = (t as u64).to_le_bytes();
    }
    hex::encode(b)
}

impl Target {
    /// Set up the client of a remote sink (no connection is made yet).
    pub fn new(sink: &AuditSink, process: &str) -> Result<Option<Self>, AuditError> {
        let setup = |e: FetchError| AuditError::Setup(e.to_string());
        Ok(Some(match sink {
            AuditSink::Stdout | AuditSink::File { .. } => return Ok(None),
            AuditSink::S3 {
                bucket,
                prefix,
                region,
                endpoint,
                credentials,
            } => Target::S3 {
                client: S3::new(
                    Http::new().map_err(setup)?,
                    bucket,
                    "",
                    region.as_deref(),
                    endpoint.as_deref(),
                    credentials,
                )
                .map_err(|e| match e {
                    FetchError::Unsupported(m) => AuditError::Unsupported(m),
                    other => setup(other),
                })?,
                prefix: prefix.clone().unwrap_or_default(),
            },
            AuditSink::Gcs {
                bucket,
                prefix,
                credentials_file,
            } => Target::Gcs(Box::new(gcs::Gcs::new(
                bucket,
                prefix.as_deref().unwrap_or_default(),
                credentials_file.as_ref(),
            )?)),
            AuditSink::Elasticsearch { url, target, auth } => Target::Elasticsearch(
                elasticsearch::Elasticsearch::new(url, target, auth, process)?,
            ),
            AuditSink::Kafka {
                brokers,
                topic,
                tls,
                sasl,
            } => Target::Kafka(Box::new(kafka::Kafka::new(
                brokers,
                topic,
                tls.as_ref(),
                sasl.as_ref(),
                process,
            )?)),
        }))
    }

    pub async fn send(&mut self, batch: &Batch, process: &str) -> Result<(), SendError> {
        match self {
            Target::S3 { client, prefix } => {
                let name = object_name(prefix, process, batch);
                let r = client
                    .put(&name, Bytes::from(batch.ndjson()), "application/x-ndjson")
                    .await?;
                if r.status.is_success() {
                    Ok(())
                } else {
                    Err(SendError::from_status(
                        &format!("s3 object {name}"),
                        r.status.as_u16(),
                        &r.body,
                    ))
                }
            }
            Target::Gcs(g) => g.send(batch, process).await,
            Target::Elasticsearch(e) => e.send(batch).await,
            Target::Kafka(k) => k.send(batch).await,
        }
    }
}
