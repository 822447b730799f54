//! Signed bundles end to end: the real `haltsql` binary against real peers
//! on loopback, installed by `hack/install-peers.sh` into `bin/`:
//! the CNCF distribution registry with the oras client, nginx (Debian) with
//! a test CA made by openssl, and the s3s-fs S3 server. A missing peer
//! fails the test (it never skips).
//!
//! Each test starts its own peers and servers on free ports and stops them
//! by their pid when it ends. Poll intervals are the minimum the config
//! allows (10 s), so the tests run in parallel and take about a minute.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

#[path = "common/kit.rs"]
mod kit;

use kit::{
    BIN, Pki, Proc, free_port, http_text, mkdir, pki, publish, run, serve_proc, sha256_hex, tool,
    wait_port, wait_ready, wait_until, write,
};

const TOKEN: &str = "bundle-agent-token";
const POLL_SECONDS: u64 = 10;
const ORDERS_SQL: &str = "SELECT id FROM app.orders LIMIT 1";
const CUSTOMERS_SQL: &str = "SELECT id FROM app.customers LIMIT 1";

// ---- bundles (made with the real CLI) ----

struct Keys {
    private: PathBuf,
    public_pem: String,
}

fn keygen(dir: &Path, name: &str) -> Keys {
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    run(Command::new(BIN)
        .args(["bundle", "keygen", "--private-key"])
        .arg(&private)
        .arg("--public-key")
        .arg(&public));
    Keys {
        private,
        public_pem: std::fs::read_to_string(&public).unwrap_or_else(|e| panic!("{e}")),
    }
}

fn policy(tables: &[&str]) -> String {
    let mut t = String::new();
    for table in tables {
        t.push_str(&format!("  app.{table}:\n    columns: [id]\n"));
    }
    format!(
        "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: orders\nsearch_path: [app]\nstatements:\n  allow: [select]\ntables:\n{t}"
    )
}

/// Builds and signs a bundle with one policy `orders` allowing `tables`;
/// returns (archive bytes, signature bytes).
fn bundle(dir: &Path, version: &str, tables: &[&str], key: &Keys) -> (Vec<u8>, Vec<u8>) {
    let src = dir.join(format!("src-{version}"));
    write(&src.join("orders.yaml"), policy(tables));
    let out = dir.join(format!("bundle-{version}.tar.gz"));
    run(Command::new(BIN)
        .args(["bundle", "build", "--revision", version])
        .arg(&src)
        .arg("-o")
        .arg(&out));
    run(Command::new(BIN)
        .args(["bundle", "sign", "--key"])
        .arg(&key.private)
        .arg(&out));
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (
        read(&out),
        read(&dir.join(format!("bundle-{version}.tar.gz.sig"))),
    )
}

// ---- haltsql serve ----

struct Serve {
    proc: Proc,
    api: SocketAddr,
    health: SocketAddr,
}

/// Starts `haltsql serve` with one bundle source (`source` is the YAML of
/// its `oci`/`https`/`s3` key, indented for the bundle_source map).
fn serve(dir: &Path, name: &str, source: &str, keys: &[&Keys], env: &[(&str, &str)]) -> Serve {
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let health: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let hash = sha256_hex(TOKEN.as_bytes());
    let mut pem = String::new();
    for k in keys {
        pem.push_str("        - |\n");
        for line in k.public_pem.lines() {
            pem.push_str(&format!("          {line}\n"));
        }
    }
    let config = format!(
        "apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: {api}
  health_listen: {health}
  auth:
    tokens:
      - name: agent
        policy: b.orders
        sha256: {hash}
policies:
  - bundle_source:
      name: test
{source}      public_keys:
{pem}      name_prefix: b.
      poll_interval_seconds: {POLL_SECONDS}
      cache_dir: {cache}
logging: {{level: info, format: text}}
",
        cache = dir.join("cache").display()
    );
    let path = dir.join(format!("{name}.yaml"));
    write(&path, &config);
    let proc = serve_proc(&path, &dir.join(format!("{name}.log")), env);
    Serve { proc, api, health }
}

impl Serve {
    fn readyz(&self) -> Option<(u16, String)> {
        http_text(self.health, "GET", "/readyz", Some(TOKEN), "")
    }

    fn metrics(&self) -> String {
        http_text(self.health, "GET", "/metrics", Some(TOKEN), "")
            .map_or_else(String::new, |(_, b)| b)
    }

    /// Sum of the series whose line starts with `prefix`.
    fn metric(&self, prefix: &str) -> f64 {
        sum(&self.metrics(), prefix)
    }

    /// All fetches that got an answer or an error.
    fn polls(&self) -> f64 {
        self.metric("haltsql_bundle_fetches_total{")
    }

