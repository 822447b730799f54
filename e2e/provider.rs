//! The cluster provider switch (`HALTSQL_E2E_PROVIDER`). Both run the
//! operator and the servers as real pods, installed from `config/default`;
//! the test reaches them with `kubectl port-forward`.
//!
//! - `node` (default, in `make test`): the local control plane with a real
//!   kubelet and containerd (`hack/cluster.sh up node`). The images are the
//!   archives of `make images` (`HALTSQL_IMAGES_DIR`, default
//!   `.cache/images`), imported with `hack/cluster.sh load node`.
//! - `kind` (`make e2e`): builds the images with Docker (unless
//!   `HALTSQL_IMAGE` names the haltsql image), creates the kind cluster
//!   `haltsql-operator` and loads the images. The cluster is deleted at the
//!   end unless `HALTSQL_E2E_KEEP_CLUSTER=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::Cluster;
use crate::operator::{self, Operator};
use haltsql_testkit::cluster::run_ok;
use haltsql_testkit::paths::repo_root;

pub const KIND_CLUSTER: &str = "haltsql-operator";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Node,
    Kind,
}

impl Kind {
    pub fn from_env() -> Self {
        match std::env::var("HALTSQL_E2E_PROVIDER").as_deref() {
            Err(_) | Ok("") | Ok("node") => Kind::Node,
            Ok("kind") => Kind::Kind,
            Ok(other) => panic!("HALTSQL_E2E_PROVIDER={other}: expected node or kind"),
        }
    }
}

pub struct Provider {
    pub kind: Kind,
    pub cluster: Cluster,
    /// The operator image installed from config/default.
    pub operator_image: String,
    /// The image of the haltsql server pods.
    pub haltsql_image: String,
}

impl Provider {
    /// Connects to (kind: creates) the cluster and makes both images available on its node.
    pub async fn setup(dir: &Path) -> Self {
        let kind = Kind::from_env();
        match kind {
            Kind::Node => {
                let (operator_image, haltsql_image) = node_images();
                Provider {
                    kind,
                    cluster: Cluster::connect(&haltsql_testkit::Cluster::Node.kubeconfig()).await,
                    operator_image,
                    haltsql_image,
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
                    run_ok(
                        Command::new("kind")
                            .args(["load", "docker-image", "--name", KIND_CLUSTER])
                            .arg(image),
                    );
                }
                Provider {
                    kind,
                    cluster: Cluster::connect(&kubeconfig).await,
                    operator_image,
                    haltsql_image,
                }
            }
        }
    }

    /// `make install-manifests IMG=...` applied server-side: CRDs, RBAC, the
    /// namespace haltsql-system and the operator Deployment.
    pub fn install(&self) {
        // A fresh install: operator pods left by an earlier run would keep
        // running whatever image they started with (same tag, same template).
        self.cluster.kubectl_ok(&[
            "delete",
            "namespace",
            operator::NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ]);
        let manifests = run_ok(
            Command::new("make")
                .args(["-s", "--no-print-directory", "-C"])
                .arg(repo_root())
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
        // Two replicas with leader election (the scenario kills the leader),
        // short resyncs (the idle minute then holds several full passes, each
        // of which must write nothing) and a short rollout deadline (the
        // stalled rollout reports RolloutFailed within the test's patience).
        let args = [
            format!("--resync-seconds={}", crate::resync_seconds()),
            format!(
                "--rollout-deadline-seconds={}",
                crate::ROLLOUT_DEADLINE_SECONDS
            ),
        ];
        let mut patch =
            vec![serde_json::json!({"op": "replace", "path": "/spec/replicas", "value": 2})];
        patch.extend(args.iter().map(|a| {
            serde_json::json!({"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a})
        }));
        self.cluster.kubectl_ok(&[
            "-n",
            operator::NAMESPACE,
            "patch",
            "deployment",
            operator::DEPLOYMENT,
            "--type=json",
            "-p",
            &serde_json::Value::Array(patch).to_string(),
        ]);
        self.cluster.kubectl_ok(&[
            "-n",
            operator::NAMESPACE,
            "rollout",
            "status",
            &format!("deploy/{}", operator::DEPLOYMENT),
            "--timeout=180s",
        ]);
    }

    /// The operator under test: the replicas of the installed Deployment.
    pub fn operator(&self) -> Operator {
        Operator::new(&self.cluster)
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

/// The image archives of `make images`, imported into the node's containerd.
fn node_images() -> (String, String) {
    let dir = std::env::var_os("HALTSQL_IMAGES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/images"));
    let mut tags = Vec::new();
    let mut load = Command::new(repo_root().join("hack/cluster.sh"));
    load.args(["load", "node"]);
    for name in ["haltsql-operator", "haltsql"] {
        let archive = dir.join(format!("{name}.tar"));
        let tag = std::fs::read_to_string(dir.join(format!("{name}.tag")))
            .unwrap_or_else(|e| panic!("{}: {e}; run `make images` first", archive.display()));
        tags.push(tag.trim().to_owned());
        load.arg(archive);
    }
    crate::step(&format!("importing {tags:?} into the node's containerd"));
    run_ok(&mut load);
    (tags[0].clone(), tags[1].clone())
}

/// Builds the images for kind with the Makefile's targets: the haltsql image
/// (unless HALTSQL_IMAGE names one) and the operator image on top of it.
fn kind_images() -> (String, String) {
    let make = |args: &[&str]| {
        run_ok(
            Command::new("make")
                .arg("-C")
                .arg(repo_root())
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
    let clusters = run_ok(Command::new("kind").args(["get", "clusters"]));
    if !clusters.lines().any(|l| l.trim() == KIND_CLUSTER) {
        crate::step(&format!("creating the kind cluster {KIND_CLUSTER}"));
        run_ok(Command::new("kind").args([
            "create",
            "cluster",
            "--name",
            KIND_CLUSTER,
            "--wait",
            "120s",
        ]));
    }
    let kubeconfig = dir.join("kind.kubeconfig");
    let text = run_ok(Command::new("kind").args(["get", "kubeconfig", "--name", KIND_CLUSTER]));
    std::fs::write(&kubeconfig, text).expect("write the kind kubeconfig");
    kubeconfig
}
