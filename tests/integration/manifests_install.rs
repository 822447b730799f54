//! The install manifests against the real API server: the kustomize install
//! applies with no error and no warning, the operator's ServiceAccount cannot
//! read Secrets but can patch Deployments anywhere, and the Helm chart applies
//! (server-side dry run).
//!
//! Needs the local cluster (`make cluster-up`); fails when it is absent.

use crate::support;

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::TestNamespace;

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
    let out = support::Cluster::Full
        .kubectl()
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
    let _client = support::Cluster::Full.client().await;
    let manifests = support::run_ok(
        Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(support::repo_root())
            .arg("install-manifests")
            .arg("IMG=example.com/op:1"),
    );
    let (ok, stdout, stderr) = run_with_stdin(
        support::Cluster::Full
            .kubectl()
            .args(["apply", "--server-side", "-f", "-"]),
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
    let edit = support::Cluster::Full.kubectl_ok(&["get", "clusterrole", "edit", "-o", "json"]);
    let view = support::Cluster::Full.kubectl_ok(&["get", "clusterrole", "view", "-o", "json"]);
    let mut aggregated = false;
    for _ in 0..50 {
        let edit = support::Cluster::Full.kubectl_ok(&["get", "clusterrole", "edit", "-o", "json"]);
        let view = support::Cluster::Full.kubectl_ok(&["get", "clusterrole", "view", "-o", "json"]);
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
    let client = support::Cluster::Full.client().await;
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
        support::Cluster::Full.kubectl().args([
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            "-",
        ]),
        rendered.as_bytes(),
    );
    assert!(ok, "helm template does not apply:\n{stdout}{stderr}");
    assert!(
        stdout.contains("deployment.apps/dry-haltsql-operator serverside-applied (server dry run)"),
        "{stdout}"
    );
    assert!(stderr.trim().is_empty(), "warnings:\n{stderr}");
}

/// A folder of links to the few programs the `install-manifests` recipe
/// needs besides kubectl, to run make with a PATH that has exactly these
/// (and kubectl only when `kubectl` is given).
fn minimal_path(dir: &std::path::Path, kubectl: Option<&std::path::Path>) -> std::path::PathBuf {
    let path = dir.join("path");
    std::fs::create_dir_all(&path).expect("path dir");
    for tool in ["bash", "mkdir", "mktemp", "rm", "cat", "make"] {
        let found = ["/usr/bin", "/bin", "/usr/local/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} not found"));
        std::os::unix::fs::symlink(found, path.join(tool)).expect("link");
    }
    if let Some(kubectl) = kubectl {
        std::os::unix::fs::symlink(kubectl, path.join("kubectl")).expect("link kubectl");
    }
    path
}

/// `make -s install-manifests` with `PATH=path` and no bin/kubectl
/// (`BIN` points at an empty folder).
fn install_manifests_with_path(
    dir: &std::path::Path,
    path: &std::path::Path,
) -> std::process::Output {
    let empty_bin = dir.join("empty-bin");
    std::fs::create_dir_all(&empty_bin).expect("empty bin");
    Command::new(path.join("make"))
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir)
        .arg("-s")
        .arg("-C")
        .arg(support::repo_root())
        .arg("install-manifests")
        .arg("IMG=example.com/op:1")
        .arg(format!("BIN={}", empty_bin.display()))
        .output()
        .expect("run make")
}

#[test]
fn install_manifests_uses_kubectl_from_path() {
    let built = support::repo_root().join("bin/kubectl");
    assert!(
        built.exists(),
        "{} is missing: `make tools`",
        built.display()
    );
    let with_bin = support::run_ok(
        Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(support::repo_root())
            .arg("install-manifests")
            .arg("IMG=example.com/op:1"),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let path = minimal_path(dir.path(), Some(&built));
    let out = install_manifests_with_path(dir.path(), &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout, with_bin,
        "kubectl on PATH prints the same manifests"
    );
    assert!(stdout.contains("kind: CustomResourceDefinition"));
    assert!(stdout.contains("image: example.com/op:1"));
}

#[test]
fn install_manifests_without_kubectl_fails_with_a_message_and_prints_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = minimal_path(dir.path(), None);
    let out = install_manifests_with_path(dir.path(), &path);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("make install-manifests: kubectl not found"),
        "{stderr}"
    );
}

#[test]
fn install_manifests_prints_nothing_when_kubectl_fails_midway() {
    // A kubectl that writes half a stream and then fails (as on a broken
    // kustomization): nothing of it may reach `kubectl apply -f -`.
    let dir = tempfile::tempdir().expect("temp dir");
    let broken = dir.path().join("broken-kubectl");
    std::fs::write(
        &broken,
        "#!/bin/bash\nprintf 'apiVersion: v1\\nkind: Namespace\\n'\necho 'error: broken' >&2\nexit 1\n",
    )
    .expect("write");
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = minimal_path(dir.path(), Some(&broken));
    let out = install_manifests_with_path(dir.path(), &path);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("kustomize failed; nothing printed"),
        "{stderr}"
    );
}

