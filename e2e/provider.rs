//! The cluster provider switch (`HALTSQL_E2E_PROVIDER`):
//!
//! - `local` (default, in `make test`): the local control plane of
//!   `hack/cluster.sh up full` (controller-manager, scheduler, kwok). The
//!   operator runs as a local process impersonating its ServiceAccount; the
//!   server pods are `haltsql serve` processes (see `serve.rs`).
//! - `kind` (`make e2e`): builds the images (unless `HALTSQL_IMAGE` names the
//!   haltsql image), creates the kind cluster `haltsql-operator`, loads the
//!   images, and the operator runs in the cluster from `config/default`. The
//!   pods are reached with `kubectl port-forward`. The cluster is deleted at
//!   the end unless `HALTSQL_E2E_KEEP_CLUSTER=1`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::operator::{self, LocalOperator, Operator};
use crate::serve::{Backend, Pods};
use crate::support;

pub const KIND_CLUSTER: &str = "haltsql-operator";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Local,
    Kind,
}

impl Kind {
    pub fn from_env() -> Self {
        match std::env::var("HALTSQL_E2E_PROVIDER").as_deref() {
            Err(_) | Ok("") | Ok("local") => Kind::Local,
            Ok("kind") => Kind::Kind,
            Ok(other) => panic!("HALTSQL_E2E_PROVIDER={other}: expected local or kind"),
        }
    }
}

pub struct Provider {
    pub kind: Kind,
    pub cluster: Cluster,
    /// Logs and pod roots of this run.
    pub dir: PathBuf,
    /// The operator image installed from config/default.
    pub operator_image: String,
    /// The image of the haltsql server pods.
    pub haltsql_image: String,
}

impl Provider {
    /// Connects to (kind: builds images for, creates) the cluster.
    pub async fn setup(dir: &Path) -> Self {
        let kind = Kind::from_env();
        match kind {
            Kind::Local => {
                let kubeconfig = support::Cluster::Full.kubeconfig();
                Provider {
                    kind,
                    cluster: Cluster::connect(&kubeconfig).await,
                    dir: dir.to_owned(),
                    // kwok runs no containers: the images are never pulled.
                    operator_image: "haltsql-operator:e2e".into(),
                    haltsql_image: "haltsql:e2e".into(),
                }
            }
            Kind::Kind => {
                for tool in ["docker", "kind", "make"] {
                    let found = Command::new(tool).arg("version").output().is_ok();
                    assert!(found, "HALTSQL_E2E_PROVIDER=kind needs `{tool}` on PATH");
                }
                let (operator_image, haltsql_image) = kind_images();
                let kubeconfig = kind_cluster(dir);
                for image in [&operator_image, &haltsql_image] {
                    crate::step(&format!("loading {image} into kind"));
                    support::run_ok(
                        Command::new("kind")
                            .args(["load", "docker-image", "--name", KIND_CLUSTER])
                            .arg(image),
                    );
                }
                Provider {
                    kind,
                    cluster: Cluster::connect(&kubeconfig).await,
                    dir: dir.to_owned(),
                    operator_image,
                    haltsql_image,
                }
            }
        }
    }

    /// `make install-manifests IMG=...` applied server-side: CRDs, RBAC, the
    /// namespace haltsql-system and the operator Deployment.
    pub fn install(&self) {
        let manifests = support::run_ok(
            Command::new("make")
                .args(["-s", "--no-print-directory", "-C"])
                .arg(support::repo_root())
                .arg("install-manifests")
                .arg(format!("IMG={}", self.operator_image))
                .env_remove("MAKEFLAGS")
                .env_remove("MFLAGS")
                .env_remove("MAKELEVEL"),
        );
        assert!(
            manifests.contains("kind: CustomResourceDefinition")
                && manifests.contains("kind: ClusterRole")
                && manifests.contains(&format!("image: {}", self.operator_image)),
            "make install-manifests printed something unexpected:\n{manifests}"
        );
        self.cluster.apply(None, &manifests);
        self.cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/haltsqlpolicies.haltsql.dev",
            "crd/haltsqlservers.haltsql.dev",
        ]);
        // On kind this is the real operator; on the local cluster its pod lands
        // on the kwok node and runs nothing, but it proves the Deployment is
        // admitted under the namespace's restricted Pod Security level.
        self.cluster.kubectl_ok(&[
            "-n",
            operator::NAMESPACE,
            "rollout",
            "status",
            &format!("deploy/{}", operator::DEPLOYMENT),
            "--timeout=180s",
        ]);
    }

    /// The operator under test.
    pub async fn operator(&self, watch_namespace: &str) -> Operator {
        match self.kind {
            Kind::Local => Operator::Local(LocalOperator::start(
                &self.cluster,
                &self.dir,
                watch_namespace,
                &support::haltsql_bin(),
            )),
            Kind::Kind => {
                let fwd = PortForward::start(
                    &self.cluster,
                    operator::NAMESPACE,
                    &format!("deploy/{}", operator::DEPLOYMENT),
                    8080,
                )
                .unwrap_or_else(|e| panic!("{e}"));
                Operator::InCluster {
                    metrics: fwd.addr,
                    _forward: fwd,
                }
            }
        }
    }

    /// How the test reaches the server pods.
    pub fn pods(&self) -> Pods {
        match self.kind {
            Kind::Local => Pods::new(Backend::Local {
                haltsql: support::haltsql_bin(),
                dir: self.dir.join("pods"),
            }),
            Kind::Kind => Pods::new(Backend::PortForward),
        }
    }

    /// kind: deletes the cluster unless HALTSQL_E2E_KEEP_CLUSTER=1.
    pub fn teardown(&self) {
        if self.kind == Kind::Kind {
            if keep_cluster() {
                eprintln!(
                    "e2e: keeping the kind cluster {KIND_CLUSTER} (HALTSQL_E2E_KEEP_CLUSTER=1)"
                );
            } else {
                let _ = Command::new("kind")
                    .args(["delete", "cluster", "--name", KIND_CLUSTER])
                    .status();
            }
        }
    }
}

