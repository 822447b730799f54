//! `https: {url, auth}`: the bundle at `url`, its signature at `url.sig`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hyper::header::{AUTHORIZATION, ETAG, HeaderName, HeaderValue, IF_NONE_MATCH};
use hyper::{Method, StatusCode};

use super::http::Http;
use super::{BUNDLE_LIMIT, Download, FetchError, Fetched, SIGNATURE_LIMIT};
use crate::bundle::SIGNATURE_SUFFIX;
use crate::load::SourceAuth;

/// The `Authorization` header for `auth` (none for `SourceAuth::None`).
pub(crate) fn auth_header(auth: &SourceAuth) -> Option<HeaderValue> {
    let v = match auth {
        SourceAuth::Basic { username, password } => format!(
            "Basic {}",
            B64.encode(format!("{username}:{}", password.expose()))
        ),
        SourceAuth::Token { token } => format!("Bearer {}", token.expose()),
        SourceAuth::ApiKey { api_key } => format!("ApiKey {}", api_key.expose()),
        SourceAuth::None => return None,
    };
    let mut v = HeaderValue::from_str(&v).ok()?;
    v.set_sensitive(true);
    Some(v)
}

pub struct Https {
    http: Http,
    url: String,
    auth: SourceAuth,
}

impl Https {
    pub fn new(http: Http, url: &str, auth: SourceAuth) -> Self {
        Https {
            http,
            url: url.to_string(),
            auth,
        }
    }

    pub async fn fetch(&mut self, known: Option<&str>) -> Result<Fetched, FetchError> {
        let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
        if let Some(a) = auth_header(&self.auth) {
            headers.push((AUTHORIZATION, a));
        }
        let mut conditional = headers.clone();
        if let Some(v) = known.and_then(|k| HeaderValue::from_str(k).ok()) {
            conditional.push((IF_NONE_MATCH, v));
        }
        let r = self
            .http
            .send(Method::GET, &self.url, &conditional, BUNDLE_LIMIT)
            .await?;
        if r.status == StatusCode::NOT_MODIFIED {
            return Ok(Fetched::Unchanged);
        }
        if r.status != StatusCode::OK {
            return Err(FetchError::Status {
                url: self.url.clone(),
                status: r.status.as_u16(),
            });
        }
        let version = r
            .headers
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // `.sig` goes on the path, before any query string.
        let sig_url = match self.url.split_once('?') {
            Some((path, query)) => format!("{path}{SIGNATURE_SUFFIX}?{query}"),
            None => format!("{}{SIGNATURE_SUFFIX}", self.url),
        };
        let s = self
            .http
            .send(Method::GET, &sig_url, &headers, SIGNATURE_LIMIT)
            .await?;
        if s.status != StatusCode::OK {
            return Err(FetchError::Status {
                url: sig_url,
                status: s.status.as_u16(),
            });
        }
        Ok(Fetched::New(Download {
            version,
            bundle: r.body.to_vec(),
            signature: s.body.to_vec(),
        }))
    }
}
