//! Identities end to end: the real `haltsql serve` binary with mTLS client
//! identities (certificates made by openssl, requests made by curl) and
//! OIDC bearer tokens (a real issuer, oauth2-proxy/mockoidc over HTTPS,
//! built by `hack/install-peers.sh`; keys of our own made by openssl for
//! `jwks_file` and the forgeries). Every peer comes from `bin/`; a missing
//! one fails the test (it never skips).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use hmac::Mac;
use serde_json::{Value, json};

#[path = "common/kit.rs"]
mod kit;

use kit::{
    BIN, Proc, free_port, request, run, serve_proc, sha256_hex, swap_data_link, tool, wait_port,
    wait_until, write,
};

const TOKEN: &str = "static-token-beside-the-identities";

// ---- PKI with openssl ----

fn openssl(dir: &Path, args: &[&str]) -> Output {
    run(Command::new(tool("openssl")).current_dir(dir).args(args))
}

/// A CA (`<name>.crt`, `<name>.key`) in `dir`.
fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
}

/// A leaf certificate `<name>.crt`/`.key` signed by CA `ca`, with `subj`
/// and the subjectAltName `san` (if any).
fn leaf(dir: &Path, ca: &str, name: &str, subj: &str, san: Option<&str>) {
    let mut args: Vec<String> = [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "-keyout".to_string(),
        format!("{name}.key"),
        "-out".to_string(),
        format!("{name}.crt"),
        "-days".to_string(),
        "2".to_string(),
        "-subj".to_string(),
        subj.to_string(),
        "-CA".to_string(),
        format!("{ca}.crt"),
        "-CAkey".to_string(),
        format!("{ca}.key"),
        "-addext".to_string(),
        "basicConstraints=critical,CA:FALSE".to_string(),
    ]);
    if let Some(san) = san {
        args.push("-addext".to_string());
        args.push(format!("subjectAltName={san}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    openssl(dir, &refs);
}

/// The subject of a certificate as `openssl -nameopt RFC2253` prints it.
fn rfc2253_subject(dir: &Path, name: &str) -> String {
    let out = openssl(
        dir,
        &[
            "x509",
            "-in",
            &format!("{name}.crt"),
            "-noout",
            "-subject",
            "-nameopt",
            "RFC2253",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("subject=")
        .to_string()
}

// ---- policies and config ----

/// A policy named `name` that allows `SELECT id FROM app.orders`.
fn policy(name: &str) -> String {
    format!(
        "apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: {name}
dialect: postgres
statements:
  allow: [select]
tables:
  app.orders:
    columns: [id]
"
    )
}

const POLICIES: &[&str] = &[
    "p-token",
    "p-subject",
    "p-dns",
    "p-uri",
    "p-orders",
    "p-reports",
    "p-fixed",
];

fn write_config(dir: &Path, api: SocketAddr, server_extra: &str, auth_extra: &str) -> PathBuf {
    let mut policies = String::new();
    for p in POLICIES {
        write(&dir.join(format!("{p}.yaml")), policy(p));
        policies.push_str(&format!("  - file: {p}.yaml\n"));
    }
    let hash = sha256_hex(TOKEN.as_bytes());
    let config = format!(
        "apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: {api}
{server_extra}  auth:
    tokens:
      - name: static
        policy: p-token
        sha256: {hash}
{auth_extra}policies:
{policies}logging: {{level: debug, format: text}}
audit:
  sinks: [{{type: file, path: {audit}}}]
",
        audit = dir.join("audit.log").display()
    );
    let path = dir.join("config.yaml");
    write(&path, config);
    path
}

struct Serve {
    proc: Proc,
    api: SocketAddr,
}

fn serve(dir: &Path, config: &Path, env: &[(&str, &str)]) -> Serve {
    let api_port = std::fs::read_to_string(config)
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.trim().strip_prefix("listen: ").map(str::to_string))
        })
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no listen address in {}", config.display()));
    let mut proc = serve_proc(config, &dir.join("haltsql.log"), env);
    wait_port(api_port.port(), &mut proc, "haltsql serve", 30);
    Serve {
        proc,
        api: api_port,
    }
}

// ---- mTLS: curl against the TLS listener ----

/// What curl got: `Some((status, body))`, or `None` when no HTTP answer
/// came (the handshake was refused).
fn curl(
    dir: &Path,
    api: SocketAddr,
    cert: Option<&str>,
    bearer: Option<&str>,
) -> Option<(u16, Value)> {
    curl_ca(dir, "ca.crt", api, cert, bearer)
}

/// [`curl`] trusting `cacert` for the server.
fn curl_ca(
    dir: &Path,
    cacert: &str,
    api: SocketAddr,
    cert: Option<&str>,
    bearer: Option<&str>,
) -> Option<(u16, Value)> {
    let mut cmd = Command::new(tool("curl"));
    cmd.current_dir(dir).args([
        "-sS",
        "--max-time",
        "10",
        "--cacert",
        cacert,
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"sql": "SELECT id FROM app.orders"}"#,
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(c) = cert {
        cmd.args(["--cert", &format!("{c}.crt"), "--key", &format!("{c}.key")]);
    }
    if let Some(b) = bearer {
        cmd.args(["-H", &format!("Authorization: Bearer {b}")]);
    }
    cmd.arg(format!("https://127.0.0.1:{}/v1/verify", api.port()));
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn curl: {e}"));
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    let status: u16 = code.trim().parse().ok()?;
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

fn policy_of(answer: Option<(u16, Value)>) -> (u16, String) {
    let (status, body) = answer.unwrap_or_else(|| panic!("no HTTP answer"));
    let p = body
        .get("policy")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    (status, p)
}

struct MtlsSetup {
    dir: tempfile::TempDir,
    subject: String,
}

fn mtls_setup() -> MtlsSetup {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    ca(d, "ca");
    ca(d, "other-ca");
    leaf(
        d,
        "ca",
        "server",
        "/CN=127.0.0.1",
        Some("IP:127.0.0.1,DNS:localhost"),
    );
    leaf(
        d,
        "ca",
        "by-subject",
        "/O=Corp/OU=Data, Analytics/CN=orders-agent",
        None,
    );
    leaf(
        d,
        "ca",
        "by-dns",
        "/CN=dns-agent",
        Some("DNS:agent.corp.example"),
    );
    leaf(
        d,
        "ca",
        "by-uri",
        "/CN=workload",
        Some("URI:spiffe://corp/ns/app/sa/agent"),
    );
    leaf(
        d,
        "ca",
        "stranger",
        "/CN=stranger",
        Some("DNS:stranger.example"),
    );
    // The same names as the trusted ones, from a CA the server does not trust.
    leaf(
        d,
        "other-ca",
        "foreign",
        "/O=Corp/OU=Data, Analytics/CN=orders-agent",
        Some("DNS:agent.corp.example"),
    );
    let subject = rfc2253_subject(d, "by-subject");
    assert_eq!(subject, "CN=orders-agent,OU=Data\\, Analytics,O=Corp");
    MtlsSetup { dir, subject }
}

/// `haltsql serve` on TLS with the set-up's CA for client certificates and
/// an identity of each kind.
fn mtls_serve(s: &MtlsSetup, client_auth: &str) -> Serve {
    let d = s.dir.path();
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let server_extra = format!(
        "  tls:\n    cert_file: {d}/server.crt\n    key_file: {d}/server.key\n    client_ca_file: {d}/ca.crt\n    client_auth: {client_auth}\n",
        d = d.display()
    );
    let auth_extra = format!(
        "    mtls:\n      identities:\n        - {{subject: '{}', policy: p-subject}}\n        - {{dns_name: AGENT.corp.example, policy: p-dns}}\n        - {{uri: 'spiffe://corp/ns/app/sa/agent', policy: p-uri}}\n",
        s.subject
    );
    serve(d, &write_config(d, api, &server_extra, &auth_extra), &[])
}

#[test]
fn a_refused_token_is_answered_401_every_time_over_http2() {
    // Answered before its body was read, a request's HTTP/2 stream ended
    // with RST_STREAM(NO_ERROR), and curl turned about a third of those 401s
    // into a failed transfer (exit 92). The server now reads the body first.
    let s = mtls_setup();
    let d = s.dir.path();
    let srv = mtls_serve(&s, "optional");
    for attempt in 0..40 {
        let answer = curl(d, srv.api, None, Some("wrong"));
        assert_eq!(
            answer.map(|(status, _)| status),
            Some(401),
            "attempt {attempt}"
        );
    }
}

#[test]
fn mtls_optional_maps_certificates_to_policies_and_refuses_foreign_cas() {
    let s = mtls_setup();
    let d = s.dir.path();
    let srv = mtls_serve(&s, "optional");
    let api = srv.api;

    // Each identity kind selects its policy.
    assert_eq!(
        policy_of(curl(d, api, Some("by-subject"), None)),
        (200, "p-subject".into())
    );
    assert_eq!(
        policy_of(curl(d, api, Some("by-dns"), None)),
        (200, "p-dns".into())
    );
    assert_eq!(
        policy_of(curl(d, api, Some("by-uri"), None)),
        (200, "p-uri".into())
    );
    // Optional: no certificate falls back to bearer tokens.
    assert_eq!(
        policy_of(curl(d, api, None, Some(TOKEN))),
        (200, "p-token".into())
    );
    assert_eq!(policy_of(curl(d, api, None, None)).0, 401);
    // A bearer token wins over the certificate; a wrong one is 401 even
    // with a matching certificate.
    assert_eq!(
        policy_of(curl(d, api, Some("by-subject"), Some(TOKEN))),
        (200, "p-token".into())
    );
    assert_eq!(
        policy_of(curl(d, api, Some("by-subject"), Some("wrong"))).0,
        401
    );
    // A trusted certificate that matches no identity carries none.
    assert_eq!(policy_of(curl(d, api, Some("stranger"), None)).0, 401);
    assert_eq!(
        policy_of(curl(d, api, Some("stranger"), Some(TOKEN))),
        (200, "p-token".into())
    );
    // Another CA's certificate is refused at the handshake, token or not.
    assert!(curl(d, api, Some("foreign"), None).is_none());
    assert!(curl(d, api, Some("foreign"), Some(TOKEN)).is_none());

    // The audit events name the identity.
    let audit = std::fs::read_to_string(d.join("audit.log")).unwrap_or_default();
    assert!(
        audit.contains(&format!("mtls:subject={}", s.subject).replace('\\', "\\\\")),
        "{audit}"
    );
    assert!(
        audit.contains("mtls:dns_name=AGENT.corp.example"),
        "{audit}"
    );
    assert!(
        audit.contains("mtls:uri=spiffe://corp/ns/app/sa/agent"),
        "{audit}"
    );
    drop(srv);
}

#[test]
fn mtls_required_refuses_connections_without_a_trusted_certificate() {
    let s = mtls_setup();
    let d = s.dir.path();
    let srv = mtls_serve(&s, "required");
    let api = srv.api;
    assert_eq!(
        policy_of(curl(d, api, Some("by-dns"), None)),
        (200, "p-dns".into())
    );
    assert!(
        curl(d, api, None, Some(TOKEN)).is_none(),
        "no certificate, yet an answer"
    );
    assert!(curl(d, api, Some("foreign"), None).is_none());
    // With a trusted certificate, a token still decides when present.
    assert_eq!(
        policy_of(curl(d, api, Some("stranger"), Some(TOKEN))),
        (200, "p-token".into())
    );
    drop(srv);
}

/// The TLS files as Kubernetes mounts a Secret: links through `..data`,
/// swapped at once.
fn tls_secret(d: &Path, generation: u32, cert: &str, client_ca: &str) {
    let gen_dir = d.join(format!("tls/..gen{generation}"));
    std::fs::create_dir_all(&gen_dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
    for (from, to) in [
        (format!("{cert}.crt"), "tls.crt"),
        (format!("{cert}.key"), "tls.key"),
        (format!("{client_ca}.crt"), "ca.crt"),
    ] {
        std::fs::copy(d.join(from), gen_dir.join(to)).unwrap_or_else(|e| panic!("copy: {e}"));
        let link = d.join("tls").join(to);
        if !link.exists() {
            std::os::unix::fs::symlink(format!("..data/{to}"), &link)
                .unwrap_or_else(|e| panic!("symlink: {e}"));
        }
    }
    swap_data_link(&d.join("tls"), &format!("..gen{generation}"));
}

#[test]
fn mtls_reload_watch_rotates_the_server_certificate_and_the_client_ca() {
    let s = mtls_setup();
    let d = s.dir.path();
    leaf(
        d,
        "other-ca",
        "server2",
        "/CN=127.0.0.1",
        Some("IP:127.0.0.1"),
    );
    tls_secret(d, 1, "server", "ca");
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let t = d.join("tls");
    let server_extra = format!(
        "  tls:\n    cert_file: {t}/tls.crt\n    key_file: {t}/tls.key\n    client_ca_file: {t}/ca.crt\n    client_auth: optional\n",
        t = t.display()
    );
    let auth_extra =
        "    mtls:\n      identities:\n        - {dns_name: agent.corp.example, policy: p-dns}\n";
    let config = write_config(d, api, &server_extra, auth_extra);
    let mut text = std::fs::read_to_string(&config).unwrap_or_default();
    text.push_str("reload: {watch: true}\n");
    write(&config, text);
    let srv = serve(d, &config, &[]);
    assert_eq!(
        policy_of(curl_ca(d, "ca.crt", api, Some("by-dns"), None)),
        (200, "p-dns".into())
    );
    assert!(curl_ca(d, "ca.crt", api, Some("foreign"), None).is_none());

    // The Secret now holds a certificate of the other CA, which also signs
    // the client certificates from now on.
    tls_secret(d, 2, "server2", "other-ca");
    wait_until("the new certificate and client CA", 30, || {
        curl_ca(d, "other-ca.crt", api, Some("foreign"), None).map(|(s, _)| s) == Some(200)
    });
    assert_eq!(
        policy_of(curl_ca(d, "other-ca.crt", api, Some("foreign"), None)),
        (200, "p-dns".into())
    );
    assert!(
        curl_ca(d, "ca.crt", api, Some("by-dns"), None).is_none(),
        "the old server certificate"
    );
    assert!(
        curl_ca(d, "other-ca.crt", api, Some("by-dns"), None).is_none(),
        "the old client CA"
    );
    drop(srv);
}

// ---- OIDC ----

/// The real issuer: mockoidc over HTTPS with a certificate of `ca`.
struct Issuer {
    _proc: Proc,
    issuer: String,
    control: String,
}

fn issuer(d: &Path, name: &str, client_id: &str) -> Issuer {
    issuer_on(d, name, client_id, "127.0.0.1:0")
}

fn issuer_on(d: &Path, name: &str, client_id: &str, listen: &str) -> Issuer {
    let log = d.join(format!("{name}.log"));
    let mut proc = Proc::start(
        Command::new(tool("oidc-issuer")).current_dir(d).args([
            "-cert",
            "server.crt",
            "-key",
            "server.key",
            "-ca",
            "ca.crt",
            "-client-id",
            client_id,
            "-listen",
            listen,
        ]),
        &log,
    );
    let mut info = Value::Null;
    wait_until("the OIDC issuer to start", 30, || {
        proc.assert_running("oidc-issuer");
        info = proc
            .log()
            .lines()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or(Value::Null);
        info.get("control").is_some()
    });
    let s = |k: &str| info[k].as_str().unwrap_or_default().to_string();
    Issuer {
        issuer: s("issuer"),
        control: s("control"),
        _proc: proc,
    }
}

fn get(url: &str) -> String {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("{url}"));
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let addr: SocketAddr = host.parse().unwrap_or_else(|e| panic!("{host}: {e}"));
    let method = if path.starts_with("/rotate") {
        "POST"
    } else {
        "GET"
    };
    let (status, body) = request(addr, method, &path, None, "");
    assert_eq!(status, 200, "{url}: {body}");
    body
}

impl Issuer {
    fn token(&self, sub: &str, policy: &str, shift: &str) -> String {
        get(&format!(
            "{}/token?sub={sub}&policy={policy}&shift={shift}",
            self.control
        ))
    }
}

/// The answer to a verify request with `token`: (status, policy or error).
fn verify(api: SocketAddr, token: &str) -> (u16, String) {
    let (status, body) = request(
        api,
        "POST",
        "/v1/verify",
        Some(token),
        r#"{"sql": "SELECT id FROM app.orders"}"#,
    );
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let what = v
        .get("policy")
        .or_else(|| v.get("error"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    (status, what)
}

fn part(token: &str, i: usize) -> Value {
    let p = token
        .split('.')
        .nth(i)
        .unwrap_or_else(|| panic!("not a JWT: {token}"));
    let raw = B64URL.decode(p).unwrap_or_else(|e| panic!("base64: {e}"));
    serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("json: {e}"))
}

fn enc(v: &Value) -> String {
    B64URL.encode(v.to_string())
}

/// Signs `header.claims` with openssl (`rsa` PEM key, RS256, or `ed25519`).
fn sign(d: &Path, key: &str, header: &Value, claims: &Value) -> String {
    let input = format!("{}.{}", enc(header), enc(claims));
    write(&d.join("signing-input"), &input);
    let out = if header["alg"] == "EdDSA" {
        openssl(
            d,
            &[
                "pkeyutl",
                "-sign",
                "-rawin",
                "-inkey",
                key,
                "-in",
                "signing-input",
            ],
        )
    } else {
        openssl(d, &["dgst", "-sha256", "-sign", key, "signing-input"])
    };
    format!("{input}.{}", B64URL.encode(out.stdout))
}

/// A JWK for the Ed25519 key `key` (PEM) with `kid`.
fn ed25519_jwk(d: &Path, key: &str, kid: &str) -> Value {
    let der = openssl(d, &["pkey", "-in", key, "-pubout", "-outform", "DER"]).stdout;
    let x = &der[der.len() - 32..];
    json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": B64URL.encode(x), "use": "sig"})
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[test]
fn oidc_real_issuer_tokens_forgeries_policy_claims_and_key_rotation() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    ca(d, "ca");
    leaf(d, "ca", "server", "/CN=127.0.0.1", Some("IP:127.0.0.1"));
    let good = issuer(d, "issuer", "haltsql-tests");
    // A second real issuer whose tokens are for another audience.
    let other_aud = issuer(d, "issuer-other", "another-client");
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let auth_extra = format!(
        "    oidc:\n      - {{issuer: '{}', audience: haltsql-tests, policy_claim: haltsql_policy}}\n      - {{issuer: '{}', audience: haltsql-tests, policy: p-fixed}}\n",
        good.issuer, other_aud.issuer
    );
    let config = write_config(d, api, "", &auth_extra);
    let ca_file = d.join("ca.crt");
    let ca_file = ca_file.to_string_lossy();
    let mut srv = serve(d, &config, &[("SSL_CERT_FILE", &ca_file)]);

    // Real tokens: the policy claim selects the policy.
    let alice = good.token("alice", "p-orders", "0s");
    assert_eq!(verify(api, &alice), (200, "p-orders".into()));
    assert_eq!(
        verify(api, &good.token("bob", "p-reports", "0s")),
        (200, "p-reports".into())
    );
    // A valid token naming no loaded policy, or none: 403.
    assert_eq!(verify(api, &good.token("eve", "p-missing", "0s")).0, 403);
    assert_eq!(verify(api, &good.token("carl", "", "0s")).0, 403);
    // Expired (issued 2 h ago, 10 min lifetime) and not yet valid (1 h ahead).
    assert_eq!(verify(api, &good.token("alice", "p-orders", "-2h")).0, 401);
    assert_eq!(verify(api, &good.token("alice", "p-orders", "1h")).0, 401);
    // The other issuer's real token is for another audience.
    let wrong_aud = other_aud.token("alice", "p-orders", "0s");
    assert_eq!(part(&wrong_aud, 1)["aud"], json!(["another-client"]));
    assert_eq!(verify(api, &wrong_aud).0, 401);
    // Static tokens keep working beside OIDC.
    assert_eq!(verify(api, TOKEN), (200, "p-token".into()));

    // Forgeries built from the real token.
    let header = part(&alice, 0);
    let claims = part(&alice, 1);
    let sig = alice.rsplit('.').next().unwrap_or_default();
    let mut raised = claims.clone();
    raised["haltsql_policy"] = json!("p-reports");
    assert_eq!(
        verify(api, &format!("{}.{}.{sig}", enc(&header), enc(&raised))).0,
        401,
        "edited claims"
    );
    let none = json!({"alg": "none", "typ": "JWT", "kid": header["kid"]});
    assert_eq!(
        verify(api, &format!("{}.{}.", enc(&none), enc(&claims))).0,
        401,
        "alg none"
    );
    // HS256 keyed with the issuer's public key (as its JWKS publishes it).
    let jwks_doc = run(Command::new(tool("curl")).current_dir(d).args([
        "-sS",
        "--cacert",
        "ca.crt",
        &format!("{}/.well-known/jwks.json", good.issuer),
    ]))
    .stdout;
    let jwks: Value = serde_json::from_slice(&jwks_doc).unwrap_or(Value::Null);
    let n = B64URL
        .decode(jwks["keys"][0]["n"].as_str().unwrap_or_default())
        .unwrap_or_default();
    assert!(n.len() >= 256, "RSA modulus: {jwks}");
    for secret in [jwks_doc.as_slice(), n.as_slice()] {
        let hs = json!({"alg": "HS256", "typ": "JWT", "kid": header["kid"]});
        let input = format!("{}.{}", enc(&hs), enc(&claims));
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap_or_else(|e| panic!("{e}"));
        mac.update(input.as_bytes());
        let t = format!("{input}.{}", B64URL.encode(mac.finalize().into_bytes()));
        assert_eq!(verify(api, &t).0, 401, "HS256 with the public key");
    }
    // The same claims and kid, signed by another RSA key.
    openssl(d, &["genrsa", "-out", "attacker.pem", "2048"]);
    let t = sign(d, "attacker.pem", &header, &claims);
    assert_eq!(verify(api, &t).0, 401, "another key");
    // The issuer's own token under an issuer this server does not know.
    let mut foreign = claims.clone();
    foreign["iss"] = json!("https://127.0.0.1:1/oidc");
    let t = sign(d, "attacker.pem", &header, &foreign);
    assert_eq!(verify(api, &t).0, 401, "unknown issuer");
    assert_eq!(
        verify(api, &alice),
        (200, "p-orders".into()),
        "the real token still works"
    );

    // Key rotation: the issuer signs with a new key; the server refreshes
    // its keys on the unknown kid (at most once per 10 s) and accepts it.
    let new_kid = get(&format!("{}/rotate", good.control));
    let rotated = good.token("alice", "p-reports", "0s");
    assert_eq!(part(&rotated, 0)["kid"], json!(new_kid));
    wait_until("the rotated key to be accepted", 40, || {
        verify(api, &rotated) == (200, "p-reports".into())
    });
    // The old key is gone from the issuer's JWKS, so is its token.
    assert_eq!(verify(api, &alice).0, 401);
    srv.proc.assert_running("haltsql serve");
    let log = srv.proc.log();
    assert!(log.contains("OIDC keys loaded"), "{log}");
    drop(srv);
}

#[test]
fn oidc_jwks_file_as_content_and_as_a_path_that_rotates() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    for k in ["k1", "k2", "k3"] {
        openssl(
            d,
            &[
                "genpkey",
                "-algorithm",
                "ed25519",
                "-out",
                &format!("{k}.pem"),
            ],
        );
    }
    let jwk1 = ed25519_jwk(d, "k1.pem", "k1");
    let jwk2 = ed25519_jwk(d, "k2.pem", "k2");
    let jwk3 = ed25519_jwk(d, "k3.pem", "k3");
    // The operator's way: a Secret file whose content the placeholder reads.
    write(
        &d.join("secret-jwks.json"),
        json!({"keys": [jwk1]}).to_string(),
    );
    write(
        &d.join("rotating-jwks.json"),
        json!({"keys": [jwk2]}).to_string(),
    );
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let auth_extra = format!(
        "    oidc:\n      - {{issuer: 'https://content.example', audience: haltsql, policy: p-fixed, jwks_file: '${{file:{d}/secret-jwks.json}}'}}\n      - {{issuer: 'https://path.example', audience: haltsql, policy_claim: pol, jwks_file: {d}/rotating-jwks.json}}\n",
        d = d.display()
    );
    let config = write_config(d, api, "", &auth_extra);
    let srv = serve(d, &config, &[]);

    let t = |kid: &str, key: &str, claims: Value| {
        sign(
            d,
            key,
            &json!({"alg": "EdDSA", "typ": "JWT", "kid": kid}),
            &claims,
        )
    };
    let n = now();
    let content = |extra: Value| {
        let mut c = json!({"iss": "https://content.example", "sub": "svc", "aud": "haltsql", "exp": n + 300, "iat": n});
        if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                c.insert(k.clone(), v.clone());
            }
        }
        c
    };
    assert_eq!(
        verify(api, &t("k1", "k1.pem", content(json!({})))),
        (200, "p-fixed".into())
    );
    // aud as an array holding ours.
    assert_eq!(
        verify(
            api,
            &t("k1", "k1.pem", content(json!({"aud": ["x", "haltsql"]})))
        ),
        (200, "p-fixed".into())
    );
    assert_eq!(
        verify(api, &t("k1", "k1.pem", content(json!({"aud": ["x"]})))).0,
        401
    );
    // Within the 60 s skew, and past it.
    assert_eq!(
        verify(api, &t("k1", "k1.pem", content(json!({"exp": n - 20})))).0,
        200
    );
    assert_eq!(
        verify(api, &t("k1", "k1.pem", content(json!({"exp": n - 120})))).0,
        401
    );
    assert_eq!(
        verify(api, &t("k1", "k1.pem", content(json!({"nbf": n + 600})))).0,
        401
    );
    // No exp at all.
    let mut no_exp = content(json!({}));
    no_exp.as_object_mut().map(|o| o.remove("exp"));
    assert_eq!(verify(api, &t("k1", "k1.pem", no_exp)).0, 401);
    // Signed by a key of the other entry's issuer: wrong key for this issuer.
    assert_eq!(verify(api, &t("k1", "k2.pem", content(json!({})))).0, 401);

    // The path entry: policy_claim, then a key added to the file later.
    let path_claims = json!({"iss": "https://path.example", "sub": "job", "aud": "haltsql", "exp": n + 300, "pol": "p-reports"});
    assert_eq!(
        verify(api, &t("k2", "k2.pem", path_claims.clone())),
        (200, "p-reports".into())
    );
    let by_k3 = t("k3", "k3.pem", path_claims.clone());
    assert_eq!(verify(api, &by_k3).0, 401);
    let tmp = d.join("rotating-jwks.tmp");
    write(&tmp, json!({"keys": [jwk2, jwk3]}).to_string());
    std::fs::rename(&tmp, d.join("rotating-jwks.json")).unwrap_or_else(|e| panic!("rename: {e}"));
    wait_until("the added key to be accepted", 40, || {
        verify(api, &by_k3) == (200, "p-reports".into())
    });
    drop(srv);
}

#[test]
fn oidc_unreadable_jwks_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    write(
        &d.join("jwks.json"),
        r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#,
    );
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let auth_extra = format!(
        "    oidc:\n      - {{issuer: 'https://id.example', audience: haltsql, policy: p-fixed, jwks_file: {}/jwks.json}}\n",
        d.display()
    );
    let config = write_config(d, api, "", &auth_extra);
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server.auth.oidc[0]") && err.contains("no usable signing key"),
        "{err}"
    );
}

