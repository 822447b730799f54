//! The connection layer's bounds on the real `haltsql serve`, on loopback:
//! a slow request head and a stalled body are closed, a listener over its
//! connection bound makes room or answers 503, requests over the in-flight
//! bound get 503 while the health routes still answer, and a body over the
//! limit is refused while it streams. The timeouts are set to 1-2 s; the
//! waits below only bound how long a broken server may hang the test.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

const TOKEN: &str = "limits-test-token";
/// Longest a test waits for something the server must do within 1-2 s.
const PATIENCE: Duration = Duration::from_secs(20);

const POLICY: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: p
dialect: postgres
tables:
  app.orders:
    columns: [id]
";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Server {
    child: Child,
    api: SocketAddr,
    health: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(limits: &str) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let health: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
        let hash = hex::encode(Sha256::digest(TOKEN.as_bytes()));
        std::fs::write(
            dir.path().join("config.yaml"),
            format!(
                "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: {api}\n  health_listen: {health}\n  auth:\n    tokens: [{{name: t, policy: p, sha256: {hash}}}]\npolicies: [{{file: policy.yaml}}]\naudit:\n  sinks: [{{type: file, path: {}}}]\nlimits:\n{limits}",
                dir.path().join("audit.log").display()
            ),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_haltsql"))
            .args(["serve", "--config"])
            .arg(dir.path().join("config.yaml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            api,
            health,
            _dir: dir,
        };
        let deadline = Instant::now() + PATIENCE;
        while get(server.health, "/readyz").0 != 200 {
            assert!(Instant::now() < deadline, "haltsql serve did not get ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Reads until the server closes; returns what it sent and how long it
/// took. Panics if the server keeps the connection open past PATIENCE.
fn read_until_closed(s: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "the server kept the connection open ({e}) after {:?}; got {:?}",
                started.elapsed(),
                String::from_utf8_lossy(&out)
            ),
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        started.elapsed(),
    )
}

/// One request on a fresh connection (`Connection: close`); status and body.
fn request(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    let mut s = connect(addr);
    // A server that answers early (503, 413) may close before the whole
    // request is written: what it answered is still there to read.
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body));
    let (text, _) = read_until_closed(&mut s);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    match TcpStream::connect(addr) {
        Err(_) => (0, String::new()),
        Ok(_) => request(
            addr,
            &format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
            b"",
        ),
    }
}

