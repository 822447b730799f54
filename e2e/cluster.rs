//! Cluster access for the scenario: a kube client and `kubectl`, both with the
//! admin kubeconfig of the provider, plus small readers for the custom resources.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use haltsql_testkit::cluster::{apply_stdin, run_ok};
use haltsql_testkit::paths::repo_root;

/// The admin view of the cluster under test.
#[derive(Clone)]
pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub client: Client,
}

impl Cluster {
    pub async fn connect(kubeconfig: &Path) -> Self {
        let client = haltsql_testkit::cluster::connect(kubeconfig).await;
        Cluster {
            kubeconfig: kubeconfig.to_owned(),
            client,
        }
    }

    /// `bin/kubectl` (or `kubectl` from PATH when `bin/` has none) with this kubeconfig.
    pub fn kubectl(&self) -> Command {
        let local = repo_root().join("bin/kubectl");
        let mut cmd = if local.exists() {
            Command::new(local)
        } else {
            Command::new("kubectl")
        };
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// Runs kubectl; panics with its output unless it succeeds.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        run_ok(self.kubectl().args(args))
    }

    /// Runs kubectl and returns (success, stdout, stderr) without judging.
    pub fn kubectl_try(&self, args: &[&str]) -> (bool, String, String) {
        let out = self
            .kubectl()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run kubectl {args:?}: {e}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `kubectl apply --server-side -f -` with `manifest` on stdin.
    pub fn apply(&self, namespace: Option<&str>, manifest: &str) -> String {
        let mut cmd = self.kubectl();
        if let Some(ns) = namespace {
            cmd.args(["-n", ns]);
        }
        apply_stdin(cmd, manifest)
    }

    /// `kubectl wait --for=condition=COND KIND/NAME`.
    pub fn wait_condition(&self, ns: &str, object: &str, condition: &str, timeout: Duration) {
        let (ok, out, err) = self.kubectl_try(&[
            "-n",
            ns,
            "wait",
            &format!("--for=condition={condition}"),
            &format!("--timeout={}s", timeout.as_secs()),
            object,
        ]);
        if !ok {
            let (_, yaml, _) = self.kubectl_try(&["-n", ns, "get", object, "-o", "yaml"]);
            panic!("kubectl wait for {condition} on {object} failed: {out}{err}\n{yaml}");
        }
    }

    pub fn policies(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            ns,
            &resource("HaltSQLPolicy", "haltsqlpolicies"),
        )
    }

    pub fn servers(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            ns,
            &resource("HaltSQLServer", "haltsqlservers"),
        )
    }
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("haltsql.dev", "v1alpha1", kind),
        plural,
    )
}

/// One condition of a custom resource's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub observed_generation: Option<i64>,
}

/// The condition `type_` of `obj`, if set.
pub fn condition(obj: &DynamicObject, type_: &str) -> Option<Cond> {
    let conds = obj.data.pointer("/status/conditions")?.as_array()?;
    let c = conds.iter().find(|c| c["type"] == type_)?;
    Some(Cond {
        status: c["status"].as_str().unwrap_or_default().to_owned(),
        reason: c["reason"].as_str().unwrap_or_default().to_owned(),
        message: c["message"].as_str().unwrap_or_default().to_owned(),
        observed_generation: c["observedGeneration"].as_i64(),
    })
}

/// True when `type_` is `True` and refers to the object's current generation
/// (a condition without observedGeneration counts when status.observedGeneration matches).
pub fn is_true_now(obj: &DynamicObject, type_: &str) -> bool {
    let Some(c) = condition(obj, type_) else {
        return false;
    };
    let generation = obj.metadata.generation;
    let observed = c
        .observed_generation
        .or_else(|| status_i64(obj, "observedGeneration"));
    c.status == "True" && observed == generation
}

pub fn status_str(obj: &DynamicObject, field: &str) -> Option<String> {
    obj.data
        .pointer(&format!("/status/{field}"))?
        .as_str()
        .map(str::to_owned)
}

pub fn status_i64(obj: &DynamicObject, field: &str) -> Option<i64> {
    obj.data.pointer(&format!("/status/{field}"))?.as_i64()
}

/// `status.appliedPolicies[name].contentHash` of a server.
pub fn applied_hash(server: &DynamicObject, policy: &str) -> Option<String> {
    server
        .data
        .pointer("/status/appliedPolicies")?
        .as_array()?
        .iter()
        .find(|p| p["name"] == policy)?
        .get("contentHash")?
        .as_str()
        .map(str::to_owned)
}

/// A short description of an object's conditions, for failure messages.
pub fn describe(obj: &DynamicObject) -> String {
    let status = obj.data.get("status").cloned().unwrap_or(Value::Null);
    format!(
        "{} (generation {:?}): {}",
        obj.metadata.name.as_deref().unwrap_or("?"),
        obj.metadata.generation,
        serde_json::to_string_pretty(&status).unwrap_or_default()
    )
}
