//! The HaltSQLServer controller on the full local cluster: the real Deployment
//! controller makes ReplicaSets, kwok makes pods Ready, the garbage collector
//! removes owned objects.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use crate::support::{Cluster, Operator, TestNamespace, condition, eventually};
use futures::StreamExt;
use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use haltsql_testkit::fixtures;
use haltsql_testkit::status::pod_ready;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

const WAIT: Duration = Duration::from_secs(60);

async fn wait_condition<K>(api: &Api<K>, name: &str, type_: &str, status: &str, reason: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + HasConditions,
{
    let what = format!("{name}: {type_}={status}/{reason}");
    eventually(&what, WAIT, || async {
        let obj = api.get(name).await.ok()?;
        let (s, r) = condition(obj.conditions(), type_)?;
        (s == status && r == reason).then_some(())
    })
    .await;
}

trait HasConditions {
    fn conditions(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition];
}
impl HasConditions for HaltSQLServer {
    fn conditions(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }
}
impl HasConditions for HaltSQLPolicy {
    fn conditions(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }
}

async fn ready_pods(pods: &Api<Pod>) -> i32 {
    let list = pods.list(&ListParams::default()).await.unwrap();
    list.items.iter().filter(|p| pod_ready(p)).count() as i32
}

/// The quick-start policy (with `columns`) and server "hs", once the server is Ready.
async fn create_ready_quick_start(
    policies: &Api<HaltSQLPolicy>,
    servers: &Api<HaltSQLServer>,
    columns: &[&str],
) {
    let document = support::quick_start_policy_document(columns);
    policies
        .create(
            &PostParams::default(),
            &support::policy_object("orders", &document),
        )
        .await
        .unwrap();
    servers
        .create(
            &PostParams::default(),
            &support::quick_start_server("hs", "orders"),
        )
        .await
        .unwrap();
    wait_condition(servers, "hs", "Ready", "True", "Ready").await;
}

async fn setup(
    prefix: &str,
    rollout_deadline: Duration,
) -> (kube::Client, TestNamespace, Operator) {
    let (client, ns, operator) =
        support::in_process::start_in_new_namespace(Cluster::Full, prefix, |s| {
            s.rollout_deadline = rollout_deadline
        })
        .await;
    fixtures::create_token_secret(&client, &ns.name, fixtures::TEST_TOKEN_SHA256).await;
    (client, ns, operator)
}

#[tokio::test]
async fn a_policy_edit_rolls_out_without_losing_ready_pods() {
    let (client, ns, _operator) = setup("cl-rollout", Duration::from_secs(180)).await;
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);

    create_ready_quick_start(&policies, &servers, &["id", "status", "total_cents"]).await;
    wait_condition(&policies, "orders", "Synced", "True", "Synced").await;
    assert_eq!(ready_pods(&pods).await, 2);
    let first_hash = policies
        .get("orders")
        .await
        .unwrap()
        .status
        .unwrap()
        .content_hash
        .unwrap();

    // Watch every pod change during the rollout and remember the fewest ready pods seen.
    let fewest_ready = Arc::new(AtomicI32::new(i32::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = tokio::spawn({
        let pods = pods.clone();
        let fewest_ready = fewest_ready.clone();
        let stop = stop.clone();
        async move {
            let mut events = watcher(pods.clone(), watcher::Config::default())
                .default_backoff()
                .boxed();
            while !stop.load(Ordering::SeqCst) {
                if tokio::time::timeout(Duration::from_millis(200), events.next())
                    .await
                    .is_ok()
                {
                    let ready = ready_pods(&pods).await;
                    fewest_ready.fetch_min(ready, Ordering::SeqCst);
                }
            }
        }
    });

    let document =
        support::quick_start_policy_document(&["id", "status", "total_cents", "created_at"]);
    policies
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"policy": document}})),
        )
        .await
        .unwrap();
    eventually("a second ReplicaSet", WAIT, || async {
        (replicasets
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len()
            == 2)
            .then_some(())
    })
    .await;
    eventually("Synced with the new content", WAIT, || async {
        let policy = policies.get("orders").await.ok()?;
        let status = policy.status?;
        let (s, _) = condition(&status.conditions, "Synced")?;
        (s == "True" && status.content_hash.as_deref() != Some(first_hash.as_str())).then_some(())
    })
    .await;
    wait_condition(&servers, "hs", "Ready", "True", "Ready").await;
    stop.store(true, Ordering::SeqCst);
    monitor.await.unwrap();

    let status = servers.get("hs").await.unwrap().status.unwrap();
    let new_hash = policies
        .get("orders")
        .await
        .unwrap()
        .status
        .unwrap()
        .content_hash
        .unwrap();
    assert_eq!(status.applied_policies.unwrap()[0].content_hash, new_hash);
    let fewest = fewest_ready.load(Ordering::SeqCst);
    assert!(
        fewest >= 2,
        "ready pods dropped to {fewest} during the rollout"
    );
    // The old ReplicaSet is scaled to zero, the new one runs both replicas.
    let rs = replicasets.list(&ListParams::default()).await.unwrap();
    let mut sizes: Vec<i32> = rs
        .items
        .iter()
        .map(|r| r.status.as_ref().map(|s| s.replicas).unwrap_or(0))
        .collect();
    sizes.sort();
    assert_eq!(sizes, vec![0, 2]);
}

