//! `policies[].bundle_source`: signed policy bundles (checked, not fetched).

use std::path::PathBuf;

use base64::Engine as _;
use ed25519_dalek::VerifyingKey;
use ed25519_dalek::pkcs8::DecodePublicKey as _;

use crate::load::Session;
use crate::load::fields::{Secret, abs_path, bucket, host_of, is_loopback_host, region, url};
use crate::load::tree::Node;
use crate::load::walk::{Doc, Map, Str, index, join};
use haltsql_names::is_dns1123_hostname;

/// Smallest `poll_interval_seconds`.
pub const MIN_POLL_SECONDS: i64 = 10;
/// Largest `poll_interval_seconds` (one day).
pub const MAX_POLL_SECONDS: i64 = 86_400;
/// Default `poll_interval_seconds`.
pub const DEFAULT_POLL_SECONDS: u64 = 300;

/// Authentication for a bundle (or audit) endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceAuth {
    /// `{type: none}` (the default).
    None,
    /// `{type: basic, username, password}` or `{username, password}`.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: Secret,
    },
    /// `{type: token, token}` or `{token}`: a bearer token.
    Token {
        /// The token.
        token: Secret,
    },
    /// `{type: api_key, api_key}` or `{api_key}`: an Elasticsearch API key
    /// (sent as `Authorization: ApiKey <api_key>`; Elasticsearch audit sinks
    /// only).
    ApiKey {
        /// The encoded API key.
        api_key: Secret,
    },
}

/// Where S3 credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3Credentials {
    /// `env`: the AWS_* variables (the default).
    Env,
    /// `static`: keys in the config (normally from `${file:...}`).
    Static {
        /// Access key id.
        access_key_id: String,
        /// Secret access key.
        secret_access_key: Secret,
        /// Session token.
        session_token: Option<Secret>,
    },
    /// `web_identity`: a projected service account token (IRSA).
    WebIdentity,
    /// `instance`: the instance metadata service.
    Instance,
}

/// Where a bundle is fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleLocation {
    /// An OCI artifact.
    Oci {
        /// `ref`: `registry/repository[:tag][@sha256:digest]`.
        reference: String,
        /// Talk plain HTTP to the registry (never with credentials).
        plain_http: bool,
        /// Registry authentication.
        auth: SourceAuth,
    },
    /// An https URL.
    Https {
        /// The URL.
        url: String,
        /// Authentication.
        auth: SourceAuth,
    },
    /// An S3 object.
    S3 {
        /// Bucket.
        bucket: String,
        /// Object key.
        key: String,
        /// Region.
        region: Option<String>,
        /// Endpoint URL for S3-compatible stores.
        endpoint: Option<String>,
        /// Credentials.
        credentials: S3Credentials,
    },
}

/// A checked `bundle_source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSource {
    /// `name`: a DNS-1123 subdomain (at most 253 characters, as a
    /// Kubernetes object name), unique in the config.
    pub name: String,
    /// `oci`, `https` or `s3`.
    pub location: BundleLocation,
    /// `public_keys`: raw 32-byte Ed25519 keys; bundles must be signed by one.
    pub public_keys: Vec<[u8; 32]>,
    /// `name_prefix`, prepended to the bundle's policy names.
    pub name_prefix: Option<String>,
    /// `poll_interval_seconds`, 10 to 86400, default 300.
    pub poll_interval_seconds: u64,
    /// `cache_dir`: where the last good bundle is kept.
    pub cache_dir: Option<PathBuf>,
}

