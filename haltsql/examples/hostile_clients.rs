//! Hostile clients for the load test (`make loadtest`, hack/loadtest.sh):
//! slow connections that never finish their request head, a flood of
//! 16 MiB bodies, a health prober, and a memory sampler of the server.
//! Loopback only; bounded by `--seconds` and by the connection counts.
//!
//! Prints one `key value` line per figure on stdout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

const FLOOD_BODY: u64 = 16 * 1024 * 1024;

struct Args {
    api: SocketAddr,
    health: SocketAddr,
    pid: u32,
    token: String,
    slow: usize,
    flood: usize,
    seconds: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut api = None;
    let mut health = None;
    let mut pid = None;
    let mut token = None;
    let mut slow = 2000;
    let mut flood = 16;
    let mut seconds = 20;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--api" => api = Some(value.parse::<SocketAddr>().map_err(|e| bad(&e))?),
            "--health" => health = Some(value.parse::<SocketAddr>().map_err(|e| bad(&e))?),
            "--pid" => pid = Some(value.parse::<u32>().map_err(|e| bad(&e))?),
            "--token" => token = Some(value),
            "--slow" => slow = value.parse().map_err(|e| bad(&e))?,
            "--flood" => flood = value.parse().map_err(|e| bad(&e))?,
            "--seconds" => seconds = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let api = api.ok_or("--api is required")?;
    let health = health.ok_or("--health is required")?;
    for a in [api, health] {
        if !a.ip().is_loopback() {
            return Err(format!("{a} is not a loopback address"));
        }
    }
    if seconds > 300 || slow > 20_000 || flood > 256 {
        return Err("bounds: --seconds <= 300, --slow <= 20000, --flood <= 256".into());
    }
    Ok(Args {
        api,
        health,
        pid: pid.ok_or("--pid is required")?,
        token: token.ok_or("--token is required")?,
        slow,
        flood,
        seconds,
    })
}

#[derive(Default)]
struct Figures {
    slow_opened: AtomicU64,
    slow_refused_503: AtomicU64,
    slow_connect_failed: AtomicU64,
    /// Lifetimes (ms) of slow connections the server closed.
    slow_lifetimes: Mutex<Vec<u64>>,
    flood_requests: AtomicU64,
    flood_413: AtomicU64,
    flood_503: AtomicU64,
    flood_other: AtomicU64,
    flood_bytes_sent: AtomicU64,
    health_ok: AtomicU64,
    health_failed: AtomicU64,
    health_latencies: Mutex<Vec<u64>>,
    rss_peak_kib: AtomicU64,
}

/// Half a request head, then one more header byte every second: a server
/// that only times out silence keeps it forever.
async fn slow_client(api: SocketAddr, until: Instant, f: Arc<Figures>) {
    while Instant::now() < until {
        let Ok(mut s) = TcpStream::connect(api).await else {
            f.slow_connect_failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        f.slow_opened.fetch_add(1, Ordering::Relaxed);
        let opened = Instant::now();
        if s.write_all(b"POST /v1/verify HTTP/1.1\r\nHost: t\r\nX-Slow: ")
            .await
            .is_err()
        {
            continue;
        }
        let mut buf = [0u8; 512];
        let closed_with = loop {
            tokio::select! {
                r = s.read(&mut buf) => break r.map(|n| buf[..n].to_vec()),
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if Instant::now() >= until {
                        return;
                    }
                    if s.write_all(b"a").await.is_err() {
                        break Ok(Vec::new());
                    }
                }
            }
        };
        let lifetime = u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Ok(bytes) = &closed_with
            && bytes.starts_with(b"HTTP/1.1 503")
        {
            f.slow_refused_503.fetch_add(1, Ordering::Relaxed);
        }
        f.slow_lifetimes.lock().await.push(lifetime);
    }
}

