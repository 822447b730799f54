//! Field checks shared by the config sections and the bundle sources:
//! secrets, absolute paths, files given as a path or as their content,
//! bucket and region names, URLs and hosts.

use std::fmt;
use std::path::{Path, PathBuf};

use super::Session;
use super::tree::Node;
use super::walk::Doc;

/// A secret string (password, token, key). `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret value.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An absolute path (rooted when the options have a root).
pub(crate) fn abs_path(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
) -> Option<PathBuf> {
    let s = doc.nonempty(node, path)?;
    let p = Path::new(&s.value);
    if !p.is_absolute() {
        doc.error_str(&s, format!("{} must be an absolute path", s.shown()));
        return None;
    }
    if s.value.contains('\0') {
        doc.error_str(&s, "path must not contain NUL");
        return None;
    }
    Some(super::fs::rooted(session.opts.root.as_deref(), p))
}

fn bucket_ok(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    b.len() >= 3
        && b.len() <= max
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'-' | b'_')
        })
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

pub(crate) fn bucket(doc: &mut Doc<'_>, node: &Node, path: &str, max: usize) -> Option<String> {
    let s = doc.nonempty(node, path)?;
    if bucket_ok(&s.value, max) && (max != 63 || !s.value.contains('_')) {
        Some(s.value)
    } else {
        doc.error_str(
            &s,
            format!(
                "invalid bucket name {}: 3 to {max} lower-case letters, digits, '.' and '-'{}, starting and ending with a letter or digit",
                s.shown(),
                if max == 63 { "" } else { " and '_'" }
            ),
        );
        None
    }
}

/// Checks a URL: `scheme://host[:port][/...]`, one of `schemes`, no
/// credentials in it, no whitespace or control characters.
pub(crate) fn check_url(s: &str, schemes: &[&str]) -> Result<(), String> {
    let expected = schemes
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(" or ");
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(format!("expected a {expected} URL"));
    };
    if !schemes.contains(&scheme) {
        return Err(format!("expected a {expected} URL"));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("URLs must not contain whitespace".to_string());
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("credentials in the URL are not allowed; use auth".to_string());
    }
    let host = if authority.starts_with('[') {
        authority
            .split_once(']')
            .map_or("", |(h, _)| h.trim_start_matches('['))
    } else {
        authority.split(':').next().unwrap_or("")
    };
    if host.is_empty() {
        return Err("the URL has no host".to_string());
    }
    if let Some(port) = authority
        .strip_prefix(&format!("[{host}]"))
        .or_else(|| authority.strip_prefix(host))
        && let Some(port) = port.strip_prefix(':')
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err("invalid port".to_string());
    }
    Ok(())
}

pub(crate) fn region(doc: &mut Doc<'_>, node: &Node, path: &str) -> Option<String> {
    let s = doc.nonempty(node, path)?;
    if s.value.len() <= 64
        && s.value
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        Some(s.value)
    } else {
        doc.error_str(
            &s,
            format!(
                "invalid region {}: lower-case letters, digits and '-'",
                s.shown()
            ),
        );
        None
    }
}

pub(crate) fn url(doc: &mut Doc<'_>, node: &Node, path: &str, schemes: &[&str]) -> Option<String> {
    let s = doc.nonempty(node, path)?;
    match check_url(&s.value, schemes) {
        Ok(()) => Some(s.value),
        Err(e) => {
            doc.error_str(&s, format!("invalid URL {}: {e}", s.shown()));
            None
        }
    }
}

/// The host of `host[:port]` or `[v6]:port`, without brackets.
pub fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    registry.split(':').next().unwrap_or("")
}

/// Whether a host names the loopback interface: `localhost`, 127.0.0.0/8
/// or `::1`. Names other than `localhost` are not resolved: a DNS answer is
/// not proof of being local.
pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// A file setting that takes either a path or the file's content.
///
/// With the operator's Secret references, `${file:...}` placeholders resolve
/// to a file's *content*, so keys such as `ca_file` accept both: a value
/// that starts with `-----BEGIN` (PEM) or `{` (JSON) is content, anything
/// else must be an absolute path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOrContent {
    /// An absolute path (rooted when the options have a root).
    Path(PathBuf),
    /// The content itself.
    Content(Secret),
}

