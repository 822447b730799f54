//! Verify API benchmark on loopback.
//!
//! Starts the server in-process (the same config loading, router, verify
//! pool and audit file sink as `haltsql serve`) on 127.0.0.1, then drives it
//! with keep-alive HTTP/1.1 connections: 1 and 2 connections per core, for a
//! typical allowed and a typical denied query. Prints requests per second
//! and latency percentiles.
//!
//! ```text
//! cargo run --release -p haltsql --example verify_bench [SECONDS_PER_RUN]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;

use haltsql::engine::{Policy, Rules};

/// The allocator of the `haltsql` binary (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TOKEN: &str = "bench-token";
const ALLOWED: &str = "SELECT id, status, total_cents FROM orders WHERE status = 'paid' AND total_cents > 1000 ORDER BY id DESC LIMIT 50";
const DENIED: &str = "SELECT id, email FROM orders WHERE status = 'paid' ORDER BY id DESC LIMIT 50";

type Error = Box<dyn std::error::Error + Send + Sync>;

fn write_pod(dir: &std::path::Path) -> Result<std::path::PathBuf, Error> {
    let hash = hex::encode(Sha256::digest(TOKEN.as_bytes()));
    std::fs::write(dir.join("token.sha256"), format!("{hash}\n"))?;
    std::fs::write(
        dir.join("policy.yaml"),
        "apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders-agent
search_path: [app]
statements:
  allow: [select]
require_limit:
  max: 100
tables:
  app.orders:
    columns: [id, status, total_cents]
",
    )?;
    let config = format!(
        "apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: 127.0.0.1:0
  auth:
    tokens:
      - name: bench
        policy: orders-agent
        sha256: ${{file:{}}}
policies:
  - file: policy.yaml
audit:
  sinks: [{{type: file, path: {}}}]
",
        dir.join("token.sha256").display(),
        dir.join("audit.log").display()
    );
    let path = dir.join("config.yaml");
    std::fs::write(&path, config)?;
    Ok(path)
}

struct Run {
    requests: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

async fn client(
    addr: std::net::SocketAddr,
    body: Bytes,
    warmup_until: Instant,
    until: Instant,
) -> Result<Vec<Duration>, Error> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut lat = Vec::with_capacity(100_000);
    loop {
        let start = Instant::now();
        if start >= until {
            break;
        }
        let req = Request::post("/v1/verify")
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))?;
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        if status != 200 || bytes.is_empty() {
            return Err(format!("unexpected response {status}").into());
        }
        if start >= warmup_until {
            lat.push(start.elapsed());
        }
    }
    Ok(lat)
}

async fn run(
    addr: std::net::SocketAddr,
    sql: &str,
    connections: usize,
    seconds: f64,
) -> Result<Run, Error> {
    let body = Bytes::from(serde_json::json!({ "sql": sql }).to_string());
    let warmup = Duration::from_millis(500);
    let measure = Duration::from_secs_f64(seconds);
    let t0 = Instant::now();
    let warmup_until = t0 + warmup;
    let until = warmup_until + measure;
    let mut tasks = Vec::new();
    for _ in 0..connections {
        tasks.push(tokio::spawn(client(
            addr,
            body.clone(),
            warmup_until,
            until,
        )));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    Ok(Run {
        requests: latencies.len() as u64,
        elapsed: measure,
        latencies,
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn engine_only(sql: &str, policy: &Policy) -> Duration {
    let n = 2000u32;
    // verify() spawns its big-stack thread per call; measure the whole call.
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(haltsql::engine::verify(policy, sql));
    }
    start.elapsed() / n
}

fn main() -> Result<(), Error> {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let dir = tempfile::tempdir()?;
    let config_path = write_pod(dir.path())?;
    let config = haltsql::load::load_config(&config_path).map_err(|errs| {
        errs.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let policy = Policy::new(&Rules::from(&config.policies[0]));
    let state = Arc::new(haltsql::serve::build_state(&config)?);

    // As `haltsql serve` builds its runtime: the engine's stack, so small
    // inputs are verified on the runtime's threads.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("bench-server")
        .thread_stack_size(haltsql::engine::ENGINE_STACK_BYTES)
        .on_thread_start(haltsql::engine::mark_engine_stack)
        .enable_all()
        .build()?;
    let listener = server_rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let router = haltsql::serve::app::api_router(Arc::clone(&state));
    server_rt.spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("bench-client")
        .enable_all()
        .build()?;

    println!(
        "haltsql verify benchmark: POST /v1/verify on {addr} (HTTP/1.1 keep-alive, bearer token, audit to a file)"
    );
    println!(
        "cores: {cores}; {seconds} s per run after 0.5 s warm-up; server and clients share the machine"
    );
    println!("allowed: {ALLOWED}");
    println!("denied:  {DENIED}");
    println!();
    println!(
        "{:<8} {:>11} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "query", "connections", "requests", "req/s", "p50 ms", "p99 ms", "max ms"
    );
    for (label, sql) in [("allowed", ALLOWED), ("denied", DENIED)] {
        for per_core in [1, 2] {
            let conns = per_core * cores;
            let mut r = client_rt.block_on(run(addr, sql, conns, seconds))?;
            r.latencies.sort_unstable();
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            println!(
                "{:<8} {:>11} {:>9} {:>10.0} {:>10.3} {:>10.3} {:>10.3}",
                label,
                format!("{conns} ({per_core}/core)"),
                r.requests,
                r.requests as f64 / r.elapsed.as_secs_f64(),
                ms(percentile(&r.latencies, 0.50)),
                ms(percentile(&r.latencies, 0.99)),
                ms(percentile(&r.latencies, 1.0)),
            );
        }
    }
    println!();
    for (label, sql) in [("allowed", ALLOWED), ("denied", DENIED)] {
        let d = haltsql::engine::verify(&policy, sql);
        println!(
            "engine only ({label}, allowed={}): {:.1} µs per verify (incl. a fresh verify thread)",
            d.allowed,
            engine_only(sql, &policy).as_secs_f64() * 1e6
        );
    }
    let audit_lines = std::fs::read_to_string(dir.path().join("audit.log"))
        .map(|s| s.lines().count())
        .unwrap_or(0);
    println!("audit events written: {audit_lines}");
    Ok(())
}
