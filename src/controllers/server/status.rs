//! Pure status computation: from what reconcile found and the Deployment's
//! status to the server's conditions. No client, no clock (the caller passes `now`).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{
    AppliedPolicy, AvailableReason, ConditionStatus, ConfigRenderedReason, DesiredCondition,
    HaltSQLServer, HaltSQLServerStatus, PoliciesReadyReason, ProgressingReason, ReadyReason,
    ServerConditionType, set_condition,
};
use crate::render::CONFIG_CHECKSUM_ANNOTATION;

/// Where the Deployment's rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutState {
    /// Every replica runs the current template and is available, no old pods left.
    Complete,
    InProgress,
    /// The Deployment controller gave up waiting for progress (`progressDeadlineSeconds`).
    Failed,
}

/// Reads the rollout state from a Deployment's status.
pub fn rollout_state(deployment: &Deployment) -> RolloutState {
    let desired = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let Some(status) = deployment.status.as_ref() else {
        return RolloutState::InProgress;
    };
    let deadline_exceeded = status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let observed = match (status.observed_generation, deployment.metadata.generation) {
        (Some(observed), Some(generation)) => observed >= generation,
        (_, None) => true,
        (None, Some(_)) => false,
    };
    let complete = observed
        && status.updated_replicas.unwrap_or(0) == desired
        && status.available_replicas.unwrap_or(0) >= desired
        && status.replicas.unwrap_or(0) == desired;
    if complete {
        RolloutState::Complete
    } else if observed && deadline_exceeded {
        RolloutState::Failed
    } else {
        RolloutState::InProgress
    }
}

/// What this reconcile did before computing status.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Some referenced policy is not ready; nothing was re-rendered.
    PoliciesNotReady {
        reason: PoliciesReadyReason,
        message: String,
    },
    /// The spec cannot be rendered; nothing was applied.
    InvalidConfig { message: String },
    /// An owned name is taken by an object this server does not control.
    NameConflict { message: String },
    /// Rendered, but writing an owned object failed several times in a row.
    ApplyFailed { message: String },
    /// Rendered and applied (or already up to date); `rolled` when a new
    /// Deployment spec was applied in this pass.
    Rendered {
        checksum: String,
        policies: Vec<AppliedPolicy>,
        rolled: bool,
    },
}

/// The new status, starting from the current one so that transition times and
/// the last fully rolled-out configuration carry over.
pub fn compute_status(
    server: &HaltSQLServer,
    deployment: Option<&Deployment>,
    outcome: &Outcome,
    selector: String,
    now: &Time,
) -> HaltSQLServerStatus {
    let previous = server.status.clone().unwrap_or_default();
    let generation = server.metadata.generation;
    let mut status = HaltSQLServerStatus {
        observed_generation: generation,
        selector: Some(selector),
        ..previous.clone()
    };
    let mut conditions = previous.conditions.clone();
    let mut set = |desired: DesiredCondition| {
        set_condition(&mut conditions, desired, generation, now);
    };

    let policies_ready = policies_ready_condition(outcome);
    let config_rendered = config_rendered_condition(outcome);
    if let Outcome::Rendered { checksum, .. } = outcome {
        status.config_checksum = Some(checksum.clone());
    }
    let (available, progressing) = match deployment {
        None => {
            status.replicas = None;
            status.ready_replicas = None;
            status.updated_replicas = None;
            (
                DesiredCondition::new(
                    ConditionStatus::False,
                    AvailableReason::DeploymentMissing,
                    "The Deployment does not exist",
                ),
                DesiredCondition::new(
                    ConditionStatus::False,
                    ProgressingReason::DeploymentMissing,
                    "The Deployment does not exist",
                ),
            )
        }
        Some(deployment) => deployment_conditions(deployment, outcome, &mut status),
    };

    let ready = ready_condition(&policies_ready, &config_rendered, &available, &progressing);
    set(policies_ready);
    set(config_rendered);
    set(available);
    set(progressing);
    set(ready);
    status.conditions = conditions;
    status
}

fn policies_ready_condition(outcome: &Outcome) -> DesiredCondition {
    match outcome {
        Outcome::PoliciesNotReady { reason, message } => {
            DesiredCondition::new(ConditionStatus::False, *reason, message.clone())
        }
        _ => DesiredCondition::new(
            ConditionStatus::True,
            PoliciesReadyReason::PoliciesReady,
            "Every referenced HaltSQLPolicy is valid",
        ),
    }
}