/// Checks an OCI reference `registry[:port]/repository[:tag][@sha256:hex]`.
fn check_oci_ref(s: &str) -> Result<(), String> {
    if s.len() > 1024 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace and be at most 1024 characters".to_string());
    }
    let (name_tag, digest) = match s.split_once('@') {
        Some((a, d)) => (a, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let ok = d.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !ok {
            return Err("the digest must be sha256: and 64 lower-case hex digits".to_string());
        }
    }
    let Some((registry, path)) = name_tag.split_once('/') else {
        return Err(
            "expected registry/repository[:tag][@digest], for example ghcr.io/corp/policies:prod"
                .to_string(),
        );
    };
    let reg_ok = !registry.is_empty()
        && registry
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b':' | b'[' | b']'));
    if !reg_ok {
        return Err(format!("invalid registry {registry:?}"));
    }
    let (repo, tag) = match path.rsplit_once(':') {
        Some((r, t)) => (r, Some(t)),
        None => (path, None),
    };
    let repo_ok = !repo.is_empty()
        && repo.split('/').all(|c| {
            !c.is_empty()
                && c.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                })
                && c.as_bytes()[0].is_ascii_alphanumeric()
        });
    if !repo_ok {
        return Err(format!(
            "invalid repository {repo:?}: lower-case letters, digits, '.', '_', '-' and '/'"
        ));
    }
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && (t.as_bytes()[0].is_ascii_alphanumeric() || t.as_bytes()[0] == b'_')
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !ok {
            return Err(format!("invalid tag {t:?}"));
        }
    }
    if tag.is_none() && digest.is_none() {
        return Err("a tag or a digest is required, for example :prod or @sha256:...".to_string());
    }
    Ok(())
}

/// The auth types and the keys each takes.
const AUTH_KEYS: &[(&str, &[&str])] = &[
    ("none", &["type"]),
    ("basic", &["type", "username", "password"]),
    ("token", &["type", "token"]),
    ("api_key", &["type", "api_key"]),
];

/// `auth`, in one of two forms:
///
/// - typed: `{type: none}`, `{type: basic, username, password}`,
///   `{type: token, token}` (and `{type: api_key, api_key}` when
///   `allow_api_key`). A key that belongs to another type is unknown.
/// - short: `{username, password}`, `{token}` (or `{api_key}` when
///   `allow_api_key`): exactly one of them.
pub(crate) fn parse_auth(
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
    allow_api_key: bool,
) -> Option<SourceAuth> {
    let m = doc.open_map(node, path)?;
    let types: &[&str] = if allow_api_key {
        &["none", "basic", "token", "api_key"]
    } else {
        &["none", "basic", "token"]
    };
    let typed = m.iter().any(|(k, _, _)| k == "type");
    let ty = if typed {
        m.req(doc, "type")
            .and_then(|n| doc.choice(n, &join(path, "type"), types))?
    } else {
        let keys: &[&str] = if allow_api_key {
            &["api_key", "username", "password", "token", "type"]
        } else {
            &["username", "password", "token", "type"]
        };
        let before = doc.errors.len();
        let m = doc.map(node, path, keys)?;
        let mut forms = Vec::new();
        if allow_api_key && m.has("api_key") {
            forms.push("api_key");
        }
        if m.has("token") {
            forms.push("token");
        }
        if m.has("username") || m.has("password") {
            forms.push("basic");
        }
        if forms.len() != 1 {
            if doc.errors.len() == before {
                let one_of = if allow_api_key {
                    "api_key, token, or username with password"
                } else {
                    "token, or username with password"
                };
                doc.error(
                    node,
                    path,
                    format!(
                        "exactly one of {one_of} is required (or a type: {})",
                        types.join("|")
                    ),
                );
            }
            return None;
        }
        forms[0].to_string()
    };
    let keys = AUTH_KEYS
        .iter()
        .find(|(t, _)| *t == ty)
        .map_or(&[][..], |(_, k)| k);
    // The short form has no `type` key, so allowing it does no harm there.
    let m = doc.map(node, path, keys)?;
    let secret = |doc: &mut Doc<'_>, key: &str| {
        m.req(doc, key)
            .and_then(|n| doc.nonempty(n, &join(path, key)))
            .map(|s| Secret::new(s.value))
    };
    match ty.as_str() {
        "basic" => {
            let u = m
                .req(doc, "username")
                .and_then(|n| doc.nonempty(n, &join(path, "username")));
            let p = secret(doc, "password");
            Some(SourceAuth::Basic {
                username: u?.value,
                password: p?,
            })
        }
        "token" => Some(SourceAuth::Token {
            token: secret(doc, "token")?,
        }),
        "api_key" => Some(SourceAuth::ApiKey {
            api_key: secret(doc, "api_key")?,
        }),
        _ => Some(SourceAuth::None),
    }
}

/// The credential sources and the keys each takes.
const CREDENTIAL_KEYS: &[(&str, &[&str])] = &[
    ("env", &["source"]),
    (
        "static",
        &[
            "source",
            "access_key_id",
            "secret_access_key",
            "session_token",
        ],
    ),
    ("web_identity", &["source"]),
    ("instance", &["source"]),
];

