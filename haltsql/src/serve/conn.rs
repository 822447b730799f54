//! The connection layer: accepting, bounding and timing out connections.
//!
//! What a hostile client can hold is bounded here, before any route runs:
//! - **connections** per listener (`limits.max_connections`): at the bound,
//!   the connection that has waited longest for a request head is closed to
//!   make room (a slow or silent client loses its place to a new one; one
//!   that never sent a whole head goes before a kept-alive one); when
//!   every connection is busy with a request, the new one gets a plain
//!   `503` (or, under TLS, is closed) and never costs a task;
//! - **time to send a request head** (`limits.header_read_timeout_seconds`,
//!   HTTP/1; it covers the TLS handshake too, and the wait for the next
//!   request on a kept-alive connection);
//! - **time without progress** (`limits.idle_timeout_seconds`): no byte read
//!   or written either way, whatever the phase (a stalled body, a client
//!   that does not read its answer, a silent HTTP/2 connection);
//! - **requests in flight** (`limits.max_requests_in_flight`, all routes but
//!   `/healthz` and `/readyz`): past it, `503` with `Retry-After: 1` before
//!   the body is read. Bodies are read through a length limit in the route,
//!   so memory stays below in-flight times `limits.max_request_bytes`.
//!
//! The health listener runs the same layer with its own connection bound,
//! so a flood on the API port never starves the probes.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use super::tls::TlsSlot;
use tower::ServiceExt;

use super::identity::PeerIdentity;
use crate::load::LimitsConfig;

/// The plain answer to a connection over the bound (HTTP/1.1, then close).
const OVER_BOUND: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 42\r\n\r\n{\"error\":\"too many connections, retry\"}\r\n";

/// How long writing [`OVER_BOUND`] may take before the socket is dropped.
const OVER_BOUND_WRITE: Duration = Duration::from_secs(1);

/// Most bytes read and dropped from a refused connection before closing.
const OVER_BOUND_DRAIN: usize = 64 * 1024;

/// Refused connections being answered at once; past it they are closed
/// without an answer, so a connection flood cannot pile up tasks.
const MAX_REFUSING: usize = 256;

/// How often the idle watchdog looks at a connection.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// The bounds one listener enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// `None`: requests are not bounded (the health listener).
    pub max_requests_in_flight: Option<usize>,
}

/// Open connections the health listener keeps at most: enough for any
/// number of probes, few enough to cost nothing.
pub const HEALTH_MAX_CONNECTIONS: usize = 64;

impl ConnLimits {
    /// The API listener's bounds from `limits`.
    pub fn api(limits: &LimitsConfig) -> Self {
        ConnLimits {
            header_read_timeout: Duration::from_secs(limits.header_read_timeout_seconds),
            idle_timeout: Duration::from_secs(limits.idle_timeout_seconds),
            max_connections: usize::try_from(limits.max_connections).unwrap_or(usize::MAX),
            max_requests_in_flight: Some(
                usize::try_from(limits.max_requests_in_flight).unwrap_or(usize::MAX),
            ),
        }
    }

    /// The health listener's bounds: the same timeouts, its own small
    /// connection bound, no request bound.
    pub fn health(limits: &LimitsConfig) -> Self {
        ConnLimits {
            max_connections: HEALTH_MAX_CONNECTIONS,
            max_requests_in_flight: None,
            ..Self::api(limits)
        }
    }
}

/// Milliseconds since `origin`, for atomics.
fn millis_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One open connection as the registry sees it.
struct Slot {
    /// Requests of this connection being answered.
    active: AtomicUsize,
    /// When it last started to wait for a request head (ms since origin).
    waiting_since: AtomicU64,
    /// It has sent a whole request head at least once.
    served: AtomicBool,
    /// Closes the connection (evicted to make room).
    kill: Notify,
}

/// The open connections of one listener.
struct Registry {
    origin: Instant,
    max: usize,
    next_id: AtomicU64,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Signalled whenever a connection leaves (for the drain).
    left: Notify,
}

enum Admission {
    Admitted(u64, Arc<Slot>),
    Full,
}

