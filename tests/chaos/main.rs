//! The fault suite (issue 20): the real operator binary, started as the
//! manager tests start it, against the `chaos` local cluster
//! (`hack/cluster.sh up chaos`: like `full`, with kwok, an audit log and
//! frequent etcd compaction), through a loopback proxy of ours. Each scenario
//! injects faults while a background checker verifies the invariants
//! (checker.rs), then waits for the state the final specs call for and
//! prints a table.
//!
//! `make test` runs the short form (a few runs of each scenario);
//! `make chaos` (`HALTSQL_CHAOS=full`) the full one. `HALTSQL_CHAOS_SEED`
//! repeats a run's random choices.

// The integration tests' typed objects; the fault suite needs a few of them.
#[path = "../integration/support/objects.rs"]
#[allow(dead_code)]
mod objects;

mod checker;
mod proxy;
mod workload;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLServer};
use haltsql_testkit::identity::write_impersonating_kubeconfig;
use haltsql_testkit::launcher::{OperatorProcess, Options};
use haltsql_testkit::prometheus::Metrics;
use haltsql_testkit::{Cluster, TestNamespace};
use kube::api::Api;
use workload::{Fingerprint, Workload};

/// Generous bound for convergence after a fault (the figures are printed;
/// this only catches a system that never converges).
const CONVERGE: Duration = Duration::from_secs(180);

fn full_form() -> bool {
    std::env::var("HALTSQL_CHAOS").is_ok_and(|v| v == "full")
}

/// `HALTSQL_CHAOS_ONLY=kills,writers,...` runs only those scenarios (for
/// debugging one); unset runs all of the form.
fn selected(scenario: &str) -> bool {
    std::env::var("HALTSQL_CHAOS_ONLY").map_or(true, |only| only.split(',').any(|s| s == scenario))
}

/// Writes straight to the process's stderr, past the test harness's capture
/// (which takes `eprint!`), so `make test` shows the seed and the tables.
fn show(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// `HALTSQL_CHAOS_KEEP_LOGS=DIR` keeps every operator process's log there.
fn keep_log(pid: u32, log: &str) {
    if let Some(dir) = std::env::var_os("HALTSQL_CHAOS_KEEP_LOGS") {
        let _ = std::fs::write(PathBuf::from(dir).join(format!("operator-{pid}.log")), log);
    }
}

/// xorshift64*: reproducible random choices without a dependency.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("HALTSQL_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        show(&format!("chaos: HALTSQL_CHAOS_SEED={seed}\n"));
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The chaos cluster: the admin client (never proxied), its kubeconfig and
/// the API server's address.
struct Env {
    client: kube::Client,
    kubeconfig: PathBuf,
    api: SocketAddr,
}

impl Env {
    async fn new() -> Env {
        Cluster::Chaos.ensure_crds();
        let client = Cluster::Chaos.client().await;
        let kubeconfig = Cluster::Chaos.kubeconfig();
        let text = std::fs::read_to_string(&kubeconfig).unwrap();
        let server = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: https://"))
            .expect("the kubeconfig names an https server");
        Env {
            client,
            kubeconfig,
            api: server.parse().expect("server address"),
        }
    }

    /// A copy of the kubeconfig pointing at the proxy.
    fn proxied_kubeconfig(&self, dir: &Path, port: u16) -> PathBuf {
        let text = std::fs::read_to_string(&self.kubeconfig)
            .unwrap()
            .replace(&self.api.to_string(), &format!("127.0.0.1:{port}"));
        let path = dir.join("kubeconfig");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `hack/cluster.sh ARGS... ` for the chaos cluster.
    fn cluster_sh(&self, args: &[&str]) {
        haltsql_testkit::cluster::run_ok(
            Command::new(haltsql_testkit::paths::repo_root().join("hack/cluster.sh")).args(args),
        );
    }

    async fn namespace(&self, prefix: &str) -> TestNamespace {
        TestNamespace::new_in(&self.client, Cluster::Chaos, prefix).await
    }
}

/// The operator under test, restartable; the checker reads its pid.
struct Operator {
    options: Options,
    process: Option<OperatorProcess>,
    pid: checker::OperatorPid,
    /// Logs of the processes that ended (killed or stopped).
    logs: Vec<String>,
    kills: u32,
}

impl Operator {
    fn new(options: Options) -> Operator {
        Operator {
            options,
            process: None,
            pid: Arc::new(AtomicU32::new(0)),
            logs: Vec::new(),
            kills: 0,
        }
    }

    async fn start(&mut self) {
        let p = OperatorProcess::start(&self.options);
        self.pid.store(p.pid(), Ordering::SeqCst);
        p.wait_serving().await;
        self.process = Some(p);
    }

    fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.signal("KILL");
            p.wait_exit(Duration::from_secs(10))
                .expect("a SIGKILLed operator exits");
            self.pid.store(0, Ordering::SeqCst);
            keep_log(p.pid(), &p.logs());
            self.logs.push(p.logs());
            self.kills += 1;
        }
    }

    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            // Running state must be clean: the process must still be there.
            assert!(
                p.try_exit().is_none(),
                "the operator exited on its own:\n{}",
                p.logs()
            );
            p.signal("TERM");
            p.wait_exit(Duration::from_secs(30));
            self.pid.store(0, Ordering::SeqCst);
            keep_log(p.pid(), &p.logs());
            self.logs.push(p.logs());
        }
    }

    async fn writes(&self) -> f64 {
        match &self.process {
            Some(p) => p
                .metrics()
                .await
                .value("haltsql_operator_api_writes_total", &[]),
            None => 0.0,
        }
    }

    /// Panics in any log, and log lines matching `needle`.
    fn scan_logs(&self, needle: &str) -> (usize, usize) {
        let mut logs = self.logs.clone();
        if let Some(p) = &self.process {
            logs.push(p.logs());
        }
        let panics = logs.iter().map(|l| l.matches("panicked").count()).sum();
        let hits = logs
            .iter()
            .flat_map(|l| l.lines())
            .filter(|l| l.contains(needle))
            .count();
        (panics, hits)
    }
}

/// One row of a scenario's table.
#[derive(Default)]
struct Row {
    runs: u32,
    faults: u32,
    converge: Vec<Duration>,
    /// Requests (connection attempts) or writes during the outage, as the
    /// scenario defines it.
    outage: Vec<String>,
    violations: Vec<String>,
    notes: Vec<String>,
}

fn percentile(samples: &[Duration], p: f64) -> String {
    if samples.is_empty() {
        return "-".to_owned();
    }
    let mut s = samples.to_vec();
    s.sort();
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    format!("{:.1} s", s[rank.clamp(1, s.len()) - 1].as_secs_f64())
}

