//! A short grace before a server that was serving valid policies reports one
//! of them as pending re-validation. An edit makes its policy pending until
//! `haltsql validate` has judged the new content, usually well under a
//! second; meanwhile the server keeps its last good configuration and is
//! still ready. Reporting every edit as `PoliciesReady=False` would make
//! `Ready` flap on each edit and add a status write to the edit's path; a
//! validation that takes longer than the grace is reported as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::policies::PolicyGate;
use crate::api::{
    ConditionStatus, HaltSQLServer, PoliciesReadyReason, ServerConditionType, find_condition,
};

/// How long a server that was serving valid policies waits for a
/// re-validation before it reports `PolicyPendingValidation`.
pub const PENDING_GRACE: Duration = Duration::from_secs(2);

/// Since when each server (by `namespace/name`) has found a referenced
/// policy pending, while its status still says its policies are ready.
#[derive(Debug, Default)]
pub struct PendingSince {
    since: Mutex<HashMap<String, Instant>>,
}

impl PendingSince {
    /// How long the server `key` holds off reporting `gate`, if it does: only
    /// a pending policy of a server whose status says its policies were
    /// ready, and only for the rest of the grace.
    pub fn hold_off(
        &self,
        key: &str,
        server: &HaltSQLServer,
        gate: &PolicyGate,
        now: Instant,
    ) -> Option<Duration> {
        let pending = matches!(
            gate,
            PolicyGate::Closed {
                reason: PoliciesReadyReason::PolicyPendingValidation,
                ..
            }
        );
        if !pending {
            self.clear(key);
            return None;
        }
        if !policies_were_ready(server) {
            return None;
        }
        self.grace_left(key, now)
    }

    /// The rest of the grace for `key` at `now` (its first call starts it),
    /// or `None` once the grace is over.
    fn grace_left(&self, key: &str, now: Instant) -> Option<Duration> {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        let first = *since.entry(key.to_owned()).or_insert(now);
        PENDING_GRACE
            .checked_sub(now.saturating_duration_since(first))
            .filter(|rest| !rest.is_zero())
    }

    /// The server's policies are no longer pending (or it is gone).
    pub fn clear(&self, key: &str) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since.remove(key);
    }
}

/// Whether the server's status says that its policies are ready for its
/// current generation: only then does a pending policy get the grace.
fn policies_were_ready(server: &HaltSQLServer) -> bool {
    server.status.as_ref().is_some_and(|status| {
        status.observed_generation == server.metadata.generation
            && find_condition(
                &status.conditions,
                ServerConditionType::PoliciesReady.as_str(),
            )
            .is_some_and(|c| c.status == ConditionStatus::True.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DesiredCondition, HaltSQLServerSpec, HaltSQLServerStatus, set_condition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn server_with_policies_ready(status: ConditionStatus) -> HaltSQLServer {
        let mut server = HaltSQLServer::new("hs", HaltSQLServerSpec::default());
        server.metadata.generation = Some(3);
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            DesiredCondition::new(status, PoliciesReadyReason::PoliciesReady, "test"),
            Some(3),
            &Time(k8s_openapi::jiff::Timestamp::now()),
        );
        server.status = Some(HaltSQLServerStatus {
            observed_generation: Some(3),
            conditions,
            ..Default::default()
        });
        server
    }

    fn pending() -> PolicyGate {
        PolicyGate::Closed {
            reason: PoliciesReadyReason::PolicyPendingValidation,
            message: String::new(),
        }
    }

    #[test]
    fn only_a_server_whose_policies_were_ready_holds_off_and_only_for_a_pending_policy() {
        let now = Instant::now();
        let was_ready = server_with_policies_ready(ConditionStatus::True);
        let holds = PendingSince::default();
        assert_eq!(
            holds.hold_off("ns/hs", &was_ready, &pending(), now),
            Some(PENDING_GRACE)
        );
        let not_valid = PolicyGate::Closed {
            reason: PoliciesReadyReason::PolicyNotValid,
            message: String::new(),
        };
        assert_eq!(holds.hold_off("ns/hs", &was_ready, &not_valid, now), None);
        assert_eq!(
            holds.hold_off("ns/hs", &was_ready, &pending(), now + PENDING_GRACE),
            Some(PENDING_GRACE),
            "another verdict in between starts the grace again"
        );
        assert_eq!(
            holds.hold_off("ns/hs", &was_ready, &pending(), now + 2 * PENDING_GRACE),
            None
        );

        let was_waiting = server_with_policies_ready(ConditionStatus::False);
        assert_eq!(
            PendingSince::default().hold_off("ns/hs", &was_waiting, &pending(), now),
            None
        );
        let mut new_generation = was_ready.clone();
        new_generation.metadata.generation = Some(4);
        assert_eq!(
            PendingSince::default().hold_off("ns/hs", &new_generation, &pending(), now),
            None,
            "a status about an older spec says nothing about this one"
        );
    }

    #[test]
    fn the_grace_runs_from_the_first_pending_pass_and_restarts_after_a_clear() {
        let pending = PendingSince::default();
        let t0 = Instant::now();
        assert_eq!(pending.grace_left("ns/a", t0), Some(PENDING_GRACE));
        let half = PENDING_GRACE / 2;
        assert_eq!(
            pending.grace_left("ns/a", t0 + half),
            Some(PENDING_GRACE - half)
        );
        assert_eq!(
            pending.grace_left("ns/b", t0 + half),
            Some(PENDING_GRACE),
            "servers are independent"
        );
        assert_eq!(pending.grace_left("ns/a", t0 + PENDING_GRACE), None);
        assert_eq!(pending.grace_left("ns/a", t0 + 2 * PENDING_GRACE), None);
        pending.clear("ns/a");
        let later = t0 + 3 * PENDING_GRACE;
        assert_eq!(pending.grace_left("ns/a", later), Some(PENDING_GRACE));
    }
}
