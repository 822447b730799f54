//! The HaltSQLServer controller against a real kube-apiserver and etcd with no
//! controller-manager: the tests write Deployment status themselves, and check
//! owner references instead of garbage collection.

use crate::support;

use std::time::Duration;

use crate::support::{Cluster, Operator, TestNamespace, condition, eventually};
use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(30);

struct Fixture {
    /// Deleted when the test ends.
    _ns: TestNamespace,
    operator: Operator,
    policies: Api<HaltSQLPolicy>,
    servers: Api<HaltSQLServer>,
    deployments: Api<Deployment>,
    config_maps: Api<ConfigMap>,
    services: Api<Service>,
    pdbs: Api<PodDisruptionBudget>,
    network_policies: Api<NetworkPolicy>,
    events: Api<Event>,
}

async fn fixture(prefix: &str) -> Fixture {
    fixture_with(prefix, |_| {}).await
}

async fn fixture_with(
    prefix: &str,
    adjust: impl FnOnce(&mut haltsql_operator::controllers::context::Settings),
) -> Fixture {
    let (client, ns, operator) =
        support::in_process::start_in_new_namespace(Cluster::Envtest, prefix, adjust).await;
    Fixture {
        events: Api::namespaced(client.clone(), &ns.name),
        policies: Api::namespaced(client.clone(), &ns.name),
        servers: Api::namespaced(client.clone(), &ns.name),
        deployments: Api::namespaced(client.clone(), &ns.name),
        config_maps: Api::namespaced(client.clone(), &ns.name),
        services: Api::namespaced(client.clone(), &ns.name),
        pdbs: Api::namespaced(client.clone(), &ns.name),
        network_policies: Api::namespaced(client.clone(), &ns.name),
        _ns: ns,
        operator,
    }
}

impl Fixture {
    async fn create_quick_start(&self) {
        let document = support::quick_start_policy_document(&["id", "status", "total_cents"]);
        self.policies
            .create(
                &PostParams::default(),
                &support::policy_object("orders", &document),
            )
            .await
            .unwrap();
        self.servers
            .create(
                &PostParams::default(),
                &support::quick_start_server("hs", "orders"),
            )
            .await
            .unwrap();
    }

    /// The current per-configuration ConfigMap of `hs`.
    async fn config_map(&self) -> ConfigMap {
        support::current_config_map(&self.servers, &self.config_maps, "hs")
            .await
            .expect("the server's current ConfigMap")
    }

    async fn server_condition(&self, type_: &str) -> Option<(String, String)> {
        let server = self.servers.get("hs").await.ok()?;
        condition(&server.status?.conditions, type_)
    }

    async fn wait_server_condition(&self, type_: &str, status: &str, reason: &str) {
        let what = format!("server condition {type_}={status}/{reason}");
        eventually(&what, WAIT, || async {
            let (s, r) = self.server_condition(type_).await?;
            (s == status && r == reason).then_some(())
        })
        .await;
    }

    async fn wait_policy_condition(&self, name: &str, type_: &str, status: &str, reason: &str) {
        let what = format!("policy {name} condition {type_}={status}/{reason}");
        eventually(&what, WAIT, || async {
            let policy = self.policies.get(name).await.ok()?;
            let (s, r) = condition(&policy.status?.conditions, type_)?;
            (s == status && r == reason).then_some(())
        })
        .await;
    }

    /// Waits for an Event about the server `hs` with `reason`, as anyone
    /// reads it through the API server (`kubectl events`, `describe`).
    async fn wait_event(&self, type_: &str, reason: &str) -> Event {
        let what = format!("a {type_} Event {reason} about hs");
        eventually(&what, WAIT, || async {
            let events = self.events.list(&Default::default()).await.ok()?;
            events.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some(type_)
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("HaltSQLServer")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("hs")
            })
        })
        .await
    }

    async fn complete_rollout(&self) {
        support::in_process::complete_rollout(&self.deployments, "hs").await;
    }

    async fn ready_quick_start(&self) {
        self.create_quick_start().await;
        self.wait_policy_condition("orders", "Valid", "True", "Validated")
            .await;
        self.complete_rollout().await;
        self.wait_server_condition("Ready", "True", "Ready").await;
        self.wait_policy_condition("orders", "Synced", "True", "Synced")
            .await;
    }
}

