//! `reload.watch: true`: reload the config when one of its files changes.
//!
//! Every [`WATCH_INTERVAL`] the watcher hashes the content of every file
//! the running config was loaded from ([`LoadedConfig::inputs`]: the
//! config, its policy and catalog files, and the files its `${file:...}`
//! placeholders read). Content, not modification times, so a Kubernetes
//! ConfigMap or Secret update (a symbolic link swapped to a new folder)
//! is seen like an edit in place; the TLS files are watched too. On a
//! change the config is loaded exactly as at start-up and the new policy
//! set (policies, tokens, OIDC entries, mTLS identities, default policy)
//! and the TLS settings (certificate, key, client CA, modes) replace the
//! old ones; a handshake or request uses either the old or the new.
//!
//! A config that does not load, or whose policy set does not resolve
//! (with the current bundles), changes nothing: its located errors are
//! logged and counted, and it is tried again at every tick until it loads
//! (a failure with the same errors is logged and counted once). Settings
//! that live in listeners, the audit sinks, the bundle pollers or the
//! logger, and turning TLS on or off, take effect at the next start; a reload that
//! changes them is applied for the rest and names them in the log and in
//! `restart_required` on the admin listener.

use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::app::AppState;
use crate::load::{self, LoadedConfig};

/// How often the watched files are hashed.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// Largest file hashed (the loader refuses larger documents anyway).
const MAX_HASHED: u64 = 64 * 1024 * 1024;

/// A hash of the names and contents of `files` (a missing file counts as
/// such, so its disappearance and return are changes too).
pub fn fingerprint(files: &[PathBuf]) -> [u8; 32] {
    let mut h = Sha256::new();
    for f in files {
        h.update(f.as_os_str().as_bytes());
        h.update([0]);
        let mut buf = Vec::new();
        match std::fs::File::open(f).and_then(|file| file.take(MAX_HASHED).read_to_end(&mut buf)) {
            Ok(_) => {
                h.update(b"+");
                h.update(Sha256::digest(&buf));
            }
            Err(_) => h.update(b"-"),
        }
    }
    h.finalize().into()
}

/// The settings whose change only a restart applies.
pub fn restart_only_changes(old: &LoadedConfig, new: &LoadedConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |changed: bool, what: &str| {
        if changed {
            out.push(what.to_string());
        }
    };
    check(old.server.listen != new.server.listen, "server.listen");
    check(
        old.server.health_listen != new.server.health_listen,
        "server.health_listen",
    );
    check(old.server.admin != new.server.admin, "server.admin");
    check(
        old.server.tls.is_some() != new.server.tls.is_some(),
        "server.tls",
    );
    check(
        old.bundle_sources != new.bundle_sources,
        "policies[].bundle_source",
    );
    check(old.reload != new.reload, "reload");
    check(old.limits != new.limits, "limits");
    check(old.logging != new.logging, "logging");
    check(old.audit != new.audit, "audit");
    out
}

/// Applies a loaded config: the new policy set first (nothing changes if
/// it does not resolve), then the config itself.
pub fn apply(state: &AppState, new: LoadedConfig) -> Result<Vec<String>, String> {
    let new = Arc::new(new);
    let old = state.current_config();
    let restart = restart_only_changes(&old, &new);
    // TLS files are read first: a bad pair changes nothing.
    let tls = match (&state.tls, &new.server.tls) {
        (Some(_), Some(t)) => {
            Some(super::tls::server_config(t).map_err(|e| format!("server.tls: {e}"))?)
        }
        _ => None,
    };
    match &state.bundles {
        Some(b) => b.set_config(Arc::clone(&new))?,
        None => {
            let auth = super::build_auth(&new, &[], &state.oidc).map_err(|e| e.to_string())?;
            *state
                .auth
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(auth));
        }
    }
    if let (Some(slot), Some(tls)) = (&state.tls, tls) {
        *slot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tls;
    }
    *state
        .config
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = new;
    state.oidc.prefetch();
    Ok(restart)
}

fn record_failure(state: &AppState, errors: Vec<String>) {
    let mut stats = state.reload_stats();
    if stats.last_errors == errors && stats.last_failure.is_some() {
        return;
    }
    for e in &errors {
        tracing::error!(error = %e, "config reload failed; keeping the previous config");
    }
    stats.failures += 1;
    stats.last_failure = Some(SystemTime::now());
    stats.last_errors = errors;
}

/// One reload attempt of `path`.
pub fn reload(state: &AppState, path: &Path) {
    let new = match load::load_config(path) {
        Ok(c) => c,
        Err(errors) => {
            record_failure(state, errors.iter().map(ToString::to_string).collect());
            return;
        }
    };
    let sha = new.sha256.clone();
    match apply(state, new) {
        Ok(restart) => {
            let mut stats = state.reload_stats();
            stats.successes += 1;
            stats.last_success = Some(SystemTime::now());
            stats.last_errors.clear();
            stats.last_failure = None;
            for r in restart {
                if !stats.restart_required.contains(&r) {
                    stats.restart_required.push(r);
                }
            }
            tracing::info!(sha256 = %sha, restart_required = ?stats.restart_required, "config reloaded");
        }
        Err(e) => record_failure(state, vec![e]),
    }
}

/// The files a config is watched by: its inputs and its TLS files.
pub fn watched(config: &LoadedConfig) -> Vec<PathBuf> {
    let mut files = config.inputs.clone();
    if let Some(t) = &config.server.tls {
        files.extend(super::tls::files(t));
    }
    files
}

/// Watches the running config's files until `stop` turns true.
pub async fn watch_loop(state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let path = state.current_config().file.clone();
    let mut seen = fingerprint(&watched(&state.current_config()));
    loop {
        tokio::select! {
            () = tokio::time::sleep(WATCH_INTERVAL) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        let inputs = watched(&state.current_config());
        let st = Arc::clone(&state);
        let failing = st.reload_stats().last_failure.is_some();
        let path = path.clone();
        // Hashing and loading read files: off the async workers.
        let outcome = tokio::task::spawn_blocking(move || {
            let now = fingerprint(&inputs);
            if now != seen || failing {
                reload(&st, &path);
                // The new config may read other files: start from them.
                Some(fingerprint(&watched(&st.current_config())))
            } else {
                None
            }
        })
        .await;
        if let Ok(Some(fp)) = outcome {
            seen = fp;
        }
    }
}
