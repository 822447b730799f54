//! The helpers of the tests that run the real `haltsql` binary against real
//! peers on loopback, kept in one place so that a fix (a timeout, a log that
//! a failure should show) reaches every test at once. Included with
//! `#[path = "common/kit.rs"] mod kit;`.

// Every test binary includes the whole kit but uses only part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const BIN: &str = env!("CARGO_BIN_EXE_haltsql");

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("no workspace root"))
}

/// A peer binary from bin/: fails, not skips, when it is missing, so a
/// machine without the peers cannot pass the tests by testing nothing.
pub fn tool(name: &str) -> PathBuf {
    let p = repo_root().join("bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run hack/install-peers.sh (make test does)",
        p.display()
    );
    p
}

/// A port nothing listens on, so that tests can run in parallel.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("free port: {e}"))
}

/// Writes `content`, making the parent folders first.
pub fn write(path: &Path, content: impl AsRef<[u8]>) {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
    }
    std::fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Replaces a file atomically (as a publisher, or the kubelet for a
/// Secret's files, does), so a watcher never reads half a file.
pub fn publish(path: &Path, content: impl AsRef<[u8]>) {
    let tmp = path.with_extension("publishing");
    write(&tmp, content);
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename: {e}"));
}

/// Points `dir/..data` at `target` in one rename, as the kubelet swaps a
/// ConfigMap's or a Secret's files: a watcher sees the old set or the new.
pub fn swap_data_link(dir: &Path, target: &str) {
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap_or_else(|e| panic!("symlink: {e}"));
    std::fs::rename(&tmp, dir.join("..data")).unwrap_or_else(|e| panic!("swap: {e}"));
}

pub fn mkdir(d: &Path) -> PathBuf {
    std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{e}"));
    d.to_path_buf()
}

/// Runs a set-up command; a failure shows its output, since that is all
/// there is to tell why.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// A child process, killed (by its pid) when dropped, so that a failing
/// test leaves no peer behind.
pub struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with its output appended to `log`: a peer restarted on
    /// the same log keeps what it wrote before, for the failure message.
    pub fn start(cmd: &mut Command, log: &Path) -> Proc {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("log: {e}"));
        let f2 = f.try_clone().unwrap_or_else(|e| panic!("log: {e}"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Proc {
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then the exit code: what a graceful shutdown does is part
    /// of what is tested.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        // Our own child, not yet reaped: its pid cannot have been reused.
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Fails at once with the log when the process died, rather than
    /// after a wait for something it can no longer do.
    pub fn assert_running(&mut self, what: &str) {
        if let Some(c) = &mut self.child
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!("{what} exited with {status}:\n{}", self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `p` accepts connections on the loopback `port`.
pub fn wait_port(port: u16, p: &mut Proc, what: &str, secs: u64) {
    wait_until(what, secs, || {
        p.assert_running(what);
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

// ---- haltsql serve ----

/// Starts `haltsql serve --config config` with `env`, its output in `log`.
pub fn serve_proc(config: &Path, log: &Path, env: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"]).arg(config);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::start(&mut cmd, log)
}

/// Waits until `/readyz` on `health` answers 200; a server that is never
/// ready fails with its last answer and its log.
pub fn wait_ready(p: &mut Proc, health: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        p.assert_running("haltsql serve");
        let readyz = http_text(health, "GET", "/readyz", None, "");
        if let Some((200, _)) = readyz {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "haltsql serve not ready: {readyz:?}\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---- plain HTTP/1.1 ----

/// One plain HTTP/1.1 request with `headers` (each ending in `\r\n`):
/// (status, body), None when no answer came. A small client of our own,
/// so that what is sent is exactly what the test says.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}");
    if method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Some((status, body))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
}

/// [`http`] as the API's clients call it: an optional bearer token, a
/// JSON body on POST, a text answer.
pub fn http_text(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> Option<(u16, String)> {
    let mut headers = String::new();
    if let Some(b) = bearer {
        headers.push_str(&format!("Authorization: Bearer {b}\r\n"));
    }
    if method == "POST" {
        headers.push_str("Content-Type: application/json\r\n");
    }
    let (status, body) = http(addr, method, path, &headers, body.as_bytes())?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`http_text`] where an answer is certain: no answer fails the test.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> (u16, String) {
    http_text(addr, method, path, bearer, body)
        .unwrap_or_else(|| panic!("{method} {addr}{path}: no HTTP answer"))
}

// ---- a test CA (the openssl CLI) ----

/// A CA and a server certificate for localhost and 127.0.0.1, made by the
/// real openssl, as an operator would make them.
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    dir: PathBuf,
}

/// Makes the CA (common name `ca_name`) and the server certificate in
/// `dir/pki`.
pub fn pki(dir: &Path, ca_name: &str) -> Pki {
    let d = mkdir(&dir.join("pki"));
    let ca = d.join("ca.crt");
    run(Command::new(tool("openssl"))
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", &format!("/CN={ca_name}")])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(d.join("ca.key"))
        .arg("-out")
        .arg(&ca));
    let mut pki = Pki {
        ca,
        cert: PathBuf::new(),
        key: PathBuf::new(),
        dir: d,
    };
    (pki.cert, pki.key) = pki.issue(
        "srv",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        2,
    );
    pki
}

impl Pki {
    /// A key and a certificate signed by the CA (`name.key`, `name.crt`
    /// beside it) with subject `subj`, the extensions `ext` (an openssl
    /// extfile) and serial number `serial`: (certificate, key).
    pub fn issue(&self, name: &str, subj: &str, ext: &str, serial: u32) -> (PathBuf, PathBuf) {
        let openssl = tool("openssl");
        let d = &self.dir;
        let (cert, key) = (d.join(format!("{name}.crt")), d.join(format!("{name}.key")));
        let (csr, cnf) = (d.join(format!("{name}.csr")), d.join(format!("{name}.cnf")));
        run(Command::new(&openssl)
            .args([
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-subj", subj])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr));
        write(&cnf, ext);
        run(Command::new(&openssl)
            .args(["x509", "-req", "-days", "2", "-set_serial"])
            .arg(serial.to_string())
            .arg("-in")
            .arg(&csr)
            .arg("-CA")
            .arg(&self.ca)
            .arg("-CAkey")
            .arg(d.join("ca.key"))
            .arg("-extfile")
            .arg(&cnf)
            .arg("-out")
            .arg(&cert));
        (cert, key)
    }
}

// ---- peers more than one test file starts ----

/// Debian's nginx in the foreground, everything it writes under
/// `dir/nginx`, with `servers` (`server {}` blocks, and any other
/// directive of the `http` block) as the test's part of the config.
/// The caller waits for its ports: only it knows them.
pub fn nginx(dir: &Path, servers: &str) -> Proc {
    let n = mkdir(&dir.join("nginx"));
    let conf = format!(
        "daemon off;
master_process off;
worker_processes 1;
pid {n}/nginx.pid;
error_log {n}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log {n}/access.log;
  client_body_temp_path {n}/body;
  proxy_temp_path {n}/proxy;
  fastcgi_temp_path {n}/fastcgi;
  uwsgi_temp_path {n}/uwsgi;
  scgi_temp_path {n}/scgi;
{servers}}}
",
        n = n.display(),
    );
    write(&n.join("nginx.conf"), conf);
    Proc::start(
        Command::new(tool("nginx"))
            .arg("-p")
            .arg(&n)
            .arg("-e")
            .arg(n.join("error.log"))
            .arg("-c")
            .arg(n.join("nginx.conf")),
        &dir.join("nginx.log"),
    )
}

/// s3s-fs serving the folder `dir/s3` (a bucket is a subfolder) on `port`
/// with one access key; returns once it listens.
pub fn start_s3s(dir: &Path, port: u16, access: &str, secret: &str) -> Proc {
    let mut p = Proc::start(
        Command::new(tool("s3s-fs"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", access, "--secret-key", secret])
            .arg(dir.join("s3")),
        &dir.join("s3s-fs.log"),
    );
    wait_port(port, &mut p, "s3s-fs", 30);
    p
}