/// The connection settings an S3 bundle source and an S3 audit sink share.
pub(crate) struct S3Access {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    /// `None` when `credentials` is present but wrong (already reported).
    pub credentials: Option<S3Credentials>,
}

/// `region`, `endpoint` and `credentials` (default: from the environment).
pub(crate) fn parse_s3_access(doc: &mut Doc<'_>, m: &Map<'_>, path: &str) -> S3Access {
    let region = m
        .get("region")
        .and_then(|n| region(doc, n, &join(path, "region")));
    let endpoint = m
        .get("endpoint")
        .and_then(|n| url(doc, n, &join(path, "endpoint"), &["https", "http"]));
    let credentials = match m.get("credentials") {
        None => Some(S3Credentials::Env),
        Some(n) => parse_s3_credentials(doc, n, &join(path, "credentials")),
    };
    S3Access {
        region,
        endpoint,
        credentials,
    }
}

/// `credentials: {source: env|static|web_identity|instance, ...}`.
pub(crate) fn parse_s3_credentials(
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
) -> Option<S3Credentials> {
    let m = doc.open_map(node, path)?;
    let source = m.req(doc, "source").and_then(|n| {
        doc.choice(
            n,
            &join(path, "source"),
            &["env", "static", "web_identity", "instance"],
        )
    })?;
    let keys = CREDENTIAL_KEYS
        .iter()
        .find(|(t, _)| *t == source)
        .map_or(&[][..], |(_, k)| k);
    let m = doc.map(node, path, keys)?;
    match source.as_str() {
        "static" => {
            let id = m
                .req(doc, "access_key_id")
                .and_then(|n| doc.nonempty(n, &join(path, "access_key_id")));
            let secret = m
                .req(doc, "secret_access_key")
                .and_then(|n| doc.nonempty(n, &join(path, "secret_access_key")));
            let session = match m.get("session_token") {
                None => Some(None),
                Some(n) => doc
                    .nonempty(n, &join(path, "session_token"))
                    .map(|s| Some(Secret::new(s.value))),
            };
            Some(S3Credentials::Static {
                access_key_id: id?.value,
                secret_access_key: Secret::new(secret?.value),
                session_token: session?,
            })
        }
        "web_identity" => Some(S3Credentials::WebIdentity),
        "instance" => Some(S3Credentials::Instance),
        _ => Some(S3Credentials::Env),
    }
}

/// Parses an Ed25519 public key: PEM (`-----BEGIN PUBLIC KEY-----`, SPKI)
/// or base64 of the 32 raw bytes. The key must be a valid curve point and not
/// of small order.
pub fn parse_ed25519_public_key(text: &str) -> Result<[u8; 32], String> {
    let t = text.trim();
    let key = if t.starts_with("-----BEGIN") {
        VerifyingKey::from_public_key_pem(t).map_err(|_| {
            "not an Ed25519 public key in PEM (SubjectPublicKeyInfo) form".to_string()
        })?
    } else {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(t)
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(t))
            .map_err(|_| "neither PEM nor base64".to_string())?;
        let arr: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
            format!(
                "base64 of {} bytes; an Ed25519 public key has 32",
                bytes.len()
            )
        })?;
        VerifyingKey::from_bytes(&arr)
            .map_err(|_| "not a valid Ed25519 public key (not a curve point)".to_string())?
    };
    if key.is_weak() {
        return Err("a weak (small-order) Ed25519 key".to_string());
    }
    Ok(key.to_bytes())
}

/// The state of a bundle source's `name_prefix`, for the config's cross-checks.
pub(crate) enum Prefix {
    /// Not set.
    Absent,
    /// Set but invalid (already reported).
    Invalid,
    /// Set and valid.
    Valid(Str),
}

impl Prefix {
    pub(crate) fn valid(&self) -> Option<&Str> {
        match self {
            Prefix::Valid(s) => Some(s),
            _ => None,
        }
    }
}

const SOURCE_KEYS: &[&str] = &[
    "name",
    "oci",
    "https",
    "s3",
    "public_keys",
    "name_prefix",
    "poll_interval_seconds",
    "cache_dir",
];

