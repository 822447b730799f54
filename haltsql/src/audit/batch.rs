//! A batch of queued events, how its object is named, and why sending one
//! failed.

use std::sync::Arc;
use std::time::SystemTime;

use crate::audit::rfc3339_compact;
use crate::bundle::fetch::FetchError;

/// One queued event.
#[derive(Debug, Clone)]
pub struct Queued {
    pub seq: u64,
    pub line: Arc<str>,
    pub time: SystemTime,
}

/// A contiguous run of the chain, oldest first.
#[derive(Debug)]
pub struct Batch {
    pub events: Vec<Queued>,
    pub bytes: usize,
}

impl Batch {
    pub fn first_seq(&self) -> u64 {
        self.events.first().map_or(0, |e| e.seq)
    }

    pub fn last_seq(&self) -> u64 {
        self.events.last().map_or(0, |e| e.seq)
    }

    /// The events as newline-delimited JSON (each line ends with `\n`).
    pub fn ndjson(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes + self.events.len());
        for e in &self.events {
            out.extend_from_slice(e.line.as_bytes());
            out.push(b'\n');
        }
        out
    }
}

/// The object name of a batch: `PREFIX` + UTC time of its first event +
/// the process id + first and last `seq`, so that names sort by time and,
/// within one process, by position in the chain.
pub fn object_name(prefix: &str, process: &str, batch: &Batch) -> String {
    let first = batch
        .events
        .first()
        .map_or_else(std::time::SystemTime::now, |e| e.time);
    format!(
        "{prefix}{}-{process}-{:012}-{:012}.ndjson",
        rfc3339_compact(first),
        batch.first_seq(),
        batch.last_seq()
    )
}

/// Why a send failed.
#[derive(Debug)]
pub enum SendError {
    /// The sink could not be reached or answered a temporary error: retried
    /// with backoff.
    Transient(String),
    /// The sink refused the batch (or `events` of its events) for good:
    /// those events are dropped and counted, the rest count as sent.
    Rejected {
        message: String,
        events: Option<u64>,
    },
}

impl SendError {
    pub fn rejected(message: impl Into<String>) -> Self {
        SendError::Rejected {
            message: message.into(),
            events: None,
        }
    }

    /// An HTTP status: 408, 429 and 5xx are temporary, other errors final.
    pub fn from_status(what: &str, status: u16, body: &[u8]) -> Self {
        let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        let message = format!("{what}: HTTP {status}: {text}");
        if status == 408 || status == 429 || status >= 500 {
            SendError::Transient(message)
        } else {
            SendError::rejected(message)
        }
    }
}

impl From<FetchError> for SendError {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::Status { status, .. } => {
                SendError::from_status(&e.to_string(), status, &[])
            }
            FetchError::Unsupported(m) | FetchError::Url(m) => SendError::rejected(m),
            other => SendError::Transient(other.to_string()),
        }
    }
}
