//! One pass of the server loop: gate on the policies, render, apply what
//! changed, read the Deployment, write status if it changed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info_span, warn};

use super::apply::{self, Plan};
use super::collect::{Collect, collect_config_maps};
use super::events::transition_events;
use super::policies::{PolicyGate, ReadyPolicy, gate_policies};
use super::status::{Outcome, compute_status};
use crate::api::{AppliedPolicy, HaltSQLServer, HaltSQLServerStatus};
use crate::controllers::context::{Context, object_key};
use crate::controllers::metrics::ControllerKind;
use crate::controllers::status_patch::patch_status;
use crate::render::{self, PolicyInput, Rendered, SPEC_HASH_ANNOTATION};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("HaltSQLServer has no namespace")]
    NotNamespaced,
    #[error("HaltSQLServer has no uid yet")]
    NoUid,
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// A 409: someone wrote in between. Normal; the next pass finishes the job.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(e)) if e.code == 409)
    }
}

pub async fn reconcile(server: Arc<HaltSQLServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = info_span!(
        "reconcile",
        controller = "haltsqlserver",
        namespace = server.namespace().unwrap_or_default(),
        name = server.name_any()
    );
    async move {
        let timer = ctx.metrics.start_reconcile(ControllerKind::Server);
        let Some(server) = ctx.own_writes.caught_up(&ctx.servers, server).await else {
            debug!("the cache does not show our last status write yet; looking again soon");
            timer.finish("stale");
            return Ok(Action::requeue(
                crate::controllers::status_patch::STALE_RECHECK,
            ));
        };
        let result = reconcile_server(&server, &ctx).await;
        let key = object_key(server.namespace().as_deref(), &server.name_any());
        match &result {
            Ok(_) => {
                ctx.server_backoff.succeeded(&key);
                timer.finish("success");
            }
            Err(e) if e.is_conflict() => timer.finish("conflict"),
            Err(_) => timer.finish("error"),
        }
        result
    }
    .instrument(span)
    .await
}

