//! The HaltSQLPolicy controller against a real kube-apiserver and etcd
//! (envtest: no controller-manager), with the whole operator runtime running
//! in this process and the real `haltsql` of this workspace as validator (or
//! a wrapper script around it, to watch what the validator sees).

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{Cluster, Operator, TestNamespace, eventually};
use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use haltsql_operator::render::content_hash;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(30);

/// RFC 8032 test key 1, as PEM.
const PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n-----END PUBLIC KEY-----\n";

struct Fixture {
    ns: TestNamespace,
    operator: Operator,
    policies: Api<HaltSQLPolicy>,
    servers: Api<HaltSQLServer>,
    deployments: Api<Deployment>,
    secrets: Api<Secret>,
}

async fn fixture(
    prefix: &str,
    adjust: impl FnOnce(&mut haltsql_operator::controllers::context::Settings),
) -> Fixture {
    let (client, ns, operator) =
        support::in_process::start_in_new_namespace(Cluster::Envtest, prefix, adjust).await;
    Fixture {
        policies: Api::namespaced(client.clone(), &ns.name),
        servers: Api::namespaced(client.clone(), &ns.name),
        deployments: Api::namespaced(client.clone(), &ns.name),
        secrets: Api::namespaced(client.clone(), &ns.name),
        ns,
        operator,
    }
}

fn find(conditions: &[Condition], type_: &str) -> Option<Condition> {
    conditions.iter().find(|c| c.type_ == type_).cloned()
}

impl Fixture {
    async fn create_policy(&self, name: &str, document: &str) -> HaltSQLPolicy {
        self.policies
            .create(
                &PostParams::default(),
                &support::policy_object(name, document),
            )
            .await
            .expect("create policy")
    }

    /// Waits until the policy's `type_` condition has `status`/`reason` for
    /// the object's current generation, and returns the policy.
    async fn wait_for(&self, name: &str, type_: &str, status: &str, reason: &str) -> HaltSQLPolicy {
        let what = format!("policy {name}: {type_}={status}/{reason}");
        eventually(&what, WAIT, || async {
            let policy = self.policies.get(name).await.ok()?;
            let conditions = &policy.status.as_ref()?.conditions;
            let c = find(conditions, type_)?;
            (c.status == status
                && c.reason == reason
                && c.observed_generation == policy.metadata.generation)
                .then_some(policy)
        })
        .await
    }

    fn validator_runs(&self) -> u64 {
        ["valid", "invalid", "error"]
            .iter()
            .map(|o| {
                self.operator
                    .metrics
                    .validator_runs
                    .with_label_values(&[o])
                    .get()
            })
            .sum()
    }

    fn status_writes(&self) -> u64 {
        self.operator
            .metrics
            .api_writes
            .with_label_values(&["HaltSQLPolicy", "status"])
            .get()
    }

    fn policy_reconciles(&self) -> u64 {
        self.operator
            .metrics
            .reconciles
            .with_label_values(&["haltsqlpolicy", "success"])
            .get()
    }

    async fn complete_rollout(&self, name: &str) {
        support::in_process::complete_rollout(&self.deployments, name).await;
    }

    /// Waits until the server applied a new Deployment spec: playing the
    /// Deployment controller before that would complete the old one.
    async fn wait_for_new_deployment_spec(&self, name: &str, previous: Option<i64>) {
        eventually("the new Deployment spec", WAIT, || async {
            let generation = self.deployments.get(name).await.ok()?.metadata.generation;
            (generation > previous).then_some(())
        })
        .await;
    }

    async fn edit_policy(&self, name: &str, document: &str) {
        let patch = serde_json::json!({"spec": {"policy": document}});
        self.policies
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("edit policy");
    }
}

fn document(columns: &[&str]) -> String {
    support::quick_start_policy_document(columns)
}

/// A script in `dir` that runs `body`; replaced atomically (write + rename),
/// so a running validator never sees a half-written file.
fn install_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.new"));
    std::fs::write(&tmp, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&tmp, &path).expect("install script");
    path
}

#[tokio::test]
async fn valid_policy_is_validated_with_its_name_and_hash() {
    let f = fixture("pol-valid", |_| {}).await;
    let created = f
        .create_policy("orders", &document(&["id", "status"]))
        .await;
    let policy = f.wait_for("orders", "Valid", "True", "Validated").await;
    let status = policy.status.clone().expect("status");
    assert_eq!(status.policy_name.as_deref(), Some("orders-agent"));
    assert_eq!(status.content_hash, Some(content_hash(&created.spec)));
    assert_eq!(status.observed_generation, policy.metadata.generation);
    let synced = find(&status.conditions, "Synced").expect("Synced");
    assert_eq!(
        (synced.status.as_str(), synced.reason.as_str()),
        ("False", "NotReferenced")
    );
    f.operator.stop().await;
}