fn controlled_by(meta: &kube::core::ObjectMeta, server: &HaltSQLServer) -> bool {
    meta.owner_references.iter().flatten().any(|o| {
        o.uid == server.uid().unwrap_or_default()
            && o.kind == "HaltSQLServer"
            && o.controller == Some(true)
            && o.block_owner_deletion == Some(true)
    })
}

#[tokio::test]
async fn quick_start_renders_owned_objects_and_becomes_ready() {
    let f = fixture("srv-ready").await;
    f.create_quick_start().await;
    f.wait_policy_condition("orders", "Valid", "True", "Validated")
        .await;
    f.wait_server_condition("PoliciesReady", "True", "PoliciesReady")
        .await;
    f.wait_server_condition("ConfigRendered", "True", "Rendered")
        .await;
    // Nothing has run the Deployment yet.
    f.wait_server_condition("Available", "False", "Unavailable")
        .await;
    f.wait_server_condition("Progressing", "True", "RollingOut")
        .await;
    f.wait_server_condition("Ready", "False", "Unavailable")
        .await;
    f.wait_policy_condition("orders", "Synced", "False", "RollingOut")
        .await;

    let server = f.servers.get("hs").await.unwrap();
    let config_map = f.config_map().await;
    let deployment = f.deployments.get("hs").await.unwrap();
    let service = f.services.get("hs").await.unwrap();
    let pdb = f.pdbs.get("hs").await.unwrap();
    let network_policy = f.network_policies.get("hs").await.unwrap();
    for (kind, meta) in [
        ("ConfigMap", &config_map.metadata),
        ("Deployment", &deployment.metadata),
        ("Service", &service.metadata),
        ("PodDisruptionBudget", &pdb.metadata),
        ("NetworkPolicy", &network_policy.metadata),
    ] {
        assert!(
            controlled_by(meta, &server),
            "{kind} has a controller owner reference to the server"
        );
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("haltsql-operator"),
            "{kind}"
        );
        assert!(
            meta.annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("haltsql.dev/spec-hash")),
            "{kind}"
        );
    }
    // One immutable ConfigMap per configuration, named and labelled by its
    // hash, which the pod template mounts and carries.
    assert_eq!(config_map.immutable, Some(true));
    let cm_name = config_map.metadata.name.clone().unwrap();
    let hash = cm_name.strip_prefix("hs-haltsql-config-").unwrap();
    assert_eq!(hash.len(), 16, "{cm_name}");
    assert_eq!(
        config_map
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("haltsql.dev/config-hash"))
            .map(String::as_str),
        Some(hash)
    );
    let template = deployment.spec.as_ref().unwrap().template.clone();
    assert_eq!(
        template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .and_then(|l| l.get("haltsql.dev/config-hash"))
            .map(String::as_str),
        Some(hash)
    );
    let mounted: Vec<String> = template
        .spec
        .unwrap()
        .volumes
        .unwrap()
        .into_iter()
        .filter_map(|v| v.config_map.map(|c| c.name))
        .collect();
    assert_eq!(mounted, std::slice::from_ref(&cm_name));
    let data = config_map.data.unwrap();
    assert!(data.contains_key("config.yaml"));
    assert!(data.contains_key("policy-orders.yaml"));
    let checksum = server
        .status
        .as_ref()
        .and_then(|s| s.config_checksum.clone())
        .unwrap();
    let template_checksum = deployment
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap()
        .get("haltsql.dev/config-checksum")
        .cloned();
    assert_eq!(template_checksum.as_deref(), Some(checksum.as_str()));

    f.complete_rollout().await;
    f.wait_server_condition("Available", "True", "Ready").await;
    f.wait_server_condition("Progressing", "True", "RolloutComplete")
        .await;
    f.wait_server_condition("Ready", "True", "Ready").await;
    f.wait_policy_condition("orders", "Synced", "True", "Synced")
        .await;
    let status = f.servers.get("hs").await.unwrap().status.unwrap();
    let policy_status = f.policies.get("orders").await.unwrap().status.unwrap();
    let applied = status.applied_policies.unwrap();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].name, "orders-agent");
    assert_eq!(
        Some(&applied[0].content_hash),
        policy_status.content_hash.as_ref()
    );
    assert_eq!(status.ready_replicas, Some(2));
    assert_eq!(
        status.observed_generation,
        f.servers.get("hs").await.unwrap().metadata.generation
    );
}

