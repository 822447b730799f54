//! Authentication: static bearer tokens, OIDC bearer JWTs and mTLS
//! client identities.
//!
//! Precedence: a request with an `Authorization` header is decided by its
//! bearer token alone (a static token first, then, when the token has the
//! shape of a JWT, the OIDC entries); a wrong token is 401 whatever
//! certificate the connection presented. Without the header, a verified
//! client certificate that matches an mTLS identity (the first in config
//! order) selects that identity's policy; a certificate that matches none
//! carries no identity. Last comes `allow_unauthenticated`.
//!
//! A presented static token is hashed with SHA-256 and compared in constant
//! time with *every* configured hash (no early exit), so timing reveals
//! neither which token matched nor how much of a hash did.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use super::identity::PeerIdentity;
use super::oidc::{self, KeySource, jwt};
use crate::engine::Policy;
use crate::load::MtlsMatch;

/// The policy set in use: `None` until every bundle source has a bundle;
/// swapped whole when a new bundle is accepted.
pub type AuthSlot = Arc<RwLock<Option<Arc<Authenticator>>>>;

/// Largest Authorization header value accepted.
const MAX_AUTH_HEADER: usize = 8 * 1024;

pub struct TokenEntry {
    pub name: String,
    pub sha256: [u8; 32],
    pub policy: Arc<Policy>,
}

/// One `server.auth.mtls.identities` entry with its policy resolved.
pub struct MtlsEntry {
    pub matcher: MtlsMatch,
    pub policy: Arc<Policy>,
}

/// How an OIDC entry selects the policy.
pub enum OidcPolicy {
    Fixed(Arc<Policy>),
    /// The claim that names a loaded policy.
    Claim(String),
}

/// One `server.auth.oidc` entry, ready to verify tokens.
pub struct OidcEntry {
    pub issuer: String,
    pub audience: String,
    pub policy: OidcPolicy,
    pub keys: Arc<KeySource>,
}

/// Who is calling and under which policy.
#[derive(Clone)]
pub struct Caller {
    /// The caller's name for the audit event: the static token's name,
    /// `oidc:<sub>` or `mtls:<the matched identity>`; None for an
    /// unauthenticated request.
    pub token: Option<String>,
    pub policy: Arc<Policy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No Authorization header (and unauthenticated access is off).
    Missing,
    /// A header that is not `Bearer <token>`.
    Malformed,
    /// A token that matches no configured hash and no OIDC entry.
    Wrong,
    /// A valid OIDC token whose `policy_claim` is missing or names no
    /// loaded policy (403: the caller is known, the policy is not).
    PolicyClaim,
    /// The token's issuer has never produced its keys (unreachable).
    KeysUnavailable,
}

impl AuthError {
    pub fn message(self) -> &'static str {
        match self {
            AuthError::Missing => "missing bearer token",
            AuthError::Malformed => "malformed Authorization header, expected: Bearer <token>",
            AuthError::Wrong => "invalid bearer token",
            AuthError::PolicyClaim => "the token's policy claim names no loaded policy",
            AuthError::KeysUnavailable => "the token issuer's keys are not available, retry",
        }
    }

    /// The HTTP status of the answer.
    pub fn status(self) -> u16 {
        match self {
            AuthError::PolicyClaim => 403,
            AuthError::KeysUnavailable => 503,
            _ => 401,
        }
    }
}

pub struct Authenticator {
    tokens: Vec<TokenEntry>,
    /// The policy for requests without a token, when
    /// `allow_unauthenticated` is on.
    unauthenticated: Option<Arc<Policy>>,
    mtls: Vec<MtlsEntry>,
    oidc: Vec<OidcEntry>,
    /// Every loaded policy by name (for `policy_claim`).
    policies: HashMap<String, Arc<Policy>>,
}

impl Authenticator {
    pub fn new(tokens: Vec<TokenEntry>, unauthenticated: Option<Arc<Policy>>) -> Self {
        Authenticator {
            tokens,
            unauthenticated,
            mtls: Vec::new(),
            oidc: Vec::new(),
            policies: HashMap::new(),
        }
    }

    /// Adds the mTLS identities and the OIDC entries.
    pub fn with_identities(
        mut self,
        mtls: Vec<MtlsEntry>,
        oidc: Vec<OidcEntry>,
        policies: HashMap<String, Arc<Policy>>,
    ) -> Self {
        self.mtls = mtls;
        self.oidc = oidc;
        self.policies = policies;
        self
    }

