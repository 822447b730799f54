//! `haltsql-operator render`: the objects the operator would create for some
//! manifests, offline. It runs the same steps as the controllers: validate each
//! policy with the haltsql CLI, gate the server on them, render.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde::Deserialize;

use crate::api::{
    ConditionStatus, DesiredCondition, HaltSQLPolicy, HaltSQLPolicyStatus, HaltSQLServer,
    ValidReason, set_condition,
};
use crate::cli::RenderArgs;
use crate::metrics::Metrics;
use crate::policy::{Validator, Verdict};
use crate::render::content::{content_hash, validation_document};
use crate::render::{self, PolicyInput};
use crate::server::{PolicyGate, gate_policies_with, with_rollout_deadline};

const ROLLOUT_DEADLINE: Duration = Duration::from_secs(180);

fn read_input(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

pub async fn run(args: &RenderArgs) -> anyhow::Result<()> {
    let mut servers = Vec::new();
    let mut policies: BTreeMap<String, HaltSQLPolicy> = BTreeMap::new();
    for path in &args.files {
        let text = read_input(path)?;
        for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = serde_yaml::Value::deserialize(document)
                .with_context(|| format!("{}: document {}", path.display(), index + 1))?;
            if value.is_null() {
                continue;
            }
            let kind = value
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or_default()
                .to_owned();
            let place = format!("{}: document {} ({kind})", path.display(), index + 1);
            match kind.as_str() {
                "HaltSQLServer" => {
                    let mut server: HaltSQLServer =
                        serde_yaml::from_value(value).with_context(|| place.clone())?;
                    default_metadata(&mut server.metadata, &args.namespace);
                    servers.push(server);
                }
                "HaltSQLPolicy" => {
                    let mut policy: HaltSQLPolicy =
                        serde_yaml::from_value(value).with_context(|| place.clone())?;
                    default_metadata(&mut policy.metadata, &args.namespace);
                    policies.insert(policy.name_any(), policy);
                }
                _ => {} // Secrets, Namespaces and the like are not the operator's business.
            }
        }
    }
    if servers.is_empty() {
        bail!("no HaltSQLServer in the given files");
    }

    let validator = Validator::new(
        args.haltsql_binary.clone(),
        Duration::from_secs(30),
        Metrics::new()?,
    );
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    for policy in policies.values_mut() {
        policy.status = Some(verdict_status(policy, &validator, &now).await?);
    }

    let mut out = String::new();
    for server in &servers {
        let lookup = |name: &str| {
            policies
                .get(name)
                .filter(|p| p.namespace() == server.namespace())
                .map(|p| Arc::new(p.clone()))
        };
        let ready = match gate_policies_with(server, lookup) {
            PolicyGate::Open(ready) => ready,
            PolicyGate::Closed { reason, message } => {
                bail!("HaltSQLServer {}: {reason}: {message}", server.name_any())
            }
        };
        let inputs: Vec<PolicyInput<'_>> = ready
            .iter()
            .map(|p| PolicyInput {
                object_name: &p.object_name,
                policy_name: &p.policy_name,
                content_hash: &p.content_hash,
                spec: &p.spec,
            })
            .collect();
        let rendered = render::render(server, &inputs)
            .map_err(|e| anyhow::anyhow!("HaltSQLServer {}: {e}", server.name_any()))?;
        let deployment = with_rollout_deadline(rendered.deployment, ROLLOUT_DEADLINE);
        push_yaml(&mut out, &rendered.config_map)?;
        push_yaml(&mut out, &deployment)?;
        push_yaml(&mut out, &rendered.service)?;
        if let Some(pdb) = &rendered.pod_disruption_budget {
            push_yaml(&mut out, pdb)?;
        }
        if let Some(np) = &rendered.network_policy {
            push_yaml(&mut out, np)?;
        }
    }
    print!("{out}");
    Ok(())
}

/// Objects from files have no uid or generation; give them what rendering needs.
fn default_metadata(meta: &mut kube::core::ObjectMeta, namespace: &str) {
    if meta.namespace.is_none() {
        meta.namespace = Some(namespace.to_owned());
    }
    if meta.uid.is_none() {
        // The owner reference needs a uid; the real one is assigned by the API server.
        meta.uid = Some("00000000-0000-0000-0000-000000000000".to_owned());
    }
    meta.generation.get_or_insert(1);
}

async fn verdict_status(
    policy: &HaltSQLPolicy,
    validator: &Validator,
    now: &Time,
) -> anyhow::Result<HaltSQLPolicyStatus> {
    let name = policy.name_any();
    let document = validation_document(&name, &policy.spec)
        .map_err(|e| anyhow::anyhow!("HaltSQLPolicy {name}: {e}"))?;
    let generation = policy.metadata.generation;
    let mut status = HaltSQLPolicyStatus {
        observed_generation: generation,
        content_hash: Some(content_hash(&policy.spec)),
        ..Default::default()
    };
    let condition = match validator.validate(&document).await {
        Verdict::Valid { policy_name } => {
            // A bundle's documents are not known offline: its object name stands in.
            status.policy_name = Some(policy_name.unwrap_or_else(|| name.clone()));
            DesiredCondition::new(ConditionStatus::True, ValidReason::Validated, "valid")
        }
        Verdict::Invalid { message } => bail!("HaltSQLPolicy {name} is not valid:\n{message}"),
        Verdict::Error { message } => bail!("HaltSQLPolicy {name}: could not validate: {message}"),
    };
    set_condition(&mut status.conditions, condition, generation, now);
    Ok(status)
}

fn push_yaml<K: serde::Serialize>(out: &mut String, obj: &K) -> anyhow::Result<()> {
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(obj)?);
    Ok(())
}