#[tokio::test]
async fn an_idle_server_gets_no_writes() {
    let f = fixture("srv-idle").await;
    f.ready_quick_start().await;
    // Let the watch events of the last writes settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes_before = f.operator.writes();
    async fn versions(f: &Fixture) -> Vec<Option<String>> {
        vec![
            f.servers.get("hs").await.unwrap().resource_version(),
            f.policies.get("orders").await.unwrap().resource_version(),
            f.config_map().await.resource_version(),
            f.deployments.get("hs").await.unwrap().resource_version(),
            f.services.get("hs").await.unwrap().resource_version(),
            f.pdbs.get("hs").await.unwrap().resource_version(),
            f.network_policies
                .get("hs")
                .await
                .unwrap()
                .resource_version(),
        ]
    }
    let before = versions(&f).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(versions(&f).await, before, "no object changed while idle");
    assert_eq!(
        f.operator.writes(),
        writes_before,
        "the operator wrote nothing while idle"
    );
}

#[tokio::test]
async fn an_invalid_policy_edit_keeps_the_last_good_configuration() {
    let f = fixture("srv-invalid").await;
    f.ready_quick_start().await;
    let config_map = f.config_map().await;
    let config_maps = support::config_map_names(&f.config_maps, "hs").await;
    let deployment = f.deployments.get("hs").await.unwrap();

    let broken = "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: orders-agent\ntables:\n  app.orders:\n    colums: [id]\n";
    f.policies
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"policy": broken}})),
        )
        .await
        .unwrap();
    f.wait_policy_condition("orders", "Valid", "False", "ValidationFailed")
        .await;
    f.wait_server_condition("PoliciesReady", "False", "PolicyNotValid")
        .await;
    f.wait_server_condition("ConfigRendered", "False", "NotRendered")
        .await;
    f.wait_server_condition("Ready", "False", "PolicyNotValid")
        .await;
    f.wait_policy_condition("orders", "Synced", "False", "NotValid")
        .await;
    let policy = f.policies.get("orders").await.unwrap();
    let valid = policy
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Valid")
        .unwrap();
    assert!(
        valid.message.contains("tables.app.orders.colums"),
        "located message: {}",
        valid.message
    );

    assert_eq!(
        f.config_map().await.resource_version(),
        config_map.resource_version()
    );
    assert_eq!(
        support::config_map_names(&f.config_maps, "hs").await,
        config_maps,
        "no new ConfigMap"
    );
    assert_eq!(
        f.deployments.get("hs").await.unwrap().resource_version(),
        deployment.resource_version()
    );
}

