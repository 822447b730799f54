//! The remote audit sinks end to end: the real `haltsql serve` sends its
//! audit events to real peers on loopback, installed by
//! `hack/install-peers.sh` into `bin/`: s3s-fs (S3), fake-gcs-server (GCS),
//! an OpenSearch node (the `_bulk` API) and an Apache Kafka broker (KRaft,
//! plaintext and SASL over TLS). A missing peer fails the test (it never
//! skips).
//!
//! Each test reads back what arrived at its peer and compares it, line by
//! line, with the same events written by a `file` sink of the same server:
//! the events are the chain's exact lines, each batch is a contiguous run,
//! and the links between batches hold. Then it stops the peer, shows that
//! verify requests are still answered while events are dropped and counted
//! (the queue holds `QUEUE` events), starts the peer again and shows that
//! delivery resumes and that what was dropped is exactly the gap in the
//! chain.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

#[path = "common/kit.rs"]
mod kit;

use kit::{
    Pki, Proc, free_port, http, pki, run, serve_proc, sha256_hex, start_s3s, tool, wait_port,
    wait_ready, wait_until, write,
};

const TOKEN: &str = "audit-agent-token";
const SQL: &str = "SELECT id FROM app.orders LIMIT 1";
/// `audit.delivery` of the tests: small, so that an outage fills the queue.
const QUEUE: usize = 50;
const BATCH: usize = 10;
const FLUSH_MS: u64 = 200;
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn json_get(addr: SocketAddr, path: &str) -> Value {
    let (status, body) =
        http(addr, "GET", path, "", b"").unwrap_or_else(|| panic!("GET {path}: no answer"));
    assert_eq!(
        status,
        200,
        "GET {path}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

// ---- haltsql serve ----

struct Serve {
    proc: Proc,
    api: SocketAddr,
    health: SocketAddr,
    audit_file: PathBuf,
}

/// Starts `haltsql serve` with a `file` sink (`audit.sinks[0]`, the
/// reference copy of the chain) and `sinks` (YAML list items, each starting
/// with `  - `), so the remote sinks are `audit.sinks[1]` and on.
fn serve(dir: &Path, sinks: &str, flush_ms: u64, env: &[(&str, &str)]) -> Serve {
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let health: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let hash = sha256_hex(TOKEN.as_bytes());
    let audit_file = dir.join("audit.jsonl");
    write(
        &dir.join("policy.yaml"),
        "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: orders\nsearch_path: [app]\ntables:\n  app.orders:\n    columns: [id]\n",
    );
    let config = format!(
        "apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: {api}
  health_listen: {health}
  auth:
    tokens:
      - name: agent
        policy: orders
        sha256: {hash}
policies:
  - file: policy.yaml
logging: {{level: info, format: text}}
audit:
  delivery: {{queue_events: {QUEUE}, batch_events: {BATCH}, flush_interval_ms: {flush_ms}}}
  sinks:
  - {{type: file, path: {}}}
{sinks}",
        audit_file.display()
    );
    let path = dir.join("config.yaml");
    write(&path, &config);
    let proc = serve_proc(&path, &dir.join("serve.log"), env);
    let mut s = Serve {
        proc,
        api,
        health,
        audit_file,
    };
    s.wait_ready();
    s
}

impl Serve {
    /// Waits until `f` holds; on a timeout, fails with the metrics and log.
    fn wait(&self, what: &str, secs: u64, f: impl Fn(&Serve) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !f(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}\n{}\n{}",
                self.metrics(),
                self.proc.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn metrics(&self) -> String {
        http(self.health, "GET", "/metrics", "", b"").map_or_else(String::new, |(_, b)| {
            String::from_utf8_lossy(&b).into_owned()
        })
    }

    fn metric(&self, name: &str, sink: usize, extra: &str) -> f64 {
        let prefix = format!("{name}{{sink=\"audit.sinks[{sink}]\"");
        let m = self.metrics();
        m.lines()
            .filter(|l| l.starts_with(&prefix) && l.contains(extra))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    fn sent(&self, sink: usize) -> usize {
        self.metric("haltsql_audit_events_sent_total", sink, "") as usize
    }

    fn dropped(&self, sink: usize) -> usize {
        self.metric("haltsql_audit_events_dropped_total", sink, "") as usize
    }

    fn queued(&self, sink: usize) -> usize {
        self.metric("haltsql_audit_queue_events", sink, "") as usize
    }

    fn wait_ready(&mut self) {
        wait_ready(&mut self.proc, self.health);
    }

    /// Sends `n` verify requests; each must be answered 200. Returns the
    /// slowest answer.
    fn verify(&self, n: usize) -> Duration {
        let body = serde_json::json!({ "sql": SQL }).to_string();
        let auth = format!("Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n");
        let mut slowest = Duration::ZERO;
        for _ in 0..n {
            let t = Instant::now();
            let r = http(self.api, "POST", "/v1/verify", &auth, body.as_bytes());
            slowest = slowest.max(t.elapsed());
            assert_eq!(
                r.as_ref().map(|r| r.0),
                Some(200),
                "{r:?}\n{}",
                self.proc.log()
            );
        }
        slowest
    }

    /// The reference chain: the file sink's lines.
    fn chain(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.audit_file).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        assert_eq!(haltsql::audit::verify_chain(&lines), Ok(()));
        lines
    }
}

fn seq_of(line: &str) -> u64 {
    serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v["seq"].as_u64())
        .unwrap_or_else(|| panic!("not an audit event: {line}"))
}

/// Checks delivered lines against the reference chain the way a reader
/// checks a sink's content: every line is an event of the chain, byte for
/// byte (so it hashes to the next event's `prev`); where two consecutive
/// `seq` were delivered, the later one's `prev` is the hash of the earlier
/// line; seq 1 links to the genesis. Repeated deliveries of one event
/// (allowed for Kafka) must be identical. Returns the delivered `seq`s.
fn check_delivered(what: &str, chain: &[String], got: &[String]) -> Vec<u64> {
    let mut by_seq: BTreeMap<u64, &String> = BTreeMap::new();
    for line in got {
        let seq = seq_of(line);
        let idx = usize::try_from(seq).unwrap_or(usize::MAX) - 1;
        assert!(idx < chain.len(), "{what}: seq {seq} was never written");
        assert_eq!(
            line, &chain[idx],
            "{what}: seq {seq} differs from the chain"
        );
        if let Some(prev) = by_seq.insert(seq, line) {
            assert_eq!(prev, line, "{what}: seq {seq} delivered twice, differently");
        }
    }
    let mut last: Option<(u64, &String)> = None;
    for (&seq, line) in &by_seq {
        let prev = serde_json::from_str::<Value>(line).unwrap()["prev"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if seq == 1 {
            assert_eq!(prev, GENESIS, "{what}: seq 1 does not start the chain");
        }
        if let Some((ls, ll)) = last
            && ls + 1 == seq
        {
            assert_eq!(
                prev,
                sha256_hex(ll.as_bytes()),
                "{what}: link {ls} -> {seq} broken"
            );
        }
        last = Some((seq, line));
    }
    by_seq.into_keys().collect()
}

/// Checks that each object (one batch) is a contiguous run of the chain and
/// that sorting the object names sorts the batches by `seq`.
fn check_batches(what: &str, objects: &[(String, String)]) -> Vec<String> {
    let mut names: Vec<&(String, String)> = objects.iter().collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let mut lines = Vec::new();
    let mut last_seq = 0;
    for (name, body) in names {
        assert!(
            body.ends_with('\n'),
            "{what}: {name} is not newline-terminated"
        );
        let batch: Vec<&str> = body.lines().collect();
        assert!(
            !batch.is_empty() && batch.len() <= BATCH,
            "{what}: {name} has {} events",
            batch.len()
        );
        let seqs: Vec<u64> = batch.iter().map(|l| seq_of(l)).collect();
        for w in seqs.windows(2) {
            assert_eq!(w[0] + 1, w[1], "{what}: {name} is not contiguous: {seqs:?}");
        }
        for w in batch.windows(2) {
            let prev = serde_json::from_str::<Value>(w[1]).unwrap()["prev"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            assert_eq!(
                prev,
                sha256_hex(w[0].as_bytes()),
                "{what}: {name}: link broken"
            );
        }
        assert!(
            seqs[0] > last_seq,
            "{what}: {name} sorts before an earlier batch"
        );
        assert!(
            name.ends_with(&format!(
                "-{:012}-{:012}.ndjson",
                seqs[0],
                seqs[seqs.len() - 1]
            )),
            "{what}: {name} does not name its seq range"
        );
        last_seq = seqs[seqs.len() - 1];
        lines.extend(batch.iter().map(|l| (*l).to_string()));
    }
    lines
}

/// The scenario every sink goes through. `sinks` are the remote sinks'
/// indices in `audit.sinks`; `read(i)` returns what sink `i`'s peer holds.
fn outage_and_recovery(
    s: &Serve,
    sinks: &[usize],
    read: &dyn Fn(usize) -> Vec<String>,
    stop_peer: &mut dyn FnMut(),
    start_peer: &mut dyn FnMut(),
) {
    // 1. Everything arrives, in batches.
    let t = Instant::now();
    s.verify(25);
    for &i in sinks {
        s.wait(&format!("sink {i}: 25 events sent"), 60, |s| {
            s.sent(i) >= 25
        });
        assert_eq!(s.sent(i), 25, "{}", s.metrics());
        let batches = s.metric("haltsql_audit_batches_sent_total", i, "") as usize;
        assert!(
            batches >= 3,
            "sink {i}: 25 events in {batches} batches of at most {BATCH}"
        );
    }
    let chain = s.chain();
    assert_eq!(chain.len(), 25);
    for &i in sinks {
        let got = check_delivered(&format!("sink {i}"), &chain, &read(i));
        assert_eq!(got, (1..=25).collect::<Vec<u64>>(), "sink {i}");
    }

    eprintln!("delivered: {:?}", t.elapsed());
    // 2. The peer is down: verify answers keep coming, events are dropped
    // once the queue is full, and counted.
    stop_peer();
    let slowest = s.verify(100);
    eprintln!("100 verify requests with the peer down: slowest answer {slowest:?}");
    for &i in sinks {
        s.wait(&format!("sink {i}: a failed send counted"), 30, |s| {
            s.metric("haltsql_audit_send_failures_total", i, "") >= 1.0
        });
        let dropped = s.metric(
            "haltsql_audit_events_dropped_total",
            i,
            "reason=\"queue_full\"",
        ) as usize;
        // At most QUEUE events wait, plus one batch being retried.
        assert!(
            dropped >= 100 - QUEUE - BATCH,
            "sink {i}: {dropped} dropped\n{}",
            s.metrics()
        );
        assert_eq!(s.sent(i), 25, "sink {i} sent while its peer was down");
    }

    eprintln!("outage checked: {:?}", t.elapsed());
    // 3. The peer is back: what was queued is delivered, and new events too.
    start_peer();
    eprintln!("peer back: {:?}", t.elapsed());
    for &i in sinks {
        s.wait(&format!("sink {i}: the queue delivered"), 90, |s| {
            s.queued(i) == 0 && s.sent(i) + s.dropped(i) == 125
        });
    }
    eprintln!("queue delivered: {:?}", t.elapsed());
    s.verify(10);
    for &i in sinks {
        s.wait(&format!("sink {i}: new events after the outage"), 60, |s| {
            s.sent(i) + s.dropped(i) == 135 && s.queued(i) == 0
        });
    }
    eprintln!("new events delivered: {:?}", t.elapsed());
    let chain = s.chain();
    assert_eq!(chain.len(), 135);
    for &i in sinks {
        let got = check_delivered(&format!("sink {i}"), &chain, &read(i));
        let dropped = s.dropped(i);
        assert_eq!(
            got.len(),
            135 - dropped,
            "sink {i}: delivered plus dropped is not everything"
        );
        // The queue filled before anything was dropped, and the newest
        // events of the outage were the ones dropped: the chain arrived as
        // 1..=K and 126..=135, with one gap.
        let k = 135 - dropped - 10;
        assert!(k >= 25 + QUEUE, "sink {i}: only {k} events before the gap");
        let expected: Vec<u64> = (1..=k as u64).chain(126..=135).collect();
        assert_eq!(got, expected, "sink {i}");
        eprintln!(
            "sink {i}: {} events delivered, {dropped} dropped during the outage",
            got.len()
        );
    }
}

// ---- S3 (s3s-fs) ----

const S3_KEY: &str = "haltsql-audit-key";
const S3_SECRET: &str = "haltsql-audit-secret-0123456789";

/// The objects under `bucket/prefix` in the s3s-fs folder.
fn s3_objects(dir: &Path, bucket: &str, prefix: &str) -> Vec<(String, String)> {
    let root = dir.join("s3").join(bucket);
    let mut out = Vec::new();
    let base = root.join(prefix);
    for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".ndjson") {
            let body = std::fs::read_to_string(e.path()).unwrap_or_default();
            out.push((format!("{prefix}{name}"), body));
        }
    }
    out
}

#[test]
fn s3_sink_batches_survives_an_outage_and_flushes_at_shutdown() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("s3/audit")).unwrap();
    let port = free_port();
    let s3 = Arc::new(Mutex::new(Some(start_s3s(dir, port, S3_KEY, S3_SECRET))));
    let sink = format!(
        "  - type: s3\n    bucket: audit\n    prefix: haltsql/\n    region: us-east-1\n    endpoint: http://127.0.0.1:{port}\n    credentials: {{source: static, access_key_id: {S3_KEY}, secret_access_key: {S3_SECRET}}}\n"
    );
    let d1 = dir.join("serve");
    std::fs::create_dir_all(&d1).unwrap();
    let s = serve(&d1, &sink, FLUSH_MS, &[]);
    let read = |_| check_batches("s3", &s3_objects(dir, "audit", "haltsql/"));
    let mut stop = || {
        if let Some(mut p) = s3.lock().unwrap().take() {
            p.stop();
        }
    };
    let mut start = || *s3.lock().unwrap() = Some(start_s3s(dir, port, S3_KEY, S3_SECRET));
    outage_and_recovery(&s, &[1], &read, &mut stop, &mut start);

    // SIGTERM sends what is queued: with a one-minute flush interval,
    // three events wait in the queue until the shutdown sends them.
    let d2 = dir.join("shutdown");
    std::fs::create_dir_all(&d2).unwrap();
    let sink2 = sink.replace("prefix: haltsql/", "prefix: shutdown/");
    let mut s2 = serve(&d2, &sink2, 60_000, &[]);
    s2.verify(3);
    assert_eq!(s2.sent(1), 0, "sent before the shutdown: {}", s2.metrics());
    assert_eq!(s2.proc.terminate(), Some(0), "{}", s2.proc.log());
    let objects = s3_objects(dir, "audit", "shutdown/");
    let lines = check_batches("s3 shutdown", &objects);
    let chain = s2.chain();
    assert_eq!(
        check_delivered("s3 shutdown", &chain, &lines),
        vec![1, 2, 3]
    );

    // A wrong secret is refused by the server: the batch is dropped as
    // rejected (403 is final), counted, and verify answers still come.
    let d3 = dir.join("wrong");
    std::fs::create_dir_all(&d3).unwrap();
    let sink3 = sink
        .replace("prefix: haltsql/", "prefix: wrong/")
        .replace(S3_SECRET, "not-the-secret");
    let s3b = serve(&d3, &sink3, FLUSH_MS, &[]);
    s3b.verify(5);
    s3b.wait("rejected events counted", 30, |s| {
        s.metric(
            "haltsql_audit_events_dropped_total",
            1,
            "reason=\"rejected\"",
        ) >= 5.0
    });
    assert!(s3_objects(dir, "audit", "wrong/").is_empty());
    assert!(s3b.proc.log().contains("HTTP 403"), "{}", s3b.proc.log());
}

