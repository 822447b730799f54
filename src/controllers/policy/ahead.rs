//! Judging ahead of the status writes.
//!
//! A judgement is kept ([`Judged`](crate::controllers::judgement::Judged))
//! and handed at once to the servers that reference the policy. At start-up
//! the scope's policies are judged ahead of their passes, in namespace and
//! name order ([`judge_ahead`]): a server's policies are usually close
//! together in that order, so servers open one after another from the first
//! seconds instead of all at once after the last status write.

use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::reconcile::judge;
use super::validator::MAX_BATCH_DOCUMENTS;
use crate::api::HaltSQLPolicy;
use crate::controllers::context::Context;
use crate::controllers::judgement::Judgement;
use crate::controllers::server;
use crate::render;

/// The judgement of the policy's current content (`hash`): the one this
/// operator already made, or a new one, kept and handed at once to the
/// servers that reference the policy.
pub async fn judgement_of(policy: &HaltSQLPolicy, hash: &str, ctx: &Context) -> Judgement {
    let key = ObjectRef::from_obj(policy);
    let generation = policy.metadata.generation;
    if let Some(known) = ctx.judged.get(&key, generation, hash) {
        return known;
    }
    let judgement = judge(&policy.name_any(), &policy.spec, &ctx.validator).await;
    ctx.judged.record(key, generation, hash, &judgement);
    ctx.requeue_servers(server::servers_referencing(&ctx.servers, policy));
    judgement
}

/// Judges every policy of the scope whose status does not judge its
/// current content yet, in namespace and name order. One batch's worth is
/// in flight at once: enough to keep every validator run busy, few enough
/// that the order holds and the operator's memory stays where it was.
pub async fn judge_ahead(ctx: Arc<Context>) {
    let mut unjudged: Vec<(Arc<HaltSQLPolicy>, String)> = ctx
        .policies
        .state()
        .into_iter()
        .map(|policy| {
            let hash = render::content_hash(&policy.spec);
            (policy, hash)
        })
        .filter(|(policy, hash)| match &policy.status {
            Some(status) => {
                Judgement::from_status(status, policy.metadata.generation, hash).is_none()
            }
            None => true,
        })
        .collect();
    unjudged.sort_by_key(|(policy, _)| (policy.namespace(), policy.name_any()));
    futures::stream::iter(unjudged)
        .for_each_concurrent(MAX_BATCH_DOCUMENTS, |(policy, hash)| {
            let ctx = ctx.clone();
            async move {
                judgement_of(&policy, &hash, &ctx).await;
            }
        })
        .await;
}
