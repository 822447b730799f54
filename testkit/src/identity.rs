//! Acting as someone else: kubeconfigs that impersonate a user, and an
//! operator identity whose RBAC is limited to some namespaces.

use std::path::{Path, PathBuf};

use crate::cluster::Cluster;
use crate::paths::repo_root;

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Yaml {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("{0}: no users to impersonate with")]
    NoUsers(PathBuf),
}

/// Writes to `out` a copy of the kubeconfig `admin` whose users impersonate
/// `user` (kubeconfig `as:`) and, when given, `groups` (`as-groups:`).
pub fn write_impersonating_kubeconfig(
    admin: &Path,
    user: &str,
    groups: &[&str],
    out: &Path,
) -> Result<(), KubeconfigError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KubeconfigError::Io { path, source }
    };
    let text = std::fs::read_to_string(admin).map_err(io(admin))?;
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|source| KubeconfigError::Yaml {
            path: admin.to_path_buf(),
            source,
        })?;
    let users = config["users"]
        .as_sequence_mut()
        .filter(|users| !users.is_empty())
        .ok_or_else(|| KubeconfigError::NoUsers(admin.to_path_buf()))?;
    for entry in users {
        entry["user"]["as"] = user.into();
        if !groups.is_empty() {
            entry["user"]["as-groups"] =
                groups.iter().map(|g| serde_yaml::Value::from(*g)).collect();
        }
    }
    let text = serde_yaml::to_string(&config).map_err(|source| KubeconfigError::Yaml {
        path: out.to_path_buf(),
        source,
    })?;
    std::fs::write(out, text).map_err(io(out))
}

/// RBAC for an operator that may act only in some namespaces of the full
/// cluster: a ServiceAccount in `home`, a ClusterRole with the operator's
/// rules (from config/rbac/role.yaml, under a name of this test's own),
/// RoleBindings to it in `namespaces` only, and a leader-election Role in
/// `lease_namespace`; with a kubeconfig that impersonates the ServiceAccount.
/// The ClusterRole is deleted when dropped.
pub struct LimitedIdentity {
    pub kubeconfig: PathBuf,
    pub user: String,
    cluster_role: String,
    _dir: tempfile::TempDir,
}

impl LimitedIdentity {
    pub fn new(home: &str, namespaces: &[&str], lease_namespace: Option<&str>) -> Self {
        let cluster_role = format!("haltsql-operator-test-{home}");
        let role = read_repo_file("config/rbac/role.yaml").replace(
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
            yaml.push_str(&role_binding(ns, "ClusterRole", &cluster_role, home));
        }
        if let Some(ns) = lease_namespace {
            let lease_role = read_repo_file("config/rbac/leader_election_role.yaml").replace(
                "name: haltsql-operator-leader-election-role",
                &format!("name: leader-election\n  namespace: {ns}"),
            );
            yaml.push_str("---\n");
            yaml.push_str(&lease_role);
            yaml.push_str(
                &role_binding(ns, "Role", "leader-election", home)
                    .replace("name: haltsql-operator,", "name: leader-election,"),
            );
        }
        Cluster::Full.apply(&yaml);

        let user = format!("system:serviceaccount:{home}:operator");
        let dir = tempfile::tempdir().expect("temporary directory");
        let kubeconfig = dir.path().join("kubeconfig");
        write_impersonating_kubeconfig(&Cluster::Full.kubeconfig(), &user, &[], &kubeconfig)
            .unwrap_or_else(|e| panic!("impersonating kubeconfig: {e}"));
        LimitedIdentity {
            kubeconfig,
            user,
            cluster_role,
            _dir: dir,
        }
    }

    /// Binds the operator's ClusterRole in one more namespace.
    pub fn bind_in(&self, namespace: &str, home: &str) {
        Cluster::Full.apply(&role_binding(
            namespace,
            "ClusterRole",
            &self.cluster_role,
            home,
        ));
    }

    /// Whether the impersonated identity may do `verb` on `resource`.
    pub fn can(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        let mut cmd = Cluster::Full.kubectl();
        cmd.args(["auth", "can-i", verb, resource, "--as", &self.user]);
        match namespace {
            Some(ns) => cmd.args(["-n", ns]),
            None => cmd.arg("--all-namespaces"),
        };
        let out = cmd.output().expect("kubectl runs");
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    }
}

impl Drop for LimitedIdentity {
    fn drop(&mut self) {
        let _ = Cluster::Full
            .kubectl()
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

/// A RoleBinding `haltsql-operator` in `namespace` of `kind`/`role` to the
/// ServiceAccount `operator` of `home`, as a YAML document.
fn role_binding(namespace: &str, kind: &str, role: &str, home: &str) -> String {
    format!(
        "---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: haltsql-operator, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: {kind}, name: {role}}}
subjects: [{{kind: ServiceAccount, name: operator, namespace: {home}}}]
"
    )
}

fn read_repo_file(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