#[tokio::test]
async fn invalid_policy_reports_located_errors_then_recovers() {
    let f = fixture("pol-invalid", |_| {}).await;
    let bad = document(&["id"]).replace("columns:", "colums:");
    f.create_policy("orders", &bad).await;
    let policy = f
        .wait_for("orders", "Valid", "False", "ValidationFailed")
        .await;
    let status = policy.status.expect("status");
    let valid = find(&status.conditions, "Valid").expect("Valid");
    assert_eq!(
        valid.message,
        "policy.yaml:13:5: tables.app.orders.colums: unknown key, expected one of: columns"
    );
    assert_eq!(status.policy_name, None);
    let synced = find(&status.conditions, "Synced").expect("Synced");
    assert_eq!(synced.reason, "NotValid");

    // Unparseable YAML is the document's problem too: located, not InvalidSpec.
    f.edit_policy("orders", "tables: [\n").await;
    let policy = f
        .wait_for("orders", "Valid", "False", "ValidationFailed")
        .await;
    let valid = find(&policy.status.expect("status").conditions, "Valid").expect("Valid");
    assert!(
        valid
            .message
            .starts_with("policy.yaml:2:1: YAML syntax error"),
        "{}",
        valid.message
    );

    // Fixed: Valid flips (new transition time); Synced stays False, so its
    // transition time is kept although its reason changes.
    // (Transition times have whole seconds: let one pass first.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    f.edit_policy("orders", &document(&["id"])).await;
    let policy = f.wait_for("orders", "Valid", "True", "Validated").await;
    let conditions = policy.status.expect("status").conditions;
    let synced_after = find(&conditions, "Synced").expect("Synced");
    assert_eq!(synced_after.reason, "NotReferenced");
    assert_eq!(
        synced_after.last_transition_time,
        synced.last_transition_time
    );
    assert_ne!(
        find(&conditions, "Valid")
            .expect("Valid")
            .last_transition_time,
        valid.last_transition_time
    );
    f.operator.stop().await;
}

#[tokio::test]
async fn catalog_file_reference_is_invalid_spec_without_running_haltsql() {
    let f = fixture("pol-catalog", |_| {}).await;
    let text = document(&["id"]).replace(
        "dialect: postgres\n",
        "dialect: postgres\ncatalog: ./schema.json\n",
    );
    f.create_policy("orders", &text).await;
    let policy = f.wait_for("orders", "Valid", "False", "InvalidSpec").await;
    let valid = find(&policy.status.expect("status").conditions, "Valid").expect("Valid");
    assert!(
        valid.message.contains("\"./schema.json\""),
        "{}",
        valid.message
    );
    assert_eq!(f.validator_runs(), 0);
    f.operator.stop().await;
}

#[tokio::test]
async fn a_document_that_is_not_a_policy_starts_no_validator() {
    let f = fixture("pol-notpolicy", |_| {}).await;
    // A Config would make an unsealed validator resolve the placeholder.
    let config = "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\n  auth:\n    tokens: [{name: a, policy: p, sha256: '${file:/var/run/secrets/kubernetes.io/serviceaccount/token}'}]\npolicies: [{file: /etc/passwd}]\n";
    f.create_policy("config", config).await;
    f.create_policy("nokind", &document(&["id"]).replace("kind: Policy\n", ""))
        .await;
    let policy = f.wait_for("config", "Valid", "False", "NotAPolicy").await;
    let valid = find(&policy.status.expect("status").conditions, "Valid").expect("Valid");
    assert!(
        valid
            .message
            .starts_with("spec.policy must be a kind: Policy document, this one has kind: Config;"),
        "{}",
        valid.message
    );
    let policy = f.wait_for("nokind", "Valid", "False", "NotAPolicy").await;
    let valid = find(&policy.status.expect("status").conditions, "Valid").expect("Valid");
    assert!(
        valid.message.contains("this one has no kind"),
        "{}",
        valid.message
    );
    assert_eq!(f.validator_runs(), 0, "no validator ran");

    // Fixed into a Policy, it is validated as usual.
    let fixed = support::policy_object("config", &document(&["id"]));
    f.policies
        .patch(
            "config",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": fixed.spec})),
        )
        .await
        .expect("patch");
    f.wait_for("config", "Valid", "True", "Validated").await;
    assert_eq!(f.validator_runs(), 1);
    f.operator.stop().await;
}

