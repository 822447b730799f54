//! The install manifests against the real API server: the kustomize install
//! applies with no error and no warning, the operator's ServiceAccount cannot
//! read Secrets but can patch Deployments anywhere, and the Helm chart applies
//! (server-side dry run).
//!
//! Needs the local cluster (`make cluster-up`); fails when it is absent.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use support::TestNamespace;

const OPERATOR_SA: &str =
    "system:serviceaccount:haltsql-system:haltsql-operator-controller-manager";

/// Runs `cmd` with `input` on stdin; returns (success, stdout, stderr).
fn run_with_stdin(cmd: &mut Command, input: &[u8]) -> (bool, String, String) {
    let mut child = match cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => panic!("cannot run {cmd:?}: {err}"),
    };
    if let Some(mut stdin) = child.stdin.take()
        && let Err(err) = stdin.write_all(input)
    {
        panic!("write to {cmd:?}: {err}");
    }
    let out = match child.wait_with_output() {
        Ok(out) => out,
        Err(err) => panic!("wait for {cmd:?}: {err}"),
    };
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl auth can-i ... --as=<operator SA>`: true for "yes".
fn operator_can(args: &[&str]) -> bool {
    let out = support::kubectl()
        .args(["auth", "can-i"])
        .args(args)
        .arg(format!("--as={OPERATOR_SA}"))
        .output();
    match out {
        Ok(o) => {
            let answer = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            assert!(
                answer == "yes" || answer == "no",
                "can-i {args:?}: {answer} {}",
                String::from_utf8_lossy(&o.stderr)
            );
            answer == "yes"
        }
        Err(err) => panic!("kubectl auth can-i: {err}"),
    }
}

#[tokio::test]
async fn kustomize_install_applies_cleanly_and_rbac_is_tight() {
    // Fails with a hint when the cluster is absent.
    let _client = support::client().await;
    let manifests = support::run_ok(
        Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(support::repo_root())
            .arg("install-manifests")
            .arg("IMG=example.com/op:1"),
    );
    let (ok, stdout, stderr) = run_with_stdin(
        support::kubectl().args(["apply", "--server-side", "-f", "-"]),
        manifests.as_bytes(),
    );
    assert!(ok, "apply failed:\n{stdout}{stderr}");
    assert!(
        stderr.trim().is_empty(),
        "apply printed warnings or errors:\n{stderr}"
    );
    for object in [
        "namespace/haltsql-system",
        "customresourcedefinition.apiextensions.k8s.io/haltsqlpolicies.haltsql.dev",
        "customresourcedefinition.apiextensions.k8s.io/haltsqlservers.haltsql.dev",
        "clusterrole.rbac.authorization.k8s.io/haltsql-operator-manager-role",
        "deployment.apps/haltsql-operator-controller-manager",
    ] {
        assert!(stdout.contains(object), "{object} not applied:\n{stdout}");
    }

    // No Secrets, no Pods, nothing cluster-scoped.
    assert!(!operator_can(&["get", "secrets"]));
    assert!(!operator_can(&["get", "secrets", "-n", "haltsql-system"]));
    assert!(!operator_can(&["list", "secrets", "--all-namespaces"]));
    assert!(!operator_can(&["list", "pods", "--all-namespaces"]));
    assert!(!operator_can(&["list", "namespaces"]));
    assert!(!operator_can(&["list", "nodes"]));
    assert!(!operator_can(&["create", "clusterroles"]));
    assert!(!operator_can(&[
        "update",
        "customresourcedefinitions.apiextensions.k8s.io"
    ]));
    assert!(!operator_can(&[
        "update",
        "haltsqlservers.haltsql.dev",
        "-n",
        "agents"
    ]));
    // What it needs, in any namespace.
    assert!(operator_can(&["patch", "deployments", "--all-namespaces"]));
    assert!(operator_can(&["patch", "deployments", "-n", "agents"]));
    for resource in [
        "configmaps",
        "services",
        "poddisruptionbudgets.policy",
        "networkpolicies.networking.k8s.io",
    ] {
        for verb in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            assert!(
                operator_can(&[verb, resource, "-n", "agents"]),
                "{verb} {resource}"
            );
        }
    }
    for verb in ["get", "list", "watch"] {
        assert!(operator_can(&[verb, "haltsqlservers.haltsql.dev", "-A"]));
        assert!(operator_can(&[verb, "haltsqlpolicies.haltsql.dev", "-A"]));
    }
    assert!(operator_can(&[
        "patch",
        "haltsqlpolicies.haltsql.dev",
        "--subresource=status",
        "-n",
        "agents"
    ]));
    assert!(operator_can(&[
        "update",
        "haltsqlservers.haltsql.dev",
        "--subresource=finalizers",
        "-n",
        "agents"
    ]));
    assert!(operator_can(&["create", "events", "-n", "agents"]));
    // Leader election only in its own namespace.
    assert!(operator_can(&[
        "update",
        "leases.coordination.k8s.io",
        "-n",
        "haltsql-system"
    ]));
    assert!(!operator_can(&[
        "update",
        "leases.coordination.k8s.io",
        "-n",
        "agents"
    ]));

    // The aggregated roles reach the built-in ones.
    let edit =
        support::run_ok(support::kubectl().args(["get", "clusterrole", "edit", "-o", "json"]));
    let view =
        support::run_ok(support::kubectl().args(["get", "clusterrole", "view", "-o", "json"]));
    let mut aggregated = false;
    for _ in 0..50 {
        let edit =
            support::run_ok(support::kubectl().args(["get", "clusterrole", "edit", "-o", "json"]));
        let view =
            support::run_ok(support::kubectl().args(["get", "clusterrole", "view", "-o", "json"]));
        if edit.contains("haltsqlservers") && view.contains("haltsqlpolicies") {
            aggregated = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        aggregated,
        "edit/view do not aggregate the haltsql roles:\n{edit}\n{view}"
    );
}

#[tokio::test]
async fn helm_template_applies_with_server_dry_run() {
    let client = support::client().await;
    let ns = TestNamespace::new(&client, "helm-dry-run").await;
    let helm = support::repo_root().join("bin/helm");
    assert!(helm.exists(), "{} is missing: `make tools`", helm.display());
    let rendered = support::run_ok(
        Command::new(&helm)
            .args(["template", "dry"])
            .arg(support::repo_root().join("charts/haltsql-operator"))
            .args(["--namespace", &ns.name]),
    );
    let (ok, stdout, stderr) = run_with_stdin(
        support::kubectl().args(["apply", "--server-side", "--dry-run=server", "-f", "-"]),
        rendered.as_bytes(),
    );
    assert!(ok, "helm template does not apply:\n{stdout}{stderr}");
    assert!(
        stdout.contains("deployment.apps/dry-haltsql-operator serverside-applied (server dry run)"),
        "{stdout}"
    );
    assert!(stderr.trim().is_empty(), "warnings:\n{stderr}");
}
