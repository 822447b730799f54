//! The operator's RBAC rules: the single list that `config/rbac/role.yaml`,
//! the leader-election Role and the Helm chart are generated from.
//!
//! The operator never reads Secrets or Pods and needs nothing cluster-scoped.
//! It writes owned objects with server-side apply (PATCH) and patches status,
//! so `patch` is granted where it applies, on top of the verbs in the guide's
//! RBAC table. It also reads ReplicaSets (get, list, watch), to delete a
//! per-configuration ConfigMap only once no ReplicaSet uses it.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// One RBAC rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API groups (`""` is the core group).
    pub api_groups: &'static [&'static str],
    /// Resources and subresources.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
const OWNED: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const RECORD: &[&str] = &["create", "patch"];

/// The rules of the operator's ClusterRole (`manager-role`).
pub const MANAGER_RULES: &[Rule] = &[
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlpolicies", "haltsqlservers"],
        verbs: READ,
    },
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlpolicies/status", "haltsqlservers/status"],
        verbs: &["update", "patch"],
    },
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlservers/finalizers"],
        verbs: &["update"],
    },
    Rule {
        api_groups: &[""],
        resources: &["configmaps", "services"],
        verbs: OWNED,
    },
    Rule {
        api_groups: &["apps"],
        resources: &["deployments"],
        verbs: OWNED,
    },
    // Read only: which ReplicaSets still use which per-configuration
    // ConfigMap (the guide's table has no ReplicaSets; see docs/guide.md).
    Rule {
        api_groups: &["apps"],
        resources: &["replicasets"],
        verbs: READ,
    },
    Rule {
        api_groups: &["policy"],
        resources: &["poddisruptionbudgets"],
        verbs: OWNED,
    },
    Rule {
        api_groups: &["networking.k8s.io"],
        resources: &["networkpolicies"],
        verbs: OWNED,
    },
    Rule {
        api_groups: &[""],
        resources: &["events"],
        verbs: RECORD,
    },
    Rule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: RECORD,
    },
];

/// The rules of the leader-election Role in the operator's namespace.
pub const LEADER_ELECTION_RULES: &[Rule] = &[
    Rule {
        api_groups: &["coordination.k8s.io"],
        resources: &["leases"],
        verbs: OWNED,
    },
    Rule {
        api_groups: &[""],
        resources: &["events"],
        verbs: RECORD,
    },
    Rule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: RECORD,
    },
];

/// Verbs of users who edit the custom resources.
const EDIT: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `haltsql-editor-role`: aggregated into the built-in `admin` and `edit`
/// roles. Editing a HaltSQLServer can route Secrets of its namespace to an
/// endpoint of the editor's choice, which `admin`/`edit` users may read anyway.
pub const EDITOR_RULES: &[Rule] = &[
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlpolicies", "haltsqlservers"],
        verbs: EDIT,
    },
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlservers/scale"],
        verbs: &["get", "patch", "update"],
    },
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlpolicies/status", "haltsqlservers/status"],
        verbs: &["get"],
    },
];

/// `haltsql-viewer-role`: aggregated into the built-in `view` role.
pub const VIEWER_RULES: &[Rule] = &[
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlpolicies", "haltsqlservers"],
        verbs: READ,
    },
    Rule {
        api_groups: &["haltsql.dev"],
        resources: &["haltsqlpolicies/status", "haltsqlservers/status"],
        verbs: &["get"],
    },
];

/// Name of the aggregated editor ClusterRole.
pub const EDITOR_ROLE_NAME: &str = "haltsql-editor-role";
/// Name of the aggregated viewer ClusterRole.
pub const VIEWER_ROLE_NAME: &str = "haltsql-viewer-role";

/// Name of the ClusterRole in `config/rbac` (names are written in full; the
/// kustomize install adds no prefix).
pub const MANAGER_ROLE_NAME: &str = "haltsql-operator-manager-role";
/// Name of the leader-election Role in `config/rbac`.
pub const LEADER_ELECTION_ROLE_NAME: &str = "haltsql-operator-leader-election-role";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    /// The role could not be serialized.
    #[error("cannot serialize RBAC role: {0}")]
    Serialize(#[from] serde_yaml::Error),
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The rules as Kubernetes `PolicyRule`s.
pub fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(strings(r.api_groups)),
            resources: Some(strings(r.resources)),
            verbs: strings(r.verbs),
            ..Default::default()
        })
        .collect()
}

fn labels() -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([(
        "app.kubernetes.io/name".to_owned(),
        "haltsql-operator".to_owned(),
    )])
}