fn print_table(name: &str, row: &Row) {
    let mut out = String::new();
    out.push_str(&format!("\n== chaos scenario: {name}\n"));
    out.push_str(
        "| runs | faults injected | converge after fault p50 | p99 | during the outage | invariant violations |\n",
    );
    out.push_str("|---|---|---|---|---|---|\n");
    out.push_str(&format!(
        "| {} | {} | {} | {} | {} | {} |\n",
        row.runs,
        row.faults,
        percentile(&row.converge, 50.0),
        percentile(&row.converge, 99.0),
        if row.outage.is_empty() {
            "-".to_owned()
        } else {
            row.outage.join("; ")
        },
        row.violations.len()
    ));
    for v in &row.violations {
        out.push_str(&format!("  violation: {v}\n"));
    }
    for n in &row.notes {
        out.push_str(&format!("  {n}\n"));
    }
    show(&out);
}

async fn wait_converged(w: &Workload, client: &kube::Client) -> Fingerprint {
    haltsql_testkit::eventually("convergence to the final specs", CONVERGE, || async {
        w.converged(client).await
    })
    .await
}

fn operator_options(ns: &str, kubeconfig: PathBuf, tmp: &Path) -> Options {
    let mut options = Options::new(PathBuf::from(env!("CARGO_BIN_EXE_haltsql-operator")), &[ns]);
    options.kubeconfig = kubeconfig;
    options.rust_log =
        std::env::var("HALTSQL_TEST_OPERATOR_LOG").unwrap_or_else(|_| "info".to_owned());
    options
        .env
        .push(("TMPDIR".to_owned(), tmp.display().to_string()));
    options
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

// ---- scenario 1: SIGKILL at random points ---------------------------------

#[derive(Clone, Copy, Debug)]
enum Phase {
    ColdStart,
    Rollout,
    EditStorm,
}

/// One run; `kill` false is the unkilled baseline.
async fn kill_run(
    env: &Env,
    rng: &mut Rng,
    phase: Phase,
    kill: bool,
    row: &mut Row,
) -> Fingerprint {
    let ns = env.namespace("chaos-kill").await;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut op = Operator::new(operator_options(&ns.name, env.kubeconfig.clone(), &tmp));
    let check = checker::Checker::start(env.client.clone(), &ns.name, op.pid.clone());
    let mut w = Workload::standard(&ns.name);
    let c = &env.client;

    op.start().await;
    match phase {
        Phase::ColdStart => {
            w.create(c).await;
            if kill {
                tokio::time::sleep(Duration::from_millis(rng.below(2500))).await;
                op.kill();
            }
        }
        Phase::Rollout => {
            w.create(c).await;
            wait_converged(&w, c).await;
            w.edit(
                c,
                "orders",
                workload::document("orders-agent", &["id", "status", "total_cents"], None),
            )
            .await;
            if kill {
                tokio::time::sleep(Duration::from_millis(rng.below(2000))).await;
                op.kill();
            }
        }
        Phase::EditStorm => {
            w.create(c).await;
            wait_converged(&w, c).await;
            let edits = 16;
            let kill_at = rng.below(edits);
            let names = ["orders", "p1", "p2"];
            let columns: [&[&str]; 3] = [&["id"], &["id", "status"], &["id", "total_cents"]];
            for i in 0..edits {
                let policy = names[rng.below(3) as usize];
                let doc_name = match policy {
                    "orders" => "orders-agent",
                    "p1" => "agent-1",
                    _ => "agent-2",
                };
                // A quarter of the edits are invalid; the last one per
                // policy (below) is valid.
                let doc = if rng.below(4) == 0 {
                    workload::invalid_document(doc_name)
                } else {
                    workload::document(doc_name, columns[rng.below(3) as usize], None)
                };
                w.edit(c, policy, doc).await;
                if kill && i == kill_at {
                    op.kill();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for (policy, doc_name) in [
                ("orders", "orders-agent"),
                ("p1", "agent-1"),
                ("p2", "agent-2"),
            ] {
                w.edit(
                    c,
                    policy,
                    workload::document(doc_name, &["id", "status", "total_cents"], Some("final")),
                )
                .await;
            }
        }
    }
    // Restarted at once, as a Deployment would (without its backoff).
    let restarted = Instant::now();
    if kill {
        op.start().await;
    }
    let fingerprint = wait_converged(&w, c).await;
    if kill {
        row.converge.push(restarted.elapsed());
        row.outage.push(format!("{:.0}", op.writes().await));
    }
    let (panics, _) = op.scan_logs("");
    // The invariants are confirmed while the operator still runs: the
    // Deployment controller cleans up old ReplicaSets after the rollout, and
    // their ConfigMaps must follow.
    let report = check.finish(c, &ns.name).await;
    op.stop();
    row.runs += 1;
    if kill {
        row.faults += 1;
    }
    if panics > 0 {
        row.violations
            .push(format!("{panics} panics in the operator logs ({phase:?})"));
    }
    // A kill in the middle of a validation leaves its private directory;
    // the restarted operator removes it.
    let left = entries(&tmp);
    if left > 0 {
        row.violations.push(format!(
            "{phase:?}: {left} validator temp dirs left after the restart"
        ));
    }
    row.violations.extend(
        report
            .violations
            .into_iter()
            .map(|v| format!("{phase:?}: {v}")),
    );
    row.notes.push(format!(
        "{phase:?}{}: {} checker rounds, max RSS {} KiB, validator temp dirs left {}",
        if kill { " killed" } else { " baseline" },
        report.rounds,
        report.max_rss_kib,
        entries(&tmp)
    ));
    fingerprint
}

async fn scenario_kills(env: &Env, rng: &mut Rng, runs: u32) -> Row {
    let mut row = Row::default();
    let phases = [Phase::ColdStart, Phase::Rollout, Phase::EditStorm];
    let mut baselines = Vec::new();
    for phase in phases {
        baselines.push(kill_run(env, rng, phase, false, &mut row).await);
    }
    for i in 0..runs {
        let phase = phases[(i as usize) % phases.len()];
        let fp = kill_run(env, rng, phase, true, &mut row).await;
        let baseline = &baselines[(i as usize) % phases.len()];
        if &fp != baseline {
            row.violations.push(format!(
                "{phase:?} run {i}: converged to {fp:?}, the unkilled run to {baseline:?}"
            ));
        }
    }
    row.notes.insert(
        0,
        "converge: from the new process started right after the SIGKILL to the final state; outage column: API writes the restarted operator made to get there".to_owned(),
    );
    row
}

// ---- scenario 2: leader failover with two replicas under load -------------

/// A kubeconfig whose user impersonates `user` (with the admin's group), so
/// the API server's audit log names the replica behind every write.
fn impersonating_kubeconfig(env: &Env, dir: &Path, user: &str) -> PathBuf {
    let path = dir.join(format!("kubeconfig-{user}"));
    write_impersonating_kubeconfig(&env.kubeconfig, user, &["system:masters"], &path)
        .unwrap_or_else(|e| panic!("impersonating kubeconfig: {e}"));
    path
}

/// Writes to `ns` in the audit log: (time, impersonated user), in order.
fn audited_writes(ns: &str, users_prefix: &str) -> Vec<(String, String)> {
    let log = Cluster::Chaos
        .kubeconfig()
        .parent()
        .unwrap()
        .join("logs/audit.log");
    let text = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("the chaos cluster's audit log {}: {e}", log.display()));
    let mut writes: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == ns)
        .filter_map(|e| {
            let user = e["impersonatedUser"]["username"].as_str()?;
            if !user.starts_with(users_prefix) {
                return None;
            }
            let at = e["requestReceivedTimestamp"].as_str()?.to_owned();
            Some((at, user.to_owned()))
        })
        .collect();
    // RFC 3339 with fixed precision sorts as text.
    writes.sort();
    writes
}

async fn leader_of(ops: &[Operator]) -> Option<usize> {
    let mut leaders = Vec::new();
    for (i, o) in ops.iter().enumerate() {
        let Some(p) = &o.process else { continue };
        if let Some(text) = p.metrics_text().await
            && Metrics(text).value("haltsql_operator_leader", &[]) == 1.0
        {
            leaders.push(i);
        }
    }
    (leaders.len() == 1).then(|| leaders[0])
}

async fn failover_run(env: &Env, rng: &mut Rng, row: &mut Row) {
    let ns = env.namespace("chaos-leader").await;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let c = &env.client;
    let prefix = format!("chaos-replica-{}-", std::process::id());
    let mut incarnation = 0;
    let options = |incarnation: u32| {
        let user = format!("{prefix}{incarnation}");
        let mut o = operator_options(
            &ns.name,
            impersonating_kubeconfig(env, dir.path(), &user),
            &tmp,
        );
        o.leader_election_namespace = Some(ns.name.clone());
        o
    };
    let mut ops = vec![Operator::new(options(0)), Operator::new(options(1))];
    incarnation += 2;
    for op in ops.iter_mut() {
        op.start().await;
    }
    let check = checker::Checker::start(c.clone(), &ns.name, ops[0].pid.clone());
    let mut w = Workload::standard(&ns.name);
    w.create(c).await;
    wait_converged(&w, c).await;

    let columns: [&[&str]; 3] = [&["id"], &["id", "status"], &["id", "total_cents"]];
    let mut takeovers = Vec::new();
    for failover in 0..2 {
        let leader =
            haltsql_testkit::eventually("exactly one leader", CONVERGE, || leader_of(&ops)).await;
        // Load: edits before and after the leader dies.
        for i in 0..4 {
            let (policy, doc_name) = [
                ("orders", "orders-agent"),
                ("p1", "agent-1"),
                ("p2", "agent-2"),
            ][(i + failover) % 3];
            w.edit(
                c,
                policy,
                workload::document(doc_name, columns[rng.below(3) as usize], None),
            )
            .await;
            if i == 1 {
                ops[leader].kill();
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let killed_at = Instant::now();
        let standby = 1 - leader;
        haltsql_testkit::eventually("the standby takes over", CONVERGE, || async {
            (leader_of(&ops).await == Some(standby)).then_some(())
        })
        .await;
        takeovers.push(killed_at.elapsed());
        wait_converged(&w, c).await;
        row.converge.push(killed_at.elapsed());
        row.faults += 1;
        // The killed replica comes back, as a Deployment restarts it.
        ops[leader] = Operator::new(options(incarnation));
        incarnation += 1;
        ops[leader].start().await;
    }
    let report = check.finish(c, &ns.name).await;
    let mut panics = 0;
    for op in ops.iter_mut() {
        panics += op.scan_logs("").0;
        op.stop();
    }

    // Two leaders never wrote at once: the writes of each replica
    // incarnation form an interval, and no two intervals overlap.
    let writes = audited_writes(&ns.name, &prefix);
    let mut spans: BTreeMap<String, (String, String, usize)> = BTreeMap::new();
    for (at, user) in &writes {
        let e = spans
            .entry(user.clone())
            .or_insert_with(|| (at.clone(), at.clone(), 0));
        e.1 = at.clone();
        e.2 += 1;
    }
    let mut ordered: Vec<(&String, &(String, String, usize))> = spans.iter().collect();
    ordered.sort_by(|a, b| a.1.0.cmp(&b.1.0));
    for pair in ordered.windows(2) {
        let ((a, (_, a_end, _)), (b, (b_start, _, _))) = (pair[0], pair[1]);
        if a_end >= b_start {
            row.violations.push(format!(
                "replicas {a} and {b} both wrote between {b_start} and {a_end}"
            ));
        }
    }
    if writes.is_empty() {
        row.violations
            .push("no write of the replicas found in the audit log".to_owned());
    }
    row.runs += 1;
    if panics > 0 {
        row.violations
            .push(format!("{panics} panics in the operator logs"));
    }
    row.violations.extend(report.violations);
    let takeover: Vec<String> = takeovers
        .iter()
        .map(|t| format!("{:.1} s", t.as_secs_f64()))
        .collect();
    row.outage.push(format!("takeover {}", takeover.join(", ")));
    row.notes.push(format!(
        "audit log: {} writes by {} replica incarnations, in {} disjoint spans; lease {} s; {} checker rounds",
        writes.len(),
        spans.len(),
        ordered.len(),
        haltsql_operator::manager::leader::LEASE_DURATION_SECONDS,
        report.rounds
    ));
}

// ---- scenario 5: conflicting writers --------------------------------------

async fn writers_run(env: &Env, rng: &mut Rng, row: &mut Row) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    use kube::api::{Patch, PatchParams, PostParams};

    let ns = env.namespace("chaos-writers").await;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let c = &env.client;
    let mut op = Operator::new(operator_options(&ns.name, env.kubeconfig.clone(), &tmp));
    let check = checker::Checker::start(c.clone(), &ns.name, op.pid.clone());
    let mut w = Workload::standard(&ns.name);
    op.start().await;
    w.create(c).await;
    wait_converged(&w, c).await;

    // Someone else's objects, with names near the operator's.
    let config_maps: Api<ConfigMap> = Api::namespaced(c.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(c.clone(), &ns.name);
    let foreign_cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hs-a-haltsql-config"}, "data": {"k": "v"}}))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &foreign_cm)
        .await
        .unwrap();
    let foreign_svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hs-a-other"}, "spec": {"ports": [{"port": 80}]}}))
    .unwrap();
    services
        .create(&PostParams::default(), &foreign_svc)
        .await
        .unwrap();
    let foreign_versions = (
        config_maps
            .get("hs-a-haltsql-config")
            .await
            .unwrap()
            .metadata
            .resource_version,
        services
            .get("hs-a-other")
            .await
            .unwrap()
            .metadata
            .resource_version,
    );
    let writes_before = op.writes().await;

    // Writer 1 (spawned): the servers' metadata and replicas.
    let servers: Api<HaltSQLServer> = Api::namespaced(c.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), &ns.name);
    let mut seed = rng.next();
    let server_writer = tokio::spawn({
        let servers = servers.clone();
        async move {
            let mut n = 0;
            for i in 0..80u64 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let replicas = 1 + (seed >> 33) % 3;
                let patch = serde_json::json!({
                    "metadata": {"annotations": {"chaos/touch": i.to_string()}},
                    "spec": {"replicas": replicas}});
                if servers
                    .patch("hs-a", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    n += 1;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            n
        }
    });
    // Writer 2 (spawned): the owned objects, by hand: an annotation on the
    // Deployment and Service of hs-b (fields the operator does not set), and
    // the Service of hs-a deleted now and then.
    let owned_writer = tokio::spawn({
        let deployments = deployments.clone();
        let services = services.clone();
        async move {
            let mut n = 0;
            let params = PatchParams::apply("chaos-hand-editor").force();
            for i in 0..80u64 {
                let patch = serde_json::json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "hs-b", "annotations": {"chaos/by-hand": i.to_string()}}});
                if services
                    .patch("hs-b", &params, &Patch::Apply(&patch))
                    .await
                    .is_ok()
                {
                    n += 1;
                }
                let patch = serde_json::json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "hs-b", "annotations": {"chaos/by-hand": i.to_string()}}});
                if deployments
                    .patch("hs-b", &params, &Patch::Apply(&patch))
                    .await
                    .is_ok()
                {
                    n += 1;
                }
                if i % 20 == 10 && services.delete("hs-a", &Default::default()).await.is_ok() {
                    n += 1;
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            n
        }
    });
    // Writer 3 (here): the policies.
    let columns: [&[&str]; 3] = [&["id"], &["id", "status"], &["id", "total_cents"]];
    let mut policy_writes = 0;
    for i in 0..80usize {
        let (policy, doc_name) = [
            ("orders", "orders-agent"),
            ("p1", "agent-1"),
            ("p2", "agent-2"),
        ][i % 3];
        w.edit(
            c,
            policy,
            workload::document(doc_name, columns[rng.below(3) as usize], None),
        )
        .await;
        policy_writes += 1;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let server_writes = server_writer.await.unwrap();
    let owned_writes = owned_writer.await.unwrap();
    let done = Instant::now();
    wait_converged(&w, c).await;
    // No lost update: the last replica count the writer set is the Deployment's.
    let final_replicas =
        haltsql_testkit::eventually("the last replica count applied", CONVERGE, || async {
            let want = servers.get("hs-a").await.ok()?.spec.replicas;
            let have = deployments.get("hs-a").await.ok()?.spec?.replicas;
            (want.is_some() && want == have).then_some(want)
        })
        .await;
    haltsql_testkit::eventually("the deleted Service re-created", CONVERGE, || async {
        services.get_opt("hs-a").await.ok()?.map(|_| ())
    })
    .await;
    row.converge.push(done.elapsed());

    // Manual edits of fields the operator does not set stay; foreign objects
    // are untouched.
    for (kind, annotations) in [
        (
            "Service",
            services.get("hs-b").await.unwrap().metadata.annotations,
        ),
        (
            "Deployment",
            deployments.get("hs-b").await.unwrap().metadata.annotations,
        ),
    ] {
        let value = annotations
            .unwrap_or_default()
            .get("chaos/by-hand")
            .cloned();
        if value.as_deref() != Some("79") {
            row.violations.push(format!(
                "the manual annotation on {kind} hs-b is {value:?}, not \"79\""
            ));
        }
    }
    let after = (
        config_maps
            .get("hs-a-haltsql-config")
            .await
            .unwrap()
            .metadata
            .resource_version,
        services
            .get("hs-a-other")
            .await
            .unwrap()
            .metadata
            .resource_version,
    );
    if after != foreign_versions {
        row.violations
            .push("a foreign object was written".to_owned());
    }
    let metrics = match &op.process {
        Some(p) => Some(p.metrics().await),
        None => None,
    };
    let conflicts = metrics.as_ref().map_or(0.0, |m| {
        m.value(
            "haltsql_operator_reconciles_total",
            &[("result", "conflict")],
        )
    });
    let operator_writes = op.writes().await - writes_before;
    let (panics, _) = op.scan_logs("");
    // The invariants are confirmed while the operator still runs: the
    // Deployment controller cleans up old ReplicaSets after the rollout, and
    // their ConfigMaps must follow.
    let report = check.finish(c, &ns.name).await;
    op.stop();
    row.runs += 1;
    row.faults += (policy_writes + server_writes + owned_writes) as u32;
    if panics > 0 {
        row.violations
            .push(format!("{panics} panics in the operator log"));
    }
    row.violations.extend(report.violations);
    row.outage.push(format!(
        "{} foreign writes, {operator_writes:.0} operator writes, {conflicts:.0} reconciles ended in 409",
        policy_writes + server_writes + owned_writes
    ));
    row.notes.push(format!(
        "converge: from the last foreign write to the final state (replicas {:?}); {} checker rounds, max RSS {} KiB",
        final_replicas, report.rounds, report.max_rss_kib
    ));
}