fn keep_cluster() -> bool {
    matches!(
        std::env::var("HALTSQL_E2E_KEEP_CLUSTER").as_deref(),
        Ok("1") | Ok("true")
    )
}

/// Builds the images for kind with the Makefile's targets: the haltsql image
/// (unless HALTSQL_IMAGE names one) and the operator image on top of it.
fn kind_images() -> (String, String) {
    let make = |args: &[&str]| {
        support::run_ok(
            Command::new("make")
                .arg("-C")
                .arg(support::repo_root())
                .args(args)
                .env_remove("MAKEFLAGS")
                .env_remove("MFLAGS")
                .env_remove("MAKELEVEL"),
        )
    };
    let haltsql_image = match std::env::var("HALTSQL_IMAGE") {
        Ok(image) if !image.is_empty() => image,
        _ => {
            crate::step("building the haltsql image haltsql:e2e (make docker-build-haltsql)");
            make(&["docker-build-haltsql", "HALTSQL_IMG=haltsql:e2e"]);
            "haltsql:e2e".into()
        }
    };
    crate::step("building the operator image haltsql-operator:e2e (make docker-build)");
    make(&[
        "docker-build",
        "IMG=haltsql-operator:e2e",
        &format!("HALTSQL_IMG={haltsql_image}"),
    ]);
    ("haltsql-operator:e2e".into(), haltsql_image)
}

/// Creates the kind cluster (or reuses it) and writes its kubeconfig into `dir`.
fn kind_cluster(dir: &Path) -> PathBuf {
    let clusters = support::run_ok(Command::new("kind").args(["get", "clusters"]));
    if !clusters.lines().any(|l| l.trim() == KIND_CLUSTER) {
        crate::step(&format!("creating the kind cluster {KIND_CLUSTER}"));
        support::run_ok(Command::new("kind").args([
            "create",
            "cluster",
            "--name",
            KIND_CLUSTER,
            "--wait",
            "120s",
        ]));
    }
    let kubeconfig = dir.join("kind.kubeconfig");
    let text =
        support::run_ok(Command::new("kind").args(["get", "kubeconfig", "--name", KIND_CLUSTER]));
    std::fs::write(&kubeconfig, text).expect("write the kind kubeconfig");
    kubeconfig
}

/// A running `kubectl port-forward TARGET :PORT` on loopback.
pub struct PortForward {
    child: Child,
    pub addr: SocketAddr,
}

impl PortForward {
    pub fn start(cluster: &Cluster, ns: &str, target: &str, port: u16) -> Result<Self, String> {
        let mut child = cluster
            .kubectl()
            .args(["-n", ns, "port-forward", "--address", "127.0.0.1", target])
            .arg(format!(":{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("kubectl port-forward {target}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // "Forwarding from 127.0.0.1:41234 -> 8080"; keep reading so the pipe never fills.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                let local = line
                    .strip_prefix("Forwarding from ")
                    .and_then(|rest| rest.split(" -> ").next())
                    .and_then(|a| a.parse::<SocketAddr>().ok());
                if let Some(addr) = local {
                    return Ok(PortForward { child, addr });
                }
            }
        }
        let _ = child.kill();
        Err(format!("kubectl port-forward {target} did not start"))
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
