//! Prometheus metrics of the operator, served on `/metrics`.
//!
//! Counters and histograms are updated where things happen (reconciles, the
//! validator, API writes). The objects-by-condition gauge is computed at
//! scrape time from the reflector stores instead: it is always exact (deleted
//! objects drop out, no per-object bookkeeping in the reconcilers) and costs
//! one pass over the cached custom resources per scrape.

use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::reflector::Store;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::api::{HaltSQLPolicy, HaltSQLServer};

/// Which controller a series belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerKind {
    Policy,
    Server,
}

impl ControllerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "haltsqlpolicy",
            Self::Server => "haltsqlserver",
        }
    }
}

/// How a reconcile ended, the `result` label of `haltsql_operator_reconciles_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileResult {
    /// The pass finished; the next one is at the resync.
    Success,
    /// The pass asked to be retried with backoff.
    Requeue,
    /// The pass is waiting for something (a validation, a rollout) and looks again later.
    Waiting,
    /// A write met a newer object (409); retried shortly.
    Conflict,
    /// The cache did not show the operator's own last status write yet; nothing was done.
    Stale,
    /// The pass failed; retried with backoff.
    Error,
}

impl ReconcileResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Requeue => "requeue",
            Self::Waiting => "waiting",
            Self::Conflict => "conflict",
            Self::Stale => "stale",
            Self::Error => "error",
        }
    }
}

/// Every series the operator exports. Names follow the Prometheus conventions
/// (`_total` counters, `_seconds` histograms, a `haltsql_operator_` prefix).
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Reconciles by controller and result (`success`, `requeue`, `waiting`, `conflict`, `stale`, `error`).
    pub reconciles: IntCounterVec,
    /// Reconcile duration by controller.
    pub reconcile_duration: HistogramVec,
    /// Reconciles running right now, by controller.
    pub reconciles_in_flight: IntGaugeVec,
    /// Documents judged by `haltsql validate` by outcome (`valid`, `invalid`, `error`).
    pub validator_runs: IntCounterVec,
    /// `haltsql validate` processes by outcome (`batch` for several documents).
    pub validator_processes: IntCounterVec,
    /// `haltsql validate` process duration.
    pub validator_duration: HistogramVec,
    /// Verdicts served from the content-hash cache instead of a validator run.
    pub validator_cache_hits: IntCounterVec,
    /// API writes by resource kind and verb (`apply`, `create`, `delete`, `status`).
    pub api_writes: IntCounterVec,
    /// Custom resources by kind, condition type and status; computed at scrape
    /// time from the stores registered with [`Metrics::observe_stores`].
    pub conditions: IntGaugeVec,
    /// 1 while this process holds the leader lease (or runs without leader election).
    pub leader: IntGauge,
    /// The stores `conditions` is computed from at scrape time, one pair per watched scope.
    sources: Arc<Mutex<Vec<StoreSource>>>,
}

