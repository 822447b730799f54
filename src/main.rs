//! `haltsql-operator`: the controller manager (default) and the offline
//! `render` subcommand.
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM or Ctrl-C: in-flight
//! reconciles drained, lease released); 1 when startup fails (for instance a
//! missing `--haltsql-binary`), when the leader lease is lost, or when the
//! controllers stop on their own; 2 for bad flags (clap).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::FutureExt;
use kube::Client;
use tracing::{error, info, warn};

use haltsql_operator::controllers::context::Settings;
use haltsql_operator::controllers::metrics::Metrics;
use haltsql_operator::controllers::runtime::{self, Readiness};
use haltsql_operator::manager::cli::{Cli, Command, RunArgs};
use haltsql_operator::manager::{api_client, http, leader, render_command, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Render(args)) => {
            // A pipeline tool: plain errors on stderr, the objects on stdout.
            match render_command::run(&args).await {
                Ok(objects) => {
                    print!("{objects}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            telemetry::init();
            match run(cli.run).await {
                Ok(()) => {
                    info!("stopped");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    error!(error = format!("{e:#}"), "haltsql-operator stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Fails unless `path` is an executable regular file (after following links).
fn check_executable(path: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "--haltsql-binary {}: the haltsql CLI is missing (it validates every policy)",
            path.display()
        )
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        bail!(
            "--haltsql-binary {}: not an executable file",
            path.display()
        );
    }
    Ok(())
}

/// Resolves on the first SIGTERM or Ctrl-C; a second one exits at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            error!(%e, "cannot listen for SIGTERM; only Ctrl-C stops the operator");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    info!("shutting down: draining in-flight reconciles");
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        warn!("second signal: exiting without draining");
        std::process::exit(1);
    });
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    check_executable(&args.haltsql_binary)?;

    // Bound before anything else, so a taken port fails the start loudly.
    let metrics = Metrics::new().context("cannot register metrics")?;
    let readiness = Readiness::default();
    if let Some(addr) = args.metrics_bind_address.0 {
        let listener = http::bind(addr)
            .await
            .with_context(|| format!("--metrics-bind-address {addr}"))?;
        info!(address = %addr, "serving /metrics");
        tokio::spawn(http::serve_metrics(listener, metrics.clone()));
    }
    if let Some(addr) = args.health_probe_bind_address.0 {
        let listener = http::bind(addr)
            .await
            .with_context(|| format!("--health-probe-bind-address {addr}"))?;
        info!(address = %addr, "serving /healthz and /readyz");
        tokio::spawn(http::serve_health(listener, readiness.clone()));
    }

    let config = kube::Config::infer()
        .await
        .context("cannot configure the Kubernetes client (KUBECONFIG or in-cluster)")?;
    // The lease has a client of its own, so that its renewals never queue
    // behind the controllers' requests.
    let client = Client::try_from(config.clone()).context("cannot build the Kubernetes client")?;
    // One request in flight per pass of either controller.
    let controllers_client = api_client::bounded(config, 2 * usize::from(args.concurrency))
        .context("cannot build the Kubernetes client")?;

    // A run killed in the middle of a validation (OOM, SIGKILL) left its
    // private directory behind; in a pod, /tmp outlives the container.
    let removed =
        haltsql_operator::controllers::policy::remove_stale_private_dirs(&std::env::temp_dir());
    if removed > 0 {
        info!(
            removed,
            "removed validation directories an earlier run left behind"
        );
    }

    let mut settings = Settings::new(args.haltsql_binary.clone());
    settings.watch_namespaces = args.namespaces();
    settings.rollout_deadline = Duration::from_secs(args.rollout_deadline_seconds);
    settings.validator_timeout = Duration::from_secs(args.validator_timeout_seconds);
    settings.concurrency = args.concurrency;
    if let Some(n) = args.validator_concurrency {
        settings.validator_concurrency = n.into();
    }
    settings.resync = Duration::from_secs(args.resync_seconds);
    match &settings.watch_namespaces {
        Some(namespaces) => info!(namespaces = %namespaces.join(","), "watching namespaces"),
        None => info!("watching all namespaces"),
    }

    // Set when a signal arrives, so a controller stop without one is an error.
    let stopping = Arc::new(AtomicBool::new(false));
    let shutdown = {
        let stopping = stopping.clone();
        async move {
            shutdown_signal().await;
            stopping.store(true, Ordering::SeqCst);
        }
        .boxed()
        .shared()
    };

    let controllers_result = Arc::new(std::sync::Mutex::new(None));
    let start = {
        let client = controllers_client;
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        let shutdown = shutdown.clone();
        let controllers_result = controllers_result.clone();
        move || async move {
            let result = runtime::run(client, settings, metrics, readiness, shutdown).await;
            if let Ok(mut slot) = controllers_result.lock() {
                *slot = Some(result);
            }
        }
    };

    if args.leader_elect {
        let namespace = match args.leader_election_namespace.clone() {
            Some(ns) => ns,
            None => pod_namespace().unwrap_or_else(|| client.default_namespace().to_owned()),
        };
        let outcome = leader::run_as_leader(
            client,
            &namespace,
            leader::identity(),
            readiness,
            metrics,
            shutdown,
            start,
        )
        .await;
        if let Err(e) = outcome {
            // Exit before anything else runs: the next leader may already be
            // reconciling, and no write of this replica may overlap with it.
            error!(error = %e, "leader election failed; exiting so that Kubernetes restarts this replica");
            std::process::exit(1);
        }
    } else {
        metrics.leader.set(1);
        start().await;
    }

    let result = controllers_result
        .lock()
        .ok()
        .and_then(|mut slot| slot.take());
    match result {
        Some(Err(e)) => Err(e).context("the controllers failed"),
        Some(Ok(())) if !stopping.load(Ordering::SeqCst) => {
            bail!("the controllers stopped without a shutdown signal")
        }
        _ => Ok(()),
    }
}

/// The operator's own namespace when it runs in a pod.
fn pod_namespace() -> Option<String> {
    if let Ok(ns) = std::env::var("POD_NAMESPACE")
        && !ns.is_empty()
    {
        return Some(ns);
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