pub fn error_policy(server: Arc<HaltSQLServer>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = object_key(server.namespace().as_deref(), &server.name_any());
    if error.is_conflict() {
        debug!(server = %key, "conflict, requeueing");
        return Action::requeue(Duration::from_millis(200));
    }
    let delay = ctx.server_backoff.failed(&key);
    warn!(server = %key, %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile_server(server: &HaltSQLServer, ctx: &Context) -> Result<Action, Error> {
    ctx.wait_for_stores().await;
    let namespace = server.namespace().ok_or(Error::NotNamespaced)?;
    let uid = server.uid().ok_or(Error::NoUid)?;

    // Fail closed: nothing is re-rendered unless every referenced policy is valid.
    let outcome = match gate_policies(server, &ctx.policies) {
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
        patch_status(
            &ctx.client,
            server,
            server.status.as_ref(),
            &status,
            &ctx.metrics,
            &ctx.own_writes,
        )
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
    Ok(Action::requeue(ctx.settings.resync))
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
    if let Err(status_error) = patch_status(
        &ctx.client,
        server,
        server.status.as_ref(),
        &status,
        &ctx.metrics,
        &ctx.own_writes,
    )
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
    let inputs: Vec<PolicyInput<'_>> = policies
        .iter()
        .map(|p| PolicyInput {
            object_name: &p.object_name,
            policy_name: &p.policy_name,
            content_hash: &p.content_hash,
            spec: &p.spec,
        })
        .collect();
    let rendered = match render::render(server, &inputs) {
        Ok(rendered) => rendered,
        Err(error) => {
            return Ok(Outcome::InvalidConfig {
                message: error.to_string(),
            });
        }
    };
    let Rendered {
        checksum,
        config_map,
        deployment,
        service,
        pod_disruption_budget,
        network_policy,
        ..
    } = rendered;
    let deployment = with_rollout_deadline(deployment, ctx.settings.rollout_deadline);

    let client = ctx.client.clone();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let network_policies: Api<NetworkPolicy> = Api::namespaced(client, namespace);
    let owned = &ctx.owned;

    let config_map_plan = apply::plan(
        &config_maps,
        cached_meta(&owned.config_maps, &config_map),
        &config_map,
        uid,
    )
    .await?;
    let deployment_plan = apply::plan(
        &deployments,
        cached(&owned.deployments, namespace, &deployment.name_any()).map(|d| d.metadata.clone()),
        &deployment,
        uid,
    )
    .await?;
    let service_plan = apply::plan(
        &services,
        cached_meta(&owned.services, &service),
        &service,
        uid,
    )
    .await?;
    let pdb_plan = match &pod_disruption_budget {
        Some(pdb) => Some(
            apply::plan(
                &pdbs,
                cached_meta(&owned.pod_disruption_budgets, pdb),
                pdb,
                uid,
            )
            .await?,
        ),
        None => None,
    };
    let network_policy_plan = match &network_policy {
        Some(np) => Some(
            apply::plan(
                &network_policies,
                cached_meta(&owned.network_policies, np),
                np,
                uid,
            )
            .await?,
        ),
        None => None,
    };

    let conflicts: Vec<String> = [
        Some(&config_map_plan),
        Some(&deployment_plan),
        Some(&service_plan),
        pdb_plan.as_ref(),
        network_policy_plan.as_ref(),
    ]
    .into_iter()
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

    // The ConfigMap goes first: new pods must find the configuration they name.
    if config_map_plan == Plan::Apply {
        apply::apply(&config_maps, &config_map, &ctx.metrics).await?;
    }
    if deployment_plan == Plan::Apply {
        apply::apply(&deployments, &deployment, &ctx.metrics).await?;
    }
    if service_plan == Plan::Apply {
        apply::apply(&services, &service, &ctx.metrics).await?;
    }
    match (&pod_disruption_budget, pdb_plan) {
        (Some(pdb), Some(Plan::Apply)) => apply::apply(&pdbs, pdb, &ctx.metrics).await?,
        (None, _) => {
            let name = server.name_any();
            let live =
                cached(&owned.pod_disruption_budgets, namespace, &name).map(|m| m.metadata.clone());
            apply::delete_if_controlled(&pdbs, &name, live, uid, &ctx.metrics).await?
        }
        _ => {}
    }
    match (&network_policy, network_policy_plan) {
        (Some(np), Some(Plan::Apply)) => apply::apply(&network_policies, np, &ctx.metrics).await?,
        (None, _) => {
            let name = server.name_any();
            let live =
                cached(&owned.network_policies, namespace, &name).map(|m| m.metadata.clone());
            apply::delete_if_controlled(&network_policies, &name, live, uid, &ctx.metrics).await?
        }
        _ => {}
    }

    // Old configurations go once no ReplicaSet uses them. A failure here must
    // not hold up the status: the next pass (a ReplicaSet deleted, the
    // Deployment observed, the resync) tries again.
    let collect = Collect {
        config_maps: &owned.config_maps,
        replica_sets: &owned.replica_sets,
        config_map_api: &config_maps,
        deployment_api: &deployments,
        replica_set_api: &Api::namespaced(ctx.client.clone(), namespace),
        metrics: &ctx.metrics,
    };
    if let Err(error) = collect_config_maps(
        &collect,
        namespace,
        &server.name_any(),
        uid,
        &config_map.name_any(),
    )
    .await
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
        rolled: deployment_plan == Plan::Apply,
    })
}

/// The rollout deadline is the Deployment's own progress deadline, so the
/// Deployment controller reports a stalled rollout even while the operator is down.
pub fn with_rollout_deadline(mut deployment: Deployment, deadline: Duration) -> Deployment {
    if let Some(spec) = deployment.spec.as_mut() {
        spec.progress_deadline_seconds =
            Some(i32::try_from(deadline.as_secs()).unwrap_or(i32::MAX));
    }
    if let Some(annotations) = deployment.metadata.annotations.as_mut() {
        annotations.remove(SPEC_HASH_ANNOTATION);
    }
    let hash = render::spec_hash_of(&deployment);
    deployment
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(SPEC_HASH_ANNOTATION.to_owned(), hash);
    deployment
}

fn cached<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

fn cached_meta<K>(
    store: &Store<kube::core::PartialObjectMeta<K>>,
    desired: &K,
) -> Option<ObjectMeta>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let namespace = desired.meta().namespace.as_deref()?;
    cached(store, namespace, &desired.name_any()).map(|m| m.metadata.clone())
}
