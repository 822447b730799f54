//! Kubernetes Events for what a user watching `kubectl describe` should see:
//! a new configuration rolling out, a name conflict, an invalid spec, a
//! stalled rollout. Emitted on transitions only, so an idle server is silent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event, EventType};

use crate::api::{
    ConfigRenderedReason, HaltSQLServerStatus, ProgressingReason, ServerConditionType,
};

fn reason_of(conditions: &[Condition], type_: ServerConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_str())
}

/// Whether a condition now has `reason` and did not before.
fn entered(
    previous: &[Condition],
    current: &[Condition],
    type_: ServerConditionType,
    reason: &str,
) -> Option<String> {
    let now = reason_of(current, type_).filter(|c| c.reason == reason)?;
    let before = reason_of(previous, type_).map(|c| c.reason.as_str());
    (before != Some(reason)).then(|| now.message.clone())
}

/// The events for going from `previous` to `current`; `rolled` says a new
/// Deployment spec was applied in this pass.
pub fn transition_events(
    previous: Option<&HaltSQLServerStatus>,
    current: &HaltSQLServerStatus,
    rolled: bool,
) -> Vec<Event> {
    let empty = Vec::new();
    let before = previous.map(|s| &s.conditions).unwrap_or(&empty);
    let after = &current.conditions;
    let mut events = Vec::new();
    if rolled {
        let checksum = current.config_checksum.as_deref().unwrap_or_default();
        events.push(Event {
            type_: EventType::Normal,
            reason: "RollingOut".into(),
            note: Some(format!(
                "Rolling out configuration {}",
                checksum.get(..12).unwrap_or(checksum)
            )),
            action: "Apply".into(),
            secondary: None,
        });
    }
    let warnings = [
        (
            ServerConditionType::ConfigRendered,
            ConfigRenderedReason::NameConflict.as_str(),
            "Apply",
        ),
        (
            ServerConditionType::ConfigRendered,
            ConfigRenderedReason::InvalidConfig.as_str(),
            "Render",
        ),
        (
            ServerConditionType::Progressing,
            ProgressingReason::RolloutFailed.as_str(),
            "Rollout",
        ),
    ];
    for (type_, reason, action) in warnings {
        if let Some(message) = entered(before, after, type_, reason) {
            events.push(Event {
                type_: EventType::Warning,
                reason: reason.into(),
                note: Some(truncate(&message, 1024)),
                action: action.into(),
                secondary: None,
            });
        }
    }
    events
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn status_with(type_: &str, reason: &str) -> HaltSQLServerStatus {
        HaltSQLServerStatus {
            conditions: vec![Condition {
                type_: type_.into(),
                status: "False".into(),
                reason: reason.into(),
                message: format!("{reason} happened"),
                observed_generation: Some(1),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn warns_once_on_entering_a_bad_state() {
        let conflict = status_with("ConfigRendered", "NameConflict");
        let events = transition_events(None, &conflict, false);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "NameConflict");
        assert_eq!(events[0].type_, EventType::Warning);
        assert!(
            transition_events(Some(&conflict), &conflict, false).is_empty(),
            "no repeat while it stays"
        );
        let failed = status_with("Progressing", "RolloutFailed");
        assert_eq!(
            transition_events(Some(&conflict), &failed, false)[0].reason,
            "RolloutFailed"
        );
    }

    #[test]
    fn a_new_deployment_spec_is_announced() {
        let status = HaltSQLServerStatus {
            config_checksum: Some("abcdef0123456789".into()),
            ..Default::default()
        };
        let events = transition_events(Some(&status), &status, true);
        assert_eq!(events.len(), 1);
        assert_eq!(
            events[0].note.as_deref(),
            Some("Rolling out configuration abcdef012345")
        );
    }
}
