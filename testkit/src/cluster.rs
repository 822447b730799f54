//! The local control planes of `hack/cluster.sh`: their kubeconfigs, clients,
//! `bin/kubectl`, and the CRDs. Tests fail, never skip, when a cluster is absent.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kube::api::{Api, DeleteParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::paths::repo_root;

/// Which local control plane a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cluster {
    /// etcd + kube-apiserver + controller-manager + scheduler + kwok.
    Full,
    /// etcd + kube-apiserver only: nothing acts on Deployments but the test.
    Envtest,
    /// The control plane plus a real node (containerd, kubelet, kube-proxy):
    /// pods run as containers (`hack/cluster.sh up node`).
    Node,
    /// Like `Full`, for the fault suite alone, which restarts its API server
    /// and etcd (`hack/cluster.sh up chaos`).
    Chaos,
}

impl Cluster {
    pub fn kubeconfig(self) -> PathBuf {
        let (var, default) = match self {
            Cluster::Full => ("HALTSQL_TEST_KUBECONFIG", ".cluster/full/kubeconfig"),
            Cluster::Envtest => ("HALTSQL_ENVTEST_KUBECONFIG", ".cluster/envtest/kubeconfig"),
            Cluster::Node => ("HALTSQL_NODE_KUBECONFIG", ".cluster/node/kubeconfig"),
            Cluster::Chaos => ("HALTSQL_CHAOS_KUBECONFIG", ".cluster/chaos/kubeconfig"),
        };
        std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join(default))
    }

    /// A client; panics with a hint when the cluster is not running.
    pub async fn client(self) -> Client {
        connect(&self.kubeconfig()).await
    }

    /// `bin/kubectl` pointed at this cluster.
    pub fn kubectl(self) -> Command {
        let mut cmd = Command::new(repo_root().join("bin/kubectl"));
        cmd.arg("--kubeconfig").arg(self.kubeconfig());
        cmd
    }

    /// Runs `kubectl ARGS`; returns its stdout, panics with its output on failure.
    pub fn kubectl_ok(self, args: &[&str]) -> String {
        run_ok(self.kubectl().args(args))
    }

    /// `kubectl apply --server-side` of YAML (several documents allowed).
    pub fn apply(self, yaml: &str) {
        apply_stdin(self.kubectl(), yaml);
    }

    /// Installs (or updates) the CRDs from `crds/` and waits until they are
    /// established. Idempotent; safe to call from every test.
    pub fn ensure_crds(self) {
        run_ok(
            self.kubectl()
                .args(["apply", "--server-side", "--force-conflicts", "-f"])
                .arg(repo_root().join("crds")),
        );
        run_ok(self.kubectl().args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/haltsqlpolicies.haltsql.dev",
            "crd/haltsqlservers.haltsql.dev",
        ]));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "cannot read {path} ({source}); start the cluster with `make cluster-up` (or `make test`)"
    )]
    Read {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("the kubeconfig {path} is not usable: {source}")]
    Config {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("a client from {path}: {source}")]
    Client { path: PathBuf, source: kube::Error },
    #[error("the cluster of {path} does not answer: {source}")]
    NoAnswer { path: PathBuf, source: kube::Error },
}

/// A client with the kubeconfig at `path`, once the API server answers.
pub async fn try_connect(path: &Path) -> Result<Client, ConnectError> {
    let path_buf = || path.to_path_buf();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| ConnectError::Read {
        path: path_buf(),
        source,
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| ConnectError::Config {
            path: path_buf(),
            source,
        })?;
    let client = Client::try_from(config).map_err(|source| ConnectError::Client {
        path: path_buf(),
        source,
    })?;
    client
        .apiserver_version()
        .await
        .map_err(|source| ConnectError::NoAnswer {
            path: path_buf(),
            source,
        })?;
    Ok(client)
}

/// [`try_connect`] for tests: panics with the reason (and a hint).
pub async fn connect(path: &Path) -> Client {
    try_connect(path).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Runs a command and returns its stdout, panicking with its stderr on failure.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deletes an object, ignoring "not found".
pub async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("delete {name}: {e}"),
    }
}

/// `kubectl apply --server-side --force-conflicts -f -` with `yaml` on stdin,
/// through `kubectl` (which names the cluster and, if it likes, a namespace);
/// returns kubectl's output and fails the test with kubectl's error.
pub fn apply_stdin(mut kubectl: Command, yaml: &str) -> String {
    let mut child = kubectl
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(yaml.as_bytes())
            .expect("kubectl reads stdin");
    }
    let out = child.wait_with_output().expect("kubectl finishes");
    assert!(
        out.status.success(),
        "kubectl apply failed:\n{}\n--- manifest ---\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
