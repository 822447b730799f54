//! The gcs sink: one object per batch, uploaded with the JSON API
//! (`uploadType=media`, `ifGenerationMatch=0` so a retried upload never
//! replaces an object).
//!
//! Credentials: a service account key (`credentials_file`, or the file
//! `GOOGLE_APPLICATION_CREDENTIALS` names). The sink signs a JWT (RS256)
//! with the key and exchanges it at the key's `token_uri` for an access
//! token (RFC 7523), cached until a minute before it expires.
//! `STORAGE_EMULATOR_HOST` (as the Google client libraries read it) points
//! the uploads at another server; without a key the uploads then carry no
//! token. The metadata server of Google's VMs is not supported.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use hyper::Method;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use serde::Deserialize;

use super::batch::{Batch, SendError, object_name};
use super::{AuditError, read_file_or_content};
use crate::bundle::fetch::http::{Http, encode};
use crate::load::FileOrContent;

/// The scope the access token is asked for.
const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
const DEFAULT_BASE: &str = "https://storage.googleapis.com";

#[derive(Deserialize)]
struct ServiceAccountKey {
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    token_uri: String,
}

struct Signer {
    email: String,
    key_id: Option<String>,
    key: ring::signature::RsaKeyPair,
    token_uri: String,
}

pub struct Gcs {
    http: Http,
    base: String,
    bucket: String,
    prefix: String,
    signer: Option<Signer>,
    token: Option<(String, Instant)>,
}

impl Gcs {
    pub fn new(
        bucket: &str,
        prefix: &str,
        credentials: Option<&FileOrContent>,
    ) -> Result<Self, AuditError> {
        let emulator = std::env::var("STORAGE_EMULATOR_HOST")
            .ok()
            .filter(|v| !v.is_empty());
        let key = match credentials {
            Some(f) => Some(
                read_file_or_content(f)
                    .map_err(|e| AuditError::Setup(format!("gcs credentials_file: {e}")))?,
            ),
            None => match std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
                Ok(p) if !p.is_empty() => Some(
                    read_file_or_content(&FileOrContent::Path(p.into())).map_err(|e| {
                        AuditError::Setup(format!("GOOGLE_APPLICATION_CREDENTIALS: {e}"))
                    })?,
                ),
                _ if emulator.is_some() => None,
                _ => {
                    return Err(AuditError::Unsupported(
                        "the gcs audit sink with the metadata server's credentials (set credentials_file or GOOGLE_APPLICATION_CREDENTIALS)"
                            .to_string(),
                    ));
                }
            },
        };
        let signer = key.as_deref().map(signer).transpose()?;
        let base = match emulator {
            Some(h) if h.contains("://") => h.trim_end_matches('/').to_string(),
            Some(h) => format!("http://{}", h.trim_end_matches('/')),
            None => DEFAULT_BASE.to_string(),
        };
        Ok(Gcs {
            http: Http::new().map_err(|e| AuditError::Setup(e.to_string()))?,
            base,
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            signer,
            token: None,
        })
    }

    async fn token(&mut self) -> Result<Option<String>, SendError> {
        let Some(s) = &self.signer else {
            return Ok(None);
        };
        if let Some((t, until)) = &self.token
            && Instant::now() < *until
        {
            return Ok(Some(t.clone()));
        }
        let assertion = s.assertion(SystemTime::now())?;
        let body = format!(
            "grant_type={}&assertion={}",
            encode("urn:ietf:params:oauth:grant-type:jwt-bearer", false),
            encode(&assertion, false)
        );
        let headers = [(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        )];
        let r = self
            .http
            .send_body(
                Method::POST,
                &s.token_uri,
                &headers,
                Bytes::from(body),
                64 * 1024,
            )
            .await?;
        if !r.status.is_success() {
            return Err(SendError::from_status(
                "gcs token exchange",
                r.status.as_u16(),
                &r.body,
            ));
        }
        #[derive(Deserialize)]
        struct TokenResponse {
            access_token: String,
            #[serde(default)]
            expires_in: Option<u64>,
        }
        let t: TokenResponse = serde_json::from_slice(&r.body)
            .map_err(|e| SendError::Transient(format!("gcs token exchange: bad answer: {e}")))?;
        let life = Duration::from_secs(t.expires_in.unwrap_or(3600).saturating_sub(60).max(1));
        self.token = Some((t.access_token.clone(), Instant::now() + life));
        Ok(Some(t.access_token))
    }

    pub async fn send(&mut self, batch: &Batch, process: &str) -> Result<(), SendError> {
        let token = self.token().await?;
        let name = object_name(&self.prefix, process, batch);
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=media&ifGenerationMatch=0&name={}",
            self.base,
            encode(&self.bucket, false),
            encode(&name, false)
        );
        let mut headers: Vec<(HeaderName, HeaderValue)> = vec![(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )];
        if let Some(t) = token {
            let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|e| SendError::rejected(format!("gcs token: {e}")))?;
            v.set_sensitive(true);
            headers.push((AUTHORIZATION, v));
        }
        let r = self
            .http
            .send_body(
                Method::POST,
                &url,
                &headers,
                Bytes::from(batch.ndjson()),
                64 * 1024,
            )
            .await?;
        match r.status.as_u16() {
            s if (200..300).contains(&s) => Ok(()),
            // The object exists: an earlier attempt of this batch got through.
            412 => Ok(()),
            401 => {
                self.token = None;
                Err(SendError::Transient(format!("gcs object {name}: HTTP 401")))
            }
            s => Err(SendError::from_status(
                &format!("gcs object {name}"),
                s,
                &r.body,
            )),
        }
    }
}