#[tokio::test]
async fn a_policy_edit_rolls_a_new_checksum_and_synced_follows() {
    let f = fixture("srv-edit").await;
    f.ready_quick_start().await;
    let old_checksum = f
        .servers
        .get("hs")
        .await
        .unwrap()
        .status
        .unwrap()
        .config_checksum
        .unwrap();
    let document =
        support::quick_start_policy_document(&["id", "status", "total_cents", "created_at"]);
    f.policies
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"policy": document}})),
        )
        .await
        .unwrap();
    let new_checksum = eventually("a new checksum on the Deployment", WAIT, || async {
        let d = f.deployments.get("hs").await.ok()?;
        let c = d
            .spec?
            .template
            .metadata?
            .annotations?
            .get("haltsql.dev/config-checksum")?
            .clone();
        (c != old_checksum).then_some(c)
    })
    .await;
    f.wait_policy_condition("orders", "Synced", "False", "RollingOut")
        .await;
    f.wait_server_condition("Progressing", "True", "RollingOut")
        .await;
    f.complete_rollout().await;
    f.wait_policy_condition("orders", "Synced", "True", "Synced")
        .await;
    let status = f.servers.get("hs").await.unwrap().status.unwrap();
    assert_eq!(
        status.config_checksum.as_deref(),
        Some(new_checksum.as_str())
    );
    let policy_hash = f
        .policies
        .get("orders")
        .await
        .unwrap()
        .status
        .unwrap()
        .content_hash
        .unwrap();
    assert_eq!(
        status.applied_policies.unwrap()[0].content_hash,
        policy_hash
    );
}

/// The name of the ConfigMap the operator will render for the quick start
/// in `namespace` (the same pure rendering the operator runs).
fn quick_start_config_map_name(namespace: &str) -> String {
    let document = support::quick_start_policy_document(&["id", "status", "total_cents"]);
    let policy = support::policy_object("orders", &document);
    let mut server = support::quick_start_server("hs", "orders");
    server.metadata.namespace = Some(namespace.to_owned());
    let input = haltsql_operator::render::PolicyInput {
        object_name: "orders",
        policy_name: "orders-agent",
        content_hash: "",
        spec: &policy.spec,
    };
    let rendered = haltsql_operator::render::render(&server, &[input]).unwrap();
    rendered.config_map.metadata.name.unwrap()
}

#[tokio::test]
async fn name_conflict_leaves_the_foreign_object_untouched() {
    let f = fixture("srv-conflict").await;
    let taken = quick_start_config_map_name(&f._ns.name);
    // Also a foreign ConfigMap with the name older operator versions used:
    // no longer ours, so neither a conflict nor something to collect.
    for name in [taken.as_str(), "hs-haltsql-config"] {
        let foreign: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"team": "someone-else"}},
            "data": {"config.yaml": "not ours"}
        }))
        .unwrap();
        f.config_maps
            .create(&PostParams::default(), &foreign)
            .await
            .unwrap();
    }
    let before = f.config_maps.get(&taken).await.unwrap();
    let legacy_before = f.config_maps.get("hs-haltsql-config").await.unwrap();
    f.create_quick_start().await;
    f.wait_server_condition("ConfigRendered", "False", "NameConflict")
        .await;
    f.wait_server_condition("Ready", "False", "NameConflict")
        .await;
    let event = f.wait_event("Warning", "NameConflict").await;
    assert!(
        event
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&format!("ConfigMap {taken}"))),
        "{event:?}"
    );
    let after = f.config_maps.get(&taken).await.unwrap();
    assert_eq!(after.resource_version(), before.resource_version());
    assert_eq!(after.data, before.data);
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert!(after.metadata.owner_references.is_none());
    assert!(
        f.deployments.get_opt("hs").await.unwrap().is_none(),
        "nothing is applied on a conflict"
    );
    let server = f.servers.get("hs").await.unwrap();
    let message = server
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "ConfigRendered")
        .unwrap()
        .message;
    assert!(message.contains(&format!("ConfigMap {taken}")), "{message}");

    // Once the name is free, the server renders; the legacy-named foreign
    // ConfigMap is left as it was throughout.
    // (The operator does not watch foreign objects: touch the server.)
    support::delete_ignoring_missing(&f.config_maps, &taken).await;
    f.servers
        .patch(
            "hs",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    f.wait_server_condition("ConfigRendered", "True", "Rendered")
        .await;
    f.complete_rollout().await;
    f.wait_server_condition("Ready", "True", "Ready").await;
    let legacy_after = f.config_maps.get("hs-haltsql-config").await.unwrap();
    assert_eq!(
        legacy_after.resource_version(),
        legacy_before.resource_version()
    );
}

