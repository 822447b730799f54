//! Static checks of the install manifests: the kustomize install
//! (`make install-manifests`) and the Helm chart render what the guide asks
//! for, and both carry exactly the RBAC rules and CRDs generated from the code.
//!
//! Needs `bin/kubectl` and `bin/helm` (`make tools`), not a cluster.

use crate::support;

use std::path::PathBuf;
use std::process::Command;

use haltsql_operator::manifests::{self, rbac};
use serde::Deserialize;
use serde_json::{Value, json};

fn tool(name: &str) -> PathBuf {
    let path = support::repo_root().join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: build the tools with `make tools`",
        path.display()
    );
    path
}

/// Parses a multi-document YAML stream into JSON values (empty documents
/// dropped).
fn documents(yaml: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        match Value::deserialize(doc) {
            Ok(Value::Null) => {}
            Ok(value) => docs.push(value),
            Err(err) => panic!("bad YAML: {err}\n{yaml}"),
        }
    }
    docs
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    match docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    {
        Some(doc) => doc,
        None => panic!("no {kind} {name} in the rendered manifests"),
    }
}

fn install_manifests(img: &str) -> Vec<Value> {
    let out = support::run_ok(
        Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(support::repo_root())
            .arg("install-manifests")
            .arg(format!("IMG={img}")),
    );
    documents(&out)
}

fn helm_template(args: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new(tool("helm"))
        .args(["template", "op"])
        .arg(support::repo_root().join("charts/haltsql-operator"))
        .args(["--namespace", "haltsql-system"])
        .args(args)
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(documents(&String::from_utf8_lossy(&o.stdout))),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
        Err(err) => panic!("cannot run helm: {err}"),
    }
}

fn generated_rules(rules: &[rbac::Rule]) -> Value {
    match serde_json::to_value(rbac::policy_rules(rules)) {
        Ok(v) => v,
        Err(err) => panic!("rules: {err}"),
    }
}

/// Integral floats as integers: the CRD types hold `minimum`/`maximum` as
/// f64 (`86400.0`), which kustomize re-serializes as `86400`.
fn normalize(value: Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, normalize(v))).collect())
        }
        other => other,
    }
}

fn generated_crd_specs() -> Vec<(String, Value)> {
    manifests::crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            match serde_json::to_value(&crd.spec) {
                Ok(spec) => (name, normalize(spec)),
                Err(err) => panic!("crd: {err}"),
            }
        })
        .collect()
}

/// The restricted Pod Security level, as the manager pods must meet it.
fn assert_hardened_manager(deploy: &Value) {
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], json!(true));
    assert_eq!(pod["securityContext"]["runAsUser"], json!(65532));
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        json!("RuntimeDefault")
    );
    let containers = pod["containers"].as_array().cloned().unwrap_or_default();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["name"], json!("manager"));
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], json!(true));
    assert_eq!(sc["allowPrivilegeEscalation"], json!(false));
    assert_eq!(sc["runAsUser"], json!(65532));
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], json!("RuntimeDefault"));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], json!("/healthz"));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], json!("/readyz"));
    // The validator needs a writable temporary directory.
    assert_eq!(c["volumeMounts"][0]["mountPath"], json!("/tmp"));
    assert!(
        c["args"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("--health-probe-bind-address=:8081"))),
        "{c}"
    );
}

