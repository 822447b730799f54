//! Per-object exponential backoff for failed reconciles. kube-runtime has none
//! built in: the error policy asks here how long to wait, and a successful
//! reconcile resets the count.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Failure counts by object key (`namespace/name`).
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure and returns how long to wait before the next try:
    /// base, 2*base, 4*base, ... capped at max.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = self.base.saturating_mul(1u32 << (*count).min(16));
        *count = count.saturating_add(1);
        delay.min(self.max)
    }

    /// Forgets the failures of an object after it reconciled cleanly.
    pub fn succeeded(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(key);
    }

    /// How many failures in a row the object has had.
    pub fn failures(&self, key: &str) -> u32 {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_until_the_cap_and_resets_on_success() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let delays: Vec<u64> = (0..6).map(|_| backoff.failed("ns/a").as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 10, 10]);
        assert_eq!(
            backoff.failed("ns/b").as_secs(),
            1,
            "objects are independent"
        );
        backoff.succeeded("ns/a");
        assert_eq!(backoff.failures("ns/a"), 0);
        assert_eq!(backoff.failed("ns/a").as_secs(), 1);
    }
}
