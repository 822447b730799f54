//! `server.auth`: bearer tokens, OIDC providers and mTLS identities.

use std::collections::BTreeMap;

use super::policies::{PolicyRef, policy_ref};
use crate::load::Session;
use crate::load::fields::{Content, FileOrContent, check_url, file_or_content};
use crate::load::tree::Node;
use crate::load::walk::{Doc, index, join};

/// `server.auth`.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// Requests without a token use `default_policy`.
    pub allow_unauthenticated: bool,
    /// Bearer tokens.
    pub tokens: Vec<TokenConfig>,
    /// OIDC providers.
    pub oidc: Vec<OidcProvider>,
    /// mTLS identities.
    pub mtls_identities: Vec<MtlsIdentity>,
}

/// One bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenConfig {
    /// The token's name (for audit events).
    pub name: String,
    /// The policy the token selects.
    pub policy: String,
    /// SHA-256 of the token (decoded from the 64 hex digits).
    pub sha256: [u8; 32],
}

impl TokenConfig {
    /// The hash as lower-case hex.
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }
}

/// How an OIDC provider selects the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OidcPolicy {
    /// `policy`: one policy for every token of the provider.
    Fixed(String),
    /// `policy_claim`: the claim that names the policy.
    Claim(String),
}

/// One `server.auth.oidc` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcProvider {
    /// `issuer` (an https URL).
    pub issuer: String,
    /// `audience`.
    pub audience: String,
    /// `policy` or `policy_claim`.
    pub policy: OidcPolicy,
    /// `jwks_file`: keys from a file (an absolute path) or the JWKS JSON
    /// itself (a value starting with `{`) instead of the issuer.
    pub jwks_file: Option<FileOrContent>,
}

/// What an mTLS identity matches in the client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MtlsMatch {
    /// The subject distinguished name.
    Subject(String),
    /// A DNS subject alternative name.
    DnsName(String),
    /// A URI subject alternative name (for example a SPIFFE ID).
    Uri(String),
}

/// One `server.auth.mtls.identities` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtlsIdentity {
    /// What to match.
    pub matcher: MtlsMatch,
    /// The policy it selects.
    pub policy: String,
}

/// `server.auth`. `client_certificates`: `server.tls` asks clients for
/// certificates (what mTLS identities need).
pub(super) fn parse_auth(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    refs: &mut Vec<PolicyRef>,
    client_certificates: bool,
) -> Option<AuthConfig> {
    let m = doc.map(
        node,
        "server.auth",
        &["allow_unauthenticated", "tokens", "oidc", "mtls"],
    )?;
    let before = doc.errors.len();
    let mut auth = AuthConfig::default();
    if let Some(n) = m.get("allow_unauthenticated") {
        auth.allow_unauthenticated = doc
            .bool(n, "server.auth.allow_unauthenticated")
            .unwrap_or(false);
    }

    if let Some(list) = m.get("tokens")
        && let Some(items) = doc.seq(list, "server.auth.tokens")
    {
        auth.tokens = parse_tokens(doc, items, refs);
    }
    if let Some(list) = m.get("oidc")
        && let Some(items) = doc.seq(list, "server.auth.oidc")
    {
        auth.oidc = parse_oidc(session, doc, items, refs);
    }
    if let Some(mt) = m.get("mtls")
        && let Some(mm) = doc.map(mt, "server.auth.mtls", &["identities"])
        && let Some(list) = mm.get("identities")
        && let Some(items) = doc.seq(list, "server.auth.mtls.identities")
    {
        auth.mtls_identities = parse_mtls_identities(doc, list, items, refs, client_certificates);
    }

    (doc.errors.len() == before).then_some(auth)
}

