//! One pass of the policy loop.
//!
//! 1. Hash the content (`render::content_hash`).
//! 2. If the status already judges this generation and this content, and the
//!    judgement is a real one (not `ValidatorError`), keep it: a resync costs
//!    no subprocess.
//! 3. Otherwise decide what the operator can tell by itself (`InvalidSpec`)
//!    and hand everything else to `haltsql validate` (whose cache makes
//!    content seen before free).
//! 4. Work out `Synced` from the servers in the shared store.
//! 5. Write the status only if it differs from what is stored, with the
//!    resourceVersion that was read; a conflict is normal and requeues
//!    quietly.
//!
//! The rule for `InvalidSpec` versus `ValidationFailed`: `InvalidSpec` is
//! only for a spec the operator can reject with certainty without haltsql,
//! because the problem lies in how the object is put together rather than
//! in the policy language:
//! - neither or both of `policy` and `bundleSource` (the API server rejects
//!   this; objects from before the CEL rule may still carry it);
//! - an inline policy larger than 256 KiB (idem);
//! - an inline policy whose top-level `catalog` is a string, i.e. a file
//!   reference, which neither the operator nor the pods can resolve;
//! - a bundle source that cannot be turned into a `bundle_source` entry
//!   (no location, a Secret reference that is not a valid name).
//!
//! `NotAPolicy` is the one check of the document the operator makes first:
//! an inline `spec.policy` whose top-level `kind` is anything but `Policy`
//! (a `kind: Config` above all, which would make the validator resolve
//! `${file:}` placeholders and open the files it names, an oracle for the
//! operator pod's files) never reaches a validator. Every run is sealed
//! besides (`haltsql validate --sealed`), so a document that slips past
//! this check still cannot make the validator read anything else.
//!
//! Everything about the document itself goes to haltsql and is
//! `ValidationFailed` with located errors, including YAML that does not
//! parse: haltsql reports the line and column, the operator could not do
//! better, and both are the user's mistake in the same place.
//!
//! For a bundle source, `policyName` is the name of its `bundle_source`
//! entry in the rendered config, which is the HaltSQLPolicy's own name
//! (a bundle brings its policies only when the server fetches it). That is
//! the name servers list in `appliedPolicies`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Deserialize;
use tracing::info;

use super::ahead::judgement_of;
use super::validator::{Validator, Verdict};
use crate::api::{
    ConditionStatus, DesiredCondition, HaltSQLPolicy, HaltSQLPolicySpec, HaltSQLPolicyStatus,
    HaltSQLServer, MAX_POLICY_BYTES, PolicyConditionType, PolicySource, SyncedReason,
    find_condition, set_condition,
};
use crate::controllers::backoff::Backoff;
use crate::controllers::context::Context;
use crate::controllers::judgement::Judgement;
use crate::controllers::metrics::ControllerKind;
use crate::controllers::reconcile::{self as wrapper, Pass, PassError, Reconciled, is_conflict};
use crate::controllers::server;
use crate::render;

/// Servers named in a `Synced` message before the rest are counted.
const MAX_LISTED_SERVERS: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("HaltSQLPolicy has no namespace")]
    NotNamespaced,
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl PassError for Error {
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(e) if is_conflict(e))
    }
}

impl Reconciled for HaltSQLPolicy {
    const CONTROLLER: ControllerKind = ControllerKind::Policy;
    const CONFLICT_REQUEUE: Duration = Duration::from_millis(500);

    fn store(ctx: &Context) -> &Store<Self> {
        &ctx.policies
    }

    fn backoff(ctx: &Context) -> &Backoff {
        &ctx.policy_backoff
    }

    fn pass_limit(ctx: &Context) -> &tokio::sync::Semaphore {
        &ctx.pass_limits.policy
    }
}

/// Reconciles one HaltSQLPolicy.
pub async fn reconcile(policy: Arc<HaltSQLPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    wrapper::reconcile(policy, ctx, |policy, ctx| async move {
        reconcile_policy(&policy, &ctx).await
    })
    .await
}

/// Requeues a failed reconcile with per-object exponential backoff.
pub fn error_policy(policy: Arc<HaltSQLPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    wrapper::error_policy(policy, error, ctx)
}