/// Checks a `bundle_source` entry. Returns the source (when valid), and its
/// name and prefix (when readable) for the config's cross-checks.
pub(crate) fn parse_bundle_source(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
) -> (Option<BundleSource>, Option<Str>, Prefix) {
    let Some(m) = doc.map(node, path, SOURCE_KEYS) else {
        return (None, None, Prefix::Invalid);
    };
    let before = doc.errors.len();
    let name = m.req(doc, "name").and_then(|n| source_name(doc, n, path));

    let forms: Vec<&str> = ["oci", "https", "s3"]
        .into_iter()
        .filter(|k| m.has(k))
        .collect();
    let location = if forms.len() != 1 {
        doc.error(node, path, "exactly one of oci, https or s3 is required");
        None
    } else {
        let form = forms[0];
        let fpath = join(path, form);
        m.get(form)
            .and_then(|n| parse_location(doc, n, &fpath, form))
    };

    let public_keys = m
        .req(doc, "public_keys")
        .and_then(|n| public_keys(doc, n, &join(path, "public_keys")));

    let prefix = m.get("name_prefix").and_then(|n| name_prefix(doc, n, path));

    let poll = match m.get("poll_interval_seconds") {
        None => Some(DEFAULT_POLL_SECONDS),
        Some(n) => doc
            .int(
                n,
                &join(path, "poll_interval_seconds"),
                MIN_POLL_SECONDS,
                MAX_POLL_SECONDS,
            )
            .and_then(|v| u64::try_from(v).ok()),
    };
    let cache_dir = match m.get("cache_dir") {
        None => Some(None),
        Some(n) => abs_path(session, doc, n, &join(path, "cache_dir")).map(Some),
    };

    let prefix_state = match prefix {
        Some(p) => Prefix::Valid(p),
        None if m.has("name_prefix") => Prefix::Invalid,
        None => Prefix::Absent,
    };
    let source = if doc.errors.len() == before {
        match (&name, location, public_keys, poll, cache_dir) {
            (Some(n), Some(location), Some(public_keys), Some(poll), Some(cache_dir)) => {
                Some(BundleSource {
                    name: n.value.clone(),
                    location,
                    public_keys,
                    name_prefix: match &prefix_state {
                        Prefix::Valid(p) => Some(p.value.clone()),
                        _ => None,
                    },
                    poll_interval_seconds: poll,
                    cache_dir,
                })
            }
            _ => None,
        }
    } else {
        None
    };
    (source, name, prefix_state)
}

/// `name`: a DNS-1123 subdomain whose labels are DNS labels.
fn source_name(doc: &mut Doc<'_>, n: &Node, path: &str) -> Option<Str> {
    let s = doc.nonempty(n, &join(path, "name"))?;
    if is_dns1123_hostname(&s.value) {
        Some(s)
    } else {
        doc.error_str(
            &s,
            format!(
                "invalid name {}: must be a lower-case DNS-1123 subdomain (at most 253 characters)",
                s.shown()
            ),
        );
        None
    }
}

/// `public_keys` (at `kpath`): at least one Ed25519 key, no key twice.
fn public_keys(doc: &mut Doc<'_>, n: &Node, kpath: &str) -> Option<Vec<[u8; 32]>> {
    let items = doc.strings(n, kpath)?;
    if items.is_empty() {
        doc.error(n, kpath, "must list at least one Ed25519 public key");
        return None;
    }
    let mut keys: Vec<[u8; 32]> = Vec::new();
    let mut ok = true;
    for s in &items {
        match parse_ed25519_public_key(&s.value) {
            Ok(k) if keys.contains(&k) => {
                doc.error_str(
                    s,
                    format!(
                        "duplicate key (same as {})",
                        index(kpath, keys.iter().position(|x| *x == k).unwrap_or(0))
                    ),
                );
                ok = false;
            }
            Ok(k) => keys.push(k),
            Err(e) => {
                doc.error_str(s, format!("invalid public key: {e}"));
                ok = false;
            }
        }
    }
    ok.then_some(keys)
}

