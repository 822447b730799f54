//! Leader election on a Lease: only the holder runs the controllers; a
//! replica that loses the lease exits at once so Kubernetes restarts it.

use std::future::Future;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tracing::{error, info};

use crate::metrics::Metrics;
use crate::runtime::Readiness;

/// The Lease the replicas compete for.
pub const LEASE_NAME: &str = "haltsql-operator-leader";
/// Seconds a lease stays valid without renewal: the longest a failover takes.
pub const LEASE_DURATION_SECONDS: u64 = 15;
const LEASE_GRACE_SECONDS: u64 = 5;

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error("lost the leader lease")]
    Lost,
}

/// This replica's identity in the lease: the pod name when in a pod.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "haltsql-operator".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Waits for the lease, runs `controllers` while holding it, and releases it
/// after they drained on shutdown. Returns `LeaderError::Lost` if the lease is
/// lost while leading: the caller must exit, since in-flight work may overlap
/// with the new leader's otherwise.
pub async fn run_as_leader<F, Fut>(
    client: Client,
    namespace: &str,
    readiness: Readiness,
    metrics: Metrics,
    shutdown: Shared<BoxFuture<'static, ()>>,
    controllers: F,
) -> Result<(), LeaderError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity())
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .build()
        .await?;
    readiness.set_standby(true);
    info!(lease = LEASE_NAME, %namespace, "waiting for the leader lease");
    loop {
        tokio::select! {
            _ = shutdown.clone() => return Ok(()),
            is_leader = manager.changed() => if is_leader? { break },
        }
    }
    readiness.set_standby(false);
    metrics.leader.set(1);
    info!(
        lease = LEASE_NAME,
        "became leader; starting the controllers"
    );

    let outcome = tokio::select! {
        _ = controllers() => Ok(()),
        lost = hold(&manager) => lost,
    };
    metrics.leader.set(0);
    match outcome {
        Ok(()) => {
            // Hand over at once instead of making the next leader wait out the lease.
            let released = tokio::time::timeout(Duration::from_secs(5), manager.release()).await;
            if !matches!(released, Ok(Ok(()))) {
                error!(
                    "could not release the leader lease; the next leader waits for it to expire"
                );
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Keeps renewing the lease; returns only when it is lost.
async fn hold(manager: &LeaseManager) -> Result<(), LeaderError> {
    loop {
        if !manager.changed().await? {
            return Err(LeaderError::Lost);
        }
    }
}
