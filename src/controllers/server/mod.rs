//! The HaltSQLServer controller: render the referenced valid policies and the
//! server spec into owned objects, roll them out safely, report status.

mod apply;
mod collect;
mod events;
mod owned;
mod pending;
mod policies;
mod reconcile;
mod status;

pub use pending::{PENDING_GRACE, PendingSince};
pub use policies::{PolicyGate, ReadyPolicy, gate_policies, gate_policies_with};
pub use reconcile::{Error, error_policy, reconcile};
pub use status::{RolloutState, rollout_state};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{HaltSQLPolicy, HaltSQLServer};

/// The servers in the policy's namespace that list it in `spec.policies`.
pub fn servers_referencing(
    servers: &Store<HaltSQLServer>,
    policy: &HaltSQLPolicy,
) -> impl Iterator<Item = ObjectRef<HaltSQLServer>> + use<> {
    let name = policy.name_any();
    // This runs for every policy event over every server: the namespaces
    // are compared in place (`namespace()` would copy one per server).
    let matches: Vec<ObjectRef<HaltSQLServer>> = servers
        .state()
        .into_iter()
        .filter(|server| server.metadata.namespace == policy.metadata.namespace)
        .filter(|server| server.spec.policies.iter().any(|p| p.name == name))
        .map(|server| ObjectRef::from_obj(server.as_ref()))
        .collect();
    matches.into_iter()
}
