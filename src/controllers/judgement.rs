//! What `haltsql validate` (or the operator itself, for a spec it can
//! reject alone) made of a policy's content, and the latest such judgement
//! of each policy, kept ahead of the status write that reports it.
//!
//! A policy's `Valid` condition lands one status write after its verdict,
//! and under load that write waits behind every other one. The servers that
//! reference the policy need not wait for it: the server gate also reads
//! [`Judged`], and only for the exact generation and content a judgement
//! was made for. The fail-closed rule is therefore the status's own:
//! nothing `haltsql validate` did not accept is rendered.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::api::{
    ConditionStatus, DesiredCondition, HaltSQLPolicy, HaltSQLPolicyStatus, PolicyConditionType,
    ValidReason, find_condition,
};
use crate::render;

/// What the policy's content was judged to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// `Valid=True`, `Validated`.
    Validated { policy_name: String },
    /// `Valid=False`, `ValidationFailed`, with the located errors.
    ValidationFailed { message: String },
    /// `Valid=False`, `InvalidSpec`.
    InvalidSpec { message: String },
    /// `Valid=False`, `NotAPolicy`: no validator was started.
    NotAPolicy { message: String },
    /// `Valid=Unknown`, `ValidatorError`: retried with backoff.
    ValidatorError { message: String },
}

impl Judgement {
    /// The `Valid` condition this judgement sets.
    pub fn condition(&self) -> DesiredCondition {
        match self {
            Judgement::Validated { policy_name } => DesiredCondition::new(
                ConditionStatus::True,
                ValidReason::Validated,
                format!("haltsql validate accepted the policy {policy_name:?}"),
            ),
            Judgement::ValidationFailed { message } => DesiredCondition::new(
                ConditionStatus::False,
                ValidReason::ValidationFailed,
                message.clone(),
            ),
            Judgement::InvalidSpec { message } => DesiredCondition::new(
                ConditionStatus::False,
                ValidReason::InvalidSpec,
                message.clone(),
            ),
            Judgement::NotAPolicy { message } => DesiredCondition::new(
                ConditionStatus::False,
                ValidReason::NotAPolicy,
                message.clone(),
            ),
            Judgement::ValidatorError { message } => DesiredCondition::new(
                ConditionStatus::Unknown,
                ValidReason::ValidatorError,
                message.clone(),
            ),
        }
    }

    /// `status.policyName`: set only when the policy is valid.
    pub fn policy_name(&self) -> Option<&str> {
        match self {
            Judgement::Validated { policy_name } => Some(policy_name),
            _ => None,
        }
    }

    /// The judgement the status already records for this generation and
    /// content, if it may be reused (a `ValidatorError` never is).
    pub fn from_status(
        status: &HaltSQLPolicyStatus,
        generation: Option<i64>,
        hash: &str,
    ) -> Option<Self> {
        if status.observed_generation != generation || status.content_hash.as_deref() != Some(hash)
        {
            return None;
        }
        let valid = find_condition(&status.conditions, PolicyConditionType::Valid.as_str())?;
        if valid.observed_generation != generation {
            return None;
        }
        let message = valid.message.clone();
        match (valid.status.as_str(), valid.reason.as_str()) {
            ("True", "Validated") => Some(Judgement::Validated {
                policy_name: status.policy_name.clone()?,
            }),
            ("False", "ValidationFailed") => Some(Judgement::ValidationFailed { message }),
            ("False", "InvalidSpec") => Some(Judgement::InvalidSpec { message }),
            ("False", "NotAPolicy") => Some(Judgement::NotAPolicy { message }),
            _ => None,
        }
    }
}

/// The latest judgement of each policy, with what it was made for.
#[derive(Debug, Default)]
pub struct Judged {
    by_policy: Mutex<HashMap<ObjectRef<HaltSQLPolicy>, Entry>>,
}

#[derive(Debug)]
struct Entry {
    generation: Option<i64>,
    content_hash: String,
    judgement: Judgement,
}

impl Judged {
    /// Keeps `judgement` of the policy `key` at this generation and content.
    /// A `ValidatorError` says nothing about the content and is not kept.
    pub fn record(
        &self,
        key: ObjectRef<HaltSQLPolicy>,
        generation: Option<i64>,
        content_hash: &str,
        judgement: &Judgement,
    ) {
        if matches!(judgement, Judgement::ValidatorError { .. }) {
            return;
        }
        self.lock().insert(
            key,
            Entry {
                generation,
                content_hash: content_hash.to_owned(),
                judgement: judgement.clone(),
            },
        );
    }

    /// The judgement of `key` made for exactly this generation and content.
    pub fn get(
        &self,
        key: &ObjectRef<HaltSQLPolicy>,
        generation: Option<i64>,
        content_hash: &str,
    ) -> Option<Judgement> {
        self.lock()
            .get(key)
            .filter(|e| e.generation == generation && e.content_hash == content_hash)
            .map(|e| e.judgement.clone())
    }

    /// The judgement of the policy as it is now, if one was made.
    pub fn of(&self, policy: &HaltSQLPolicy) -> Option<Judgement> {
        self.get(
            &ObjectRef::from_obj(policy),
            policy.metadata.generation,
            &render::content_hash(&policy.spec),
        )
    }

    /// Forgets a deleted policy.
    pub fn forget(&self, key: &ObjectRef<HaltSQLPolicy>) {
        self.lock().remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<HaltSQLPolicy>, Entry>> {
        // A panic while holding the lock leaves whole entries only.
        self.by_policy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectRef<HaltSQLPolicy> {
        ObjectRef::new(name).within("ns")
    }

    fn validated(name: &str) -> Judgement {
        Judgement::Validated {
            policy_name: name.to_owned(),
        }
    }

    #[test]
    fn a_judgement_answers_only_for_its_generation_and_content() {
        let judged = Judged::default();
        judged.record(key("p"), Some(2), "h2", &validated("orders"));
        assert_eq!(
            judged.get(&key("p"), Some(2), "h2"),
            Some(validated("orders"))
        );
        assert_eq!(judged.get(&key("p"), Some(3), "h2"), None);
        assert_eq!(judged.get(&key("p"), Some(2), "h3"), None);
        assert_eq!(judged.get(&key("q"), Some(2), "h2"), None);
    }

    #[test]
    fn the_latest_judgement_replaces_the_one_before() {
        let judged = Judged::default();
        judged.record(key("p"), Some(1), "h1", &validated("orders"));
        let failed = Judgement::ValidationFailed {
            message: "line 3: unknown table".to_owned(),
        };
        judged.record(key("p"), Some(2), "h2", &failed);
        assert_eq!(judged.get(&key("p"), Some(1), "h1"), None);
        assert_eq!(judged.get(&key("p"), Some(2), "h2"), Some(failed));
    }

    #[test]
    fn a_validator_error_is_not_kept_and_a_deleted_policy_is_forgotten() {
        let judged = Judged::default();
        judged.record(key("p"), Some(1), "h1", &validated("orders"));
        let error = Judgement::ValidatorError {
            message: "timed out".to_owned(),
        };
        judged.record(key("p"), Some(2), "h2", &error);
        assert_eq!(judged.get(&key("p"), Some(2), "h2"), None);
        assert_eq!(
            judged.get(&key("p"), Some(1), "h1"),
            Some(validated("orders"))
        );
        judged.forget(&key("p"));
        assert_eq!(judged.get(&key("p"), Some(1), "h1"), None);
    }
}
