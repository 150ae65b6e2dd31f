//! The reconcile of one MailerPipeline: the finalizer around converging it (or cleaning
//! up after it), then its status and events, and the error policy that decides when a
//! failed pipeline is tried again.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::autoscaling::{Autoscaling, desired_workers};
use super::cleanup::cleanup;
use super::context::Context;
use super::converge::{Converged, converge, unchanged_spec};
use super::deployment::deployment_name;
use super::error::Error;
use super::metrics::QueueRole;
use super::reasons::event;
use super::status::{Findings, TopologyOutcome, dead_letters_added, desired_status};
use crate::manifest::display_name;
use crate::spec::{MailerPipeline, MailerPipelineStatus, TOPOLOGY_READY};

/// The finalizer that holds a deleted pipeline until its RabbitMQ side is cleaned up.
pub const FINALIZER: &str = "mailer.dev/cleanup";

/// Reconciles one pipeline: adds the finalizer, converges it and writes its status, or,
/// when it is being deleted, cleans up and removes the finalizer.
pub async fn reconcile(pipeline: Arc<MailerPipeline>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let key = display_name(&pipeline);
    let api: Api<MailerPipeline> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, pipeline, |event| async {
        match event {
            FinalizerEvent::Apply(pipeline) => apply(&pipeline, &ctx).await,
            FinalizerEvent::Cleanup(pipeline) => cleanup(&pipeline, &ctx).await,
        }
    })
    .await
    .map_err(flatten);
    ctx.metrics.reconciled(
        result.as_ref().map(|_| ()).map_err(Error::category),
        started.elapsed(),
    );
    match &result {
        Ok(_) => ctx.reset_backoff(&key),
        Err(e) => {
            tracing::warn!(pipeline = %key, category = e.category(), error = %e, "reconcile failed")
        }
    }
    result
}

/// When a failed pipeline is tried again: soon, backing off, when the failure may pass
/// by itself; otherwise after the resync interval (a change of the pipeline or of a
/// Secret it names tries it at once).
pub fn error_policy(pipeline: Arc<MailerPipeline>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.is_transient() {
        Action::requeue(ctx.next_backoff(&display_name(&pipeline)))
    } else {
        Action::requeue(ctx.settings.resync_interval)
    }
}

fn flatten(error: finalizer::Error<Error>) -> Error {
    match error {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        finalizer::Error::AddFinalizer(e) => Error::kube("add the finalizer", e),
        finalizer::Error::RemoveFinalizer(e) => Error::kube("remove the finalizer", e),
        finalizer::Error::UnnamedObject => Error::IncompleteObject("metadata.name"),
        finalizer::Error::InvalidFinalizer => Error::IncompleteObject("valid finalizer"),
    }
}

/// Converges the pipeline, then writes its status (only when it changed) and publishes
/// events for what happened.
async fn apply(pipeline: &MailerPipeline, ctx: &Context) -> Result<Action, Error> {
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let name = pipeline.name_any();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let worker_deployment = deployment_name(pipeline);
    let live = deployments.get_opt(&worker_deployment).await.map_err(|e| {
        Error::kube(
            format!("read Deployment {namespace}/{worker_deployment}"),
            e,
        )
    })?;
    let fallback = live.clone();

    let outcome = converge(&ctx.client, &ctx.settings, pipeline, live).await;
    let previous = pipeline.status.as_ref();
    let findings = match &outcome {
        Ok(done) => Findings {
            generation: pipeline.metadata.generation,
            topology: TopologyOutcome::Ready,
            deployment: done.deployment.as_ref(),
            desired_workers: desired_workers(pipeline, done.deployment.as_ref()),
            autoscaling: done.autoscaling.clone(),
            deployment_name: &worker_deployment,
            queues: done.queues,
            worker_user: Some(done.worker_user.clone()),
        },
        Err(e) => Findings {
            generation: pipeline.metadata.generation,
            topology: TopologyOutcome::Failed {
                reason: e.reason(),
                message: e.public_message(),
            },
            // A Deployment of that name that is not ours says nothing about our workers.
            deployment: fallback
                .as_ref()
                .filter(|_| !matches!(e, Error::NotOurs { .. })),
            desired_workers: desired_workers(pipeline, fallback.as_ref()),
            autoscaling: if pipeline.spec.worker.autoscaling.is_some() {
                Autoscaling::On
            } else {
                Autoscaling::Off
            },
            deployment_name: &worker_deployment,
            queues: None,
            worker_user: previous.and_then(|s| s.worker_user.clone()),
        },
    };
    let status = desired_status(previous, &findings, Timestamp::now());
    if previous != Some(&status) {
        let api: Api<MailerPipeline> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({ "status": status });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube("write the status", e))?;
    }
    if let Ok(done) = &outcome {
        ctx.metrics
            .rabbitmq_written(&namespace, &name, done.rabbitmq_writes);
    }
    if let Some(queues) = status.queues {
        for (role, depth) in [
            (QueueRole::Send, queues.send),
            (QueueRole::Retry, queues.retry),
            (QueueRole::Dead, queues.dead),
        ] {
            if let Some(depth) = depth {
                ctx.metrics.set_queue_depth(&namespace, &name, role, depth);
            }
        }
    }
    publish_events(pipeline, ctx, &outcome, previous, &status).await;
    outcome.map(|_| Action::requeue(ctx.settings.resync_interval))
}

async fn publish_events(
    pipeline: &MailerPipeline,
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
            let rabbitmq: Vec<String> = done
                .topology_changes
                .iter()
                .map(ToString::to_string)
                .chain(done.user_changes.iter().map(ToString::to_string))
                .collect();
            let was_ready = previous.is_some_and(|p| p.is_true(TOPOLOGY_READY));
            if !rabbitmq.is_empty() && !was_ready {
                ctx.publish(
                    &regarding,
                    EventType::Normal,
                    event::TOPOLOGY_CREATED,
                    "Reconcile",
                    rabbitmq.join("; "),
                )
                .await;
            } else if !rabbitmq.is_empty() || !done.repaired_objects.is_empty() {
                let mut changed = rabbitmq;
                changed.extend(done.repaired_objects.iter().map(|o| format!("reapply {o}")));
                if unchanged_spec(pipeline) {
                    // The spec is the one already applied: someone else changed these.
                    let namespace = pipeline.namespace().unwrap_or_default();
                    ctx.metrics.drift_repaired(&namespace, &pipeline.name_any());
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
    if let Some(added) = dead_letters_added(previous, status) {
        let total = status.queues.and_then(|q| q.dead).unwrap_or(added);
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
