//! OIDC bearer tokens: JWTs signed by an issuer's published keys.
//!
//! Keys come from the issuer (discovery at
//! `<issuer>/.well-known/openid-configuration`, then its `jwks_uri`, both
//! over HTTPS with the system roots or `SSL_CERT_FILE`) or from `jwks_file`
//! (a path, re-read on demand, or the JWKS JSON itself). A key set is
//! cached; a token whose `kid` is unknown triggers a refresh, at most one
//! per [`REFRESH_MIN_INTERVAL`] per source (so a stream of forged `kid`s
//! cannot make the server hammer the issuer), which is how a rotated key is
//! picked up. Cached issuer keys are also refreshed in the background once
//! older than [`MAX_AGE`]; a failed refresh keeps the previous keys.

pub mod alg;
pub mod jwks;
pub mod jwt;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyper::Method;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::bundle::fetch::http::Http;
use crate::load::{FileOrContent, OidcProvider};

use jwks::Jwk;
use jwt::Unverified;

/// Tolerance for `exp` and `nbf` against this machine's clock.
pub const CLOCK_SKEW_SECONDS: i64 = 60;
/// Fewest seconds between two refreshes of one key source.
pub const REFRESH_MIN_INTERVAL: Duration = Duration::from_secs(10);
/// Issuer keys older than this are refreshed in the background.
pub const MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// Largest discovery or JWKS document read.
const MAX_DOCUMENT: u64 = 1024 * 1024;

#[derive(Debug, Error)]
pub enum OidcError {
    #[error("{0}")]
    Fetch(String),
    #[error("cannot read jwks_file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Jwks {
        what: String,
        source: jwks::JwksError,
    },
    #[error("{0}")]
    Discovery(String),
    #[error("cannot set up the HTTPS client: {0}")]
    Setup(String),
}

enum Origin {
    /// Discovery then `jwks_uri`.
    Issuer { issuer: String, http: Box<Http> },
    /// A file, re-read on refresh.
    File(PathBuf),
    /// Fixed keys (`jwks_file` given as content).
    Fixed,
}

struct KeySet {
    keys: Arc<Vec<Jwk>>,
    fetched: Instant,
}

/// The keys of one issuer or `jwks_file`, shared by every config entry
/// (and every reload) that names the same source.
pub struct KeySource {
    origin: Origin,
    label: String,
    keys: RwLock<Option<KeySet>>,
    /// When the last refresh started (serialises refreshes).
    last_refresh: tokio::sync::Mutex<Option<Instant>>,
}

/// Why no key could be found for a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLookup {
    /// The source has never produced keys (issuer unreachable, say).
    Unavailable,
}

impl KeySource {
    fn new(origin: Origin, label: String, initial: Option<Vec<Jwk>>) -> Self {
        KeySource {
            origin,
            label,
            keys: RwLock::new(initial.map(|k| KeySet {
                keys: Arc::new(k),
                fetched: Instant::now(),
            })),
            last_refresh: tokio::sync::Mutex::new(None),
        }
    }

