//! Benchmarks of the operator against the local cluster (`make bench`).
//!
//! Scenarios (see the README's "Benchmarks" section):
//! 1. cold convergence of N policies and M servers against the floor
//!    (`haltsql validate` serially + `kubectl apply --server-side` of the
//!    rendered objects);
//! 2. edit latency (policy write -> new checksum on each referencing Deployment);
//! 3. idle writes and validator runs;
//! 4. footprint (RSS, CPU), again with unrelated objects in the watched namespaces;
//! 5. `haltsql verify` throughput (the haltsql crate's `verify_bench` example).
//!
//! Every figure comes from this run; nothing is estimated.
//!
//! ```text
//! cargo run --release --example bench -- --scale small \
//!     --operator-bin target/release/haltsql-operator --haltsql-bin target/release/haltsql
//! ```

mod curve;
mod fixtures;
mod operator;
mod report;
mod track;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt, stream};
use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Notify;

use fixtures::{FLOOR_PREFIX, Layout, OP_PREFIX};
use haltsql_testkit::prometheus::{Metrics, grown};
use operator::Operator;
use report::{Table, mib, ms, percentile, secs, verdict};
use track::{Tracker, no_fingerprint};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Scale {
    /// N=100, M=10, K=10, 60 s idle, 1,000 ConfigMaps and 100 Deployments.
    Small,
    /// N=1000, M=100, K=50, 300 s idle, 10,000 ConfigMaps and 1,000 Deployments.
    Default,
    /// N=5000, M=500 in 50 namespaces, K=50, 60 s idle, 10,000 ConfigMaps and 1,000 Deployments.
    Large,
}

#[derive(Debug, Parser)]
#[command(about = "Benchmarks of haltsql-operator against the local cluster")]
struct Args {
    #[arg(long, value_enum, default_value = "default", env = "BENCH_SCALE")]
    scale: Scale,
    /// HaltSQLPolicies (N).
    #[arg(long)]
    policies: Option<usize>,
    /// HaltSQLServers (M).
    #[arg(long)]
    servers: Option<usize>,
    /// Namespaces the population is spread over.
    #[arg(long)]
    namespaces: Option<usize>,
    /// Policy edits (K).
    #[arg(long)]
    edits: Option<usize>,
    /// Idle window after convergence, seconds.
    #[arg(long)]
    idle_seconds: Option<u64>,
    /// Idle window with the unrelated objects present, seconds.
    #[arg(long)]
    idle2_seconds: Option<u64>,
    #[arg(long)]
    unrelated_config_maps: Option<usize>,
    #[arg(long)]
    unrelated_deployments: Option<usize>,
    /// Seconds per `verify_bench` run.
    #[arg(long)]
    verify_seconds: Option<f64>,
    /// Seconds to wait for convergence before giving up.
    #[arg(long)]
    timeout_seconds: Option<u64>,
    #[arg(long, default_value = ".cluster/kubeconfig")]
    kubeconfig: PathBuf,
    #[arg(long, default_value = "bin/kubectl")]
    kubectl: PathBuf,
    /// The release operator binary.
    #[arg(long)]
    operator_bin: PathBuf,
    /// The release haltsql binary (validator).
    #[arg(long)]
    haltsql_bin: PathBuf,
    /// haltsql's `verify_bench` example binary; scenario 5 is skipped without it.
    #[arg(long)]
    verify_bench: Option<PathBuf>,
    /// Where results.json, logs and the floor's files go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
    /// Leave the benchmark namespaces in place at the end.
    #[arg(long)]
    keep: bool,
    /// Print how the figures grow over the results.json of earlier runs
    /// (one folder per size, smallest first) instead of running anything.
    #[arg(long, value_name = "DIR", num_args = 1..)]
    curve: Vec<PathBuf>,
}

impl Scale {
    /// The value for this scale out of `[small, default, large]`.
    fn choose<T: Copy>(self, [small, default, large]: [T; 3]) -> T {
        match self {
            Scale::Small => small,
            Scale::Default => default,
            Scale::Large => large,
        }
    }
}

/// The sizes of one run.
#[derive(Debug)]
struct Sizes {
    layout: Layout,
    edits: usize,
    idle: Duration,
    idle2: Duration,
    unrelated_config_maps: usize,
    unrelated_deployments: usize,
    verify_seconds: f64,
    timeout: Duration,
}

impl Sizes {
    fn from(args: &Args) -> Self {
        let pick = |o: Option<usize>, sizes: [usize; 3]| o.unwrap_or(args.scale.choose(sizes));
        let pick64 = |o: Option<u64>, sizes: [u64; 3]| o.unwrap_or(args.scale.choose(sizes));
        let policies = pick(args.policies, [100, 1000, 5000]);
        let servers = pick(args.servers, [10, 100, 500]);
        let namespaces = pick(args.namespaces, [5, 10, 50]);
        Sizes {
            layout: Layout::new(policies, servers, namespaces),
            edits: pick(args.edits, [10, 50, 50]),
            idle: Duration::from_secs(pick64(args.idle_seconds, [60, 300, 60])),
            idle2: Duration::from_secs(pick64(args.idle2_seconds, [30, 60, 30])),
            unrelated_config_maps: pick(args.unrelated_config_maps, [1000, 10_000, 10_000]),
            unrelated_deployments: pick(args.unrelated_deployments, [100, 1000, 1000]),
            verify_seconds: args.verify_seconds.unwrap_or(3.0),
            timeout: Duration::from_secs(pick64(args.timeout_seconds, [900, 3600, 3600])),
        }
    }
}

/// Every watch the benchmark keeps on the cluster.
struct Watches {
    notify: Arc<Notify>,
    policies: Tracker<HaltSQLPolicy>,
    servers: Tracker<HaltSQLServer>,
    deployments: Tracker<Deployment>,
    config_maps: Tracker<PartialObjectMeta<ConfigMap>>,
    services: Tracker<PartialObjectMeta<Service>>,
    pdbs: Tracker<PartialObjectMeta<PodDisruptionBudget>>,
    network_policies: Tracker<PartialObjectMeta<NetworkPolicy>>,
}

