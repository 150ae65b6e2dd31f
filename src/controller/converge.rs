//! Bringing RabbitMQ and Kubernetes to what a pipeline asks for, in named phases:
//! [`resolve`](super::resolve) everything it references, [`validate`](super::validate)
//! once into a validated pipeline, build what is [`desired`](super::desired) (pure),
//! [`apply`](super::apply) it; the reconcile then writes the status
//! ([`report`](super::report)). Nothing is written until everything referenced resolved
//! and validated.

use k8s_openapi::api::apps::v1::Deployment;

use super::apply::{Applied, apply};
use super::autoscaling::{self, Autoscaling};
use super::context::Context;
use super::desired::desired;
use super::error::Error;
use super::ownership::claim;
use super::resolve::resolve;
use super::validate::validate;
use crate::spec::{MailerPipeline, QueueDepths, TopologySpec};
use crate::topology::{Management, QueueDepth, Requests, counted};

/// What converging changed and found.
#[derive(Debug)]
pub struct Converged {
    pub applied: Applied,
    /// Whether KEDA scales the workers.
    pub autoscaling: Autoscaling,
    pub queues: Option<QueueDepths>,
    pub worker_user: String,
    /// The requests this reconcile made to RabbitMQ's management API (its client is
    /// shared with the others running at once): no write when it was in sync.
    pub rabbitmq: Requests,
}

/// Applies everything `pipeline` asks for. `live_deployment` is the worker Deployment
/// as read before.
pub async fn converge(
    ctx: &Context,
    pipeline: &MailerPipeline,
    live_deployment: Option<Deployment>,
) -> Result<Converged, Error> {
    // Boxed: the phases' future is large, and a reconcile may run on a small stack.
    let work = Box::pin(converge_uncounted(ctx, pipeline, live_deployment));
    let (converged, requests) = counted(work).await;
    converged.map(|converged| Converged {
        rabbitmq: requests,
        ..converged
    })
}

async fn converge_uncounted(
    ctx: &Context,
    pipeline: &MailerPipeline,
    live_deployment: Option<Deployment>,
) -> Result<Converged, Error> {
    let client = &ctx.client;
    let settings = &ctx.settings;
    let resolved = resolve(client, &ctx.brokers, &ctx.owned, pipeline, live_deployment).await?;
    let valid = validate(pipeline, &resolved, &settings.cluster_name)?;
    let desired = desired(&valid, &resolved, settings)?;
    let keda = autoscaling::resolve(client, &ctx.keda, pipeline, &valid.namespace).await?;
    let claimed = claim(ctx, &valid, &desired).await?;
    let mut applied = apply(ctx, &valid, &resolved, &desired, &claimed).await?;
    // KEDA's objects reference the Deployment, so they follow it.
    let (autoscaling, reapplied) =
        autoscaling::converge(client, pipeline, &valid.namespace, keda).await?;
    applied.reapplied_objects.extend(reapplied);
    // Read at most every `queue_depth_interval`; in between the status keeps the last.
    let key = format!("{}/{}", valid.namespace, valid.name);
    let queues = match ctx.queue_depths_due(&key) {
        true => {
            let management = &valid.broker.management;
            queue_depths(management, &desired.topology.vhost, &valid.spec.topology).await
        }
        false => None,
    };
    Ok(Converged {
        applied,
        autoscaling,
        queues,
        worker_user: valid.credentials.username.clone(),
        rabbitmq: Requests::default(),
    })
}

/// Whether the spec is the one the operator last applied in full, so a difference found
/// now was made by someone else (drift) rather than asked for. `observedGeneration` does
/// not tell: it is written after a failed attempt too.
pub fn unchanged_spec(pipeline: &MailerPipeline) -> bool {
    let applied = pipeline.status.as_ref().and_then(|s| s.applied_generation);
    applied.is_some() && applied == pipeline.metadata.generation
}

/// The depths of the send, retry and dead queues; `None` when the broker could not be
/// asked (the reconcile does not fail for that: the topology was just applied).
async fn queue_depths(
    management: &Management,
    vhost: &str,
    topology: &TopologySpec,
) -> Option<QueueDepths> {
    let depth = |queue: &str| {
        let queue = queue.to_string();
        async move {
            let found = management.queue_depth(vhost, &queue).await;
            found.map(|d| d.map(total))
        }
    };
    let read = futures::try_join!(
        depth(&topology.queue),
        depth(&topology.retry_queue),
        depth(&topology.dead_queue)
    );
    match read {
        Ok((send, retry, dead)) => Some(QueueDepths { send, retry, dead }),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the queue depths");
            None
        }
    }
}

/// RabbitMQ's `messages` already counts the unacknowledged ones.
fn total(depth: QueueDepth) -> i64 {
    i64::try_from(depth.messages).unwrap_or(i64::MAX)
}
