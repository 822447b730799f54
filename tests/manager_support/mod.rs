//! Helpers for the manager tests: the real `haltsql-operator` binary as a
//! child process against the full local cluster, its HTTP endpoints, a
//! Prometheus text parser, the guide's quick start, and RBAC-limited
//! kubeconfigs that impersonate a ServiceAccount.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::support;

/// The quick start of the guide: the token Secret, the policy and the server.
/// `NAMESPACE` is replaced by the test's namespace.
pub const QUICKSTART_SECRET: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: haltsql-tokens
  namespace: NAMESPACE
stringData:
  orders-agent.sha256: "SECRET_VALUE"
"#;

pub const QUICKSTART_POLICY: &str = r#"
apiVersion: haltsql.dev/v1alpha1
kind: HaltSQLPolicy
metadata:
  name: orders
  namespace: NAMESPACE
spec:
  policy: |
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
"#;

pub const QUICKSTART_SERVER: &str = r#"
apiVersion: haltsql.dev/v1alpha1
kind: HaltSQLServer
metadata:
  name: haltsql
  namespace: NAMESPACE
spec:
  replicas: 2
  image: ghcr.io/haltsql/haltsql:0.0.1
  policies:
    - name: orders
  auth:
    tokens:
      - name: orders-agent
        policy: orders-agent          # metadata.name inside the policy document
        sha256SecretRef: { name: haltsql-tokens, key: orders-agent.sha256 }
  podDisruptionBudget:
    enabled: true
  networkPolicy:
    enabled: true
    ingressFrom:
      - podSelector: { matchLabels: { app: orders-agent } }
"#;