/// The operator's ClusterRole.
pub fn manager_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(MANAGER_ROLE_NAME.to_owned()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(policy_rules(MANAGER_RULES)),
        ..Default::default()
    }
}

fn aggregated_role(name: &str, rules: &[Rule], aggregate_to: &[&str]) -> ClusterRole {
    let mut labels = labels();
    for role in aggregate_to {
        labels.insert(
            format!("rbac.authorization.k8s.io/aggregate-to-{role}"),
            "true".to_owned(),
        );
    }
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..Default::default()
        },
        rules: Some(policy_rules(rules)),
        ..Default::default()
    }
}

/// `haltsql-editor-role`, aggregated into `admin` and `edit`.
pub fn editor_cluster_role() -> ClusterRole {
    aggregated_role(EDITOR_ROLE_NAME, EDITOR_RULES, &["admin", "edit"])
}

/// `haltsql-viewer-role`, aggregated into `view`.
pub fn viewer_cluster_role() -> ClusterRole {
    aggregated_role(VIEWER_ROLE_NAME, VIEWER_RULES, &["view"])
}

/// The leader-election Role (its namespace is set by kustomize).
pub fn leader_election_role() -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(LEADER_ELECTION_ROLE_NAME.to_owned()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(policy_rules(LEADER_ELECTION_RULES)),
    }
}

/// `config/rbac/role.yaml`: the ClusterRole as YAML.
pub fn manager_cluster_role_yaml() -> Result<String, RbacError> {
    Ok(serde_yaml::to_string(&manager_cluster_role())?)
}

/// `config/rbac/leader_election_role.yaml`: the leader-election Role as YAML.
pub fn leader_election_role_yaml() -> Result<String, RbacError> {
    Ok(serde_yaml::to_string(&leader_election_role())?)
}

/// `config/rbac/haltsql_editor_role.yaml`.
pub fn editor_cluster_role_yaml() -> Result<String, RbacError> {
    Ok(serde_yaml::to_string(&editor_cluster_role())?)
}

/// `config/rbac/haltsql_viewer_role.yaml`.
pub fn viewer_cluster_role_yaml() -> Result<String, RbacError> {
    Ok(serde_yaml::to_string(&viewer_cluster_role())?)
}

/// The rules alone as a YAML list (included by the Helm chart).
pub fn rules_yaml(rules: &[Rule]) -> Result<String, RbacError> {
    Ok(serde_yaml::to_string(&policy_rules(rules))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_resources(rules: &[Rule]) -> Vec<&'static str> {
        rules
            .iter()
            .flat_map(|r| r.resources.iter().copied())
            .collect()
    }

    #[test]
    fn no_secrets_pods_or_cluster_scoped_resources() {
        for res in all_resources(MANAGER_RULES)
            .into_iter()
            .chain(all_resources(LEADER_ELECTION_RULES))
        {
            for forbidden in [
                "secrets",
                "pods",
                "namespaces",
                "nodes",
                "clusterroles",
                "clusterrolebindings",
                "customresourcedefinitions",
                "*",
            ] {
                assert_ne!(res, forbidden, "RBAC must not grant {forbidden}");
            }
        }
        for rule in MANAGER_RULES.iter().chain(LEADER_ELECTION_RULES) {
            assert!(!rule.verbs.contains(&"*"));
            assert!(!rule.api_groups.contains(&"*"));
        }
    }

    #[test]
    fn guide_table_plus_patch() {
        let verbs = |res: &str| -> Vec<&str> {
            MANAGER_RULES
                .iter()
                .filter(|r| r.resources.contains(&res))
                .flat_map(|r| r.verbs.iter().copied())
                .collect()
        };
        assert_eq!(verbs("haltsqlservers"), ["get", "list", "watch"]);
        assert_eq!(verbs("haltsqlpolicies/status"), ["update", "patch"]);
        assert_eq!(verbs("haltsqlservers/finalizers"), ["update"]);
        for owned in [
            "configmaps",
            "services",
            "deployments",
            "poddisruptionbudgets",
            "networkpolicies",
        ] {
            assert_eq!(verbs(owned), OWNED, "{owned}");
        }
        assert_eq!(verbs("replicasets"), READ);
    }

    #[test]
    fn renders_yaml() -> Result<(), RbacError> {
        let yaml = manager_cluster_role_yaml()?;
        assert!(yaml.starts_with("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n"));
        assert!(yaml.contains("- networkpolicies"));
        Ok(())
    }
}