// ---- scenario 3: API server and etcd restarted during a rollout -----------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Restart {
    ApiServer,
    Etcd,
}

async fn restart_run(env: &Env, which: Restart, row: &mut Row) {
    let ns = env.namespace("chaos-restart").await;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let proxy = proxy::Proxy::start(env.api).await;
    let kubeconfig = env.proxied_kubeconfig(dir.path(), proxy.port);
    let mut op = Operator::new(operator_options(&ns.name, kubeconfig, &tmp));
    let check = checker::Checker::start(env.client.clone(), &ns.name, op.pid.clone());
    let mut w = Workload::standard(&ns.name);
    let c = &env.client;
    op.start().await;
    w.create(c).await;
    wait_converged(&w, c).await;

    // A rollout starts, then the component goes down for a while.
    w.edit(
        c,
        "orders",
        workload::document("orders-agent", &["id", "status", "total_cents"], None),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (component, signal) = match which {
        Restart::ApiServer => ("kube-apiserver", "KILL"),
        Restart::Etcd => ("etcd", "TERM"),
    };
    let before = proxy.accepted();
    let down_at = Instant::now();
    env.cluster_sh(&["stop", "chaos", component, signal]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    env.cluster_sh(&["up", "chaos"]);
    let outage = down_at.elapsed();
    let attempts = proxy.accepted() - before;
    let back = Instant::now();
    // A change made right after the outage must arrive through the resumed watches.
    w.edit(
        c,
        "p1",
        workload::document("agent-1", &["id", "status"], None),
    )
    .await;
    wait_converged(&w, c).await;
    row.converge.push(back.elapsed());
    let rate = attempts as f64 / outage.as_secs_f64();
    row.outage.push(format!(
        "{attempts} connections in {:.0} s ({rate:.1}/s)",
        outage.as_secs_f64()
    ));
    // Backoff: with the API server unreachable the operator's retries stay
    // far below a tight loop (hundreds per second).
    if which == Restart::ApiServer && rate > 20.0 {
        row.violations.push(format!(
            "{rate:.1} connection attempts per second while the API server was down"
        ));
    }
    let (panics, gone) = op.scan_logs("too old resource version");
    // The invariants are confirmed while the operator still runs: the
    // Deployment controller cleans up old ReplicaSets after the rollout, and
    // their ConfigMaps must follow.
    let report = check.finish(c, &ns.name).await;
    op.stop();
    row.runs += 1;
    row.faults += 1;
    if panics > 0 {
        row.violations
            .push(format!("{panics} panics in the operator log"));
    }
    row.violations.extend(report.violations);
    row.notes.push(format!(
        "{which:?}: outage {:.1} s, {gone} log lines about 410 Gone (watch relisted), {} checker rounds, max RSS {} KiB",
        outage.as_secs_f64(),
        report.rounds,
        report.max_rss_kib
    ));
}

// ---- scenario 4: the API server slow, connections dropped ------------------

async fn slow_run(env: &Env, rng: &mut Rng, row: &mut Row) {
    let ns = env.namespace("chaos-slow").await;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let proxy = proxy::Proxy::start(env.api).await;
    let kubeconfig = env.proxied_kubeconfig(dir.path(), proxy.port);
    let mut op = Operator::new(operator_options(&ns.name, kubeconfig, &tmp));
    let check = checker::Checker::start(env.client.clone(), &ns.name, op.pid.clone());
    let mut w = Workload::standard(&ns.name);
    let c = &env.client;
    op.start().await;
    w.create(c).await;
    wait_converged(&w, c).await;

    // 200 ms on every chunk both ways, and every open connection (watches
    // included) cut each second, while the policies change.
    proxy.set_latency(Duration::from_millis(200));
    let before = proxy.accepted();
    let started = Instant::now();
    let columns: [&[&str]; 3] = [&["id"], &["id", "status"], &["id", "total_cents"]];
    for i in 0..6 {
        let (policy, doc_name) = [
            ("orders", "orders-agent"),
            ("p1", "agent-1"),
            ("p2", "agent-2"),
        ][i % 3];
        w.edit(
            c,
            policy,
            workload::document(doc_name, columns[rng.below(3) as usize], None),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if i % 2 == 1 {
            proxy.cut_all();
        }
    }
    // Still slow, no more cuts: it must converge like this.
    let fault_end = Instant::now();
    wait_converged(&w, c).await;
    row.converge.push(fault_end.elapsed());
    proxy.set_latency(Duration::ZERO);
    let connections = proxy.accepted() - before;
    row.outage.push(format!(
        "{connections} connections in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    let (panics, _) = op.scan_logs("");
    // The invariants are confirmed while the operator still runs: the
    // Deployment controller cleans up old ReplicaSets after the rollout, and
    // their ConfigMaps must follow.
    let report = check.finish(c, &ns.name).await;
    op.stop();
    row.runs += 1;
    row.faults += 3;
    if panics > 0 {
        row.violations
            .push(format!("{panics} panics in the operator log"));
    }
    row.violations.extend(report.violations);
    row.notes.push(format!(
        "converge: from the last cut, with 200 ms added per chunk, to the final state; {} checker rounds, max RSS {} KiB",
        report.rounds, report.max_rss_kib
    ));
}

// ---- scenario 4b: the API server refusing (500 and 429 answers) -----------

/// The ServiceAccount the refused operator runs as: API Priority and Fairness
/// classifies requests by the authenticated user (impersonation does not
/// change it, and the admin's `system:masters` is exempt).
const REFUSED_ACCOUNT: &str = "haltsql-operator-refused";

/// The ServiceAccount whose requests hold the refused priority level's one
/// seat (a priority level without shares still runs one request at a time).
const SEAT_HOLDER: &str = "haltsql-chaos-seat-holder";

/// Writes to `out` a copy of the kubeconfig `source` that authenticates with `token`.
fn token_kubeconfig(source: &Path, out: PathBuf, token: &str) -> PathBuf {
    let text = std::fs::read_to_string(source).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    for entry in config["users"].as_sequence_mut().unwrap() {
        entry["user"] = serde_yaml::from_str(&format!("token: {token}")).unwrap();
    }
    std::fs::write(&out, serde_yaml::to_string(&config).unwrap()).unwrap();
    out
}

async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Deletes the cluster-scoped objects a run made, whatever happened.
struct ClusterScoped(Vec<(&'static str, String)>);

impl Drop for ClusterScoped {
    fn drop(&mut self) {
        for (kind, name) in &self.0 {
            let _ = Cluster::Chaos
                .kubectl()
                .args(["delete", kind, name, "--ignore-not-found", "--wait=false"])
                .output();
        }
    }
}

/// Sum of the API server's metric `name` over the series whose labels
/// contain `label` (its /metrics, read with the admin client).
async fn apiserver_metric(client: &kube::Client, name: &str, label: &str) -> f64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn apply_json<K>(api: &Api<K>, name: &str, object: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let params = kube::api::PatchParams::apply("haltsql-chaos").force();
    api.patch(name, &params, &kube::api::Patch::Apply(&object))
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

async fn server_reasons(client: &kube::Client, ns: &str) -> Vec<String> {
    let servers: Api<HaltSQLServer> = Api::namespaced(client.clone(), ns);
    let Ok(list) = servers.list(&Default::default()).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter_map(|s| {
            let status = s.status.as_ref()?;
            let (st, reason) =
                haltsql_testkit::status::condition(&status.conditions, "ConfigRendered")?;
            Some(format!("{st}/{reason}"))
        })
        .collect()
}

/// An admission webhook nobody answers (failurePolicy Fail) makes the API
/// server answer 500 to every write of the namespace's ConfigMaps and
/// Deployments; then a priority level with no seats (API Priority and
/// Fairness, limitResponse Reject) makes it answer 429 to every request of
/// the operator's ServiceAccount. Each lasts 20 s during a rollout.
async fn refused_run(env: &Env, row: &mut Row) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;

    let ns = env.namespace("chaos-refused").await;
    let c = &env.client;
    let binding = format!("haltsql-chaos-refused-{}", ns.name);
    let webhook = format!("haltsql-chaos-refuse-{}", ns.name);
    let level = webhook.clone();
    let _cleanup = ClusterScoped(vec![
        ("clusterrolebinding", binding.clone()),
        ("validatingwebhookconfiguration", webhook.clone()),
        ("flowschema", level.clone()),
        ("flowschema", format!("{level}-holder")),
        ("prioritylevelconfiguration", level.clone()),
    ]);
    let accounts: Api<ServiceAccount> = Api::namespaced(c.clone(), &ns.name);
    for account in [REFUSED_ACCOUNT, SEAT_HOLDER] {
        accounts
            .create(
                &Default::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": account}}))
                    .unwrap(),
            )
            .await
            .unwrap();
    }
    apply_json(
        &Api::<ClusterRoleBinding>::all(c.clone()),
        &binding,
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": REFUSED_ACCOUNT, "namespace": ns.name},
                         {"kind": "ServiceAccount", "name": SEAT_HOLDER, "namespace": ns.name}]
        }),
    )
    .await;
    let token = |account: &'static str| {
        let accounts = accounts.clone();
        async move {
            accounts
                .create_token_request(
                    account,
                    &Default::default(),
                    &serde_json::from_value(
                        serde_json::json!({"spec": {"expirationSeconds": 3600}}),
                    )
                    .unwrap(),
                )
                .await
                .unwrap()
                .status
                .and_then(|s| s.token)
                .expect("the API server issues a token")
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let proxy = proxy::Proxy::start(env.api).await;
    let proxied = env.proxied_kubeconfig(dir.path(), proxy.port);
    let kubeconfig = token_kubeconfig(
        &proxied,
        dir.path().join("kubeconfig-operator"),
        &token(REFUSED_ACCOUNT).await,
    );
    let holder_kubeconfig = token_kubeconfig(
        &env.kubeconfig,
        dir.path().join("kubeconfig-holder"),
        &token(SEAT_HOLDER).await,
    );
    let mut op = Operator::new(operator_options(&ns.name, kubeconfig, &tmp));
    let check = checker::Checker::start(c.clone(), &ns.name, op.pid.clone());
    let mut w = Workload::standard(&ns.name);
    op.start().await;
    w.create(c).await;
    wait_converged(&w, c).await;
    let hold = Duration::from_secs(20);

    // 500: every write of a ConfigMap or Deployment in the namespace fails.
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(c.clone());
    apply_json(
        &webhooks,
        &webhook,
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": webhook},
            "webhooks": [{
                "name": "refuse.chaos.haltsql.dev",
                // Port 1 on loopback: nothing listens, the call fails at once.
                "clientConfig": {"url": "https://127.0.0.1:1/refuse"},
                "rules": [{"apiGroups": ["", "apps"], "apiVersions": ["v1"],
                           "operations": ["CREATE", "UPDATE", "DELETE"],
                           "resources": ["configmaps", "deployments"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}},
                "failurePolicy": "Fail", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "timeoutSeconds": 2
            }]
        }),
    )
    .await;
    // The metric names the webhook, not its configuration.
    let webhook_label = "name=\"refuse.chaos.haltsql.dev\"";
    let refused_before = apiserver_metric(
        c,
        "apiserver_admission_webhook_rejection_count",
        webhook_label,
    )
    .await;
    let started = Instant::now();
    w.edit(
        c,
        "orders",
        workload::document("orders-agent", &["id", "status", "total_cents"], None),
    )
    .await;
    // The refusal lasts: both servers must say so in ConfigRendered.
    haltsql_testkit::eventually("ConfigRendered=False/ApplyFailed", CONVERGE, || async {
        let reasons = server_reasons(c, &ns.name).await;
        (reasons.len() == 2 && reasons.iter().all(|r| r == "False/ApplyFailed")).then_some(())
    })
    .await;
    let reported_after = started.elapsed();
    tokio::time::sleep(hold.saturating_sub(started.elapsed())).await;
    let refused = apiserver_metric(
        c,
        "apiserver_admission_webhook_rejection_count",
        webhook_label,
    )
    .await
        - refused_before;
    let outage = started.elapsed();
    webhooks
        .delete(&webhook, &Default::default())
        .await
        .unwrap();
    let back = Instant::now();
    wait_converged(&w, c).await;
    row.converge.push(back.elapsed());
    let rate = refused / outage.as_secs_f64();
    row.outage.push(format!(
        "500: {refused:.0} refused writes in {:.0} s ({rate:.1}/s)",
        outage.as_secs_f64()
    ));
    // Backoff per server (1 s doubling): a handful of writes, not a loop.
    if rate > 2.0 {
        row.violations.push(format!(
            "{rate:.1} writes per second while the API server answered 500"
        ));
    }
    row.notes.push(format!(
        "500: ConfigRendered=False/ApplyFailed on both servers {:.1} s after the edit",
        reported_after.as_secs_f64()
    ));

    // 429: the operator's ServiceAccount gets a priority level without
    // shares (flow control still runs one request of it at a time) that
    // rejects rather than queues, and the seat holder keeps that one seat
    // busy with creates a webhook holds for 30 s (its address accepts TCP
    // connections and never answers).
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hanging_port = hanging.local_addr().unwrap().port();
    apply_json(
        &webhooks,
        &webhook,
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": webhook},
            "webhooks": [{
                "name": "hold.chaos.haltsql.dev",
                "clientConfig": {"url": format!("https://127.0.0.1:{hanging_port}/hold")},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["configmaps"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}},
                "objectSelector": {"matchLabels": {"haltsql.dev/chaos-seat-holder": "true"}},
                "failurePolicy": "Fail", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "timeoutSeconds": 30
            }]
        }),
    )
    .await;
    let levels: Api<PriorityLevelConfiguration> = Api::all(c.clone());
    let schemas: Api<FlowSchema> = Api::all(c.clone());
    apply_json(
        &levels,
        &level,
        serde_json::json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
            "metadata": {"name": level},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"}
            }}
        }),
    )
    .await;
    // One flow schema per account, so the metrics tell the operator's
    // rejections from the seat holder's.
    let holder_schema = format!("{level}-holder");
    for (schema, account) in [(&level, REFUSED_ACCOUNT), (&holder_schema, SEAT_HOLDER)] {
        apply_json(
            &schemas,
            schema,
            serde_json::json!({
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                "metadata": {"name": schema},
                "spec": {
                    "priorityLevelConfiguration": {"name": level},
                    "matchingPrecedence": 100,
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [{
                        "subjects": [{"kind": "ServiceAccount",
                                      "serviceAccount": {"name": account, "namespace": ns.name}}],
                        "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                           "namespaces": ["*"], "clusterScope": true}],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
                    }]
                }
            }),
        )
        .await;
    }
    // Two loops: one holds the seat, the other, refused, shows it is held.
    let holder_client = client_from(&holder_kubeconfig).await;
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let config_maps: Api<ConfigMap> = Api::namespaced(holder_client.clone(), &ns.name);
            tokio::spawn(async move {
                let held: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {
                    "generateName": "seat-", "labels": {"haltsql.dev/chaos-seat-holder": "true"}}}))
                .unwrap();
                loop {
                    // Held 30 s by the webhook, or refused at once while the
                    // seat is busy (429) or the settings are not in force yet.
                    let _ = config_maps.create(&Default::default(), &held).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    let schema_label = format!("flow_schema=\"{level}\"");
    let holder_label = format!("flow_schema=\"{holder_schema}\"");
    // The API server applies flow control settings within a second or so;
    // the seat is held once the holder's own requests are being rejected.
    haltsql_testkit::eventually("the seat holder holding the seat", CONVERGE, || async {
        (apiserver_metric(
            c,
            "apiserver_flowcontrol_rejected_requests_total",
            &holder_label,
        )
        .await
            > 0.0)
            .then_some(())
    })
    .await;
    let rejected_before = apiserver_metric(
        c,
        "apiserver_flowcontrol_rejected_requests_total",
        &schema_label,
    )
    .await;
    let started = Instant::now();
    w.edit(
        c,
        "p1",
        workload::document("agent-1", &["id", "status"], None),
    )
    .await;
    // Every watch must start again through the refusals.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.cut_all();
    tokio::time::sleep(hold).await;
    let rejected = apiserver_metric(
        c,
        "apiserver_flowcontrol_rejected_requests_total",
        &schema_label,
    )
    .await
        - rejected_before;
    let outage = started.elapsed();
    for holder in holders {
        holder.abort();
    }
    for schema in [&level, &holder_schema] {
        schemas.delete(schema, &Default::default()).await.unwrap();
    }
    levels.delete(&level, &Default::default()).await.unwrap();
    webhooks
        .delete(&webhook, &Default::default())
        .await
        .unwrap();
    drop(hanging);
    let back = Instant::now();
    wait_converged(&w, c).await;
    row.converge.push(back.elapsed());
    if rejected < 1.0 {
        row.violations
            .push("no request of the operator was answered 429".to_owned());
    }
    let rate = rejected / outage.as_secs_f64();
    row.outage.push(format!(
        "429: {rejected:.0} requests rejected in {:.0} s ({rate:.1}/s)",
        outage.as_secs_f64()
    ));
    // Every watch and every retry backs off: no tight loop.
    if rate > 10.0 {
        row.violations.push(format!(
            "{rate:.1} requests per second while the API server answered 429"
        ));
    }

    let (panics, _) = op.scan_logs("");
    let report = check.finish(c, &ns.name).await;
    op.stop();
    row.runs += 1;
    row.faults += 2;
    if panics > 0 {
        row.violations
            .push(format!("{panics} panics in the operator log"));
    }
    row.violations.extend(report.violations);
    row.notes.push(format!(
        "converge: from the end of each refusal to the final state; {} checker rounds, max RSS {} KiB",
        report.rounds, report.max_rss_kib
    ));
}