/// `(kind, name)` of every object in `helm get manifest`.
fn manifest_objects(manifest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(manifest) {
        let value = match <serde_yaml::Value as serde::Deserialize>::deserialize(doc) {
            Ok(v) => v,
            Err(e) => panic!("helm get manifest is not YAML: {e}"),
        };
        let kind = value.get("kind").and_then(|k| k.as_str());
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str());
        if let (Some(kind), Some(name)) = (kind, name) {
            out.push((kind.to_owned(), name.to_owned()));
        }
    }
    out
}

#[tokio::test]
async fn helm_install_runs_the_operator_and_uninstall_leaves_only_the_crds() {
    let client = support::Cluster::Full.client().await;
    let ns = TestNamespace::new(&client, "helm-install").await;
    let helm = support::repo_root().join("bin/helm");
    assert!(helm.exists(), "{} is missing: `make tools`", helm.display());
    let kubeconfig = support::Cluster::Full.kubeconfig();
    let release = format!("hi{}", std::process::id());
    let helm_cmd = |args: &[&str]| {
        let mut c = Command::new(&helm);
        c.arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--namespace", &ns.name])
            .args(args);
        c
    };
    // The CRDs may already be in the cluster (other tests apply them):
    // the release takes them over. The aggregated roles are cluster-wide
    // and shared with the kustomize install, so this release leaves them be.
    support::run_ok(&mut helm_cmd(&[
        "install",
        &release,
        &support::repo_root()
            .join("charts/haltsql-operator")
            .display()
            .to_string(),
        "--take-ownership",
        "--set",
        "rbac.aggregatedRoles=false",
        "--set",
        &format!("watchNamespaces={{{}}}", ns.name),
    ]));
    let full = format!("{release}-haltsql-operator");
    let objects = manifest_objects(&support::run_ok(&mut helm_cmd(&[
        "get", "manifest", &release,
    ])));
    let has = |kind: &str, name: &str| objects.iter().any(|(k, n)| k == kind && n == name);
    for (kind, name) in [
        ("Deployment", full.clone()),
        ("ServiceAccount", full.clone()),
        ("Service", format!("{full}-metrics")),
        ("ClusterRole", format!("{full}-manager-role")),
        ("RoleBinding", format!("{full}-manager-rolebinding")),
        ("Role", format!("{full}-leader-election-role")),
        ("RoleBinding", format!("{full}-leader-election-rolebinding")),
        (
            "CustomResourceDefinition",
            "haltsqlpolicies.haltsql.dev".into(),
        ),
        (
            "CustomResourceDefinition",
            "haltsqlservers.haltsql.dev".into(),
        ),
    ] {
        assert!(
            has(kind, &name),
            "{kind} {name} not in the release: {objects:#?}"
        );
    }
    // Every object exists in the cluster.
    for (kind, name) in &objects {
        support::run_ok(
            support::Cluster::Full
                .kubectl()
                .args(["-n", &ns.name, "get", kind, name, "-o", "name"]),
        );
    }
    // The operator's pod is scheduled (on the kwok node: no real container
    // runs here) with the arguments the values ask for.
    let pod_args = support::eventually(
        "the operator pod",
        std::time::Duration::from_secs(60),
        || async {
            let out = support::Cluster::Full
                .kubectl()
                .args(["-n", &ns.name, "get", "pods", "-l"])
                .arg(format!("app.kubernetes.io/instance={release}"))
                .args([
                    "-o",
                    "jsonpath={.items[0].spec.nodeName} {.items[0].spec.containers[0].args}",
                ])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success() && text.starts_with("kwok-node-0 ")).then_some(text)
        },
    )
    .await;
    assert!(
        pod_args.contains(&format!("--watch-namespaces={}", ns.name)),
        "{pod_args}"
    );
    assert!(pod_args.contains("--leader-elect"), "{pod_args}");

    support::run_ok(&mut helm_cmd(&["uninstall", &release, "--wait"]));
    for (kind, name) in &objects {
        let left = support::Cluster::Full.kubectl_ok(&[
            "-n",
            &ns.name,
            "get",
            kind,
            name,
            "--ignore-not-found",
            "-o",
            "name",
        ]);
        if kind == "CustomResourceDefinition" {
            assert!(
                !left.trim().is_empty(),
                "the CRD {name} was removed (crds.keep)"
            );
        } else {
            assert!(
                left.trim().is_empty(),
                "{kind} {name} is left after uninstall"
            );
        }
    }
    support::eventually(
        "the operator pod gone",
        std::time::Duration::from_secs(60),
        || async {
            let out = support::Cluster::Full
                .kubectl()
                .args(["-n", &ns.name, "get", "pods", "-o", "name", "-l"])
                .arg(format!("app.kubernetes.io/instance={release}"))
                .output()
                .ok()?;
            (out.status.success() && out.stdout.is_empty()).then_some(())
        },
    )
    .await;
    let releases = support::run_ok(&mut helm_cmd(&["list", "-q"]));
    assert!(releases.trim().is_empty(), "{releases}");
}