/// Applies YAML (several documents allowed) with the admin kubeconfig.
pub fn kubectl_apply(yaml: &str) {
    let mut child = support::kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply failed:\n{}\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Applies the quick start (policy and server; the Secret too when `secret`
/// is given) in `namespace`.
pub fn apply_quickstart(namespace: &str, secret: Option<&str>) {
    let mut yaml = String::new();
    if let Some(value) = secret {
        yaml.push_str(&QUICKSTART_SECRET.replace("SECRET_VALUE", value));
        yaml.push_str("---\n");
    }
    yaml.push_str(QUICKSTART_POLICY);
    yaml.push_str("---\n");
    yaml.push_str(QUICKSTART_SERVER);
    kubectl_apply(&yaml.replace("NAMESPACE", namespace));
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The operator binary built with these tests.
pub fn operator_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_haltsql-operator"))
}

/// How to start one operator process.
pub struct Options {
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
    pub fn new(namespaces: &[&str]) -> Self {
        Options {
            kubeconfig: support::Cluster::Full.kubeconfig(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            leader_election_namespace: None,
            haltsql_binary: support::haltsql_bin(),
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
/// logs (stderr) in a file. Killed when dropped.
pub struct OperatorProcess {
    pub child: Child,
    pub metrics_port: u16,
    pub health_port: u16,
    pub log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl OperatorProcess {
    pub fn start(options: &Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("operator.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let metrics_port = free_port();
        let health_port = free_port();
        let mut cmd = Command::new(operator_bin());
        cmd.arg(format!(
            "--haltsql-binary={}",
            options.haltsql_binary.display()
        ))
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
        .arg(format!(
            "--health-probe-bind-address=127.0.0.1:{health_port}"
        ))
        .arg(format!(
            "--watch-namespaces={}",
            options.namespaces.join(",")
        ))
        .args(&options.extra_args)
        .env_clear()
        .env("KUBECONFIG", &options.kubeconfig)
        .env("RUST_LOG", &options.rust_log)
        .env("HOME", dir.path())
        .envs(options.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        if let Some(ns) = &options.leader_election_namespace {
            cmd.arg("--leader-elect")
                .arg(format!("--leader-election-namespace={ns}"));
        }
        let child = cmd.spawn().expect("the operator binary starts");
        OperatorProcess {
            child,
            metrics_port,
            health_port,
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

    /// `GET path` on the metrics port; `None` while nothing answers.
    pub fn metrics_text(&self) -> Option<String> {
        http_get(self.metrics_port, "/metrics")
            .filter(|(status, _, _)| *status == 200)
            .map(|(_, _, body)| body)
    }

    /// The scraped metrics, panicking if the endpoint does not answer.
    pub fn metrics(&self) -> Metrics {
        Metrics(
            self.metrics_text().unwrap_or_else(|| {
                panic!("/metrics does not answer; operator logs:\n{}", self.logs())
            }),
        )
    }

    /// Status code of `GET path` on the health port.
    pub fn health(&self, path: &str) -> Option<u16> {
        http_get(self.health_port, path).map(|(status, _, _)| status)
    }

    /// The exit status, if the process has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
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

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Waits until `/metrics` answers.
    pub async fn wait_serving(&self) {
        support::eventually("/metrics to answer", Duration::from_secs(30), || async {
            self.metrics_text().map(|_| ())
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

/// A minimal HTTP/1.1 GET on loopback: (status, content type, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((status, content_type, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// A scraped Prometheus text exposition.
#[derive(Clone, Debug)]
pub struct Metrics(pub String);

impl Metrics {
    /// The sum of the samples of `name` whose labels include all of `labels`;
    /// `None` when no sample matches.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = None;
        for line in self.0.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (series_name, series_labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            if series_name != name {
                continue;
            }
            let matches = labels.iter().all(|(k, v)| {
                series_labels
                    .split(',')
                    .any(|kv| kv == format!("{k}=\"{v}\""))
            });
            if matches {
                let value: f64 = value.parse().unwrap();
                *found.get_or_insert(0.0) += value;
            }
        }
        found
    }

    /// Like [`Metrics::get`], 0 when absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Whether any sample of a series whose name starts with `prefix` exists.
    pub fn has_series(&self, prefix: &str) -> bool {
        self.0
            .lines()
            .any(|l| !l.starts_with('#') && l.starts_with(prefix))
    }
}

/// RBAC for an operator that may act only in some namespaces: a ServiceAccount
/// in `home`, a ClusterRole with the operator's rules (from
/// config/rbac/role.yaml, under a name of this test's own), RoleBindings to it
/// in `namespaces` only, and a leader-election Role in `lease_namespace`.
/// Returns a kubeconfig that impersonates the ServiceAccount.
pub struct LimitedIdentity {
    pub kubeconfig: PathBuf,
    pub user: String,
    cluster_role: String,
    _dir: tempfile::TempDir,
}

impl LimitedIdentity {
    pub fn new(home: &str, namespaces: &[&str], lease_namespace: Option<&str>) -> Self {
        let cluster_role = format!("haltsql-operator-test-{home}");
        let role = std::fs::read_to_string(support::repo_root().join("config/rbac/role.yaml"))
            .unwrap()
            .replace(
                "name: haltsql-operator-manager-role",
                &format!("name: {cluster_role}"),
            );
        assert!(
            role.contains(&cluster_role),
            "role.yaml names the ClusterRole"
        );
        let mut yaml = role;
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: operator, namespace: {home}}}\n"
        ));
        for ns in namespaces {
            yaml.push_str(&format!(
                "---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: haltsql-operator, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {cluster_role}}}
subjects: [{{kind: ServiceAccount, name: operator, namespace: {home}}}]
"
            ));
        }
        if let Some(ns) = lease_namespace {
            let lease_role = std::fs::read_to_string(
                support::repo_root().join("config/rbac/leader_election_role.yaml"),
            )
            .unwrap()
            .replace(
                "name: haltsql-operator-leader-election-role",
                &format!("name: leader-election\n  namespace: {ns}"),
            );
            yaml.push_str("---\n");
            yaml.push_str(&lease_role);
            yaml.push_str(&format!(
                "---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: leader-election, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: leader-election}}
subjects: [{{kind: ServiceAccount, name: operator, namespace: {home}}}]
"
            ));
        }
        kubectl_apply(&yaml);

        let user = format!("system:serviceaccount:{home}:operator");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        write_impersonating_kubeconfig(&support::Cluster::Full.kubeconfig(), &user, &kubeconfig);
        LimitedIdentity {
            kubeconfig,
            user,
            cluster_role,
            _dir: dir,
        }
    }

    /// Binds the operator's ClusterRole in one more namespace.
    pub fn bind_in(&self, namespace: &str, home: &str) {
        kubectl_apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: haltsql-operator, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {}}}
subjects: [{{kind: ServiceAccount, name: operator, namespace: {home}}}]
",
            self.cluster_role
        ));
    }

    /// Whether the impersonated identity may do `verb` on `resource`.
    pub fn can(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        let mut cmd = support::kubectl();
        cmd.args(["auth", "can-i", verb, resource, "--as", &self.user]);
        match namespace {
            Some(ns) => cmd.args(["-n", ns]),
            None => cmd.arg("--all-namespaces"),
        };
        let out = cmd.output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    }
}

impl Drop for LimitedIdentity {
    fn drop(&mut self) {
        let _ = support::kubectl()
            .args([
                "delete",
                "clusterrole",
                &self.cluster_role,
                "--ignore-not-found",
                "--wait=false",
            ])
            .output();
    }
}

/// A copy of `admin` whose users impersonate `user` (kubeconfig `as:`).
fn write_impersonating_kubeconfig(admin: &Path, user: &str, out: &Path) {
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    let users = config["users"].as_sequence_mut().unwrap();
    for entry in users {
        entry["user"]["as"] = serde_yaml::Value::String(user.to_owned());
    }
    std::fs::write(out, serde_yaml::to_string(&config).unwrap()).unwrap();
}

/// Sets one field of an object by merge patch (admin client).
pub async fn merge_patch<K>(api: &Api<K>, name: &str, patch: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch {name}: {e}"));
}

/// The admin client, with the CRDs installed.
pub async fn client_with_crds() -> Client {
    let client = support::client().await;
    support::ensure_crds(support::Cluster::Full);
    client
}
