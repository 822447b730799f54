//! `haltsql serve`: the verify API over HTTP(S).
//!
//! Start-up: load the config exactly as `validate` does (located errors and
//! exit 2 on failure), refuse features this server does not implement (exit
//! 2, naming the feature), build the policies, open the audit sinks and the
//! TLS settings, bind the listeners, then report ready. SIGTERM (or SIGINT)
//! turns `/readyz` to 503, stops accepting, drains open requests and exits 0.

pub mod admin;
pub mod app;
pub mod auth;
pub mod bundles;
pub mod conn;
pub mod identity;
pub mod oidc;
pub mod reload;
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
use crate::engine::{ENGINE_STACK_BYTES, Policy, Rules};
use crate::load::{self, LoadedConfig, LogFormat};

use app::AppState;
use auth::{Authenticator, MtlsEntry, OidcEntry, TokenEntry};

/// How long open connections may take to finish after SIGTERM.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(25);
/// The least time queued audit events get to reach remote sinks at shutdown.
pub const AUDIT_FLUSH_MIN: Duration = Duration::from_secs(2);
/// The most time queued audit events get to reach remote sinks at shutdown.
pub const AUDIT_FLUSH_MAX: Duration = Duration::from_secs(10);

const SERVE_LONG: &str = "\
Load a Config document (exactly as `haltsql validate` would) and serve the \
verify API: POST /v1/verify with {\"sql\": \"...\"} and `Authorization: \
Bearer <token>` (a static token or an OIDC JWT) or, without the header, an \
mTLS client certificate that matches an identity; GET /healthz and /readyz. \
With server.admin.listen, a plain-HTTP admin listener serves /metrics, \
/config and /bundles (never secrets). With reload.watch, the config and \
every file it was loaded from are watched and a change is applied \
atomically (a config that does not load changes nothing).

Exit codes:
  0  stopped by SIGTERM or SIGINT after draining open requests
  2  the config does not load (the located errors are printed on stderr), \
uses a feature this server does not implement, or a listener, TLS file, \
jwks_file or audit sink cannot be set up";

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
    #[error("server.auth.mtls.identities[{index}] names policy {policy}, which is not loaded")]
    UnknownIdentityPolicy { index: usize, policy: String },
    #[error("server.auth.oidc[{index}] names policy {policy}, which is not loaded")]
    UnknownOidcPolicy { index: usize, policy: String },
    #[error("server.auth.oidc[{index}]: {source}")]
    Oidc {
        index: usize,
        source: oidc::OidcError,
    },
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
    // The runtime's threads get the engine's stack, so small inputs are
    // verified where the request is handled (engine::pool).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_stack_size(ENGINE_STACK_BYTES)
        .on_thread_start(crate::engine::mark_engine_stack)
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
    let auth: auth::AuthSlot = Arc::default();
    let config = Arc::new(config.clone());
    let oidc_sources = Arc::new(oidc::Sources::default());
    // Every jwks_file is read now, so a bad one stops the start.
    for (index, p) in config.server.auth.oidc.iter().enumerate() {
        oidc_sources
            .get(p)
            .map_err(|source| ServeError::Oidc { index, source })?;
    }
    let bundles = if config.bundle_sources.is_empty() {
        *auth
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(Arc::new(build_auth(&config, &[], &oidc_sources)?));
        None
    } else {
        // The policy set is published once every source has a bundle.
        Some(bundles::Bundles::new(
            Arc::clone(&config),
            Arc::clone(&auth),
            Arc::clone(&oidc_sources),
        ))
    };
    Ok(AppState {
        auth,
        bundles,
        max_request_bytes: usize::try_from(config.limits.max_request_bytes).unwrap_or(usize::MAX),
        oidc: oidc_sources,
        tls: match &config.server.tls {
            Some(t) => Some(Arc::new(std::sync::RwLock::new(tls::server_config(t)?))),
            None => None,
        },
        config: std::sync::RwLock::new(Arc::clone(&config)),
        reloads: std::sync::Mutex::default(),
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
/// bundles' policies): every token, identity, fixed OIDC policy and the
/// default policy must resolve, and no two policies may share a name.
pub fn build_auth(
    config: &LoadedConfig,
    extra: &[load::LoadedPolicy],
    oidc_sources: &oidc::Sources,
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
    let mut mtls = Vec::new();
    for (index, m) in config.server.auth.mtls_identities.iter().enumerate() {
        let policy = policies
            .get(&m.policy)
            .ok_or_else(|| ServeError::UnknownIdentityPolicy {
                index,
                policy: m.policy.clone(),
            })?;
        mtls.push(MtlsEntry {
            matcher: m.matcher.clone(),
            policy: Arc::clone(policy),
        });
    }
    let mut oidc_entries = Vec::new();
    for (index, p) in config.server.auth.oidc.iter().enumerate() {
        let policy = match &p.policy {
            load::OidcPolicy::Fixed(name) => {
                auth::OidcPolicy::Fixed(Arc::clone(policies.get(name).ok_or_else(|| {
                    ServeError::UnknownOidcPolicy {
                        index,
                        policy: name.clone(),
                    }
                })?))
            }
            load::OidcPolicy::Claim(c) => auth::OidcPolicy::Claim(c.clone()),
        };
        oidc_entries.push(OidcEntry {
            issuer: p.issuer.clone(),
            audience: p.audience.clone(),
            policy,
            keys: oidc_sources
                .get(p)
                .map_err(|source| ServeError::Oidc { index, source })?,
        });
    }
    Ok(Authenticator::new(tokens, unauthenticated).with_identities(mtls, oidc_entries, policies))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

async fn serve(config: LoadedConfig) -> Result<(), ServeError> {
    let state = Arc::new(build_state(&config)?);
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut servers = Vec::new();
    let api = app::api_router(Arc::clone(&state));
    let listener = bind(config.server.listen).await?;
    let api_addr = listener.local_addr().unwrap_or(config.server.listen);
    servers.push(tokio::spawn(conn::serve(
        listener,
        api,
        state.tls.clone(),
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
    let mut admin_addr = None;
    if let Some(addr) = config.server.admin.listen {
        let listener = bind(addr).await?;
        admin_addr = listener.local_addr().ok();
        servers.push(tokio::spawn(conn::serve(
            listener,
            admin::admin_router(Arc::clone(&state)),
            None,
            conn::ConnLimits::health(&config.limits),
            stop_rx.clone(),
        )));
    }
    let audit_delivery = state.audit.start_delivery();
    let mut bundle_tasks = match &state.bundles {
        Some(b) => b.spawn(stop_rx.clone()),
        None => Vec::new(),
    };
    if config.reload.watch {
        bundle_tasks.push(tokio::spawn(reload::watch_loop(
            Arc::clone(&state),
            stop_rx.clone(),
        )));
    }
    state.oidc.prefetch();
    state.ready.store(true, Ordering::Release);
    tracing::info!(
        listen = %api_addr,
        health = ?health_addr,
        admin = ?admin_addr,
        reload_watch = config.reload.watch,
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
