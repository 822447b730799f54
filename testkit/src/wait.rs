//! The one wait loop: poll a check until it succeeds, and on timeout say
//! what it was waiting for and the last state the check saw.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// How often [`eventually`] polls.
pub const POLL: Duration = Duration::from_millis(100);

/// What one poll returns: done with a value, or not yet (with what it saw).
pub trait Attempt {
    type Output;
    fn into_result(self) -> Result<Self::Output, String>;
}

/// `None`: not yet, nothing more to say.
impl<T> Attempt for Option<T> {
    type Output = T;
    fn into_result(self) -> Result<T, String> {
        self.ok_or_else(|| "not yet".to_owned())
    }
}

/// `Err(state)`: not yet; the last one is in the timeout's message.
impl<T, E: Display> Attempt for Result<T, E> {
    type Output = T;
    fn into_result(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Polls `check` every [`POLL`] until it succeeds, or panics after `timeout`
/// naming `what` and the last state seen.
pub async fn eventually<A, F, Fut>(what: &str, timeout: Duration, check: F) -> A::Output
where
    A: Attempt,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    eventually_every(what, timeout, POLL, check).await
}

/// [`eventually`] with another poll interval (slower for checks that run
/// `kubectl` or open port-forwards).
pub async fn eventually_every<A, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> A::Output
where
    A: Attempt,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await.into_result() {
            Ok(value) => return value,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last state:\n{last}")
            }
            Err(_) => tokio::time::sleep(interval).await,
        }
    }
}