fn bench_namespace(ns: &str) -> bool {
    ns.starts_with(OP_PREFIX) || ns.starts_with(FLOOR_PREFIX)
}

fn checksum_of(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(fixtures::CHECKSUM_ANNOTATION)
        .cloned()
}

impl Watches {
    fn start(client: &Client) -> Self {
        let notify = Arc::new(Notify::new());
        let bench = watcher::Config::default().labels(&format!("{}=true", fixtures::BENCH_LABEL));
        let owned = watcher::Config::default().labels(&format!(
            "{}={}",
            haltsql_operator::render::MANAGED_BY_LABEL,
            haltsql_operator::render::MANAGED_BY
        ));
        fn meta<K>(
            what: &'static str,
            client: &Client,
            config: watcher::Config,
            notify: &Arc<Notify>,
        ) -> Tracker<PartialObjectMeta<K>>
        where
            K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
            K::DynamicType: Default,
        {
            Tracker::spawn(
                what,
                watcher::watcher(Api::<PartialObjectMeta<K>>::all(client.clone()), config),
                bench_namespace,
                no_fingerprint,
                notify.clone(),
            )
        }
        Watches {
            policies: Tracker::spawn(
                "haltsqlpolicies",
                watcher::watcher(Api::all(client.clone()), bench.clone()),
                bench_namespace,
                valid_content,
                notify.clone(),
            ),
            servers: Tracker::spawn(
                "haltsqlservers",
                watcher::watcher(Api::all(client.clone()), bench),
                bench_namespace,
                no_fingerprint,
                notify.clone(),
            ),
            deployments: Tracker::spawn(
                "deployments",
                watcher::watcher(Api::all(client.clone()), owned.clone()),
                bench_namespace,
                checksum_of,
                notify.clone(),
            ),
            config_maps: meta::<ConfigMap>("configmaps", client, owned.clone(), &notify),
            services: meta::<Service>("services", client, owned.clone(), &notify),
            pdbs: meta::<PodDisruptionBudget>("pdbs", client, owned.clone(), &notify),
            network_policies: meta::<NetworkPolicy>("networkpolicies", client, owned, &notify),
            notify,
        }
    }

    fn synced(&self) -> bool {
        self.policies.synced()
            && self.servers.synced()
            && self.deployments.synced()
            && self.config_maps.synced()
            && self.services.synced()
            && self.pdbs.synced()
            && self.network_policies.synced()
    }

    /// resourceVersion changes seen on CRs and owned objects, by kind.
    fn changes(&self) -> [(&'static str, u64); 7] {
        [
            ("HaltSQLPolicy", self.policies.changes()),
            ("HaltSQLServer", self.servers.changes()),
            ("Deployment", self.deployments.changes()),
            ("ConfigMap", self.config_maps.changes()),
            ("Service", self.services.changes()),
            ("PodDisruptionBudget", self.pdbs.changes()),
            ("NetworkPolicy", self.network_policies.changes()),
        ]
    }

    fn recent(&self) -> Vec<String> {
        let mut all = self.policies.recent();
        all.extend(self.servers.recent());
        all.extend(self.deployments.recent());
        all.extend(self.config_maps.recent());
        all.extend(self.services.recent());
        all.extend(self.pdbs.recent());
        all.extend(self.network_policies.recent());
        all
    }

    /// Waits until `done` holds, re-checking on every watch event; returns
    /// the elapsed time when it first held.
    async fn until(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if done(self) {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), self.notify.notified()).await;
        }
    }
}

fn condition_true(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

fn policy_valid(p: &HaltSQLPolicy) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.observed_generation == p.metadata.generation && condition_true(&s.conditions, "Valid")
    })
}

/// The content hash a policy is `Valid` with for its current generation:
/// it changes when the operator has judged an edit.
fn valid_content(p: &HaltSQLPolicy) -> Option<String> {
    policy_valid(p)
        .then(|| p.status.as_ref()?.content_hash.clone())
        .flatten()
}

fn policy_done(p: &HaltSQLPolicy) -> bool {
    policy_valid(p)
        && p.status
            .as_ref()
            .is_some_and(|s| condition_true(&s.conditions, "Synced"))
}

fn server_ready(s: &HaltSQLServer) -> bool {
    s.status.as_ref().is_some_and(|st| {
        st.observed_generation == s.metadata.generation && condition_true(&st.conditions, "Ready")
    })
}

fn deployment_available(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation >= d.metadata.generation
            && s.replicas == Some(want)
            && s.updated_replicas == Some(want)
            && s.available_replicas == Some(want)
    })
}

/// Counts (valid, done) policies and ready servers in the operator's namespaces.
fn population(w: &Watches) -> (usize, usize, usize) {
    let policies = w.policies.objects(OP_PREFIX);
    let valid = policies.iter().filter(|p| policy_valid(p)).count();
    let done = policies.iter().filter(|p| policy_done(p)).count();
    let ready = w
        .servers
        .objects(OP_PREFIX)
        .iter()
        .filter(|s| server_ready(s))
        .count();
    (valid, done, ready)
}

fn converged(w: &Watches, layout: &Layout) -> bool {
    let (_, done, ready) = population(w);
    done == layout.total_policies() && ready == layout.total_servers()
}

