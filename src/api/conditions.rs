//! Condition types and reasons of both resources, and a pure helper that
//! sets a condition the Kubernetes way.
//!
//! Each reason enum belongs to exactly one condition type, so a
//! [`DesiredCondition`] built from a reason always carries the matching type.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// `True`
    True,
    /// `False`
    False,
    /// `Unknown`
    Unknown,
}

impl ConditionStatus {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value { Self::True } else { Self::False }
    }
}

/// A reason of one condition type.
pub trait ConditionReason: Copy {
    /// The condition type this reason belongs to.
    fn condition_type(self) -> &'static str;
    /// The reason as written into the condition.
    fn as_str(self) -> &'static str;
}

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The API spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

macro_rules! reason_enum {
    ($(#[$meta:meta])* $name:ident => $ty:expr, { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        string_enum!($(#[$meta])* $name { $($(#[$vmeta])* $variant),+ });

        impl ConditionReason for $name {
            fn condition_type(self) -> &'static str {
                $ty.as_str()
            }
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }
    };
}

string_enum!(
    /// Condition types of a HaltSQLPolicy.
    PolicyConditionType {
        /// Whether the current generation passed validation.
        Valid,
        /// Whether every referencing server has rolled out the current content.
        Synced,
    }
);

string_enum!(
    /// Condition types of a HaltSQLServer.
    ServerConditionType {
        /// Every referenced policy exists and is valid for its generation.
        PoliciesReady,
        /// The configuration was rendered and the owned objects applied.
        ConfigRendered,
        /// The Deployment has its replicas available.
        Available,
        /// The state of the current rollout.
        Progressing,
        /// Everything above is satisfied.
        Ready,
    }
);

reason_enum!(
    /// Reasons of the policy's `Valid` condition.
    ValidReason => PolicyConditionType::Valid, {
        /// `haltsql validate` accepted the content (status True).
        Validated,
        /// `haltsql validate` rejected it; the message has the located errors.
        ValidationFailed,
        /// The spec cannot be validated as given (e.g. a catalog file reference).
        InvalidSpec,
        /// The inline `spec.policy` is not a `kind: Policy` document; no
        /// validator was started for it.
        NotAPolicy,
        /// The check itself could not run (status Unknown); retried with backoff.
        ValidatorError,
    }
);

reason_enum!(
    /// Reasons of the policy's `Synced` condition.
    SyncedReason => PolicyConditionType::Synced, {
        /// Every referencing server runs the current content.
        Synced,
        /// A referencing server is still rolling out.
        RollingOut,
        /// No server references the policy.
        NotReferenced,
        /// The policy is not valid, so no server loads it.
        NotValid,
    }
);

reason_enum!(
    /// Reasons of the server's `PoliciesReady` condition.
    PoliciesReadyReason => ServerConditionType::PoliciesReady, {
        /// Every referenced policy is valid for its current generation.
        PoliciesReady,
        /// A referenced HaltSQLPolicy does not exist.
        PolicyNotFound,
        /// A referenced policy is not valid.
        PolicyNotValid,
        /// A referenced policy has not been validated for its generation yet.
        PolicyPendingValidation,
    }
);

reason_enum!(
    /// Reasons of the server's `ConfigRendered` condition.
    ConfigRenderedReason => ServerConditionType::ConfigRendered, {
        /// The configuration was rendered and applied.
        Rendered,
        /// The server spec cannot be rendered.
        InvalidConfig,
        /// An object with an owned name belongs to someone else.
        NameConflict,
        /// Not rendered (for example while policies are not ready).
        NotRendered,
        /// Rendered, but writing an owned object keeps failing (the API
        /// server or an admission webhook refuses it); the last good
        /// configuration stays and the write is retried with backoff.
        ApplyFailed,
    }
);

