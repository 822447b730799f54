//! What the scenarios run: a namespace with policies and servers, edits, the
//! state they must converge to (computed with the operator's own pure
//! rendering), and a fingerprint of the converged state to compare runs.

use std::collections::BTreeMap;
use std::time::Duration;

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use haltsql_operator::render::{self, PolicyInput};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use sha2::{Digest, Sha256};

use haltsql_testkit::fixtures;

use crate::objects::{policy_object, quick_start_server_loading as server_object};

/// A policy document named `name` (its `metadata.name`), allowing `columns`,
/// with `description` when given (the misbehaving validator keys on it).
pub fn document(name: &str, columns: &[&str], description: Option<&str>) -> String {
    let doc = fixtures::quick_start_policy_document(columns).replace("orders-agent", name);
    match description {
        Some(d) => doc.replace(
            &format!("metadata:\n  name: {name}\n"),
            &format!("metadata:\n  name: {name}\n  description: {d}\n"),
        ),
        None => doc,
    }
}

/// A document haltsql rejects (a misspelt key).
pub fn invalid_document(name: &str) -> String {
    document(name, &["id"], None).replace("columns:", "colums:")
}

/// Policies (object name -> document) and servers (name -> policy objects).
#[derive(Clone)]
pub struct Workload {
    pub ns: String,
    pub policies: BTreeMap<String, String>,
    pub servers: BTreeMap<String, Vec<String>>,
}

impl Workload {
    /// Three policies and two servers sharing one of them.
    pub fn standard(ns: &str) -> Workload {
        let mut policies = BTreeMap::new();
        policies.insert(
            "orders".to_owned(),
            document("orders-agent", &["id", "status"], None),
        );
        policies.insert("p1".to_owned(), document("agent-1", &["id"], None));
        policies.insert("p2".to_owned(), document("agent-2", &["id"], None));
        let mut servers = BTreeMap::new();
        servers.insert("hs-a".to_owned(), vec!["orders".into(), "p1".into()]);
        servers.insert("hs-b".to_owned(), vec!["orders".into(), "p2".into()]);
        Workload {
            ns: ns.to_owned(),
            policies,
            servers,
        }
    }

    pub async fn create(&self, client: &kube::Client) {
        fixtures::create_token_secret(client, &self.ns, fixtures::TEST_TOKEN_SHA256).await;
        let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &self.ns);
        for (name, doc) in &self.policies {
            policies
                .create(&PostParams::default(), &policy_object(name, doc))
                .await
                .unwrap();
        }
        let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &self.ns);
        for (name, refs) in &self.servers {
            let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
            servers
                .create(&PostParams::default(), &server_object(name, &refs))
                .await
                .unwrap();
        }
    }

    /// Sets a policy's document (recorded as its final content). Retries
    /// while the API server does not answer.
    pub async fn edit(&mut self, client: &kube::Client, policy: &str, doc: String) {
        let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &self.ns);
        let patch = serde_json::json!({"spec": {"policy": doc}});
        haltsql_testkit::eventually(
            &format!("editing policy {policy}"),
            Duration::from_secs(60),
            || async {
                policies
                    .patch(policy, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await;
        self.policies.insert(policy.to_owned(), doc);
    }

    /// The config checksum each server must end up with.
    pub fn expected_checksums(&self) -> BTreeMap<String, String> {
        let specs: BTreeMap<&String, HaltSQLPolicy> = self
            .policies
            .iter()
            .map(|(n, d)| (n, policy_object(n, d)))
            .collect();
        let names: BTreeMap<&String, String> = self
            .policies
            .iter()
            .map(|(n, d)| {
                let name = d
                    .lines()
                    .skip_while(|l| *l != "metadata:")
                    .find_map(|l| l.trim().strip_prefix("name: "))
                    .unwrap()
                    .to_owned();
                (n, name)
            })
            .collect();
        self.servers
            .iter()
            .map(|(server, refs)| {
                let mut obj =
                    server_object(server, &refs.iter().map(String::as_str).collect::<Vec<_>>());
                obj.metadata.namespace = Some(self.ns.clone());
                let inputs: Vec<PolicyInput<'_>> = refs
                    .iter()
                    .map(|r| PolicyInput {
                        object_name: r,
                        policy_name: &names[r],
                        content_hash: "",
                        spec: &specs[r].spec,
                    })
                    .collect();
                let rendered = render::render(&obj, &inputs).unwrap();
                (server.clone(), rendered.checksum)
            })
            .collect()
    }

    /// `Some(fingerprint)` once everything reflects the final specs: every
    /// policy Valid for its generation with its content's hash, every server
    /// observed, rendered with the expected checksum, rolled out and Ready,
    /// every policy Synced.
    pub async fn converged(&self, client: &kube::Client) -> Option<Fingerprint> {
        let expected = self.expected_checksums();
        let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &self.ns);
        let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &self.ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &self.ns);
        let mut fp = Fingerprint::default();
        for p in policies.list(&ListParams::default()).await.ok()?.items {
            let name = p.metadata.name.clone()?;
            let status = p.status.as_ref()?;
            let doc = self.policies.get(&name)?;
            if status.observed_generation != p.metadata.generation
                || status.content_hash.as_deref()
                    != Some(hex::encode(Sha256::digest(doc.as_bytes()))).as_deref()
            {
                return None;
            }
            let conditions = conditions(&status.conditions);
            if !conditions.contains("Valid=True/Validated")
                || !conditions.contains("Synced=True/Synced")
            {
                return None;
            }
            fp.0.insert(format!("policy {name}"), conditions);
        }
        for s in servers.list(&ListParams::default()).await.ok()?.items {
            let name = s.metadata.name.clone()?;
            let status = s.status.as_ref()?;
            if status.observed_generation != s.metadata.generation
                || status.config_checksum.as_ref() != expected.get(&name)
            {
                return None;
            }
            let conditions = conditions(&status.conditions);
            if !conditions.contains("Ready=True/Ready") {
                return None;
            }
            let template = deployments
                .get(&name)
                .await
                .ok()?
                .spec?
                .template
                .metadata?
                .annotations?
                .get("haltsql.dev/config-checksum")
                .cloned();
            if template.as_ref() != expected.get(&name) {
                return None;
            }
            let applied: Vec<String> = status
                .applied_policies
                .iter()
                .flatten()
                .map(|a| a.name.clone())
                .collect();
            fp.0.insert(
                format!("server {name}"),
                format!("{conditions} applied={}", applied.join(",")),
            );
        }
        (fp.0.len() == self.policies.len() + self.servers.len()).then_some(fp)
    }
}

/// Conditions (type=status/reason) and applied policies of every object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint(pub BTreeMap<String, String>);

fn conditions(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> String {
    let mut all: Vec<String> = conditions
        .iter()
        .map(|c| format!("{}={}/{}", c.type_, c.status, c.reason))
        .collect();
    all.sort();
    all.join(" ")
}
