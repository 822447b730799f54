//! What a deletion requeues (shared subscribers never see deletions), and
//! which server events concern a policy's `Synced`.

use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::api::{HaltSQLPolicy, HaltSQLServer};
use crate::controllers::context::{Context, object_key};
use crate::controllers::{policy, server};

/// Where deletions send the objects they concern.
#[derive(Clone)]
pub(super) struct Requeues {
    pub(super) servers: UnboundedSender<ObjectRef<HaltSQLServer>>,
    pub(super) policies: UnboundedSender<ObjectRef<HaltSQLPolicy>>,
}

/// A deleted policy changes what its servers render.
pub(super) fn on_policy_deleted(
    ctx: Arc<Context>,
    to_servers: UnboundedSender<ObjectRef<HaltSQLServer>>,
) -> impl Fn(&HaltSQLPolicy) + Send + 'static {
    move |policy| {
        ctx.own_writes.forget(policy);
        ctx.judged.forget(&ObjectRef::from_obj(policy));
        for server in server::servers_referencing(&ctx.servers, policy) {
            let _ = to_servers.unbounded_send(server);
        }
    }
}

/// A deleted server changes its policies' `Synced`.
pub(super) fn on_server_deleted(
    ctx: Arc<Context>,
    synced_inputs: Arc<SyncedInputs>,
    to_policies: UnboundedSender<ObjectRef<HaltSQLPolicy>>,
) -> impl Fn(&HaltSQLServer) + Send + 'static {
    move |server| {
        synced_inputs.forget(server);
        ctx.own_writes.forget(server);
        ctx.pending_since.clear(&object_key(
            server.namespace().as_deref(),
            &server.name_any(),
        ));
        for policy in policy::policies_referenced_by(server) {
            let _ = to_policies.unbounded_send(policy);
        }
    }
}

/// A deleted owned object must be re-created at once.
pub(super) fn on_owned_deleted<K: Resource>(
    to_servers: UnboundedSender<ObjectRef<HaltSQLServer>>,
) -> impl Fn(&K) + Send + 'static {
    move |obj| {
        if let Some(server) = controlling_server(obj) {
            let _ = to_servers.unbounded_send(server);
        }
    }
}

/// A deleted ReplicaSet may free a ConfigMap. It is controlled by the
/// Deployment, which has the server's name.
pub(super) fn on_replica_set_deleted(
    to_servers: UnboundedSender<ObjectRef<HaltSQLServer>>,
) -> impl Fn(&PartialObjectMeta<ReplicaSet>) + Send + 'static {
    move |rs| {
        let deployment = rs.metadata.owner_references.iter().flatten().find(|o| {
            o.controller == Some(true) && o.kind == "Deployment" && o.api_version == "apps/v1"
        });
        if let (Some(owner), Some(ns)) = (deployment, rs.metadata.namespace.as_deref()) {
            let _ = to_servers.unbounded_send(ObjectRef::new(&owner.name).within(ns));
        }
    }
}

/// The policies a server event requeues: those it references or ran, but
/// only when that changed (see [`SyncedInputs`]).
pub(super) fn policies_to_requeue(
    policies: Store<HaltSQLPolicy>,
    synced_inputs: Arc<SyncedInputs>,
) -> impl Fn(Arc<HaltSQLServer>) -> Vec<ObjectRef<HaltSQLPolicy>> + Send + Sync + 'static {
    // A policy a server just dropped is not in its spec any more, but still
    // in its appliedPolicies: requeue both. Only when those changed, though:
    // most server writes (replica counts, conditions) say nothing about a
    // policy's Synced.
    move |server| {
        if !synced_inputs.changed(&server) {
            return Vec::new();
        }
        policy::policies_affected_by(&server, &policies).collect()
    }
}

/// The server that controls an owned object, from its controller owner reference.
fn controlling_server<K: Resource>(obj: &K) -> Option<ObjectRef<HaltSQLServer>> {
    let owner = obj.meta().owner_references.as_ref()?.iter().find(|o| {
        o.controller == Some(true)
            && o.kind == "HaltSQLServer"
            && o.api_version == crate::api::API_VERSION
    })?;
    let mut reference = ObjectRef::new(&owner.name);
    if let Some(ns) = obj.meta().namespace.as_deref() {
        reference = reference.within(ns);
    }
    Some(reference)
}

/// What a policy's `Synced` reads from each server (the policies it
/// references and its appliedPolicies), as last seen, so that server events
/// that change neither requeue no policy.
#[derive(Default)]
pub(super) struct SyncedInputs {
    last_seen: std::sync::Mutex<std::collections::HashMap<ObjectRef<HaltSQLServer>, u64>>,
}

impl SyncedInputs {
    /// Records the server's inputs; true if they differ from the last seen.
    pub(super) fn changed(&self, server: &HaltSQLServer) -> bool {
        use std::hash::Hasher;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for reference in &server.spec.policies {
            hasher.write(reference.name.as_bytes());
            hasher.write_u8(0);
        }
        hasher.write_u8(1);
        if let Some(applied) = server
            .status
            .as_ref()
            .and_then(|s| s.applied_policies.as_ref())
        {
            for policy in applied {
                hasher.write(policy.name.as_bytes());
                hasher.write_u8(0);
                hasher.write(policy.content_hash.as_bytes());
                hasher.write_u8(0);
            }
        }
        let fingerprint = hasher.finish();
        let mut last_seen = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        last_seen.insert(ObjectRef::from_obj(server), fingerprint) != Some(fingerprint)
    }

    pub(super) fn forget(&self, server: &HaltSQLServer) {
        let mut last_seen = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        last_seen.remove(&ObjectRef::from_obj(server));
    }
}