#[tokio::test]
async fn missing_validator_is_validator_error_until_it_comes_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = dir.path().join("haltsql");
    let f = fixture("pol-missing", |s| s.haltsql_binary = binary.clone()).await;
    f.create_policy("orders", &document(&["id"])).await;
    let policy = f
        .wait_for("orders", "Valid", "Unknown", "ValidatorError")
        .await;
    let status = policy.status.expect("status");
    let valid = find(&status.conditions, "Valid").expect("Valid");
    assert!(
        valid.message.starts_with("cannot run "),
        "{}",
        valid.message
    );
    assert_eq!(
        find(&status.conditions, "Synced").expect("Synced").reason,
        "NotValid"
    );
    // Retried with backoff (1s, 2s, ...): more runs follow without any event.
    eventually("a retry", WAIT, || async {
        (f.validator_runs() >= 2).then_some(())
    })
    .await;

    std::os::unix::fs::symlink(support::haltsql_bin(), &binary).expect("symlink");
    let policy = f.wait_for("orders", "Valid", "True", "Validated").await;
    assert_eq!(
        policy.status.expect("status").policy_name.as_deref(),
        Some("orders-agent")
    );
    f.operator.stop().await;
}

#[tokio::test]
async fn hanging_validator_times_out_cleans_up_and_recovers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let record = dir.path().join("cwd");
    let script = install_script(
        dir.path(),
        "haltsql",
        &format!("/bin/pwd >> {}\nexec /bin/sleep 120", record.display()),
    );
    let f = fixture("pol-hang", |s| {
        s.haltsql_binary = script.clone();
        s.validator_timeout = Duration::from_secs(1);
    })
    .await;
    f.create_policy("orders", &document(&["id"])).await;
    let policy = f
        .wait_for("orders", "Valid", "Unknown", "ValidatorError")
        .await;
    let valid = find(&policy.status.expect("status").conditions, "Valid").expect("Valid");
    assert_eq!(valid.message, "haltsql validate did not finish within 1s");

    install_script(
        dir.path(),
        "haltsql",
        &format!(
            "/bin/pwd >> {}\nexec {} \"$@\"",
            record.display(),
            support::haltsql_bin().display()
        ),
    );
    f.wait_for("orders", "Valid", "True", "Validated").await;
    f.operator.stop().await;

    // Every run's private directory is gone: the timed-out ones and the good one.
    let dirs = std::fs::read_to_string(&record).expect("recorded directories");
    let dirs: Vec<&str> = dirs.lines().collect();
    assert!(dirs.len() >= 2, "{dirs:?}");
    for d in dirs {
        assert!(d.contains("haltsql-validate-"), "{d}");
        assert!(!Path::new(d).exists(), "{d} was left behind");
    }
}