/// `name_prefix`: ends with `.` or `-`, and makes a valid name with any
/// bundle policy name after it.
fn name_prefix(doc: &mut Doc<'_>, n: &Node, path: &str) -> Option<Str> {
    let s = doc.nonempty(n, &join(path, "name_prefix"))?;
    let probe = format!("{}a", s.value);
    if s.value.len() <= 200 && s.value.ends_with(['.', '-']) && is_dns1123_hostname(&probe) {
        Some(s)
    } else {
        doc.error_str(
            &s,
            format!(
                "invalid name_prefix {}: lower-case letters, digits, '-' and '.', ending with '.' or '-' (for example \"prod.\"), at most 200 characters",
                s.shown()
            ),
        );
        None
    }
}

fn parse_location(
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
    form: &str,
) -> Option<BundleLocation> {
    match form {
        "oci" => {
            let m = doc.map(node, path, &["ref", "plain_http", "auth"])?;
            let reference = m.req(doc, "ref").and_then(|n| {
                let s = doc.nonempty(n, &join(path, "ref"))?;
                match check_oci_ref(&s.value) {
                    Ok(()) => Some(s.value),
                    Err(e) => {
                        doc.error_str(&s, format!("invalid OCI reference {}: {e}", s.shown()));
                        None
                    }
                }
            });
            let plain_http = match m.get("plain_http") {
                None => Some(false),
                Some(n) => doc.bool(n, &join(path, "plain_http")),
            };
            let auth = match m.get("auth") {
                None => Some(SourceAuth::None),
                Some(n) => parse_auth(doc, n, &join(path, "auth"), false),
            };
            if plain_http == Some(true)
                && matches!(
                    auth,
                    Some(SourceAuth::Basic { .. } | SourceAuth::Token { .. })
                )
                && let Some(n) = m.get("auth")
            {
                doc.error(
                    n,
                    &join(path, "auth"),
                    "credentials would be sent in clear text with plain_http: true",
                );
                return None;
            }
            // The guide's rule: plain HTTP only to a registry on this host.
            if plain_http == Some(true)
                && let Some(r) = &reference
                && let Some(n) = m.get("plain_http")
            {
                let registry = r.split('/').next().unwrap_or("");
                let host = host_of(registry);
                if !is_loopback_host(host) {
                    doc.error(
                        n,
                        &join(path, "plain_http"),
                        format!(
                            "plain_http is only allowed for loopback registries (localhost, 127.0.0.0/8, [::1]), not {registry}"
                        ),
                    );
                    return None;
                }
            }
            Some(BundleLocation::Oci {
                reference: reference?,
                plain_http: plain_http?,
                auth: auth?,
            })
        }
        "https" => {
            let m = doc.map(node, path, &["url", "auth"])?;
            let u = m
                .req(doc, "url")
                .and_then(|n| url(doc, n, &join(path, "url"), &["https"]));
            let auth = match m.get("auth") {
                None => Some(SourceAuth::None),
                Some(n) => parse_auth(doc, n, &join(path, "auth"), false),
            };
            Some(BundleLocation::Https {
                url: u?,
                auth: auth?,
            })
        }
        _ => {
            let m = doc.map(
                node,
                path,
                &["bucket", "key", "region", "endpoint", "credentials"],
            )?;
            let b = m
                .req(doc, "bucket")
                .and_then(|n| bucket(doc, n, &join(path, "bucket"), 63));
            let key = m.req(doc, "key").and_then(|n| {
                let s = doc.nonempty(n, &join(path, "key"))?;
                if s.value.len() > 1024 {
                    doc.error_str(&s, "longer than 1024 bytes");
                    return None;
                }
                Some(s.value)
            });
            let S3Access {
                region: r,
                endpoint,
                credentials,
            } = parse_s3_access(doc, &m, path);
            Some(BundleLocation::S3 {
                bucket: b?,
                key: key?,
                region: r,
                endpoint,
                credentials: credentials?,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oci_refs() {
        assert!(check_oci_ref("ghcr.io/corp/p:prod").is_ok());
        assert!(check_oci_ref("localhost:5000/p@sha256:".to_string().add64().as_str()).is_ok());
        assert!(check_oci_ref("ghcr.io/corp/p").is_err());
        assert!(check_oci_ref("p:prod").is_err());
        assert!(check_oci_ref("ghcr.io/Corp/p:prod").is_err());
    }

    trait Add64 {
        fn add64(self) -> String;
    }
    impl Add64 for String {
        fn add64(self) -> String {
            format!("{self}{}", "a".repeat(64))
        }
    }
}
