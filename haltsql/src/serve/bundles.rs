//! Bundle sources in `haltsql serve`: start from the cache, poll, verify,
//! swap.
//!
//! The policy set the server answers with is composed from the config's
//! file policies and the current bundle of every source. It exists only
//! once every source has a verified bundle (from its cache or its source);
//! until then `/readyz` is 503 and `/v1/verify` answers 503. A new bundle
//! replaces the old one only if its signature verifies, every policy in it
//! is valid, and the composed set still resolves every token and the
//! default policy; otherwise it is logged and counted, and the last good
//! bundle keeps serving. The swap is one pointer store: a request sees
//! either the old set or the new one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::auth::AuthSlot;
use crate::bundle::fetch::{FetchError, Fetched, Fetcher};
use crate::bundle::{self, Bundle, cache};
use crate::load::{BundleSource, LoadedConfig, LoadedPolicy};

/// Shortest wait before retrying a failed fetch.
const FIRST_RETRY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
struct Current {
    bundle: Bundle,
    /// The source's version (manifest digest or ETag).
    version: Option<String>,
    /// `cache` or `source`.
    origin: &'static str,
}

#[derive(Default)]
struct Status {
    current: Option<Current>,
    last_error: Option<String>,
    last_success: Option<SystemTime>,
    /// `result` label -> count.
    fetches: BTreeMap<&'static str, u64>,
    /// `reason` label -> count.
    rejected: BTreeMap<&'static str, u64>,
    updates: u64,
}

struct Source {
    config: BundleSource,
    status: Mutex<Status>,
}

/// Every bundle source of a server, and the slot its policy set goes to.
pub struct Bundles {
    /// The config the policy set is composed with (replaced by a reload).
    config: Mutex<Arc<LoadedConfig>>,
    oidc: Arc<super::oidc::Sources>,
    sources: Vec<Source>,
    slot: AuthSlot,
    /// Serializes check-and-swap across sources.
    compose_lock: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data: keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a downloaded bundle was not used.
struct Rejection {
    reason: &'static str,
    message: String,
}

impl Bundles {
    /// Loads each source's cache (verified again) and publishes the policy
    /// set if every source has one.
    pub fn new(
        config: Arc<LoadedConfig>,
        slot: AuthSlot,
        oidc: Arc<super::oidc::Sources>,
    ) -> Arc<Self> {
        let sources = config
            .bundle_sources
            .iter()
            .map(|c| Source {
                config: c.clone(),
                status: Mutex::new(Status::default()),
            })
            .collect();
        let me = Arc::new(Bundles {
            config: Mutex::new(config),
            oidc,
            sources,
            slot,
            compose_lock: Mutex::new(()),
        });
        for i in 0..me.sources.len() {
            me.load_cache(i);
        }
        {
            let _guard = lock(&me.compose_lock);
            let _ = me.publish_if_complete(None);
        }
        me
    }

    fn load_cache(&self, i: usize) {
        let src = &self.sources[i];
        let Some(dir) = &src.config.cache_dir else {
            return;
        };
        let name = &src.config.name;
        let cached = match cache::read(dir) {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(source = %name, error = %e, "bundle cache unreadable; ignoring it");
                return;
            }
        };
        match self.check(i, &cached.bundle, &cached.signature) {
            Ok(b) => {
                tracing::info!(source = %name, digest = %b.digest, "bundle loaded from the cache");
                let mut st = lock(&src.status);
                st.current = Some(Current {
                    bundle: b,
                    version: cached.version,
                    origin: "cache",
                });
            }
            Err(r) => {
                tracing::warn!(source = %name, reason = r.reason, error = %r.message, "cached bundle refused; ignoring it");
                *lock(&src.status).rejected.entry(r.reason).or_default() += 1;
            }
        }
    }

    /// Verifies the signature, then opens and checks the archive.
    fn check(&self, i: usize, data: &[u8], signature: &[u8]) -> Result<Bundle, Rejection> {
        let c = &self.sources[i].config;
        bundle::verify_bytes(data, signature, &c.public_keys).map_err(|e| Rejection {
            reason: "signature",
            message: e.to_string(),
        })?;
        bundle::open(
            data,
            c.name_prefix.as_deref(),
            &format!("bundle {}", c.name),
        )
        .map_err(|e| Rejection {
            reason: e.reason(),
            message: e.to_string(),
        })
    }