#[tokio::test]
async fn bundle_source_credentials_never_reach_the_validator() {
    let dir = tempfile::tempdir().expect("temp dir");
    let capture = dir.path().join("capture");
    std::fs::create_dir(&capture).expect("capture dir");
    // Records, per run, the environment the process was started with, the
    // files it was given and its working directory, then runs haltsql.
    let script = install_script(
        dir.path(),
        "haltsql",
        &format!(
            "c={c}/$$\n/bin/mkdir \"$c\"\n\
             /bin/cat /proc/$$/environ > \"$c/environ\"\n\
             /bin/pwd > \"$c/cwd\"\n\
             /bin/cp -r . \"$c/files\"\n\
             exec {haltsql} \"$@\"",
            c = capture.display(),
            haltsql = support::haltsql_bin().display()
        ),
    );
    let f = fixture("pol-bundle", |s| s.haltsql_binary = script.clone()).await;
    let secret_value = "hunter2-registry-password";
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "registry-credentials"},
        "stringData": {"username": "robot", "password": secret_value}
    }))
    .expect("secret literal");
    f.secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    let policy: HaltSQLPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "haltsql.dev/v1alpha1",
        "kind": "HaltSQLPolicy",
        "metadata": {"name": "prod"},
        "spec": {"bundleSource": {
            "oci": {
                "ref": "ghcr.io/corp/haltsql-policies:prod",
                "auth": {"type": "basic", "secretName": "registry-credentials"}
            },
            "publicKeys": [PUBLIC_KEY],
            "namePrefix": "prod."
        }}
    }))
    .expect("policy literal");
    let created = f
        .policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create policy");
    let policy = f.wait_for("prod", "Valid", "True", "Validated").await;
    let status = policy.status.expect("status");
    // A bundle names its policies only when fetched; the status carries the
    // name of its bundle_source entry, which is the object's name.
    assert_eq!(status.policy_name.as_deref(), Some("prod"));
    assert_eq!(status.content_hash, Some(content_hash(&created.spec)));
    f.operator.stop().await;

    let runs: Vec<PathBuf> = std::fs::read_dir(&capture)
        .expect("captures")
        .map(|e| e.expect("capture entry").path())
        .collect();
    assert_eq!(runs.len(), 1, "one validator run: {runs:?}");
    let run = &runs[0];
    assert_eq!(
        std::fs::read(run.join("environ")).expect("environ"),
        b"",
        "the validator's environment must be empty"
    );
    let files: Vec<String> = std::fs::read_dir(run.join("files"))
        .expect("files")
        .map(|e| e.expect("file").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, ["config.yaml"]);
    let config = std::fs::read_to_string(run.join("files/config.yaml")).expect("config");
    assert!(config.contains("kind: Config"), "{config}");
    assert!(
        config.contains("ghcr.io/corp/haltsql-policies:prod"),
        "{config}"
    );
    for leak in [
        secret_value,
        "robot",
        "registry-credentials",
        "${file:",
        "/var/run/haltsql/secrets",
    ] {
        assert!(
            !config.contains(leak),
            "{leak:?} in the validation document:\n{config}"
        );
    }
    let cwd = std::fs::read_to_string(run.join("cwd")).expect("cwd");
    assert!(!Path::new(cwd.trim()).exists(), "{cwd} was left behind");
}

#[tokio::test]
async fn synced_follows_the_servers_rollouts() {
    let f = fixture("pol-synced", |_| {}).await;
    f.create_policy("orders", &document(&["id", "status", "total_cents"]))
        .await;
    f.wait_for("orders", "Synced", "False", "NotReferenced")
        .await;

    f.servers
        .create(
            &PostParams::default(),
            &support::quick_start_server("hs", "orders"),
        )
        .await
        .expect("create server");
    let policy = f.wait_for("orders", "Synced", "False", "RollingOut").await;
    let synced = find(&policy.status.expect("status").conditions, "Synced").expect("Synced");
    assert_eq!(
        synced.message,
        "not every referencing HaltSQLServer runs this content yet (their Progressing condition tells how far each is): hs"
    );

    f.complete_rollout("hs").await;
    let policy = f.wait_for("orders", "Synced", "True", "Synced").await;
    let first_hash = policy.status.expect("status").content_hash.expect("hash");
    let server = f.servers.get("hs").await.expect("server");
    let applied = server
        .status
        .and_then(|s| s.applied_policies)
        .expect("appliedPolicies");
    assert_eq!(applied.len(), 1);
    assert_eq!(
        (applied[0].name.as_str(), applied[0].content_hash.as_str()),
        ("orders-agent", first_hash.as_str())
    );

    let first_generation = f
        .deployments
        .get("hs")
        .await
        .expect("deployment")
        .metadata
        .generation;
    // An edit: valid again at once, but not synced until the server rolls it out.
    f.edit_policy(
        "orders",
        &document(&["id", "status", "total_cents", "created_at"]),
    )
    .await;
    let policy = f.wait_for("orders", "Synced", "False", "RollingOut").await;
    let status = policy.status.expect("status");
    assert_eq!(
        find(&status.conditions, "Valid").expect("Valid").reason,
        "Validated"
    );
    assert_ne!(status.content_hash.as_deref(), Some(first_hash.as_str()));

    f.wait_for_new_deployment_spec("hs", first_generation).await;
    f.complete_rollout("hs").await;
    let policy = f.wait_for("orders", "Synced", "True", "Synced").await;
    assert_ne!(
        policy.status.expect("status").content_hash.as_deref(),
        Some(first_hash.as_str())
    );
    f.operator.stop().await;
}