    fn current(&self) -> Option<(Arc<Vec<Jwk>>, Instant)> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|s| (Arc::clone(&s.keys), s.fetched))
    }

    /// The keys that may verify `token`: those with its `kid` (every
    /// suitable key when it has none). An unknown `kid` refreshes the set
    /// first (rate-limited).
    pub async fn candidates(self: &Arc<Self>, token: &Unverified) -> Result<Vec<Jwk>, KeyLookup> {
        let pick = |keys: &[Jwk]| -> Vec<Jwk> {
            keys.iter()
                .filter(|k| k.suits(token.alg))
                .filter(|k| token.kid.is_none() || k.kid == token.kid)
                .cloned()
                .collect()
        };
        if let Some((keys, fetched)) = self.current() {
            let found = pick(&keys);
            if !found.is_empty() {
                if matches!(self.origin, Origin::Issuer { .. }) && fetched.elapsed() > MAX_AGE {
                    let me = Arc::clone(self);
                    tokio::spawn(async move { me.refresh().await });
                }
                return Ok(found);
            }
        }
        self.refresh().await;
        match self.current() {
            Some((keys, _)) => Ok(pick(&keys)),
            None => Err(KeyLookup::Unavailable),
        }
    }

    /// Loads the keys again unless that was tried less than
    /// [`REFRESH_MIN_INTERVAL`] ago; on failure the old keys stay.
    pub async fn refresh(&self) {
        if matches!(self.origin, Origin::Fixed) {
            return;
        }
        let mut last = self.last_refresh.lock().await;
        if last.is_some_and(|t| t.elapsed() < REFRESH_MIN_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        match self.load().await {
            Ok(keys) => {
                tracing::info!(source = %self.label, keys = keys.len(), "OIDC keys loaded");
                *self
                    .keys
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(KeySet {
                    keys: Arc::new(keys),
                    fetched: Instant::now(),
                });
            }
            Err(e) => {
                tracing::warn!(source = %self.label, error = %e, "cannot load the OIDC keys; keeping the previous ones");
            }
        }
    }

    async fn load(&self) -> Result<Vec<Jwk>, OidcError> {
        match &self.origin {
            Origin::Fixed => Err(OidcError::Discovery("fixed keys".into())),
            Origin::File(path) => read_jwks_file(path),
            Origin::Issuer { issuer, http } => fetch_issuer_keys(http, issuer).await,
        }
    }
}

fn read_jwks_file(path: &std::path::Path) -> Result<Vec<Jwk>, OidcError> {
    let data = std::fs::read(path).map_err(|source| OidcError::Read {
        path: path.display().to_string(),
        source,
    })?;
    jwks::parse(&data).map_err(|source| OidcError::Jwks {
        what: format!("jwks_file {}", path.display()),
        source,
    })
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

async fn get(http: &Http, url: &str) -> Result<bytes::Bytes, OidcError> {
    let resp = http
        .send(Method::GET, url, &[], MAX_DOCUMENT)
        .await
        .map_err(|e| OidcError::Fetch(e.to_string()))?;
    if !resp.status.is_success() {
        return Err(OidcError::Fetch(format!("{url}: HTTP {}", resp.status)));
    }
    Ok(resp.body)
}

async fn fetch_issuer_keys(http: &Http, issuer: &str) -> Result<Vec<Jwk>, OidcError> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let body = get(http, &url).await?;
    let d: Discovery =
        serde_json::from_slice(&body).map_err(|e| OidcError::Discovery(format!("{url}: {e}")))?;
    // OpenID Connect Discovery 1.0, section 4.3: the issuer must match exactly.
    if d.issuer != issuer {
        return Err(OidcError::Discovery(format!(
            "{url} names issuer {:?}, not {issuer:?}",
            d.issuer
        )));
    }
    if !d.jwks_uri.starts_with("https://") {
        return Err(OidcError::Discovery(format!(
            "{url}: jwks_uri {:?} is not https",
            d.jwks_uri
        )));
    }
    let body = get(http, &d.jwks_uri).await?;
    jwks::parse(&body).map_err(|source| OidcError::Jwks {
        what: d.jwks_uri.clone(),
        source,
    })
}

/// Key sources by (issuer, jwks_file), kept across policy-set rebuilds and
/// reloads so a cache survives them.
#[derive(Default)]
pub struct Sources {
    map: Mutex<HashMap<String, Arc<KeySource>>>,
}

