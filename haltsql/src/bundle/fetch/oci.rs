//! `oci: {ref, plain_http, auth}`: a bundle published as an OCI artifact
//! whose manifest has one layer of the bundle media type and one of the
//! signature media type (what `oras push` makes, see haltsql/README.md).
//!
//! Registry auth follows the distribution spec: a request is first sent
//! with the configured token (if any); a 401 with a `Bearer` challenge is
//! answered by asking the realm for a pull token (with the basic credentials,
//! if any), a `Basic` challenge by sending the basic credentials.

use hyper::header::{ACCEPT, AUTHORIZATION, HeaderName, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::http::{Http, Resp, encode};
use super::https::auth_header;
use super::{BUNDLE_LIMIT, Download, FetchError, Fetched, SIGNATURE_LIMIT, SMALL_LIMIT};
use crate::bundle::{BUNDLE_MEDIA_TYPE, SIGNATURE_MEDIA_TYPE};
use crate::load::SourceAuth;
use crate::load::fields::{host_of, is_loopback_host};

const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json";

/// A parsed `registry/repository[:tag][@sha256:digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Self, FetchError> {
        let bad = || {
            FetchError::Url(format!(
                "{s}: expected registry/repository[:tag][@sha256:...]"
            ))
        };
        let (name_tag, digest) = match s.split_once('@') {
            Some((a, d)) => (a, Some(d.to_string())),
            None => (s, None),
        };
        let (registry, path) = name_tag.split_once('/').ok_or_else(bad)?;
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) => (r, Some(t.to_string())),
            None => (path, None),
        };
        if registry.is_empty() || repository.is_empty() || (tag.is_none() && digest.is_none()) {
            return Err(bad());
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The host without port or brackets.
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    size: u64,
}

#[derive(Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
}

pub struct Oci {
    http: Http,
    reference: Reference,
    base: String,
    auth: SourceAuth,
    /// The Authorization header that worked last (a pull token or basic).
    session: Option<HeaderValue>,
}

impl Oci {
    pub fn new(
        http: Http,
        reference: &str,
        plain_http: bool,
        auth: SourceAuth,
    ) -> Result<Self, FetchError> {
        let reference = Reference::parse(reference)?;
        if plain_http && !is_loopback_host(reference.host()) {
            return Err(FetchError::Unsupported(format!(
                "plain_http is only allowed for loopback registries, not {}",
                reference.registry
            )));
        }
        let scheme = if plain_http { "http" } else { "https" };
        let base = format!("{scheme}://{}", reference.registry);
        let session = match &auth {
            SourceAuth::Token { .. } => auth_header(&auth),
            _ => None,
        };
        Ok(Oci {
            http,
            reference,
            base,
            auth,
            session,
        })
    }

    fn repo_url(&self, tail: &str) -> String {
        format!(
            "{}/v2/{}/{tail}",
            self.base,
            encode(&self.reference.repository, true)
        )
    }

    /// Sends with the session's credentials; answers one auth challenge.
    async fn send(
        &mut self,
        method: Method,
        url: &str,
        accept: Option<&'static str>,
        limit: u64,
    ) -> Result<Resp, FetchError> {
        let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
        if let Some(a) = accept {
            headers.push((ACCEPT, HeaderValue::from_static(a)));
        }
        let mut with_auth = headers.clone();
        if let Some(s) = &self.session {
            with_auth.push((AUTHORIZATION, s.clone()));
        }
        let r = self
            .http
            .send(method.clone(), url, &with_auth, limit)
            .await?;
        if r.status != StatusCode::UNAUTHORIZED {
            return Ok(r);
        }
        let challenge = r
            .header(WWW_AUTHENTICATE.as_str())
            .unwrap_or("")
            .to_string();
        let Some(session) = self.answer(&challenge).await? else {
            return Ok(r);
        };
        self.session = Some(session.clone());
        headers.push((AUTHORIZATION, session));
        self.http.send(method, url, &headers, limit).await
    }

