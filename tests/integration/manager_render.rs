//! `haltsql-operator render`: offline output for the guide's quick start
//! that the API server accepts (`kubectl apply --dry-run=server`), and
//! failures where the operator would refuse to render.

use crate::support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::support::TestNamespace;
use haltsql_testkit::fixtures;
use serde::Deserialize;

/// Runs `render` offline: the kubeconfig points nowhere.
fn render(files: &[&Path]) -> Output {
    let mut cmd = Command::new(support::operator_bin());
    cmd.arg("render")
        .arg(format!(
            "--haltsql-binary={}",
            support::haltsql_bin().display()
        ))
        .env_clear()
        .env("KUBECONFIG", "/nonexistent/kubeconfig");
    for file in files {
        cmd.arg("-f").arg(file);
    }
    cmd.output().expect("the operator binary runs")
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn render_output_for_the_quick_start_applies_with_server_dry_run() {
    let client = support::client_with_crds().await;
    let ns = TestNamespace::new(&client, "mgr-render").await;
    let dir = tempfile::tempdir().unwrap();
    // As in the guide: the Secret, the policy and the server, in two files.
    let policy = write(
        dir.path(),
        "policy.yaml",
        &fixtures::to_yaml(&[
            fixtures::in_namespace(fixtures::token_secret("x"), &ns.name),
            fixtures::in_namespace(fixtures::quick_start_policy(), &ns.name),
        ]),
    );
    let server = write(
        dir.path(),
        "server.yaml",
        &fixtures::yaml_in(fixtures::quick_start_server(), Some(&ns.name)),
    );
    let out = render(&[&server, &policy]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "render failed: {stderr}");
    let yaml = String::from_utf8(out.stdout).unwrap();

    let mut kinds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&yaml) {
        let value = serde_yaml::Value::deserialize(document).unwrap();
        if value.is_null() {
            continue;
        }
        assert_eq!(
            value["metadata"]["namespace"].as_str(),
            Some(ns.name.as_str())
        );
        kinds.push(value["kind"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy"
        ]
    );
    assert!(
        !yaml.contains("kind: Secret"),
        "render must skip the Secret"
    );

    let mut apply = support::Cluster::Full
        .kubectl()
        .args(["apply", "--dry-run=server", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let applied = apply.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&applied.stdout);
    assert!(
        applied.status.success(),
        "the API server refused the rendered objects:\n{}\n{yaml}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(stdout.matches("(server dry run)").count(), 5, "{stdout}");
    // A dry run: nothing was created.
    let config_map = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("name: haltsql-haltsql-config-"))
        .map(|hash| format!("haltsql-haltsql-config-{hash}"))
        .expect("the rendered ConfigMap's name");
    let get = support::Cluster::Full
        .kubectl()
        .args(["-n", &ns.name, "get", "configmap", &config_map])
        .output()
        .unwrap();
    assert!(!get.status.success());
    assert!(
        String::from_utf8_lossy(&get.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
}

#[test]
fn render_fails_with_located_errors_for_an_invalid_policy() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write(
        dir.path(),
        "policy.yaml",
        &fixtures::yaml_in(fixtures::quick_start_policy(), Some("agents"))
            .replace("require_limit:", "require_limits:"),
    );
    let server = write(
        dir.path(),
        "server.yaml",
        &fixtures::yaml_in(fixtures::quick_start_server(), Some("agents")),
    );
    let out = render(&[&server, &policy]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing is printed on failure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("HaltSQLPolicy agents/orders is not valid (ValidationFailed)")
            && stderr.contains("require_limits"),
        "{stderr}"
    );
}

#[test]
fn render_fails_when_a_referenced_policy_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let server = write(
        dir.path(),
        "server.yaml",
        &fixtures::yaml_in(fixtures::quick_start_server(), Some("agents")),
    );
    let out = render(&[&server]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("HaltSQLServer agents/haltsql: PolicyNotFound"),
        "{stderr}"
    );
    // A policy of the same name in another namespace does not count.
    let policy = write(
        dir.path(),
        "policy.yaml",
        &fixtures::yaml_in(fixtures::quick_start_policy(), Some("elsewhere")),
    );
    let out = render(&[&server, &policy]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn render_reads_standard_input_and_defaults_the_namespace() {
    let mut child = Command::new(support::operator_bin())
        .args(["render", "-n", "team-a", "-f", "-"])
        .arg(format!(
            "--haltsql-binary={}",
            support::haltsql_bin().display()
        ))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = fixtures::quick_start_yaml(None, None);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert_eq!(yaml.matches("namespace: team-a").count(), 5, "{yaml}");
}
