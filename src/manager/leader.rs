//! Leader election on a Lease: only the holder runs the controllers.
//!
//! - A standby replica keeps trying for the lease; API errors while standing
//!   by are retried, since nothing is at stake yet.
//! - The leader renews the lease in a task of its own, so busy reconciles
//!   can never delay a renewal. If the lease is lost, or a renewal fails and
//!   leadership can no longer be confirmed, [`run_as_leader`] returns an error
//!   at once and the controllers are dropped mid-flight: the caller exits so
//!   that Kubernetes restarts the replica as a clean standby. Continuing to
//!   reconcile after that point could overlap with the next leader.
//! - On shutdown the controllers drain first, then the lease is released, so
//!   the next leader starts at once instead of waiting for it to expire.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::controllers::metrics::Metrics;
use crate::controllers::runtime::Readiness;

/// The Lease the replicas compete for.
pub const LEASE_NAME: &str = "haltsql-operator-leader";
/// Seconds a lease stays valid without renewal: the longest a failover takes
/// after a leader dies without releasing it.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// The leader renews this many seconds before the lease would expire.
const LEASE_GRACE_SECONDS: u64 = 5;
/// Pause after a failed attempt to reach the lease while standing by.
const STANDBY_RETRY: Duration = Duration::from_secs(2);
/// How long releasing the lease may take on shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("cannot use the Lease {namespace}/{LEASE_NAME}: {source}")]
    Setup {
        namespace: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    #[error("lost the leader lease to another replica")]
    Lost,
    #[error("cannot renew the leader lease, so leadership is not certain any more: {0}")]
    Renew(#[source] kube_lease_manager::LeaseManagerError),
}

/// This replica's identity in the lease: the pod name (or host name) and a
/// random suffix, so a restarted container never mistakes its predecessor's
/// lease for its own.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "haltsql-operator".to_owned());
    // RandomState is seeded from the OS's randomness: enough for uniqueness.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{host}_{:08x}", hasher.finish() as u32)
}

/// Waits for the lease, runs `controllers` while holding it, and releases it
/// after they drained on shutdown. `Ok` means a clean stop (shutdown, or
/// shutdown while standing by); any error means the process must exit now.
pub async fn run_as_leader<F, Fut>(
    client: Client,
    namespace: &str,
    identity: String,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
    controllers: F,
) -> Result<(), LeaderError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity.clone())
        .with_field_manager(format!("haltsql-operator-{identity}"))
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .build()
        .await
        .map_err(|source| LeaderError::Setup {
            namespace: namespace.to_owned(),
            source,
        })?;
    let manager = Arc::new(manager);
    let mut shutdown = std::pin::pin!(shutdown);

    readiness.set_standby(true);
    info!(lease = LEASE_NAME, %namespace, %identity, "waiting for the leader lease");
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                info!("shutdown while standing by");
                return Ok(());
            }
            changed = manager.changed() => match changed {
                Ok(true) => break,
                Ok(false) => {}
                Err(error) => {
                    warn!(%error, "cannot reach the leader lease; retrying");
                    tokio::time::sleep(STANDBY_RETRY).await;
                }
            },
        }
    }

    // Renewal runs apart from the controllers; it reports only a loss.
    let (lost_tx, lost_rx) = oneshot::channel::<LeaderError>();
    let renewer = tokio::spawn({
        let manager = manager.clone();
        async move {
            let error = loop {
                match manager.changed().await {
                    Ok(true) => continue,
                    Ok(false) => break LeaderError::Lost,
                    Err(e) => break LeaderError::Renew(e),
                }
            };
            let _ = lost_tx.send(error);
        }
    });

    readiness.set_standby(false);
    metrics.leader.set(1);
    info!(lease = LEASE_NAME, %identity, "became leader; starting the controllers");

    // The controllers stop by themselves once `shutdown` resolves (the caller
    // wires it into them) after draining their in-flight reconciles.
    let outcome = tokio::select! {
        _ = controllers() => Ok(()),
        lost = lost_rx => Err(lost.unwrap_or(LeaderError::Lost)),
    };
    metrics.leader.set(0);
    renewer.abort();
    outcome?;

    // Hand over at once instead of making the next leader wait out the lease.
    match tokio::time::timeout(RELEASE_TIMEOUT, manager.release()).await {
        Ok(Ok(())) => info!(lease = LEASE_NAME, "released the leader lease"),
        Ok(Err(error)) => {
            warn!(%error, "could not release the leader lease; the next leader waits for it to expire")
        }
        Err(_) => {
            warn!("releasing the leader lease timed out; the next leader waits for it to expire")
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_unique_per_process_start() {
        let a = identity();
        let b = identity();
        assert_ne!(a, b);
        assert!(!a.is_empty() && a.len() < 128);
    }
}
