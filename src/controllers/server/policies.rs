//! The fail-closed gate: a server is rendered only while every policy it
//! references is `Valid` for its current generation and content, as its
//! status says or, before that status lands, as this operator judged it.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{
    ConditionStatus, HaltSQLPolicy, HaltSQLPolicySpec, HaltSQLServer, PoliciesReadyReason,
    PolicyConditionType, find_condition,
};
use crate::controllers::judgement::{Judged, Judgement};
use crate::render::PolicyInput;
use crate::render::content::content_hash;

/// A referenced policy that may be rendered.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadyPolicy {
    /// The HaltSQLPolicy object's name.
    pub object_name: String,
    /// The policy document's `metadata.name`.
    pub policy_name: String,
    pub content_hash: String,
    pub spec: HaltSQLPolicySpec,
}

impl ReadyPolicy {
    /// This policy as rendering takes it.
    pub fn input(&self) -> PolicyInput<'_> {
        PolicyInput {
            object_name: &self.object_name,
            policy_name: &self.policy_name,
            content_hash: &self.content_hash,
            spec: &self.spec,
        }
    }
}

/// Whether the server may be rendered, and if not, why.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyGate {
    Open(Vec<ReadyPolicy>),
    Closed {
        reason: PoliciesReadyReason,
        message: String,
    },
}

/// Checks every policy the server references, in the order of `spec.policies`.
/// The first missing policy wins over an invalid one, which wins over a pending one.
pub fn gate_policies(
    server: &HaltSQLServer,
    policies: &Store<HaltSQLPolicy>,
    judged: &Judged,
) -> PolicyGate {
    let namespace = server.namespace();
    gate_policies_with(
        server,
        |name| {
            let mut key = ObjectRef::<HaltSQLPolicy>::new(name);
            if let Some(ns) = namespace.as_deref() {
                key = key.within(ns);
            }
            policies.get(&key)
        },
        |policy| judged.of(policy),
    )
}

/// The gate over any source of policies (the store, or files for `render`)
/// and of judgements not yet in their status (`judged`).
pub fn gate_policies_with(
    server: &HaltSQLServer,
    lookup: impl Fn(&str) -> Option<Arc<HaltSQLPolicy>>,
    judged: impl Fn(&HaltSQLPolicy) -> Option<Judgement>,
) -> PolicyGate {
    let mut missing = Vec::new();
    let mut invalid = Vec::new();
    let mut pending = 0;
    let mut ready = Vec::new();
    for reference in &server.spec.policies {
        let Some(policy) = lookup(&reference.name) else {
            missing.push(reference.name.clone());
            continue;
        };
        let readiness = match readiness(&policy) {
            Readiness::Pending => {
                judged(&policy).map_or(Readiness::Pending, |j| readiness_judged(&policy, j))
            }
            known => known,
        };
        match readiness {
            Readiness::Ready(p) => ready.push(*p),
            Readiness::Invalid(why) => invalid.push(format!("{} ({why})", reference.name)),
            Readiness::Pending => pending += 1,
        }
    }
    if !missing.is_empty() {
        return PolicyGate::Closed {
            reason: PoliciesReadyReason::PolicyNotFound,
            message: format!("HaltSQLPolicy not found: {}", missing.join(", ")),
        };
    }
    if !invalid.is_empty() {
        return PolicyGate::Closed {
            reason: PoliciesReadyReason::PolicyNotValid,
            message: format!(
                "HaltSQLPolicy not valid, keeping the last good configuration: {}",
                invalid.join("; ")
            ),
        };
    }
    if pending > 0 {
        return PolicyGate::Closed {
            reason: PoliciesReadyReason::PolicyPendingValidation,
            // No names: the message stays the same while the policies are
            // judged one after the other, so waiting costs no status writes.
            message: "A referenced HaltSQLPolicy is not yet validated for its current generation (the policies' Valid condition tells which)".to_owned(),
        };
    }
    PolicyGate::Open(ready)
}

/// What a judgement of the current generation and content says, before the
/// policy's status does.
fn readiness_judged(policy: &HaltSQLPolicy, judgement: Judgement) -> Readiness {
    match judgement {
        Judgement::Validated { policy_name } => Readiness::Ready(Box::new(ReadyPolicy {
            object_name: policy.name_any(),
            policy_name,
            content_hash: content_hash(&policy.spec),
            spec: policy.spec.clone(),
        })),
        // Not kept by `Judged`; here for completeness.
        Judgement::ValidatorError { .. } => Readiness::Pending,
        other => Readiness::Invalid(other.condition().reason.to_owned()),
    }
}

