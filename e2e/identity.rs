//! Key material for the identity step, made with the openssl command line
//! (installed by `hack/install-peers.sh`): a CA with a server and a client
//! certificate, a foreign CA with its own client certificate, and RS256 JWTs
//! with the JWKS that verifies them. Requests go through curl, a real TLS
//! client.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The DNS name of the client certificate, mapped to a policy by the server.
pub const CLIENT_DNS: &str = "orders-agent.e2e.haltsql.test";
pub const ISSUER: &str = "https://issuer.e2e.haltsql.test";
pub const AUDIENCE: &str = "haltsql-e2e";

fn openssl(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}; run `make peers`"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Certificates and keys in `dir`: `ca.crt`, `server.{crt,key}`,
/// `client.{crt,key}` (from the CA), `foreign.{crt,key}` (another CA).
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let dir = dir.join("pki");
        std::fs::create_dir_all(&dir).expect("pki folder");
        for ca in ["ca", "foreign-ca"] {
            openssl(
                &dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.crt"),
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN=haltsql e2e {ca}"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            );
        }
        let leaf = |name: &str, ca: &str, ext: &str| {
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("extension file");
            openssl(
                &dir,
                &[
                    "req",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={name}"),
                ],
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{ca}.crt"),
                    "-CAkey",
                    &format!("{ca}.key"),
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &format!("{name}.crt"),
                    "-extfile",
                    &format!("{name}.ext"),
                ],
            );
        };
        leaf(
            "server",
            "ca",
            "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        let client = format!(
            "basicConstraints=CA:FALSE\nsubjectAltName=DNS:{CLIENT_DNS}\nextendedKeyUsage=clientAuth\n"
        );
        leaf("client", "ca", &client);
        leaf("foreign", "foreign-ca", &client);
        Pki { dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// An RS256 signing key and its JWKS.
pub struct JwtKey {
    dir: PathBuf,
    kid: String,
}

impl JwtKey {
    pub fn new(dir: &Path, kid: &str) -> Self {
        let dir = dir.join(format!("jwt-{kid}"));
        std::fs::create_dir_all(&dir).expect("jwt folder");
        openssl(
            &dir,
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "key.pem",
            ],
        );
        JwtKey {
            dir,
            kid: kid.to_owned(),
        }
    }

    /// `{"keys": [...]}` with this key's public half.
    pub fn jwks(&self) -> String {
        let out = String::from_utf8(openssl(
            &self.dir,
            &["rsa", "-in", "key.pem", "-noout", "-modulus"],
        ))
        .expect("modulus");
        let modulus = out
            .trim()
            .strip_prefix("Modulus=")
            .expect("openssl prints Modulus=");
        let n = base64url(&self.dir, &hex::decode(modulus).expect("hex modulus"));
        serde_json::json!({
            "keys": [{"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256", "n": n, "e": "AQAB"}]
        })
        .to_string()
    }

    /// A signed token for `audience`, valid for ten minutes.
    pub fn token(&self, audience: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": self.kid});
        let claims = serde_json::json!({
            "iss": ISSUER, "aud": audience, "sub": "e2e-agent", "iat": now, "exp": now + 600
        });
        let input = format!(
            "{}.{}",
            base64url(&self.dir, header.to_string().as_bytes()),
            base64url(&self.dir, claims.to_string().as_bytes())
        );
        std::fs::write(self.dir.join("input"), &input).expect("signing input");
        openssl(
            &self.dir,
            &[
                "dgst", "-sha256", "-sign", "key.pem", "-out", "sig", "input",
            ],
        );
        let sig = std::fs::read(self.dir.join("sig")).expect("signature");
        format!("{input}.{}", base64url(&self.dir, &sig))
    }
}

fn base64url(dir: &Path, bytes: &[u8]) -> String {
    std::fs::write(dir.join("b64-in"), bytes).expect("base64 input");
    let out = String::from_utf8(openssl(dir, &["base64", "-A", "-in", "b64-in"])).expect("base64");
    out.trim()
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// What curl got: the HTTP status (0 when no response) and the body or error.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// `POST /v1/verify` over TLS to `port` on loopback, trusting `ca.crt`, with
/// an optional client certificate (`client` or `foreign`) and bearer token.
pub fn verify(pki: &Pki, port: u16, cert: Option<&str>, token: Option<&str>, sql: &str) -> Answer {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "--cacert", &pki.path("ca.crt")])
        .args([
            "-H",
            "Content-Type: application/json",
            "-w",
            "\n%{http_code}",
        ])
        .args(["-d", &serde_json::json!({ "sql": sql }).to_string()]);
    if let Some(name) = cert {
        cmd.args(["--cert", &pki.path(&format!("{name}.crt"))])
            .args(["--key", &pki.path(&format!("{name}.key"))]);
    }
    if let Some(token) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    cmd.args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .arg(format!("https://localhost:{port}/v1/verify"));
    let out = cmd.output().unwrap_or_else(|e| panic!("curl: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    Answer {
        status: code.trim().parse().unwrap_or(0),
        body: if out.status.success() {
            body.to_owned()
        } else {
            format!(
                "curl exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        },
    }
}

/// Files under `dir` (recursively) and their contents.
pub fn files_under(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap_or_default()));
            }
        }
    }
    out
}