reason_enum!(
    /// Reasons of the server's `Available` condition.
    AvailableReason => ServerConditionType::Available, {
        /// The wanted replicas are available.
        Ready,
        /// Not enough replicas are available.
        Unavailable,
        /// The server has zero replicas.
        ScaledToZero,
        /// The Deployment does not exist (yet).
        DeploymentMissing,
    }
);

reason_enum!(
    /// Reasons of the server's `Progressing` condition.
    ProgressingReason => ServerConditionType::Progressing, {
        /// A rollout is in progress.
        RollingOut,
        /// The current configuration has rolled out.
        RolloutComplete,
        /// The rollout made no progress within its deadline.
        RolloutFailed,
        /// The Deployment does not exist (yet).
        DeploymentMissing,
    }
);

/// Reasons of the server's `Ready` condition: `Ready`, or the reason of the
/// first condition that is not satisfied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadyReason {
    /// Everything is satisfied.
    Ready,
    /// `PoliciesReady` is not satisfied.
    PoliciesReady(PoliciesReadyReason),
    /// `ConfigRendered` is not satisfied.
    ConfigRendered(ConfigRenderedReason),
    /// `Available` is not satisfied.
    Available(AvailableReason),
    /// `Progressing` is not satisfied.
    Progressing(ProgressingReason),
}

impl ConditionReason for ReadyReason {
    fn condition_type(self) -> &'static str {
        ServerConditionType::Ready.as_str()
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::PoliciesReady(r) => r.as_str(),
            Self::ConfigRendered(r) => r.as_str(),
            Self::Available(r) => r.as_str(),
            Self::Progressing(r) => r.as_str(),
        }
    }
}

impl fmt::Display for ReadyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ConditionReason::as_str(*self))
    }
}