/// What the content form of a [`FileOrContent`] holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Content {
    /// PEM certificates.
    Certificates,
    /// A PEM private key.
    PrivateKey,
    /// A JSON object (a service account key).
    Json,
    /// A JSON Web Key Set (a JSON object with a `keys` array).
    Jwks,
}

/// A path or the content itself (see [`FileOrContent`]). Error messages
/// never show content.
pub(crate) fn file_or_content(
    session: &Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
    content: Content,
) -> Option<FileOrContent> {
    let s = doc.nonempty(node, path)?;
    let text = s.value.trim_start();
    let form = match content {
        Content::Certificates => "PEM certificates (-----BEGIN CERTIFICATE-----)",
        Content::PrivateKey => "a PEM private key (-----BEGIN PRIVATE KEY-----)",
        Content::Json => "the service account key JSON",
        Content::Jwks => "a JWKS JSON document ({\"keys\": [...]})",
    };
    let is_content = match content {
        Content::Json | Content::Jwks => text.starts_with('{'),
        _ => text.starts_with("-----BEGIN"),
    };
    if is_content {
        let ok = match content {
            Content::Json => {
                serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
            }
            Content::Jwks => serde_json::from_str::<serde_json::Value>(text)
                .is_ok_and(|v| v.get("keys").is_some_and(serde_json::Value::is_array)),
            Content::Certificates => pem_labels(text)
                .is_some_and(|l| !l.is_empty() && l.iter().all(|l| *l == "CERTIFICATE")),
            Content::PrivateKey => pem_labels(text).is_some_and(|l| {
                l.len() == 1 && l[0].ends_with("PRIVATE KEY") && l[0] != "ENCRYPTED PRIVATE KEY"
            }),
        };
        if !ok {
            doc.error_str(
                &s,
                format!("the content is not {form}; expected an absolute path or {form}"),
            );
            return None;
        }
        return Some(FileOrContent::Content(Secret::new(s.value)));
    }
    if !Path::new(&s.value).is_absolute() || s.value.contains('\0') {
        doc.error_str(
            &s,
            format!(
                "{} is not an absolute path; expected an absolute path or {form}",
                s.shown()
            ),
        );
        return None;
    }
    Some(FileOrContent::Path(super::fs::rooted(
        session.opts.root.as_deref(),
        Path::new(&s.value),
    )))
}

/// The labels of the PEM blocks in `text` (`-----BEGIN L-----` ...
/// `-----END L-----`), or `None` when the framing is broken or there is
/// text outside the blocks. The base64 inside is not decoded here.
fn pem_labels(text: &str) -> Option<Vec<&str>> {
    let mut labels = Vec::new();
    let mut open: Option<&str> = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() {
            continue;
        }
        if let Some(l) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            if open.is_some() {
                return None;
            }
            open = Some(l);
        } else if let Some(l) = line
            .strip_prefix("-----END ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            if open != Some(l) {
                return None;
            }
            labels.push(l);
            open = None;
        } else if open.is_none() {
            return None;
        }
    }
    open.is_none().then_some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(check_url("https://example.com/x", &["https"]).is_ok());
        assert!(check_url("https://example.com:8443", &["https"]).is_ok());
        assert!(check_url("https://[::1]:8443/a", &["https"]).is_ok());
        assert!(check_url("http://example.com", &["https"]).is_err());
        assert!(check_url("https://u:p@example.com", &["https"]).is_err());
        assert!(check_url("https://", &["https"]).is_err());
        assert!(check_url("https://a:0", &["https"]).is_err());
        assert!(check_url("https://a b", &["https"]).is_err());
    }

    #[test]
    fn loopback() {
        for h in ["localhost", "127.0.0.1", "127.3.2.1", "::1", "LOCALHOST"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "10.0.0.1",
            "registry.local",
            "localhost.example",
            "0.0.0.0",
            "::",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