// ---- GCS (fake-gcs-server) and a token endpoint ----

/// A token endpoint (RFC 7523 JWT bearer grant) on loopback that checks the
/// assertion's RS256 signature with the service account's public key and
/// its claims, and counts the exchanges it accepted and refused.
struct TokenServer {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

fn token_server(public_der: Vec<u8>, email: String) -> TokenServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let (a, r) = (Arc::clone(&accepted), Arc::clone(&refused));
    let uri = format!("http://{addr}/token");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let ok = check_token_request(&conn, &public_der, &email, &uri);
            let (status, body) = if ok {
                a.fetch_add(1, Ordering::SeqCst);
                (
                    "200 OK",
                    r#"{"access_token":"test-access-token","expires_in":3600,"token_type":"Bearer"}"#,
                )
            } else {
                r.fetch_add(1, Ordering::SeqCst);
                ("400 Bad Request", r#"{"error":"invalid_grant"}"#)
            };
            let mut c = &conn;
            let _ = write!(
                c,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    TokenServer {
        addr,
        accepted,
        refused,
    }
}

fn check_token_request(conn: &TcpStream, public_der: &[u8], email: &str, uri: &str) -> bool {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut r = BufReader::new(conn);
    let mut len = 0usize;
    let mut line = String::new();
    let mut first = true;
    let mut post_token = false;
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        if first {
            post_token = line.starts_with("POST /token ");
            first = false;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; len];
    if r.read_exact(&mut body).is_err() || !post_token {
        return false;
    }
    let form: BTreeMap<String, String> = String::from_utf8_lossy(&body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect();
    if form.get("grant_type").map(String::as_str)
        != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        return false;
    }
    let Some(jwt) = form.get("assertion") else {
        return false;
    };
    let parts: Vec<&str> = jwt.split('.').collect();
    if parts.len() != 3 {
        return false;
    }
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (Ok(header), Ok(claims), Ok(sig)) = (
        b64.decode(parts[0]),
        b64.decode(parts[1]),
        b64.decode(parts[2]),
    ) else {
        return false;
    };
    let key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        public_der,
    );
    if key
        .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
        .is_err()
    {
        return false;
    }
    let h: Value = serde_json::from_slice(&header).unwrap_or_default();
    let c: Value = serde_json::from_slice(&claims).unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    h["alg"] == "RS256"
        && c["iss"] == email
        && c["aud"] == uri
        && c["scope"] == "https://www.googleapis.com/auth/devstorage.read_write"
        && c["iat"].as_u64().is_some_and(|t| t.abs_diff(now) < 300)
        && c["exp"].as_u64().is_some_and(|t| t > now)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = s
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn start_fake_gcs(dir: &Path, port: u16) -> Proc {
    let mut p = Proc::start(
        Command::new(tool("fake-gcs-server"))
            .args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
            ])
            .args(["-public-host", &format!("127.0.0.1:{port}")])
            .args(["-backend", "filesystem", "-filesystem-root"])
            .arg(dir.join("gcs-root"))
            .arg("-data")
            .arg(dir.join("gcs-data")),
        &dir.join("fake-gcs.log"),
    );
    wait_port(port, &mut p, "fake-gcs-server", 30);
    p
}