/// A condition as a controller wants it, before the helper fills in the
/// transition time and generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    /// Condition type.
    pub type_: &'static str,
    /// Condition status.
    pub status: ConditionStatus,
    /// Reason (CamelCase).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl DesiredCondition {
    /// A condition whose type follows from the reason.
    pub fn new<R: ConditionReason>(
        status: ConditionStatus,
        reason: R,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_: reason.condition_type(),
            status,
            reason: reason.as_str(),
            message: message.into(),
        }
    }
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Sets `desired` in `conditions` with `observed_generation`.
///
/// `lastTransitionTime` becomes `now` only when the condition is new or its
/// status changed; a changed reason or message keeps the old time. Returns
/// whether anything changed, so that callers write status only when needed.
/// The function is pure: the caller passes the clock.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    desired: DesiredCondition,
    observed_generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = desired.status.as_str();
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let mut changed = false;
            if existing.status != status {
                existing.status = status.to_owned();
                existing.last_transition_time = now.clone();
                changed = true;
            }
            if existing.reason != desired.reason {
                existing.reason = desired.reason.to_owned();
                changed = true;
            }
            if existing.message != desired.message {
                existing.message = desired.message;
                changed = true;
            }
            if existing.observed_generation != observed_generation {
                existing.observed_generation = observed_generation;
                changed = true;
            }
            changed
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_.to_owned(),
                status: status.to_owned(),
                reason: desired.reason.to_owned(),
                message: desired.message,
                observed_generation,
                last_transition_time: now.clone(),
            });
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(secs: i64) -> Time {
        match k8s_openapi::jiff::Timestamp::from_second(secs) {
            Ok(ts) => Time(ts),
            Err(err) => panic!("bad test time: {err}"),
        }
    }

    #[test]
    fn reason_determines_type() {
        let c = DesiredCondition::new(ConditionStatus::True, ValidReason::Validated, "ok");
        assert_eq!(c.type_, "Valid");
        assert_eq!(c.reason, "Validated");
        let c = DesiredCondition::new(
            ConditionStatus::False,
            ReadyReason::PoliciesReady(PoliciesReadyReason::PolicyNotFound),
            "x",
        );
        assert_eq!(c.type_, "Ready");
        assert_eq!(c.reason, "PolicyNotFound");
        assert_eq!(
            DesiredCondition::new(
                ConditionStatus::True,
                ProgressingReason::RolloutComplete,
                ""
            )
            .type_,
            "Progressing"
        );
    }

    #[test]
    fn reasons_match_the_guide() {
        let names = |all: &[&str]| all.join(",");
        assert_eq!(
            names(
                &ValidReason::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
            ),
            "Validated,ValidationFailed,InvalidSpec,NotAPolicy,ValidatorError"
        );
        assert_eq!(
            names(
                &SyncedReason::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
            ),
            "Synced,RollingOut,NotReferenced,NotValid"
        );
        assert_eq!(
            names(
                &PoliciesReadyReason::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
            ),
            "PoliciesReady,PolicyNotFound,PolicyNotValid,PolicyPendingValidation"
        );
        assert_eq!(
            names(
                &ConfigRenderedReason::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
            ),
            "Rendered,InvalidConfig,NameConflict,NotRendered,ApplyFailed"
        );
        assert_eq!(
            names(
                &AvailableReason::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
            ),
            "Ready,Unavailable,ScaledToZero,DeploymentMissing"
        );
        assert_eq!(
            names(
                &ProgressingReason::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
            ),
            "RollingOut,RolloutComplete,RolloutFailed,DeploymentMissing"
        );
        assert_eq!(
            names(
                &ServerConditionType::ALL
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
            ),
            "PoliciesReady,ConfigRendered,Available,Progressing,Ready"
        );
    }

    #[test]
    fn new_condition_is_added_with_now() {
        let mut conds = Vec::new();
        let changed = set_condition(
            &mut conds,
            DesiredCondition::new(ConditionStatus::True, ValidReason::Validated, "ok"),
            Some(3),
            &time(100),
        );
        assert!(changed);
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].type_, "Valid");
        assert_eq!(conds[0].status, "True");
        assert_eq!(conds[0].observed_generation, Some(3));
        assert_eq!(conds[0].last_transition_time, time(100));
    }

    #[test]
    fn same_condition_changes_nothing() {
        let mut conds = Vec::new();
        let desired = DesiredCondition::new(ConditionStatus::True, ValidReason::Validated, "ok");
        set_condition(&mut conds, desired.clone(), Some(1), &time(100));
        let before = conds.clone();
        assert!(!set_condition(&mut conds, desired, Some(1), &time(200)));
        assert_eq!(conds, before);
    }

    #[test]
    fn reason_change_keeps_transition_time() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            DesiredCondition::new(ConditionStatus::False, ValidReason::ValidationFailed, "a"),
            Some(1),
            &time(100),
        );
        let changed = set_condition(
            &mut conds,
            DesiredCondition::new(ConditionStatus::False, ValidReason::InvalidSpec, "b"),
            Some(2),
            &time(200),
        );
        assert!(changed);
        assert_eq!(conds[0].reason, "InvalidSpec");
        assert_eq!(conds[0].message, "b");
        assert_eq!(conds[0].observed_generation, Some(2));
        assert_eq!(conds[0].last_transition_time, time(100));
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            DesiredCondition::new(ConditionStatus::False, SyncedReason::RollingOut, ""),
            Some(1),
            &time(100),
        );
        set_condition(
            &mut conds,
            DesiredCondition::new(ConditionStatus::True, ValidReason::Validated, ""),
            Some(1),
            &time(150),
        );
        assert!(set_condition(
            &mut conds,
            DesiredCondition::new(ConditionStatus::True, SyncedReason::Synced, ""),
            Some(1),
            &time(200),
        ));
        let synced = find_condition(&conds, "Synced");
        assert_eq!(
            synced.map(|c| c.last_transition_time.clone()),
            Some(time(200))
        );
        assert!(is_condition_true(&conds, "Synced"));
        assert_eq!(
            find_condition(&conds, "Valid").map(|c| c.last_transition_time.clone()),
            Some(time(150))
        );
        assert_eq!(conds.len(), 2);
    }
}
