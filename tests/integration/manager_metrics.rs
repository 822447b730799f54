//! The manager's endpoints and logs, from the real binary against the full
//! local cluster: `/metrics` after a reconcile, `/readyz` only after the
//! stores synced, JSON log lines that carry the object, no Secret values.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::TestNamespace;
use crate::support::{LimitedIdentity, OperatorProcess};
use haltsql_testkit::fixtures;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};

/// The series names the README's "Metrics" section documents.
fn documented_series() -> Vec<String> {
    let readme = std::fs::read_to_string(support::repo_root().join("README.md")).unwrap();
    let start = readme
        .find("\n## Metrics")
        .expect("README has a Metrics section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut names: Vec<String> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("haltsql_operator_") && !s.ends_with('_'))
        .map(|s| s.split('{').next().unwrap_or(s).to_owned())
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 8, "documented series: {names:?}");
    names
}

#[tokio::test]
async fn metrics_serve_the_documented_series_with_real_values_after_a_reconcile() {
    let client = support::client_with_crds().await;
    let ns = TestNamespace::new(&client, "mgr-metrics").await;
    // A token hash as in the quick start, unique to this run.
    let secret_value = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&ns.name));
    support::apply_quickstart(&ns.name, Some(&secret_value));

    let mut options = support::options(&[&ns.name]);
    options.rust_log = "debug".to_owned();
    let operator = OperatorProcess::start(&options);
    operator.wait_serving().await;

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    support::eventually(
        "the quick start reconciled",
        Duration::from_secs(90),
        || async {
            let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &ns.name);
            support::current_config_map(&servers, &config_maps, "haltsql").await?;
            (operator.metrics().await.value(
                "haltsql_operator_objects",
                &[
                    ("kind", "HaltSQLServer"),
                    ("condition", "ConfigRendered"),
                    ("status", "True"),
                ],
            ) == 1.0)
                .then_some(())
        },
    )
    .await;
    // The same content under another name: its verdict comes from the cache.
    let mut policy_copy = fixtures::quick_start_policy();
    policy_copy["metadata"]["name"] = "orders-copy".into();
    support::Cluster::Full.apply(&fixtures::yaml_in(policy_copy, Some(&ns.name)));
    support::eventually("both policies Valid", Duration::from_secs(60), || async {
        (operator.metrics().await.value(
            "haltsql_operator_objects",
            &[
                ("kind", "HaltSQLPolicy"),
                ("condition", "Valid"),
                ("status", "True"),
            ],
        ) == 2.0)
            .then_some(())
    })
    .await;

    let response = operator.metrics_response().await.expect("/metrics answers");
    assert_eq!(response.status, 200);
    assert!(
        response.content_type.starts_with("text/plain"),
        "{}",
        response.content_type
    );

    let m = operator.metrics().await;
    for name in documented_series() {
        assert!(
            m.has_series(&name),
            "{name} is documented but not served:\n{}",
            m.0
        );
    }
    for controller in ["haltsqlpolicy", "haltsqlserver"] {
        assert!(
            m.value(
                "haltsql_operator_reconciles_total",
                &[("controller", controller), ("result", "success")]
            ) >= 1.0,
            "{controller}"
        );
        assert!(
            m.value(
                "haltsql_operator_reconcile_duration_seconds_count",
                &[("controller", controller)]
            ) >= 1.0
        );
        assert!(
            m.value(
                "haltsql_operator_reconcile_duration_seconds_sum",
                &[("controller", controller)]
            ) > 0.0
        );
    }
    assert_eq!(
        m.value(
            "haltsql_operator_validator_runs_total",
            &[("outcome", "valid")]
        ),
        1.0,
        "one haltsql validate run for two objects with the same content"
    );
    // At least the copy's verdict; a pass over a not yet updated object may add one.
    assert!(
        m.value(
            "haltsql_operator_validator_cache_hits_total",
            &[("outcome", "valid")]
        ) >= 1.0
    );
    assert!(
        m.value(
            "haltsql_operator_validator_duration_seconds_sum",
            &[("outcome", "valid")]
        ) > 0.0
    );
    // Each owned object was written exactly once.
    for kind in [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ] {
        assert_eq!(
            m.value(
                "haltsql_operator_api_writes_total",
                &[("kind", kind), ("verb", "apply")]
            ),
            1.0,
            "{kind}"
        );
    }
    assert!(
        m.value(
            "haltsql_operator_api_writes_total",
            &[("kind", "HaltSQLPolicy"), ("verb", "status")]
        ) >= 2.0
    );
    assert_eq!(m.value("haltsql_operator_leader", &[]), 1.0);
    // A pass that the last status write itself triggered may still be running
    // at the scrape above; the gauge must come back to zero once it ends.
    support::eventually(
        "nothing in flight once settled",
        Duration::from_secs(10),
        || async {
            (operator
                .metrics()
                .await
                .value("haltsql_operator_reconciles_in_flight", &[])
                == 0.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(operator.health("/readyz").await, Some(200));
    assert_eq!(operator.health("/healthz").await, Some(200));

    // The gauge follows deletions at the next scrape.
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    support::delete_ignoring_missing(&policies, "orders-copy").await;
    support::eventually(
        "the deleted policy to leave the objects gauge",
        Duration::from_secs(30),
        || async {
            (operator.metrics().await.value(
                "haltsql_operator_objects",
                &[
                    ("kind", "HaltSQLPolicy"),
                    ("condition", "Valid"),
                    ("status", "True"),
                ],
            ) == 1.0)
                .then_some(())
        },
    )
    .await;

    // Logs: JSON lines; reconcile lines name their object; no Secret value.
    let logs = operator.logs();
    assert!(
        !logs.contains(&secret_value),
        "a Secret value reached the logs"
    );
    let lines = operator.log_lines();
    let applying = lines
        .iter()
        .find(|l| l["message"] == "applied" && l["kind"] == "Deployment")
        .unwrap_or_else(|| panic!("no 'applied' Deployment line:\n{logs}"));
    assert_eq!(applying["object"], "haltsql");
    assert_eq!(applying["namespace"], ns.name.as_str());
    assert_eq!(applying["name"], "haltsql");
    assert_eq!(applying["controller"], "haltsqlserver");
    let in_reconcile: Vec<_> = lines
        .iter()
        .filter(|l| {
            l["spans"]
                .as_array()
                .is_some_and(|s| s.iter().any(|n| n == "reconcile"))
        })
        .collect();
    assert!(!in_reconcile.is_empty());
    for line in in_reconcile {
        assert_eq!(line["namespace"], ns.name.as_str(), "{line}");
        assert!(
            line["name"].as_str().is_some_and(|n| !n.is_empty()),
            "{line}"
        );
    }
}

#[tokio::test]
async fn readyz_turns_ready_only_after_the_stores_synced() {
    let client = support::client_with_crds().await;
    let home = TestNamespace::new(&client, "mgr-ready-home").await;
    let watched = TestNamespace::new(&client, "mgr-ready").await;
    // No RoleBinding in the watched namespace yet: every list is forbidden,
    // so the stores cannot sync.
    let identity = LimitedIdentity::new(&home.name, &[], None);
    assert!(!identity.can("list", "haltsqlpolicies.haltsql.dev", Some(&watched.name)));

    let mut options = support::options(&[&watched.name]);
    options.kubeconfig = identity.kubeconfig.clone();
    let operator = OperatorProcess::start(&options);
    support::eventually("/healthz", Duration::from_secs(30), || async {
        (operator.health("/healthz").await == Some(200)).then_some(())
    })
    .await;

    // Not ready for as long as the stores cannot list.
    support::eventually(
        "a forbidden watch in the logs",
        Duration::from_secs(30),
        || async { operator.logs().contains("forbidden").then_some(()) },
    )
    .await;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(operator.health("/readyz").await, Some(503));
        assert_eq!(operator.health("/healthz").await, Some(200));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Grant the rules: the watches recover and the operator becomes ready,
    // and then it reconciles.
    identity.bind_in(&watched.name, &home.name);
    support::apply_quickstart(&watched.name, None);
    support::eventually("/readyz to turn 200", Duration::from_secs(90), || async {
        (operator.health("/readyz").await == Some(200)).then_some(())
    })
    .await;
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), &watched.name);
    support::eventually("the server's status", Duration::from_secs(60), || async {
        servers.get("haltsql").await.ok()?.status.map(|_| ())
    })
    .await;
}