/// The objects under `prefix`, listed and read through the GCS JSON API.
fn gcs_objects(addr: SocketAddr, bucket: &str, prefix: &str) -> Vec<(String, String)> {
    let list = json_get(addr, &format!("/storage/v1/b/{bucket}/o?prefix={prefix}"));
    let mut out = Vec::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let name = item["name"].as_str().unwrap_or_default().to_string();
        let enc: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let (status, body) = http(
            addr,
            "GET",
            &format!("/storage/v1/b/{bucket}/o/{enc}?alt=media"),
            "",
            b"",
        )
        .unwrap_or_else(|| panic!("GET {name}: no answer"));
        assert_eq!(status, 200, "GET {name}");
        out.push((name, String::from_utf8_lossy(&body).into_owned()));
    }
    out
}

#[test]
fn gcs_sink_with_a_service_account_key_survives_an_outage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let openssl = tool("openssl");
    let key = dir.join("sa.key");
    run(Command::new(&openssl)
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key));
    let public = dir.join("sa.pub.der");
    run(Command::new(&openssl)
        .args(["rsa", "-RSAPublicKey_out", "-outform", "DER", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public));
    let email = "haltsql-audit@test-project.iam.gserviceaccount.com".to_string();
    let tokens = token_server(std::fs::read(&public).unwrap(), email.clone());
    let sa = serde_json::json!({
        "type": "service_account",
        "project_id": "test-project",
        "private_key_id": "k1",
        "private_key": std::fs::read_to_string(&key).unwrap(),
        "client_email": email,
        "token_uri": format!("http://{}/token", tokens.addr),
    });
    let sa_file = dir.join("sa.json");
    write(&sa_file, sa.to_string());
    // The bucket exists from the start: fake-gcs-server loads -data at start-up.
    std::fs::create_dir_all(dir.join("gcs-data/audit")).unwrap();

    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let gcs = Arc::new(Mutex::new(Some(start_fake_gcs(dir, port))));
    let emulator = format!("http://127.0.0.1:{port}");
    let sink = format!(
        "  - type: gcs\n    bucket: audit\n    prefix: haltsql/\n    credentials_file: {}\n",
        sa_file.display()
    );
    let d1 = dir.join("serve");
    std::fs::create_dir_all(&d1).unwrap();
    let s = serve(
        &d1,
        &sink,
        FLUSH_MS,
        &[("STORAGE_EMULATOR_HOST", &emulator)],
    );
    let read = |_| check_batches("gcs", &gcs_objects(addr, "audit", "haltsql/"));
    let mut stop = || {
        if let Some(mut p) = gcs.lock().unwrap().take() {
            p.stop();
        }
    };
    let mut start = || *gcs.lock().unwrap() = Some(start_fake_gcs(dir, port));
    outage_and_recovery(&s, &[1], &read, &mut stop, &mut start);
    // One token served every upload (it is cached for its lifetime), and
    // every assertion the sink signed verified.
    assert_eq!(tokens.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(tokens.refused.load(Ordering::SeqCst), 0);
}

// ---- Elasticsearch _bulk (an OpenSearch node) ----

/// A peer on the machine's Java: `main` from the classpath `cp`, with a
/// heap small enough for the JVM peers of tests running side by side.
fn java(cp: &str, main: &str) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(["-Xms256m", "-Xmx512m", "-cp", cp, main]);
    cmd
}