/// Creates many objects, 16 requests at a time.
async fn create_all<K>(client: &Client, objects: Vec<Value>) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    stream::iter(objects)
        .map(|value| async move {
            let obj: K = serde_json::from_value(value)?;
            let api: Api<K> = Api::namespaced(client.clone(), &obj.namespace().unwrap_or_default());
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating {}", obj.name_any()))?;
            anyhow::Ok(())
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

async fn create_namespaces(client: &Client, prefix: &str, count: usize) -> Result<Vec<String>> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut names = Vec::new();
    for i in 0..count {
        let name = fixtures::namespace(prefix, i);
        api.create(
            &PostParams::default(),
            &serde_json::from_value(fixtures::namespace_object(&name))?,
        )
        .await
        .with_context(|| format!("creating namespace {name}"))?;
        let secret: Secret = serde_json::from_value(fixtures::token_secret(&name))?;
        Api::<Secret>::namespaced(client.clone(), &name)
            .create(&PostParams::default(), &secret)
            .await?;
        names.push(name);
    }
    Ok(names)
}

/// Deletes the benchmark's namespaces; with `wait`, until they are gone.
async fn delete_namespaces(client: &Client, wait: bool) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let selector = ListParams::default().labels(&format!("{}=true", fixtures::BENCH_LABEL));
    for ns in api.list(&selector).await? {
        if bench_namespace(&ns.name_any()) && ns.metadata.deletion_timestamp.is_none() {
            api.delete(&ns.name_any(), &DeleteParams::background())
                .await?;
        }
    }
    if wait {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let left = api
                .list(&selector)
                .await?
                .iter()
                .filter(|n| bench_namespace(&n.name_any()))
                .count();
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!("{left} benchmark namespaces still terminating after 10 minutes");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(())
}

/// The floor: `haltsql validate` of every policy serially, then `kubectl
/// apply --server-side` of the objects `haltsql-operator render` prints,
/// one kubectl per namespace, all at once.
struct Floor {
    validate: Duration,
    apply: Duration,
    available: Duration,
    objects: usize,
}

async fn run_floor(args: &Args, sizes: &Sizes, client: &Client, w: &Watches) -> Result<Floor> {
    let layout = &sizes.layout;
    let dir = args.out_dir.join("floor");
    std::fs::create_dir_all(&dir)?;

    // The same servers and policies, in the floor's namespaces, rendered offline.
    let mut input = String::new();
    for ns in 0..layout.namespaces {
        let name = fixtures::namespace(FLOOR_PREFIX, ns);
        for p in 0..layout.policies_per_ns {
            input.push_str("---\n");
            input.push_str(&fixtures::policy_object(&name, ns, p).to_string());
            input.push('\n');
        }
        for s in 0..layout.servers_per_ns {
            input.push_str("---\n");
            input.push_str(&fixtures::server_object(layout, &name, s).to_string());
            input.push('\n');
        }
    }
    let input_path = dir.join("input.yaml");
    std::fs::write(&input_path, input)?;
    let rendered = std::process::Command::new(&args.operator_bin)
        .arg("render")
        .arg("-f")
        .arg(&input_path)
        .arg("--haltsql-binary")
        .arg(&args.haltsql_bin)
        .output()?;
    if !rendered.status.success() {
        bail!(
            "haltsql-operator render failed: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
    }
    let text = String::from_utf8(rendered.stdout)?;
    let mut by_namespace: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    let mut objects = 0;
    for document in serde_yaml::Deserializer::from_str(&text) {
        let mut value: Value = serde::Deserialize::deserialize(document)?;
        if value.is_null() {
            continue;
        }
        // The placeholder owner does not exist: the garbage collector would
        // delete the objects. Everything else is exactly what the operator applies.
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("ownerReferences");
        }
        let ns = value["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        by_namespace.entry(ns).or_default().push(value);
        objects += 1;
    }
    let mut files = Vec::new();
    for (ns, items) in by_namespace {
        let path = dir.join(format!("{ns}.json"));
        std::fs::write(
            &path,
            json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
        )?;
        files.push(path);
    }

    // haltsql validate, serially, as the operator runs it (private dir, empty env).
    let started = Instant::now();
    for ns in 0..layout.namespaces {
        for p in 0..layout.policies_per_ns {
            let tmp = tempfile::tempdir()?;
            std::fs::write(
                tmp.path().join("policy.yaml"),
                fixtures::policy_document(ns, p, None),
            )?;
            let out = std::process::Command::new(&args.haltsql_bin)
                .args(["validate", "--format", "json", "--", "policy.yaml"])
                .env_clear()
                .current_dir(tmp.path())
                .output()?;
            if !out.status.success() {
                bail!(
                    "haltsql validate rejected a benchmark policy: {}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
    }
    let validate = started.elapsed();

    create_namespaces(client, FLOOR_PREFIX, layout.namespaces).await?;
    let started = Instant::now();
    let applies = files.iter().map(|file| {
        tokio::process::Command::new(&args.kubectl)
            .arg("--kubeconfig")
            .arg(&args.kubeconfig)
            .args(["apply", "--server-side", "-o", "name", "-f"])
            .arg(file)
            .output()
    });
    for out in futures::future::join_all(applies).await {
        let out = out?;
        if !out.status.success() {
            bail!(
                "kubectl apply failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let apply = started.elapsed();
    let want = layout.total_servers();
    let done = w
        .until(
            "the floor's Deployments to be available",
            sizes.timeout,
            |w| {
                let ds = w.deployments.objects(FLOOR_PREFIX);
                ds.len() == want && ds.iter().all(|d| deployment_available(d))
            },
        )
        .await?;
    Ok(Floor {
        validate,
        apply,
        available: done - started,
        objects,
    })
}

/// What a series of edits measured.
struct Edits {
    /// From the write to a new checksum, one per referencing Deployment.
    latencies: Vec<Duration>,
    /// From the write to the policy `Valid` with the new content, one per edit.
    to_valid: Vec<Duration>,
    /// Deployments that did not get a new checksum in time.
    missed: usize,
}

/// Edits policies one at a time.
async fn run_edits(
    client: &Client,
    w: &Watches,
    layout: &Layout,
    first: usize,
    count: usize,
) -> Result<Edits> {
    let mut latencies = Vec::new();
    let mut to_valid = Vec::new();
    let mut missed = 0;
    for e in first..first + count {
        let ns = e % layout.namespaces;
        let p = ((e / layout.namespaces) * 7 + 3) % layout.policies_per_ns;
        let ns_name = fixtures::namespace(OP_PREFIX, ns);
        let keys: Vec<String> = layout
            .referencing(p)
            .into_iter()
            .map(|s| format!("{ns_name}/{}", fixtures::server_name(s)))
            .collect();
        let old: Vec<Option<String>> = keys
            .iter()
            .map(|k| w.deployments.fingerprint(k).and_then(|(fp, _)| fp))
            .collect();
        let policy_key = format!("{ns_name}/{}", fixtures::policy_name(p));
        let old_content = w.policies.fingerprint(&policy_key).and_then(|(fp, _)| fp);
        let api: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), &ns_name);
        let patch = json!({"spec": {"policy": fixtures::policy_document(ns, p, Some(e))}});
        let t0 = Instant::now();
        api.patch(
            &fixtures::policy_name(p),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        let changed = |w: &Watches| {
            keys.iter().zip(&old).all(|(k, old)| {
                w.deployments
                    .fingerprint(k)
                    .is_some_and(|(fp, _)| fp.is_some() && fp != *old)
            })
        };
        if w.until("new checksums", Duration::from_secs(60), changed)
            .await
            .is_err()
        {
            eprintln!("bench: edit {e} ({ns_name}/p-{p}): not every Deployment changed in 60 s");
        }
        for (k, old) in keys.iter().zip(&old) {
            match w.deployments.fingerprint(k) {
                Some((fp, since)) if fp.is_some() && fp != *old => {
                    latencies.push(since.saturating_duration_since(t0))
                }
                _ => missed += 1,
            }
        }
        if let Some((Some(content), since)) = w.policies.fingerprint(&policy_key)
            && Some(&content) != old_content.as_ref()
        {
            to_valid.push(since.saturating_duration_since(t0));
        }
    }
    latencies.sort_unstable();
    to_valid.sort_unstable();
    Ok(Edits {
        latencies,
        to_valid,
        missed,
    })
}

/// What an idle window saw.
struct Idle {
    window: Duration,
    rv_changes: u64,
    by_kind: Vec<String>,
    writes: f64,
    validator_runs: f64,
    reconciles: f64,
    writes_detail: Vec<String>,
    recent: Vec<String>,
}

async fn idle_window(w: &Watches, op: &Operator, window: Duration) -> Result<Idle> {
    let before = w.changes();
    let m0 = op.metrics().await?;
    tokio::time::sleep(window).await;
    let m1 = op.metrics().await?;
    let after = w.changes();
    let by_kind: Vec<String> = before
        .iter()
        .zip(after)
        .filter(|(b, a)| a.1 > b.1)
        .map(|(b, a)| format!("{} +{}", b.0, a.1 - b.1))
        .collect();
    let rv_changes = before.iter().zip(after).map(|(b, a)| a.1 - b.1).sum();
    Ok(Idle {
        window,
        rv_changes,
        by_kind,
        writes: m1.sum("haltsql_operator_api_writes_total")
            - m0.sum("haltsql_operator_api_writes_total"),
        validator_runs: m1.sum("haltsql_operator_validator_runs_total")
            - m0.sum("haltsql_operator_validator_runs_total"),
        reconciles: m1.sum("haltsql_operator_reconciles_total")
            - m0.sum("haltsql_operator_reconciles_total"),
        writes_detail: grown(&m0, &m1, "haltsql_operator_api_writes_total"),
        recent: if rv_changes > 0 { w.recent() } else { vec![] },
    })
}

/// RSS and CPU of one operator process over the phases it ran.
struct Footprint {
    peak_kib: u64,
    steady_kib: u64,
    cpu_s: f64,
    children_cpu_s: f64,
}

fn footprint(op: &Operator, steady_from: Duration) -> Footprint {
    let last = op.sample();
    let steady = op.samples_between(steady_from, last.at);
    let steady_kib = if steady.is_empty() {
        last.rss_kib
    } else {
        steady.iter().map(|s| s.rss_kib).sum::<u64>() / steady.len() as u64
    };
    Footprint {
        peak_kib: op.peak_rss_kib(),
        steady_kib,
        cpu_s: last.cpu_s,
        children_cpu_s: last.children_cpu_s,
    }
}

/// One row of `verify_bench`'s table.
struct VerifyRow {
    query: String,
    connections: String,
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn run_verify_bench(binary: &Path, seconds: f64) -> Result<(Vec<VerifyRow>, String)> {
    let out = std::process::Command::new(binary)
        .arg(seconds.to_string())
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "verify_bench failed ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // "allowed  2 (1/core)  requests  req/s  p50  p99  max"
    let rows = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 8 || !(f[0] == "allowed" || f[0] == "denied") {
                return None;
            }
            Some(VerifyRow {
                query: f[0].to_owned(),
                connections: format!("{} {}", f[1], f[2]),
                per_second: f[4].parse().ok()?,
                p50_ms: f[5].parse().ok()?,
                p99_ms: f[6].parse().ok()?,
            })
        })
        .collect();
    Ok((rows, text))
}

/// Writes per object during the cold start, from the operator's metrics.
struct ColdWrites {
    policy_status_per_policy: f64,
    server_status_per_server: f64,
    applies_per_server: f64,
    conflicts: f64,
    stale: f64,
}

impl ColdWrites {
    fn from(m: &Metrics, policies: usize, servers: usize) -> Self {
        let labelled = |name: &str, wanted: &[&str]| -> f64 {
            m.series(name)
                .iter()
                .filter(|(labels, _)| wanted.iter().all(|w| labels.contains(w)))
                .map(|(_, v)| v)
                .sum::<f64>()
                + 0.0 // an empty sum is -0.0
        };
        let writes = "haltsql_operator_api_writes_total";
        let reconciles = "haltsql_operator_reconciles_total";
        ColdWrites {
            policy_status_per_policy: labelled(
                writes,
                &["kind=\"HaltSQLPolicy\"", "verb=\"status\""],
            ) / policies.max(1) as f64,
            server_status_per_server: labelled(
                writes,
                &["kind=\"HaltSQLServer\"", "verb=\"status\""],
            ) / servers.max(1) as f64,
            applies_per_server: labelled(writes, &["verb=\"apply\""]) / servers.max(1) as f64,
            conflicts: labelled(reconciles, &["result=\"conflict\""]),
            stale: labelled(reconciles, &["result=\"stale\""]),
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn nproc() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if !args.curve.is_empty() {
        return curve::print(&args.curve);
    }
    // Interrupted, the run's future is dropped, and with it the operator
    // child (killed on drop) instead of left running against the cluster.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = run(args) => result,
        _ = tokio::signal::ctrl_c() => bail!("interrupted; the benchmark namespaces are left for the next run to remove"),
        _ = terminate.recv() => bail!("terminated; the benchmark namespaces are left for the next run to remove"),
    }
}

async fn run(args: Args) -> Result<()> {
    let sizes = Sizes::from(&args);
    let layout = sizes.layout.clone();
    std::fs::create_dir_all(&args.out_dir)?;
    let date = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%d %H:%M UTC")
        .to_string();
    let load_start = loadavg();
    let scale = format!(
        "{:?}: N={} policies, M={} servers ({} replicas, {} policies each) in {} namespaces, K={} edits, idle {} s (+{} s), {} unrelated ConfigMaps, {} unrelated Deployments",
        args.scale,
        layout.total_policies(),
        layout.total_servers(),
        layout.replicas,
        layout.refs_per_server,
        layout.namespaces,
        sizes.edits,
        sizes.idle.as_secs(),
        sizes.idle2.as_secs(),
        sizes.unrelated_config_maps,
        sizes.unrelated_deployments,
    );
    eprintln!("bench: {scale}");

    // Every policy document is the sample's: a sample edited out of shape
    // stops the run here, with the file named, before anything is created.
    haltsql_testkit::fixtures::try_quick_start_policy_document(&[])?;
    let client = haltsql_testkit::cluster::try_connect(&args.kubeconfig).await?;
    eprintln!("bench: removing namespaces left by an earlier run");
    delete_namespaces(&client, true).await?;
    let w = Watches::start(&client);
    w.until("the watches to sync", Duration::from_secs(60), |w| {
        w.synced()
    })
    .await?;

    // 1b. The floor.
    eprintln!("bench: floor (render, validate serially, kubectl apply --server-side)");
    let floor = run_floor(&args, &sizes, &client, &w).await?;

    // 1. Cold convergence.
    eprintln!(
        "bench: creating {} policies and {} servers",
        layout.total_policies(),
        layout.total_servers()
    );
    let op_namespaces = create_namespaces(&client, OP_PREFIX, layout.namespaces).await?;
    let mut policies = Vec::new();
    let mut servers = Vec::new();
    for (ns, name) in op_namespaces.iter().enumerate() {
        policies.extend((0..layout.policies_per_ns).map(|p| fixtures::policy_object(name, ns, p)));
        servers
            .extend((0..layout.servers_per_ns).map(|s| fixtures::server_object(&layout, name, s)));
    }
    create_all::<HaltSQLPolicy>(&client, policies).await?;
    create_all::<HaltSQLServer>(&client, servers).await?;
    w.until(
        "the custom resources to be seen",
        Duration::from_secs(120),
        |w| {
            w.policies.len_where(OP_PREFIX) == layout.total_policies()
                && w.servers.len_where(OP_PREFIX) == layout.total_servers()
        },
    )
    .await?;

    eprintln!("bench: starting the operator (cold)");
    let mut op = Operator::start(
        &args.operator_bin,
        &args.haltsql_bin,
        &args.kubeconfig,
        &op_namespaces,
        args.out_dir.join("operator-1.log"),
    )?;
    let t0 = op.started;
    let ready_at = op.wait_ready(Duration::from_secs(120)).await?;
    let n = layout.total_policies();
    let m = layout.total_servers();
    let (mut valid_at, mut applied_at) = (None, None);
    let converged_at = w
        .until("cold convergence", sizes.timeout, |w| {
            let now = Instant::now();
            if valid_at.is_none() && population(w).0 == n {
                valid_at = Some(now);
            }
            let deployments = w.deployments.objects(OP_PREFIX);
            if applied_at.is_none()
                && deployments.len() == m
                && deployments.iter().all(|d| checksum_of(d).is_some())
            {
                applied_at = Some(now);
            }
            converged(w, &layout)
        })
        .await?;
    let valid_at = valid_at.unwrap_or(converged_at);
    let applied_at = applied_at.unwrap_or(converged_at);
    let convergence = converged_at - t0;
    let cpu_cold = op.sample();
    let op_peak_cold_kib = op.peak_rss_kib();
    let m_cold = op.metrics().await?;
    std::fs::write(args.out_dir.join("operator-1.cold.metrics"), &m_cold.0)?;
    eprintln!("bench: converged in {}", secs(convergence));

    // 2. Edit latency.
    eprintln!("bench: {} edits", sizes.edits);
    let Edits {
        latencies: edit_lat,
        to_valid: edit_to_valid,
        missed: edit_missed,
    } = run_edits(&client, &w, &layout, 0, sizes.edits).await?;
    let settled = w
        .until("convergence after the edits", sizes.timeout, |w| {
            converged(w, &layout)
        })
        .await?;
    let cpu_edits = op.sample();

    // 3. Idle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    eprintln!("bench: idle window of {} s", sizes.idle.as_secs());
    let idle_from = op.started.elapsed();
    let idle = idle_window(&w, &op, sizes.idle).await?;
    op.check_alive()?;
    let cpu_idle_start = op
        .samples_between(idle_from, idle_from + Duration::from_secs(1))
        .first()
        .copied()
        .unwrap_or_default();
    let fp1 = footprint(&op, idle_from);
    std::fs::write(
        args.out_dir.join("operator-1.end.metrics"),
        &op.metrics().await?.0,
    )?;
    let idle_cpu = fp1.cpu_s - cpu_idle_start.cpu_s;
    op.stop().await?;

    // 4. Footprint: first a restart without unrelated objects (the baseline
    // for the same population), then with them in the watched namespaces.
    eprintln!("bench: restarting the operator (baseline for scenario 4)");
    let mut op_base = Operator::start(
        &args.operator_bin,
        &args.haltsql_bin,
        &args.kubeconfig,
        &op_namespaces,
        args.out_dir.join("operator-baseline.log"),
    )?;
    op_base.wait_ready(Duration::from_secs(300)).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    op_base.check_alive()?;
    let fp_base = footprint(&op_base, op_base.started.elapsed() - Duration::from_secs(5));
    op_base.stop().await?;
    eprintln!(
        "bench: creating {} unrelated ConfigMaps and {} unrelated Deployments",
        sizes.unrelated_config_maps, sizes.unrelated_deployments
    );
    let created = Instant::now();
    let ns_of = |i: usize| &op_namespaces[i % op_namespaces.len()];
    create_all::<ConfigMap>(
        &client,
        (0..sizes.unrelated_config_maps)
            .map(|i| fixtures::unrelated_config_map(ns_of(i), i))
            .collect(),
    )
    .await?;
    create_all::<Deployment>(
        &client,
        (0..sizes.unrelated_deployments)
            .map(|i| fixtures::unrelated_deployment(ns_of(i), i))
            .collect(),
    )
    .await?;
    let unrelated_created = created.elapsed();
    eprintln!("bench: restarting the operator with them present");
    let mut op2 = Operator::start(
        &args.operator_bin,
        &args.haltsql_bin,
        &args.kubeconfig,
        &op_namespaces,
        args.out_dir.join("operator-2.log"),
    )?;
    let ready2 = op2.wait_ready(Duration::from_secs(300)).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let m_restart1 = op2.metrics().await?;
    let restart_writes = m_restart1.sum("haltsql_operator_api_writes_total") as u64;
    let restart_validator = m_restart1.sum("haltsql_operator_validator_runs_total") as u64;
    let edits2 = sizes.edits.min(10);
    let Edits {
        latencies: edit_lat2,
        to_valid: edit_to_valid2,
        missed: edit_missed2,
    } = run_edits(&client, &w, &layout, sizes.edits, edits2).await?;
    w.until("convergence after the edits", sizes.timeout, |w| {
        converged(w, &layout)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle2_from = op2.started.elapsed();
    let idle2 = idle_window(&w, &op2, sizes.idle2).await?;
    op2.check_alive()?;
    let fp2 = footprint(&op2, idle2_from);
    op2.stop().await?;

    // 5. haltsql verify.
    let verify = match &args.verify_bench {
        Some(binary) => {
            eprintln!("bench: haltsql verify_bench");
            Some(run_verify_bench(binary, sizes.verify_seconds)?)
        }
        None => None,
    };

    let load_end = loadavg();

    // The table.
    let floor_sum = floor.validate + floor.apply;
    let floor_rollout = floor.validate + floor.available;
    let ratio = convergence.as_secs_f64() / floor_sum.as_secs_f64();
    let ratio_rollout = convergence.as_secs_f64() / floor_rollout.as_secs_f64();
    let mut t = Table::default();
    t.add("1 cold", "operator: start -> /readyz", secs(ready_at), "");
    t.add(
        "1 cold",
        format!("operator: start -> all {n} policies Valid"),
        secs(valid_at - t0),
        "",
    );
    t.add(
        "1 cold",
        format!("operator: start -> all {m} Deployments applied"),
        secs(applied_at - t0),
        "",
    );
    t.add(
        "1 cold",
        "operator: start -> all Valid+Synced, all servers Ready",
        secs(convergence),
        "",
    );
    t.add(
        "1 cold",
        format!("floor: haltsql validate x{n}, serially"),
        secs(floor.validate),
        "",
    );
    t.add(
        "1 cold",
        format!(
            "floor: kubectl apply --server-side ({} objects)",
            floor.objects
        ),
        secs(floor.apply),
        "",
    );
    t.add("1 cold", "floor = validate + apply", secs(floor_sum), "");
    t.add(
        "1 cold",
        "ratio convergence / floor",
        format!("{ratio:.2}x"),
        format!("<= 1.5x ({})", verdict(ratio <= 1.5)),
    );
    t.add(
        "1 cold",
        "floor with rollout (validate + apply until Deployments available)",
        secs(floor_rollout),
        "",
    );
    t.add(
        "1 cold",
        "ratio convergence / floor with rollout",
        format!("{ratio_rollout:.2}x"),
        "",
    );
    // Ready and Synced need the rollout, which no operator can finish sooner
    // than the floor's own Deployments did from the moment they were applied.
    let lower_bound = floor.available.as_secs_f64() / floor_sum.as_secs_f64();
    t.add(
        "1 cold",
        "lower bound of the ratio: floor's apply until available, without validation, / floor",
        format!("{lower_bound:.2}x"),
        if lower_bound > 1.5 {
            "the 1.5x goal is out of reach in this run"
        } else {
            ""
        },
    );
    t.add(
        "1 cold",
        "validator runs / API writes during cold start",
        format!(
            "{} / {}",
            m_cold.sum("haltsql_operator_validator_runs_total"),
            m_cold.sum("haltsql_operator_api_writes_total")
        ),
        "",
    );
    let writes = ColdWrites::from(&m_cold, n, m);
    t.add(
        "1 cold",
        "status writes per policy / per server; applies per server",
        format!(
            "{:.2} / {:.2}; {:.2}",
            writes.policy_status_per_policy,
            writes.server_status_per_server,
            writes.applies_per_server
        ),
        format!(
            "<= 2 per policy ({})",
            verdict(writes.policy_status_per_policy <= 2.0)
        ),
    );
    t.add(
        "1 cold",
        "validator processes; reconciles ended in 409 / skipped over a stale cache",
        format!(
            "{}; {} / {}",
            m_cold.sum("haltsql_operator_validator_processes_total"),
            writes.conflicts,
            writes.stale
        ),
        "409: 0",
    );
    let p99 = percentile(&edit_lat, 0.99);
    t.add(
        "2 edit",
        format!(
            "policy write -> new checksum ({} Deployment samples, {} edits)",
            edit_lat.len(),
            sizes.edits
        ),
        format!(
            "p50 {}, p99 {}, max {}",
            ms(percentile(&edit_lat, 0.5)),
            ms(p99),
            ms(percentile(&edit_lat, 1.0))
        ),
        format!(
            "p99 < 500 ms ({})",
            verdict(p99 < Duration::from_millis(500) && edit_missed == 0)
        ),
    );
    t.add(
        "2 edit",
        format!(
            "  of which policy write -> Valid with the new content ({} edits)",
            edit_to_valid.len()
        ),
        format!(
            "p50 {}, p99 {}, max {}",
            ms(percentile(&edit_to_valid, 0.5)),
            ms(percentile(&edit_to_valid, 0.99)),
            ms(percentile(&edit_to_valid, 1.0))
        ),
        "",
    );
    if edit_missed > 0 {
        t.add(
            "2 edit",
            "Deployments without a new checksum within 60 s",
            edit_missed.to_string(),
            "0",
        );
    }
    t.add(
        "3 idle",
        format!(
            "resourceVersion changes on CRs and owned objects in {} s",
            idle.window.as_secs()
        ),
        if idle.by_kind.is_empty() {
            "0".to_owned()
        } else {
            format!("{} ({})", idle.rv_changes, idle.by_kind.join(", "))
        },
        format!("0 ({})", verdict(idle.rv_changes == 0)),
    );
    t.add(
        "3 idle",
        "operator API writes / validator runs (metrics)",
        format!("{} / {}", idle.writes, idle.validator_runs),
        format!(
            "0 / 0 ({})",
            verdict(idle.writes == 0.0 && idle.validator_runs == 0.0)
        ),
    );
    t.add(
        "3 idle",
        "reconciles in the window",
        idle.reconciles.to_string(),
        "",
    );
    t.add(
        "4 footprint",
        "scenarios 1-3: peak RSS / steady RSS (idle mean)",
        format!("{} / {}", mib(fp1.peak_kib), mib(fp1.steady_kib)),
        "",
    );
    t.add(
        "4 footprint",
        "scenarios 1-3: CPU s (operator; + validator children)",
        format!(
            "cold {:.1}, edits {:.1}, idle {:.2}; total {:.1} (+{:.1})",
            cpu_cold.cpu_s,
            cpu_edits.cpu_s - cpu_cold.cpu_s,
            idle_cpu,
            fp1.cpu_s,
            fp1.children_cpu_s
        ),
        "",
    );
    t.add(
        "4 footprint",
        "restart without unrelated objects, 10 s after /readyz: peak / steady RSS",
        format!("{} / {}", mib(fp_base.peak_kib), mib(fp_base.steady_kib)),
        "",
    );
    t.add(
        "4 footprint",
        format!(
            "with {} ConfigMaps + {} Deployments unrelated: peak / steady RSS",
            sizes.unrelated_config_maps, sizes.unrelated_deployments
        ),
        format!("{} / {}", mib(fp2.peak_kib), mib(fp2.steady_kib)),
        format!("< 40 MiB ({})", verdict(fp2.peak_kib < 40 * 1024)),
    );
    t.add(
        "4 footprint",
        "  restart: start -> /readyz; writes / validator runs by 10 s after",
        format!(
            "{}; {} / {}",
            secs(ready2),
            restart_writes,
            restart_validator
        ),
        "",
    );
    let p99b = percentile(&edit_lat2, 0.99);
    t.add(
        "4 footprint",
        format!("  edit latency ({} edits)", edits2),
        format!(
            "p50 {}, p99 {}, max {} (to Valid: p50 {}, max {}){}",
            ms(percentile(&edit_lat2, 0.5)),
            ms(p99b),
            ms(percentile(&edit_lat2, 1.0)),
            ms(percentile(&edit_to_valid2, 0.5)),
            ms(percentile(&edit_to_valid2, 1.0)),
            if edit_missed2 > 0 {
                format!(", {edit_missed2} missed")
            } else {
                String::new()
            }
        ),
        "",
    );
    t.add(
        "4 footprint",
        format!(
            "  idle {} s: rv changes / writes / validator runs",
            idle2.window.as_secs()
        ),
        format!(
            "{} / {} / {}",
            idle2.rv_changes, idle2.writes, idle2.validator_runs
        ),
        "0 / 0 / 0",
    );
    t.add(
        "4 footprint",
        "  CPU s (operator; + validator children)",
        format!("{:.1} (+{:.1})", fp2.cpu_s, fp2.children_cpu_s),
        "",
    );
    let cores = nproc();
    if let Some((rows, _)) = &verify {
        for r in rows {
            let goal = if r.connections.ends_with("(2/core)") {
                format!(
                    "> 20,000/s on 2 cores ({})",
                    verdict(r.per_second > 20_000.0)
                )
            } else {
                String::new()
            };
            t.add(
                "5 verify",
                format!("{} query, {} connections", r.query, r.connections),
                format!(
                    "{:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
                    r.per_second, r.p50_ms, r.p99_ms
                ),
                goal,
            );
        }
    } else {
        t.add("5 verify", "not run (no --verify-bench)", "-", "");
    }

    let table = t.render();
    println!();
    println!("haltsql-operator benchmarks, {date}, nproc {cores}");
    println!("{scale}");
    println!("load average at start {load_start}, at end {load_end}");
    println!();
    print!("{table}");
    println!(
        "\ncold start writes: {}",
        m_cold
            .series("haltsql_operator_api_writes_total")
            .iter()
            .map(|(l, v)| format!("{l} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if idle.rv_changes > 0 || idle.writes > 0.0 {
        println!(
            "\nidle writes: {:?}; last changes seen: {:?}",
            idle.writes_detail, idle.recent
        );
    }
    if idle2.rv_changes > 0 || idle2.writes > 0.0 {
        println!(
            "idle writes (with unrelated objects): {:?}; last changes seen: {:?}",
            idle2.writes_detail, idle2.recent
        );
    }

    let d = |d: Duration| d.as_secs_f64();
    let results = json!({
        "date": date,
        "nproc": cores,
        "scale": format!("{:?}", args.scale).to_lowercase(),
        "load_average": {"start": load_start, "end": load_end},
        "sizes": {
            "policies": n, "servers": layout.total_servers(), "namespaces": layout.namespaces,
            "policies_per_server": layout.refs_per_server, "replicas": layout.replicas,
            "edits": sizes.edits, "idle_seconds": sizes.idle.as_secs(), "idle2_seconds": sizes.idle2.as_secs(),
            "unrelated_config_maps": sizes.unrelated_config_maps,
            "unrelated_deployments": sizes.unrelated_deployments,
        },
        "cold_convergence": {
            "ready_seconds": d(ready_at),
            "all_valid_seconds": d(valid_at - t0),
            "all_deployments_applied_seconds": d(applied_at - t0),
            "api_writes_by_kind": m_cold.series("haltsql_operator_api_writes_total")
                .iter().map(|(l, v)| format!("{l} {v}")).collect::<Vec<_>>(),
            "converged_seconds": d(convergence),
            "validator_runs": m_cold.sum("haltsql_operator_validator_runs_total"),
            "validator_processes": m_cold.sum("haltsql_operator_validator_processes_total"),
            "api_writes": m_cold.sum("haltsql_operator_api_writes_total"),
            "policy_status_writes_per_policy": writes.policy_status_per_policy,
            "server_status_writes_per_server": writes.server_status_per_server,
            "applies_per_server": writes.applies_per_server,
            "reconciles_conflict": writes.conflicts,
            "reconciles_stale": writes.stale,
            "cpu_seconds": cpu_cold.cpu_s,
            "peak_rss_mib": op_peak_cold_kib as f64 / 1024.0,
            "floor": {
                "validate_serial_seconds": d(floor.validate),
                "apply_seconds": d(floor.apply),
                "apply_until_available_seconds": d(floor.available),
                "objects": floor.objects,
                "floor_seconds": d(floor_sum),
                "floor_with_rollout_seconds": d(floor_rollout),
            },
            "ratio": ratio,
            "ratio_with_rollout": ratio_rollout,
            "ratio_lower_bound": lower_bound,
        },
        "edit_latency": {
            "edits": sizes.edits,
            "samples": edit_lat.len(),
            "missed": edit_missed,
            "p50_ms": d(percentile(&edit_lat, 0.5)) * 1000.0,
            "p99_ms": d(p99) * 1000.0,
            "max_ms": d(percentile(&edit_lat, 1.0)) * 1000.0,
            "to_valid_p50_ms": d(percentile(&edit_to_valid, 0.5)) * 1000.0,
            "to_valid_p99_ms": d(percentile(&edit_to_valid, 0.99)) * 1000.0,
            "settled_seconds_after_start": d(settled - t0),
        },
        "idle": {
            "window_seconds": idle.window.as_secs(),
            "resource_version_changes": idle.rv_changes,
            "by_kind": idle.by_kind,
            "api_writes": idle.writes,
            "validator_runs": idle.validator_runs,
            "reconciles": idle.reconciles,
        },
        "footprint": {
            "scenarios_1_3": {
                "peak_rss_mib": fp1.peak_kib as f64 / 1024.0,
                "steady_rss_mib": fp1.steady_kib as f64 / 1024.0,
                "cpu_seconds": fp1.cpu_s,
                "cpu_seconds_cold": cpu_cold.cpu_s,
                "cpu_seconds_edits": cpu_edits.cpu_s - cpu_cold.cpu_s,
                "cpu_seconds_idle": idle_cpu,
                "validator_children_cpu_seconds": fp1.children_cpu_s,
            },
            "restart_baseline": {
                "peak_rss_mib": fp_base.peak_kib as f64 / 1024.0,
                "steady_rss_mib": fp_base.steady_kib as f64 / 1024.0,
                "cpu_seconds": fp_base.cpu_s,
            },
            "with_unrelated": {
                "unrelated_created_seconds": d(unrelated_created),
                "peak_rss_mib": fp2.peak_kib as f64 / 1024.0,
                "steady_rss_mib": fp2.steady_kib as f64 / 1024.0,
                "cpu_seconds": fp2.cpu_s,
                "validator_children_cpu_seconds": fp2.children_cpu_s,
                "ready_seconds": d(ready2),
                "restart_api_writes": restart_writes,
                "restart_validator_runs": restart_validator,
                "edits": edits2,
                "edit_p50_ms": d(percentile(&edit_lat2, 0.5)) * 1000.0,
                "edit_p99_ms": d(p99b) * 1000.0,
                "edit_max_ms": d(percentile(&edit_lat2, 1.0)) * 1000.0,
                "edit_missed": edit_missed2,
                "idle_window_seconds": idle2.window.as_secs(),
                "idle_resource_version_changes": idle2.rv_changes,
                "idle_api_writes": idle2.writes,
                "idle_validator_runs": idle2.validator_runs,
            },
        },
        "verify": verify.as_ref().map(|(rows, raw)| json!({
            "rows": rows.iter().map(|r| json!({
                "query": r.query, "connections": r.connections,
                "per_second": r.per_second, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
            })).collect::<Vec<_>>(),
            "output": raw,
        })),
        "table": table,
    });
    let path = args.out_dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&results)?)?;
    println!("\nresults: {}", path.display());
    if !args.keep {
        eprintln!("bench: deleting the benchmark namespaces (in the background)");
        if let Err(error) = delete_namespaces(&client, false).await {
            eprintln!("bench: could not delete the benchmark namespaces: {error:#}");
        }
    }
    Ok(())
}