// ---- scenario 6: the validator misbehaves for some policies ---------------

/// The hanging validator's `sleep` argument: unusual, and distinct per run,
/// so leftovers are found and attributed to this run.
fn hang_mark() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("3599.{nanos:09}")
}

fn wrapper_script(dir: &Path, hang_mark: &str) -> (PathBuf, PathBuf) {
    let fixed = dir.join("fixed");
    let script = dir.join("haltsql-misbehaving");
    let real = haltsql_testkit::paths::haltsql_bin();
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
# A haltsql that misbehaves whenever one of the documents it is given (the
# operator may give several at once) is a policy whose description says so,
# until {fixed} exists.
if [ ! -e '{fixed}' ]; then
  for f; do
    [ -f "$f" ] || continue
    case "$(cat "$f")" in
      *chaos-crash*) kill -SEGV $$ ;;
      *chaos-hang*) sleep {hang_mark}; exit 0 ;;
      *chaos-garbage*) head -c 3000 /dev/urandom; exit 0 ;;
      *chaos-huge*) yes '{{"valid": true, "errors": []}}' | head -c 30000000; exit 0 ;;
    esac
  done
fi
exec '{real}' "$@"
"#,
            fixed = fixed.display(),
            real = real.display()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    (script, fixed)
}

/// Processes left by the misbehaving validator: our wrapper (by its path in
/// the command line) or its `sleep` (by its unusual argument).
fn validator_processes(script: &Path, hang_mark: &str) -> Vec<String> {
    let script = script.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // The script itself (`sh SCRIPT ARGS` once the kernel ran it), not the
        // operator, whose flags name it.
        let is_ours = args.first().is_some_and(|a| *a == script)
            || args.get(1).is_some_and(|a| *a == script)
            || (args.first().is_some_and(|a| a.ends_with("sleep"))
                && args.get(1).is_some_and(|a| a == hang_mark));
        if is_ours {
            found.push(format!(
                "{} {}",
                entry.file_name().to_string_lossy(),
                args.join(" ")
            ));
        }
    }
    found
}