#[test]
fn oidc_issuer_unreachable_is_503_until_it_answers() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    ca(d, "ca");
    leaf(d, "ca", "server", "/CN=127.0.0.1", Some("IP:127.0.0.1"));
    let port = free_port();
    let iss = format!("https://127.0.0.1:{port}/oidc");
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let auth_extra = format!(
        "    oidc:\n      - {{issuer: '{iss}', audience: haltsql-tests, policy: p-fixed}}\n"
    );
    let config = write_config(d, api, "", &auth_extra);
    let ca_file = d.join("ca.crt");
    let ca_file = ca_file.to_string_lossy();
    let srv = serve(d, &config, &[("SSL_CERT_FILE", &ca_file)]);
    let shaped = format!(
        "{}.{}.{}",
        enc(&json!({"alg": "RS256", "kid": "k"})),
        enc(&json!({"iss": iss, "aud": "haltsql-tests", "exp": now() + 300})),
        B64URL.encode([0u8; 256])
    );
    let (status, body) = request(
        api,
        "POST",
        "/v1/verify",
        Some(&shaped),
        r#"{"sql": "SELECT id FROM app.orders"}"#,
    );
    assert_eq!(status, 503, "{body}");
    // The issuer comes up: its keys are fetched and its tokens accepted.
    let up = issuer_on(d, "issuer", "haltsql-tests", &format!("127.0.0.1:{port}"));
    assert_eq!(up.issuer, iss);
    let token = up.token("alice", "", "0s");
    wait_until("the issuer's keys", 40, || {
        verify(api, &token) == (200, "p-fixed".into())
    });
    assert_eq!(verify(api, &shaped).0, 401);
    drop(srv);
}