#[tokio::test]
async fn a_deleted_owned_object_comes_back_and_manual_edits_stay() {
    let f = fixture("srv-recreate").await;
    f.ready_quick_start().await;
    support::delete_ignoring_missing(&f.services, "hs").await;
    eventually("the Service re-created", WAIT, || async {
        f.services.get_opt("hs").await.ok()?
    })
    .await;

    // A manual edit stays until the server or its policies change (spec-hash rule).
    f.services
        .patch("hs", &PatchParams::default(), &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"edited": "by-hand"}}, "spec": {"sessionAffinity": "ClientIP"}})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let svc = f.services.get("hs").await.unwrap();
    assert_eq!(
        svc.spec.unwrap().session_affinity.as_deref(),
        Some("ClientIP")
    );
}

#[tokio::test]
async fn missing_policy_and_invalid_config_fail_closed() {
    let f = fixture("srv-closed").await;
    f.servers
        .create(
            &PostParams::default(),
            &support::quick_start_server("hs", "nope"),
        )
        .await
        .unwrap();
    f.wait_server_condition("PoliciesReady", "False", "PolicyNotFound")
        .await;
    f.wait_server_condition("Ready", "False", "PolicyNotFound")
        .await;
    f.wait_server_condition("Available", "False", "DeploymentMissing")
        .await;
    assert!(
        support::config_map_names(&f.config_maps, "hs")
            .await
            .is_empty()
    );

    // The policy appears, but the token names a policy it does not define.
    let document =
        support::quick_start_policy_document(&["id"]).replace("orders-agent", "billing-agent");
    f.policies
        .create(
            &PostParams::default(),
            &support::policy_object("nope", &document),
        )
        .await
        .unwrap();
    f.wait_server_condition("ConfigRendered", "False", "InvalidConfig")
        .await;
    let server = f.servers.get("hs").await.unwrap();
    let message = server
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "ConfigRendered")
        .unwrap()
        .message;
    assert!(message.contains("orders-agent"), "{message}");
    assert!(f.deployments.get_opt("hs").await.unwrap().is_none());
    let event = f.wait_event("Warning", "InvalidConfig").await;
    assert_eq!(event.note.as_deref(), Some(message.as_str()));
    assert_eq!(event.action.as_deref(), Some("Render"));
}

#[tokio::test]
async fn deleting_a_policy_requeues_its_server() {
    let f = fixture("srv-delpol").await;
    f.ready_quick_start().await;
    support::delete_ignoring_missing(&f.policies, "orders").await;
    f.wait_server_condition("PoliciesReady", "False", "PolicyNotFound")
        .await;
    // Still serving the last good configuration.
    assert!(f.deployments.get_opt("hs").await.unwrap().is_some());
}

