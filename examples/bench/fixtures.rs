//! The benchmark population: namespaces, HaltSQLPolicies, HaltSQLServers and
//! which server references which policy. Pure functions of the layout, so the
//! operator run and the `kubectl apply` floor get exactly the same objects.

use haltsql_testkit::fixtures;
use serde_json::{Value, json};

/// Label on every namespace and custom resource the benchmark creates.
pub const BENCH_LABEL: &str = "haltsql.dev/bench";
/// Namespaces the operator watches.
pub const OP_PREFIX: &str = "bench-op-";
/// Namespaces of the `kubectl apply --server-side` floor.
pub const FLOOR_PREFIX: &str = "bench-floor-";
/// Pod-template annotation carrying the config checksum.
pub const CHECKSUM_ANNOTATION: &str = "haltsql.dev/config-checksum";

/// How the population is spread.
#[derive(Clone, Debug)]
pub struct Layout {
    pub namespaces: usize,
    pub policies_per_ns: usize,
    pub servers_per_ns: usize,
    pub refs_per_server: usize,
    pub replicas: i32,
}

impl Layout {
    /// `policies` and `servers` in total over `namespaces`; each server
    /// references a window of consecutive policies a little wider than its
    /// share, so every policy is referenced and neighbours overlap.
    pub fn new(policies: usize, servers: usize, namespaces: usize) -> Self {
        let namespaces = namespaces.clamp(1, servers.max(1));
        let policies_per_ns = policies.div_ceil(namespaces).max(1);
        let servers_per_ns = servers.div_ceil(namespaces).max(1);
        let stride = policies_per_ns.div_ceil(servers_per_ns);
        let refs_per_server = (stride + 2).min(policies_per_ns);
        Layout {
            namespaces,
            policies_per_ns,
            servers_per_ns,
            refs_per_server,
            replicas: 2,
        }
    }

    pub fn total_policies(&self) -> usize {
        self.namespaces * self.policies_per_ns
    }

    pub fn total_servers(&self) -> usize {
        self.namespaces * self.servers_per_ns
    }

    fn stride(&self) -> usize {
        self.policies_per_ns.div_ceil(self.servers_per_ns)
    }

    /// Policy indices server `s` references (within its namespace).
    pub fn refs(&self, s: usize) -> Vec<usize> {
        (0..self.refs_per_server)
            .map(|i| (s * self.stride() + i) % self.policies_per_ns)
            .collect()
    }

    /// Servers (indices) referencing policy `p`.
    pub fn referencing(&self, p: usize) -> Vec<usize> {
        (0..self.servers_per_ns)
            .filter(|s| self.refs(*s).contains(&p))
            .collect()
    }
}

pub fn namespace(prefix: &str, i: usize) -> String {
    format!("{prefix}{i}")
}

pub fn policy_name(p: usize) -> String {
    format!("p-{p:04}")
}

pub fn server_name(s: usize) -> String {
    format!("s-{s:03}")
}

/// A typical policy document, unique per namespace, policy and edit so that
/// no two documents share a validator cache entry.
pub fn policy_document(ns: usize, p: usize, edit: Option<usize>) -> String {
    let unique = format!("c{ns}_{p}");
    let edited = edit.map(|e| format!("edit_{e}"));
    let mut columns = vec!["id", "status", "total_cents", "created_at", &unique];
    columns.extend(edited.as_deref());
    // The quick start of config/samples, renamed, with one more table.
    let mut document = fixtures::quick_start_policy_document(&columns).replace(
        "name: orders-agent\n",
        &format!("name: {}\n", policy_name(p)),
    );
    document.push_str("  app.customers:\n    columns: [id, country]\n");
    document
}

pub fn namespace_object(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {BENCH_LABEL: "true"}}
    })
}

pub fn token_secret(ns: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "haltsql-tokens", "namespace": ns, "labels": {BENCH_LABEL: "true"}},
        "stringData": {"agent.sha256": "0".repeat(64)}
    })
}

pub fn policy_object(ns_name: &str, ns: usize, p: usize) -> Value {
    json!({
        "apiVersion": "haltsql.dev/v1alpha1", "kind": "HaltSQLPolicy",
        "metadata": {"name": policy_name(p), "namespace": ns_name, "labels": {BENCH_LABEL: "true"}},
        "spec": {"policy": policy_document(ns, p, None)}
    })
}

/// The guide's quick-start server shape (token, PDB and NetworkPolicy on).
pub fn server_object(layout: &Layout, ns_name: &str, s: usize) -> Value {
    let refs = layout.refs(s);
    let policies: Vec<Value> = refs
        .iter()
        .map(|p| json!({"name": policy_name(*p)}))
        .collect();
    json!({
        "apiVersion": "haltsql.dev/v1alpha1", "kind": "HaltSQLServer",
        "metadata": {"name": server_name(s), "namespace": ns_name, "labels": {BENCH_LABEL: "true"}},
        "spec": {
            "replicas": layout.replicas,
            "image": "ghcr.io/haltsql/haltsql:0.0.1",
            "policies": policies,
            "auth": {"tokens": [{
                "name": "agent",
                "policy": policy_name(refs[0]),
                "sha256SecretRef": {"name": "haltsql-tokens", "key": "agent.sha256"}
            }]},
            "podDisruptionBudget": {"enabled": true},
            "networkPolicy": {"enabled": true, "ingressFrom": [{"podSelector": {"matchLabels": {"app": "agents"}}}]}
        }
    })
}

/// An unlabelled ConfigMap of about 1 KiB that the operator must not cache.
pub fn unrelated_config_map(ns: &str, i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("unrelated-{i:05}"), "namespace": ns},
        "data": {"payload": format!("{i:05}-").repeat(170)}
    })
}

/// An unlabelled Deployment with no replicas (no pods), that the operator must not cache.
pub fn unrelated_deployment(ns: &str, i: usize) -> Value {
    let labels = json!({"app": format!("unrelated-{i:04}")});
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("unrelated-{i:04}"), "namespace": ns},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "registry.example/unrelated:1",
                    "env": [{"name": "INDEX", "value": i.to_string()}]}]}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_is_referenced() {
        for (n, m, ns) in [(100, 10, 5), (1000, 100, 10), (7, 3, 2)] {
            let l = Layout::new(n, m, ns);
            for p in 0..l.policies_per_ns {
                assert!(!l.referencing(p).is_empty(), "{l:?} policy {p}");
            }
        }
    }
}