async fn reconcile_policy(policy: &HaltSQLPolicy, ctx: &Context) -> Result<Pass, Error> {
    // Policies are namespaced; a cluster-scoped one would be a broken CRD.
    policy.namespace().ok_or(Error::NotNamespaced)?;
    let generation = policy.metadata.generation;
    let hash = render::content_hash(&policy.spec);
    let current = policy.status.clone().unwrap_or_default();

    let judgement = match Judgement::from_status(&current, generation, &hash) {
        Some(known) => known,
        None => judgement_of(policy, &hash, ctx).await,
    };
    let synced = synced_condition(policy, &judgement, &hash, &ctx.servers);

    let now = now();
    let mut status = current.clone();
    status.observed_generation = generation;
    status.content_hash = Some(hash);
    status.policy_name = judgement.policy_name().map(str::to_owned);
    set_condition(
        &mut status.conditions,
        judgement.condition(),
        generation,
        &now,
    );
    set_condition(&mut status.conditions, synced, generation, &now);

    if policy.status.as_ref() != Some(&status) {
        log_change(&current, &status);
        ctx.write_status(policy, policy.status.as_ref(), &status)
            .await?;
    }
    Ok(match judgement {
        // The status says ValidatorError; try again, slower each time.
        Judgement::ValidatorError { .. } => Pass::Retry,
        _ => Pass::Done,
    })
}

/// `InvalidSpec` for what the operator can tell itself, `haltsql validate`
/// for the rest (see the module docs for the rule).
pub async fn judge(
    object_name: &str,
    spec: &HaltSQLPolicySpec,
    validator: &Validator,
) -> Judgement {
    if let Some(message) = invalid_spec(spec) {
        return Judgement::InvalidSpec { message };
    }
    if let Some(message) = not_a_policy(spec) {
        return Judgement::NotAPolicy { message };
    }
    let doc = match render::validation_document(object_name, spec) {
        Ok(doc) => doc,
        Err(e) => {
            return Judgement::InvalidSpec {
                message: e.to_string(),
            };
        }
    };
    let bundle = matches!(spec.source(), Ok(PolicySource::Bundle(_)));
    match validator.validate(&doc).await {
        Verdict::Valid { policy_name } => match (bundle, policy_name) {
            (true, _) => Judgement::Validated {
                policy_name: object_name.to_owned(),
            },
            (false, Some(policy_name)) => Judgement::Validated { policy_name },
            (false, None) => Judgement::ValidatorError {
                message: "haltsql validate accepted the policy but reported no metadata.name"
                    .to_owned(),
            },
        },
        Verdict::Invalid { message } => Judgement::ValidationFailed { message },
        Verdict::Error { message } => Judgement::ValidatorError { message },
    }
}

/// The spec problems the operator reports itself, without haltsql.
pub fn invalid_spec(spec: &HaltSQLPolicySpec) -> Option<String> {
    let source = match spec.source() {
        Ok(source) => source,
        Err(e) => return Some(e.to_string()),
    };
    let PolicySource::Inline(text) = source else {
        return None;
    };
    if text.len() > MAX_POLICY_BYTES {
        return Some(format!(
            "spec.policy is {} bytes; at most {MAX_POLICY_BYTES} are allowed",
            text.len()
        ));
    }
    if let Some(file) = catalog_file_reference(text) {
        return Some(format!(
            "spec.policy: catalog refers to the file {file:?}, which neither the operator nor the server pods have; write the catalog snapshot inline, or ship it in a signed bundle (bundleSource)"
        ));
    }
    None
}

/// Why an inline `spec.policy` is not a `kind: Policy` document, if it is
/// not. A document that does not parse as a mapping is left to haltsql,
/// which locates the syntax error (and runs sealed, so it reads nothing).
pub fn not_a_policy(spec: &HaltSQLPolicySpec) -> Option<String> {
    let Ok(PolicySource::Inline(text)) = spec.source() else {
        return None;
    };
    let serde_yaml::Value::Mapping(map) = serde_yaml::from_str::<serde_yaml::Value>(text).ok()?
    else {
        return None;
    };
    let shown = match map.get("kind") {
        Some(serde_yaml::Value::String(kind)) if kind == "Policy" => return None,
        Some(serde_yaml::Value::String(kind)) => format!("kind: {}", truncate_kind(kind)),
        Some(_) => "a kind that is not a string".to_owned(),
        None => "no kind".to_owned(),
    };
    Some(format!(
        "spec.policy must be a kind: Policy document, this one has {shown}; a HaltSQLPolicy holds one policy (a server's Config is rendered by the operator from the HaltSQLServer), and no validator is run for anything else"
    ))
}

