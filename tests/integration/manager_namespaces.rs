//! `--watch-namespaces`: objects elsewhere are never reconciled, and the
//! operator works with RBAC granted only in the watched namespaces.

use crate::support;

use std::time::Duration;

use crate::support::TestNamespace;
use crate::support::{LimitedIdentity, OperatorProcess};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};

/// Waits until the quick start in `namespace` is reconciled: the policy has
/// its verdict, the server its status, the ConfigMap exists.
async fn wait_reconciled(client: &Client, namespace: &str) {
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), namespace);
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    support::eventually(
        &format!("the quick start in {namespace} reconciled"),
        Duration::from_secs(90),
        || async {
            let policy = policies.get("orders").await.ok()?;
            policy.status?.policy_name?;
            servers.get("haltsql").await.ok()?.status?.config_checksum?;
            support::current_config_map(&servers, &config_maps, "haltsql").await?;
            Some(())
        },
    )
    .await;
}

/// Nothing of the operator's touched `namespace`.
async fn assert_untouched(client: &Client, namespace: &str) {
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), namespace);
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    assert_eq!(policies.get("orders").await.unwrap().status, None);
    assert_eq!(servers.get("haltsql").await.unwrap().status, None);
    assert!(
        support::config_map_names(&config_maps, "haltsql")
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn objects_outside_the_watched_namespaces_are_never_reconciled() {
    let client = support::client_with_crds().await;
    let a = TestNamespace::new(&client, "mgr-ns-a").await;
    let b = TestNamespace::new(&client, "mgr-ns-b").await;
    let c = TestNamespace::new(&client, "mgr-ns-c").await;
    for ns in [&a, &b, &c] {
        support::apply_quickstart(&ns.name, None);
    }
    // Admin credentials: only the flag keeps the operator out of c.
    let operator = OperatorProcess::start(&support::options(&[&a.name, &b.name]));
    wait_reconciled(&client, &a.name).await;
    wait_reconciled(&client, &b.name).await;
    // Give a stray watch time to show itself before looking at c.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_untouched(&client, &c.name).await;

    let m = operator.metrics().await;
    assert_eq!(
        m.value(
            "haltsql_operator_objects",
            &[("kind", "HaltSQLPolicy"), ("condition", "Valid")]
        ),
        2.0,
        "only the policies of a and b are cached"
    );
    assert!(
        !operator.logs().contains(&c.name),
        "the operator logged about {}",
        c.name
    );
}

#[tokio::test]
async fn the_operator_works_with_rolebindings_in_the_watched_namespaces_only() {
    let client = support::client_with_crds().await;
    let a = TestNamespace::new(&client, "mgr-rbac-a").await;
    let b = TestNamespace::new(&client, "mgr-rbac-b").await;
    let c = TestNamespace::new(&client, "mgr-rbac-c").await;
    for ns in [&a, &b, &c] {
        support::apply_quickstart(&ns.name, Some("0".repeat(64).as_str()));
    }
    // The ServiceAccount lives in a, its leader-election Role too.
    let identity = LimitedIdentity::new(&a.name, &[&a.name, &b.name], Some(&a.name));
    assert!(identity.can("list", "haltsqlpolicies.haltsql.dev", Some(&b.name)));
    assert!(!identity.can("list", "haltsqlpolicies.haltsql.dev", Some(&c.name)));
    assert!(!identity.can("list", "haltsqlpolicies.haltsql.dev", None));
    assert!(!identity.can("get", "secrets", Some(&a.name)));

    let mut options = support::options(&[&a.name, &b.name]).leader_elect(&a.name);
    options.kubeconfig = identity.kubeconfig.clone();
    let mut operator = OperatorProcess::start(&options);
    wait_reconciled(&client, &a.name).await;
    wait_reconciled(&client, &b.name).await;
    support::eventually("/readyz", Duration::from_secs(30), || async {
        (operator.health("/readyz").await == Some(200)).then_some(())
    })
    .await;
    assert_eq!(
        operator
            .metrics()
            .await
            .value("haltsql_operator_leader", &[]),
        1.0
    );
    assert_untouched(&client, &c.name).await;

    // Not one request was refused: nothing is listed cluster-wide, no Secret read.
    let logs = operator.logs();
    assert!(
        !logs.to_ascii_lowercase().contains("forbidden"),
        "a request was forbidden:\n{logs}"
    );
    assert!(
        operator.try_exit().is_none(),
        "the operator exited:\n{logs}"
    );
}