impl Registry {
    fn new(max: usize) -> Self {
        Registry {
            origin: Instant::now(),
            max: max.max(1),
            next_id: AtomicU64::new(0),
            slots: Mutex::new(HashMap::new()),
            left: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        // Every update is one insert or remove: a panic cannot leave it torn.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new connection, evicting the one that has waited longest
    /// for a request head when the listener is full.
    fn admit(&self) -> Admission {
        let mut slots = self.lock();
        if slots.len() >= self.max {
            // A connection that never sent a whole head goes before a
            // kept-alive one that did, the longest waiting first.
            let oldest = slots
                .iter()
                .filter(|(_, s)| s.active.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, s)| {
                    (
                        s.served.load(Ordering::Acquire),
                        s.waiting_since.load(Ordering::Acquire),
                    )
                })
                .map(|(id, _)| *id);
            match oldest.and_then(|id| slots.remove(&id)) {
                Some(evicted) => evicted.kill.notify_one(),
                None => return Admission::Full,
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            active: AtomicUsize::new(0),
            waiting_since: AtomicU64::new(millis_since(self.origin)),
            served: AtomicBool::new(false),
            kill: Notify::new(),
        });
        slots.insert(id, Arc::clone(&slot));
        Admission::Admitted(id, slot)
    }

    fn leave(&self, id: u64) {
        self.lock().remove(&id);
        self.left.notify_waiters();
    }

    fn open(&self) -> usize {
        self.lock().len()
    }
}

/// Counts a request of a connection as active while it lives.
struct Active<'a> {
    slot: &'a Slot,
    origin: Instant,
}

impl<'a> Active<'a> {
    fn new(slot: &'a Slot, origin: Instant) -> Self {
        slot.active.fetch_add(1, Ordering::AcqRel);
        slot.served.store(true, Ordering::Release);
        Active { slot, origin }
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        if self.slot.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.slot
                .waiting_since
                .store(millis_since(self.origin), Ordering::Release);
        }
    }
}

/// An I/O stream that records when bytes last moved.
struct Tracked<S> {
    inner: S,
    last: Arc<AtomicU64>,
    origin: Instant,
}

impl<S> Tracked<S> {
    fn touch(&self) {
        self.last
            .store(millis_since(self.origin), Ordering::Release);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let out = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        out
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let out = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(out, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        out
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let out = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(out, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        out
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Everything the connection tasks of one listener share.
struct Shared {
    router: Router,
    limits: ConnLimits,
    registry: Registry,
    in_flight: Option<Semaphore>,
    tls: Option<TlsSlot>,
    builder: auto::Builder<TokioExecutor>,
}

/// Serves `router` on `listener` (TLS when `tls` is set) within `limits`
/// until `stop` turns true; then stops accepting, lets open requests finish
/// and returns when every connection is closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsSlot>,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let shared = Arc::new(Shared {
        router,
        limits,
        registry: Registry::new(limits.max_connections),
        in_flight: limits.max_requests_in_flight.map(Semaphore::new),
        tls,
        builder,
    });
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|v| *v) => break,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors, mostly: wait instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match shared.registry.admit() {
            Admission::Admitted(id, slot) => {
                let shared = Arc::clone(&shared);
                let stop = stop.clone();
                tokio::spawn(async move {
                    connection(&shared, stream, peer, &slot, stop).await;
                    shared.registry.leave(id);
                });
            }
            Admission::Full => {
                if let Ok(permit) = Arc::clone(&refusing).try_acquire_owned() {
                    tokio::spawn(refuse(stream, shared.tls.is_none(), permit));
                }
            }
        }
    }
    drop(listener);
    // Drain: wait until every connection has closed.
    loop {
        let left = shared.registry.left.notified();
        if shared.registry.open() == 0 {
            return;
        }
        left.await;
    }
}

/// Answers a connection over the bound and closes it. The request the
/// client already sent is read and dropped for a moment after the answer
/// (a lingering close): closing with unread data would reset the
/// connection and could destroy the 503 before the client reads it.
async fn refuse(mut stream: TcpStream, plain: bool, _permit: OwnedSemaphorePermit) {
    if plain {
        let _ = tokio::time::timeout(OVER_BOUND_WRITE, async {
            stream.write_all(OVER_BOUND).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            let mut drained = 0usize;
            while drained < OVER_BOUND_DRAIN {
                match stream.read(&mut sink).await? {
                    0 => break,
                    n => drained += n,
                }
            }
            Ok::<(), io::Error>(())
        })
        .await;
    }
}