/// A `kind` value shown in a message: one line, at most 64 characters.
fn truncate_kind(kind: &str) -> String {
    let mut out: String = kind
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(64)
        .collect();
    if kind.chars().count() > 64 {
        out.push_str("...");
    }
    out
}

/// The top-level `catalog` of a policy document when it is a string (a file
/// reference). A document that does not parse is left to haltsql, which
/// locates the syntax error.
fn catalog_file_reference(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        catalog: Option<serde_yaml::Value>,
    }
    match serde_yaml::from_str::<Probe>(text).ok()?.catalog? {
        serde_yaml::Value::String(file) => Some(file),
        _ => None,
    }
}

/// `Synced` from the servers that reference the policy.
fn synced_condition(
    policy: &HaltSQLPolicy,
    judgement: &Judgement,
    hash: &str,
    servers: &Store<HaltSQLServer>,
) -> DesiredCondition {
    let Some(policy_name) = judgement.policy_name() else {
        return DesiredCondition::new(
            ConditionStatus::False,
            SyncedReason::NotValid,
            "the policy is not valid for its current generation, so no server loads it",
        );
    };
    let mut referencing = server::servers_listing(servers, policy);
    if referencing.is_empty() {
        return DesiredCondition::new(
            ConditionStatus::False,
            SyncedReason::NotReferenced,
            "no HaltSQLServer references this policy",
        );
    }
    // Sorted, so the message is the same on every pass.
    referencing.sort_by_key(|s| s.name_any());
    if referencing
        .iter()
        .all(|s| has_applied(s, policy_name, hash))
    {
        DesiredCondition::new(
            ConditionStatus::True,
            SyncedReason::Synced,
            format!(
                "every referencing HaltSQLServer runs this content: {}",
                name_list(referencing.iter().map(|s| s.name_any()).collect())
            ),
        )
    } else {
        DesiredCondition::new(
            ConditionStatus::False,
            SyncedReason::RollingOut,
            // Names every referencing server, not only those still rolling
            // out: the message stays the same until the last one is done, so
            // a rollout costs the policy no status write per server.
            format!(
                "not every referencing HaltSQLServer runs this content yet (their Progressing condition tells how far each is): {}",
                name_list(referencing.iter().map(|s| s.name_any()).collect())
            ),
        )
    }
}

/// Whether the server's fully rolled-out configuration has this content.
fn has_applied(server: &HaltSQLServer, policy_name: &str, hash: &str) -> bool {
    server
        .status
        .as_ref()
        .and_then(|s| s.applied_policies.as_ref())
        .is_some_and(|applied| {
            applied
                .iter()
                .any(|a| a.name == policy_name && a.content_hash == hash)
        })
}

fn name_list(names: Vec<String>) -> String {
    let total = names.len();
    let mut listed: Vec<String> = names.into_iter().take(MAX_LISTED_SERVERS).collect();
    if total > MAX_LISTED_SERVERS {
        listed.push(format!("and {} more", total - MAX_LISTED_SERVERS));
    }
    listed.join(", ")
}

/// The HaltSQLPolicies a server references: the mapper that requeues them
/// when the server (and so its `appliedPolicies`) changes.
pub fn policies_referenced_by(
    server: &HaltSQLServer,
) -> impl Iterator<Item = ObjectRef<HaltSQLPolicy>> + use<> {
    let namespace = server.namespace();
    let refs: Vec<ObjectRef<HaltSQLPolicy>> = server
        .spec
        .policies
        .iter()
        .map(|p| {
            let reference = ObjectRef::new(&p.name);
            match namespace.as_deref() {
                Some(ns) => reference.within(ns),
                None => reference,
            }
        })
        .collect();
    refs.into_iter()
}

