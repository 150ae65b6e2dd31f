//! What a pipeline whose namespace its RabbitmqCluster no longer allows loses: the
//! workers' users the operator made for it there (see [`crate::controller::broker::tenancy`]).

use std::collections::BTreeSet;

use crate::controller::broker::connection;
use crate::controller::broker::tenancy::Use;
use crate::controller::broker::tenancy::was_applied;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::reconcile::claim::owner_of;
use crate::controller::reconcile::retire::retire;
use crate::spec::MailerPipeline;
use crate::topology::ownership::Claim;

/// Removes the workers' users the operator made for `pipeline` in the broker of its
/// `clusterRef`, which no longer allows the pipeline's namespace; returns their names.
/// The cluster's credentials serve the operator alone here: nothing read reaches the
/// pipeline's status or events (the caller reports `NotAllowed` whatever this finds).
pub async fn revoke(ctx: &Context, pipeline: &MailerPipeline) -> Result<Vec<String>, Error> {
    if pipeline.spec.rabbitmq.cluster_ref.is_none() || !was_applied(pipeline) {
        return Ok(Vec::new());
    }
    let broker = match connection::locate_for(&ctx.client, pipeline, Use::Revoke).await {
        Ok(broker) => broker,
        // No such cluster: nothing there to revoke.
        Err(Error::NotAllowed { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let management = ctx.brokers.get(&broker.endpoint)?;
    let me = owner_of(&ctx.settings.cluster_name, pipeline);
    let users: BTreeSet<Claim> = management
        .markers()
        .await?
        .held_by(&me.uid)
        .into_iter()
        .filter(|claim| matches!(claim, Claim::User { .. }))
        .collect();
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let policy = pipeline.spec.topology.deletion_policy;
    let retired = retire(&management, &broker, &me, &users, &BTreeSet::new(), policy).await?;
    Ok(retired.users_removed)
}
