//! `haltsql-operator render`: the objects the operator would create for some
//! manifests, offline, for review in GitOps pipelines (like `helm template`).
//!
//! It runs the controllers' own steps without a cluster: judge each policy
//! exactly as the policy controller does (same `InvalidSpec` rules, same
//! `haltsql validate`), gate each server on its policies as the server
//! controller does, and call the same pure rendering. Where the controllers
//! would report a condition and keep the last good state, `render` fails
//! instead, so a pipeline stops before anything is applied.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde::Deserialize;

use crate::api::{HaltSQLPolicy, HaltSQLPolicyStatus, HaltSQLServer, set_condition};
use crate::controllers::context::{DEFAULT_ROLLOUT_DEADLINE, DEFAULT_VALIDATOR_TIMEOUT};
use crate::controllers::metrics::Metrics;
use crate::controllers::policy::{Judgement, Validator, judge};
use crate::controllers::server::{PolicyGate, ReadyPolicy, gate_policies_with};
use crate::manager::cli::RenderArgs;
use crate::render::content::content_hash;
use crate::render::{self, PolicyInput, RenderSettings};

/// Stands in for the server's uid in owner references: the API server
/// assigns the real one, which a manifest on disk does not have.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

#[derive(Debug, thiserror::Error)]
pub enum RenderCmdError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{place}: {source}")]
    Parse {
        place: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{place}: {kind} {key} is defined more than once")]
    Duplicate {
        place: String,
        kind: &'static str,
        key: String,
    },
    #[error("no HaltSQLServer in the given files")]
    NoServer,
    #[error("cannot set up the validator: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("HaltSQLPolicy {key} is not valid ({reason}):\n{message}")]
    InvalidPolicy {
        key: String,
        reason: &'static str,
        message: String,
    },
    #[error("HaltSQLPolicy {key}: the validator could not run: {message}")]
    Validator { key: String, message: String },
    #[error("HaltSQLServer {key}: {reason}: {message}")]
    PoliciesNotReady {
        key: String,
        reason: String,
        message: String,
    },
    #[error("HaltSQLServer {key}: {source}")]
    Render {
        key: String,
        #[source]
        source: render::RenderError,
    },
    #[error("writing YAML: {0}")]
    Serialize(#[source] serde_yaml::Error),
}

/// `namespace/name`.
fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn read_input(path: &Path) -> Result<String, RenderCmdError> {
    let read = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(path)
    };
    read.map_err(|source| RenderCmdError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The servers and policies found in the files, keyed by `namespace/name`.
#[derive(Default)]
struct Inputs {
    servers: BTreeMap<String, HaltSQLServer>,
    policies: BTreeMap<String, HaltSQLPolicy>,
}

fn parse_inputs(args: &RenderArgs) -> Result<Inputs, RenderCmdError> {
    let mut inputs = Inputs::default();
    for path in &args.files {
        let text = read_input(path)?;
        for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let place = format!("{}: document {}", path.display(), index + 1);
            let value = serde_yaml::Value::deserialize(document).map_err(|source| {
                RenderCmdError::Parse {
                    place: place.clone(),
                    source,
                }
            })?;
            let is_ours = value
                .get("apiVersion")
                .and_then(|v| v.as_str())
                .is_some_and(|v| v.starts_with("haltsql.dev/"));
            let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
            let parse_err = |source| RenderCmdError::Parse {
                place: format!("{place} ({kind})"),
                source,
            };
            // Secrets, Namespaces and the like are not the operator's business.
            match (is_ours, kind) {
                (true, "HaltSQLServer") => {
                    let mut server: HaltSQLServer =
                        serde_yaml::from_value(value.clone()).map_err(parse_err)?;
                    default_metadata(&mut server.metadata, &args.namespace);
                    let key = key_of(&server.namespace().unwrap_or_default(), &server.name_any());
                    if inputs.servers.insert(key.clone(), server).is_some() {
                        return Err(RenderCmdError::Duplicate {
                            place,
                            kind: "HaltSQLServer",
                            key,
                        });
                    }
                }
                (true, "HaltSQLPolicy") => {
                    let mut policy: HaltSQLPolicy =
                        serde_yaml::from_value(value.clone()).map_err(parse_err)?;
                    default_metadata(&mut policy.metadata, &args.namespace);
                    let key = key_of(&policy.namespace().unwrap_or_default(), &policy.name_any());
                    if inputs.policies.insert(key.clone(), policy).is_some() {
                        return Err(RenderCmdError::Duplicate {
                            place,
                            kind: "HaltSQLPolicy",
                            key,
                        });
                    }
                }
                _ => {}
            }
        }
    }
    Ok(inputs)
}

/// Renders the manifests' servers; returns the YAML stream to print.
pub async fn run(args: &RenderArgs) -> Result<String, RenderCmdError> {
    let Inputs {
        servers,
        mut policies,
    } = parse_inputs(args)?;
    if servers.is_empty() {
        return Err(RenderCmdError::NoServer);
    }

    let validator = Validator::new(
        args.haltsql_binary.clone(),
        DEFAULT_VALIDATOR_TIMEOUT,
        crate::controllers::context::default_validator_concurrency(),
        Metrics::new()?,
    );
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // Every policy in the files is judged, referenced or not: a pipeline
    // wants to hear about an invalid policy before it is applied.
    for (key, policy) in policies.iter_mut() {
        policy.status = Some(judged_status(key, policy, &validator, &now).await?);
    }

    let mut out = String::from(
        "# Rendered by `haltsql-operator render` for review. The operator creates these\n\
         # objects itself; the owner references carry a placeholder uid.\n",
    );
    for (key, server) in &servers {
        let namespace = server.namespace().unwrap_or_default();
        let lookup = |name: &str| {
            policies
                .get(&key_of(&namespace, name))
                .map(|p| Arc::new(p.clone()))
        };
        // Offline, only the policies' statuses judge them.
        let ready = match gate_policies_with(server, lookup, |_| None) {
            PolicyGate::Open(ready) => ready,
            PolicyGate::Closed { reason, message } => {
                return Err(RenderCmdError::PoliciesNotReady {
                    key: key.clone(),
                    reason: reason.to_string(),
                    message,
                });
            }
        };
        let inputs: Vec<PolicyInput<'_>> = ready.iter().map(ReadyPolicy::input).collect();
        // The controllers' default deadline: `render` has no flag for it.
        let settings = RenderSettings {
            rollout_deadline: Some(DEFAULT_ROLLOUT_DEADLINE),
        };
        let rendered = render::render_with(server, &inputs, settings).map_err(|source| {
            RenderCmdError::Render {
                key: key.clone(),
                source,
            }
        })?;
        push_yaml(&mut out, &rendered.config_map)?;
        push_yaml(&mut out, &rendered.deployment)?;
        push_yaml(&mut out, &rendered.service)?;
        if let Some(pdb) = &rendered.pod_disruption_budget {
            push_yaml(&mut out, pdb)?;
        }
        if let Some(np) = &rendered.network_policy {
            push_yaml(&mut out, np)?;
        }
    }
    Ok(out)
}

/// Objects from files have no uid or generation; give them what rendering needs.
fn default_metadata(meta: &mut kube::core::ObjectMeta, namespace: &str) {
    if meta.namespace.is_none() {
        meta.namespace = Some(namespace.to_owned());
    }
    if meta.uid.is_none() {
        meta.uid = Some(PLACEHOLDER_UID.to_owned());
    }
    meta.generation.get_or_insert(1);
}

/// The status the policy controller would write, or an error where it would
/// report the policy as not valid.
async fn judged_status(
    key: &str,
    policy: &HaltSQLPolicy,
    validator: &Validator,
    now: &Time,
) -> Result<HaltSQLPolicyStatus, RenderCmdError> {
    let judgement = judge(&policy.name_any(), &policy.spec, validator).await;
    let generation = policy.metadata.generation;
    let mut status = HaltSQLPolicyStatus {
        observed_generation: generation,
        content_hash: Some(content_hash(&policy.spec)),
        policy_name: judgement.policy_name().map(str::to_owned),
        ..Default::default()
    };
    match &judgement {
        Judgement::Validated { .. } => {}
        Judgement::ValidationFailed { message } => {
            return Err(RenderCmdError::InvalidPolicy {
                key: key.to_owned(),
                reason: "ValidationFailed",
                message: message.clone(),
            });
        }
        Judgement::InvalidSpec { message } => {
            return Err(RenderCmdError::InvalidPolicy {
                key: key.to_owned(),
                reason: "InvalidSpec",
                message: message.clone(),
            });
        }
        Judgement::NotAPolicy { message } => {
            return Err(RenderCmdError::InvalidPolicy {
                key: key.to_owned(),
                reason: "NotAPolicy",
                message: message.clone(),
            });
        }
        Judgement::ValidatorError { message } => {
            return Err(RenderCmdError::Validator {
                key: key.to_owned(),
                message: message.clone(),
            });
        }
    }
    set_condition(
        &mut status.conditions,
        judgement.condition(),
        generation,
        now,
    );
    Ok(status)
}

fn push_yaml<K: serde::Serialize>(out: &mut String, obj: &K) -> Result<(), RenderCmdError> {
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(obj).map_err(RenderCmdError::Serialize)?);
    Ok(())
}