    /// Composes the policy set with `candidate` in place of source `i`'s
    /// bundle; publishes it if every source has a bundle. Call with
    /// `compose_lock` held.
    fn publish_if_complete(&self, candidate: Option<(usize, &Bundle)>) -> Result<bool, String> {
        let mut extra: Vec<LoadedPolicy> = Vec::new();
        for (j, s) in self.sources.iter().enumerate() {
            match candidate {
                Some((i, b)) if i == j => extra.extend(b.policies.iter().cloned()),
                _ => match &lock(&s.status).current {
                    Some(c) => extra.extend(c.bundle.policies.iter().cloned()),
                    None => return Ok(false),
                },
            }
        }
        let config = Arc::clone(&lock(&self.config));
        match super::build_auth(&config, &extra, &self.oidc) {
            Ok(auth) => {
                *self
                    .slot
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(auth));
                Ok(true)
            }
            Err(e) => {
                if candidate.is_none() {
                    tracing::error!(error = %e, "the bundles do not make a usable policy set");
                }
                Err(e.to_string())
            }
        }
    }

    /// Composes the policy set with a reloaded config (same bundle
    /// sources); on failure the previous config and policy set stay.
    pub fn set_config(&self, config: Arc<LoadedConfig>) -> Result<(), String> {
        let _guard = lock(&self.compose_lock);
        let old = std::mem::replace(&mut *lock(&self.config), config);
        match self.publish_if_complete(None) {
            Ok(_) => Ok(()),
            Err(e) => {
                *lock(&self.config) = old;
                Err(e)
            }
        }
    }

    /// Each source's state for the admin listener (no secrets: names,
    /// digests, revisions, times, counters and the last error).
    pub fn state_json(&self) -> serde_json::Value {
        let secs = |t: Option<SystemTime>| {
            t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        };
        let sources: Vec<serde_json::Value> = self
            .sources
            .iter()
            .map(|s| {
                let st = lock(&s.status);
                let current = st.current.as_ref().map(|c| {
                    serde_json::json!({
                        "digest": format!("sha256:{}", c.bundle.digest),
                        "revision": c.bundle.revision,
                        "version": c.version,
                        "origin": c.origin,
                        "policies": c.bundle.policies.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
                    })
                });
                serde_json::json!({
                    "name": s.config.name,
                    "loaded": st.current.is_some(),
                    "current": current,
                    "last_success_unix": secs(st.last_success),
                    "last_error": st.last_error,
                    "fetches": st.fetches,
                    "rejected": st.rejected,
                    "updates": st.updates,
                })
            })
            .collect();
        serde_json::Value::Array(sources)
    }

    /// Whether every source has a bundle and the policy set is published.
    pub fn ready(&self) -> bool {
        self.slot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    /// Why the server is not ready, one line per source without a bundle.
    pub fn not_ready_reasons(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter_map(|s| {
                let st = lock(&s.status);
                if st.current.is_some() {
                    return None;
                }
                Some(format!(
                    "bundle source {}: no verified bundle yet{}",
                    s.config.name,
                    st.last_error
                        .as_ref()
                        .map(|e| format!(" (last error: {e})"))
                        .unwrap_or_default()
                ))
            })
            .collect()
    }

    /// Starts one polling task per source; they end when `stop` turns true.
    pub fn spawn(
        self: &Arc<Self>,
        stop: watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..self.sources.len())
            .map(|i| {
                let me = Arc::clone(self);
                let mut stop = stop.clone();
                tokio::spawn(async move { me.poll_loop(i, &mut stop).await })
            })
            .collect()
    }

    async fn poll_loop(&self, i: usize, stop: &mut watch::Receiver<bool>) {
        let src = &self.sources[i];
        let interval = Duration::from_secs(src.config.poll_interval_seconds);
        let mut fetcher = match Fetcher::new(&src.config.location) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(source = %src.config.name, error = %e, "cannot fetch this bundle source");
                lock(&src.status).last_error = Some(e.to_string());
                return;
            }
        };
        let mut failures: u32 = 0;
        loop {
            let ok = self.poll_once(i, &mut fetcher).await;
            let delay = if ok {
                failures = 0;
                jitter(interval)
            } else {
                failures = failures.saturating_add(1);
                jitter(backoff(failures, interval))
            };
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|v| *v) => return,
            }
        }
    }

    /// One fetch; false when the source could not be read.
    async fn poll_once(&self, i: usize, fetcher: &mut Fetcher) -> bool {
        let src = &self.sources[i];
        let name = &src.config.name;
        let known = lock(&src.status)
            .current
            .as_ref()
            .and_then(|c| c.version.clone());
        let download = match fetcher.fetch(known.as_deref()).await {
            Ok(Fetched::Unchanged) => {
                let mut st = lock(&src.status);
                // The source confirmed the cached bundle.
                if let Some(c) = st.current.as_mut() {
                    c.origin = "source";
                }
                *st.fetches.entry("unchanged").or_default() += 1;
                st.last_success = Some(SystemTime::now());
                st.last_error = None;
                return true;
            }
            Ok(Fetched::New(d)) => d,
            Err(e) => {
                self.fetch_failed(i, &e);
                return false;
            }
        };
        // Unpacking and loading can take a while for a large bundle: keep
        // it off the threads that serve requests.
        let checked =
            tokio::task::block_in_place(|| self.check(i, &download.bundle, &download.signature));
        let _guard = lock(&self.compose_lock);
        let result = checked.and_then(|b| {
            let same = lock(&src.status)
                .current
                .as_ref()
                .is_some_and(|c| c.bundle.digest == b.digest);
            if same {
                return Ok((b, false));
            }
            match self.publish_if_complete(Some((i, &b))) {
                Ok(_) => Ok((b, true)),
                Err(message) => Err(Rejection {
                    reason: "conflict",
                    message,
                }),
            }
        });
        let mut st = lock(&src.status);
        st.last_success = Some(SystemTime::now());
        match result {
            Ok((b, changed)) => {
                *st.fetches
                    .entry(if changed { "updated" } else { "unchanged" })
                    .or_default() += 1;
                st.last_error = None;
                if changed {
                    st.updates += 1;
                    tracing::info!(
                        source = %name,
                        digest = %b.digest,
                        revision = b.revision.as_deref().unwrap_or("-"),
                        policies = b.policies.len(),
                        "bundle verified and in use"
                    );
                }
                if let Some(dir) = &src.config.cache_dir
                    && (changed || st.current.as_ref().is_some_and(|c| c.origin == "cache"))
                {
                    let c = cache::Cached {
                        version: download.version.clone(),
                        bundle: download.bundle,
                        signature: download.signature,
                    };
                    if let Err(e) = cache::write(dir, &c) {
                        tracing::warn!(source = %name, error = %e, dir = %dir.display(), "cannot write the bundle cache");
                    }
                }
                st.current = Some(Current {
                    bundle: b,
                    version: download.version,
                    origin: "source",
                });
                true
            }
            Err(r) => {
                *st.fetches.entry("rejected").or_default() += 1;
                *st.rejected.entry(r.reason).or_default() += 1;
                tracing::error!(
                    source = %name,
                    reason = r.reason,
                    error = %r.message,
                    "new bundle refused; the last good bundle keeps serving"
                );
                st.last_error = Some(format!("bundle refused ({}): {}", r.reason, r.message));
                // The source answered; retrying sooner would not change the bundle.
                true
            }
        }
    }

    fn fetch_failed(&self, i: usize, e: &FetchError) {
        let src = &self.sources[i];
        let mut st = lock(&src.status);
        *st.fetches.entry("error").or_default() += 1;
        st.last_error = Some(e.to_string());
        let serving = st.current.as_ref().map(|c| c.bundle.digest.clone());
        tracing::warn!(
            source = %src.config.name,
            reason = e.reason(),
            error = %e,
            serving = serving.as_deref().unwrap_or("nothing"),
            "cannot fetch the bundle"
        );
    }

    /// The bundle series of `/metrics` (Prometheus text format).
    pub fn metrics(&self, out: &mut String) {
        let mut loaded = String::new();
        let mut info = String::new();
        let mut policies = String::new();
        let mut success = String::new();
        let mut fetches = String::new();
        let mut rejected = String::new();
        let mut updates = String::new();
        for s in &self.sources {
            let st = lock(&s.status);
            let n = label(&s.config.name);
            let _ = writeln!(
                loaded,
                "haltsql_bundle_loaded{{source=\"{n}\"}} {}",
                u8::from(st.current.is_some())
            );
            if let Some(c) = &st.current {
                let _ = writeln!(
                    info,
                    "haltsql_bundle_info{{source=\"{n}\",digest=\"sha256:{}\",revision=\"{}\",origin=\"{}\"}} 1",
                    c.bundle.digest,
                    label(c.bundle.revision.as_deref().unwrap_or("")),
                    c.origin
                );
                let _ = writeln!(
                    policies,
                    "haltsql_bundle_policies{{source=\"{n}\"}} {}",
                    c.bundle.policies.len()
                );
            }
            if let Some(t) = st
                .last_success
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            {
                let _ = writeln!(
                    success,
                    "haltsql_bundle_last_success_timestamp_seconds{{source=\"{n}\"}} {}",
                    t.as_secs()
                );
            }
            for (r, v) in &st.fetches {
                let _ = writeln!(
                    fetches,
                    "haltsql_bundle_fetches_total{{source=\"{n}\",result=\"{r}\"}} {v}"
                );
            }
            for (r, v) in &st.rejected {
                let _ = writeln!(
                    rejected,
                    "haltsql_bundle_rejected_total{{source=\"{n}\",reason=\"{r}\"}} {v}"
                );
            }
            let _ = writeln!(
                updates,
                "haltsql_bundle_updates_total{{source=\"{n}\"}} {}",
                st.updates
            );
        }
        let sections = [
            (
                "haltsql_bundle_loaded",
                "gauge",
                "1 when the source has a verified bundle in use.",
                loaded,
            ),
            (
                "haltsql_bundle_info",
                "gauge",
                "The bundle in use: digest, manifest revision, and where it came from (cache or source).",
                info,
            ),
            (
                "haltsql_bundle_policies",
                "gauge",
                "Policies in the bundle in use.",
                policies,
            ),
            (
                "haltsql_bundle_last_success_timestamp_seconds",
                "gauge",
                "When the source last answered (unchanged, updated or refused bundle).",
                success,
            ),
            (
                "haltsql_bundle_fetches_total",
                "counter",
                "Fetches by result: updated, unchanged, rejected (bad bundle), error (source unreachable or failing).",
                fetches,
            ),
            (
                "haltsql_bundle_rejected_total",
                "counter",
                "Bundles refused by reason: signature, invalid_archive, invalid_policy, too_large, conflict.",
                rejected,
            ),
            (
                "haltsql_bundle_updates_total",
                "counter",
                "Bundles swapped in from the source.",
                updates,
            ),
        ];
        for (name, kind, help, body) in sections {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            out.push_str(&body);
        }
    }
}

/// Escapes a Prometheus label value.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `base` stretched or shrunk by up to 10%, so that many pods polling one
/// source do not do it in lockstep.
fn jitter(base: Duration) -> Duration {
    let mut b = [0u8; 2];
    let r = if getrandom::fill(&mut b).is_ok() {
        f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX)
    } else {
        0.5
    };
    base.mul_f64(0.9 + 0.2 * r)
}

/// 1 s, 2 s, 4 s ... after consecutive failures, never longer than the poll
/// interval: a source that is down is retried soon, and never more often
/// than once a second.
fn backoff(failures: u32, interval: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << exp).min(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_the_interval() {
        let i = Duration::from_secs(10);
        let got: Vec<u64> = (1..=6).map(|f| backoff(f, i).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff(u32::MAX, i), i);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        for _ in 0..200 {
            let j = jitter(Duration::from_secs(100)).as_secs_f64();
            assert!((90.0..=110.0).contains(&j), "{j}");
        }
    }

    #[test]
    fn label_escaping() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
