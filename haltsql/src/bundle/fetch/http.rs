//! A small HTTP(S) client for the fetchers and the audit sinks: one request
//! with a size cap on the answer's body, a deadline, and redirects (the
//! credentials stay behind when a redirect leaves the host, and https never
//! redirects to http).
//!
//! Trusted CAs are the system's, read with `rustls-native-certs`, which also
//! honours `SSL_CERT_FILE` and `SSL_CERT_DIR`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, LOCATION};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::FetchError;

/// Deadline of one request, body included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Redirects followed.
const MAX_REDIRECTS: usize = 5;

/// An answer with its body read.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    /// A header as a string, if present and printable.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Clone)]
pub struct Http {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Http {
    pub fn new() -> Result<Self, FetchError> {
        let mut roots = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for c in found.certs {
            // A bad system certificate must not stop the others from working.
            let _ = roots.add(c);
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| FetchError::Setup(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Http { client })
    }

    /// Sends `method` to `url` with `headers`; reads at most `limit` body bytes.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        limit: u64,
    ) -> Result<Resp, FetchError> {
        self.send_body(method, url, headers, Bytes::new(), limit)
            .await
    }

    /// Sends `method` with `body` to `url` (the body is sent again after a
    /// redirect); reads at most `limit` body bytes of the answer.
    pub async fn send_body(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        limit: u64,
    ) -> Result<Resp, FetchError> {
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.send_inner(method, url, headers, body, limit),
        )
        .await
        .map_err(|_| FetchError::Network(format!("{url}: no answer within {REQUEST_TIMEOUT:?}")))?
    }

    async fn send_inner(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        limit: u64,
    ) -> Result<Resp, FetchError> {
        let mut uri: Uri = url
            .parse()
            .map_err(|e| FetchError::Url(format!("{url}: {e}")))?;
        let first_authority = uri.authority().cloned();
        for _ in 0..=MAX_REDIRECTS {
            let mut req = Request::builder().method(method.clone()).uri(uri.clone());
            let same_host = uri.authority() == first_authority.as_ref();
            for (k, v) in headers {
                if *k == AUTHORIZATION && !same_host {
                    continue;
                }
                req = req.header(k, v);
            }
            let req = req
                .body(Full::new(body.clone()))
                .map_err(|e| FetchError::Url(format!("{uri}: {e}")))?;
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| FetchError::Network(format!("{uri}: {}", chain(&e))))?;
            let status = resp.status();
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                let next = resp
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| {
                        FetchError::Protocol(format!("{uri}: redirect without Location"))
                    })?;
                let next = resolve(&uri, next)?;
                if uri.scheme_str() == Some("https") && next.scheme_str() != Some("https") {
                    return Err(FetchError::Protocol(format!(
                        "{uri}: refusing a redirect from https to {next}"
                    )));
                }
                uri = next;
                continue;
            }
            let (parts, body) = resp.into_parts();
            if let Some(len) = parts
                .headers
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                && len > limit
                && method != Method::HEAD
            {
                return Err(FetchError::TooLarge {
                    url: uri.to_string(),
                    limit,
                });
            }
            let body = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX))
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        FetchError::TooLarge {
                            url: uri.to_string(),
                            limit,
                        }
                    } else {
                        FetchError::Network(format!("{uri}: {e}"))
                    }
                })?
                .to_bytes();
            return Ok(Resp {
                status,
                headers: parts.headers,
                body,
            });
        }
        Err(FetchError::Protocol(format!(
            "{url}: more than {MAX_REDIRECTS} redirects"
        )))
    }
}

/// An error and its causes on one line (hyper's own message is vague).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Resolves a Location header against the request URI.
fn resolve(base: &Uri, location: &str) -> Result<Uri, FetchError> {
    let bad = |e: String| FetchError::Protocol(format!("bad redirect {location:?}: {e}"));
    if location.contains("://") {
        return location
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| bad(e.to_string()));
    }
    let scheme = base.scheme_str().unwrap_or("https");
    let authority = base
        .authority()
        .map(|a| a.as_str())
        .ok_or_else(|| bad("no host".to_string()))?;
    let path = if location.starts_with('/') {
        location.to_string()
    } else {
        let dir = base.path().rsplit_once('/').map_or("", |(d, _)| d);
        format!("{dir}/{location}")
    };
    format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| bad(e.to_string()))
}

/// Percent-encodes everything but RFC 3986 unreserved characters (and `/`
/// when `keep_slash`).
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve() {
        let base: Uri = "https://a.example:8443/v2/x/blobs/sha256:1"
            .parse()
            .unwrap();
        assert_eq!(
            resolve(&base, "/data/1?sig=2").unwrap().to_string(),
            "https://a.example:8443/data/1?sig=2"
        );
        assert_eq!(
            resolve(&base, "http://b.example/z").unwrap().to_string(),
            "http://b.example/z"
        );
        assert_eq!(
            resolve(&base, "other").unwrap().to_string(),
            "https://a.example:8443/v2/x/blobs/other"
        );
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(encode("a b/c~d+é", true), "a%20b/c~d%2B%C3%A9");
        assert_eq!(encode("a/b", false), "a%2Fb");
    }
}
