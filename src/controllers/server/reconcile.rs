//! One pass of the server loop: gate on the policies, render, apply what
//! changed, read the Deployment, write status if it changed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tracing::{debug, warn};

use super::apply::{self, Plan};
use super::collect::{Collect, collect_config_maps};
use super::events::transition_events;
use super::owned::{Namespace, OwnedStep, cached};
use super::policies::{PolicyGate, ReadyPolicy, gate_policies};
use super::status::{Outcome, compute_status};
use crate::api::{AppliedPolicy, HaltSQLServer, HaltSQLServerStatus};
use crate::controllers::backoff::Backoff;
use crate::controllers::context::{Context, object_key};
use crate::controllers::metrics::ControllerKind;
use crate::controllers::reconcile::{self as wrapper, Pass, PassError, Reconciled, is_conflict};
use crate::render::{self, PolicyInput, Rendered};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("HaltSQLServer has no namespace")]
    NotNamespaced,
    #[error("HaltSQLServer has no uid yet")]
    NoUid,
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl PassError for Error {
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(e) if is_conflict(e))
    }
}

impl Reconciled for HaltSQLServer {
    const CONTROLLER: ControllerKind = ControllerKind::Server;
    const CONFLICT_REQUEUE: Duration = Duration::from_millis(200);

    fn store(ctx: &Context) -> &Store<Self> {
        &ctx.servers
    }

    fn backoff(ctx: &Context) -> &Backoff {
        &ctx.server_backoff
    }

    fn pass_limit(ctx: &Context) -> &tokio::sync::Semaphore {
        &ctx.pass_limits.server
    }
}

/// Reconciles one HaltSQLServer.
pub async fn reconcile(server: Arc<HaltSQLServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    wrapper::reconcile(server, ctx, |server, ctx| async move {
        reconcile_server(&server, &ctx).await
    })
    .await
}

/// Requeues a failed reconcile with per-object exponential backoff.
pub fn error_policy(server: Arc<HaltSQLServer>, error: &Error, ctx: Arc<Context>) -> Action {
    wrapper::error_policy(server, error, ctx)
}

async fn reconcile_server(server: &HaltSQLServer, ctx: &Context) -> Result<Pass, Error> {
    ctx.wait_for_stores().await;
    let namespace = server.namespace().ok_or(Error::NotNamespaced)?;
    let uid = server.uid().ok_or(Error::NoUid)?;

    // Fail closed: nothing is re-rendered unless every referenced policy is valid.
    let gate = gate_policies(server, &ctx.policies, &ctx.judged);
    let key = object_key(Some(&namespace), &server.name_any());
    if let Some(rest) = ctx
        .pending_since
        .hold_off(&key, server, &gate, Instant::now())
    {
        debug!("a referenced policy is being validated again; the status stays for now");
        return Ok(Pass::RecheckIn(rest));
    }
    let outcome = match gate {
        PolicyGate::Closed { reason, message } => {
            debug!(%message, "policies not ready; keeping the last good configuration");
            Outcome::PoliciesNotReady { reason, message }
        }
        PolicyGate::Open(policies) => {
            match render_and_apply(server, &policies, ctx, &namespace, &uid).await {
                Ok(outcome) => outcome,
                Err(error) => {
                    report_lasting_apply_failure(server, ctx, &namespace, &uid, &error).await;
                    return Err(error);
                }
            }
        }
    };

    let status = status_after(server, ctx, &namespace, &uid, &outcome);
    if server.status.as_ref() != Some(&status) {
        ctx.write_status(server, server.status.as_ref(), &status)
            .await?;
    }
    let rolled = matches!(outcome, Outcome::Rendered { rolled: true, .. });
    for event in transition_events(server.status.as_ref(), &status, rolled) {
        // An event that cannot be recorded is not worth failing the reconcile for.
        match ctx.recorder.publish(&event, &server.object_ref(&())).await {
            Ok(()) => ctx.metrics.write("Event", "create"),
            Err(error) => debug!(%error, reason = %event.reason, "cannot record event"),
        }
    }
    Ok(Pass::Done)
}

/// The status this pass's outcome and the Deployment this server controls call for.
fn status_after(
    server: &HaltSQLServer,
    ctx: &Context,
    namespace: &str,
    uid: &str,
    outcome: &Outcome,
) -> HaltSQLServerStatus {
    let name = server.name_any();
    let deployment = cached(&ctx.owned.deployments, namespace, &name)
        .filter(|d| apply::controlled_by(&d.metadata, uid));
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    compute_status(
        server,
        deployment.as_deref(),
        outcome,
        render::selector_string(&name),
        &now,
    )
}

/// Failed writes in a row after which the server's status says so: one
/// failure is retried quietly, a refusal that lasts is reported.
const REPORT_APPLY_FAILURE_AFTER: u32 = 3;

