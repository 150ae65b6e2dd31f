//! Phase 5 of a reconcile: report what it found: the status (written only when it
//! changed), the queue-depth gauges and the events.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::key::PipelineKey;
use crate::controller::metrics::QueueRole;
use crate::controller::objects::autoscaling::{Autoscaling, desired_workers};
use crate::controller::objects::deployment::deployment_name;
use crate::controller::objects::status::unchanged_spec;
use crate::controller::objects::status::{
    Findings, TopologyOutcome, dead_letters_added, desired_status,
};
use crate::controller::reasons::{self, event};
use crate::controller::reconcile::Converged;
use crate::controller::reconcile::observe::{KeyCheck, PolicyCheck};
use crate::spec::{MailerPipeline, MailerPipelineStatus, READY, TOPOLOGY_READY, WORKER_READY};
use crate::topology::desired::POLICY_PRIORITY;

/// Writes the status `outcome` calls for, sets the gauges and publishes the events.
/// `live` is the worker Deployment as read first.
pub async fn report(
    pipeline: &MailerPipeline,
    key: &PipelineKey,
    ctx: &Context,
    outcome: &Result<Converged, Error>,
    live: Option<&Deployment>,
) -> Result<(), Error> {
    let (namespace, name) = (&key.namespace, &key.name);
    let worker_deployment = deployment_name(pipeline);
    let previous = pipeline.status.as_ref();
    let findings = match &outcome {
        Ok(done) => Findings {
            generation: pipeline.metadata.generation,
            applied_generation: pipeline.metadata.generation,
            topology: policies_outcome(&done.observed.policies, previous),
            deployment: done.applied.deployment.as_ref(),
            desired_workers: desired_workers(pipeline, done.applied.deployment.as_ref()),
            autoscaling: done.autoscaling.clone(),
            deployment_name: &worker_deployment,
            queues: done.observed.queues.clone(),
            worker_user: Some(done.worker_user.clone()),
            provider_refuses_key: provider_key_outcome(
                pipeline,
                done.observed.provider_key,
                previous,
            ),
        },
        Err(e) => Findings {
            generation: pipeline.metadata.generation,
            applied_generation: previous.and_then(|s| s.applied_generation),
            topology: TopologyOutcome::Failed {
                reason: e.reason(),
                message: e.public_message(),
            },
            // A Deployment of that name that is not ours says nothing about our workers.
            deployment: live.filter(|_| !matches!(e, Error::NotOurs { .. })),
            desired_workers: desired_workers(pipeline, live),
            autoscaling: if pipeline.spec.worker.autoscaling.is_some() {
                Autoscaling::On
            } else {
                Autoscaling::Off
            },
            deployment_name: &worker_deployment,
            queues: None,
            worker_user: previous.and_then(|s| s.worker_user.clone()),
            provider_refuses_key: None,
        },
    };
    let status = desired_status(previous, &findings, Timestamp::now());
    if previous != Some(&status) {
        let api: Api<MailerPipeline> = Api::namespaced(ctx.client.clone(), namespace);
        let patch = json!({ "status": status });
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("write the status", e))?;
    }
    let ready = status.condition(READY).is_some_and(|c| c.status == "True");
    ctx.metrics.set_ready(namespace, name, ready);
    if let Ok(done) = outcome {
        ctx.metrics
            .rabbitmq_written(namespace, name, done.rabbitmq.writes);
    }
    if let Some(queues) = &status.queues {
        for (role, depth) in [
            (QueueRole::Send, queues.send),
            (QueueRole::Retry, queues.retry),
            (QueueRole::Dead, queues.dead),
        ] {
            if let Some(depth) = depth {
                ctx.metrics.set_queue_depth(namespace, name, role, depth);
            }
        }
        let tiers: Vec<(u32, i64)> = queues
            .retry_tiers
            .iter()
            .filter_map(|tier| Some((tier.tier, tier.messages?)))
            .collect();
        ctx.metrics.set_retry_tiers(namespace, name, &tiers);
    }
    publish_events(pipeline, key, ctx, outcome, previous, &status).await;
    Ok(())
}