fn signer(json: &str) -> Result<Signer, AuditError> {
    let setup = |m: String| AuditError::Setup(format!("gcs service account key: {m}"));
    let k: ServiceAccountKey =
        serde_json::from_str(json).map_err(|e| setup(format!("not a service account key: {e}")))?;
    let der =
        <pki_types::PrivatePkcs8KeyDer<'static> as pki_types::pem::PemObject>::from_pem_slice(
            k.private_key.as_bytes(),
        )
        .map_err(|e| setup(format!("private_key: {e}")))?;
    let key = ring::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
        .map_err(|e| setup(format!("private_key: {e}")))?;
    check_token_uri(&k.token_uri).map_err(setup)?;
    Ok(Signer {
        email: k.client_email,
        key_id: k.private_key_id,
        key,
        token_uri: k.token_uri,
    })
}

/// The key's `token_uri` receives a signed assertion: it must be https,
/// or http to a loopback address (a local token server).
fn check_token_uri(uri: &str) -> Result<(), String> {
    if uri.starts_with("https://") {
        return Ok(());
    }
    let Some(rest) = uri.strip_prefix("http://") else {
        return Err(format!("token_uri {uri:?} is not an https:// URL"));
    };
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let host = host
        .rsplit_once(':')
        .filter(|(_, p)| p.bytes().all(|c| c.is_ascii_digit()))
        .map_or(host, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!(
            "token_uri {uri:?} is not https:// (plain http only to a loopback address)"
        ))
    }
}

impl Signer {
    /// The signed JWT of the token request.
    fn assertion(&self, now: SystemTime) -> Result<String, SendError> {
        let iat = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.key_id {
            header["kid"] = serde_json::Value::String(kid.clone());
        }
        let claims = serde_json::json!({
            "iss": self.email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": iat,
            "exp": iat + 3600,
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                signing_input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| SendError::rejected("gcs: cannot sign the token request"))?;
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_uri_must_be_https_or_loopback() {
        assert!(check_token_uri("https://oauth2.example/token").is_ok());
        assert!(check_token_uri("http://127.0.0.1:9000/token").is_ok());
        assert!(check_token_uri("http://[::1]:9000/token").is_ok());
        assert!(check_token_uri("http://localhost/token").is_ok());
        assert!(check_token_uri("http://10.0.0.1/token").is_err());
        assert!(check_token_uri("http://127.0.0.1.example/token").is_err());
        assert!(check_token_uri("ftp://127.0.0.1/token").is_err());
    }
}
