//! The one reconcile wrapper both controllers run their pass in: the span
//! every log line of the pass carries, the reconcile metrics, waiting for
//! the cache to show our own last status write, per-object backoff, quiet
//! conflicts, and the error policy.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tokio::sync::Semaphore;
use tracing::{Instrument, debug, info_span, warn};

use super::backoff::Backoff;
use super::context::{Context, object_key};
use super::metrics::{ControllerKind, ReconcileResult};
use super::status_patch::STALE_RECHECK;

/// How a pass ended when it did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Done: look again at the next resync.
    Done,
    /// Something outside the API server failed (the validator) and the
    /// status says so: try again, slower each time.
    Retry,
    /// Nothing to write yet: look again after this long, unless an event
    /// brings the next pass sooner.
    RecheckIn(Duration),
}

/// The error of a pass. A 409 is normal: someone wrote in between, and the
/// next pass finishes the job.
pub trait PassError: std::error::Error {
    fn is_conflict(&self) -> bool;
}

/// True for a 409 from the API server.
pub fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e) if e.code == 409)
}

/// What the wrapper needs to know of a controller's resource.
pub trait Reconciled: Resource<DynamicType = ()> + Clone + Send + Sync + 'static {
    /// Its label in the metrics and logs.
    const CONTROLLER: ControllerKind;
    /// How soon a conflicting write is retried. The watch usually delivers
    /// the newer object (and a reconcile) before that.
    const CONFLICT_REQUEUE: Duration;
    /// The store the controller reads its objects from.
    fn store(ctx: &Context) -> &Store<Self>;
    /// The controller's failure counts.
    fn backoff(ctx: &Context) -> &Backoff;
    /// The controller's bound on passes at once.
    fn pass_limit(ctx: &Context) -> &Semaphore;
}

/// Runs one `pass` over `obj` inside the wrapper.
pub async fn reconcile<K, E, F, Fut>(obj: Arc<K>, ctx: Arc<Context>, pass: F) -> Result<Action, E>
where
    K: Reconciled,
    E: PassError,
    F: FnOnce(Arc<K>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Pass, E>>,
{
    let span = info_span!(
        "reconcile",
        controller = K::CONTROLLER.as_str(),
        namespace = obj.namespace().unwrap_or_default(),
        name = obj.name_any()
    );
    async move {
        // Closed only if the context is torn down, and then nothing is left to do.
        let Ok(_permit) = K::pass_limit(&ctx).acquire().await else {
            return Ok(Action::await_change());
        };
        let timer = ctx.metrics.start_reconcile(K::CONTROLLER);
        let key = object_key(obj.namespace().as_deref(), &obj.name_any());
        let Some(obj) = ctx.own_writes.caught_up(K::store(&ctx), obj).await else {
            debug!("the cache does not show our last status write yet; looking again soon");
            timer.finish(ReconcileResult::Stale);
            return Ok(Action::requeue(STALE_RECHECK));
        };
        match pass(obj, ctx.clone()).await {
            Ok(Pass::Done) => {
                K::backoff(&ctx).succeeded(&key);
                timer.finish(ReconcileResult::Success);
                Ok(Action::requeue(ctx.settings.resync))
            }
            Ok(Pass::RecheckIn(delay)) => {
                K::backoff(&ctx).succeeded(&key);
                timer.finish(ReconcileResult::Waiting);
                Ok(Action::requeue(delay))
            }
            Ok(Pass::Retry) => {
                let delay = K::backoff(&ctx).failed(&key);
                debug!(retry_in = ?delay, "retrying with backoff");
                timer.finish(ReconcileResult::Requeue);
                Ok(Action::requeue(delay))
            }
            Err(e) if e.is_conflict() => {
                debug!("conflict writing, requeueing");
                timer.finish(ReconcileResult::Conflict);
                Ok(Action::requeue(K::CONFLICT_REQUEUE))
            }
            Err(e) => {
                timer.finish(ReconcileResult::Error);
                Err(e)
            }
        }
    }
    .instrument(span)
    .await
}

/// Requeues a failed pass with per-object exponential backoff (conflicts
/// never get here: [`reconcile`] requeues them itself).
pub fn error_policy<K: Reconciled, E: PassError>(
    obj: Arc<K>,
    error: &E,
    ctx: Arc<Context>,
) -> Action {
    let key = object_key(obj.namespace().as_deref(), &obj.name_any());
    let delay = K::backoff(&ctx).failed(&key);
    warn!(controller = K::CONTROLLER.as_str(), object = %key, %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::api::{HaltSQLPolicy, HaltSQLPolicySpec};
    use crate::controllers::context::{PassLimits, ScopeStores, Settings};
    use crate::controllers::metrics::Metrics;
    use crate::controllers::policy::Validator;

    #[derive(Debug, thiserror::Error)]
    #[error("not used")]
    struct NoError;

    impl PassError for NoError {
        fn is_conflict(&self) -> bool {
            false
        }
    }

    /// A scope's context over empty stores, sharing `limits`. Its client
    /// points at a closed port: the passes here make no request.
    fn scope_context(namespace: &str, limits: Arc<PassLimits>) -> Arc<Context> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        let client = kube::Client::try_from(config).expect("client");
        let metrics = Metrics::new().expect("metrics");
        let settings = Settings::new("/nonexistent/haltsql".into());
        let validator = Arc::new(Validator::new(
            settings.haltsql_binary.clone(),
            settings.validator_timeout,
            1,
            metrics.clone(),
        ));
        Arc::new(
            Context::new(
                client,
                Some(namespace.to_owned()),
                ScopeStores::unwatched(),
                validator,
                settings,
                metrics,
            )
            .with_pass_limits(limits),
        )
    }

    fn policy(namespace: &str, name: &str) -> Arc<HaltSQLPolicy> {
        let mut policy = HaltSQLPolicy::new(
            name,
            HaltSQLPolicySpec {
                policy: Some("kind: Policy\n".to_owned()),
                bundle_source: None,
            },
        );
        policy.metadata.namespace = Some(namespace.to_owned());
        Arc::new(policy)
    }

    /// The most passes that ran at once when four scopes (one namespace
    /// each, as with RoleBindings only) each started a pass together.
    async fn most_at_once(permits: u16) -> usize {
        let limits = Arc::new(PassLimits::new(permits));
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let passes = (0..4).map(|i| {
            let namespace = format!("ns-{i}");
            let ctx = scope_context(&namespace, limits.clone());
            let (running, most) = (&running, &most);
            async move {
                reconcile(policy(&namespace, "p"), ctx, |_, _| async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, NoError>(Pass::Done)
                })
                .await
            }
        });
        for result in futures::future::join_all(passes).await {
            assert!(result.is_ok());
        }
        most.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn the_pass_limit_holds_over_every_scope_that_shares_it() {
        assert_eq!(most_at_once(1).await, 1);
        assert_eq!(most_at_once(2).await, 2);
        assert_eq!(most_at_once(8).await, 4);
    }
}