/// The custom-resource stores of one watched scope.
struct StoreSource {
    policies: Store<HaltSQLPolicy>,
    servers: Store<HaltSQLServer>,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "haltsql_operator_reconciles_total",
                "Reconciles by controller and result.",
            ),
            &["controller", "result"],
        )?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "haltsql_operator_reconcile_duration_seconds",
                "Time spent in one reconcile, by controller.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["controller"],
        )?;
        let reconciles_in_flight = IntGaugeVec::new(
            Opts::new(
                "haltsql_operator_reconciles_in_flight",
                "Reconciles running now, by controller.",
            ),
            &["controller"],
        )?;
        let validator_runs = IntCounterVec::new(
            Opts::new(
                "haltsql_operator_validator_runs_total",
                "Documents judged by haltsql validate (not from the cache), by outcome (valid, invalid, error).",
            ),
            &["outcome"],
        )?;
        let validator_processes = IntCounterVec::new(
            Opts::new(
                "haltsql_operator_validator_processes_total",
                "haltsql validate processes started, by outcome (valid, invalid, error for a document judged alone; batch for several at once).",
            ),
            &["outcome"],
        )?;
        let validator_duration = HistogramVec::new(
            HistogramOpts::new(
                "haltsql_operator_validator_duration_seconds",
                "Duration of one haltsql validate process, by the outcome label of haltsql_operator_validator_processes_total.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["outcome"],
        )?;
        let validator_cache_hits = IntCounterVec::new(
            Opts::new(
                "haltsql_operator_validator_cache_hits_total",
                "Verdicts reused for content validated before, instead of running haltsql validate.",
            ),
            &["outcome"],
        )?;
        let api_writes = IntCounterVec::new(
            Opts::new(
                "haltsql_operator_api_writes_total",
                "Writes to the API server by resource kind and verb.",
            ),
            &["kind", "verb"],
        )?;
        let conditions = IntGaugeVec::new(
            Opts::new(
                "haltsql_operator_objects",
                "Custom resources by kind, condition type and condition status.",
            ),
            &["kind", "condition", "status"],
        )?;
        let leader = IntGauge::new(
            "haltsql_operator_leader",
            "1 while this process runs the controllers (holds the lease, or runs without leader election).",
        )?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(reconciles_in_flight.clone()))?;
        registry.register(Box::new(validator_runs.clone()))?;
        registry.register(Box::new(validator_processes.clone()))?;
        registry.register(Box::new(validator_duration.clone()))?;
        registry.register(Box::new(validator_cache_hits.clone()))?;
        registry.register(Box::new(api_writes.clone()))?;
        registry.register(Box::new(conditions.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Self {
            registry,
            reconciles,
            reconcile_duration,
            reconciles_in_flight,
            validator_runs,
            validator_processes,
            validator_duration,
            validator_cache_hits,
            api_writes,
            conditions,
            leader,
            sources: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Makes `haltsql_operator_objects` count the objects of these stores
    /// (called once per watched scope by the runtime).
    pub fn observe_stores(&self, policies: Store<HaltSQLPolicy>, servers: Store<HaltSQLServer>) {
        self.lock_sources().push(StoreSource { policies, servers });
    }

    fn lock_sources(&self) -> std::sync::MutexGuard<'_, Vec<StoreSource>> {
        // A panic elsewhere while holding the lock leaves the list intact.
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Recomputes the objects-by-condition gauge from the stores.
    fn refresh_conditions(&self, sources: &[StoreSource]) {
        self.conditions.reset();
        let count = |kind: &str, conditions: &[Condition]| {
            for condition in conditions {
                self.conditions
                    .with_label_values(&[kind, condition.type_.as_str(), condition.status.as_str()])
                    .inc();
            }
        };
        for source in sources {
            for policy in source.policies.state() {
                if let Some(status) = &policy.status {
                    count("HaltSQLPolicy", &status.conditions);
                }
            }
            for server in source.servers.state() {
                if let Some(status) = &server.status {
                    count("HaltSQLServer", &status.conditions);
                }
            }
        }
    }

    /// Counts one API write.
    pub fn write(&self, kind: &str, verb: &str) {
        self.api_writes.with_label_values(&[kind, verb]).inc();
    }

    /// The text exposition of every series.
    pub fn encode(&self) -> String {
        use prometheus::Encoder;
        // Held across refresh and gather so concurrent scrapes never see a
        // gauge another scrape has just reset.
        let sources = self.lock_sources();
        self.refresh_conditions(&sources);
        let mut buffer = Vec::new();
        let encoder = prometheus::TextEncoder::new();
        if encoder
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        drop(sources);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// Measures one reconcile: in-flight while alive, duration and result when finished.
pub struct ReconcileTimer {
    metrics: Metrics,
    controller: ControllerKind,
    started: std::time::Instant,
    result: ReconcileResult,
}

impl Metrics {
    /// Starts measuring a reconcile; the result defaults to `error` unless set.
    pub fn start_reconcile(&self, controller: ControllerKind) -> ReconcileTimer {
        self.reconciles_in_flight
            .with_label_values(&[controller.as_str()])
            .inc();
        ReconcileTimer {
            metrics: self.clone(),
            controller,
            started: std::time::Instant::now(),
            result: ReconcileResult::Error,
        }
    }
}

impl ReconcileTimer {
    /// Records the outcome.
    pub fn finish(mut self, result: ReconcileResult) {
        self.result = result;
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        let controller = self.controller.as_str();
        self.metrics
            .reconciles_in_flight
            .with_label_values(&[controller])
            .dec();
        self.metrics
            .reconcile_duration
            .with_label_values(&[controller])
            .observe(self.started.elapsed().as_secs_f64());
        self.metrics
            .reconciles
            .with_label_values(&[controller, self.result.as_str()])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    use super::*;

    fn policy(name: &str, conditions: &[(&str, &str)]) -> HaltSQLPolicy {
        let conditions: Vec<serde_json::Value> = conditions
            .iter()
            .map(|(type_, status)| {
                serde_json::json!({
                    "type": type_, "status": status, "reason": "R", "message": "",
                    "lastTransitionTime": "2025-01-01T00:00:00Z"
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "haltsql.dev/v1alpha1",
            "kind": "HaltSQLPolicy",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"policy": "kind: Policy"},
            "status": {"conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn objects_gauge_follows_the_stores_at_scrape_time() {
        let metrics = Metrics::new().unwrap();
        let (policies, mut policy_writer) = reflector::store::<HaltSQLPolicy>();
        let (servers, _server_writer) = reflector::store::<HaltSQLServer>();
        metrics.observe_stores(policies, servers);
        let a = policy("a", &[("Valid", "True"), ("Synced", "False")]);
        let b = policy("b", &[("Valid", "True")]);
        policy_writer.apply_watcher_event(&watcher::Event::Apply(a));
        policy_writer.apply_watcher_event(&watcher::Event::Apply(b.clone()));
        let text = metrics.encode();
        assert!(
            text.contains(
                "haltsql_operator_objects{condition=\"Valid\",kind=\"HaltSQLPolicy\",status=\"True\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains(
            "haltsql_operator_objects{condition=\"Synced\",kind=\"HaltSQLPolicy\",status=\"False\"} 1"
        ));

        // A deleted object drops out at the next scrape; a gone series disappears.
        policy_writer.apply_watcher_event(&watcher::Event::Delete(policy("a", &[])));
        let text = metrics.encode();
        assert!(text.contains(
            "haltsql_operator_objects{condition=\"Valid\",kind=\"HaltSQLPolicy\",status=\"True\"} 1"
        ));
        assert!(!text.contains("condition=\"Synced\""), "{text}");
    }

    #[test]
    fn series_follow_the_prometheus_conventions() {
        let metrics = Metrics::new().unwrap();
        // Touch every labelled series so it is exported.
        metrics
            .start_reconcile(ControllerKind::Server)
            .finish(ReconcileResult::Success);
        metrics.write("ConfigMap", "apply");
        metrics.validator_runs.with_label_values(&["valid"]).inc();
        metrics
            .validator_duration
            .with_label_values(&["valid"])
            .observe(0.1);
        metrics
            .validator_cache_hits
            .with_label_values(&["valid"])
            .inc();
        for family in metrics.registry.gather() {
            let name = family.name();
            assert!(name.starts_with("haltsql_operator_"), "{name}");
            match family.get_field_type() {
                prometheus::proto::MetricType::COUNTER => {
                    assert!(name.ends_with("_total"), "{name}")
                }
                prometheus::proto::MetricType::HISTOGRAM => {
                    assert!(name.ends_with("_seconds"), "{name}")
                }
                _ => assert!(!name.ends_with("_total"), "{name}"),
            }
        }
        let text = metrics.encode();
        assert!(text.contains(
            "haltsql_operator_reconciles_total{controller=\"haltsqlserver\",result=\"success\"} 1"
        ));
        assert!(
            text.contains("haltsql_operator_reconciles_in_flight{controller=\"haltsqlserver\"} 0")
        );
    }
}
