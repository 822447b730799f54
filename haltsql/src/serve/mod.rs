//! `haltsql serve`: the verify API over HTTP(S).
//!
//! Start-up: load the config exactly as `validate` does (located errors and
//! exit 2 on failure), refuse features this server does not implement (exit
//! 2, naming the feature), build the policies, open the audit sinks and the
//! TLS settings, bind the listeners, then report ready. SIGTERM (or SIGINT)
//! turns `/readyz` to 503, stops accepting, drains open requests and exits 0.

pub mod app;
pub mod auth;
pub mod bundles;
pub mod conn;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::audit::{AuditError, AuditLog};
use crate::engine::pool::{PoolError, VerifyPool};
use crate::engine::{Policy, Rules};
use crate::load::{self, LoadedConfig, LogFormat};

use app::AppState;
use auth::{Authenticator, TokenEntry};

/// How long open connections may take to finish after SIGTERM.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(25);
/// The least time queued audit events get to reach remote sinks at shutdown.
pub const AUDIT_FLUSH_MIN: Duration = Duration::from_secs(2);
/// The most time queued audit events get to reach remote sinks at shutdown.
pub const AUDIT_FLUSH_MAX: Duration = Duration::from_secs(10);

const SERVE_LONG: &str = "\
Load a Config document (exactly as `haltsql validate` would) and serve the \
verify API: POST /v1/verify with `Authorization: Bearer <token>` and \
{\"sql\": \"...\"}; GET /healthz and /readyz.

Exit codes:
  0  stopped by SIGTERM or SIGINT after draining open requests
  2  the config does not load (the located errors are printed on stderr), \
uses a feature this server does not implement, or a listener, TLS file or \
audit sink cannot be set up";

/// Arguments of `haltsql serve`.
#[derive(Debug, Clone, Args)]
#[command(about = "Serve the verify API", long_about = SERVE_LONG)]
pub struct ServeArgs {
    /// The Config document.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("{0} is not implemented by this server")]
    Unsupported(String),
    #[error("token {token} names policy {policy}, which is not loaded")]
    UnknownPolicy { token: String, policy: String },
    #[error("two policies are named {0} (file policies and bundles together)")]
    DuplicatePolicy(String),
    #[error("allow_unauthenticated is on but default_policy {0} is not loaded")]
    NoDefaultPolicy(String),
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// Run `haltsql serve`; returns the exit code.
pub fn run(args: &ServeArgs) -> i32 {
    let config = match load::load_config(&args.config) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            return 2;
        }
    };
    init_logging(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("haltsql serve: {}", ServeError::Runtime(e));
            return 2;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("haltsql serve: {e}");
            tracing::error!(error = %e, "serve failed");
            2
        }
    }
}