#[tokio::test]
async fn pods_that_never_become_ready_give_rollout_failed() {
    let (client, ns, _operator) = setup("cl-stall", Duration::from_secs(5)).await;
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create_ready_quick_start(&policies, &servers, &["id"]).await;

    // New pods that can never be scheduled stand in for pods that never get ready.
    servers
        .patch(
            "hs",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"nodeSelector": {"haltsql.dev/no-such-node": "x"}}}),
            ),
        )
        .await
        .unwrap();
    wait_condition(&servers, "hs", "Progressing", "True", "RollingOut").await;
    wait_condition(&servers, "hs", "Progressing", "False", "RolloutFailed").await;
    wait_condition(&servers, "hs", "Ready", "False", "RolloutFailed").await;
    // The old pods keep serving.
    assert_eq!(ready_pods(&pods).await, 2);
    let status = servers.get("hs").await.unwrap().status.unwrap();
    assert_eq!(status.ready_replicas, Some(2));
}

#[tokio::test]
async fn deleting_the_server_garbage_collects_everything() {
    let (client, ns, _operator) = setup("cl-gc", Duration::from_secs(180)).await;
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &ns.name);
    create_ready_quick_start(&policies, &servers, &["id"]).await;

    support::delete_ignoring_missing(&servers, "hs").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns.name);
    let network_policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns.name);
    eventually("every owned object garbage-collected", WAIT, || async {
        let gone = deployments.get_opt("hs").await.ok()?.is_none()
            && replicasets
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
            && pods
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
            && support::config_map_names(&config_maps, "hs")
                .await
                .is_empty()
            && services.get_opt("hs").await.ok()?.is_none()
            && pdbs.get_opt("hs").await.ok()?.is_none()
            && network_policies.get_opt("hs").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    // The policy is not owned by the server and stays, now NotReferenced.
    wait_condition(&policies, "orders", "Synced", "False", "NotReferenced").await;
}

/// The config hash a pod (or ReplicaSet) carries, and the ConfigMap it mounts.
fn pod_config(pod: &Pod) -> (Option<String>, Vec<String>) {
    let hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("haltsql.dev/config-hash"))
        .cloned();
    let mounted = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.config_map.map(|c| c.name))
        .collect();
    (hash, mounted)
}