/// When writing the owned objects keeps failing (not a 409, which the next
/// pass resolves), says so in `ConfigRendered`, best effort: the status write
/// may be refused too, and the caller's error drives the retry either way.
async fn report_lasting_apply_failure(
    server: &HaltSQLServer,
    ctx: &Context,
    namespace: &str,
    uid: &str,
    error: &Error,
) {
    let key = object_key(Some(namespace), &server.name_any());
    // error_policy records this failure after we return.
    if error.is_conflict() || ctx.server_backoff.failures(&key) + 1 < REPORT_APPLY_FAILURE_AFTER {
        return;
    }
    let outcome = Outcome::ApplyFailed {
        message: format!(
            "Writing an owned object keeps failing; the last good configuration stays and the write is retried: {error}"
        ),
    };
    let status = status_after(server, ctx, namespace, uid, &outcome);
    if server.status.as_ref() == Some(&status) {
        return;
    }
    if let Err(status_error) = ctx
        .write_status(server, server.status.as_ref(), &status)
        .await
    {
        debug!(error = %status_error, "cannot report the failed write in the status");
    }
}

/// Renders the server and applies every owned object whose spec changed,
/// unless an owned name is taken by a foreign object.
async fn render_and_apply(
    server: &HaltSQLServer,
    policies: &[ReadyPolicy],
    ctx: &Context,
    namespace: &str,
    uid: &str,
) -> Result<Outcome, Error> {
    let inputs: Vec<PolicyInput<'_>> = policies.iter().map(ReadyPolicy::input).collect();
    let rendered = match render::render_with(server, &inputs, ctx.settings.render_settings()) {
        Ok(rendered) => rendered,
        Err(error) => {
            return Ok(Outcome::InvalidConfig {
                message: error.to_string(),
            });
        }
    };
    let checksum = rendered.checksum.clone();
    let config_map_name = rendered.config_map.name_any();
    let objects = owned_objects(server, rendered, ctx, namespace);

    // Each plan is a cache lookup, or a GET on a miss (every object at the
    // first render): one round trip for all of them, not one per kind.
    let plans =
        futures::future::try_join_all(objects.iter().map(|object| object.plan(uid))).await?;
    let conflicts: Vec<String> = plans
        .iter()
        .flatten()
        .filter_map(|plan| match plan {
            Plan::Conflict(message) => Some(message.clone()),
            _ => None,
        })
        .collect();
    if !conflicts.is_empty() {
        warn!(conflicts = %conflicts.join("; "), "owned name taken; nothing applied");
        return Ok(Outcome::NameConflict {
            message: conflicts.join("; "),
        });
    }
    // The ConfigMap first, since new pods must find the configuration they
    // name; the others do not depend on each other.
    let mut steps = objects.iter().zip(&plans);
    if let Some((config_map, plan)) = steps.next() {
        config_map.write(plan.as_ref(), uid, &ctx.metrics).await?;
    }
    let rest: Vec<_> = steps.collect();
    futures::future::try_join_all(
        rest.iter()
            .map(|(object, plan)| object.write(plan.as_ref(), uid, &ctx.metrics)),
    )
    .await?;
    let rolled = rest
        .iter()
        .any(|(object, plan)| object.kind() == "Deployment" && *plan == &Some(Plan::Apply));

    // Old configurations go once no ReplicaSet uses them. A failure here must
    // not hold up the status: the next pass (a ReplicaSet deleted, the
    // Deployment observed, the resync) tries again.
    let collect = Collect {
        config_maps: &ctx.owned.config_maps,
        replica_sets: &ctx.owned.replica_sets,
        config_map_api: &Api::namespaced(ctx.client.clone(), namespace),
        deployment_api: &Api::namespaced(ctx.client.clone(), namespace),
        replica_set_api: &Api::namespaced(ctx.client.clone(), namespace),
        metrics: &ctx.metrics,
    };
    let name = server.name_any();
    if let Err(error) = collect_config_maps(&collect, namespace, &name, uid, &config_map_name).await
    {
        warn!(%error, "cannot collect unused ConfigMaps; retrying on the next pass");
    }

    let policies = policies
        .iter()
        .map(|p| AppliedPolicy {
            name: p.policy_name.clone(),
            content_hash: p.content_hash.clone(),
        })
        .collect();
    Ok(Outcome::Rendered {
        checksum,
        policies,
        rolled,
    })
}

/// Every kind the server owns, the ConfigMap first (it is written before the
/// others), with what the caches show under each name.
fn owned_objects(
    server: &HaltSQLServer,
    rendered: Rendered,
    ctx: &Context,
    namespace: &str,
) -> Vec<Box<dyn OwnedStep>> {
    let owned = &ctx.owned;
    let ns = Namespace {
        client: &ctx.client,
        name: namespace,
    };
    let name = server.name_any();
    let config_map_name = rendered.config_map.name_any();
    vec![
        ns.step(
            &owned.config_maps,
            &config_map_name,
            Some(rendered.config_map),
        ),
        ns.step(&owned.deployments, &name, Some(rendered.deployment)),
        ns.step(&owned.services, &name, Some(rendered.service)),
        ns.step(
            &owned.pod_disruption_budgets,
            &name,
            rendered.pod_disruption_budget,
        ),
        ns.step(&owned.network_policies, &name, rendered.network_policy),
    ]
}