fn verify(addr: SocketAddr) -> (u16, String) {
    let body = br#"{"sql": "SELECT id FROM app.orders"}"#;
    request(
        addr,
        &format!(
            "POST /v1/verify HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ),
        body,
    )
}

/// A verify request whose body never completes, returned once the server
/// reads that body (its `100 Continue` came): from then on the connection
/// is busy in a request, however loaded the machine is.
fn stalled_verify(addr: SocketAddr) -> TcpStream {
    let mut s = connect(addr);
    s.write_all(
        format!(
            "POST /v1/verify HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 500\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut interim = Vec::new();
    let mut byte = [0u8; 1];
    while !interim.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).unwrap(),
            1,
            "closed before 100 Continue: {:?}",
            String::from_utf8_lossy(&interim)
        );
        interim.push(byte[0]);
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100 "),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    s.write_all(b"{\"sql\": ").unwrap();
    s
}

#[test]
fn a_slow_request_head_is_closed_after_the_header_timeout() {
    let server = Server::start("  header_read_timeout_seconds: 1\n  idle_timeout_seconds: 30\n");
    let opened = Instant::now();
    // Half a head, then nothing.
    let mut slow = connect(server.api);
    slow.write_all(b"POST /v1/verify HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    // A silent connection too (the protocol is not even known).
    let mut silent = connect(server.api);
    let (text, _) = read_until_closed(&mut slow);
    assert!(!text.contains(" 200 "), "{text}");
    read_until_closed(&mut silent);
    let lived = opened.elapsed();
    assert!(lived >= Duration::from_millis(900), "{lived:?}");
    assert_eq!(verify(server.api).0, 200);
}

#[test]
fn a_stalled_body_is_closed_after_the_idle_timeout() {
    let server = Server::start("  header_read_timeout_seconds: 30\n  idle_timeout_seconds: 2\n");
    let mut stalled = stalled_verify(server.api);
    let (text, after) = read_until_closed(&mut stalled);
    assert!(after >= Duration::from_millis(1500), "{after:?}");
    assert!(!text.contains(" 200 "), "{text}");
    assert_eq!(verify(server.api).0, 200);
}

#[test]
fn over_the_connection_bound_the_longest_waiting_goes_or_the_new_one_gets_503() {
    let server = Server::start("  max_connections: 2\n  header_read_timeout_seconds: 60\n");
    // Two connections waiting for a head fill the listener ...
    let mut first = connect(server.api);
    std::thread::sleep(Duration::from_millis(100));
    let _second = connect(server.api);
    std::thread::sleep(Duration::from_millis(100));
    // ... a well-behaved client still gets its answer: the longest waiting
    // connection is closed to make room.
    assert_eq!(verify(server.api).0, 200);
    let (text, _) = read_until_closed(&mut first);
    assert_eq!(text, "");

    // With every connection busy in a request, a new one gets 503 and close.
    let _busy = [stalled_verify(server.api), stalled_verify(server.api)];
    let (status, text) = verify(server.api);
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("too many connections"), "{text}");
    // The health listener has its own bound.
    assert_eq!(get(server.health, "/readyz").0, 200);
}

#[test]
fn over_the_in_flight_bound_verify_gets_503_and_health_still_answers() {
    let server = Server::start("  max_requests_in_flight: 1\n");
    let held = stalled_verify(server.api);
    let (status, text) = verify(server.api);
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("Retry-After: 1") || text.contains("retry-after: 1"),
        "{text}"
    );
    assert!(text.contains("too many requests in flight"), "{text}");
    assert_eq!(get(server.api, "/readyz").0, 200);
    assert_eq!(get(server.api, "/healthz").0, 200);
    assert_eq!(get(server.health, "/readyz").0, 200);
    drop(held);
    let deadline = Instant::now() + PATIENCE;
    while verify(server.api).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the in-flight slot was not freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_oversized_body_is_refused_while_it_streams() {
    let server = Server::start("  max_request_bytes: 1024\n");
    // Announced too large: refused before any body byte.
    let (status, _) = request(
        server.api,
        &format!(
            "POST /v1/verify HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            16 * 1024 * 1024
        ),
        b"",
    );
    assert_eq!(status, 413);

    // Chunked, no length: refused once 1024 bytes have arrived, while the
    // client is still sending (the last chunk is never sent).
    let mut s = connect(server.api);
    s.write_all(
        format!(
            "POST /v1/verify HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let chunk = format!("400\r\n{}\r\n", "x".repeat(1024));
    for _ in 0..2 {
        s.write_all(chunk.as_bytes()).unwrap();
    }
    let (text, _) = read_until_closed(&mut s);
    assert!(text.starts_with("HTTP/1.1 413 "), "{text}");
    assert!(text.contains("larger than 1024 bytes"), "{text}");
}

#[test]
fn the_limits_have_defaults_and_ranges() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\npolicies: [{file: policy.yaml}]\nlimits:\n  header_read_timeout_seconds: 0\n  idle_timeout_seconds: 3601\n  max_connections: 0\n  max_requests_in_flight: x\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_haltsql"))
        .current_dir(dir.path())
        .args(["validate", "config.yaml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "config.yaml:7:32: limits.header_read_timeout_seconds: out of range, expected 1 to 300\n\
         config.yaml:8:25: limits.idle_timeout_seconds: out of range, expected 1 to 3600\n\
         config.yaml:9:20: limits.max_connections: out of range, expected 1 to 100000\n\
         config.yaml:10:27: limits.max_requests_in_flight: expected an integer, found a string\n"
    );
    let cfg = haltsql::load::load_config(&{
        std::fs::write(
            dir.path().join("plain.yaml"),
            "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\npolicies: [{file: policy.yaml}]\n",
        )
        .unwrap();
        dir.path().join("plain.yaml")
    })
    .unwrap();
    assert_eq!(cfg.limits, haltsql::load::LimitsConfig::default());
    assert_eq!(cfg.limits.header_read_timeout_seconds, 10);
    assert_eq!(cfg.limits.idle_timeout_seconds, 60);
    assert_eq!(cfg.limits.max_connections, 1024);
    assert_eq!(cfg.limits.max_requests_in_flight, 256);
}