    /// `allowed` of a verify call, None when not answered with 200.
    fn allowed(&self, sql: &str) -> Option<bool> {
        let body = serde_json::json!({ "sql": sql }).to_string();
        let (status, body) = http_text(self.api, "POST", "/v1/verify", Some(TOKEN), &body)?;
        if status != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        v["allowed"].as_bool()
    }

    fn wait_ready(&mut self) {
        wait_ready(&mut self.proc, self.health);
    }

    /// The poll count right after the first fetch (which made the server
    /// ready): the next poll is a full interval away.
    fn first_poll(&self) -> f64 {
        wait_until("the first poll counted", 10, || self.polls() >= 1.0);
        self.polls()
    }

    /// Waits for a poll to finish, so that the next one is a full interval
    /// away; returns the poll count.
    fn after_a_poll(&self) -> f64 {
        let before = self.polls();
        wait_until("a poll", 2 * POLL_SECONDS + 5, || self.polls() > before);
        self.polls()
    }

    /// Waits until `f` holds, then checks it took at most one poll since
    /// `polls` (the count right after a poll, taken before publishing).
    /// Returns the poll count: a poll has just finished, so the next
    /// change can be published at once.
    fn picked_up_in_one_poll(&self, polls: f64, what: &str, f: impl Fn(&Serve) -> bool) -> f64 {
        wait_until(what, 3 * POLL_SECONDS, || f(self));
        let now = self.polls();
        assert!(
            now <= polls + 1.0,
            "{what} took {} polls\n{}",
            now - polls,
            self.metrics()
        );
        now
    }
}

fn sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---- peers ----

fn registry(dir: &Path, pki: &Pki, user: &str, password: &str) -> (Proc, u16) {
    let port = free_port();
    let out = run(Command::new(tool("htpasswd")).args(["-Bbn", user, password]));
    write(&dir.join("htpasswd"), &out.stdout);
    let config = format!(
        "version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {root}}}
http:
  addr: 127.0.0.1:{port}
  tls: {{certificate: {cert}, key: {key}}}
auth:
  htpasswd: {{realm: haltsql-test, path: {htpasswd}}}
",
        root = dir.join("registry-data").display(),
        cert = pki.cert.display(),
        key = pki.key.display(),
        htpasswd = dir.join("htpasswd").display(),
    );
    write(&dir.join("registry.yaml"), config);
    let mut p = Proc::start(
        Command::new(tool("registry"))
            .arg("serve")
            .arg(dir.join("registry.yaml"))
            .env("OTEL_TRACES_EXPORTER", "none"),
        &dir.join("registry.log"),
    );
    wait_port(port, &mut p, "registry", 30);
    (p, port)
}

/// Publishes a bundle with oras, as a user would.
fn oras_push(
    dir: &Path,
    pki: &Pki,
    reference: &str,
    bundle: &[u8],
    sig: &[u8],
    user: &str,
    password: &str,
) {
    let work = dir.join("oras-work");
    write(&work.join("bundle.tar.gz"), bundle);
    write(&work.join("bundle.tar.gz.sig"), sig);
    run(Command::new(tool("oras"))
        .current_dir(&work)
        .args(["push", "--no-tty", "--ca-file"])
        .arg(&pki.ca)
        .args(["--registry-config"])
        .arg(dir.join("oras-auth.json"))
        .args(["-u", user, "-p", password])
        .args([
            "--artifact-type",
            "application/vnd.haltsql.bundle.v1",
            reference,
        ])
        .arg("bundle.tar.gz:application/vnd.haltsql.bundle.v1.tar+gzip")
        .arg("bundle.tar.gz.sig:application/vnd.haltsql.bundle.signature.v1+json")
        .env("HOME", dir));
}

