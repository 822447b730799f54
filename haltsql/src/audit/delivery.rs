//! Delivery to a remote sink: a bounded queue that `record` fills without
//! waiting, and a task that sends it in batches, retrying with backoff.
//!
//! The queue is filled in chain order under the audit log's lock, so a batch
//! (the oldest events, taken from the front) is always a contiguous run of
//! the hash chain. When the queue is full a new event is dropped and
//! counted; a verify answer never waits for a remote sink.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, watch};

use super::batch::{Batch, Queued, SendError};
use super::sinks::Target;
use crate::load::DeliveryConfig;

/// A batch never holds more than this many bytes of events (one larger
/// event is sent alone). Kafka brokers refuse record batches above 1 MiB by
/// default, so batches stay under it.
pub const MAX_BATCH_BYTES: usize = 900 * 1024;
/// A queue never holds more than this many bytes of events.
pub const MAX_QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// First retry delay; doubled after each failed attempt.
const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Deadline of one send attempt.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct QueueState {
    events: VecDeque<Queued>,
    bytes: usize,
    /// When the oldest queued event arrived.
    oldest: Option<Instant>,
}

/// Counters of one sink, shown on `/metrics`.
#[derive(Default)]
pub struct Stats {
    pub sent: AtomicU64,
    pub batches: AtomicU64,
    pub failures: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_rejected: AtomicU64,
    pub dropped_shutdown: AtomicU64,
}

/// The queue of one remote sink.
pub struct Queue {
    /// `audit.sinks[N]`, the metrics' `sink` label.
    pub name: String,
    /// The sink type, the metrics' `type` label.
    pub kind: &'static str,
    state: Mutex<QueueState>,
    notify: Notify,
    max_events: usize,
    batch_events: usize,
    interval: Duration,
    pub stats: Stats,
}

impl Queue {
    pub fn new(name: String, kind: &'static str, d: &DeliveryConfig) -> Self {
        Queue {
            name,
            kind,
            state: Mutex::new(QueueState::default()),
            notify: Notify::new(),
            max_events: usize::try_from(d.queue_events).unwrap_or(usize::MAX),
            batch_events: usize::try_from(d.batch_events).unwrap_or(usize::MAX).max(1),
            interval: Duration::from_millis(d.flush_interval_ms),
            stats: Stats::default(),
        }
    }

    /// Queue one event (`time`: its `time` field), or drop and count it
    /// when the queue is full. Never waits for the sink.
    pub fn push(&self, seq: u64, line: &Arc<str>, time: SystemTime) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if st.events.len() >= self.max_events || st.bytes + line.len() > MAX_QUEUE_BYTES {
            drop(st);
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        st.bytes += line.len();
        st.events.push_back(Queued {
            seq,
            line: Arc::clone(line),
            time,
        });
        if st.oldest.is_none() {
            st.oldest = Some(Instant::now());
        }
        // Wake the task when its wait changes: the first event starts the
        // flush interval, a full batch is due at once.
        let wake = st.events.len() == 1
            || st.events.len() == self.batch_events
            || st.bytes >= MAX_BATCH_BYTES;
        drop(st);
        if wake {
            self.notify.notify_one();
        }
    }

    /// Events waiting.
    pub fn queued(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .events
            .len()
    }