enum Readiness {
    Ready(Box<ReadyPolicy>),
    Invalid(String),
    Pending,
}

fn readiness(policy: &HaltSQLPolicy) -> Readiness {
    let Some(status) = policy.status.as_ref() else {
        return Readiness::Pending;
    };
    let generation = policy.metadata.generation;
    let Some(valid) = find_condition(&status.conditions, PolicyConditionType::Valid.as_str())
    else {
        return Readiness::Pending;
    };
    // A verdict about an older generation says nothing about the current spec.
    if status.observed_generation != generation || valid.observed_generation != generation {
        return Readiness::Pending;
    }
    if valid.status == ConditionStatus::False.as_str() {
        return Readiness::Invalid(valid.reason.clone());
    }
    if valid.status != ConditionStatus::True.as_str() {
        return Readiness::Pending;
    }
    let current_hash = content_hash(&policy.spec);
    match (&status.policy_name, &status.content_hash) {
        (Some(name), Some(hash)) if *hash == current_hash => {
            Readiness::Ready(Box::new(ReadyPolicy {
                object_name: policy.name_any(),
                policy_name: name.clone(),
                content_hash: hash.clone(),
                spec: policy.spec.clone(),
            }))
        }
        _ => Readiness::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HaltSQLPolicyStatus, HaltSQLServerSpec, PolicyReference};

    const DOC: &str = "kind: Policy\nmetadata: {name: orders}\n";

    fn server() -> HaltSQLServer {
        let mut server = HaltSQLServer::new(
            "hs",
            HaltSQLServerSpec {
                policies: vec![PolicyReference {
                    name: "p".to_owned(),
                }],
                ..HaltSQLServerSpec::default()
            },
        );
        server.metadata.namespace = Some("ns".to_owned());
        server
    }

    /// Generation 2 of `p`, whose status still judges generation 1.
    fn edited_policy() -> Arc<HaltSQLPolicy> {
        let mut policy = HaltSQLPolicy::new(
            "p",
            HaltSQLPolicySpec {
                policy: Some(DOC.to_owned()),
                bundle_source: None,
            },
        );
        policy.metadata.namespace = Some("ns".to_owned());
        policy.metadata.generation = Some(2);
        policy.status = Some(HaltSQLPolicyStatus {
            observed_generation: Some(1),
            ..HaltSQLPolicyStatus::default()
        });
        Arc::new(policy)
    }

    fn key() -> ObjectRef<HaltSQLPolicy> {
        ObjectRef::new("p").within("ns")
    }

    fn is_pending(gate: &PolicyGate) -> bool {
        matches!(
            gate,
            PolicyGate::Closed {
                reason: PoliciesReadyReason::PolicyPendingValidation,
                ..
            }
        )
    }

    fn gate(judged: &Judged) -> PolicyGate {
        let policy = edited_policy();
        gate_policies_with(&server(), |_| Some(policy.clone()), |p| judged.of(p))
    }

    #[test]
    fn a_stale_status_without_a_judgement_keeps_the_gate_closed() {
        assert!(is_pending(&gate(&Judged::default())));
    }

    #[test]
    fn a_judgement_of_the_current_generation_and_content_opens_the_gate() {
        let judged = Judged::default();
        let hash = content_hash(&edited_policy().spec);
        let validated = Judgement::Validated {
            policy_name: "orders".to_owned(),
        };
        judged.record(key(), Some(2), &hash, &validated);
        let PolicyGate::Open(ready) = gate(&judged) else {
            panic!("the gate stayed closed");
        };
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].policy_name, "orders");
        assert_eq!(ready[0].content_hash, hash);
    }

    #[test]
    fn a_judgement_of_other_content_or_a_rejection_does_not_open_it() {
        let judged = Judged::default();
        let validated = Judgement::Validated {
            policy_name: "orders".to_owned(),
        };
        let hash = content_hash(&edited_policy().spec);
        judged.record(key(), Some(2), "another-content", &validated);
        assert!(is_pending(&gate(&judged)));
        judged.record(key(), Some(1), &hash, &validated);
        assert!(is_pending(&gate(&judged)));

        let rejected = Judgement::ValidationFailed {
            message: "line 2: unknown table".to_owned(),
        };
        judged.record(key(), Some(2), &hash, &rejected);
        assert!(matches!(
            gate(&judged),
            PolicyGate::Closed {
                reason: PoliciesReadyReason::PolicyNotValid,
                ..
            }
        ));
    }
}