/// 16 MiB bodies as fast as the server takes them, announced with a
/// length and chunked in turn.
async fn flood_client(api: SocketAddr, token: String, until: Instant, f: Arc<Figures>) {
    let chunk = vec![b'x'; 64 * 1024];
    let mut chunked = false;
    while Instant::now() < until {
        chunked = !chunked;
        let Ok(mut s) = TcpStream::connect(api).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        f.flood_requests.fetch_add(1, Ordering::Relaxed);
        let head = if chunked {
            format!(
                "POST /v1/verify HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
        } else {
            format!(
                "POST /v1/verify HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nContent-Length: {FLOOD_BODY}\r\n\r\n"
            )
        };
        if s.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let (mut rd, mut wr) = s.into_split();
        let f2 = Arc::clone(&f);
        let chunk2 = chunk.clone();
        let writer = tokio::spawn(async move {
            let mut sent = 0u64;
            while sent < FLOOD_BODY {
                let r = if chunked {
                    let mut framed = format!("{:x}\r\n", chunk2.len()).into_bytes();
                    framed.extend_from_slice(&chunk2);
                    framed.extend_from_slice(b"\r\n");
                    wr.write_all(&framed).await
                } else {
                    wr.write_all(&chunk2).await
                };
                if r.is_err() {
                    break;
                }
                sent += chunk2.len() as u64;
                f2.flood_bytes_sent
                    .fetch_add(chunk2.len() as u64, Ordering::Relaxed);
            }
        });
        let mut buf = [0u8; 256];
        let status = match tokio::time::timeout(Duration::from_secs(30), rd.read(&mut buf)).await {
            Ok(Ok(n)) if n >= 12 => buf[9..12].to_vec(),
            _ => Vec::new(),
        };
        writer.abort();
        match status.as_slice() {
            b"413" => f.flood_413.fetch_add(1, Ordering::Relaxed),
            b"503" => f.flood_503.fetch_add(1, Ordering::Relaxed),
            _ => f.flood_other.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// GET /readyz on the health port every 100 ms.
async fn health_prober(health: SocketAddr, until: Instant, f: Arc<Figures>) {
    while Instant::now() < until {
        let started = Instant::now();
        let ok = tokio::time::timeout(Duration::from_secs(2), async {
            let mut s = TcpStream::connect(health).await.ok()?;
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.ok()?;
            out.starts_with(b"HTTP/1.1 200").then_some(())
        })
        .await;
        if matches!(ok, Ok(Some(()))) {
            f.health_ok.fetch_add(1, Ordering::Relaxed);
            f.health_latencies
                .lock()
                .await
                .push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        } else {
            f.health_failed.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The server's resident memory (VmRSS) every 100 ms; keeps the peak.
async fn memory_sampler(pid: u32, until: Instant, f: Arc<Figures>) {
    while Instant::now() < until {
        if let Ok(status) = tokio::fs::read_to_string(format!("/proc/{pid}/status")).await
            && let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        {
            f.rss_peak_kib.fetch_max(kib, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hostile_clients: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let f = Arc::new(Figures::default());
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for _ in 0..args.slow {
        tasks.push(tokio::spawn(slow_client(args.api, until, Arc::clone(&f))));
    }
    for _ in 0..args.flood {
        tasks.push(tokio::spawn(flood_client(
            args.api,
            args.token.clone(),
            until,
            Arc::clone(&f),
        )));
    }
    tasks.push(tokio::spawn(health_prober(
        args.health,
        until,
        Arc::clone(&f),
    )));
    tasks.push(tokio::spawn(memory_sampler(
        args.pid,
        until,
        Arc::clone(&f),
    )));
    for t in tasks {
        let _ = t.await;
    }
    let mut lifetimes = f.slow_lifetimes.lock().await.clone();
    lifetimes.sort_unstable();
    let mut health = f.health_latencies.lock().await.clone();
    health.sort_unstable();
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!("slow_connections_opened {}", g(&f.slow_opened));
    println!("slow_connections_closed_by_server {}", lifetimes.len());
    println!("slow_connections_refused_503 {}", g(&f.slow_refused_503));
    println!("slow_connect_failures {}", g(&f.slow_connect_failed));
    println!("slow_lifetime_ms_p50 {}", percentile(&lifetimes, 0.5));
    println!("slow_lifetime_ms_p99 {}", percentile(&lifetimes, 0.99));
    println!(
        "slow_lifetime_ms_max {}",
        lifetimes.last().copied().unwrap_or(0)
    );
    println!("flood_requests {}", g(&f.flood_requests));
    println!("flood_413 {}", g(&f.flood_413));
    println!("flood_503 {}", g(&f.flood_503));
    println!("flood_other {}", g(&f.flood_other));
    println!("flood_mib_sent {}", g(&f.flood_bytes_sent) / (1024 * 1024));
    println!("health_readyz_ok {}", g(&f.health_ok));
    println!("health_readyz_failed {}", g(&f.health_failed));
    println!(
        "health_readyz_ms_max {:.1}",
        health.last().copied().unwrap_or(0) as f64 / 1000.0
    );
    println!(
        "server_rss_peak_mib {:.1}",
        g(&f.rss_peak_kib) as f64 / 1024.0
    );
    std::process::ExitCode::SUCCESS
}