#[test]
fn kustomize_install_matches_the_guide() {
    tool("kubectl");
    let docs = install_manifests("example.com/op:1");

    let ns = find(&docs, "Namespace", "haltsql-system");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        json!("restricted")
    );

    let deploy = find(&docs, "Deployment", "haltsql-operator-controller-manager");
    assert_eq!(deploy["metadata"]["namespace"], json!("haltsql-system"));
    assert_eq!(deploy["spec"]["replicas"], json!(1));
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], json!("example.com/op:1"));
    assert!(
        c["args"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("--leader-elect")))
    );
    assert_hardened_manager(deploy);
    let sa = deploy["spec"]["template"]["spec"]["serviceAccountName"].clone();
    assert_eq!(sa, json!("haltsql-operator-controller-manager"));

    // Every namespaced object lives in haltsql-system.
    for doc in &docs {
        if let Some(namespace) = doc["metadata"]["namespace"].as_str() {
            assert_eq!(namespace, "haltsql-system", "{}", doc["metadata"]["name"]);
        }
    }

    // RBAC: exactly the generated rules, bound to the operator's account.
    let role = find(&docs, "ClusterRole", rbac::MANAGER_ROLE_NAME);
    assert_eq!(role["rules"], generated_rules(rbac::MANAGER_RULES));
    let binding = find(
        &docs,
        "ClusterRoleBinding",
        "haltsql-operator-manager-rolebinding",
    );
    assert_eq!(binding["roleRef"]["name"], json!(rbac::MANAGER_ROLE_NAME));
    assert_eq!(binding["subjects"][0]["name"], sa);
    assert_eq!(binding["subjects"][0]["namespace"], json!("haltsql-system"));
    let le = find(&docs, "Role", rbac::LEADER_ELECTION_ROLE_NAME);
    assert_eq!(le["metadata"]["namespace"], json!("haltsql-system"));
    assert_eq!(le["rules"], generated_rules(rbac::LEADER_ELECTION_RULES));
    let le_binding = find(
        &docs,
        "RoleBinding",
        "haltsql-operator-leader-election-rolebinding",
    );
    assert_eq!(le_binding["subjects"][0]["name"], sa);

    let editor = find(&docs, "ClusterRole", "haltsql-editor-role");
    let labels = &editor["metadata"]["labels"];
    assert_eq!(
        labels["rbac.authorization.k8s.io/aggregate-to-admin"],
        json!("true")
    );
    assert_eq!(
        labels["rbac.authorization.k8s.io/aggregate-to-edit"],
        json!("true")
    );
    let viewer = find(&docs, "ClusterRole", "haltsql-viewer-role");
    assert_eq!(
        viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        json!("true")
    );

    // No Secret or Pod access and nothing cluster-scoped anywhere in the
    // operator's roles.
    for role in [role, le] {
        let text = role["rules"].to_string();
        for forbidden in ["secrets", "\"pods\"", "namespaces", "nodes", "\"*\""] {
            assert!(!text.contains(forbidden), "{forbidden} in {text}");
        }
    }

    // CRDs: exactly the generated ones.
    for (name, spec) in generated_crd_specs() {
        assert_eq!(
            normalize(find(&docs, "CustomResourceDefinition", &name)["spec"].clone()),
            spec
        );
    }

    assert!(docs.iter().any(|d| d["kind"] == "Service"
        && d["metadata"]["name"] == "haltsql-operator-controller-manager-metrics-service"));
}

#[test]
fn install_manifests_takes_any_image_reference() {
    tool("kubectl");
    for img in [
        "registry.example:5000/team/haltsql-operator:0.0.1",
        "registry.example/haltsql-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        let docs = install_manifests(img);
        let deploy = find(&docs, "Deployment", "haltsql-operator-controller-manager");
        assert_eq!(
            deploy["spec"]["template"]["spec"]["containers"][0]["image"],
            json!(img)
        );
    }
}

#[test]
fn samples_render_with_kustomize() {
    let out = support::run_ok(
        Command::new(tool("kubectl"))
            .arg("kustomize")
            .arg(support::repo_root().join("config/samples")),
    );
    let docs = documents(&out);
    let mut kinds: Vec<_> = docs
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "HaltSQLPolicy/orders",
            "HaltSQLPolicy/prod-bundle",
            "HaltSQLServer/haltsql"
        ]
    );
    for doc in &docs {
        assert_eq!(doc["metadata"]["namespace"], json!("agents"));
    }
}

