use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Client;
use tracing::{error, info};

use haltsql_operator::cli::{Cli, Command, RunArgs, parse_bind_address};
use haltsql_operator::context::Settings;
use haltsql_operator::metrics::Metrics;
use haltsql_operator::runtime::{self, Readiness};
use haltsql_operator::{http, leader, render_cmd, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init();
    match cli.command {
        Some(Command::Render(args)) => render_cmd::run(&args).await,
        None => run(cli.run).await,
    }
}

fn check_executable(path: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "--haltsql-binary {}: cannot use the haltsql CLI",
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

/// Resolves on SIGTERM or Ctrl-C.
fn shutdown_signal() -> BoxFuture<'static, ()> {
    async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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
    }
    .boxed()
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    check_executable(&args.haltsql_binary)?;
    let metrics_addr =
        parse_bind_address(&args.metrics_bind_address).map_err(anyhow::Error::msg)?;
    let health_addr =
        parse_bind_address(&args.health_probe_bind_address).map_err(anyhow::Error::msg)?;

    let client = Client::try_default()
        .await
        .context("cannot configure the Kubernetes client")?;
    let metrics = Metrics::new().context("cannot register metrics")?;
    let readiness = Readiness::default();
    if let Some(addr) = metrics_addr {
        let metrics = metrics.clone();
        let listener = http::bind(addr)
            .await
            .with_context(|| format!("metrics endpoint {addr}"))?;
        tokio::spawn(async move { http::serve_metrics(listener, metrics).await });
    }
    if let Some(addr) = health_addr {
        let readiness = readiness.clone();
        let listener = http::bind(addr)
            .await
            .with_context(|| format!("health endpoint {addr}"))?;
        tokio::spawn(async move { http::serve_health(listener, readiness).await });
    }

    let mut settings = Settings::new(args.haltsql_binary.clone());
    settings.watch_namespaces =
        (!args.watch_namespaces.is_empty()).then(|| args.watch_namespaces.clone());
    settings.rollout_deadline = Duration::from_secs(args.rollout_deadline_seconds);
    settings.validator_timeout = Duration::from_secs(args.validator_timeout_seconds);
    settings.resync = Duration::from_secs(args.resync_seconds.max(1));

    let shutdown = shutdown_signal().shared();
    let start = {
        let client = client.clone();
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        let shutdown = shutdown.clone();
        move || async move {
            if let Err(e) = runtime::run(client, settings, metrics, readiness, shutdown).await {
                error!(%e, "controllers stopped");
            }
        }
    };
    if args.leader_elect {
        let namespace = match args.leader_election_namespace.clone() {
            Some(ns) => ns,
            None => pod_namespace().unwrap_or_else(|| client.default_namespace().to_owned()),
        };
        leader::run_as_leader(
            client,
            &namespace,
            readiness,
            metrics,
            shutdown.boxed().shared(),
            start,
        )
        .await
        .context("leader election")?;
    } else {
        metrics.leader.set(1);
        start().await;
    }
    info!("stopped");
    Ok(())
}

fn pod_namespace() -> Option<String> {
    if let Ok(ns) = std::env::var("POD_NAMESPACE") {
        return Some(ns);
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_owned())
}
