//! The elasticsearch sink: one `_bulk` request per batch.
//!
//! `index`: an `index` action per event with `_id` = `PROCESS-SEQ`, so a
//! retried batch overwrites instead of duplicating. `data_stream`: a `create`
//! action with the same `_id` (data streams only take `create`); a
//! retried event that is already there answers 409, which counts as
//! delivered. A data stream needs `@timestamp`, so there each document is
//! the event's JSON line with `"@timestamp":"<time>",` put after its `{`;
//! the chain hashes the line without it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hyper::Method;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};

use super::AuditError;
use super::batch::{Batch, SendError};
use crate::audit::rfc3339;
use crate::bundle::fetch::http::Http;
use crate::load::{EsTarget, SourceAuth};

/// Largest `_bulk` answer read (it has one item per event).
const ANSWER_LIMIT: u64 = 16 * 1024 * 1024;

pub struct Elasticsearch {
    http: Http,
    url: String,
    target: EsTarget,
    auth: Option<HeaderValue>,
    process: String,
}

impl Elasticsearch {
    pub fn new(
        url: &str,
        target: &EsTarget,
        auth: &SourceAuth,
        process: &str,
    ) -> Result<Self, AuditError> {
        let header = match auth {
            SourceAuth::None => None,
            SourceAuth::Basic { username, password } => Some(format!(
                "Basic {}",
                STANDARD.encode(format!("{username}:{}", password.expose()))
            )),
            SourceAuth::Token { token } => Some(format!("Bearer {}", token.expose())),
            SourceAuth::ApiKey { api_key } => Some(format!("ApiKey {}", api_key.expose())),
        };
        let auth = header
            .map(|h| {
                HeaderValue::from_str(&h).map(|mut v| {
                    v.set_sensitive(true);
                    v
                })
            })
            .transpose()
            .map_err(|_| {
                AuditError::Setup("elasticsearch auth: not a valid header value".into())
            })?;
        Ok(Elasticsearch {
            http: Http::new().map_err(|e| AuditError::Setup(e.to_string()))?,
            url: format!("{}/_bulk", url.trim_end_matches('/')),
            target: target.clone(),
            auth,
            process: process.to_string(),
        })
    }

    /// The `_bulk` body of a batch.
    pub fn body(&self, batch: &Batch) -> Vec<u8> {
        let mut out = Vec::with_capacity(batch.bytes * 2);
        for e in &batch.events {
            let id = format!("{}-{}", self.process, e.seq);
            let (action, index, doc) = match &self.target {
                EsTarget::Index(i) => ("index", i, e.line.to_string()),
                EsTarget::DataStream(d) => {
                    let rest = e.line.strip_prefix('{').unwrap_or(&e.line);
                    let sep = if rest.starts_with('}') { "" } else { "," };
                    (
                        "create",
                        d,
                        format!("{{\"@timestamp\":\"{}\"{sep}{rest}", rfc3339(e.time)),
                    )
                }
            };
            let meta = serde_json::json!({ action: { "_index": index, "_id": id } });
            out.extend_from_slice(meta.to_string().as_bytes());
            out.push(b'\n');
            out.extend_from_slice(doc.as_bytes());
            out.push(b'\n');
        }
        out
    }

    pub async fn send(&mut self, batch: &Batch) -> Result<(), SendError> {
        let mut headers: Vec<(HeaderName, HeaderValue)> = vec![(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )];
        if let Some(a) = &self.auth {
            headers.push((AUTHORIZATION, a.clone()));
        }
        let r = self
            .http
            .send_body(
                Method::POST,
                &self.url,
                &headers,
                Bytes::from(self.body(batch)),
                ANSWER_LIMIT,
            )
            .await?;
        if !r.status.is_success() {
            return Err(SendError::from_status(
                "elasticsearch _bulk",
                r.status.as_u16(),
                &r.body,
            ));
        }
        bulk_result(&r.body, batch.events.len())
    }
}

/// Reads a `_bulk` answer: every item must be created or updated (409 on
/// `create`: already there). Items refused with 429 or 5xx make the whole
/// batch retried (the ids make that safe); other refusals are final.
fn bulk_result(body: &[u8], expected: usize) -> Result<(), SendError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| SendError::Transient(format!("elasticsearch _bulk: bad answer: {e}")))?;
    if v.get("errors").and_then(serde_json::Value::as_bool) == Some(false) {
        return Ok(());
    }
    let items = v
        .get("items")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| SendError::Transient("elasticsearch _bulk: answer without items".into()))?;
    if items.len() != expected {
        return Err(SendError::Transient(format!(
            "elasticsearch _bulk: {} items for {expected} events",
            items.len()
        )));
    }
    let mut refused = 0u64;
    let mut first = None;
    for item in items {
        let Some(result) = item.as_object().and_then(|o| o.values().next()) else {
            continue;
        };
        let status = result
            .get("status")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        match status {
            200..=299 | 409 => {}
            429 | 500.. => {
                return Err(SendError::Transient(format!(
                    "elasticsearch _bulk: an item answered {status}"
                )));
            }
            _ => {
                refused += 1;
                if first.is_none() {
                    first = Some(
                        result
                            .get("error")
                            .map(ToString::to_string)
                            .unwrap_or_else(|| format!("status {status}")),
                    );
                }
            }
        }
    }
    if refused == 0 {
        return Ok(());
    }
    Err(SendError::Rejected {
        message: format!(
            "elasticsearch _bulk refused {refused} events: {}",
            first.unwrap_or_default()
        ),
        events: Some(refused),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_answers() {
        assert!(bulk_result(br#"{"errors":false,"items":[]}"#, 2).is_ok());
        let conflict =
            br#"{"errors":true,"items":[{"create":{"status":201}},{"create":{"status":409}}]}"#;
        assert!(bulk_result(conflict, 2).is_ok());
        let busy = br#"{"errors":true,"items":[{"index":{"status":429}}]}"#;
        assert!(matches!(bulk_result(busy, 1), Err(SendError::Transient(_))));
        let bad = br#"{"errors":true,"items":[{"index":{"status":201}},{"index":{"status":400,"error":{"type":"mapper_parsing_exception"}}}]}"#;
        match bulk_result(bad, 2) {
            Err(SendError::Rejected { events, message }) => {
                assert_eq!(events, Some(1));
                assert!(message.contains("mapper_parsing_exception"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
