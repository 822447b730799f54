//! The operator under test, seen from outside: the replicas of the Deployment
//! installed from `config/default`. One of them leads (holds the Lease); the
//! test reads the leader's metrics through `kubectl port-forward`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::port_forward::PortForward;
use haltsql_testkit::http;
use haltsql_testkit::prometheus::Metrics;

/// The operator's namespace and ServiceAccount (config/rbac).
pub const NAMESPACE: &str = "haltsql-system";
pub const SERVICE_ACCOUNT: &str = "haltsql-operator-controller-manager";
pub const DEPLOYMENT: &str = "haltsql-operator-controller-manager";
const POD_SELECTOR: &str = "control-plane=controller-manager";

pub fn service_account_user() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}")
}

/// The leading replica, reached through a port-forward to its metrics port.
struct Leader {
    pod: String,
    metrics: SocketAddr,
    _forward: PortForward,
}

pub struct Operator {
    cluster: Cluster,
    leader: Option<Leader>,
}

impl Operator {
    pub fn new(cluster: &Cluster) -> Self {
        Operator {
            cluster: cluster.clone(),
            leader: None,
        }
    }

    fn leader(&self) -> &Leader {
        self.leader.as_ref().expect("wait_leader first")
    }

    pub fn leader_pod(&self) -> String {
        self.leader().pod.clone()
    }

    pub async fn scrape(&self) -> String {
        let resp = http::get(self.leader().metrics, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("operator metrics: {e}"));
        assert_eq!(resp.status, 200, "operator /metrics: {}", resp.body);
        resp.body
    }

    /// `haltsql_operator_api_writes_total`, all series.
    pub async fn api_writes(&self) -> u64 {
        Metrics(self.scrape().await).sum("haltsql_operator_api_writes_total") as u64
    }

    /// `haltsql_operator_reconciles_total`, all series.
    pub async fn reconciles(&self) -> u64 {
        Metrics(self.scrape().await).sum("haltsql_operator_reconciles_total") as u64
    }

    /// `kubectl get lease -o OUTPUT` of the leader Lease.
    fn lease(&self, output: &str) -> (bool, String, String) {
        let lease = haltsql_operator::manager::leader::LEASE_NAME;
        self.cluster
            .kubectl_try(&["-n", NAMESPACE, "get", "lease", lease, "-o", output])
    }

    /// The pod named by the leader Lease's holder (`<pod>_<suffix>`), if any.
    fn lease_holder_pod(&self) -> Option<String> {
        let (ok, out, _) = self.lease("jsonpath={.spec.holderIdentity}");
        let holder = out.trim();
        (ok && !holder.is_empty()).then(|| holder.split('_').next().unwrap_or(holder).to_owned())
    }

    /// Waits until a replica other than `not` holds the Lease and says so in
    /// its metrics (`haltsql_operator_leader` 1), and follows it.
    pub async fn wait_leader(&mut self, not: Option<&str>, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("no lease holder yet");
        while tokio::time::Instant::now() < deadline {
            if let Some(pod) = self.lease_holder_pod().filter(|p| Some(p.as_str()) != not) {
                match PortForward::start(&self.cluster, NAMESPACE, &format!("pod/{pod}"), 8080) {
                    Ok(fwd) => match http::get(fwd.addr, "/metrics").await {
                        Ok(r) if Metrics(r.body.clone()).sum("haltsql_operator_leader") >= 1.0 => {
                            self.leader = Some(Leader {
                                pod,
                                metrics: fwd.addr,
                                _forward: fwd,
                            });
                            return;
                        }
                        Ok(r) => last = format!("{pod} holds the lease, metrics: {}", r.status),
                        Err(e) => last = format!("{pod}: {e}"),
                    },
                    Err(e) => last = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let (_, lease, _) = self.lease("yaml");
        panic!("no operator replica became leader within {timeout:?} ({last}):\n{lease}");
    }

    /// Kills the leading pod at once (no grace period), like a node failure.
    pub fn kill_leader(&mut self) -> String {
        let pod = self.leader_pod();
        self.leader = None;
        self.cluster.kubectl_ok(&[
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            &pod,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
        pod
    }

    /// The misbehaviour check: no operator pod restarted or panicked.
    pub fn assert_healthy(&self) {
        let pods = self.cluster.kubectl_ok(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            POD_SELECTOR,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].restartCount}{\"\\n\"}{end}",
        ]);
        for line in pods.lines().filter(|l| !l.trim().is_empty()) {
            let (name, restarts) = line.split_once(' ').unwrap_or((line, ""));
            assert_eq!(restarts.trim(), "0", "operator pod {name} restarted");
            let log = self.cluster.kubectl_ok(&["-n", NAMESPACE, "logs", name]);
            assert!(
                !log.contains("panicked"),
                "operator pod {name} panicked:\n{log}"
            );
        }
    }

    /// The last lines of every operator pod's log, for a failed run.
    pub fn log_tail(&self) -> String {
        let (_, out, err) = self.cluster.kubectl_try(&[
            "-n",
            NAMESPACE,
            "logs",
            "-l",
            POD_SELECTOR,
            "--prefix",
            "--tail=40",
        ]);
        format!("{out}{err}")
    }
}