#[test]
fn oci_bundle_published_with_oras_is_served_updated_and_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = pki(dir, "haltsql bundle test CA");
    let (user, password) = ("publisher", "registry-test-password");
    let (mut registry, port) = registry(dir, &pki, user, password);
    let key = keygen(dir, "signer");
    let reference = format!("127.0.0.1:{port}/haltsql/policies:prod");

    let (v1, v1sig) = bundle(dir, "v1", &["orders"], &key);
    oras_push(dir, &pki, &reference, &v1, &v1sig, user, password);

    let source = format!(
        "      oci:\n        ref: {reference}\n        auth: {{username: {user}, password: {password}}}\n"
    );
    let ca = pki.ca.display().to_string();
    let env = [("SSL_CERT_FILE", ca.as_str())];
    let mut s = serve(dir, "serve-a", &source, &[&key], &env);
    s.wait_ready();
    assert_eq!(s.allowed(ORDERS_SQL), Some(true), "{}", s.proc.log());
    assert_eq!(s.allowed(CUSTOMERS_SQL), Some(false));
    let m = s.metrics();
    assert!(m.contains("origin=\"source\""), "{m}");
    assert!(m.contains("revision=\"v1\""), "{m}");

    // A new version is picked up by the next poll.
    let polls = s.first_poll();
    let (v2, v2sig) = bundle(dir, "v2", &["orders", "customers"], &key);
    oras_push(dir, &pki, &reference, &v2, &v2sig, user, password);
    s.picked_up_in_one_poll(polls, "v2 from the registry", |s| {
        s.allowed(CUSTOMERS_SQL) == Some(true)
    });
    // The first bundle from the registry, then v2.
    assert_eq!(s.metric("haltsql_bundle_updates_total{"), 2.0);

    // The registry goes away: the bundle in use keeps serving.
    registry.stop();
    wait_until("a failed fetch", 3 * POLL_SECONDS, || {
        s.metric("haltsql_bundle_fetches_total{source=\"test\",result=\"error\"}") >= 1.0
    });
    assert_eq!(s.allowed(CUSTOMERS_SQL), Some(true));
    assert_eq!(s.readyz().map(|r| r.0), Some(200));
    s.proc.stop();

    // A restart with the registry still down serves the cached v2.
    let mut s = serve(dir, "serve-b", &source, &[&key], &env);
    s.wait_ready();
    assert_eq!(s.allowed(CUSTOMERS_SQL), Some(true), "{}", s.proc.log());
    let m = s.metrics();
    assert!(
        m.contains("origin=\"cache\"") && m.contains("revision=\"v2\""),
        "{m}"
    );
}

fn nginx(dir: &Path, pki: &Pki, token: &str) -> (Proc, u16) {
    let port = free_port();
    let www = mkdir(&dir.join("nginx/www"));
    let servers = format!(
        "  default_type application/octet-stream;
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    root {www};
    location / {{
      if ($http_authorization != \"Bearer {token}\") {{ return 401; }}
    }}
  }}
",
        www = www.display(),
        cert = pki.cert.display(),
        key = pki.key.display(),
    );
    let mut p = kit::nginx(dir, &servers);
    wait_port(port, &mut p, "nginx", 30);
    (p, port)
}

#[test]
fn https_bundle_with_token_and_etag_refuses_tampered_and_foreign_bundles() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = pki(dir, "haltsql bundle test CA");
    let token = "https-bundle-token";
    let (_nginx, port) = nginx(dir, &pki, token);
    let www = dir.join("nginx/www/bundles");
    let key = keygen(dir, "signer");
    let other = keygen(dir, "other");
    let (v1, v1sig) = bundle(dir, "v1", &["orders"], &key);
    write(&www.join("prod.tar.gz"), &v1);
    write(&www.join("prod.tar.gz.sig"), &v1sig);

    let source = format!(
        "      https:\n        url: https://localhost:{port}/bundles/prod.tar.gz\n        auth: {{token: {token}}}\n"
    );
    let ca = pki.ca.display().to_string();
    let mut s = serve(
        dir,
        "serve",
        &source,
        &[&key],
        &[("SSL_CERT_FILE", ca.as_str())],
    );
    s.wait_ready();
    assert_eq!(s.allowed(ORDERS_SQL), Some(true), "{}", s.proc.log());
    assert_eq!(s.allowed(CUSTOMERS_SQL), Some(false));

    // An unchanged bundle is a conditional GET answered 304.
    let polls = s.after_a_poll();
    let access = std::fs::read_to_string(dir.join("nginx/access.log")).unwrap_or_default();
    assert!(
        access
            .lines()
            .any(|l| l.contains("/bundles/prod.tar.gz HTTP/1.1\" 304 ")),
        "{access}"
    );

    // Tampered: another archive served next to v1's signature.
    let (v2, v2sig) = bundle(dir, "v2", &["orders", "customers"], &key);
    publish(&www.join("prod.tar.gz"), &v2);
    let polls = s.picked_up_in_one_poll(polls, "the tampered bundle refused", |s| {
        s.metric("haltsql_bundle_rejected_total{source=\"test\",reason=\"signature\"}") >= 1.0
    });
    assert_eq!(s.allowed(CUSTOMERS_SQL), Some(false));
    assert_eq!(s.allowed(ORDERS_SQL), Some(true));
    assert_eq!(s.readyz().map(|r| r.0), Some(200));

    // Signed by a key that is not in public_keys.
    let (v3, v3sig) = bundle(dir, "v3", &["orders", "customers"], &other);
    // (The tampered bundle was refused by the poll that just finished.)
    let before = s.metric("haltsql_bundle_rejected_total{");
    publish(&www.join("prod.tar.gz.sig"), &v3sig);
    publish(&www.join("prod.tar.gz"), &v3);
    let polls = s.picked_up_in_one_poll(polls, "the foreign bundle refused", |s| {
        s.metric("haltsql_bundle_rejected_total{") > before
    });
    assert_eq!(s.allowed(CUSTOMERS_SQL), Some(false));
    assert!(
        s.proc.log().contains("not signed by any"),
        "{}",
        s.proc.log()
    );

    // The same content signed by the trusted key is taken.
    publish(&www.join("prod.tar.gz.sig"), &v2sig);
    publish(&www.join("prod.tar.gz"), &v2);
    s.picked_up_in_one_poll(polls, "v2 signed by the trusted key", |s| {
        s.allowed(CUSTOMERS_SQL) == Some(true)
    });
}