async fn connection(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    slot: &Arc<Slot>,
    mut stop: watch::Receiver<bool>,
) {
    let origin = shared.registry.origin;
    let last = Arc::new(AtomicU64::new(millis_since(origin)));
    let io = Tracked {
        inner: stream,
        last: Arc::clone(&last),
        origin,
    };
    match &shared.tls {
        None => drive(shared, TokioIo::new(io), slot, &last, &mut stop, None).await,
        Some(tls) => {
            let acceptor = TlsAcceptor::from(super::tls::current(tls));
            let handshake = tokio::select! {
                h = tokio::time::timeout(shared.limits.header_read_timeout, acceptor.accept(io)) => h,
                () = slot.kill.notified() => return,
            };
            match handshake {
                Ok(Ok(tls)) => {
                    // rustls has verified the chain; only the leaf's names matter.
                    let peer = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| PeerIdentity::from_der(c))
                        .map(Arc::new);
                    drive(shared, TokioIo::new(tls), slot, &last, &mut stop, peer).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
    }
}

/// Serves one connection until it ends, is evicted, idles out or the
/// listener stops (then gracefully: open requests finish).
async fn drive<I>(
    shared: &Arc<Shared>,
    io: TokioIo<I>,
    slot: &Arc<Slot>,
    last: &AtomicU64,
    stop: &mut watch::Receiver<bool>,
    peer: Option<Arc<PeerIdentity>>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let shared = Arc::clone(shared);
        let slot = Arc::clone(slot);
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let shared = Arc::clone(&shared);
            let slot = Arc::clone(&slot);
            if let Some(p) = &peer {
                req.extensions_mut().insert(Arc::clone(p));
            }
            async move { Ok::<_, Infallible>(handle(&shared, &slot, req).await) }
        })
    };
    let conn = shared.builder.serve_connection(io, service);
    tokio::pin!(conn);
    let origin = shared.registry.origin;
    let idle_ms = u64::try_from(shared.limits.idle_timeout.as_millis()).unwrap_or(u64::MAX);
    let head_ms = u64::try_from(shared.limits.header_read_timeout.as_millis()).unwrap_or(u64::MAX);
    let mut check = tokio::time::interval(IDLE_CHECK);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = slot.kill.notified() => return,
            _ = stop.wait_for(|v| *v), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = check.tick() => {
                let now = millis_since(origin);
                let quiet = now.saturating_sub(last.load(Ordering::Acquire));
                if quiet >= idle_ms {
                    tracing::debug!(quiet_ms = quiet, "closing an idle connection");
                    return;
                }
                // hyper times out a started HTTP/1 head itself; this also
                // covers a connection that never sends a byte (the protocol
                // is not even known yet) and an HTTP/2 one with no stream.
                let waiting = now.saturating_sub(slot.waiting_since.load(Ordering::Acquire));
                if slot.active.load(Ordering::Acquire) == 0 && waiting >= head_ms {
                    tracing::debug!(waiting_ms = waiting, "no request head in time");
                    return;
                }
            }
        }
    }
}

/// One request: health routes at once, the rest within the in-flight bound.
async fn handle(shared: &Shared, slot: &Slot, req: Request<Incoming>) -> Response<Body> {
    let _active = Active::new(slot, shared.registry.origin);
    let health = matches!(req.uri().path(), "/healthz" | "/readyz");
    let _permit = match (&shared.in_flight, health) {
        (Some(sem), false) => match sem.try_acquire() {
            Ok(permit) => Some(permit),
            Err(_) => return busy(),
        },
        _ => None,
    };
    match shared.router.clone().oneshot(req.map(Body::new)).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

fn busy() -> Response<Body> {
    let mut resp = Response::new(Body::from(
        "{\"error\":\"too many requests in flight, retry\"}",
    ));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_registry_evicts_the_longest_waiting_idle_connection() {
        let r = Registry::new(2);
        let Admission::Admitted(a, slot_a) = r.admit() else {
            panic!("full")
        };
        std::thread::sleep(Duration::from_millis(5));
        let Admission::Admitted(b, slot_b) = r.admit() else {
            panic!("full")
        };
        // `b` answers a request; then it waits again.
        drop(Active::new(&slot_b, r.origin));
        std::thread::sleep(Duration::from_millis(5));
        // `a` never sent a head and waits longest: it goes.
        let Admission::Admitted(c, slot_c) = r.admit() else {
            panic!("full")
        };
        assert_eq!(r.open(), 2);
        assert!(!r.lock().contains_key(&a));
        drop(slot_a);
        std::thread::sleep(Duration::from_millis(5));
        // `b` waits longer than `c`, but `c` never sent a head: `c` goes.
        let Admission::Admitted(_d, slot_d) = r.admit() else {
            panic!("full")
        };
        assert!(r.lock().contains_key(&b));
        assert!(!r.lock().contains_key(&c));
        drop(slot_c);
        // Busy connections are never evicted: with both busy, refuse.
        let _busy_b = Active::new(&slot_b, r.origin);
        let _busy_d = Active::new(&slot_d, r.origin);
        assert!(matches!(r.admit(), Admission::Full));
    }
}
