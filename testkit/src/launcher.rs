//! The operator as a child process: its command line, built in one place,
//! and a running process with its endpoints and logs.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::Cluster;
use crate::http;
use crate::net::free_port;
use crate::paths::haltsql_bin;
use crate::prometheus::Metrics;
use crate::wait::eventually;

/// The operator's command line: the flags every harness passes.
#[derive(Clone, Debug)]
pub struct Flags {
    pub haltsql_binary: PathBuf,
    pub namespaces: Vec<String>,
    pub metrics_port: u16,
    pub health_port: u16,
    pub leader_election_namespace: Option<String>,
    pub extra_args: Vec<String>,
}

impl Flags {
    /// Endpoints on two loopback ports that were free a moment ago.
    pub fn new(haltsql_binary: PathBuf, namespaces: &[String]) -> std::io::Result<Self> {
        Ok(Flags {
            haltsql_binary,
            namespaces: namespaces.to_vec(),
            metrics_port: free_port()?,
            health_port: free_port()?,
            leader_election_namespace: None,
            extra_args: Vec::new(),
        })
    }

    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--haltsql-binary={}", self.haltsql_binary.display()),
            format!("--metrics-bind-address=127.0.0.1:{}", self.metrics_port),
            format!("--health-probe-bind-address=127.0.0.1:{}", self.health_port),
            format!("--watch-namespaces={}", self.namespaces.join(",")),
        ];
        args.extend(self.extra_args.iter().cloned());
        if let Some(ns) = &self.leader_election_namespace {
            args.push("--leader-elect".to_owned());
            args.push(format!("--leader-election-namespace={ns}"));
        }
        args
    }
}

/// How to start one operator process in a test.
pub struct Options {
    /// The `haltsql-operator` binary (`CARGO_BIN_EXE_haltsql-operator`).
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
    pub namespaces: Vec<String>,
    pub leader_election_namespace: Option<String>,
    pub haltsql_binary: PathBuf,
    pub rust_log: String,
    pub extra_args: Vec<String>,
    /// Environment variables on top of the minimal one (`TMPDIR`, say).
    pub env: Vec<(String, String)>,
}

impl Options {
    /// Admin credentials on the full cluster, watching `namespaces`.
    pub fn new(binary: PathBuf, namespaces: &[&str]) -> Self {
        Options {
            binary,
            kubeconfig: Cluster::Full.kubeconfig(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            leader_election_namespace: None,
            haltsql_binary: haltsql_bin(),
            // HALTSQL_TEST_OPERATOR_LOG overrides the operator's RUST_LOG when debugging.
            rust_log: std::env::var("HALTSQL_TEST_OPERATOR_LOG")
                .unwrap_or_else(|_| "info,haltsql_operator=debug".to_owned()),
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn leader_elect(mut self, namespace: &str) -> Self {
        self.leader_election_namespace = Some(namespace.to_owned());
        self
    }
}

/// A running `haltsql-operator` with its endpoints on loopback ports and its
/// logs (stderr) in a file. Killed when dropped; its log's tail is printed
/// when a test panics.
pub struct OperatorProcess {
    pub child: Child,
    pub metrics_port: u16,
    pub health_port: u16,
    pub log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl OperatorProcess {
    pub fn start(options: &Options) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let log_path = dir.path().join("operator.log");
        let log = std::fs::File::create(&log_path).expect("operator log file");
        let mut flags = Flags::new(options.haltsql_binary.clone(), &options.namespaces)
            .expect("free loopback ports");
        flags.leader_election_namespace = options.leader_election_namespace.clone();
        flags.extra_args = options.extra_args.clone();
        let child = Command::new(&options.binary)
            .args(flags.args())
            .env_clear()
            .env("KUBECONFIG", &options.kubeconfig)
            .env("RUST_LOG", &options.rust_log)
            .env("HOME", dir.path())
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the operator binary starts");
        OperatorProcess {
            child,
            metrics_port: flags.metrics_port,
            health_port: flags.health_port,
            log_path,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The log lines, parsed (they are JSON: stderr is not a terminal).
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        self.logs()
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"))
            })
            .collect()
    }

    /// The `/metrics` response; `None` while nothing answers.
    pub async fn metrics_response(&self) -> Option<http::Response> {
        http::get_local(self.metrics_port, "/metrics").await.ok()
    }

    /// The `/metrics` text; `None` while nothing answers 200.
    pub async fn metrics_text(&self) -> Option<String> {
        self.metrics_response()
            .await
            .filter(|r| r.status == 200)
            .map(|r| r.body)
    }

    /// The scraped metrics, panicking if the endpoint does not answer.
    pub async fn metrics(&self) -> Metrics {
        match self.metrics_text().await {
            Some(text) => Metrics(text),
            None => panic!("/metrics does not answer; operator logs:\n{}", self.logs()),
        }
    }

    /// Status code of `GET path` on the health port.
    pub async fn health(&self, path: &str) -> Option<u16> {
        http::get_local(self.health_port, path)
            .await
            .ok()
            .map(|r| r.status)
    }

    /// The exit status, if the process has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("waitpid on our own child")
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kill -SIGNAL` of this process (by the pid we started).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Waits until `/metrics` answers.
    pub async fn wait_serving(&self) {
        eventually("/metrics to answer", Duration::from_secs(30), || async {
            self.metrics_text().await.map(|_| ())
        })
        .await;
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // The whole log outlives the test's temporary directory.
            let kept = std::env::temp_dir().join(format!("haltsql-operator-{}.log", self.pid()));
            let _ = std::fs::copy(&self.log_path, &kept);
            eprintln!(
                "---- operator {} logs (all in {}) ----\n{}",
                self.pid(),
                kept.display(),
                tail(&self.logs(), 40)
            );
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
