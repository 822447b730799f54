//! Audit events: one JSON line per verify decision, written to every
//! configured sink, chained by hash.
//!
//! Each event carries `prev`, the lower-case hex SHA-256 of the previous
//! event's JSON line (without the newline) written by this process; the
//! first event of a process has `prev` = 64 zeros and `seq` = 1. A reader
//! can check that no event was removed, changed or reordered within one
//! process's output by recomputing the chain.
//!
//! Local sinks (stdout, file) are written before the decision is answered.
//! Remote sinks (s3, gcs, elasticsearch, kafka) get the event through a
//! bounded queue and a delivery task per sink ([`delivery`]), so a slow or
//! absent peer never holds up a verify answer.

mod batch;
mod delivery;
mod elasticsearch;
mod gcs;
mod kafka;
mod sinks;

use delivery::Queue;

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::engine::{Code, Decision};
use crate::load::{AuditSink, DeliveryConfig, FileOrContent};

/// The `prev` of a process's first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Debug, Error)]
pub enum AuditError {
    #[error("{0} is not implemented by this server")]
    Unsupported(String),
    #[error("cannot set up an audit sink: {0}")]
    Setup(String),
    #[error("cannot open audit file {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot write audit event: {0}")]
    Write(#[from] io::Error),
    #[error("cannot encode audit event: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("the audit log is unusable after an earlier failure")]
    Poisoned,
}

enum Sink {
    Stdout,
    File(File),
    /// In-memory sink for tests.
    Memory(Vec<String>),
    /// A remote sink's queue.
    Remote(Arc<Queue>),
}

struct Chain {
    /// The hex SHA-256 of the last line written ([`GENESIS`] at first).
    prev: [u8; 64],
    seq: u64,
    sinks: Vec<Sink>,
    /// The line being written, reused from one event to the next.
    buf: Vec<u8>,
}

/// The audit log of one process.
pub struct AuditLog {
    log_raw_sql: bool,
    chain: Mutex<Chain>,
    /// The remote sinks, their targets taken by [`AuditLog::start_delivery`].
    remotes: Vec<(Arc<Queue>, Mutex<Option<sinks::Target>>)>,
    /// This process's id in object names, document ids and record keys.
    process: Arc<str>,
}

/// The running delivery tasks of the remote sinks.
pub struct Delivery {
    stop: tokio::sync::watch::Sender<Option<Instant>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Delivery {
    /// Send what is queued, then stop; events still queued at `deadline`
    /// are dropped and counted (`reason="shutdown"`).
    pub async fn flush(self, deadline: Instant) {
        let _ = self.stop.send(Some(deadline));
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// One audit event, as written.
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    pub time: &'a str,
    pub seq: u64,
    /// The token's name; null for unauthenticated requests.
    pub token: Option<&'a str>,
    pub policy: &'a str,
    /// `allow` or `deny`.
    pub decision: &'static str,
    pub statement: Option<&'a str>,
    pub violations: &'a [Code],
    pub sql_sha256: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<&'a str>,
    pub prev: &'a str,
}

impl AuditLog {
    /// Open the configured sinks. Sink types the server does not implement
    /// are refused.
    pub fn open(
        log_raw_sql: bool,
        sinks: &[AuditSink],
        delivery: &DeliveryConfig,
    ) -> Result<Self, AuditError> {
        let mut out = Vec::new();
        let mut remotes = Vec::new();
        let process: Arc<str> = Arc::from(sinks::process_id().as_str());
        for (i, s) in sinks.iter().enumerate() {
            if let Some(target) = sinks::Target::new(s, &process)? {
                let q = Arc::new(Queue::new(
                    format!("audit.sinks[{i}]"),
                    s.type_name(),
                    delivery,
                ));
                out.push(Sink::Remote(Arc::clone(&q)));
                remotes.push((q, Mutex::new(Some(target))));
                continue;
            }
            match s {
                AuditSink::Stdout => out.push(Sink::Stdout),
                AuditSink::File { path } => {
                    let f = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|source| AuditError::Open {
                            path: path.clone(),
                            source,
                        })?;
                    out.push(Sink::File(f));
                }
                other => {
                    return Err(AuditError::Unsupported(format!(
                        "the {} audit sink",
                        other.type_name()
                    )));
                }
            }
        }
        let mut log = Self::with_sinks(log_raw_sql, out);
        log.remotes = remotes;
        log.process = process;
        Ok(log)
    }

    /// Start the delivery task of each remote sink (once; later calls
    /// start nothing). Needs a Tokio runtime.
    pub fn start_delivery(&self) -> Delivery {
        let (stop, rx) = tokio::sync::watch::channel(None);
        let mut tasks = Vec::new();
        for (q, target) in &self.remotes {
            let taken = target
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(t) = taken {
                tasks.push(tokio::spawn(delivery::run(
                    Arc::clone(q),
                    t,
                    Arc::clone(&self.process),
                    rx.clone(),
                )));
            }
        }
        Delivery { stop, tasks }
    }

    /// The audit series of `/metrics` (none without remote sinks).
    pub fn metrics(&self, out: &mut String) {
        if self.remotes.is_empty() {
            return;
        }
        for (name, kind, help) in delivery::METRICS_HEADER {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        }
        for (q, _) in &self.remotes {
            q.metrics(out);
        }
    }

    /// An audit log that keeps its lines in memory (tests, benchmarks).
    pub fn in_memory(log_raw_sql: bool) -> Self {
        Self::with_sinks(log_raw_sql, vec![Sink::Memory(Vec::new())])
    }

    fn with_sinks(log_raw_sql: bool, sinks: Vec<Sink>) -> Self {
        AuditLog {
            log_raw_sql,
            chain: Mutex::new(Chain {
                prev: hex_array(GENESIS),
                seq: 0,
                sinks,
                buf: Vec::with_capacity(512),
            }),
            remotes: Vec::new(),
            process: Arc::from(""),
        }
    }

    /// Record one decision. The event is written to every sink before this
    /// returns; an error means the decision must not be served.
    ///
    /// What does not depend on the chain (the SQL's hash, the codes) is
    /// computed before the lock; under it, the line is serialized into a
    /// buffer kept from one event to the next and written with one call
    /// per sink.
    pub fn record(&self, token: Option<&str>, sql: &str, d: &Decision) -> Result<(), AuditError> {
        let mut sql_sha256 = [0u8; 64];
        hex_sha256(sql.as_bytes(), &mut sql_sha256);
        let violations = d.codes();
        let mut guard = self.chain.lock().map_err(|_| AuditError::Poisoned)?;
        let Chain {
            prev,
            seq,
            sinks,
            buf,
        } = &mut *guard;
        let now = SystemTime::now();
        let time = rfc3339(now);
        let event = Event {
            time: &time,
            seq: *seq + 1,
            token,
            policy: &d.policy,
            decision: if d.allowed { "allow" } else { "deny" },
            statement: d.statement.as_deref(),
            violations: &violations,
            sql_sha256: ascii(&sql_sha256),
            sql: self.log_raw_sql.then_some(sql),
            prev: ascii(prev),
        };
        buf.clear();
        serde_json::to_writer(&mut *buf, &event)?;
        let line_len = buf.len();
        buf.push(b'\n');
        let event_seq = event.seq;
        // The line as shared text, made once for the remote sinks' queues.
        let mut shared: Option<Arc<str>> = None;
        for sink in sinks.iter_mut() {
            match sink {
                Sink::Stdout => {
                    let mut out = io::stdout().lock();
                    out.write_all(buf)?;
                    out.flush()?;
                }
                Sink::File(f) => f.write_all(buf)?,
                Sink::Memory(v) => v.push(line_text(&buf[..line_len])),
                Sink::Remote(q) => {
                    let line = shared
                        .get_or_insert_with(|| Arc::from(line_text(&buf[..line_len]).as_str()));
                    q.push(event_seq, line, now);
                }
            }
        }
        hex_sha256(&buf[..line_len], prev);
        *seq += 1;
        Ok(())
    }

    /// The lines of in-memory sinks.
    pub fn memory_lines(&self) -> Vec<String> {
        let Ok(chain) = self.chain.lock() else {
            return Vec::new();
        };
        chain
            .sinks
            .iter()
            .filter_map(|s| match s {
                Sink::Memory(v) => Some(v.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }
}

/// The lower-case hex SHA-256 of `data`, into `out`.
fn hex_sha256(data: &[u8], out: &mut [u8; 64]) {
    // Both lengths are fixed: 32 bytes make 64 hex digits.
    let _ = hex::encode_to_slice(Sha256::digest(data), out);
}

/// A 64-digit hex string as an array.
fn hex_array(s: &str) -> [u8; 64] {
    let mut out = [b'0'; 64];
    out.copy_from_slice(&s.as_bytes()[..64]);
    out
}

/// Hex digits as text (always ASCII).
fn ascii(hex: &[u8; 64]) -> &str {
    std::str::from_utf8(hex).unwrap_or(GENESIS)
}

/// A serialized line as text (serde_json writes UTF-8 only).
fn line_text(line: &[u8]) -> String {
    String::from_utf8_lossy(line).into_owned()
}

/// Check a sequence of audit lines from one process: each `prev` is the
/// hash of the line before (the first is [`GENESIS`]) and `seq` counts up
/// from 1. Returns the index of the first bad line.
pub fn verify_chain<S: AsRef<str>>(lines: &[S]) -> Result<(), usize> {
    let mut prev = GENESIS.to_string();
    for (i, line) in lines.iter().enumerate() {
        let line = line.as_ref();
        let v: serde_json::Value = serde_json::from_str(line).map_err(|_| i)?;
        if v.get("prev").and_then(|p| p.as_str()) != Some(prev.as_str())
            || v.get("seq").and_then(|s| s.as_u64()) != Some(i as u64 + 1)
        {
            return Err(i);
        }
        prev = hex::encode(Sha256::digest(line.as_bytes()));
    }
    Ok(())
}

/// A `FileOrContent` setting's text (a file is read, at most 1 MiB).
pub fn read_file_or_content(f: &FileOrContent) -> io::Result<String> {
    match f {
        FileOrContent::Content(c) => Ok(c.expose().to_string()),
        FileOrContent::Path(p) => {
            let mut s = String::new();
            File::open(p)?.take(1 << 20).read_to_string(&mut s)?;
            Ok(s)
        }
    }
}

/// `YYYYMMDDTHHMMSS.mmmZ` in UTC: sortable, and safe in object names.
pub fn rfc3339_compact(t: SystemTime) -> String {
    rfc3339(t).replace(['-', ':'], "")
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` in UTC.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, day) = civil_from_days(days);
    let (h, min, s, ms) = (rem / 3600, (rem % 3600) / 60, rem % 60, d.subsec_millis());
    let year = match u64::try_from(y) {
        Ok(year) if year <= 9999 => year,
        // Outside four digits: rare enough for format!.
        _ => return format!("{y:04}-{m:02}-{day:02}T{h:02}:{min:02}:{s:02}.{ms:03}Z"),
    };
    // Digit by digit: once per audit event, where format! cost ten times
    // as much (callgrind).
    let mut out = String::with_capacity(24);
    for (value, width, sep) in [
        (year, 4, '-'),
        (u64::from(m), 2, '-'),
        (u64::from(day), 2, 'T'),
        (h, 2, ':'),
        (min, 2, ':'),
        (s, 2, '.'),
        (u64::from(ms), 3, 'Z'),
    ] {
        push_digits(&mut out, value, width);
        out.push(sep);
    }
    out
}

/// The last `width` decimal digits of `v`, zero-padded.
fn push_digits(out: &mut String, v: u64, width: u32) {
    for i in (0..width).rev() {
        let digit = (v / 10u64.pow(i)) % 10;
        out.push(char::from(b'0' + digit as u8));
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::{Code, Violation};

    fn decision(allowed: bool) -> Decision {
        Decision {
            allowed,
            policy: "p".into(),
            statement: Some("select".into()),
            violations: if allowed {
                vec![]
            } else {
                vec![Violation::new(Code::ColumnNotAllowed, "x")]
            },
        }
    }

    #[test]
    fn time_format() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.789Z");
    }

    #[test]
    fn time_format_matches_the_format_string() {
        let reference = |t: SystemTime| {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            let secs = d.as_secs();
            let rem = secs % 86_400;
            let (y, m, day) = civil_from_days((secs / 86_400) as i64);
            format!(
                "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
                rem / 3600,
                (rem % 3600) / 60,
                rem % 60,
                d.subsec_millis()
            )
        };
        // Every few hours over 600 years, odd milliseconds, and years
        // past 9999.
        let mut ms: u64 = 0;
        while ms < 600 * 366 * 86_400_000 {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(rfc3339(t), reference(t));
            ms += 3 * 3_600_000 + 7_919;
        }
        for secs in [253_402_300_799u64, 253_402_300_800, 400_000_000_000] {
            let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(5);
            assert_eq!(rfc3339(t), reference(t));
        }
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(253_402_300_800)),
            "10000-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn chain_links_events_and_hides_sql() {
        let log = AuditLog::in_memory(false);
        for i in 0..3 {
            log.record(Some("tok"), "SELECT 1", &decision(i % 2 == 0))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let lines = log.memory_lines();
        assert_eq!(lines.len(), 3);
        assert_eq!(verify_chain(&lines), Ok(()));
        let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap_or_default();
        assert_eq!(first["prev"], GENESIS);
        assert_eq!(first["decision"], "allow");
        assert_eq!(first["token"], "tok");
        assert!(first.get("sql").is_none());
        let second: serde_json::Value = serde_json::from_str(&lines[1]).unwrap_or_default();
        assert_eq!(second["violations"][0], "column_not_allowed");
        // Tampering with a line breaks the chain at the next one.
        let mut bad = lines.clone();
        bad[1] = bad[1].replace("deny", "allow");
        assert_eq!(verify_chain(&bad), Err(2));
        // Dropping a line breaks it too.
        assert_eq!(verify_chain(&[&lines[0], &lines[2]]), Err(1));
    }

    #[test]
    fn raw_sql_only_when_configured() {
        let log = AuditLog::in_memory(true);
        log.record(None, "SELECT 42", &decision(true))
            .unwrap_or_else(|e| panic!("{e}"));
        let v: serde_json::Value = serde_json::from_str(&log.memory_lines()[0]).unwrap_or_default();
        assert_eq!(v["sql"], "SELECT 42");
        assert_eq!(v["token"], serde_json::Value::Null);
    }
}