    /// `None` when a batch is due now (full, or its oldest event waited the
    /// flush interval, or `flush`), else how long until it is due (`None`
    /// with an empty queue is "nothing to send": `Some(MAX)`).
    fn due_in(&self, flush: bool) -> Option<Duration> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(oldest) = st.oldest else {
            return Some(Duration::MAX);
        };
        if flush || st.events.len() >= self.batch_events || st.bytes >= MAX_BATCH_BYTES {
            return None;
        }
        let waited = oldest.elapsed();
        if waited >= self.interval {
            None
        } else {
            Some(self.interval - waited)
        }
    }

    /// Take the oldest events: at most `batch_events` and
    /// [`MAX_BATCH_BYTES`] (at least one event).
    fn take(&self) -> Option<Batch> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut events = Vec::new();
        let mut bytes = 0;
        while let Some(front) = st.events.front() {
            if !events.is_empty()
                && (events.len() >= self.batch_events || bytes + front.line.len() > MAX_BATCH_BYTES)
            {
                break;
            }
            let Some(e) = st.events.pop_front() else {
                break;
            };
            bytes += e.line.len();
            events.push(e);
        }
        st.bytes = st.bytes.saturating_sub(bytes);
        st.oldest = if st.events.is_empty() {
            None
        } else {
            // The rest arrived after the batch's first event; starting their
            // wait now keeps one event from waiting more than two intervals.
            Some(Instant::now())
        };
        (!events.is_empty()).then_some(Batch { events, bytes })
    }

    /// Drop what is left (at shutdown, after the flush deadline).
    fn drain_dropped(&self) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let n = st.events.len() as u64;
        st.events.clear();
        st.bytes = 0;
        st.oldest = None;
        n
    }

    /// The Prometheus series of this sink.
    pub fn metrics(&self, out: &mut String) {
        let l = format!("sink=\"{}\",type=\"{}\"", self.name, self.kind);
        let s = &self.stats;
        let _ = writeln!(
            out,
            "haltsql_audit_events_sent_total{{{l}}} {}",
            s.sent.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "haltsql_audit_batches_sent_total{{{l}}} {}",
            s.batches.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "haltsql_audit_send_failures_total{{{l}}} {}",
            s.failures.load(Ordering::Relaxed)
        );
        for (reason, v) in [
            ("queue_full", &s.dropped_queue_full),
            ("rejected", &s.dropped_rejected),
            ("shutdown", &s.dropped_shutdown),
        ] {
            let _ = writeln!(
                out,
                "haltsql_audit_events_dropped_total{{{l},reason=\"{reason}\"}} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(out, "haltsql_audit_queue_events{{{l}}} {}", self.queued());
    }
}

/// The `# HELP`/`# TYPE` lines of the audit series.
pub const METRICS_HEADER: &[(&str, &str, &str)] = &[
    (
        "haltsql_audit_events_sent_total",
        "counter",
        "Audit events the remote sink accepted.",
    ),
    (
        "haltsql_audit_batches_sent_total",
        "counter",
        "Batches (objects, bulk or produce requests) the remote sink accepted.",
    ),
    (
        "haltsql_audit_send_failures_total",
        "counter",
        "Failed send attempts (each is retried with backoff).",
    ),
    (
        "haltsql_audit_events_dropped_total",
        "counter",
        "Audit events not delivered: queue_full (the sink was behind), rejected (the sink refused them), shutdown (left at the flush deadline).",
    ),
    (
        "haltsql_audit_queue_events",
        "gauge",
        "Audit events waiting in the sink's queue.",
    ),
];

/// Delay before retry `attempt` (0-based): exponential, capped, with
/// jitter (between half and all of it) so that replicas do not retry in step.
pub fn backoff(attempt: u32) -> Duration {
    let full = BACKOFF_BASE
        .saturating_mul(1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX))
        .min(BACKOFF_MAX);
    let mut b = [0u8; 2];
    let r = if getrandom::fill(&mut b).is_ok() {
        f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX)
    } else {
        0.5
    };
    full.mul_f64(0.5 + r / 2.0)
}

/// The delivery task of one sink. Runs until `stop` turns true, then sends
/// what is queued until `deadline` (received with the stop) passes.
pub async fn run(
    queue: Arc<Queue>,
    mut target: Target,
    process: Arc<str>,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let mut deadline: Option<Instant> = None;
    loop {
        if deadline.is_none() {
            deadline = *stop.borrow();
        }
        let flushing = deadline.is_some();
        match queue.due_in(flushing) {
            Some(wait) if flushing && wait == Duration::MAX => return,
            Some(wait) => {
                let sleep = wait.min(Duration::from_secs(3600));
                tokio::select! {
                    _ = queue.notify.notified() => {}
                    _ = tokio::time::sleep(sleep) => {}
                    r = stop.changed() => {
                        if r.is_err() {
                            // The server is gone without a flush request.
                            deadline = Some(Instant::now());
                        }
                    }
                }
                continue;
            }
            None => {}
        }
        let Some(batch) = queue.take() else {
            continue;
        };
        if !send_with_retry(
            &queue,
            &mut target,
            &process,
            &batch,
            &mut stop,
            &mut deadline,
        )
        .await
        {
            let left = queue.drain_dropped();
            queue
                .stats
                .dropped_shutdown
                .fetch_add(left, Ordering::Relaxed);
            tracing::warn!(
                sink = %queue.name,
                dropped = left + batch.events.len() as u64,
                "audit flush deadline passed: events not delivered"
            );
            return;
        }
    }
}