/// [`policies_referenced_by`], plus the policies of the server's namespace
/// whose `policyName` its `appliedPolicies` lists: when a server stops
/// referencing a policy, the event that shows the new spec still shows the
/// old rollout, so the dropped policy learns at once that it is no longer
/// referenced. (A policy dropped before any rollout of it completed waits
/// for the resync.) Meant as the mapper of the server watch, with the
/// policies' shared store.
pub fn policies_affected_by(
    server: &HaltSQLServer,
    policies: &Store<HaltSQLPolicy>,
) -> impl Iterator<Item = ObjectRef<HaltSQLPolicy>> + use<> {
    let mut refs: Vec<ObjectRef<HaltSQLPolicy>> = policies_referenced_by(server).collect();
    let applied: Vec<&str> = server
        .status
        .as_ref()
        .and_then(|s| s.applied_policies.as_ref())
        .map(|a| a.iter().map(|a| a.name.as_str()).collect())
        .unwrap_or_default();
    if !applied.is_empty() {
        // Every server event looks at every policy: the namespace first, and
        // compared in place (`namespace()` would copy one per policy).
        for policy in policies.state() {
            if policy.metadata.namespace != server.metadata.namespace {
                continue;
            }
            let loaded = policy
                .status
                .as_ref()
                .and_then(|s| s.policy_name.as_deref())
                .is_some_and(|name| applied.contains(&name));
            if loaded {
                let reference = ObjectRef::from_obj(policy.as_ref());
                if !refs.contains(&reference) {
                    refs.push(reference);
                }
            }
        }
    }
    refs.into_iter()
}

/// The current time at whole seconds: conditions are stored that way, and
/// a value that round-trips unchanged keeps comparisons exact.
fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

