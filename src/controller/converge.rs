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
use futures::future::try_join_all;

use crate::spec::{MailerPipeline, QueueDepths};
use crate::topology::desired::policy_name;
use crate::topology::effective::{POLICY_REPORT_LAG, QueuePolicy, Shadowing, shadowing};
use crate::topology::{Management, QueueDepth, Requests, Topology, counted};

/// What converging changed and found.
#[derive(Debug)]
pub struct Converged {
    pub applied: Applied,
    /// Whether KEDA scales the workers.
    pub autoscaling: Autoscaling,
    pub queues: Option<QueueDepths>,
    /// Whether the pipeline's policies apply to its queues as written.
    pub policies: PolicyCheck,
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
    let (queues, policies) = match ctx.queue_depths_due(&key) {
        true => observe_queues(&valid.broker.management, &desired.topology).await,
        false => (None, PolicyCheck::NotChecked),
    };
    Ok(Converged {
        applied,
        autoscaling,
        queues,
        policies,
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

/// Whether the pipeline's policies apply to its queues as written (RabbitMQ applies
/// one policy per queue, the matching one of highest priority, and an operator policy
/// may override what it sets).
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyCheck {
    /// Not known this time: not read, a write to the vhost too recent for the broker to
    /// have reported its queues' policies since, or a queue too new to have them.
    NotChecked,
    /// Read: each policy that does not apply as written (none when all do).
    Checked(Vec<Shadowing>),
}

/// The depths of the send, retry and dead queues (`None` when the broker could not be
/// asked: the reconcile does not fail for that, the topology was just applied) and
/// whether their policies apply, from one read of each queue.
async fn observe_queues(
    management: &Management,
    topology: &Topology,
) -> (Option<QueueDepths>, PolicyCheck) {
    let vhost = topology.vhost.as_str();
    let read = try_join_all(
        topology
            .queues
            .iter()
            .map(|queue| management.queue_state(vhost, &queue.name)),
    )
    .await;
    let states = match read {
        Ok(states) => states,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the queues");
            return (None, PolicyCheck::NotChecked);
        }
    };
    let depth = |i: usize| {
        states
            .get(i)
            .and_then(Option::as_ref)
            .map(|state| total(state.depth))
    };
    let depths = QueueDepths {
        send: depth(0),
        retry: depth(1),
        dead: depth(2),
    };
    let settled = management
        .since_written(vhost)
        .is_none_or(|since| since >= POLICY_REPORT_LAG);
    let mut shadowed = Vec::new();
    for (queue, state) in topology.queues.iter().zip(&states) {
        let reported = match state.as_ref().map(|s| &s.policy) {
            Some(QueuePolicy::Reported(effective)) if settled => effective,
            _ => return (Some(depths), PolicyCheck::NotChecked),
        };
        let ours = topology
            .policies
            .iter()
            .find(|policy| policy.name == policy_name(&queue.name));
        shadowed.extend(ours.and_then(|ours| shadowing(ours, reported)));
    }
    (Some(depths), PolicyCheck::Checked(shadowed))
}

/// RabbitMQ's `messages` already counts the unacknowledged ones.
fn total(depth: QueueDepth) -> i64 {
    i64::try_from(depth.messages).unwrap_or(i64::MAX)
}
