//! The invariants of issue 20, checked continuously by a background task
//! while a scenario runs (every few hundred milliseconds, with the admin
//! client, never through the proxy):
//!
//! 1. every ConfigMap a pod template (the Deployment's or any ReplicaSet's)
//!    mounts exists, and each policy file in it has content that a
//!    HaltSQLPolicy reported `Valid` for its generation at some point, or
//!    that the real `haltsql validate` accepts: a server takes the
//!    operator's judgement before the policy's status write lands (see
//!    docs/guide.md), and an edit may replace the content before that
//!    write, so only the verdict itself can tell;
//! 2. every object labelled as the operator's has a controller reference to
//!    an existing HaltSQLServer;
//! 3. at most one Deployment, Service, PodDisruptionBudget and NetworkPolicy
//!    per server, and no more ConfigMaps than the configurations its
//!    ReplicaSets and Deployment use, plus one (for longer than a grace time);
//! 4. `observedGeneration` of servers and policies never goes back;
//! 5. the operator's RSS stays under a bound.
//!
//! (No panic in the operator's log is checked by the scenarios, which own the
//! processes.) A check that can race with the lists (a ConfigMap created
//! between two lists) is confirmed on a later round before it counts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use sha2::{Digest, Sha256};

/// RSS above which the operator counts as leaking.
pub const RSS_LIMIT_KIB: u64 = 256 * 1024;
/// How long a suspected violation may last before it counts.
const GRACE: Duration = Duration::from_secs(10);
const MANAGED: &str = "app.kubernetes.io/managed-by=haltsql-operator";

#[derive(Default)]
struct State {
    /// Content hashes some policy reported Valid for its generation.
    valid: BTreeSet<String>,
    /// `haltsql validate`'s verdict on content never reported Valid, by hash.
    judged: HashMap<String, bool>,
    /// Highest observedGeneration seen, by uid.
    generations: HashMap<String, i64>,
    /// Suspected violations and when they were first seen.
    suspects: BTreeMap<String, Instant>,
    /// Confirmed violations (deduplicated).
    violations: BTreeSet<String>,
    rounds: u64,
    max_rss_kib: u64,
}