fn init_logging(config: &LoadedConfig) {
    let filter = tracing_subscriber::EnvFilter::new(config.logging.level.as_str());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.logging.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Features the contract lets this server refuse, found in `config`.
pub fn unsupported_features(config: &LoadedConfig) -> Vec<String> {
    let mut out = Vec::new();
    for b in &config.bundle_sources {
        if let Err(crate::bundle::fetch::FetchError::Unsupported(what)) =
            crate::bundle::fetch::Fetcher::new(&b.location)
        {
            out.push(format!("bundle source {}: {what}", b.name));
        }
    }
    if !config.server.auth.oidc.is_empty() {
        out.push("OIDC authentication (server.auth.oidc)".to_string());
    }
    if !config.server.auth.mtls_identities.is_empty() {
        out.push("mTLS identities (server.auth.mtls.identities)".to_string());
    }
    if config.server.admin.listen.is_some() {
        out.push("the admin listener (server.admin.listen)".to_string());
    }
    if config.reload.watch {
        out.push("reloading on change (reload.watch)".to_string());
    }
    out
}

/// Build the shared state from a loaded config.
pub fn build_state(config: &LoadedConfig) -> Result<AppState, ServeError> {
    if let Some(feature) = unsupported_features(config).into_iter().next() {
        return Err(ServeError::Unsupported(feature));
    }
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let auth: app::AuthSlot = Arc::default();
    let config = Arc::new(config.clone());
    let bundles = if config.bundle_sources.is_empty() {
        *auth
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(Arc::new(build_auth(&config, &[])?));
        None
    } else {
        // The policy set is published once every source has a bundle.
        Some(bundles::Bundles::new(
            Arc::clone(&config),
            Arc::clone(&auth),
        ))
    };
    Ok(AppState {
        auth,
        bundles,
        max_request_bytes: usize::try_from(config.limits.max_request_bytes).unwrap_or(usize::MAX),
        pool: VerifyPool::new(threads)?,
        audit: AuditLog::open(
            config.audit.log_raw_sql,
            &config.audit.sinks,
            &config.audit.delivery,
        )?,
        ready: AtomicBool::new(false),
    })
}

/// The authenticator for the config's file policies plus `extra` (the
/// bundles' policies): every token and the default policy must resolve,
/// and no two policies may share a name.
pub fn build_auth(
    config: &LoadedConfig,
    extra: &[load::LoadedPolicy],
) -> Result<Authenticator, ServeError> {
    let mut policies: HashMap<String, Arc<Policy>> = HashMap::new();
    for p in config.policies.iter().chain(extra) {
        let compiled = Arc::new(Policy::new(&Rules::from(p)));
        if policies.insert(p.name.clone(), compiled).is_some() {
            return Err(ServeError::DuplicatePolicy(p.name.clone()));
        }
    }
    let mut tokens = Vec::new();
    for t in &config.server.auth.tokens {
        let policy = policies
            .get(&t.policy)
            .ok_or_else(|| ServeError::UnknownPolicy {
                token: t.name.clone(),
                policy: t.policy.clone(),
            })?;
        tokens.push(TokenEntry {
            name: t.name.clone(),
            sha256: t.sha256,
            policy: Arc::clone(policy),
        });
    }
    let unauthenticated = if config.server.auth.allow_unauthenticated {
        let name = config.default_policy.clone().unwrap_or_default();
        Some(Arc::clone(
            policies
                .get(&name)
                .ok_or(ServeError::NoDefaultPolicy(name))?,
        ))
    } else {
        None
    };
    Ok(Authenticator::new(tokens, unauthenticated))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

async fn serve(config: LoadedConfig) -> Result<(), ServeError> {
    let state = Arc::new(build_state(&config)?);
    let tls_config = match &config.server.tls {
        Some(t) => Some(tls::server_config(t)?),
        None => None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut servers = Vec::new();
    let api = app::api_router(Arc::clone(&state));
    let listener = bind(config.server.listen).await?;
    let api_addr = listener.local_addr().unwrap_or(config.server.listen);
    let acceptor = tls_config.map(tokio_rustls::TlsAcceptor::from);
    servers.push(tokio::spawn(conn::serve(
        listener,
        api,
        acceptor,
        conn::ConnLimits::api(&config.limits),
        stop_rx.clone(),
    )));
    let mut health_addr = None;
    if let Some(addr) = config.server.health_listen {
        let listener = bind(addr).await?;
        health_addr = listener.local_addr().ok();
        servers.push(tokio::spawn(conn::serve(
            listener,
            app::health_router(Arc::clone(&state)),
            None,
            conn::ConnLimits::health(&config.limits),
            stop_rx.clone(),
        )));
    }
    let audit_delivery = state.audit.start_delivery();
    let bundle_tasks = match &state.bundles {
        Some(b) => b.spawn(stop_rx.clone()),
        None => Vec::new(),
    };
    state.ready.store(true, Ordering::Release);
    tracing::info!(
        listen = %api_addr,
        health = ?health_addr,
        tls = config.server.tls.is_some(),
        policies = config.policies.len(),
        tokens = config.server.auth.tokens.len(),
        "haltsql serving"
    );

    shutdown_signal().await;
    tracing::info!("shutting down: draining open requests");
    state.ready.store(false, Ordering::Release);
    let _ = stop_tx.send(true);
    let drain_started = std::time::Instant::now();
    let drain = async {
        for s in servers {
            if let Err(e) = s.await {
                tracing::warn!(error = %e, "listener task failed");
            }
        }
    };
    for t in bundle_tasks {
        let _ = t.await;
    }
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        tracing::warn!("drain timeout: closing remaining connections");
    }
    // No request is open any more: send the audit events still queued for
    // remote sinks, within the drain's time (at least AUDIT_FLUSH_MIN).
    let now = std::time::Instant::now();
    let flush_deadline = (drain_started + DRAIN_TIMEOUT).max(now + AUDIT_FLUSH_MIN);
    audit_delivery
        .flush(flush_deadline.min(now + AUDIT_FLUSH_MAX))
        .await;
    state.pool.close();
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            // Without signal handlers, Ctrl-C is the only way to stop.
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
