//! The HaltSQLServer controller on the full local cluster: the real Deployment
//! controller makes ReplicaSets, kwok makes pods Ready, the garbage collector
//! removes owned objects.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use support::{Cluster, Operator, TestNamespace, condition, eventually};

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
    list.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count() as i32
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
    support::ensure_crds(Cluster::Full);
    let client = support::client().await;
    let ns = TestNamespace::new(&client, prefix).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "haltsql-tokens"},
        "stringData": {"orders-agent.sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let operator = Operator::start(&client, &[&ns.name], |s| {
        s.rollout_deadline = rollout_deadline
    });
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
            && config_maps
                .get_opt("hs-haltsql-config")
                .await
                .ok()?
                .is_none()
            && services.get_opt("hs").await.ok()?.is_none()
            && pdbs.get_opt("hs").await.ok()?.is_none()
            && network_policies.get_opt("hs").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    // The policy is not owned by the server and stays, now NotReferenced.
    wait_condition(&policies, "orders", "Synced", "False", "NotReferenced").await;
}