fn start_opensearch(dir: &Path, http_port: u16, transport_port: u16) -> Proc {
    let node = tool("opensearch-node");
    let cp = format!(
        "{}:{}/*",
        node.join("classes").display(),
        node.join("libs").display()
    );
    let home = dir.join("opensearch");
    std::fs::create_dir_all(&home).unwrap();
    let mut p = Proc::start(
        java(&cp, "dev.haltsql.peers.OpenSearchNode")
            .arg(&home)
            .args([http_port.to_string(), transport_port.to_string()]),
        &dir.join("opensearch.log"),
    );
    let addr: SocketAddr = ([127, 0, 0, 1], http_port).into();
    wait_until("opensearch", 180, || {
        p.assert_running("opensearch");
        matches!(
            http(
                addr,
                "GET",
                "/_cluster/health?wait_for_status=yellow&timeout=1s",
                "",
                b""
            ),
            Some((200, _))
        )
    });
    p
}

/// The documents of `index` (a data stream's too), as the event lines the
/// chain hashed: for a data stream, the `"@timestamp":...,` the sink put
/// first is taken out again.
fn es_lines(addr: SocketAddr, index: &str, data_stream: bool) -> Vec<String> {
    let (status, _) = http(addr, "POST", &format!("/{index}/_refresh"), "", b"").unwrap();
    assert_eq!(status, 200);
    let body = serde_json::json!({"size": 1000, "sort": [{"seq": "asc"}]}).to_string();
    let (status, raw) = http(
        addr,
        "POST",
        &format!("/{index}/_search"),
        "Content-Type: application/json\r\n",
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
    // The raw `_source` bytes are needed, not a re-encoding: take each
    // document's source text out of the answer by its position.
    let text = String::from_utf8_lossy(&raw).into_owned();
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("\"_source\":") {
        rest = &rest[i + "\"_source\":".len()..];
        let end = json_object_end(rest);
        let mut doc = rest[..end].to_string();
        if data_stream {
            let v: Value = serde_json::from_str(&doc).unwrap();
            let ts = format!(
                "\"@timestamp\":\"{}\",",
                v["@timestamp"].as_str().unwrap_or_default()
            );
            assert!(doc.starts_with(&format!("{{{ts}")), "{doc}");
            doc = format!("{{{}", &doc[1 + ts.len()..]);
            assert_eq!(v["@timestamp"], v["time"], "@timestamp is the event's time");
        }
        out.push(doc);
        rest = &rest[end..];
    }
    out
}

/// The length of the JSON object at the start of `s`.
fn json_object_end(s: &str) -> usize {
    let (mut depth, mut in_str, mut esc) = (0i32, false, false);
    for (i, c) in s.char_indices() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

#[test]
fn elasticsearch_sink_index_data_stream_outage_and_auth_forms() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (hp, tp) = (free_port(), free_port());
    let addr: SocketAddr = ([127, 0, 0, 1], hp).into();
    let t = Instant::now();
    let os = Arc::new(Mutex::new(Some(start_opensearch(dir, hp, tp))));
    eprintln!("opensearch started in {:?}", t.elapsed());
    let template = serde_json::json!({
        "index_patterns": ["logs-haltsql-*"],
        "data_stream": {},
        "template": {"settings": {"number_of_replicas": 0}}
    })
    .to_string();
    let r = http(
        addr,
        "PUT",
        "/_index_template/haltsql",
        "Content-Type: application/json\r\n",
        template.as_bytes(),
    );
    assert_eq!(r.map(|r| r.0), Some(200));
    let index = serde_json::json!({"settings": {"number_of_replicas": 0}}).to_string();
    let r = http(
        addr,
        "PUT",
        "/haltsql-audit",
        "Content-Type: application/json\r\n",
        index.as_bytes(),
    );
    assert_eq!(r.map(|r| r.0), Some(200));

    let sinks = format!(
        "  - {{type: elasticsearch, url: \"http://127.0.0.1:{hp}\", index: haltsql-audit}}\n  - {{type: elasticsearch, url: \"http://127.0.0.1:{hp}/\", data_stream: logs-haltsql-test}}\n"
    );
    let d1 = dir.join("serve");
    std::fs::create_dir_all(&d1).unwrap();
    let s = serve(&d1, &sinks, FLUSH_MS, &[]);
    let read = |i: usize| match i {
        1 => es_lines(addr, "haltsql-audit", false),
        _ => es_lines(addr, "logs-haltsql-test", true),
    };
    let mut stop = || {
        if let Some(mut p) = os.lock().unwrap().take() {
            p.stop();
        }
    };
    let mut start = || {
        let t = Instant::now();
        *os.lock().unwrap() = Some(start_opensearch(dir, hp, tp));
        eprintln!("opensearch restarted in {:?}", t.elapsed());
    };
    outage_and_recovery(&s, &[1, 2], &read, &mut stop, &mut start);
    // The documents' ids are PROCESS-SEQ: a retried batch cannot duplicate.
    let v = json_get(addr, "/haltsql-audit/_count");
    let delivered = 135 - s.dropped(1);
    assert_eq!(v["count"].as_u64(), Some(delivered as u64));

    // The auth forms over https: nginx (TLS with a test CA) in front of the
    // node checks an API key, a bearer token and basic credentials.
    let pki = pki(dir, "haltsql audit test CA");
    let (mut nginx, ports) = es_auth_proxy(dir, &pki, hp);
    let sinks = format!(
        "  - {{type: elasticsearch, url: \"https://127.0.0.1:{}\", index: auth-api-key, auth: {{api_key: {ES_API_KEY}}}}}
  - {{type: elasticsearch, url: \"https://127.0.0.1:{}\", index: auth-token, auth: {{type: token, token: {ES_TOKEN}}}}}
  - {{type: elasticsearch, url: \"https://127.0.0.1:{}\", index: auth-basic, auth: {{username: {ES_USER}, password: {ES_PASSWORD}}}}}
  - {{type: elasticsearch, url: \"https://127.0.0.1:{}\", index: auth-wrong, auth: {{api_key: d3Jvbmc6a2V5}}}}
",
        ports[0], ports[1], ports[2], ports[0]
    );
    let d2 = dir.join("auth");
    std::fs::create_dir_all(&d2).unwrap();
    let ca = pki.ca.display().to_string();
    let a = serve(&d2, &sinks, FLUSH_MS, &[("SSL_CERT_FILE", &ca)]);
    a.verify(12);
    for i in 1..=3 {
        a.wait(&format!("sink {i}: 12 events sent"), 60, |a| {
            a.sent(i) == 12
        });
    }
    a.wait("the wrong key's events dropped as rejected", 60, |a| {
        a.metric(
            "haltsql_audit_events_dropped_total",
            4,
            "reason=\"rejected\"",
        ) == 12.0
    });
    let chain = a.chain();
    for index in ["auth-api-key", "auth-token", "auth-basic"] {
        let got = check_delivered(index, &chain, &es_lines(addr, index, false));
        assert_eq!(got, (1..=12).collect::<Vec<u64>>(), "{index}");
    }
    let (status, _) = http(addr, "GET", "/auth-wrong/_count", "", b"").unwrap();
    assert_eq!(status, 404, "nothing got through with the wrong key");
    assert!(a.proc.log().contains("HTTP 401"), "{}", a.proc.log());
    nginx.assert_running("nginx");
}

const ES_API_KEY: &str = "aGFsdHNxbDpzZWNyZXQta2V5";
const ES_TOKEN: &str = "es-bearer-token";
const ES_USER: &str = "haltsql";
const ES_PASSWORD: &str = "es-basic-password";

/// nginx with TLS on three ports in front of `upstream`: the first lets
/// `Authorization: ApiKey ES_API_KEY` through, the second the bearer
/// token, the third basic credentials (htpasswd); anything else is 401.
fn es_auth_proxy(dir: &Path, pki: &Pki, upstream: u16) -> (Proc, [u16; 3]) {
    let ports = [free_port(), free_port(), free_port()];
    let n = dir.join("nginx");
    std::fs::create_dir_all(&n).unwrap();
    run(Command::new(tool("htpasswd"))
        .args(["-bcB"])
        .arg(n.join("htpasswd"))
        .args([ES_USER, ES_PASSWORD]));
    let server = |port: u16, check: &str| {
        format!(
            "  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location / {{
      {check}
      proxy_pass http://127.0.0.1:{upstream};
      proxy_set_header Authorization \"\";
    }}
  }}
",
            cert = pki.cert.display(),
            key = pki.key.display(),
        )
    };
    let servers = format!(
        "{}{}{}",
        server(
            ports[0],
            &format!("if ($http_authorization != \"ApiKey {ES_API_KEY}\") {{ return 401; }}")
        ),
        server(
            ports[1],
            &format!("if ($http_authorization != \"Bearer {ES_TOKEN}\") {{ return 401; }}")
        ),
        server(
            ports[2],
            &format!(
                "auth_basic haltsql; auth_basic_user_file {}/htpasswd;",
                n.display()
            )
        ),
    );
    let mut p = kit::nginx(dir, &servers);
    for port in ports {
        wait_port(port, &mut p, "nginx", 30);
    }
    (p, ports)
}

// ---- Kafka ----

struct Kafka {
    proc: Option<Proc>,
    config: PathBuf,
    dir: PathBuf,
    plain: u16,
    sasl_ssl: u16,
    mtls: u16,
}

const KAFKA_USER: &str = "haltsql";
const KAFKA_PASSWORD: &str = "kafka-test-password";
const TOPIC: &str = "haltsql.audit";

fn kafka_classpath() -> String {
    format!("{}/*", tool("kafka-libs").display())
}

impl Kafka {
    /// Formats a KRaft log dir (one node, broker and controller, with
    /// SCRAM-SHA-512 credentials) and writes the config: a plaintext
    /// listener and a SASL_SSL one (SCRAM-SHA-512 and PLAIN).
    fn new(dir: &Path, pki: &Pki) -> Kafka {
        let (plain, sasl_ssl, mtls, controller) =
            (free_port(), free_port(), free_port(), free_port());
        let data = dir.join("kafka-data");
        let pem = dir.join("kafka-keystore.pem");
        write(
            &pem,
            format!(
                "{}{}",
                std::fs::read_to_string(&pki.key).unwrap(),
                std::fs::read_to_string(&pki.cert).unwrap()
            ),
        );
        let config = dir.join("kafka.properties");
        write(
            &config,
            format!(
                "process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{sasl_ssl},SSL://127.0.0.1:{mtls},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{sasl_ssl},SSL://127.0.0.1:{mtls}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT
listener.name.ssl.ssl.client.auth=required
ssl.truststore.type=PEM
ssl.truststore.location={truststore}
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_{KAFKA_USER}=\"{KAFKA_PASSWORD}\";
ssl.keystore.type=PEM
ssl.keystore.location={}
log.dirs={}
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
num.partitions=1
",
                pem.display(),
                data.display(),
                truststore = pki.ca.display(),
            ),
        );
        let t = Instant::now();
        run(Command::new("java")
            .args([
                "-cp",
                &kafka_classpath(),
                "kafka.tools.StorageTool",
                "format",
            ])
            .args(["-t", "hAltSqLaUdItTeStCluStr"])
            .arg("-c")
            .arg(&config)
            .args([
                "--add-scram",
                &format!("SCRAM-SHA-512=[name={KAFKA_USER},password={KAFKA_PASSWORD}]"),
            ]));
        eprintln!("kafka storage formatted in {:?}", t.elapsed());
        let mut k = Kafka {
            proc: None,
            config,
            dir: dir.to_path_buf(),
            plain,
            sasl_ssl,
            mtls,
        };
        k.start();
        k
    }

    fn start(&mut self) {
        let t = Instant::now();
        let mut p = Proc::start(
            java(&kafka_classpath(), "kafka.Kafka").arg(&self.config),
            &self.dir.join("kafka.log"),
        );
        wait_port(self.plain, &mut p, "kafka", 120);
        wait_port(self.sasl_ssl, &mut p, "kafka", 30);
        wait_port(self.mtls, &mut p, "kafka", 30);
        eprintln!("kafka started in {:?}", t.elapsed());
        self.proc = Some(p);
    }

    fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A client certificate signed by the test CA: (certificate, key).
fn client_cert(pki: &Pki) -> (PathBuf, PathBuf) {
    pki.issue(
        "client",
        "/CN=haltsql-audit",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
        3,
    )
}

async fn kafka_client(port: u16) -> rskafka::client::Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rskafka::client::ClientBuilder::new(vec![format!("127.0.0.1:{port}")])
            .build()
            .await
        {
            Ok(c) => return c,
            Err(e) => {
                assert!(Instant::now() < deadline, "kafka client: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Every record of `topic` as (partition, key, value), partition by partition.
fn kafka_records(port: u16, topic: &str) -> Vec<(i32, String, String)> {
    runtime().block_on(async {
        let c = kafka_client(port).await;
        let topics = c.list_topics().await.unwrap();
        let t = topics.into_iter().find(|t| t.name == topic).unwrap();
        let mut out = Vec::new();
        for p in t.partitions {
            let pc = c
                .partition_client(
                    topic,
                    p,
                    rskafka::client::partition::UnknownTopicHandling::Retry,
                )
                .await
                .unwrap();
            let high = pc
                .get_offset(rskafka::client::partition::OffsetAt::Latest)
                .await
                .unwrap();
            let mut offset = 0;
            while offset < high {
                let (records, _) = pc.fetch_records(offset, 1..4_000_000, 1_000).await.unwrap();
                if records.is_empty() {
                    break;
                }
                for r in records {
                    offset = r.offset + 1;
                    out.push((
                        p,
                        String::from_utf8_lossy(r.record.key.as_deref().unwrap_or_default())
                            .into_owned(),
                        String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default())
                            .into_owned(),
                    ));
                }
            }
        }
        out
    })
}

#[test]
fn kafka_sink_plaintext_and_sasl_over_tls_survive_a_broker_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = pki(dir, "haltsql audit test CA");
    let kafka = Arc::new(Mutex::new(Kafka::new(dir, &pki)));
    let (plain, sasl_ssl, mtls) = {
        let k = kafka.lock().unwrap();
        (k.plain, k.sasl_ssl, k.mtls)
    };
    let client = client_cert(&pki);
    // Three partitions: the sink keeps a process's events in one of them.
    runtime().block_on(async {
        let c = kafka_client(plain).await;
        c.controller_client()
            .unwrap()
            .create_topic(TOPIC, 3, 1, 10_000)
            .await
            .unwrap();
        for topic in [
            "haltsql.audit.scram",
            "haltsql.audit.plain",
            "haltsql.audit.mtls",
        ] {
            c.controller_client()
                .unwrap()
                .create_topic(topic, 1, 1, 10_000)
                .await
                .unwrap();
        }
    });
    let ca = pki.ca.display();
    let sinks = format!(
        "  - {{type: kafka, brokers: [\"127.0.0.1:{plain}\"], topic: {TOPIC}, tls: false}}
  - type: kafka
    brokers: [\"127.0.0.1:{sasl_ssl}\"]
    topic: haltsql.audit.scram
    tls: {{ca_file: {ca}}}
    sasl: {{mechanism: scram-sha-512, username: {KAFKA_USER}, password: {KAFKA_PASSWORD}}}
  - type: kafka
    brokers: [\"127.0.0.1:{sasl_ssl}\"]
    topic: haltsql.audit.plain
    tls: {{ca_file: {ca}}}
    sasl: {{mechanism: plain, username: {KAFKA_USER}, password: {KAFKA_PASSWORD}}}
  - type: kafka
    brokers: [\"127.0.0.1:{mtls}\"]
    topic: haltsql.audit.mtls
    tls: {{ca_file: {ca}, cert_file: {}, key_file: {}}}
",
        client.0.display(),
        client.1.display()
    );
    let d1 = dir.join("serve");
    std::fs::create_dir_all(&d1).unwrap();
    let s = serve(&d1, &sinks, FLUSH_MS, &[]);
    let read = |i: usize| {
        let topic = [
            "",
            TOPIC,
            "haltsql.audit.scram",
            "haltsql.audit.plain",
            "haltsql.audit.mtls",
        ][i];
        let records = kafka_records(plain, topic);
        let keys: std::collections::BTreeSet<&str> =
            records.iter().map(|(_, k, _)| k.as_str()).collect();
        assert_eq!(keys.len(), 1, "one process, one record key: {keys:?}");
        records.into_iter().map(|(_, _, v)| v).collect()
    };
    let mut stop = || kafka.lock().unwrap().stop();
    let mut start = || kafka.lock().unwrap().start();
    outage_and_recovery(&s, &[1, 2, 3, 4], &read, &mut stop, &mut start);

    // One partition of the three holds the process's events, in chain
    // order (a retried batch may repeat events, never reorder them).
    let records = kafka_records(plain, TOPIC);
    let partitions: std::collections::BTreeSet<i32> = records.iter().map(|r| r.0).collect();
    assert_eq!(partitions.len(), 1, "{partitions:?}");
    let seqs: Vec<u64> = records.iter().map(|(_, _, v)| seq_of(v)).collect();
    let mut max = 0;
    for s in &seqs {
        assert!(*s + BATCH as u64 > max, "out of order: {seqs:?}");
        max = max.max(*s);
    }

    // A wrong password, and no client certificate where one is required:
    // the broker refuses both; nothing is delivered, the failures are
    // counted and verify answers still come.
    let d2 = dir.join("wrong");
    std::fs::create_dir_all(&d2).unwrap();
    let wrong = format!(
        "  - type: kafka\n    brokers: [\"127.0.0.1:{sasl_ssl}\"]\n    topic: {TOPIC}\n    tls: {{ca_file: {ca}}}\n    sasl: {{mechanism: scram-sha-512, username: {KAFKA_USER}, password: wrong}}\n  - type: kafka\n    brokers: [\"127.0.0.1:{mtls}\"]\n    topic: {TOPIC}\n    tls: {{ca_file: {ca}}}\n"
    );
    let w = serve(&d2, &wrong, FLUSH_MS, &[]);
    w.verify(3);
    for i in [1, 2] {
        w.wait("a refused connection counted", 60, |w| {
            w.metric("haltsql_audit_send_failures_total", i, "") >= 1.0
        });
        assert_eq!(w.sent(i), 0);
    }
}