pub struct Checker {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The current operator process, for RSS (0: none running).
pub type OperatorPid = Arc<AtomicU32>;

impl Checker {
    pub fn start(client: kube::Client, namespace: &str, pid: OperatorPid) -> Checker {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let watch_valid = tokio::spawn({
            let policies: Api<HaltSQLPolicy> = Api::namespaced(client.clone(), namespace);
            let state = state.clone();
            let stop = stop.clone();
            async move {
                let mut events = watcher(policies, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while !stop.load(Ordering::SeqCst) {
                    let Ok(Some(Ok(policy))) =
                        tokio::time::timeout(Duration::from_millis(500), events.next()).await
                    else {
                        continue;
                    };
                    if let Some(hash) = valid_hash(&policy) {
                        state.lock().unwrap().valid.insert(hash);
                    }
                }
            }
        });
        let rounds = tokio::spawn({
            let state = state.clone();
            let stop = stop.clone();
            let namespace = namespace.to_owned();
            async move {
                while !stop.load(Ordering::SeqCst) {
                    // The API server may be down on purpose: skip the round.
                    let _ = round(&client, &namespace, &state, &pid).await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        });
        Checker {
            state,
            stop,
            tasks: vec![watch_valid, rounds],
        }
    }

    /// Stops checking; returns (rounds, violations, max RSS KiB), after
    /// confirming or dropping the suspects still open.
    pub async fn finish(self, client: &kube::Client, namespace: &str) -> Report {
        // One more full round so the last state is checked, then stop.
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            let _ = task.await;
        }
        let pid = Arc::new(AtomicU32::new(0));
        // Suspects still open: re-check until they clear or their grace ends.
        let deadline = Instant::now() + GRACE;
        loop {
            let _ = round(client, namespace, &self.state, &pid).await;
            let open = !self.state.lock().unwrap().suspects.is_empty();
            if !open || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let s = self.state.lock().unwrap();
        Report {
            rounds: s.rounds,
            violations: s.violations.iter().cloned().collect(),
            max_rss_kib: s.max_rss_kib,
        }
    }
}

pub struct Report {
    pub rounds: u64,
    pub violations: Vec<String>,
    pub max_rss_kib: u64,
}

fn valid_hash(policy: &HaltSQLPolicy) -> Option<String> {
    let status = policy.status.as_ref()?;
    let valid = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Valid" && c.status == "True")?;
    let generation = policy.metadata.generation?;
    let observed = valid.observed_generation.or(status.observed_generation)?;
    (observed == generation).then(|| status.content_hash.clone())?
}

/// Whether the real `haltsql validate` accepts `document`, run as the
/// operator runs it (sealed, empty environment, a private directory).
fn haltsql_accepts(document: &str) -> bool {
    let Ok(dir) = tempfile::tempdir() else {
        return false;
    };
    if std::fs::write(dir.path().join("policy.yaml"), document).is_err() {
        return false;
    }
    std::process::Command::new(haltsql_testkit::paths::haltsql_bin())
        .args([
            "validate",
            "--sealed",
            "--format",
            "json",
            "--",
            "policy.yaml",
        ])
        .env_clear()
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn instance(meta: &ObjectMeta) -> Option<String> {
    meta.labels
        .as_ref()?
        .get("app.kubernetes.io/instance")
        .cloned()
}

fn mounted_config_map(template: &PodTemplateSpec) -> Option<String> {
    template
        .spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find_map(|v| v.config_map.as_ref().map(|c| c.name.clone()))
}

async fn round(
    client: &kube::Client,
    ns: &str,
    state: &Mutex<State>,
    pid: &OperatorPid,
) -> Result<(), kube::Error> {
    let pid = pid.load(Ordering::SeqCst);
    if pid != 0
        && let Some(rss) = rss_kib(pid)
    {
        let mut s = state.lock().unwrap();
        s.max_rss_kib = s.max_rss_kib.max(rss);
        if rss > RSS_LIMIT_KIB {
            s.violations
                .insert(format!("operator RSS {rss} KiB over {RSS_LIMIT_KIB} KiB"));
        }
    }
    let lp = ListParams::default();
    let managed = ListParams::default().labels(MANAGED);
    // ReplicaSets and the Deployment before the ConfigMaps they name, so a
    // ConfigMap is never listed before the template that mounts it.
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&managed)
        .await?
        .items;
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&managed)
        .await?
        .items;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&managed)
        .await?
        .items;
    let servers = Api::<HaltSQLServer>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let policies = Api::<HaltSQLPolicy>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items;
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list_metadata(&managed)
        .await?
        .items;
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .list_metadata(&managed)
        .await?
        .items;
    let nps = Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        .list_metadata(&managed)
        .await?
        .items;

    let mut suspects: Vec<String> = Vec::new();
    let mut immediate: Vec<String> = Vec::new();
    let mut s = state.lock().unwrap();
    s.rounds += 1;
    // What the list shows Valid counts too: the watch above misses states
    // while the API server is down, and it may still be backing off when the
    // run ends. (Like the watch, this checks that content was reported
    // Valid, not that the report came before the rendering.)
    for policy in &policies {
        if let Some(hash) = valid_hash(policy) {
            s.valid.insert(hash);
        }
    }

    // 4. observedGeneration never goes back.
    for (kind, uid, observed) in servers
        .iter()
        .map(|o| {
            (
                "HaltSQLServer",
                o.metadata.uid.clone(),
                o.status.as_ref().and_then(|s| s.observed_generation),
            )
        })
        .chain(policies.iter().map(|o| {
            (
                "HaltSQLPolicy",
                o.metadata.uid.clone(),
                o.status.as_ref().and_then(|s| s.observed_generation),
            )
        }))
    {
        let (Some(uid), Some(observed)) = (uid, observed) else {
            continue;
        };
        let max = s.generations.entry(uid.clone()).or_insert(observed);
        if observed < *max {
            immediate.push(format!(
                "{kind} {uid}: observedGeneration went back from {max} to {observed}"
            ));
        }
        *max = (*max).max(observed);
    }

    // 2. Controller references to existing servers.
    let server_uids: BTreeSet<String> = servers
        .iter()
        .filter_map(|s| s.metadata.uid.clone())
        .collect();
    let owned_metas: Vec<(&str, &ObjectMeta)> = deployments
        .iter()
        .map(|o| ("Deployment", &o.metadata))
        .chain(config_maps.iter().map(|o| ("ConfigMap", &o.metadata)))
        .chain(services.iter().map(|o| ("Service", &o.metadata)))
        .chain(pdbs.iter().map(|o| ("PodDisruptionBudget", &o.metadata)))
        .chain(nps.iter().map(|o| ("NetworkPolicy", &o.metadata)))
        .collect();
    for (kind, meta) in &owned_metas {
        let controller = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "HaltSQLServer");
        let name = meta.name.clone().unwrap_or_default();
        match controller {
            None => immediate.push(format!("{kind} {name} has no controller reference")),
            // A server deleted a moment ago: the garbage collector follows.
            Some(o) if !server_uids.contains(&o.uid) => {
                suspects.push(format!("{kind} {name} is controlled by a missing server"))
            }
            Some(_) => {}
        }
    }