async fn policy_reason(api: &Api<HaltSQLPolicy>, name: &str) -> Option<String> {
    let p = api.get(name).await.ok()?;
    let status = p.status?;
    if status.observed_generation != p.metadata.generation {
        return None;
    }
    let (s, r) = haltsql_testkit::status::condition(&status.conditions, "Valid")?;
    Some(format!("{s}/{r}"))
}

async fn validator_run(env: &Env, row: &mut Row) {
    let ns = env.namespace("chaos-validator").await;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mark = hang_mark();
    let (script, fixed) = wrapper_script(dir.path(), &mark);
    let mut options = operator_options(&ns.name, env.kubeconfig.clone(), &tmp);
    options.haltsql_binary = script.clone();
    options
        .extra_args
        .push("--validator-timeout-seconds=3".to_owned());
    let mut op = Operator::new(options);
    let check = checker::Checker::start(env.client.clone(), &ns.name, op.pid.clone());
    let c = &env.client;

    let faults = ["crash", "hang", "garbage", "huge"];
    let mut w = Workload::standard(&ns.name);
    for f in faults {
        w.policies.insert(
            format!("bad-{f}"),
            workload::document(&format!("agent-{f}"), &["id"], Some(&format!("chaos-{f}"))),
        );
    }
    let mut bad_refs = vec!["orders".to_owned()];
    bad_refs.extend(faults.iter().map(|f| format!("bad-{f}")));
    w.servers.insert("hs-bad".to_owned(), bad_refs);
    op.start().await;
    w.create(c).await;

    let policies: Api<HaltSQLPolicy> = Api::namespaced(c.clone(), &ns.name);
    let servers: Api<HaltSQLServer> = Api::namespaced(c.clone(), &ns.name);
    // Only the misbehaving ones go ValidatorError; the others are judged,
    // and their servers roll out.
    for f in faults {
        let name = format!("bad-{f}");
        haltsql_testkit::eventually(&format!("{name} ValidatorError"), CONVERGE, || async {
            (policy_reason(&policies, &name).await? == "Unknown/ValidatorError").then_some(())
        })
        .await;
    }
    let mut good = w.clone();
    good.servers.remove("hs-bad");
    good.policies.retain(|n, _| !n.starts_with("bad-"));
    // Edits of the good policies while the validator keeps failing for the others.
    for i in 0..4 {
        let columns: &[&str] = if i % 2 == 0 {
            &["id", "status"]
        } else {
            &["id"]
        };
        good.edit(c, "p1", workload::document("agent-1", columns, None))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    w.policies = {
        let mut all = w.policies.clone();
        all.extend(good.policies.clone());
        all
    };
    // `good` sees only its own objects: check them through a filtered view.
    haltsql_testkit::eventually(
        "the well-behaved policies and servers converge",
        CONVERGE,
        || async {
            for (name, _) in good.policies.iter() {
                if policy_reason(&policies, name).await? != "True/Validated" {
                    return None;
                }
            }
            for s in good.servers.keys() {
                let server = servers.get(s).await.ok()?;
                let (st, _) =
                    haltsql_testkit::status::condition(&server.status?.conditions, "Ready")?;
                if st != "True" {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let hs_bad = servers.get("hs-bad").await.unwrap();
    let gate =
        haltsql_testkit::status::condition(&hs_bad.status.unwrap().conditions, "PoliciesReady");
    if gate != Some(("False".to_owned(), "PolicyPendingValidation".to_owned())) {
        row.violations.push(format!(
            "hs-bad PoliciesReady is {gate:?}, not False/PolicyPendingValidation"
        ));
    }
    for f in faults {
        let reason = policy_reason(&policies, &format!("bad-{f}")).await;
        if reason.as_deref() != Some("Unknown/ValidatorError") {
            row.violations.push(format!(
                "bad-{f} is {reason:?} while the validator misbehaves"
            ));
        }
    }

    // The validator is fixed: everything recovers.
    std::fs::write(&fixed, b"").unwrap();
    let fixed_at = Instant::now();
    wait_converged(&w, c).await;
    row.converge.push(fixed_at.elapsed());
    // No validator in flight any more: nothing may be left behind.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let leftovers = validator_processes(&script, &mark);
    let left_dirs = entries(&tmp);
    let validator_runs = match &op.process {
        Some(p) => p
            .metrics()
            .await
            .value("haltsql_operator_validator_runs_total", &[]),
        None => 0.0,
    };
    row.outage
        .push(format!("{validator_runs:.0} validator runs"));
    if !leftovers.is_empty() {
        row.violations.push(format!(
            "validator processes left behind: {}",
            leftovers.join(" | ")
        ));
    }
    if left_dirs > 0 {
        row.violations.push(format!(
            "{left_dirs} validator temp dirs left in {}",
            tmp.display()
        ));
    }
    let (panics, _) = op.scan_logs("");
    // The invariants are confirmed while the operator still runs: the
    // Deployment controller cleans up old ReplicaSets after the rollout, and
    // their ConfigMaps must follow.
    let report = check.finish(c, &ns.name).await;
    op.stop();
    row.runs += 1;
    row.faults += faults.len() as u32;
    if panics > 0 {
        row.violations
            .push(format!("{panics} panics in the operator log"));
    }
    row.violations.extend(report.violations);
    row.notes.push(format!(
        "converge: from the validator fixed to every policy Valid and every server Ready; {} checker rounds, max RSS {} KiB, processes left {}, temp dirs left {}",
        report.rounds,
        report.max_rss_kib,
        leftovers.len(),
        left_dirs
    ));
}

#[tokio::test]
async fn fault_suite() {
    let env = Env::new().await;
    let mut rng = Rng::new();
    let full = full_form();
    let runs = |short: u32, long: u32| if full { long } else { short };
    let started = Instant::now();
    let mut failed = Vec::new();
    let mut report = |name: &str, row: Row| {
        if row.runs > 0 {
            print_table(name, &row);
        }
        failed.extend(row.violations);
    };

    if selected("kills") {
        let row = scenario_kills(&env, &mut rng, runs(3, 20)).await;
        report("operator SIGKILLed (cold start, rollout, edit storm)", row);
    }
    if selected("failover") {
        let mut row = Row::default();
        for _ in 0..runs(0, 2) {
            failover_run(&env, &mut rng, &mut row).await;
        }
        report(
            "leader failover, two replicas, the leader SIGKILLed under edits",
            row,
        );
    }
    if selected("restarts") {
        let mut row = Row::default();
        for _ in 0..runs(1, 3) {
            restart_run(&env, Restart::ApiServer, &mut row).await;
        }
        for _ in 0..runs(0, 3) {
            restart_run(&env, Restart::Etcd, &mut row).await;
        }
        report(
            "kube-apiserver (and in the full form etcd) restarted during a rollout",
            row,
        );
    }
    if selected("slow") {
        let mut row = Row::default();
        for _ in 0..runs(1, 3) {
            slow_run(&env, &mut rng, &mut row).await;
        }
        report(
            "the API server slow (200 ms per chunk) and every connection cut each second",
            row,
        );
    }
    if selected("refused") {
        let mut row = Row::default();
        for _ in 0..runs(1, 2) {
            refused_run(&env, &mut row).await;
        }
        report(
            "the API server refusing: 500 from a failing admission webhook, then 429 from flow control",
            row,
        );
    }
    if selected("writers") {
        let mut row = Row::default();
        for _ in 0..runs(1, 2) {
            writers_run(&env, &mut rng, &mut row).await;
        }
        report(
            "conflicting writers: servers, policies and owned objects edited concurrently",
            row,
        );
    }
    if selected("validator") {
        let mut row = Row::default();
        for _ in 0..runs(1, 2) {
            validator_run(&env, &mut row).await;
        }
        report(
            "the validator crashes, hangs, prints garbage or huge output",
            row,
        );
    }

    show(&format!(
        "chaos: {} form took {:.0} s\n",
        if full { "full" } else { "short" },
        started.elapsed().as_secs_f64()
    ));
    assert!(
        failed.is_empty(),
        "invariant violations:\n{}",
        failed.join("\n")
    );
}