#[tokio::test]
async fn resyncs_of_an_unchanged_policy_run_nothing_and_write_nothing() {
    let f = fixture("pol-idle", |s| s.resync = Duration::from_secs(1)).await;
    f.create_policy("orders", &document(&["id"])).await;
    let policy = f.wait_for("orders", "Valid", "True", "Validated").await;
    // Let the first passes settle (the status write wakes the loop once more).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let policy = f.policies.get("orders").await.unwrap_or(policy);
    let version = policy.resource_version();
    let (runs, writes, reconciles) = (f.validator_runs(), f.status_writes(), f.policy_reconciles());
    assert_eq!(runs, 1, "one validation for one content");

    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        f.policy_reconciles() >= reconciles + 3,
        "resyncs happened ({} -> {})",
        reconciles,
        f.policy_reconciles()
    );
    assert_eq!(f.validator_runs(), runs, "a resync runs no validator");
    assert_eq!(f.status_writes(), writes, "a resync writes nothing");
    let after = f.policies.get("orders").await.expect("policy");
    assert_eq!(after.resource_version(), version);
    f.operator.stop().await;

    // A restarted operator (empty verdict cache) trusts the status for the
    // same generation and content: still no validator run, no write.
    let client = Cluster::Envtest.client().await;
    let operator = Operator::start(&client, &[&f.ns.name], |s| {
        s.resync = Duration::from_secs(1)
    });
    eventually("reconciles after the restart", WAIT, || async {
        let n = operator
            .metrics
            .reconciles
            .with_label_values(&["haltsqlpolicy", "success"])
            .get();
        (n >= 2).then_some(())
    })
    .await;
    let runs: u64 = operator
        .metrics
        .validator_runs
        .with_label_values(&["valid"])
        .get();
    assert_eq!(runs, 0);
    assert_eq!(
        operator
            .metrics
            .api_writes
            .with_label_values(&["HaltSQLPolicy", "status"])
            .get(),
        0
    );
    let after = f.policies.get("orders").await.expect("policy");
    assert_eq!(after.resource_version(), version);
    operator.stop().await;
}

/// A Context of our own, to call `reconcile` directly with chosen objects
/// (no controller, no watches: the stores stay empty).
fn direct_context(
    client: kube::Client,
    namespace: &str,
    binary: PathBuf,
) -> std::sync::Arc<haltsql_operator::controllers::context::Context> {
    use haltsql_operator::controllers::context::{Context, ScopeStores, Settings};
    let metrics = haltsql_operator::controllers::metrics::Metrics::new().expect("metrics");
    let mut settings = Settings::new(binary);
    settings.validator_timeout = Duration::from_secs(20);
    std::sync::Arc::new(Context::new(
        client,
        Some(namespace.to_owned()),
        ScopeStores::unwatched(),
        std::sync::Arc::new(haltsql_operator::controllers::policy::Validator::new(
            settings.haltsql_binary.clone(),
            settings.validator_timeout,
            settings.validator_concurrency,
            metrics.clone(),
        )),
        settings,
        metrics,
    ))
}

#[tokio::test]
async fn a_stale_object_is_skipped_a_conflict_is_quiet_and_a_second_pass_writes_nothing() {
    use haltsql_operator::controllers::policy::reconcile;
    use kube::runtime::controller::Action;
    use std::sync::Arc;

    Cluster::Envtest.ensure_crds();
    let client = Cluster::Envtest.client().await;
    let ns = TestNamespace::new_in(&client, Cluster::Envtest, "pol-direct").await;
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    let stale = policies
        .create(
            &PostParams::default(),
            &support::policy_object("orders", &document(&["id"])),
        )
        .await
        .expect("create policy");
    let ctx = direct_context(client.clone(), &ns.name, support::haltsql_bin());
    let writes = || {
        ctx.metrics
            .api_writes
            .with_label_values(&["HaltSQLPolicy", "status"])
            .get()
    };
    let reconciles = |result: &str| {
        ctx.metrics
            .reconciles
            .with_label_values(&["haltsqlpolicy", result])
            .get()
    };
    let resync = Action::requeue(ctx.settings.resync);

    // First pass: validates and writes.
    let action = reconcile(Arc::new(stale.clone()), ctx.clone()).await;
    assert_eq!(action.expect("first pass"), resync);
    assert_eq!(writes(), 1);

    // The same object again, the version our write replaced: the cache has
    // not shown the write yet, so the pass is skipped without a request.
    let action = reconcile(Arc::new(stale.clone()), ctx.clone()).await;
    assert_eq!(
        action.expect("a stale pass is not an error"),
        Action::requeue(haltsql_operator::controllers::status_patch::STALE_RECHECK)
    );
    assert_eq!((writes(), reconciles("stale")), (1, 1));

    // Someone else wrote after us, and the pass works from an older view
    // whose status differs: the write carries that old resourceVersion and
    // conflicts; that is a quick requeue, not an error.
    let mut behind = policies.get("orders").await.expect("policy");
    policies
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("foreign write");
    behind.status = None;
    let action = reconcile(Arc::new(behind), ctx.clone()).await;
    assert_eq!(
        action.expect("conflict is not an error"),
        Action::requeue(Duration::from_millis(500))
    );
    assert_eq!(
        (writes(), reconciles("conflict"), reconciles("error")),
        (1, 1, 0)
    );

    // With the current object: nothing to do, nothing written, no validator
    // run (the status already holds this generation's verdict).
    let fresh = policies.get("orders").await.expect("policy");
    let version = fresh.resource_version();
    let action = reconcile(Arc::new(fresh), ctx.clone()).await;
    assert_eq!(action.expect("idle pass"), resync);
    assert_eq!(writes(), 1);
    assert_eq!(
        ctx.metrics
            .validator_runs
            .with_label_values(&["valid"])
            .get(),
        1
    );
    assert_eq!(
        policies
            .get("orders")
            .await
            .expect("policy")
            .resource_version(),
        version
    );
}