    // 3. One of each per server; ConfigMaps bounded by what is in use.
    let mut per_server: BTreeMap<(String, &str), usize> = BTreeMap::new();
    for (kind, meta) in &owned_metas {
        if let Some(i) = instance(meta) {
            *per_server.entry((i, kind)).or_default() += 1;
        }
    }
    for ((server, kind), n) in &per_server {
        if *kind != "ConfigMap" && *n > 1 {
            immediate.push(format!("{n} {kind}s for server {server}"));
        }
    }
    let mut in_use: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let templates = replica_sets
        .iter()
        .filter_map(|rs| {
            Some((
                instance(&rs.metadata)?,
                rs.spec.as_ref()?.template.as_ref()?,
            ))
        })
        .chain(
            deployments
                .iter()
                .filter_map(|d| Some((instance(&d.metadata)?, &d.spec.as_ref()?.template))),
        );
    let by_name: BTreeMap<&str, &ConfigMap> = config_maps
        .iter()
        .filter_map(|c| Some((c.metadata.name.as_deref()?, c)))
        .collect();
    for (server, template) in templates {
        let Some(name) = mounted_config_map(template) else {
            continue;
        };
        in_use
            .entry(server.clone())
            .or_default()
            .insert(name.clone());
        // 1. The mounted configuration exists and holds only valid content.
        match by_name.get(name.as_str()) {
            None => suspects.push(format!(
                "server {server}: a pod template mounts ConfigMap {name}, which does not exist"
            )),
            Some(cm) => {
                for (file, content) in cm.data.iter().flatten() {
                    if !file.starts_with("policy-") {
                        continue;
                    }
                    let hash = hex::encode(Sha256::digest(content.as_bytes()));
                    if !s.valid.contains(&hash)
                        && !*s
                            .judged
                            .entry(hash.clone())
                            .or_insert_with(|| haltsql_accepts(content))
                    {
                        suspects.push(format!(
                            "server {server}: ConfigMap {name} file {file} holds content never reported Valid ({})",
                            &hash[..12]
                        ));
                    }
                }
            }
        }
    }
    for ((server, kind), n) in &per_server {
        if *kind == "ConfigMap" {
            let used = in_use.get(server).map_or(0, BTreeSet::len);
            if *n > used + 1 {
                suspects.push(format!(
                    "server {server}: {n} ConfigMaps, {used} in use by its ReplicaSets and Deployment"
                ));
            }
        }
    }

    for v in immediate {
        s.violations.insert(v);
    }
    let now = Instant::now();
    let current: BTreeSet<String> = suspects.into_iter().collect();
    s.suspects.retain(|k, _| current.contains(k));
    for k in current {
        let since = *s.suspects.entry(k.clone()).or_insert(now);
        if now.duration_since(since) > GRACE {
            s.violations.insert(k);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::haltsql_accepts;
    use crate::workload;

    /// The checker's fallback verdict must itself fail closed: what haltsql
    /// rejects still counts against the operator.
    #[test]
    fn haltsql_accepts_a_valid_document_and_refuses_an_invalid_one() {
        assert!(haltsql_accepts(&workload::document(
            "agent-1",
            &["id"],
            None
        )));
        assert!(!haltsql_accepts(&workload::invalid_document("agent-1")));
        assert!(!haltsql_accepts("not: [a policy"));
    }
}