#[tokio::test]
async fn disabling_the_pdb_deletes_it_and_a_stalled_rollout_is_reported() {
    let f = fixture("srv-pdb").await;
    f.ready_quick_start().await;
    f.servers
        .patch(
            "hs",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"podDisruptionBudget": {"enabled": false}}})),
        )
        .await
        .unwrap();
    eventually("the PDB deleted", WAIT, || async {
        f.pdbs.get_opt("hs").await.ok()?.is_none().then_some(())
    })
    .await;

    // The Deployment controller's verdict on a stalled rollout becomes RolloutFailed.
    let deployment = f.deployments.get("hs").await.unwrap();
    assert_eq!(
        deployment.spec.as_ref().unwrap().progress_deadline_seconds,
        Some(180)
    );
    let status = serde_json::json!({"status": {
        "observedGeneration": deployment.metadata.generation,
        "replicas": 3, "updatedReplicas": 1, "readyReplicas": 2, "availableReplicas": 2,
        "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                        "message": "ReplicaSet has timed out progressing.",
                        "lastUpdateTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }});
    f.deployments
        .patch_status("hs", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    f.wait_server_condition("Progressing", "False", "RolloutFailed")
        .await;
    f.wait_server_condition("Ready", "False", "RolloutFailed")
        .await;
    let event = f.wait_event("Warning", "RolloutFailed").await;
    assert_eq!(event.action.as_deref(), Some("Rollout"));
    // The first rollout was announced too.
    let rolling = f.wait_event("Normal", "RollingOut").await;
    assert!(
        rolling
            .note
            .as_deref()
            .is_some_and(|n| n.starts_with("Rolling out configuration ")),
        "{rolling:?}"
    );
}

#[tokio::test]
async fn an_edit_is_reported_pending_only_when_its_validation_outlasts_the_grace() {
    use haltsql_operator::controllers::server::PENDING_GRACE;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Instant;

    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("haltsql");
    std::os::unix::fs::symlink(support::haltsql_bin(), &binary).unwrap();
    let f = fixture_with("srv-grace", |s| {
        s.haltsql_binary = binary.clone();
        s.validator_timeout = Duration::from_secs(5);
    })
    .await;
    f.ready_quick_start().await;

    // From now on the validator never answers in time: the edit stays pending.
    std::fs::remove_file(&binary).unwrap();
    std::fs::write(&binary, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let edited = support::quick_start_policy_document(&["id", "status"]);
    let edited_at = Instant::now();
    f.policies
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"policy": edited}})),
        )
        .await
        .unwrap();
    eventually("the server to hold off its report", WAIT, || async {
        (f.operator.reconciles("haltsqlserver", "waiting") > 0).then_some(())
    })
    .await;
    let gate = f.server_condition("PoliciesReady").await;
    // The grace starts after the edit, so a read that ended within it from
    // the edit saw the server inside its grace.
    if edited_at.elapsed() < PENDING_GRACE {
        assert_eq!(
            gate,
            Some(("True".to_owned(), "PoliciesReady".to_owned())),
            "still serving its last good configuration, the server stays ready"
        );
    } else {
        eprintln!("the status was read after the grace; only its end is checked");
    }
    f.wait_server_condition("PoliciesReady", "False", "PolicyPendingValidation")
        .await;
    f.wait_server_condition("Ready", "False", "PolicyPendingValidation")
        .await;

    // A validator again: the edit is judged and rolled out.
    std::fs::remove_file(&binary).unwrap();
    std::os::unix::fs::symlink(support::haltsql_bin(), &binary).unwrap();
    f.wait_server_condition("PoliciesReady", "True", "PoliciesReady")
        .await;
}

#[tokio::test]
async fn a_pending_policy_holds_the_server_and_scaling_to_zero_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("haltsql");
    let f = fixture_with("srv-pending", |s| s.haltsql_binary = binary.clone()).await;
    f.create_quick_start().await;
    // No validator yet: the policy is not judged, the server waits for it.
    f.wait_policy_condition("orders", "Valid", "Unknown", "ValidatorError")
        .await;
    f.wait_server_condition("PoliciesReady", "False", "PolicyPendingValidation")
        .await;
    f.wait_server_condition("Ready", "False", "PolicyPendingValidation")
        .await;
    assert!(f.deployments.get_opt("hs").await.unwrap().is_none());

    std::os::unix::fs::symlink(support::haltsql_bin(), &binary).unwrap();
    f.wait_policy_condition("orders", "Valid", "True", "Validated")
        .await;
    f.complete_rollout().await;
    f.wait_server_condition("Ready", "True", "Ready").await;

    f.servers
        .patch(
            "hs",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    f.wait_server_condition("Available", "False", "ScaledToZero")
        .await;
    let deployment = f.deployments.get("hs").await.unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(0));
}