#[test]
fn s3_bundle_with_static_and_env_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (access, secret) = ("haltsql-test-key", "haltsql-test-secret-key-0123456789");
    let port = free_port();
    let data = dir.join("s3");
    let objects = data.join("policies/prod");
    let key = keygen(dir, "signer");
    let (v1, v1sig) = bundle(dir, "v1", &["orders"], &key);
    write(&objects.join("bundle.tar.gz"), &v1);
    write(&objects.join("bundle.tar.gz.sig"), &v1sig);
    let _s3 = kit::start_s3s(dir, port, access, secret);

    let location = format!(
        "      s3:\n        bucket: policies\n        key: prod/bundle.tar.gz\n        region: us-east-1\n        endpoint: http://127.0.0.1:{port}\n"
    );
    let static_creds = format!(
        "{location}        credentials: {{source: static, access_key_id: {access}, secret_access_key: {secret}}}\n"
    );
    let d1 = dir.join("static");
    let mut a = serve(&mkdir(&d1), "serve", &static_creds, &[&key], &[]);
    a.wait_ready();
    assert_eq!(a.allowed(ORDERS_SQL), Some(true), "{}", a.proc.log());
    assert_eq!(a.allowed(CUSTOMERS_SQL), Some(false));

    // A new version is picked up by the next poll (checked at the end).
    let polls = a.first_poll();
    let (v2, v2sig) = bundle(dir, "v2", &["orders", "customers"], &key);
    publish(&objects.join("bundle.tar.gz.sig"), &v2sig);
    publish(&objects.join("bundle.tar.gz"), &v2);

    let d2 = dir.join("env");
    let mut b = serve(
        &mkdir(&d2),
        "serve",
        &location,
        &[&key],
        &[
            ("AWS_ACCESS_KEY_ID", access),
            ("AWS_SECRET_ACCESS_KEY", secret),
        ],
    );
    b.wait_ready();
    assert_eq!(b.allowed(ORDERS_SQL), Some(true), "{}", b.proc.log());

    // The server checks the signature of the request: a wrong secret is refused.
    let wrong = format!(
        "{location}        credentials: {{source: static, access_key_id: {access}, secret_access_key: wrong-secret}}\n"
    );
    let d3 = dir.join("wrong");
    let c = serve(&mkdir(&d3), "serve", &wrong, &[&key], &[]);
    wait_until("a refused fetch", 20, || {
        c.metric("haltsql_bundle_fetches_total{source=\"test\",result=\"error\"}") >= 1.0
    });
    let (status, body) = c.readyz().unwrap_or_default();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("HTTP 403"), "{body}");

    a.picked_up_in_one_poll(polls, "v2 from S3", |s| {
        s.allowed(CUSTOMERS_SQL) == Some(true)
    });
}

#[test]
fn no_cache_and_no_source_is_not_ready() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let key = keygen(dir, "signer");
    // Nothing listens there.
    let port = free_port();
    let source = format!("      https:\n        url: https://127.0.0.1:{port}/b.tar.gz\n");
    let s = serve(dir, "serve", &source, &[&key], &[]);
    wait_until("a failed fetch", 20, || {
        s.metric("haltsql_bundle_fetches_total{source=\"test\",result=\"error\"}") >= 1.0
    });
    let (status, body) = s.readyz().unwrap_or_default();
    assert_eq!(status, 503);
    assert!(
        body.contains("bundle source test: no verified bundle yet"),
        "{body}"
    );
    let verify = http_text(
        s.api,
        "POST",
        "/v1/verify",
        Some(TOKEN),
        &serde_json::json!({"sql": ORDERS_SQL}).to_string(),
    );
    assert_eq!(verify.map(|v| v.0), Some(503));
    assert_eq!(s.metric("haltsql_bundle_loaded{source=\"test\"}"), 0.0);
}
