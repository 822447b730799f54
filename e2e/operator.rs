//! The operator under test, seen from outside: a local process (local
//! provider) or the Deployment installed from `config/default` (kind).
//! Both answer the same questions: is it alive and clean, how many API writes
//! and reconciles has it made.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cluster::Cluster;
use crate::http;

/// The operator's namespace and ServiceAccount (config/rbac).
pub const NAMESPACE: &str = "haltsql-system";
pub const SERVICE_ACCOUNT: &str = "haltsql-operator-controller-manager";
pub const DEPLOYMENT: &str = "haltsql-operator-controller-manager";

pub fn service_account_user() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}")
}

/// Writes a copy of `admin` whose users impersonate the operator's
/// ServiceAccount (kubeconfig `as`/`as-groups`), so every request the
/// operator makes is authorized by its own RBAC, not the admin's.
pub fn impersonating_kubeconfig(admin: &Path, out: &Path) {
    let text =
        std::fs::read_to_string(admin).unwrap_or_else(|e| panic!("read {}: {e}", admin.display()));
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig is YAML");
    let users = kc
        .get_mut("users")
        .and_then(|u| u.as_sequence_mut())
        .expect("kubeconfig has users");
    for user in users {
        let u = user
            .get_mut("user")
            .and_then(|u| u.as_mapping_mut())
            .expect("kubeconfig user entry");
        u.insert("as".into(), service_account_user().into());
        u.insert(
            "as-groups".into(),
            serde_yaml::Value::Sequence(
                [
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{NAMESPACE}"),
                    "system:authenticated".to_owned(),
                ]
                .into_iter()
                .map(Into::into)
                .collect(),
            ),
        );
    }
    std::fs::write(out, serde_yaml::to_string(&kc).expect("kubeconfig to YAML"))
        .unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}

/// The operator binary run as a local process with the ServiceAccount's identity.
pub struct LocalOperator {
    child: Option<Child>,
    pub log: PathBuf,
    pub metrics: SocketAddr,
    pub health: SocketAddr,
}

impl LocalOperator {
    pub fn start(cluster: &Cluster, dir: &Path, watch_namespace: &str, haltsql: &Path) -> Self {
        let kubeconfig = dir.join("operator.kubeconfig");
        impersonating_kubeconfig(&cluster.kubeconfig, &kubeconfig);
        let log = dir.join("operator.log");
        let metrics: SocketAddr = ([127, 0, 0, 1], http::free_port()).into();
        let health: SocketAddr = ([127, 0, 0, 1], http::free_port()).into();
        let file = std::fs::File::create(&log).expect("operator log file");
        let child = Command::new(env!("CARGO_BIN_EXE_haltsql-operator"))
            .arg("--haltsql-binary")
            .arg(haltsql)
            .arg(format!("--watch-namespaces={watch_namespace}"))
            .arg("--leader-elect")
            .arg(format!("--leader-election-namespace={NAMESPACE}"))
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--health-probe-bind-address={health}"))
            // Short resyncs: the idle minute then holds several full passes,
            // each of which must write nothing.
            .arg(format!("--resync-seconds={}", crate::resync_seconds()))
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("POD_NAMESPACE")
            .env(
                "RUST_LOG",
                std::env::var("HALTSQL_E2E_OPERATOR_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("start haltsql-operator");
        LocalOperator {
            child: Some(child),
            log,
            metrics,
            health,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Err when the process has exited.
    pub fn alive(&mut self) -> Result<(), String> {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(status))) => Err(format!("the operator exited ({status})")),
            Some(Err(e)) => Err(format!("cannot check the operator process: {e}")),
            None => Err("the operator was stopped".into()),
        }
    }

    /// SIGTERM, then wait for a clean exit (it drains and releases the lease).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        for _ in 0..150 {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        child.wait().ok();
        None
    }
}

