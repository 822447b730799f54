//! The kafka sink: each event is one record (value: the event's JSON line,
//! key: the process id), a batch is one produce request.
//!
//! All events of a process go to one partition of the topic (chosen from
//! the process id when the sink first connects), so that Kafka keeps them in
//! chain order. A retried batch may be written twice; readers drop repeated
//! `(key, seq)` pairs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;

use super::AuditError;
use super::batch::{Batch, SendError};
use super::read_file_or_content;
use crate::load::{FileOrContent, KafkaSasl, KafkaTls, SaslMechanism};

/// Deadline of a connect or a produce request. rskafka retries inside it
/// (reconnecting, following a moved leader); past it the delivery task
/// counts a failure and backs off.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Kafka {
    brokers: Vec<String>,
    topic: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    sasl: Option<SaslConfig>,
    key: Vec<u8>,
    conn: Option<(Client, PartitionClient)>,
}

impl Kafka {
    pub fn new(
        brokers: &[String],
        topic: &str,
        tls: Option<&KafkaTls>,
        sasl: Option<&KafkaSasl>,
        process: &str,
    ) -> Result<Self, AuditError> {
        let tls = tls.map(client_config).transpose()?.map(Arc::new);
        let sasl = sasl.map(|s| {
            let c = Credentials::new(s.username.clone(), s.password.expose().to_string());
            match s.mechanism {
                SaslMechanism::Plain => SaslConfig::Plain(c),
                SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(c),
                SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(c),
            }
        });
        Ok(Kafka {
            brokers: brokers.to_vec(),
            topic: topic.to_string(),
            tls,
            sasl,
            key: process.as_bytes().to_vec(),
            conn: None,
        })
    }

    async fn connect(&self) -> Result<(Client, PartitionClient), SendError> {
        let mut b = ClientBuilder::new(self.brokers.clone())
            .client_id("haltsql-audit")
            .backoff_config(rskafka::BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
                deadline: Some(Duration::from_secs(5)),
            });
        if let Some(t) = &self.tls {
            b = b.tls_config(Arc::clone(t));
        }
        if let Some(s) = &self.sasl {
            b = b.sasl_config(s.clone());
        }
        let client = b.build().await.map_err(|e| transient("connect", &e))?;
        let topics = client
            .list_topics()
            .await
            .map_err(|e| transient("metadata", &e))?;
        let partitions: Vec<i32> = topics
            .into_iter()
            .find(|t| t.name == self.topic)
            .map(|t| t.partitions.into_iter().collect())
            .unwrap_or_default();
        if partitions.is_empty() {
            // Possibly not created yet: retried like an outage.
            return Err(SendError::Transient(format!(
                "topic {} not found on the brokers",
                self.topic
            )));
        }
        let pick = self.key.iter().fold(0usize, |h, b| {
            h.wrapping_mul(31).wrapping_add(usize::from(*b))
        }) % partitions.len();
        let partition = partitions[pick];
        let pc = client
            .partition_client(self.topic.clone(), partition, UnknownTopicHandling::Error)
            .await
            .map_err(|e| transient("partition", &e))?;
        Ok((client, pc))
    }

    pub async fn send(&mut self, batch: &Batch) -> Result<(), SendError> {
        if self.conn.is_none() {
            let c = tokio::time::timeout(ATTEMPT_TIMEOUT, self.connect())
                .await
                .map_err(|_| SendError::Transient("connect: no answer within 10s".into()))??;
            self.conn = Some(c);
        }
        let Some((_, pc)) = &self.conn else {
            return Err(SendError::Transient("not connected".into()));
        };
        let records = batch
            .events
            .iter()
            .map(|e| {
                let ms = e
                    .time
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                Record {
                    key: Some(self.key.clone()),
                    value: Some(e.line.as_bytes().to_vec()),
                    headers: BTreeMap::new(),
                    timestamp: chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default(),
                }
            })
            .collect();
        let produced = tokio::time::timeout(
            ATTEMPT_TIMEOUT,
            pc.produce(records, Compression::NoCompression),
        )
        .await;
        match produced {
            Ok(Ok(_)) => Ok(()),
            Err(_) => {
                self.conn = None;
                Err(SendError::Transient("produce: no answer within 10s".into()))
            }
            Ok(Err(e)) => {
                // Reconnect on the next attempt (leader moves, broker restarts).
                self.conn = None;
                let text = e.to_string();
                if text.contains("MessageTooLarge") || text.contains("RecordListTooLarge") {
                    Err(SendError::rejected(format!("produce: {text}")))
                } else {
                    Err(SendError::Transient(format!("produce: {text}")))
                }
            }
        }
    }
}

fn transient(what: &str, e: &rskafka::client::error::Error) -> SendError {
    SendError::Transient(format!("{what}: {e}"))
}

/// The rustls client settings of `tls` (no `insecure_skip_verify`: the
/// broker is always verified, against `ca_file` or the system roots).
fn client_config(tls: &KafkaTls) -> Result<rustls::ClientConfig, AuditError> {
    let setup = |m: String| AuditError::Setup(format!("kafka TLS: {m}"));
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            for c in certs(ca, "ca_file")? {
                roots.add(c).map_err(|e| setup(format!("ca_file: {e}")))?;
            }
        }
        None => {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(e.to_string()))?
        .with_root_certificates(roots);
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain = certs(cert, "cert_file")?;
            let pem = read_file_or_content(key).map_err(|e| setup(format!("key_file: {e}")))?;
            let key =
                <pki_types::PrivateKeyDer<'static> as pki_types::pem::PemObject>::from_pem_slice(
                    pem.as_bytes(),
                )
                .map_err(|e| setup(format!("key_file: {e}")))?;
            b.with_client_auth_cert(chain, key)
                .map_err(|e| setup(format!("client certificate: {e}")))
        }
        _ => Ok(b.with_no_client_auth()),
    }
}

fn certs(
    f: &FileOrContent,
    what: &str,
) -> Result<Vec<pki_types::CertificateDer<'static>>, AuditError> {
    let setup = |m: String| AuditError::Setup(format!("kafka TLS {what}: {m}"));
    let pem = read_file_or_content(f).map_err(|e| setup(e.to_string()))?;
    let out: Vec<_> =
        <pki_types::CertificateDer<'static> as pki_types::pem::PemObject>::pem_slice_iter(
            pem.as_bytes(),
        )
        .collect::<Result<_, _>>()
        .map_err(|e| setup(e.to_string()))?;
    if out.is_empty() {
        return Err(setup("no certificate".into()));
    }
    Ok(out)
}
