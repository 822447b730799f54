//! A minimal HTTP/1.1 client for loopback endpoints: the server pods and the
//! operator's metrics, through `kubectl port-forward`.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Status code and body of one response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.body))
    }
}

/// One request on a fresh connection; errors are strings for the caller's message.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Result<Response, String> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake {addr}: {e}"))?;
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
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| format!("request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("{method} {addr}{path}: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body of {method} {addr}{path}: {e}"))?
            .to_bytes();
        Ok(Response {
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    tokio::time::timeout(Duration::from_secs(15), attempt)
        .await
        .map_err(|_| format!("{method} {addr}{path}: timed out"))?
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Response, String> {
    request(addr, "GET", path, &[], None).await
}

/// `POST /v1/verify` with `{"sql": sql}` and, when given, a bearer token.
pub async fn verify(addr: SocketAddr, token: Option<&str>, sql: &str) -> Result<Response, String> {
    let body = serde_json::json!({ "sql": sql }).to_string();
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = auth.as_deref() {
        headers.push(("authorization", auth));
    }
    request(addr, "POST", "/v1/verify", &headers, Some(body)).await
}

/// Sum of all series of a Prometheus counter or gauge in a text exposition.
pub fn metric_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
