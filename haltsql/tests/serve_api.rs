//! Integration tests: the real `haltsql serve` binary on loopback, with the
//! token Secret files laid out as in a pod and the guide's quick-start policy.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use haltsql::audit::{GENESIS, verify_chain};
use pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::Value;

#[path = "common/kit.rs"]
mod kit;

use kit::{BIN, free_port, sha256_hex, write};

const TOKEN: &str = "s3cr3t-orders-agent-token";

const QUICK_START_POLICY: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders-agent
dialect: postgres
search_path: [app]
statements:
  allow: [select]
require_limit:
  max: 100
tables:
  app.orders:
    columns: [id, status, total_cents]
";

/// Test PKI: a CA, a server certificate for 127.0.0.1, a client certificate.
struct Pki {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    server_cert: String,
    server_key: String,
    client_cert: CertificateDer<'static>,
    client_key: Vec<u8>,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap_or_else(|e| panic!("rcgen: {e}"));
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("rcgen: {e}"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, ca_key).unwrap_or_else(|e| panic!("rcgen: {e}"));

    let server_key = KeyPair::generate().unwrap_or_else(|e| panic!("rcgen: {e}"));
    let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .and_then(|p| p.signed_by(&server_key, &ca))
        .unwrap_or_else(|e| panic!("rcgen: {e}"));

    let client_key = KeyPair::generate().unwrap_or_else(|e| panic!("rcgen: {e}"));
    let client = CertificateParams::new(vec!["agent.example".to_string()])
        .and_then(|p| p.signed_by(&client_key, &ca))
        .unwrap_or_else(|e| panic!("rcgen: {e}"));

    Pki {
        ca_pem: ca.pem(),
        ca_der: ca.der().clone(),
        server_cert: server.pem(),
        server_key: server_key.serialize_pem(),
        client_cert: client.der().clone(),
        client_key: client_key.serialize_der(),
    }
}

/// A pod's file layout under a temp dir: config and policy from the
/// ConfigMap, token hashes and TLS files from Secrets.
struct Pod {
    dir: tempfile::TempDir,
    api: SocketAddr,
    health: SocketAddr,
}

impl Pod {
    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn config_path(&self) -> PathBuf {
        self.root().join("etc/haltsql/config.yaml")
    }

    fn audit_path(&self) -> PathBuf {
        self.root().join("var/log/haltsql/audit.log")
    }

    /// Lays out the files; `server_extra` is appended under `server:`,
    /// `extra` at the top level.
    fn new(tls: Option<(&Pki, &str, &str)>, auth_extra: &str, extra: &str) -> Pod {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let root = dir.path();
        let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let health: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let secrets = root.join("var/run/haltsql/secrets/haltsql-tokens");
        // As `haltsql hash-token` prints it: with a trailing newline.
        let hash = sha256_hex(TOKEN.as_bytes());
        write(&secrets.join("orders-agent.sha256"), format!("{hash}\n"));
        let other = sha256_hex(b"another-token");
        write(&secrets.join("reporting.sha256"), format!("{other}\n"));
        write(
            &root.join("etc/haltsql/policy-orders.yaml"),
            QUICK_START_POLICY,
        );
        std::fs::create_dir_all(root.join("var/log/haltsql"))
            .unwrap_or_else(|e| panic!("mkdir: {e}"));
        let tls_block = match tls {
            None => String::new(),
            Some((pki, client_auth, min_version)) => {
                let t = root.join("var/run/haltsql/tls");
                write(&t.join("tls.crt"), &pki.server_cert);
                write(&t.join("tls.key"), &pki.server_key);
                write(&t.join("ca.crt"), &pki.ca_pem);
                let ca_line = if client_auth == "none" {
                    String::new()
                } else {
                    format!("    client_ca_file: {}\n", t.join("ca.crt").display())
                };
                format!(
                    "  tls:\n    cert_file: {}\n    key_file: {}\n{ca_line}    client_auth: {client_auth}\n    min_version: \"{min_version}\"\n",
                    t.join("tls.crt").display(),
                    t.join("tls.key").display(),
                )
            }
        };
        let config = format!(
            "apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: {api}
  health_listen: {health}
{tls_block}  auth:
{auth_extra}    tokens:
      - name: orders-agent
        policy: orders-agent
        sha256: ${{file:{secrets}/orders-agent.sha256}}
      - name: reporting
        policy: orders-agent
        sha256: ${{file:{secrets}/reporting.sha256}}
policies:
  - file: policy-orders.yaml
limits: {{max_request_bytes: 2048}}
logging: {{level: info, format: json}}
{extra}",
            secrets = secrets.display(),
        );
        write(&root.join("etc/haltsql/config.yaml"), &config);
        Pod { dir, api, health }
    }

