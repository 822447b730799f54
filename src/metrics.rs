//! Prometheus metrics of the operator, served on `/metrics`.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

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

/// Every series the operator exports. Names follow the Prometheus conventions
/// (`_total` counters, `_seconds` histograms, a `haltsql_operator_` prefix).
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Reconciles by controller and result (`success`, `requeue`, `conflict`, `error`).
    pub reconciles: IntCounterVec,
    /// Reconcile duration by controller.
    pub reconcile_duration: HistogramVec,
    /// Reconciles running right now, by controller.
    pub reconciles_in_flight: IntGaugeVec,
    /// `haltsql validate` runs by outcome (`valid`, `invalid`, `error`).
    pub validator_runs: IntCounterVec,
    /// `haltsql validate` run duration.
    pub validator_duration: HistogramVec,
    /// Verdicts served from the content-hash cache instead of a validator run.
    pub validator_cache_hits: IntCounterVec,
    /// API writes by resource kind and verb (`apply`, `create`, `delete`, `status`).
    pub api_writes: IntCounterVec,
    /// Objects by resource kind, condition type and status, from the last reconcile of each.
    pub conditions: IntGaugeVec,
    /// 1 while this process holds the leader lease (or runs without leader election).
    pub leader: IntGauge,
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
                "haltsql validate runs by outcome (valid, invalid, error).",
            ),
            &["outcome"],
        )?;
        let validator_duration = HistogramVec::new(
            HistogramOpts::new(
                "haltsql_operator_validator_duration_seconds",
                "Duration of one haltsql validate run.",
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
            validator_duration,
            validator_cache_hits,
            api_writes,
            conditions,
            leader,
        })
    }

    /// Counts one API write.
    pub fn write(&self, kind: &str, verb: &str) {
        self.api_writes.with_label_values(&[kind, verb]).inc();
    }

    /// The text exposition of every series.
    pub fn encode(&self) -> String {
        use prometheus::Encoder;
        let mut buffer = Vec::new();
        let encoder = prometheus::TextEncoder::new();
        if encoder
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// Measures one reconcile: in-flight while alive, duration and result when finished.
pub struct ReconcileTimer {
    metrics: Metrics,
    controller: ControllerKind,
    started: std::time::Instant,
    result: &'static str,
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
            result: "error",
        }
    }
}

impl ReconcileTimer {
    /// Records the outcome: `success`, `requeue`, `conflict` or `error`.
    pub fn finish(mut self, result: &'static str) {
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
            .with_label_values(&[controller, self.result])
            .inc();
    }
}
