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
use super::metrics::ControllerKind;
use super::status_patch::STALE_RECHECK;

/// How a pass ended when it did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Done: look again at the next resync.
    Done,
    /// Something outside the API server failed (the validator) and the
    /// status says so: try again, slower each time.
    Retry,
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
            timer.finish("stale");
            return Ok(Action::requeue(STALE_RECHECK));
        };
        match pass(obj, ctx.clone()).await {
            Ok(Pass::Done) => {
                K::backoff(&ctx).succeeded(&key);
                timer.finish("success");
                Ok(Action::requeue(ctx.settings.resync))
            }
            Ok(Pass::Retry) => {
                let delay = K::backoff(&ctx).failed(&key);
                debug!(retry_in = ?delay, "retrying with backoff");
                timer.finish("requeue");
                Ok(Action::requeue(delay))
            }
            Err(e) if e.is_conflict() => {
                debug!("conflict writing, requeueing");
                timer.finish("conflict");
                Ok(Action::requeue(K::CONFLICT_REQUEUE))
            }
            Err(e) => {
                timer.finish("error");
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
