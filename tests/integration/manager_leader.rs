//! Leader election and shutdown with real operator processes: one leader
//! reconciles, a standby takes over within the lease duration after the
//! leader is killed, a leader that loses its lease exits, SIGTERM drains
//! in-flight reconciles and releases the lease.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use crate::support::TestNamespace;
use crate::support::{Metrics, OperatorProcess};
use haltsql_testkit::fixtures;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::Api;

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use haltsql_operator::manager::leader::{LEASE_DURATION_SECONDS, LEASE_NAME};

fn is_leader(m: &Metrics) -> bool {
    m.value("haltsql_operator_leader", &[]) == 1.0
}

fn reconciles(m: &Metrics) -> f64 {
    m.value("haltsql_operator_reconciles_total", &[])
}

fn writes(m: &Metrics) -> f64 {
    m.value("haltsql_operator_api_writes_total", &[])
}

fn applies(m: &Metrics, kind: &str) -> f64 {
    m.value(
        "haltsql_operator_api_writes_total",
        &[("kind", kind), ("verb", "apply")],
    )
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_standby_takes_over_without_double_writes() {
    let client = support::client_with_crds().await;
    let ns = TestNamespace::new(&client, "mgr-leader").await;
    let options = support::options(&[&ns.name]).leader_elect(&ns.name);
    let first = OperatorProcess::start(&options);
    let second = OperatorProcess::start(&options);
    first.wait_serving().await;
    second.wait_serving().await;
    support::apply_quickstart(&ns.name, None);

    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &ns.name);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);

    support::eventually(
        "a leader that reconciled",
        Duration::from_secs(90),
        || async {
            servers.get("haltsql").await.ok()?.status?.config_checksum?;
            support::current_config_map(&servers, &config_maps, "haltsql").await?;
            Some(())
        },
    )
    .await;
    let (mut leader, standby) = if is_leader(&first.metrics().await) {
        (first, second)
    } else {
        (second, first)
    };
    assert!(is_leader(&leader.metrics().await), "neither process leads");
    // Both are ready: readiness does not depend on leadership.
    for p in [&leader, &standby] {
        assert_eq!(p.health("/readyz").await, Some(200));
    }
    let lease = leases.get(LEASE_NAME).await.unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    assert!(!holder.is_empty());

    // Let things settle, then: the standby did nothing at all.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m = standby.metrics().await;
    assert!(!is_leader(&m));
    assert_eq!(reconciles(&m), 0.0, "the standby reconciled:\n{}", m.0);
    assert_eq!(writes(&m), 0.0, "the standby wrote:\n{}", m.0);
    let leader_metrics = leader.metrics().await;
    for kind in ["ConfigMap", "Deployment", "Service"] {
        assert_eq!(applies(&leader_metrics, kind), 1.0, "{kind}");
    }

    let config_map_version = support::current_config_map(&servers, &config_maps, "haltsql")
        .await
        .unwrap()
        .resource_version();
    let service_version = services.get("haltsql").await.unwrap().resource_version();
    let deployment_generation = deployments
        .get("haltsql")
        .await
        .unwrap()
        .metadata
        .generation;

    // Kill the leader without a chance to release the lease.
    leader.child.kill().unwrap();
    leader.child.wait().unwrap();
    let killed = Instant::now();
    support::eventually(
        "the standby to take the lease",
        Duration::from_secs(LEASE_DURATION_SECONDS + 10),
        || async { is_leader(&standby.metrics().await).then_some(()) },
    )
    .await;
    let handover = killed.elapsed();
    assert!(
        handover <= Duration::from_secs(LEASE_DURATION_SECONDS + 5),
        "handover took {handover:?}"
    );
    let lease = leases.get(LEASE_NAME).await.unwrap();
    assert_ne!(lease.spec.unwrap().holder_identity, Some(holder));

    // The new leader re-reconciles everything and finds nothing to write.
    support::eventually(
        "the new leader's first pass",
        Duration::from_secs(60),
        || async {
            (standby.metrics().await.value(
                "haltsql_operator_reconciles_total",
                &[("controller", "haltsqlserver"), ("result", "success")],
            ) >= 1.0)
                .then_some(())
        },
    )
    .await;
    let m = standby.metrics().await;
    for kind in ["ConfigMap", "Deployment", "Service"] {
        assert_eq!(applies(&m, kind), 0.0, "{kind} was written again:\n{}", m.0);
    }
    assert_eq!(
        support::current_config_map(&servers, &config_maps, "haltsql")
            .await
            .unwrap()
            .resource_version(),
        config_map_version
    );
    assert_eq!(
        services.get("haltsql").await.unwrap().resource_version(),
        service_version
    );
    assert_eq!(
        deployments
            .get("haltsql")
            .await
            .unwrap()
            .metadata
            .generation,
        deployment_generation
    );

    // And it reconciles a new change, exactly once per object.
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    let policy = policies.get("orders").await.unwrap();
    let text = policy.spec.policy.clone().unwrap();
    let changed = text.replace(
        "[id, status, total_cents]",
        "[id, status, total_cents, created_at]",
    );
    assert_ne!(text, changed);
    support::merge_patch(
        &policies,
        "orders",
        serde_json::json!({"spec": {"policy": changed}}),
    )
    .await;
    support::eventually(
        "the new policy in the ConfigMap",
        Duration::from_secs(60),
        || async {
            let cm = support::current_config_map(&servers, &config_maps, "haltsql").await?;
            cm.data?
                .values()
                .any(|v| v.contains("created_at"))
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = standby.metrics().await;
    assert_eq!(applies(&m, "ConfigMap"), 1.0, "{}", m.0);
    assert_eq!(applies(&m, "Deployment"), 1.0, "{}", m.0);
    assert_eq!(applies(&m, "Service"), 0.0, "{}", m.0);
    assert_eq!(
        deployments
            .get("haltsql")
            .await
            .unwrap()
            .metadata
            .generation,
        deployment_generation.map(|g| g + 1)
    );
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_exits() {
    let client = support::client_with_crds().await;
    let ns = TestNamespace::new(&client, "mgr-lost").await;
    let mut operator =
        OperatorProcess::start(&support::options(&[&ns.name]).leader_elect(&ns.name));
    operator.wait_serving().await;
    support::eventually("leadership", Duration::from_secs(30), || async {
        is_leader(&operator.metrics().await).then_some(())
    })
    .await;

    // Another holder takes the lease over (as after a partition).
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    support::merge_patch(
        &leases,
        LEASE_NAME,
        serde_json::json!({"spec": {
            "holderIdentity": "someone-else",
            "acquireTime": now,
            "renewTime": now,
            "leaseDurationSeconds": 60,
        }}),
    )
    .await;
    let status = operator
        .wait_exit(Duration::from_secs(LEASE_DURATION_SECONDS + 5))
        .unwrap_or_else(|| panic!("still running after losing the lease:\n{}", operator.logs()));
    assert_eq!(status.code(), Some(1), "{}", operator.logs());
    assert!(
        operator.logs().contains("lost the leader lease"),
        "{}",
        operator.logs()
    );
    // It left the lease to its new holder.
    let lease = leases.get(LEASE_NAME).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("someone-else")
    );
}

#[tokio::test]
async fn sigterm_drains_in_flight_reconciles_and_releases_the_lease() {
    let client = support::client_with_crds().await;
    let ns = TestNamespace::new(&client, "mgr-term").await;
    // A validator that takes 3 seconds, so a reconcile is surely in flight.
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow-haltsql");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\n/bin/sleep 3\nexec {} \"$@\"\n",
            support::haltsql_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut options = support::options(&[&ns.name]).leader_elect(&ns.name);
    options.haltsql_binary = slow;
    let mut operator = OperatorProcess::start(&options);
    operator.wait_serving().await;
    support::eventually("leader and ready", Duration::from_secs(60), || async {
        (is_leader(&operator.metrics().await) && operator.health("/readyz").await == Some(200))
            .then_some(())
    })
    .await;

    support::Cluster::Full.apply(&fixtures::yaml_in(
        fixtures::quick_start_policy(),
        Some(&ns.name),
    ));
    support::eventually(
        "a policy reconcile in flight",
        Duration::from_secs(30),
        || async {
            (operator.metrics().await.value(
                "haltsql_operator_reconciles_in_flight",
                &[("controller", "haltsqlpolicy")],
            ) >= 1.0)
                .then_some(())
        },
    )
    .await;
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    assert_eq!(policies.get("orders").await.unwrap().status, None);

    operator.signal("TERM");
    let status = operator
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("still running 20 s after SIGTERM:\n{}", operator.logs()));
    assert_eq!(status.code(), Some(0), "{}", operator.logs());

    // The reconcile in flight finished and wrote its verdict before the exit.
    let policy = policies.get("orders").await.unwrap();
    assert_eq!(
        policy.status.and_then(|s| s.policy_name).as_deref(),
        Some("orders-agent"),
        "the in-flight reconcile was dropped:\n{}",
        operator.logs()
    );
    // The lease is free for the next leader right away.
    let lease: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let lease = lease.get(LEASE_NAME).await.unwrap();
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
    let logs = operator.logs();
    assert!(logs.contains("released the leader lease"), "{logs}");
}