    fn default_audit(&self) -> String {
        format!(
            "audit:\n  sinks: [{{type: stdout}}, {{type: file, path: {}}}]\n",
            self.audit_path().display()
        )
    }
}

struct Server {
    child: Child,
}

impl Server {
    fn start(pod: &Pod) -> Server {
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(pod.config_path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        let mut server = Server { child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let mut err = String::new();
                if let Some(mut s) = server.child.stderr.take() {
                    let _ = s.read_to_string(&mut err);
                }
                panic!("haltsql serve exited early with {status}: {err}");
            }
            if let Ok((200, _)) = plain(pod.health, "GET", "/readyz", &[], "") {
                return server;
            }
            assert!(Instant::now() < deadline, "server did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then the exit status and the captured output.
    fn stop(mut self) -> Output {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(killed.is_ok_and(|s| s.success()), "kill -TERM failed");
        let child = std::mem::replace(
            &mut self.child,
            Command::new("true")
                .spawn()
                .unwrap_or_else(|e| panic!("spawn true: {e}")),
        );
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("wait: {e}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str("Content-Type: application/json\r\n");
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    req.into_bytes()
}

fn parse_response(raw: &[u8]) -> std::io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// One plain HTTP/1.1 request.
fn plain(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&request_bytes(method, path, headers, body))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn client_config(
    pki: &Pki,
    versions: &[&'static rustls::SupportedProtocolVersion],
    client_cert: bool,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(pki.ca_der.clone())
        .unwrap_or_else(|e| panic!("root: {e}"));
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap_or_else(|e| panic!("versions: {e}"))
    .with_root_certificates(roots);
    let config = if client_cert {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.client_key.clone()));
        builder
            .with_client_auth_cert(vec![pki.client_cert.clone()], key)
            .unwrap_or_else(|e| panic!("client cert: {e}"))
    } else {
        builder.with_no_client_auth()
    };
    Arc::new(config)
}

/// One HTTP/1.1 request over TLS.
fn tls(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let name = ServerName::try_from("127.0.0.1")
        .map_err(std::io::Error::other)?
        .to_owned();
    let conn =
        rustls::ClientConnection::new(Arc::clone(config), name).map_err(std::io::Error::other)?;
    let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut stream = rustls::StreamOwned::new(conn, sock);
    stream.write_all(&request_bytes(method, path, headers, body))?;
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw) {
        Ok(_) => {}
        // The server may close without close_notify after Connection: close.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    parse_response(&raw)
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn sql_body(sql: &str) -> String {
    serde_json::json!({ "sql": sql }).to_string()
}

const BEARER: &str = "Bearer s3cr3t-orders-agent-token";

#[test]
fn serve_over_tls_with_health_port_and_audit_chain() {
    let pki = pki();
    let pod = Pod::new(Some((&pki, "none", "1.3")), "", "");
    let extra = pod.default_audit();
    // Rewrite with the audit sinks (they name a path inside the pod dir).
    let config = std::fs::read_to_string(pod.config_path()).unwrap_or_default() + &extra;
    write(&pod.config_path(), &config);

    let server = Server::start(&pod);
    let tls13 = client_config(&pki, &[&rustls::version::TLS13], false);
    let call = |headers: &[(&str, &str)], body: &str| {
        tls(pod.api, &tls13, "POST", "/v1/verify", headers, body)
            .unwrap_or_else(|e| panic!("request failed: {e}"))
    };
    let auth = [("Authorization", BEARER)];

    // Allowed: the guide's quick-start query.
    let sql_allow = "SELECT id, status FROM orders LIMIT 10";
    let (status, body) = call(&auth, &sql_body(sql_allow));
    assert_eq!(status, 200, "{body}");
    let d = json(&body);
    assert_eq!(d["allowed"], true, "{body}");
    assert_eq!(d["policy"], "orders-agent");
    assert_eq!(d["statement"], "select");
    assert_eq!(d["violations"], serde_json::json!([]));

    // Column deny: a decision, not an HTTP error.
    let sql_col = "SELECT id, email FROM orders LIMIT 10";
    let (status, body) = call(&auth, &sql_body(sql_col));
    assert_eq!(status, 200, "{body}");
    let d = json(&body);
    assert_eq!(d["allowed"], false);
    assert_eq!(d["violations"][0]["code"], "column_not_allowed");
    assert_eq!(d["violations"][0]["table"], "app.orders");
    assert_eq!(d["violations"][0]["column"], "email");

    // Statement deny.
    let sql_stmt = "DELETE FROM orders WHERE id = 1";
    let (status, body) = call(&auth, &sql_body(sql_stmt));
    assert_eq!(status, 200, "{body}");
    let d = json(&body);
    assert_eq!(d["allowed"], false);
    assert_eq!(d["statement"], "delete");
    assert_eq!(d["violations"][0]["code"], "statement_not_allowed");

    // 401: missing, wrong, malformed.
    let (status, body) = call(&[], &sql_body(sql_allow));
    assert_eq!(status, 401, "{body}");
    let (status, _) = call(
        &[("Authorization", "Bearer not-the-token")],
        &sql_body(sql_allow),
    );
    assert_eq!(status, 401);
    let (status, _) = call(&[("Authorization", TOKEN)], &sql_body(sql_allow));
    assert_eq!(status, 401);
    // The hash itself is not a token.
    let hash = sha256_hex(TOKEN.as_bytes());
    let (status, _) = call(
        &[("Authorization", &format!("Bearer {hash}"))],
        &sql_body(sql_allow),
    );
    assert_eq!(status, 401);

    // 413 over limits.max_request_bytes (2048).
    let big = sql_body(&format!(
        "SELECT id FROM orders WHERE status = '{}' LIMIT 1",
        "x".repeat(4000)
    ));
    let (status, body) = call(&auth, &big);
    assert_eq!(status, 413, "{body}");
    // 400: not JSON, no sql, sql not a string.
    assert_eq!(call(&auth, "SELECT 1").0, 400);
    assert_eq!(call(&auth, "{\"query\": \"SELECT 1\"}").0, 400);
    assert_eq!(call(&auth, "{\"sql\": 1}").0, 400);

    // The second token selects its policy and is named in the audit.
    let (status, body) = call(
        &[("Authorization", "Bearer another-token")],
        &sql_body(sql_allow),
    );
    assert_eq!(
        (status, json(&body)["allowed"].clone()),
        (200, Value::Bool(true))
    );

    // Health port: plain HTTP, only /healthz and /readyz.
    assert_eq!(
        plain(pod.health, "GET", "/healthz", &[], "")
            .map(|r| r.0)
            .ok(),
        Some(200)
    );
    assert_eq!(
        plain(pod.health, "GET", "/readyz", &[], "")
            .map(|r| r.0)
            .ok(),
        Some(200)
    );
    let r = plain(
        pod.health,
        "POST",
        "/v1/verify",
        &auth,
        &sql_body(sql_allow),
    );
    assert_eq!(r.map(|r| r.0).ok(), Some(404));
    // The API port speaks TLS only, and at least the configured version.
    let r = plain(pod.api, "GET", "/healthz", &[], "");
    assert!(
        !matches!(r, Ok((200, _))),
        "plain HTTP on the TLS port: {r:?}"
    );
    let tls12 = client_config(&pki, &[&rustls::version::TLS12], false);
    let r = tls(pod.api, &tls12, "GET", "/healthz", &[], "");
    assert!(r.is_err(), "TLS 1.2 accepted with min_version 1.3: {r:?}");
    let r = tls(pod.api, &tls13, "GET", "/readyz", &[], "");
    assert_eq!(r.map(|r| r.0).ok(), Some(200));

    // SIGTERM: drains and exits 0.
    let out = server.stop();
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    // Audit: one event per decision (4), same lines on stdout and in the file.
    let stdout: Vec<String> = BufReader::new(&out.stdout[..])
        .lines()
        .map_while(Result::ok)
        .collect();
    let file = std::fs::read_to_string(pod.audit_path()).unwrap_or_default();
    let file: Vec<String> = file.lines().map(str::to_string).collect();
    assert_eq!(stdout.len(), 4, "{stdout:#?}");
    assert_eq!(stdout, file);
    assert_eq!(verify_chain(&stdout), Ok(()));
    let events: Vec<Value> = stdout.iter().map(|l| json(l)).collect();
    assert_eq!(events[0]["prev"], GENESIS);
    assert_eq!(events[0]["decision"], "allow");
    assert_eq!(events[0]["token"], "orders-agent");
    assert_eq!(events[0]["policy"], "orders-agent");
    assert_eq!(events[0]["sql_sha256"], sha256_hex(sql_allow.as_bytes()));
    assert!(
        events[0].get("sql").is_none(),
        "raw SQL without log_raw_sql"
    );
    assert_eq!(events[1]["decision"], "deny");
    assert_eq!(
        events[1]["violations"],
        serde_json::json!(["column_not_allowed"])
    );
    assert_eq!(
        events[2]["violations"],
        serde_json::json!(["statement_not_allowed"])
    );
    assert_eq!(events[3]["token"], "reporting");
    for e in &events {
        assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
    }
    // Nothing in the audit reveals the token or its hash.
    let all = stdout.join("\n");
    assert!(!all.contains(TOKEN) && !all.contains(&hash));
}

#[test]
fn serve_unauthenticated_mode_and_raw_sql() {
    let pod = Pod::new(
        None,
        "    allow_unauthenticated: true\n",
        "default_policy: orders-agent\naudit:\n  log_raw_sql: true\n  sinks: [{type: stdout}]\n",
    );
    let server = Server::start(&pod);
    let sql = "SELECT status, count(*) FROM orders GROUP BY status LIMIT 5";
    let (status, body) =
        plain(pod.api, "POST", "/v1/verify", &[], &sql_body(sql)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200, "{body}");
    let d = json(&body);
    assert_eq!(d["allowed"], true, "{body}");
    assert_eq!(d["policy"], "orders-agent");
    // A wrong token is still refused.
    let r = plain(
        pod.api,
        "POST",
        "/v1/verify",
        &[("Authorization", "Bearer nope")],
        &sql_body(sql),
    );
    assert_eq!(r.map(|r| r.0).ok(), Some(401));
    // Multiple statements are a deny decision.
    let (_, body) = plain(
        pod.api,
        "POST",
        "/v1/verify",
        &[],
        &sql_body("SELECT 1 LIMIT 1; DROP TABLE orders"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json(&body)["violations"][0]["code"], "multiple_statements");
    // A deep input is a too_complex decision; the server keeps serving.
    // At 1.8 KiB it is verified on the pool (over INLINE_MAX_SQL_BYTES).
    let deep = format!("SELECT {}1{} LIMIT 1", "(".repeat(900), ")".repeat(900));
    let (status, body) = plain(pod.api, "POST", "/v1/verify", &[], &sql_body(&deep))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["violations"][0]["code"], "too_complex");
    // Nearly as deep as the engine parses (MAX_NESTING is 64), and small
    // enough to be verified on the thread that handles the request: it gets
    // the engine's decision there too.
    let nested = format!("SELECT {}1{} LIMIT 1", "(".repeat(60), ")".repeat(60));
    let (status, body) = plain(pod.api, "POST", "/v1/verify", &[], &sql_body(&nested))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["allowed"], true, "{body}");
    // The API listener also answers the health routes.
    assert_eq!(
        plain(pod.api, "GET", "/healthz", &[], "").map(|r| r.0).ok(),
        Some(200)
    );

    let out = server.stop();
    assert!(out.status.success());
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert_eq!(verify_chain(&lines), Ok(()));
    let e = json(&lines[0]);
    assert_eq!(e["token"], Value::Null);
    assert_eq!(e["sql"], sql);
}

/// Many decisions at once from several connections: every answered
/// decision has exactly one audit event, all in one unbroken chain (seq
/// 1..N, each `prev` the hash of the line before), and each event records
/// the decision that was answered for its SQL. The runtime's threads
/// write the events, so a lost, doubled, torn or reordered event fails
/// here.
#[test]
fn concurrent_decisions_each_have_one_event_in_one_chain() {
    let pod = Pod::new(None, "", "");
    let extra = format!(
        "audit:\n  log_raw_sql: true\n  sinks: [{{type: file, path: {}}}]\n",
        pod.audit_path().display()
    );
    let config = std::fs::read_to_string(pod.config_path()).unwrap_or_default() + &extra;
    write(&pod.config_path(), &config);
    let server = Server::start(&pod);

    const CLIENTS: usize = 8;
    const EACH: usize = 40;
    let answered: Vec<(String, bool)> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let api = pod.api;
                scope.spawn(move || {
                    (0..EACH)
                        .map(|i| {
                            // Unique SQL per request; every other one denied.
                            let sql = match i % 2 {
                                0 => format!("SELECT id FROM orders WHERE id = {c}{i:03} LIMIT 1"),
                                _ => {
                                    format!("SELECT email FROM orders WHERE id = {c}{i:03} LIMIT 1")
                                }
                            };
                            let (status, body) = plain(
                                api,
                                "POST",
                                "/v1/verify",
                                &[("Authorization", BEARER)],
                                &sql_body(&sql),
                            )
                            .unwrap_or_else(|e| panic!("{e}"));
                            assert_eq!(status, 200, "{body}");
                            let allowed = json(&body)["allowed"].as_bool();
                            assert_eq!(allowed, Some(i % 2 == 0), "{sql}: {body}");
                            (sql, i % 2 == 0)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap_or_else(|_| panic!("client panicked")))
            .collect()
    });

    let out = server.stop();
    assert!(out.status.success());
    let text = std::fs::read_to_string(pod.audit_path()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), CLIENTS * EACH, "one event per decision");
    assert_eq!(verify_chain(&lines), Ok(()));
    let mut events = std::collections::HashMap::new();
    for line in &lines {
        let e = json(line);
        let sql = e["sql"].as_str().map(str::to_string).unwrap_or_default();
        assert_eq!(e["sql_sha256"], sha256_hex(sql.as_bytes()), "{line}");
        assert_eq!(e["token"], "orders-agent", "{line}");
        let decision = e["decision"].as_str().map(str::to_string);
        assert!(events.insert(sql, decision).is_none(), "two events: {line}");
    }
    for (sql, allowed) in &answered {
        let want = if *allowed { "allow" } else { "deny" };
        assert_eq!(
            events.get(sql).cloned().flatten().as_deref(),
            Some(want),
            "{sql}"
        );
    }
}

#[test]
fn serve_requires_client_certificates_when_configured() {
    let pki = pki();
    let pod = Pod::new(Some((&pki, "required", "1.2")), "", "");
    let server = Server::start(&pod);
    let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
    let with_cert = client_config(&pki, &versions, true);
    let without = client_config(&pki, &versions, false);
    let body = sql_body("SELECT id FROM orders LIMIT 1");
    let auth = [("Authorization", BEARER)];
    let r = tls(pod.api, &with_cert, "POST", "/v1/verify", &auth, &body);
    assert_eq!(r.as_ref().map(|r| r.0).ok(), Some(200), "{r:?}");
    let r = tls(pod.api, &without, "POST", "/v1/verify", &auth, &body);
    assert!(
        !matches!(r, Ok((200, _))),
        "accepted without a client certificate: {r:?}"
    );
    // TLS 1.2 is accepted with min_version 1.2.
    let tls12 = client_config(&pki, &[&rustls::version::TLS12], true);
    let r = tls(pod.api, &tls12, "GET", "/healthz", &[], "");
    assert_eq!(r.map(|r| r.0).ok(), Some(200));
    assert!(server.stop().status.success());
}

#[test]
fn serve_load_error_prints_located_errors_and_exits_2() {
    let pod = Pod::new(None, "", "");
    let config = std::fs::read_to_string(pod.config_path())
        .unwrap_or_default()
        .replace(
            "limits: {max_request_bytes: 2048}",
            "limits: {max_request_bytes: 10}",
        )
        .replace("  listen:", "  lisen:");
    write(&pod.config_path(), &config);
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(pod.config_path())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let shown = pod.config_path().display().to_string();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with(&shown)).collect();
    assert!(lines.len() >= 2, "every error, located: {err}");
    assert!(lines.iter().any(|l| l.contains("lisen")), "{err}");
    assert!(
        lines.iter().any(|l| l.contains("max_request_bytes")),
        "{err}"
    );

    // A missing token Secret file: the "configuration that does not start" case.
    let pod = Pod::new(None, "", "");
    let secret = pod
        .root()
        .join("var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256");
    std::fs::remove_file(&secret).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(pod.config_path())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sha256"));
}

#[test]
fn serve_refuses_features_it_does_not_implement() {
    let pod = Pod::new(
        None,
        "",
        // No key and no GOOGLE_APPLICATION_CREDENTIALS: the credentials
        // would come from the metadata server of Google's VMs, which has no
        // peer here.
        "audit:\n  sinks: [{type: gcs, bucket: audit}]\n",
    );
    let validate = Command::new(BIN)
        .arg("validate")
        .arg(pod.config_path())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        validate.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&validate.stdout)
    );
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(pod.config_path())
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env_remove("STORAGE_EMULATOR_HOST")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gcs audit sink with the metadata server") && err.contains("not implemented"),
        "{err}"
    );
}

#[test]
fn check_prints_the_decision() {
    let pod = Pod::new(None, "", "");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .arg("check")
            .arg("--config")
            .arg(pod.config_path())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let out = run(&[
        "--token-name",
        "orders-agent",
        "SELECT id, status FROM orders LIMIT 10",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let d = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(d["allowed"], true);
    assert_eq!(d["policy"], "orders-agent");

    let out = run(&[
        "--policy",
        "orders-agent",
        "SELECT email FROM orders LIMIT 10",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let d = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(d["violations"][0]["code"], "column_not_allowed");
    assert_eq!(d["violations"][0]["column"], "email");

    assert_eq!(
        run(&["--policy", "nope", "SELECT 1"]).status.code(),
        Some(2)
    );
    assert_eq!(
        run(&["--token-name", "nope", "SELECT 1"]).status.code(),
        Some(2)
    );
    assert_eq!(run(&["SELECT 1"]).status.code(), Some(2));
}
