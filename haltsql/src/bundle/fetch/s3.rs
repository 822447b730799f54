//! `s3: {bucket, key, region, endpoint, credentials}`: the bundle at `key`,
//! its signature at `key.sig`, read with SigV4-signed GETs.
//!
//! With an `endpoint` (an S3-compatible store) requests are path-style,
//! `ENDPOINT/BUCKET/KEY`; without one, virtual-hosted on AWS,
//! `https://BUCKET.s3.REGION.amazonaws.com/KEY`.

use std::time::SystemTime;

use hyper::header::{ETAG, HeaderName, HeaderValue, IF_NONE_MATCH};
use hyper::{Method, StatusCode, Uri};

use super::http::{Http, encode};
use super::sigv4::{self, Credentials};
use super::{BUNDLE_LIMIT, Download, FetchError, Fetched, SIGNATURE_LIMIT};
use crate::bundle::SIGNATURE_SUFFIX;
use crate::load::S3Credentials;

/// Region used when neither the config nor `AWS_REGION` names one.
const DEFAULT_REGION: &str = "us-east-1";

enum CredSource {
    Static(Credentials),
    Env,
}

pub struct S3 {
    http: Http,
    /// `scheme://host[:port]` and the path prefix before the key.
    origin: String,
    host: String,
    path_prefix: String,
    key: String,
    region: String,
    creds: CredSource,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl S3 {
    pub fn new(
        http: Http,
        bucket: &str,
        key: &str,
        region: Option<&str>,
        endpoint: Option<&str>,
        credentials: &S3Credentials,
    ) -> Result<Self, FetchError> {
        let region = region
            .map(str::to_string)
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| DEFAULT_REGION.to_string());
        let (origin, path_prefix) = match endpoint {
            Some(e) => (
                e.trim_end_matches('/').to_string(),
                format!("/{}", encode(bucket, false)),
            ),
            None => (
                format!("https://{bucket}.s3.{region}.amazonaws.com"),
                String::new(),
            ),
        };
        let uri: Uri = origin
            .parse()
            .map_err(|e| FetchError::Url(format!("{origin}: {e}")))?;
        let host = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .ok_or_else(|| FetchError::Url(format!("{origin}: no host")))?;
        // An endpoint with a path (`https://host/base`) keeps it before the bucket.
        let origin_path = uri.path().trim_end_matches('/').to_string();
        let origin = format!("{}://{host}", uri.scheme_str().unwrap_or("https"));
        let creds = match credentials {
            S3Credentials::Static {
                access_key_id,
                secret_access_key,
                session_token,
            } => CredSource::Static(Credentials {
                access_key_id: access_key_id.clone(),
                secret_access_key: secret_access_key.expose().to_string(),
                session_token: session_token.as_ref().map(|t| t.expose().to_string()),
            }),
            S3Credentials::Env => CredSource::Env,
            S3Credentials::WebIdentity | S3Credentials::Instance => {
                return Err(FetchError::Unsupported(
                    "S3 credentials source web_identity and instance (use static or env)"
                        .to_string(),
                ));
            }
        };
        Ok(S3 {
            http,
            origin,
            host,
            path_prefix: format!("{origin_path}{path_prefix}"),
            key: key.to_string(),
            region,
            creds,
        })
    }

    /// Read at every request, so rotated variables are picked up.
    fn credentials(&self) -> Result<Credentials, FetchError> {
        match &self.creds {
            CredSource::Static(c) => Ok(c.clone()),
            CredSource::Env => match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                (Some(id), Some(secret)) => Ok(Credentials {
                    access_key_id: id,
                    secret_access_key: secret,
                    session_token: env("AWS_SESSION_TOKEN"),
                }),
                _ => Err(FetchError::Unsupported(
                    "credentials source env: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set"
                        .to_string(),
                )),
            },
        }
    }

    async fn get(
        &self,
        key: &str,
        if_none_match: Option<&str>,
        limit: u64,
    ) -> Result<super::http::Resp, FetchError> {
        let path = format!("{}/{}", self.path_prefix, encode(key, true));
        let url = format!("{}{path}", self.origin);
        let creds = self.credentials()?;
        let req = sigv4::Request {
            method: "GET",
            host: &self.host,
            path: &path,
            query: "",
            signed: &[],
        };
        let signed = sigv4::sign(&req, &creds, &self.region, SystemTime::now());
        let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
        for (k, v) in signed {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| FetchError::Protocol(e.to_string()))?;
            let mut value =
                HeaderValue::from_str(&v).map_err(|e| FetchError::Protocol(e.to_string()))?;
            value.set_sensitive(true);
            headers.push((name, value));
        }
        if let Some(v) = if_none_match.and_then(|k| HeaderValue::from_str(k).ok()) {
            headers.push((IF_NONE_MATCH, v));
        }
        self.http.send(Method::GET, &url, &headers, limit).await
    }

    /// A SigV4-signed `PUT` of `body` at `key` (the audit sink's objects).
    pub async fn put(
        &self,
        key: &str,
        body: bytes::Bytes,
        content_type: &'static str,
    ) -> Result<super::http::Resp, FetchError> {
        let path = format!("{}/{}", self.path_prefix, encode(key, true));
        let url = format!("{}{path}", self.origin);
        let creds = self.credentials()?;
        let payload = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&body));
        let req = sigv4::Request {
            method: "PUT",
            host: &self.host,
            path: &path,
            query: "",
            signed: &[("content-type", content_type)],
        };
        let signed = sigv4::sign_payload(&req, &creds, &self.region, SystemTime::now(), &payload);
        let mut headers: Vec<(HeaderName, HeaderValue)> = vec![(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static(content_type),
        )];
        for (k, v) in signed {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| FetchError::Protocol(e.to_string()))?;
            let mut value =
                HeaderValue::from_str(&v).map_err(|e| FetchError::Protocol(e.to_string()))?;
            value.set_sensitive(true);
            headers.push((name, value));
        }
        self.http
            .send_body(Method::PUT, &url, &headers, body, 64 * 1024)
            .await
    }

    pub async fn fetch(&mut self, known: Option<&str>) -> Result<Fetched, FetchError> {
        let shown = |k: &str| format!("s3 object {k}");
        let r = self.get(&self.key, known, BUNDLE_LIMIT).await?;
        if r.status == StatusCode::NOT_MODIFIED {
            return Ok(Fetched::Unchanged);
        }
        if r.status != StatusCode::OK {
            return Err(FetchError::Status {
                url: shown(&self.key),
                status: r.status.as_u16(),
            });
        }
        let version = r
            .headers
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let sig_key = format!("{}{SIGNATURE_SUFFIX}", self.key);
        let s = self.get(&sig_key, None, SIGNATURE_LIMIT).await?;
        if s.status != StatusCode::OK {
            return Err(FetchError::Status {
                url: shown(&sig_key),
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
