//! A TCP proxy on loopback between the operator and the API server. TLS goes
//! through untouched (the API server's certificate names 127.0.0.1); the
//! proxy counts connection attempts (while the API server is down, every
//! request the operator makes is a new connection), and can add latency or
//! cut every open connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Default)]
pub struct Counters {
    /// Connections the operator opened.
    pub accepted: AtomicU64,
    /// Of those, the ones the API server refused.
    pub upstream_failed: AtomicU64,
}

pub struct Proxy {
    pub port: u16,
    pub counters: Arc<Counters>,
    latency_ms: Arc<AtomicU64>,
    cut: watch::Sender<u64>,
    stopped: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: std::net::SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counters = Arc::new(Counters::default());
        let latency_ms = Arc::new(AtomicU64::new(0));
        let (cut, _) = watch::channel(0u64);
        let stopped = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let counters = counters.clone();
            let latency_ms = latency_ms.clone();
            let cut = cut.clone();
            let stopped = stopped.clone();
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    counters.accepted.fetch_add(1, Ordering::SeqCst);
                    let counters = counters.clone();
                    let latency_ms = latency_ms.clone();
                    let cut = cut.subscribe();
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(upstream).await else {
                            counters.upstream_failed.fetch_add(1, Ordering::SeqCst);
                            return;
                        };
                        pipe(client, server, latency_ms, cut).await;
                    });
                }
            }
        });
        Proxy {
            port,
            counters,
            latency_ms,
            cut,
            stopped,
            task,
        }
    }

    pub fn accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// Delay added to every chunk in both directions.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// Closes every connection open right now (new ones go through).
    pub fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.cut_all();
        self.task.abort();
    }
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    latency_ms: Arc<AtomicU64>,
    mut cut: watch::Receiver<u64>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = copy(&mut cr, &mut sw, latency_ms.clone());
    let down = copy(&mut sr, &mut cw, latency_ms);
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cut.changed() => {}
    }
}

async fn copy(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    latency_ms: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let delay = latency_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