#[test]
fn helm_lint_is_clean() {
    let out = Command::new(tool("helm"))
        .args(["lint", "--strict"])
        .arg(support::repo_root().join("charts/haltsql-operator"))
        .output();
    let out = match out {
        Ok(o) => o,
        Err(err) => panic!("cannot run helm: {err}"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 chart(s) failed"), "{text}");
    assert!(
        !text.contains("[WARNING]") && !text.contains("[ERROR]"),
        "{text}"
    );
}

#[test]
fn helm_chart_matches_the_generated_manifests() {
    tool("helm");
    let docs = match helm_template(&[]) {
        Ok(docs) => docs,
        Err(err) => panic!("helm template: {err}"),
    };
    let role = find(&docs, "ClusterRole", "op-haltsql-operator-manager-role");
    assert_eq!(role["rules"], generated_rules(rbac::MANAGER_RULES));
    let le = find(&docs, "Role", "op-haltsql-operator-leader-election-role");
    assert_eq!(le["rules"], generated_rules(rbac::LEADER_ELECTION_RULES));
    assert_eq!(
        find(&docs, "ClusterRole", "haltsql-editor-role")["rules"],
        generated_rules(rbac::EDITOR_RULES)
    );
    assert_eq!(
        find(&docs, "ClusterRole", "haltsql-viewer-role")["rules"],
        generated_rules(rbac::VIEWER_RULES)
    );
    for (name, spec) in generated_crd_specs() {
        let crd = find(&docs, "CustomResourceDefinition", &name);
        assert_eq!(normalize(crd["spec"].clone()), spec);
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            json!("keep")
        );
    }
    find(
        &docs,
        "ClusterRoleBinding",
        "op-haltsql-operator-manager-rolebinding",
    );
    let deploy = find(&docs, "Deployment", "op-haltsql-operator");
    assert_eq!(deploy["spec"]["replicas"], json!(1));
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], json!("ghcr.io/haltsql/haltsql-operator:0.0.1"));
    assert!(
        c["args"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("--leader-elect")))
    );
    assert_hardened_manager(deploy);
    let svc = find(&docs, "Service", "op-haltsql-operator-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], json!(8080));
}

#[test]
fn helm_values_switch_what_they_should() {
    tool("helm");
    let docs = match helm_template(&[
        "--set",
        "crds.install=false",
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "leaderElection.enabled=false",
        "--set",
        "metrics.enabled=false",
        "--set",
        "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ]) {
        Ok(docs) => docs,
        Err(err) => panic!("helm template: {err}"),
    };
    assert!(!docs.iter().any(|d| d["kind"] == "CustomResourceDefinition"));
    assert!(!docs.iter().any(|d| d["kind"] == "ClusterRoleBinding"));
    assert!(!docs.iter().any(|d| d["kind"] == "Role"));
    assert!(!docs.iter().any(|d| d["kind"] == "Service"));
    let bindings: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding")
        .map(|d| d["metadata"]["namespace"].clone())
        .collect();
    assert_eq!(bindings, [json!("team-a"), json!("team-b")]);
    let deploy = find(&docs, "Deployment", "op-haltsql-operator");
    let c = &deploy["spec"]["template"]["spec"]["containers"][0];
    assert!(c["image"].as_str().is_some_and(|i| {
        i.ends_with("@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    }));
    let args = c["args"].as_array().cloned().unwrap_or_default();
    assert!(args.contains(&json!("--watch-namespaces=team-a,team-b")));
    assert!(args.contains(&json!("--metrics-bind-address=0")));
    assert!(!args.contains(&json!("--leader-elect")));

    let docs = match helm_template(&["--set", "crds.keep=false"]) {
        Ok(docs) => docs,
        Err(err) => panic!("helm template: {err}"),
    };
    for (name, _) in generated_crd_specs() {
        let crd = find(&docs, "CustomResourceDefinition", &name);
        assert!(crd["metadata"].get("annotations").is_none(), "{crd}");
    }
}

#[test]
fn helm_values_schema_is_closed() {
    tool("helm");
    for (set, want) in [
        ("unknownKey=1", "additional properties"),
        ("image.unknown=1", "additional properties"),
        ("crds.unknown=true", "additional properties"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("replicaCount=-1", "replicaCount"),
    ] {
        match helm_template(&["--set", set]) {
            Ok(_) => panic!("--set {set} was accepted"),
            Err(err) => assert!(err.contains(want), "--set {set}: {err}"),
        }
    }
    match helm_template(&[
        "--set",
        "replicaCount=2",
        "--set",
        "leaderElection.enabled=false",
    ]) {
        Ok(_) => panic!("two replicas without leader election were accepted"),
        Err(err) => assert!(err.contains("leaderElection"), "{err}"),
    }
}
