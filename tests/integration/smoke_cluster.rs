//! Proves the local control plane is real: the API server stores and watches
//! objects, and the controller-manager, scheduler and kwok run Deployments.

use crate::support;

use std::time::Duration;

use crate::support::{Cluster, TestNamespace};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

#[tokio::test]
async fn configmap_round_trips_through_a_watcher() {
    for cluster in [Cluster::Envtest, Cluster::Full] {
        let client = cluster.client().await;
        let ns = TestNamespace::new_in(&client, cluster, "smoke-watch").await;
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);

        let mut stream = watcher(configmaps.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hello"},
            "data": {"greeting": "hi"}
        }))
        .unwrap();
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();

        let seen = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(obj) = stream.try_next().await.unwrap() {
                if obj.metadata.name.as_deref() == Some("hello") {
                    return obj;
                }
            }
            panic!("watch stream ended");
        })
        .await
        .expect("the ConfigMap comes back through the watcher");
        assert_eq!(
            seen.data.unwrap().get("greeting").map(String::as_str),
            Some("hi"),
            "{cluster:?}"
        );
    }
}

#[tokio::test]
async fn deployment_becomes_available_and_is_garbage_collected() {
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "smoke-deploy").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web:1"}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    support::eventually("2 available replicas", Duration::from_secs(60), || async {
        let d = deployments.get("web").await.ok()?;
        (d.status?.available_replicas? == 2).then_some(())
    })
    .await;
    assert_eq!(
        replicasets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );

    support::delete_ignoring_missing(&deployments, "web").await;
    support::eventually(
        "ReplicaSet and Pods garbage-collected",
        Duration::from_secs(60),
        || async {
            let rs = replicasets.list(&ListParams::default()).await.ok()?;
            let p = pods.list(&ListParams::default()).await.ok()?;
            (rs.items.is_empty() && p.items.is_empty()).then_some(())
        },
    )
    .await;
}