/// Sends one batch until it is accepted or refused. Returns false when the
/// flush deadline passed first (the batch is then counted as dropped).
async fn send_with_retry(
    queue: &Queue,
    target: &mut Target,
    process: &str,
    batch: &Batch,
    stop: &mut watch::Receiver<Option<Instant>>,
    deadline: &mut Option<Instant>,
) -> bool {
    let n = batch.events.len() as u64;
    let mut attempt: u32 = 0;
    loop {
        let limit = deadline.map_or(SEND_TIMEOUT, |d| {
            d.saturating_duration_since(Instant::now())
                .min(SEND_TIMEOUT)
        });
        let result = match tokio::time::timeout(limit, target.send(batch, process)).await {
            Ok(r) => r,
            Err(_) => Err(SendError::Transient(format!(
                "no answer within {}s",
                limit.as_secs_f32()
            ))),
        };
        match result {
            Ok(()) => {
                queue.stats.sent.fetch_add(n, Ordering::Relaxed);
                queue.stats.batches.fetch_add(1, Ordering::Relaxed);
                if attempt > 0 {
                    tracing::info!(sink = %queue.name, attempts = attempt + 1, "audit sink delivered again");
                }
                return true;
            }
            Err(SendError::Rejected { message, events }) => {
                let dropped = events.unwrap_or(n);
                queue
                    .stats
                    .dropped_rejected
                    .fetch_add(dropped, Ordering::Relaxed);
                queue
                    .stats
                    .sent
                    .fetch_add(n.saturating_sub(dropped), Ordering::Relaxed);
                queue.stats.batches.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    sink = %queue.name,
                    first_seq = batch.first_seq(),
                    last_seq = batch.last_seq(),
                    dropped,
                    error = %message,
                    "audit sink refused events"
                );
                return true;
            }
            Err(SendError::Transient(message)) => {
                queue.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    sink = %queue.name,
                    attempt = attempt + 1,
                    queued = queue.queued(),
                    error = %message,
                    "audit sink send failed; retrying"
                );
            }
        }
        let wait = backoff(attempt);
        attempt = attempt.saturating_add(1);
        if let Some(d) = *deadline {
            if Instant::now() + wait >= d {
                queue.stats.dropped_shutdown.fetch_add(n, Ordering::Relaxed);
                return false;
            }
            tokio::time::sleep(wait).await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            r = stop.changed() => {
                *deadline = if r.is_err() { Some(Instant::now()) } else { *stop.borrow() };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(events: u64, batch: u64) -> Queue {
        Queue::new(
            "audit.sinks[0]".into(),
            "s3",
            &DeliveryConfig {
                queue_events: events,
                batch_events: batch,
                flush_interval_ms: 1000,
            },
        )
    }

    #[test]
    fn full_queue_drops_and_counts() {
        let q = queue(3, 2);
        for seq in 1..=5 {
            q.push(
                seq,
                &Arc::from(format!("{{\"seq\":{seq}}}").as_str()),
                SystemTime::now(),
            );
        }
        assert_eq!(q.queued(), 3);
        assert_eq!(q.stats.dropped_queue_full.load(Ordering::Relaxed), 2);
        let b = q.take().unwrap();
        assert_eq!((b.first_seq(), b.last_seq()), (1, 2));
        assert_eq!(b.ndjson(), b"{\"seq\":1}\n{\"seq\":2}\n");
        let b = q.take().unwrap();
        assert_eq!((b.first_seq(), b.last_seq()), (3, 3));
        assert!(q.take().is_none());
        let mut m = String::new();
        q.metrics(&mut m);
        assert!(m.contains(
            "haltsql_audit_events_dropped_total{sink=\"audit.sinks[0]\",type=\"s3\",reason=\"queue_full\"} 2"
        ));
    }

    #[test]
    fn batches_are_due_when_full_or_old() {
        let q = queue(10, 2);
        assert_eq!(q.due_in(false), Some(Duration::MAX));
        q.push(1, &Arc::from("a"), SystemTime::now());
        assert!(q.due_in(false).is_some_and(|d| d <= Duration::from_secs(1)));
        assert_eq!(q.due_in(true), None);
        q.push(2, &Arc::from("b"), SystemTime::now());
        assert_eq!(q.due_in(false), None);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        for a in 0..20 {
            let b = backoff(a);
            let full = BACKOFF_BASE.saturating_mul(1 << a.min(16)).min(BACKOFF_MAX);
            assert!(b >= full / 2 && b <= full, "{a}: {b:?}");
        }
        assert!(backoff(30) <= BACKOFF_MAX);
    }
}