/// Issue 20, item 7: an old pod that restarts during a stalled rollout mounts
/// the last good configuration, because every configuration has its own
/// immutable ConfigMap, kept while a ReplicaSet uses it.
#[tokio::test]
async fn old_pods_restarted_during_a_stalled_rollout_keep_their_configuration() {
    let (client, ns, _operator) = setup("cl-immutable", Duration::from_secs(180)).await;
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    create_ready_quick_start(&policies, &servers, &["id"]).await;

    // A ConfigMap that looks like one of ours but is not controlled by the
    // server: never collected.
    let foreign: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hs-haltsql-config-00000000deadbeef", "labels": {
            "app.kubernetes.io/managed-by": "haltsql-operator",
            "app.kubernetes.io/instance": "hs",
            "haltsql.dev/config-hash": "00000000deadbeef"}},
        "data": {"config.yaml": "someone else's"}
    }))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let foreign_version = config_maps
        .get("hs-haltsql-config-00000000deadbeef")
        .await
        .unwrap()
        .metadata
        .resource_version;

    let good = support::current_config_map(&servers, &config_maps, "hs")
        .await
        .unwrap();
    let good_name = good.metadata.name.clone().unwrap();
    let good_hash = good_name
        .strip_prefix("hs-haltsql-config-")
        .unwrap()
        .to_owned();

    // A new configuration whose pods never become ready (they cannot be
    // scheduled): the rollout stalls with the old pods serving.
    servers
        .patch(
            "hs",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "config": {"logLevel": "debug"},
                "nodeSelector": {"haltsql.dev/no-such-node": "x"}}})),
        )
        .await
        .unwrap();
    let stalled = eventually("a new configuration rolling out", WAIT, || async {
        let cm = support::current_config_map(&servers, &config_maps, "hs").await?;
        let name = cm.metadata.name.clone()?;
        (name != good_name).then_some(cm)
    })
    .await;
    let stalled_name = stalled.metadata.name.clone().unwrap();
    assert!(
        stalled.data.as_ref().unwrap()["config.yaml"].contains("debug"),
        "the new configuration is in the new ConfigMap"
    );
    eventually("a pending pod of the new configuration", WAIT, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|p| pod_config(p).1 == [stalled_name.clone()])
            .then_some(())
    })
    .await;

    // Delete the old pods one by one: each replacement comes from the old
    // ReplicaSet, mounts the last good ConfigMap, which is still there and
    // unchanged, and becomes ready.
    for round in 0..2 {
        let list = pods.list(&ListParams::default()).await.unwrap();
        let old = list
            .items
            .iter()
            .find(|p| pod_ready(p) && pod_config(p).0.as_deref() == Some(good_hash.as_str()))
            .unwrap_or_else(|| panic!("round {round}: no ready old pod"))
            .clone();
        let old_name = old.metadata.name.clone().unwrap();
        support::delete_ignoring_missing(&pods, &old_name).await;
        let replacement = eventually("a ready replacement of the old pod", WAIT, || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let ready_old: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| pod_ready(p) && pod_config(p).0.as_deref() == Some(good_hash.as_str()))
                .collect();
            (ready_old.len() == 2
                && ready_old
                    .iter()
                    .all(|p| p.metadata.name.as_deref() != Some(&old_name)))
            .then(|| ready_old.into_iter().next())
            .flatten()
        })
        .await;
        assert_eq!(pod_config(&replacement).1, std::slice::from_ref(&good_name));
        let kept = config_maps.get(&good_name).await.unwrap();
        assert_eq!(kept.data, good.data, "round {round}: the old configuration");
        assert_eq!(
            kept.metadata.resource_version, good.metadata.resource_version,
            "round {round}: untouched"
        );
    }
    assert_eq!(ready_pods(&pods).await, 2);

    // The rollout can finish; the old ReplicaSet stays (revision history),
    // so its ConfigMap stays too.
    servers
        .patch(
            "hs",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"nodeSelector": null}})),
        )
        .await
        .unwrap();
    wait_condition(&servers, "hs", "Progressing", "True", "RolloutComplete").await;
    wait_condition(&servers, "hs", "Ready", "True", "Ready").await;
    assert!(config_maps.get_opt(&good_name).await.unwrap().is_some());

    // The old ReplicaSet goes (as the Deployment controller removes those
    // beyond revisionHistoryLimit): its ConfigMap follows; the current one
    // and the foreign one stay.
    let old_sets: Vec<String> = replicasets
        .list(&ListParams::default().labels(&format!("haltsql.dev/config-hash={good_hash}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|rs| rs.metadata.name)
        .collect();
    assert_eq!(old_sets.len(), 1, "{old_sets:?}");
    support::delete_ignoring_missing(&replicasets, &old_sets[0]).await;
    eventually("the unused ConfigMap collected", WAIT, || async {
        config_maps
            .get_opt(&good_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let current = support::current_config_map(&servers, &config_maps, "hs")
        .await
        .unwrap();
    assert_eq!(
        current.metadata.name.as_deref(),
        Some(stalled_name.as_str())
    );
    assert_eq!(
        config_maps
            .get("hs-haltsql-config-00000000deadbeef")
            .await
            .unwrap()
            .metadata
            .resource_version,
        foreign_version,
        "the foreign ConfigMap is untouched"
    );
}
