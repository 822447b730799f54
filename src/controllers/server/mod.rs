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

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{HaltSQLPolicy, HaltSQLServer};

/// The servers in the policy's namespace that list it in `spec.policies`.
pub fn servers_referencing(
    servers: &Store<HaltSQLServer>,
    policy: &HaltSQLPolicy,
) -> impl Iterator<Item = ObjectRef<HaltSQLServer>> + use<> {
    let matches: Vec<ObjectRef<HaltSQLServer>> = servers_listing(servers, policy)
        .iter()
        .map(|server| ObjectRef::from_obj(server.as_ref()))
        .collect();
    matches.into_iter()
}

/// The same servers, as the store holds them.
pub fn servers_listing(
    servers: &Store<HaltSQLServer>,
    policy: &HaltSQLPolicy,
) -> Vec<Arc<HaltSQLServer>> {
    let name = policy.name_any();
    // This runs for every policy event and pass over every server: the
    // namespaces are compared in place (`namespace()` would copy one per
    // server).
    servers
        .state()
        .into_iter()
        .filter(|server| server.metadata.namespace == policy.metadata.namespace)
        .filter(|server| server.spec.policies.iter().any(|p| p.name == name))
        .collect()
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::api::{HaltSQLPolicySpec, HaltSQLServerSpec, PolicyReference};

    #[test]
    fn only_servers_of_the_policys_namespace_that_list_it() {
        let (reader, mut writer) = store::<HaltSQLServer>();
        let server = |name: &str, namespace: &str, policies: &[&str]| {
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
            s.metadata.namespace = Some(namespace.into());
            s
        };
        for s in [
            server("lists-it", "ns", &["other", "orders"]),
            server("lists-another", "ns", &["other"]),
            server("same-name-elsewhere", "elsewhere", &["orders"]),
        ] {
            writer.apply_watcher_event(&Event::Apply(s));
        }
        let mut policy = HaltSQLPolicy::new("orders", HaltSQLPolicySpec::default());
        policy.metadata.namespace = Some("ns".into());

        let refs: Vec<_> = servers_referencing(&reader, &policy).collect();
        assert_eq!(refs, [ObjectRef::new("lists-it").within("ns")]);
        let listing: Vec<String> = servers_listing(&reader, &policy)
            .iter()
            .map(|s| s.name_any())
            .collect();
        assert_eq!(listing, ["lists-it"]);
    }
}
