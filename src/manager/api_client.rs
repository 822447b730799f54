//! The controllers' client of the Kubernetes API, with a bound on the
//! requests waiting for their answer at once.
//!
//! kube's client speaks HTTP/1.1: every request in flight holds a pooled
//! connection of its own (a TLS session and its buffers), and the pool keeps
//! what it opened. Unbounded, a cold start at 100 servers opened about 200
//! connections to the API server, since a server pass sends its applies
//! together, and the operator's memory grew with them. A watch holds its
//! connection for as long as it streams, but a permit only until the API
//! server answers with its headers, so watches never starve other requests.

use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::limit::ConcurrencyLimitLayer;

/// A client over `config` that lets at most `in_flight` requests (at least
/// one) wait for their answer at once; the others queue in order.
pub fn bounded(config: Config, in_flight: usize) -> Result<Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&ConcurrencyLimitLayer::new(in_flight.max(1)))
        .build())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A plain-HTTP server on loopback that answers every request after
    /// 200 ms and records the most requests it had in hand at once. The
    /// bound is the client's own, which no API server would let a test
    /// observe.
    async fn slow_server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (now2, most2) = (now.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let (now, most) = (now2.clone(), most2.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        // One small GET per read: enough for this client.
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        let in_hand = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(in_hand, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        let body = "{}";
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, most)
    }

    /// The most requests the server had in hand when `requests` were sent
    /// at once through a client bounded at `bound`; each is answered `{}`.
    async fn most_at_once(bound: usize, requests: usize) -> usize {
        let (url, most) = slow_server().await;
        let client = bounded(Config::new(url.parse().unwrap()), bound).unwrap();
        let sends = (0..requests).map(|i| {
            let request = http::Request::get(format!("/api/v1/namespaces/n{i}"))
                .body(Vec::new())
                .unwrap();
            client.request_text(request)
        });
        for answer in futures::future::join_all(sends).await {
            assert_eq!(answer.unwrap(), "{}");
        }
        most.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn no_more_requests_than_the_bound_wait_at_once() {
        assert_eq!(most_at_once(3, 12).await, 3);
    }

    #[tokio::test]
    async fn a_bound_wider_than_the_requests_holds_none_back() {
        assert_eq!(most_at_once(64, 12).await, 12);
    }
}