fn log_change(old: &HaltSQLPolicyStatus, new: &HaltSQLPolicyStatus) {
    for type_ in [PolicyConditionType::Valid, PolicyConditionType::Synced] {
        let before = find_condition(&old.conditions, type_.as_str());
        let after = find_condition(&new.conditions, type_.as_str());
        if let Some(after) = after {
            let changed =
                before.is_none_or(|b| b.status != after.status || b.reason != after.reason);
            if changed {
                info!(
                    condition = type_.as_str(),
                    status = %after.status,
                    reason = %after.reason,
                    "condition changed"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        AppliedPolicy, BundleSource, HaltSQLServerSpec, HaltSQLServerStatus, PolicyReference,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn inline(text: &str) -> HaltSQLPolicySpec {
        HaltSQLPolicySpec {
            policy: Some(text.to_owned()),
            bundle_source: None,
        }
    }

    #[test]
    fn only_a_kind_policy_document_passes_the_kind_check() {
        let head = "apiVersion: haltsql.dev/v1\n";
        assert_eq!(
            not_a_policy(&inline(&format!(
                "{head}kind: Policy\nmetadata: {{name: a}}\n"
            ))),
            None
        );
        let config = not_a_policy(&inline(&format!("{head}kind: Config\n"))).expect("refused");
        assert!(config.contains("this one has kind: Config;"), "{config}");
        let none = not_a_policy(&inline(head)).expect("refused");
        assert!(none.contains("this one has no kind;"), "{none}");
        let list = not_a_policy(&inline(&format!("{head}kind: [Policy]\n"))).expect("refused");
        assert!(list.contains("a kind that is not a string"), "{list}");
        let long = not_a_policy(&inline(&format!("kind: \"{}\\nx\"\n", "K".repeat(100))))
            .expect("refused");
        assert!(
            long.contains(&format!("kind: {}...", "K".repeat(64))),
            "{long}"
        );
        // Left to haltsql, which locates the syntax error (sealed).
        assert_eq!(not_a_policy(&inline("kind: [")), None);
        assert_eq!(not_a_policy(&inline("- a list")), None);
    }

    #[test]
    fn catalog_file_reference_is_invalid_spec() {
        let spec = inline("apiVersion: haltsql.dev/v1\nkind: Policy\ncatalog: ./schema.json\n");
        let message = invalid_spec(&spec).unwrap_or_default();
        assert!(message.contains("\"./schema.json\""), "{message}");
        // An inline snapshot is for haltsql to judge.
        let spec = inline("kind: Policy\ncatalog: {schemas: {}}\n");
        assert_eq!(invalid_spec(&spec), None);
        // So is a document that does not parse, or one nested elsewhere.
        assert_eq!(invalid_spec(&inline("catalog: [\n")), None);
        assert_eq!(invalid_spec(&inline("tables: {catalog: x}\n")), None);
        assert_eq!(invalid_spec(&inline("- catalog: x\n")), None);
        // JSON is YAML.
        assert!(invalid_spec(&inline(r#"{"kind": "Policy", "catalog": "s.json"}"#)).is_some());
    }

    #[test]
    fn neither_or_both_sources_and_oversize_are_invalid_spec() {
        assert!(invalid_spec(&HaltSQLPolicySpec::default()).is_some());
        let both = HaltSQLPolicySpec {
            policy: Some("x".into()),
            bundle_source: Some(BundleSource::default()),
        };
        assert!(invalid_spec(&both).is_some());
        let big = inline(&"#".repeat(MAX_POLICY_BYTES + 1));
        assert!(invalid_spec(&big).unwrap_or_default().contains("at most"));
    }

    fn status_with(valid: (&str, &str), generation: i64, hash: &str) -> HaltSQLPolicyStatus {
        HaltSQLPolicyStatus {
            observed_generation: Some(generation),
            policy_name: Some("p".into()),
            content_hash: Some(hash.into()),
            conditions: vec![Condition {
                type_: "Valid".into(),
                status: valid.0.into(),
                reason: valid.1.into(),
                message: "m".into(),
                observed_generation: Some(generation),
                last_transition_time: now(),
            }],
        }
    }

    #[test]
    fn status_is_reused_only_for_the_same_generation_content_and_a_real_verdict() {
        let s = status_with(("True", "Validated"), 3, "h");
        assert_eq!(
            Judgement::from_status(&s, Some(3), "h"),
            Some(Judgement::Validated {
                policy_name: "p".into()
            })
        );
        assert_eq!(Judgement::from_status(&s, Some(4), "h"), None);
        assert_eq!(Judgement::from_status(&s, Some(3), "other"), None);
        let s = status_with(("False", "ValidationFailed"), 3, "h");
        assert_eq!(
            Judgement::from_status(&s, Some(3), "h"),
            Some(Judgement::ValidationFailed {
                message: "m".into()
            })
        );
        let s = status_with(("Unknown", "ValidatorError"), 3, "h");
        assert_eq!(Judgement::from_status(&s, Some(3), "h"), None);
    }

    fn server(name: &str, policies: &[&str], applied: &[(&str, &str)]) -> HaltSQLServer {
        let mut s = HaltSQLServer::new(
            name,
            HaltSQLServerSpec {
                policies: policies
                    .iter()
                    .map(|p| PolicyReference { name: (*p).into() })
                    .collect(),
                ..Default::default()
            },
        );
        s.metadata.namespace = Some("ns".into());
        s.status = Some(HaltSQLServerStatus {
            applied_policies: Some(
                applied
                    .iter()
                    .map(|(n, h)| AppliedPolicy {
                        name: (*n).into(),
                        content_hash: (*h).into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        s
    }

    #[test]
    fn mapper_yields_the_referenced_policies_in_the_server_namespace() {
        let s = server("s", &["a", "b"], &[]);
        let refs: Vec<_> = policies_referenced_by(&s).collect();
        assert_eq!(
            refs,
            vec![
                ObjectRef::<HaltSQLPolicy>::new("a").within("ns"),
                ObjectRef::<HaltSQLPolicy>::new("b").within("ns"),
            ]
        );
    }

    #[test]
    fn affected_policies_include_those_the_server_still_runs() {
        use kube::runtime::reflector::store;
        use kube::runtime::watcher::Event;
        let (reader, mut writer) = store::<HaltSQLPolicy>();
        let policy = |object: &str, ns: &str, policy_name: &str| {
            let mut p = HaltSQLPolicy::new(object, inline("x"));
            p.metadata.namespace = Some(ns.into());
            p.status = Some(HaltSQLPolicyStatus {
                policy_name: Some(policy_name.into()),
                ..Default::default()
            });
            p
        };
        for p in [
            policy("dropped", "ns", "orders-agent"),
            policy("kept", "ns", "kept-agent"),
            policy("elsewhere", "other", "orders-agent"),
            policy("unrelated", "ns", "unrelated"),
        ] {
            writer.apply_watcher_event(&Event::Apply(p));
        }
        // The spec no longer names "dropped"; the last rollout still ran it.
        let s = server(
            "s",
            &["kept"],
            &[("orders-agent", "h"), ("kept-agent", "h")],
        );
        let mut names: Vec<String> = policies_affected_by(&s, &reader)
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect();
        names.sort();
        assert_eq!(names, ["ns/dropped", "ns/kept"]);
    }

    #[test]
    fn applied_needs_name_and_hash() {
        let s = server("s", &["obj"], &[("p", "h1")]);
        assert!(has_applied(&s, "p", "h1"));
        assert!(!has_applied(&s, "p", "h2"));
        assert!(!has_applied(&s, "q", "h1"));
    }

    #[test]
    fn server_lists_are_bounded() {
        let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
        assert_eq!(
            name_list(names),
            "s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, and 2 more"
        );
    }
}