/// The topology's outcome once applied: not ready while a policy of the pipeline does not
/// apply as written; when that was not checked this time, as last found.
fn policies_outcome(
    check: &PolicyCheck,
    previous: Option<&MailerPipelineStatus>,
) -> TopologyOutcome {
    match check {
        PolicyCheck::Checked(shadowed) if shadowed.is_empty() => TopologyOutcome::Ready,
        PolicyCheck::Checked(shadowed) => TopologyOutcome::Failed {
            reason: reasons::POLICY_SHADOWED.to_string(),
            message: format!(
                "{}. The pipeline's queues lack what its policies set (retry delays, dead-lettering, limits): lower that policy's priority below {POLICY_PRIORITY} or narrow its pattern, or ask the broker's administrator to",
                shadowed
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        },
        PolicyCheck::NotChecked => previous
            .and_then(|p| p.condition(TOPOLOGY_READY))
            .filter(|c| c.reason == reasons::POLICY_SHADOWED)
            .map_or(TopologyOutcome::Ready, |c| TopologyOutcome::Failed {
                reason: c.reason.clone(),
                message: c.message.clone(),
            }),
    }
}

/// Where the key the workers' provider refuses is, while it refuses it: as checked, or
/// when not checked this time, as last found.
fn provider_key_outcome(
    pipeline: &MailerPipeline,
    check: KeyCheck,
    previous: Option<&MailerPipelineStatus>,
) -> Option<String> {
    let refused = match check {
        KeyCheck::Refused => true,
        KeyCheck::NotRefused => false,
        KeyCheck::NotChecked => previous
            .and_then(|p| p.condition(WORKER_READY))
            .is_some_and(|c| c.reason == reasons::PROVIDER_REFUSES_KEY),
    };
    refused.then(|| match &pipeline.spec.worker.provider {
        Some(provider) => {
            let selector = &provider.url_secret_key_ref;
            format!("key {} of Secret {}", selector.key, selector.name)
        }
        None => "provider URL".to_string(),
    })
}

async fn publish_events(
    pipeline: &MailerPipeline,
    key: &PipelineKey,
    ctx: &Context,
    outcome: &Result<Converged, Error>,
    previous: Option<&MailerPipelineStatus>,
    status: &MailerPipelineStatus,
) {
    let regarding = pipeline.object_ref(&());
    match outcome {
        Err(e) => {
            // Only a new failure is published: a broker down for an hour is one event,
            // not one per retry.
            let before = previous.and_then(|p| p.condition(TOPOLOGY_READY));
            let now = status.condition(TOPOLOGY_READY);
            if before.map(|c| (&c.reason, &c.message)) != now.map(|c| (&c.reason, &c.message)) {
                let reason = format!("{}{}", event::RECONCILE_FAILED_PREFIX, e.reason());
                ctx.publish(
                    &regarding,
                    EventType::Warning,
                    &reason,
                    "Reconcile",
                    e.public_message(),
                )
                .await;
            }
        }
        Ok(done) => {
            let shadowed = |s: Option<&MailerPipelineStatus>| {
                s.and_then(|s| s.condition(TOPOLOGY_READY))
                    .filter(|c| c.reason == reasons::POLICY_SHADOWED)
                    .map(|c| c.message.clone())
            };
            if let Some(message) = shadowed(Some(status))
                && shadowed(previous).as_ref() != Some(&message)
            {
                ctx.publish(
                    &regarding,
                    EventType::Warning,
                    reasons::POLICY_SHADOWED,
                    "CheckPolicies",
                    message,
                )
                .await;
            }
            if !done.applied.drained.is_empty() {
                let note = format!(
                    "removed the empty queue of a former delay tier: {}",
                    done.applied.drained.join("; ")
                );
                ctx.publish(
                    &regarding,
                    EventType::Normal,
                    event::RETRY_TIER_REMOVED,
                    "Reconcile",
                    note,
                )
                .await;
            }
            let rabbitmq: Vec<String> = done
                .applied
                .topology_changes
                .iter()
                .map(ToString::to_string)
                .chain(done.applied.user_changes.iter().map(ToString::to_string))
                .chain(done.applied.left_behind.iter().cloned())
                .collect();
            // Applied before (a status of an older operator has no appliedGeneration,
            // but said TopologyReady): later changes are updates or repairs.
            let applied_before = previous
                .is_some_and(|p| p.applied_generation.is_some() || p.is_true(TOPOLOGY_READY));
            if !rabbitmq.is_empty() && !applied_before {
                ctx.publish(
                    &regarding,
                    EventType::Normal,
                    event::TOPOLOGY_CREATED,
                    "Reconcile",
                    rabbitmq.join("; "),
                )
                .await;
            } else if !rabbitmq.is_empty() || !done.applied.reapplied_objects.is_empty() {
                let mut changed = rabbitmq;
                let reapplied = done.applied.reapplied_objects.iter();
                changed.extend(reapplied.map(|o| format!("reapply {o}")));
                if unchanged_spec(pipeline) {
                    // The spec is the one already applied: someone else changed these.
                    ctx.metrics.drift_repaired(&key.namespace, &key.name);
                    let note = format!(
                        "repaired what was changed behind the operator's back: {}",
                        changed.join("; ")
                    );
                    ctx.publish(
                        &regarding,
                        EventType::Normal,
                        event::TOPOLOGY_REPAIRED,
                        "Reconcile",
                        note,
                    )
                    .await;
                } else {
                    ctx.publish(
                        &regarding,
                        EventType::Normal,
                        event::TOPOLOGY_UPDATED,
                        "Reconcile",
                        changed.join("; "),
                    )
                    .await;
                }
            }
        }
    }
    if let Some(added) = dead_letters_added(previous, status)
        && ctx.dead_letters_event_due(key)
    {
        let total = status.queues.as_ref().and_then(|q| q.dead).unwrap_or(added);
        let note = format!(
            "{added} new dead letters in {} ({total} in all); read their x-mail-dead-reason and x-mail-dead-error headers",
            pipeline.spec.topology.dead_queue
        );
        ctx.publish(
            &regarding,
            EventType::Warning,
            event::DEAD_LETTERS_GREW,
            "CountQueues",
            note,
        )
        .await;
    }
}