    /// The Authorization header that answers `challenge`, if any.
    async fn answer(&self, challenge: &str) -> Result<Option<HeaderValue>, FetchError> {
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Ok(match &self.auth {
                SourceAuth::Basic { .. } => auth_header(&self.auth),
                _ => None,
            });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Ok(None);
        }
        let params = parse_challenge(params);
        let get = |k: &str| {
            params
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.as_str())
        };
        let Some(realm) = get("realm") else {
            return Ok(None);
        };
        if !realm.starts_with("https://") && !self.base.starts_with("http://") {
            return Err(FetchError::Protocol(format!(
                "the registry's token realm {realm} is not https"
            )));
        }
        let scope = get("scope").map_or_else(
            || format!("repository:{}:pull", self.reference.repository),
            str::to_string,
        );
        let mut url = format!(
            "{realm}{}scope={}",
            if realm.contains('?') { '&' } else { '?' },
            encode(&scope, false)
        );
        if let Some(service) = get("service") {
            url.push_str(&format!("&service={}", encode(service, false)));
        }
        let mut headers = Vec::new();
        if let SourceAuth::Basic { .. } = &self.auth
            && let Some(a) = auth_header(&self.auth)
        {
            headers.push((AUTHORIZATION, a));
        }
        let r = self
            .http
            .send(Method::GET, &url, &headers, SMALL_LIMIT)
            .await?;
        if r.status != StatusCode::OK {
            return Err(FetchError::Status {
                url: realm.to_string(),
                status: r.status.as_u16(),
            });
        }
        let t: TokenAnswer = serde_json::from_slice(&r.body)
            .map_err(|e| FetchError::Protocol(format!("{realm}: bad token answer: {e}")))?;
        let token = t
            .token
            .or(t.access_token)
            .ok_or_else(|| FetchError::Protocol(format!("{realm}: no token in the answer")))?;
        let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| FetchError::Protocol(format!("{realm}: unusable token")))?;
        v.set_sensitive(true);
        Ok(Some(v))
    }

    fn status(url: &str, r: &Resp) -> FetchError {
        FetchError::Status {
            url: url.to_string(),
            status: r.status.as_u16(),
        }
    }

    pub async fn fetch(&mut self, known: Option<&str>) -> Result<Fetched, FetchError> {
        let reference = self
            .reference
            .digest
            .clone()
            .or_else(|| self.reference.tag.clone())
            .unwrap_or_default();
        let manifest_url = self.repo_url(&format!("manifests/{reference}"));
        // A pinned digest that is already served cannot change.
        if known.is_some() && known == self.reference.digest.as_deref() {
            return Ok(Fetched::Unchanged);
        }
        if let Some(k) = known {
            let h = self
                .send(
                    Method::HEAD,
                    &manifest_url,
                    Some(MANIFEST_TYPES),
                    SMALL_LIMIT,
                )
                .await?;
            if h.status == StatusCode::OK && h.header("docker-content-digest") == Some(k) {
                return Ok(Fetched::Unchanged);
            }
        }
        let r = self
            .send(
                Method::GET,
                &manifest_url,
                Some(MANIFEST_TYPES),
                SMALL_LIMIT,
            )
            .await?;
        if r.status != StatusCode::OK {
            return Err(Self::status(&manifest_url, &r));
        }
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&r.body)));
        if let Some(pinned) = &self.reference.digest
            && *pinned != digest
        {
            return Err(FetchError::Protocol(format!(
                "{manifest_url}: the manifest's digest is {digest}, not the pinned {pinned}"
            )));
        }
        if known == Some(digest.as_str()) {
            return Ok(Fetched::Unchanged);
        }
        let m: Manifest = serde_json::from_slice(&r.body).map_err(|e| {
            FetchError::Protocol(format!("{manifest_url}: not an OCI manifest: {e}"))
        })?;
        let one = |media: &str| -> Result<&Descriptor, FetchError> {
            let mut it = m.layers.iter().filter(|l| l.media_type == media);
            match (it.next(), it.next()) {
                (Some(d), None) => Ok(d),
                _ => Err(FetchError::Protocol(format!(
                    "{manifest_url}: expected exactly one layer of media type {media}"
                ))),
            }
        };
        let (b, s) = (one(BUNDLE_MEDIA_TYPE)?, one(SIGNATURE_MEDIA_TYPE)?);
        let (bd, bs, sd, ss) = (b.digest.clone(), b.size, s.digest.clone(), s.size);
        let bundle = self.blob(&bd, bs, BUNDLE_LIMIT).await?;
        let signature = self.blob(&sd, ss, SIGNATURE_LIMIT).await?;
        Ok(Fetched::New(Download {
            version: Some(digest),
            bundle,
            signature,
        }))
    }

    async fn blob(&mut self, digest: &str, size: u64, limit: u64) -> Result<Vec<u8>, FetchError> {
        let url = self.repo_url(&format!(
            "blobs/{}",
            encode(digest, false).replace("%3A", ":")
        ));
        if size > limit {
            return Err(FetchError::TooLarge { url, limit });
        }
        let r = self.send(Method::GET, &url, None, limit).await?;
        if r.status != StatusCode::OK {
            return Err(Self::status(&url, &r));
        }
        let actual = format!("sha256:{}", hex::encode(Sha256::digest(&r.body)));
        if actual != digest || r.body.len() as u64 != size {
            return Err(FetchError::Protocol(format!(
                "{url}: the blob does not match its digest and size"
            )));
        }
        Ok(r.body.to_vec())
    }
}

/// `k="v", k2=v2` of a WWW-Authenticate challenge.
fn parse_challenge(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            (q[..end].to_string(), q.get(end + 1..).unwrap_or(""))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        out.push((k, v));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = Reference::parse("localhost:5000/corp/p:prod").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost:5000", "corp/p")
        );
        assert_eq!(r.tag.as_deref(), Some("prod"));
        assert_eq!(r.host(), "localhost");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("[::1]:5000/p@{d}")).unwrap();
        assert_eq!(r.digest.as_deref(), Some(d.as_str()));
        assert_eq!(r.host(), "::1");
        assert!(Reference::parse("p:prod").is_err());
    }

    #[test]
    fn challenges() {
        let c = parse_challenge(
            r#"realm="https://auth.example/token",service="reg",scope="repository:a/b:pull""#,
        );
        assert_eq!(c[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(c[1], ("service".into(), "reg".into()));
        assert_eq!(c[2], ("scope".into(), "repository:a/b:pull".into()));
    }
}