fn config_rendered_condition(outcome: &Outcome) -> DesiredCondition {
    match outcome {
        Outcome::PoliciesNotReady { .. } => DesiredCondition::new(
            ConditionStatus::False,
            ConfigRenderedReason::NotRendered,
            "Not re-rendered while a referenced policy is not ready; the last good configuration stays",
        ),
        Outcome::InvalidConfig { message } => DesiredCondition::new(
            ConditionStatus::False,
            ConfigRenderedReason::InvalidConfig,
            message.clone(),
        ),
        Outcome::NameConflict { message } => DesiredCondition::new(
            ConditionStatus::False,
            ConfigRenderedReason::NameConflict,
            message.clone(),
        ),
        Outcome::ApplyFailed { message } => DesiredCondition::new(
            ConditionStatus::False,
            ConfigRenderedReason::ApplyFailed,
            message.clone(),
        ),
        Outcome::Rendered { checksum, .. } => DesiredCondition::new(
            ConditionStatus::True,
            ConfigRenderedReason::Rendered,
            format!("Configuration {} rendered", short(checksum)),
        ),
    }
}

/// `Available` and `Progressing` from the Deployment, with the replica
/// counts and (after a complete rollout of what was rendered now)
/// `appliedPolicies` written into `status`.
fn deployment_conditions(
    deployment: &Deployment,
    outcome: &Outcome,
    status: &mut HaltSQLServerStatus,
) -> (DesiredCondition, DesiredCondition) {
    let desired = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let observed = deployment.status.clone().unwrap_or_default();
    status.replicas = Some(observed.replicas.unwrap_or(0));
    status.ready_replicas = Some(observed.ready_replicas.unwrap_or(0));
    status.updated_replicas = Some(observed.updated_replicas.unwrap_or(0));
    let available_count = observed.available_replicas.unwrap_or(0);
    let available = if desired == 0 {
        DesiredCondition::new(
            ConditionStatus::False,
            AvailableReason::ScaledToZero,
            "The server is scaled to zero replicas",
        )
    } else if available_count >= desired {
        DesiredCondition::new(
            ConditionStatus::True,
            AvailableReason::Ready,
            format!("{available_count} of {desired} replicas available"),
        )
    } else {
        DesiredCondition::new(
            ConditionStatus::False,
            AvailableReason::Unavailable,
            format!("{available_count} of {desired} replicas available"),
        )
    };
    let template_checksum = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(CONFIG_CHECKSUM_ANNOTATION))
        .cloned();
    let state = rollout_state(deployment);
    let progressing = match state {
        RolloutState::Complete => DesiredCondition::new(
            ConditionStatus::True,
            ProgressingReason::RolloutComplete,
            format!(
                "Configuration {} runs on every replica",
                template_checksum.as_deref().map(short).unwrap_or("?")
            ),
        ),
        RolloutState::Failed => DesiredCondition::new(
            ConditionStatus::False,
            ProgressingReason::RolloutFailed,
            "The rollout made no progress within its deadline; the old pods keep serving. Check the new pods' logs for the haltsql load error",
        ),
        RolloutState::InProgress => DesiredCondition::new(
            ConditionStatus::True,
            ProgressingReason::RollingOut,
            format!(
                "{} of {desired} replicas updated, {available_count} available",
                observed.updated_replicas.unwrap_or(0)
            ),
        ),
    };
    // appliedPolicies follows only a complete rollout of exactly what was rendered now.
    if let Outcome::Rendered {
        checksum, policies, ..
    } = outcome
        && state == RolloutState::Complete
        && template_checksum.as_deref() == Some(checksum.as_str())
    {
        let mut applied = policies.clone();
        applied.sort();
        status.applied_policies = Some(applied);
    }
    (available, progressing)
}

/// `Ready`: true when the others are satisfied, else the first unsatisfied one's reason.
fn ready_condition(
    policies_ready: &DesiredCondition,
    config_rendered: &DesiredCondition,
    available: &DesiredCondition,
    progressing: &DesiredCondition,
) -> DesiredCondition {
    let unsatisfied = [policies_ready, config_rendered, available]
        .into_iter()
        .find(|c| c.status != ConditionStatus::True)
        .or(
            (progressing.reason != ProgressingReason::RolloutComplete.as_str())
                .then_some(progressing),
        );
    match unsatisfied {
        None => DesiredCondition::new(
            ConditionStatus::True,
            ReadyReason::Ready,
            "The server is ready",
        ),
        Some(c) => DesiredCondition {
            type_: ServerConditionType::Ready.as_str(),
            status: ConditionStatus::False,
            reason: c.reason,
            message: format!("{}: {}", c.type_, c.message),
        },
    }
}

fn short(checksum: &str) -> &str {
    checksum.get(..12).unwrap_or(checksum)
}