/// `server.auth.tokens`: names and hashes must be unique.
fn parse_tokens(doc: &mut Doc<'_>, items: &[Node], refs: &mut Vec<PolicyRef>) -> Vec<TokenConfig> {
    let mut tokens = Vec::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut hashes: BTreeMap<[u8; 32], String> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let path = index("server.auth.tokens", i);
        let Some(tm) = doc.map(item, &path, &["name", "policy", "sha256"]) else {
            continue;
        };
        let name = tm
            .req(doc, "name")
            .and_then(|n| doc.nonempty(n, &join(&path, "name")));
        if let Some(n) = &name {
            if !crate::load::names::is_token_name(&n.value) {
                doc.error_str(
                    n,
                    format!(
                        "invalid token name {}: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 253 characters",
                        n.shown()
                    ),
                );
            } else if let Some(prev) = names.get(&n.value) {
                doc.error_str(
                    n,
                    format!("token name {} is already used by {prev}", n.shown()),
                );
            } else {
                names.insert(n.value.clone(), path.clone());
            }
        }
        let policy = tm
            .req(doc, "policy")
            .and_then(|n| policy_ref(doc, n, &join(&path, "policy"), refs));
        let hash = tm.req(doc, "sha256").and_then(|n| {
            let s = doc.string(n, &join(&path, "sha256"))?;
            let ok = s.value.len() == 64
                && s.value.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            let bytes = ok.then(|| hex::decode(&s.value).ok()).flatten();
            let Some(arr) = bytes.and_then(|b| <[u8; 32]>::try_from(b).ok()) else {
                doc.error_str(
                    &s,
                    "must be 64 lower-case hex digits (the SHA-256 of the token, as printed by haltsql hash-token)",
                );
                return None;
            };
            if let Some(prev) = hashes.get(&arr) {
                doc.error_str(
                    &s,
                    format!("the same token hash as {prev}: a token must select exactly one policy"),
                );
                return None;
            }
            hashes.insert(arr, path.clone());
            Some(arr)
        });
        if let (Some(name), Some(policy), Some(sha256)) = (name, policy, hash) {
            tokens.push(TokenConfig {
                name: name.value,
                policy,
                sha256,
            });
        }
    }
    tokens
}

/// `server.auth.oidc`.
fn parse_oidc(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    items: &[Node],
    refs: &mut Vec<PolicyRef>,
) -> Vec<OidcProvider> {
    let mut providers = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = index("server.auth.oidc", i);
        let Some(om) = doc.map(
            item,
            &path,
            &["issuer", "audience", "policy", "policy_claim", "jwks_file"],
        ) else {
            continue;
        };
        let issuer = om.req(doc, "issuer").and_then(|n| {
            let s = doc.nonempty(n, &join(&path, "issuer"))?;
            match check_url(&s.value, &["https"]) {
                Ok(()) => Some(s.value),
                Err(e) => {
                    doc.error_str(&s, format!("invalid issuer {}: {e}", s.shown()));
                    None
                }
            }
        });
        let audience = om
            .req(doc, "audience")
            .and_then(|n| doc.nonempty(n, &join(&path, "audience")));
        let policy = match (om.get("policy"), om.get("policy_claim")) {
            (Some(p), None) => {
                policy_ref(doc, p, &join(&path, "policy"), refs).map(OidcPolicy::Fixed)
            }
            (None, Some(c)) => doc
                .nonempty(c, &join(&path, "policy_claim"))
                .map(|s| OidcPolicy::Claim(s.value)),
            _ => {
                doc.error(
                    item,
                    &path,
                    "exactly one of policy or policy_claim is required",
                );
                None
            }
        };
        let jwks = match om.get("jwks_file") {
            None => Some(None),
            Some(n) => {
                file_or_content(session, doc, n, &join(&path, "jwks_file"), Content::Jwks).map(Some)
            }
        };
        if let (Some(issuer), Some(audience), Some(policy), Some(jwks_file)) =
            (issuer, audience, policy, jwks)
        {
            providers.push(OidcProvider {
                issuer,
                audience: audience.value,
                policy,
                jwks_file,
            });
        }
    }
    providers
}

/// `server.auth.mtls.identities` (`list`, read as `items`).
fn parse_mtls_identities(
    doc: &mut Doc<'_>,
    list: &Node,
    items: &[Node],
    refs: &mut Vec<PolicyRef>,
    client_certificates: bool,
) -> Vec<MtlsIdentity> {
    let mut identities = Vec::new();
    if !items.is_empty() && !client_certificates {
        doc.error(
            list,
            "server.auth.mtls.identities",
            "mTLS identities need server.tls with client_auth optional or required",
        );
    }
    for (i, item) in items.iter().enumerate() {
        let path = index("server.auth.mtls.identities", i);
        let Some(im) = doc.map(item, &path, &["subject", "dns_name", "uri", "policy"]) else {
            continue;
        };
        let present: Vec<&str> = ["subject", "dns_name", "uri"]
            .into_iter()
            .filter(|k| im.has(k))
            .collect();
        let matcher = if present.len() != 1 {
            doc.error(
                item,
                &path,
                "exactly one of subject, dns_name or uri is required",
            );
            None
        } else {
            let key = present[0];
            im.get(key)
                .and_then(|n| doc.nonempty(n, &join(&path, key)))
                .map(|s| match key {
                    "subject" => MtlsMatch::Subject(s.value),
                    "dns_name" => MtlsMatch::DnsName(s.value),
                    _ => MtlsMatch::Uri(s.value),
                })
        };
        let policy = im
            .req(doc, "policy")
            .and_then(|n| policy_ref(doc, n, &join(&path, "policy"), refs));
        if let (Some(matcher), Some(policy)) = (matcher, policy) {
            identities.push(MtlsIdentity { matcher, policy });
        }
    }
    identities
}