    /// Authenticates a request from its headers and the connection's
    /// verified client certificate (see the module comment for precedence).
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<&PeerIdentity>,
    ) -> Result<Caller, AuthError> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            if let Some(peer) = peer
                && let Some(c) = self.match_identity(peer)
            {
                return Ok(c);
            }
            return match &self.unauthenticated {
                Some(p) => Ok(Caller {
                    token: None,
                    policy: Arc::clone(p),
                }),
                None => Err(AuthError::Missing),
            };
        };
        if values.next().is_some() || value.len() > MAX_AUTH_HEADER {
            return Err(AuthError::Malformed);
        }
        let raw = value.as_bytes();
        let (scheme, token) = match raw.iter().position(|b| *b == b' ') {
            Some(i) => (&raw[..i], &raw[i + 1..]),
            None => return Err(AuthError::Malformed),
        };
        let token = trim_spaces(token);
        if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
            return Err(AuthError::Malformed);
        }
        if let Some(c) = self.match_token(token) {
            return Ok(c);
        }
        if !self.oidc.is_empty() && jwt::looks_like_jwt(token) {
            // looks_like_jwt admits ASCII only.
            let token = std::str::from_utf8(token).map_err(|_| AuthError::Wrong)?;
            return self.match_oidc(token).await;
        }
        Err(AuthError::Wrong)
    }

    fn match_identity(&self, peer: &PeerIdentity) -> Option<Caller> {
        let e = self.mtls.iter().find(|e| peer.matches(&e.matcher))?;
        let name = match &e.matcher {
            MtlsMatch::Subject(s) => format!("mtls:subject={s}"),
            MtlsMatch::DnsName(d) => format!("mtls:dns_name={d}"),
            MtlsMatch::Uri(u) => format!("mtls:uri={u}"),
        };
        Some(Caller {
            token: Some(name),
            policy: Arc::clone(&e.policy),
        })
    }

    /// Verifies a JWT against the entries of its (unverified) issuer: the
    /// signature with that issuer's keys, then audience and times, then
    /// the policy. Nothing of the token is trusted before the signature.
    async fn match_oidc(&self, token: &str) -> Result<Caller, AuthError> {
        let t = jwt::parse(token).map_err(|e| {
            tracing::debug!(error = %e, "OIDC token refused");
            AuthError::Wrong
        })?;
        let Some(iss) = t.claims.get("iss").and_then(|v| v.as_str()) else {
            return Err(AuthError::Wrong);
        };
        let mut unavailable = false;
        for e in self.oidc.iter().filter(|e| e.issuer == iss) {
            let keys = match e.keys.candidates(&t).await {
                Ok(k) => k,
                Err(oidc::KeyLookup::Unavailable) => {
                    unavailable = true;
                    continue;
                }
            };
            if !keys.iter().any(|k| t.verify(k).is_ok()) {
                tracing::debug!(issuer = iss, kid = ?t.kid, "OIDC token: no key verifies the signature");
                continue;
            }
            if let Err(why) = oidc::check_claims(&t.claims, &e.audience) {
                tracing::debug!(issuer = iss, audience = %e.audience, reason = ?why, "OIDC token refused");
                continue;
            }
            let sub = t.claims.get("sub").and_then(|v| v.as_str()).unwrap_or("-");
            let policy = match &e.policy {
                OidcPolicy::Fixed(p) => Arc::clone(p),
                OidcPolicy::Claim(claim) => {
                    let named = t.claims.get(claim).and_then(|v| v.as_str());
                    match named.and_then(|n| self.policies.get(n)) {
                        Some(p) => Arc::clone(p),
                        None => {
                            tracing::info!(issuer = iss, sub, claim = %claim, value = ?named, "OIDC token names no loaded policy");
                            return Err(AuthError::PolicyClaim);
                        }
                    }
                }
            };
            return Ok(Caller {
                token: Some(format!("oidc:{sub}")),
                policy,
            });
        }
        if unavailable {
            Err(AuthError::KeysUnavailable)
        } else {
            Err(AuthError::Wrong)
        }
    }

    /// Constant-time over the number of configured tokens.
    fn match_token(&self, token: &[u8]) -> Option<Caller> {
        let digest: [u8; 32] = Sha256::digest(token).into();
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u32;
        for (i, t) in self.tokens.iter().enumerate() {
            let eq = t.sha256.ct_eq(&digest);
            index = u32::conditional_select(&index, &(i as u32), eq);
            found |= eq;
        }
        if bool::from(found) {
            let t = self.tokens.get(index as usize)?;
            Some(Caller {
                token: Some(t.name.clone()),
                policy: Arc::clone(&t.policy),
            })
        } else {
            None
        }
    }
}

