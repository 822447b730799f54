//! The one HTTP/1.1 client of the tests, on hyper: the operator's endpoints
//! and the server pods (through `kubectl port-forward`), all on loopback.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// How long one request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("connect {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{what} {addr}: {source}")]
    Hyper {
        what: &'static str,
        addr: SocketAddr,
        source: hyper::Error,
    },
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("{method} {addr}{path}: timed out after {TIMEOUT:?}")]
    Timeout {
        method: String,
        addr: SocketAddr,
        path: String,
    },
}

/// Status code, content type and body of one response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.body))
    }
}

/// One request on a fresh connection.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Result<Response, HttpError> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| HttpError::Connect { addr, source })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| HttpError::Hyper {
                what: "handshake",
                addr,
                source,
            })?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|source| HttpError::Hyper {
                what: "send",
                addr,
                source,
            })?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|source| HttpError::Hyper {
                what: "body",
                addr,
                source,
            })?
            .to_bytes();
        Ok(Response {
            status,
            content_type,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    tokio::time::timeout(TIMEOUT, attempt)
        .await
        .map_err(|_| HttpError::Timeout {
            method: method.to_owned(),
            addr,
            path: path.to_owned(),
        })?
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Response, HttpError> {
    request(addr, "GET", path, &[], None).await
}

/// `GET path` on a loopback port.
pub async fn get_local(port: u16, path: &str) -> Result<Response, HttpError> {
    get(SocketAddr::from(([127, 0, 0, 1], port)), path).await
}

/// `POST /v1/verify` with `{"sql": sql}` and, when given, a bearer token.
pub async fn verify(
    addr: SocketAddr,
    token: Option<&str>,
    sql: &str,
) -> Result<Response, HttpError> {
    let body = serde_json::json!({ "sql": sql }).to_string();
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = auth.as_deref() {
        headers.push(("authorization", auth));
    }
    request(addr, "POST", "/v1/verify", &headers, Some(body)).await
}
