//! A signed policy bundle served to real pods: an S3 server (s3s-fs, from
//! `hack/install-peers.sh`) on the node's address, which the pods reach
//! directly, and bundles made with the real `haltsql bundle` commands.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use haltsql_testkit::paths::{haltsql_bin, repo_root};

/// The node's InternalIP (hack/cluster-node.sh): a host address the pods reach.
pub const NODE_IP: &str = "198.19.0.1";
pub const BUCKET: &str = "policies";
pub const KEY: &str = "prod/bundle.tar.gz";
pub const ACCESS_KEY: &str = "haltsql-e2e-access";

/// A running s3s-fs on `NODE_IP`, stopped by its pid when dropped.
pub struct S3Peer {
    child: Option<Child>,
    pub port: u16,
    pub secret_key: String,
    data: PathBuf,
    log: PathBuf,
}

impl S3Peer {
    /// Starts s3s-fs on a folder `dir/name` holding the (empty) `buckets`.
    pub fn start(dir: &Path, name: &str, secret_key: &str, buckets: &[&str]) -> Self {
        let data = dir.join(name);
        for bucket in buckets {
            std::fs::create_dir_all(data.join(bucket)).expect("s3 bucket folder");
        }
        let port = TcpListener::bind((NODE_IP, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port on {NODE_IP} (is the node up?): {e}"));
        let log = dir.join(format!("{name}.log"));
        let mut peer = S3Peer {
            child: None,
            port,
            secret_key: secret_key.to_owned(),
            data,
            log,
        };
        peer.spawn();
        peer
    }

    fn spawn(&mut self) {
        let tool = repo_root().join("bin/s3s-fs");
        let log = std::fs::File::create(&self.log).expect("s3s-fs log");
        let child = Command::new(&tool)
            .args(["--host", NODE_IP, "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", &self.secret_key])
            .arg(&self.data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}; run `make peers` first", tool.display()));
        self.child = Some(child);
        let addr: SocketAddr = format!("{NODE_IP}:{}", self.port)
            .parse()
            .expect("socket address");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "s3s-fs did not listen on {addr}: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The endpoint as the pods see it.
    pub fn endpoint(&self) -> String {
        format!("http://{NODE_IP}:{}", self.port)
    }

    /// Publishes an archive and its signature the way the haltsql README
    /// says: the signature first, then the archive (each written atomically).
    pub fn publish(&self, archive: &Path) {
        let object = self.data.join(BUCKET).join(KEY);
        std::fs::create_dir_all(object.parent().expect("object folder")).expect("object folder");
        for (from, to) in [
            (sig_path(archive), sig_path(&object)),
            (archive.to_path_buf(), object),
        ] {
            let tmp = to.with_extension("partial");
            std::fs::copy(&from, &tmp).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
            std::fs::rename(&tmp, &to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
        }
    }

    /// The folder of `bucket`'s objects.
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        self.data.join(bucket)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for S3Peer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn sig_path(archive: &Path) -> PathBuf {
    let mut name = archive.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}

/// A signing key made by `haltsql bundle keygen`.
pub struct Signer {
    dir: PathBuf,
    pub public_pem: String,
}

impl Signer {
    pub fn new(dir: &Path) -> Self {
        let dir = dir.join("bundle");
        std::fs::create_dir_all(&dir).expect("bundle folder");
        haltsql(
            &dir,
            &[
                "bundle",
                "keygen",
                "--private-key",
                "bundle.key",
                "--public-key",
                "bundle.pub",
            ],
        );
        let public_pem = std::fs::read_to_string(dir.join("bundle.pub")).expect("bundle.pub");
        Signer { dir, public_pem }
    }

    /// Builds and signs a bundle of one policy document; returns the archive.
    pub fn bundle(&self, revision: &str, policy_document: &str) -> PathBuf {
        let src = self.dir.join(format!("src-{revision}"));
        std::fs::create_dir_all(&src).expect("bundle source folder");
        std::fs::write(src.join("orders.yaml"), policy_document).expect("policy file");
        let archive = format!("bundle-{revision}.tar.gz");
        let src_name = format!("src-{revision}");
        haltsql(
            &self.dir,
            &[
                "bundle",
                "build",
                &src_name,
                "-o",
                &archive,
                "--revision",
                revision,
            ],
        );
        haltsql(
            &self.dir,
            &["bundle", "sign", "--key", "bundle.key", &archive],
        );
        self.dir.join(archive)
    }
}

fn haltsql(dir: &Path, args: &[&str]) {
    let out = Command::new(haltsql_bin())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run haltsql");
    assert!(
        out.status.success(),
        "haltsql {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