#[tokio::test]
async fn validator_errors_back_off_per_object() {
    use haltsql_operator::controllers::policy::reconcile;
    use kube::runtime::controller::Action;
    use std::sync::Arc;

    Cluster::Envtest.ensure_crds();
    let client = Cluster::Envtest.client().await;
    let ns = TestNamespace::new_in(&client, Cluster::Envtest, "pol-backoff").await;
    let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns.name);
    policies
        .create(
            &PostParams::default(),
            &support::policy_object("orders", &document(&["id"])),
        )
        .await
        .expect("create policy");
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = direct_context(client.clone(), &ns.name, dir.path().join("missing"));
    let mut delays = Vec::new();
    for _ in 0..3 {
        let current = policies.get("orders").await.expect("policy");
        let action = reconcile(Arc::new(current), ctx.clone())
            .await
            .expect("a validator error is reported in status, not returned");
        delays.push(action);
    }
    assert_eq!(
        delays,
        [1, 2, 4].map(|s| Action::requeue(Duration::from_secs(s)))
    );
    // Written once (Valid=Unknown); the retries found nothing new to say.
    assert_eq!(
        ctx.metrics
            .api_writes
            .with_label_values(&["HaltSQLPolicy", "status"])
            .get(),
        1
    );
    assert_eq!(
        ctx.metrics
            .validator_runs
            .with_label_values(&["error"])
            .get(),
        3
    );
}

#[tokio::test]
async fn a_policy_the_server_stops_referencing_becomes_not_referenced() {
    let f = fixture("pol-deref", |_| {}).await;
    f.create_policy("orders", &document(&["id", "status", "total_cents"]))
        .await;
    f.create_policy(
        "other",
        &document(&["id", "status", "total_cents"])
            .replace("name: orders-agent", "name: other-agent"),
    )
    .await;
    f.servers
        .create(
            &PostParams::default(),
            &support::quick_start_server("hs", "orders"),
        )
        .await
        .expect("create server");
    f.wait_for("orders", "Valid", "True", "Validated").await;
    f.complete_rollout("hs").await;
    f.wait_for("orders", "Synced", "True", "Synced").await;

    let first_generation = f
        .deployments
        .get("hs")
        .await
        .expect("deployment")
        .metadata
        .generation;
    // The server switches to "other" (its token follows). No resync within
    // the wait: only the server watch can tell "orders".
    let patch = serde_json::json!({"spec": {
        "policies": [{"name": "other"}],
        "auth": {"tokens": [{
            "name": "orders-agent",
            "policy": "other-agent",
            "sha256SecretRef": {"name": "haltsql-tokens", "key": "orders-agent.sha256"}
        }]}
    }});
    f.servers
        .patch("hs", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch server");
    f.wait_for("orders", "Synced", "False", "NotReferenced")
        .await;
    f.wait_for("other", "Synced", "False", "RollingOut").await;
    f.wait_for_new_deployment_spec("hs", first_generation).await;
    f.complete_rollout("hs").await;
    f.wait_for("other", "Synced", "True", "Synced").await;
    f.operator.stop().await;
}