impl Drop for LocalOperator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where the operator runs.
pub enum Operator {
    Local(LocalOperator),
    /// In the cluster; `metrics` is a `kubectl port-forward` to its metrics port.
    InCluster {
        metrics: SocketAddr,
        _forward: crate::provider::PortForward,
    },
}

impl Operator {
    pub fn metrics_addr(&self) -> SocketAddr {
        match self {
            Operator::Local(op) => op.metrics,
            Operator::InCluster { metrics, .. } => *metrics,
        }
    }

    pub async fn scrape(&self) -> String {
        let resp = http::get(self.metrics_addr(), "/metrics")
            .await
            .unwrap_or_else(|e| panic!("operator metrics: {e}"));
        assert_eq!(resp.status, 200, "operator /metrics: {}", resp.body);
        resp.body
    }

    /// `haltsql_operator_api_writes_total`, all series.
    pub async fn api_writes(&self) -> u64 {
        http::metric_sum(&self.scrape().await, "haltsql_operator_api_writes_total") as u64
    }

    /// `haltsql_operator_reconciles_total`, all series.
    pub async fn reconciles(&self) -> u64 {
        http::metric_sum(&self.scrape().await, "haltsql_operator_reconciles_total") as u64
    }

    /// `/readyz` answers 200 (local process; in the cluster the readiness probe checks it).
    async fn ready(&self) -> bool {
        match self {
            Operator::Local(op) => http::get(op.health, "/readyz")
                .await
                .is_ok_and(|r| r.status == 200),
            Operator::InCluster { .. } => true,
        }
    }

    /// Waits until this operator leads (`haltsql_operator_leader` 1).
    pub async fn wait_leader(&mut self, cluster: &Cluster, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Operator::Local(op) = self
                && let Err(e) = op.alive()
            {
                panic!("{e} before leading; log:\n{}", op.log_text());
            }
            if let Ok(r) = http::get(self.metrics_addr(), "/metrics").await
                && http::metric_sum(&r.body, "haltsql_operator_leader") >= 1.0
                && self.ready().await
            {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let (_, lease, _) = cluster.kubectl_try(&[
                    "-n",
                    NAMESPACE,
                    "get",
                    "lease",
                    haltsql_operator::leader::LEASE_NAME,
                    "-o",
                    "yaml",
                ]);
                panic!(
                    "the operator did not become leader within {timeout:?}. Another operator \
                     may hold the lease (a `make demo` operator? stop it, or `make cluster-down`):\n{lease}"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The misbehaviour check: the operator still runs, never restarted and never panicked.
    pub fn assert_healthy(&mut self, cluster: &Cluster) {
        match self {
            Operator::Local(op) => {
                if let Err(e) = op.alive() {
                    panic!("{e}; log:\n{}", op.log_text());
                }
                let log = op.log_text();
                assert!(
                    !log.contains("panicked"),
                    "the operator panicked; log:\n{log}"
                );
            }
            Operator::InCluster { .. } => {
                let pods = cluster.kubectl_ok(&[
                    "-n",
                    NAMESPACE,
                    "get",
                    "pods",
                    "-l",
                    "control-plane=controller-manager",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].restartCount}{\"\\n\"}{end}",
                ]);
                for line in pods.lines().filter(|l| !l.trim().is_empty()) {
                    let (name, restarts) = line.split_once(' ').unwrap_or((line, ""));
                    assert_eq!(restarts.trim(), "0", "operator pod {name} restarted");
                    let log = cluster.kubectl_ok(&["-n", NAMESPACE, "logs", name]);
                    assert!(
                        !log.contains("panicked"),
                        "operator pod {name} panicked:\n{log}"
                    );
                }
            }
        }
    }

    pub fn log_hint(&self) -> String {
        match self {
            Operator::Local(op) => format!("operator log: {}", op.log.display()),
            Operator::InCluster { .. } => {
                format!("operator log: kubectl -n {NAMESPACE} logs deploy/{DEPLOYMENT}")
            }
        }
    }
}