fn trim_spaces(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use axum::http::HeaderValue;

    use super::*;
    use crate::engine::Rules;

    fn policy(name: &str) -> Arc<Policy> {
        Arc::new(Policy::new(&Rules {
            name: name.into(),
            tables: BTreeMap::new(),
            ..Rules::default()
        }))
    }

    fn auth(unauth: bool) -> Authenticator {
        let tokens = vec![
            TokenEntry {
                name: "a".into(),
                sha256: Sha256::digest(b"token-a").into(),
                policy: policy("pa"),
            },
            TokenEntry {
                name: "b".into(),
                sha256: Sha256::digest(b"token-b").into(),
                policy: policy("pb"),
            },
        ];
        Authenticator::new(tokens, unauth.then(|| policy("default")))
    }

    fn headers(v: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = v
            && let Ok(v) = HeaderValue::from_str(v)
        {
            h.insert(AUTHORIZATION, v);
        }
        h
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    impl Authenticator {
        fn check(&self, h: &HeaderMap) -> Result<Caller, AuthError> {
            run(self.authenticate(h, None))
        }
    }

    #[test]
    fn selects_the_token_policy() {
        let a = auth(false);
        let c = a.check(&headers(Some("Bearer token-b")));
        let c = c.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(c.token.as_deref(), Some("b"));
        assert_eq!(c.policy.name(), "pb");
        let c = a.check(&headers(Some("bearer  token-a ")));
        assert_eq!(c.ok().and_then(|c| c.token).as_deref(), Some("a"));
    }

    #[test]
    fn refuses_missing_wrong_and_malformed() {
        let a = auth(false);
        assert_eq!(a.check(&headers(None)).err(), Some(AuthError::Missing));
        assert_eq!(
            a.check(&headers(Some("Bearer token-c"))).err(),
            Some(AuthError::Wrong)
        );
        assert_eq!(
            a.check(&headers(Some("Basic dXNlcjpwYXNz"))).err(),
            Some(AuthError::Malformed)
        );
        assert_eq!(
            a.check(&headers(Some("Bearer"))).err(),
            Some(AuthError::Malformed)
        );
    }

    #[test]
    fn a_token_wins_over_a_certificate_which_wins_over_no_credentials() {
        let a = auth(true).with_identities(
            vec![MtlsEntry {
                matcher: MtlsMatch::DnsName("agent.corp".into()),
                policy: policy("pm"),
            }],
            Vec::new(),
            HashMap::new(),
        );
        let peer = PeerIdentity {
            subject: "CN=agent".into(),
            dns_names: vec!["agent.corp".into()],
            uris: Vec::new(),
        };
        let stranger = PeerIdentity {
            dns_names: vec!["stranger.corp".into()],
            ..peer.clone()
        };
        let name = |r: Result<Caller, AuthError>| r.map(|c| c.policy.name().to_string());
        assert_eq!(
            name(run(
                a.authenticate(&headers(Some("Bearer token-a")), Some(&peer))
            )),
            Ok("pa".into())
        );
        assert_eq!(
            name(run(
                a.authenticate(&headers(Some("Bearer nope")), Some(&peer))
            )),
            Err(AuthError::Wrong)
        );
        let c = run(a.authenticate(&headers(None), Some(&peer)));
        assert_eq!(
            c.as_ref().ok().and_then(|c| c.token.clone()).as_deref(),
            Some("mtls:dns_name=agent.corp")
        );
        assert_eq!(name(c), Ok("pm".into()));
        assert_eq!(
            name(run(a.authenticate(&headers(None), Some(&stranger)))),
            Ok("default".into())
        );
    }

    #[test]
    fn unauthenticated_uses_default_but_wrong_tokens_still_fail() {
        let a = auth(true);
        let c = a.check(&headers(None));
        assert_eq!(
            c.ok().map(|c| c.policy.name().to_string()).as_deref(),
            Some("default")
        );
        assert_eq!(
            a.check(&headers(Some("Bearer nope"))).err(),
            Some(AuthError::Wrong)
        );
    }
}
