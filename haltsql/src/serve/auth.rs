//! Bearer-token authentication.
//!
//! The presented token is hashed with SHA-256 and compared in constant time
//! with *every* configured hash (no early exit), so timing reveals neither
//! which token matched nor how much of a hash did.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::engine::Policy;

/// Largest Authorization header value accepted.
const MAX_AUTH_HEADER: usize = 8 * 1024;

pub struct TokenEntry {
    pub name: String,
    pub sha256: [u8; 32],
    pub policy: Arc<Policy>,
}

/// Who is calling and under which policy.
#[derive(Clone)]
pub struct Caller {
    /// The token's name; None for an unauthenticated request.
    pub token: Option<String>,
    pub policy: Arc<Policy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No Authorization header (and unauthenticated access is off).
    Missing,
    /// A header that is not `Bearer <token>`.
    Malformed,
    /// A token that matches no configured hash.
    Wrong,
}

impl AuthError {
    pub fn message(self) -> &'static str {
        match self {
            AuthError::Missing => "missing bearer token",
            AuthError::Malformed => "malformed Authorization header, expected: Bearer <token>",
            AuthError::Wrong => "invalid bearer token",
        }
    }
}

pub struct Authenticator {
    tokens: Vec<TokenEntry>,
    /// The policy for requests without a token, when
    /// `allow_unauthenticated` is on.
    unauthenticated: Option<Arc<Policy>>,
}

impl Authenticator {
    pub fn new(tokens: Vec<TokenEntry>, unauthenticated: Option<Arc<Policy>>) -> Self {
        Authenticator {
            tokens,
            unauthenticated,
        }
    }

    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let Some(value) = values.next() else {
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
        self.match_token(token).ok_or(AuthError::Wrong)
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

    #[test]
    fn selects_the_token_policy() {
        let a = auth(false);
        let c = a.authenticate(&headers(Some("Bearer token-b")));
        let c = c.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(c.token.as_deref(), Some("b"));
        assert_eq!(c.policy.name(), "pb");
        let c = a.authenticate(&headers(Some("bearer  token-a ")));
        assert_eq!(c.ok().and_then(|c| c.token).as_deref(), Some("a"));
    }

    #[test]
    fn refuses_missing_wrong_and_malformed() {
        let a = auth(false);
        assert_eq!(
            a.authenticate(&headers(None)).err(),
            Some(AuthError::Missing)
        );
        assert_eq!(
            a.authenticate(&headers(Some("Bearer token-c"))).err(),
            Some(AuthError::Wrong)
        );
        assert_eq!(
            a.authenticate(&headers(Some("Basic dXNlcjpwYXNz"))).err(),
            Some(AuthError::Malformed)
        );
        assert_eq!(
            a.authenticate(&headers(Some("Bearer"))).err(),
            Some(AuthError::Malformed)
        );
    }

    #[test]
    fn unauthenticated_uses_default_but_wrong_tokens_still_fail() {
        let a = auth(true);
        let c = a.authenticate(&headers(None));
        assert_eq!(
            c.ok().map(|c| c.policy.name().to_string()).as_deref(),
            Some("default")
        );
        assert_eq!(
            a.authenticate(&headers(Some("Bearer nope"))).err(),
            Some(AuthError::Wrong)
        );
    }
}