impl Sources {
    /// The key source of `p`, made (and, for a file or content, read) on
    /// first use. Issuer keys are fetched on the first token or by
    /// [`Sources::prefetch`].
    pub fn get(&self, p: &OidcProvider) -> Result<Arc<KeySource>, OidcError> {
        let key = match &p.jwks_file {
            None => format!("issuer {}", p.issuer),
            Some(FileOrContent::Path(path)) => format!("file {}", path.display()),
            Some(FileOrContent::Content(c)) => {
                format!("content {}", hex::encode(Sha256::digest(c.expose())))
            }
        };
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(s) = map.get(&key) {
            return Ok(Arc::clone(s));
        }
        let source = match &p.jwks_file {
            None => {
                let http = Http::new().map_err(|e| OidcError::Setup(e.to_string()))?;
                KeySource::new(
                    Origin::Issuer {
                        issuer: p.issuer.clone(),
                        http: Box::new(http),
                    },
                    p.issuer.clone(),
                    None,
                )
            }
            Some(FileOrContent::Path(path)) => {
                let keys = read_jwks_file(path)?;
                KeySource::new(
                    Origin::File(path.clone()),
                    format!("jwks_file {}", path.display()),
                    Some(keys),
                )
            }
            Some(FileOrContent::Content(c)) => {
                let keys =
                    jwks::parse(c.expose().as_bytes()).map_err(|source| OidcError::Jwks {
                        what: format!("the jwks_file content of issuer {}", p.issuer),
                        source,
                    })?;
                KeySource::new(
                    Origin::Fixed,
                    format!("jwks_file content ({})", p.issuer),
                    Some(keys),
                )
            }
        };
        let source = Arc::new(source);
        map.insert(key, Arc::clone(&source));
        Ok(source)
    }

    /// Starts fetching every issuer's keys that are not loaded yet.
    pub fn prefetch(&self) {
        let all: Vec<Arc<KeySource>> = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for s in all {
            if s.current().is_none() {
                tokio::spawn(async move { s.refresh().await });
            }
        }
    }
}

/// Why verified claims are not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimError {
    Audience,
    Expired,
    NoExpiry,
    NotYetValid,
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn number(v: Option<&serde_json::Value>) -> Option<i64> {
    let v = v?;
    v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))
}

/// Checks `aud` (a string or an array holding `audience`), `exp`
/// (required) and `nbf`, with [`CLOCK_SKEW_SECONDS`].
pub fn check_claims(
    claims: &serde_json::Map<String, serde_json::Value>,
    audience: &str,
) -> Result<(), ClaimError> {
    let aud_ok = match claims.get("aud") {
        Some(serde_json::Value::String(a)) => a == audience,
        Some(serde_json::Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !aud_ok {
        return Err(ClaimError::Audience);
    }
    let now = now();
    let exp = number(claims.get("exp")).ok_or(ClaimError::NoExpiry)?;
    if now > exp.saturating_add(CLOCK_SKEW_SECONDS) {
        return Err(ClaimError::Expired);
    }
    if let Some(nbf) = number(claims.get("nbf"))
        && now < nbf.saturating_sub(CLOCK_SKEW_SECONDS)
    {
        return Err(ClaimError::NotYetValid);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claims(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn audience_string_or_array() {
        let exp = now() + 100;
        assert_eq!(
            check_claims(&claims(json!({"aud": "a", "exp": exp})), "a"),
            Ok(())
        );
        assert_eq!(
            check_claims(&claims(json!({"aud": ["x", "a"], "exp": exp})), "a"),
            Ok(())
        );
        assert_eq!(
            check_claims(&claims(json!({"aud": ["x"], "exp": exp})), "a"),
            Err(ClaimError::Audience)
        );
        assert_eq!(
            check_claims(&claims(json!({"exp": exp})), "a"),
            Err(ClaimError::Audience)
        );
    }

    #[test]
    fn expiry_and_not_before_with_skew() {
        let n = now();
        let c = |exp: i64, nbf: i64| claims(json!({"aud": "a", "exp": exp, "nbf": nbf}));
        assert_eq!(check_claims(&c(n - 30, n - 100), "a"), Ok(()));
        assert_eq!(
            check_claims(&c(n - 120, n - 200), "a"),
            Err(ClaimError::Expired)
        );
        assert_eq!(check_claims(&c(n + 500, n + 30), "a"), Ok(()));
        assert_eq!(
            check_claims(&c(n + 500, n + 120), "a"),
            Err(ClaimError::NotYetValid)
        );
        assert_eq!(
            check_claims(&claims(json!({"aud": "a"})), "a"),
            Err(ClaimError::NoExpiry)
        );
    }
}
