//! What deleting a pipeline does: remove the worker's RabbitMQ user (when the operator
//! made it) and what `deletionPolicy` allows of the topology, then let the pipeline go.
//!
//! A failure that may pass (the broker briefly unreachable, the RabbitmqCluster's
//! Service not there yet) is retried with the usual backoff until `cleanup_deadline`
//! (10 minutes) after the pipeline's `deletionTimestamp`; so a short broker outage
//! leaves neither the worker user nor the queues behind. Past that deadline, or at once
//! for what cannot pass by itself (a Secret that is gone, credentials refused), deletion
//! completes anyway: what could not be cleaned up is said in an event and the finalizer
//! is removed, so nothing hangs in Terminating. A vhost that is gone is a clean deletion. The worker
//! Deployment and Secret go with the pipeline through their owner references.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use crate::controller::broker::connection;
use crate::controller::broker::in_use;
use crate::controller::broker::tenancy::cleanup_use;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::key::PipelineKey;
use crate::controller::objects::autoscaling::Autoscaling;
use crate::controller::objects::deployment::deployment_name;
use crate::controller::objects::status::{Findings, TopologyOutcome, desired_status};
use crate::controller::objects::worker_secret;
use crate::controller::reasons::{self, event};
use crate::controller::reconcile::claim::owner_of;
use crate::controller::reconcile::retire::retire;
use crate::spec::MailerPipeline;
use crate::topology;
use crate::topology::ownership::{legacy_topology_marker, topology_claims};

/// What a cleanup removed, and what it left with why.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub removed: Vec<String>,
    /// Left because the deletion policy says so.
    pub kept: Vec<String>,
    /// Left because it could not be removed.
    pub not_cleaned_up: Vec<String>,
}

pub async fn cleanup(
    pipeline: &MailerPipeline,
    key: &PipelineKey,
    ctx: &Context,
) -> Result<Action, Error> {
    let (report, transient) = clean_up_rabbitmq(pipeline, ctx).await?;
    let deadline = ctx.settings.cleanup_deadline;
    let gave_up = match transient {
        Some(error) if within(pipeline, deadline) => {
            tracing::warn!(error = %error, "cleanup failed for now: retrying until the cleanup deadline");
            return Err(error);
        }
        Some(_) => true,
        None => false,
    };
    // The Secrets this cleanup needed may go now.
    in_use::release_all_but(&ctx.client, &ctx.owned, pipeline, None).await?;
    let regarding = pipeline.object_ref(&());
    let mut note = Vec::new();
    if !report.removed.is_empty() {
        note.push(format!("removed {}", report.removed.join(", ")));
    }
    if !report.kept.is_empty() {
        note.push(format!("kept {}", report.kept.join(", ")));
    }
    if note.is_empty() {
        note.push("nothing in RabbitMQ was this pipeline's".to_string());
    }
    if report.not_cleaned_up.is_empty() {
        ctx.publish(
            &regarding,
            EventType::Normal,
            event::CLEANED_UP,
            "Delete",
            note.join("; "),
        )
        .await;
    } else {
        let left = format!(
            "NOT cleaned up (remove by hand if unwanted): {}",
            report.not_cleaned_up.join("; ")
        );
        ctx.metrics
            .orphaned(&key.namespace, report.not_cleaned_up.len());
        // On the pipeline too, for whoever watches it go.
        report_left_behind(pipeline, key, ctx, &left).await?;
        note.push(left);
        if gave_up {
            note.push(format!(
                "gave up {} after the deletion (--cleanup-deadline)",
                humantime::format_duration(deadline)
            ));
        }
        ctx.publish(
            &regarding,
            EventType::Warning,
            event::CLEANUP_INCOMPLETE,
            "Delete",
            note.join("; "),
        )
        .await;
    }
    ctx.metrics.forget(&key.namespace, &key.name);
    ctx.forget(key);
    ctx.owned.forget(
        &key.namespace,
        &[
            deployment_name(pipeline),
            worker_secret::secret_name(pipeline),
        ],
    );
    Ok(Action::await_change())
}

/// Writes `TopologyReady` and `Ready` False with the reason `CleanupIncomplete` and what
/// was left behind, before the finalizer goes.
async fn report_left_behind(
    pipeline: &MailerPipeline,
    key: &PipelineKey,
    ctx: &Context,
    left: &str,
) -> Result<(), Error> {
    let previous = pipeline.status.as_ref();
    let deployment_name = deployment_name(pipeline);
    let findings = Findings {
        generation: pipeline.metadata.generation,
        applied_generation: previous.and_then(|s| s.applied_generation),
        topology: TopologyOutcome::Failed {
            reason: reasons::CLEANUP_INCOMPLETE.to_string(),
            message: left.to_string(),
        },
        deployment: None,
        desired_workers: 0,
        autoscaling: Autoscaling::Off,
        deployment_name: &deployment_name,
        queues: None,
        worker_user: previous.and_then(|s| s.worker_user.clone()),
        provider_refuses_key: None,
    };
    let status = desired_status(previous, &findings, Timestamp::now());
    let api: Api<MailerPipeline> = Api::namespaced(ctx.client.clone(), &key.namespace);
    api.patch_status(
        &key.name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": status })),
    )
    .await
    .map_err(|e| Error::kube("write the status", e))?;
    Ok(())
}

/// Whether `pipeline` was marked for deletion less than `deadline` ago.
fn within(pipeline: &MailerPipeline, deadline: Duration) -> bool {
    let Some(Time(deleted)) = &pipeline.metadata.deletion_timestamp else {
        return false;
    };
    let elapsed = Timestamp::now().duration_since(*deleted).as_secs_f64();
    elapsed < deadline.as_secs_f64()
}

/// Removes what may be removed; fails only when the Kubernetes API does. The error
/// beside the report is the first failure that may pass by itself, if any.
async fn clean_up_rabbitmq(
    pipeline: &MailerPipeline,
    ctx: &Context,
) -> Result<(CleanupReport, Option<Error>), Error> {
    let mut transient: Option<Error> = None;
    let report = remove_from_rabbitmq(pipeline, ctx, &mut transient).await?;
    Ok((report, transient))
}

async fn remove_from_rabbitmq(
    pipeline: &MailerPipeline,
    ctx: &Context,
    transient: &mut Option<Error>,
) -> Result<CleanupReport, Error> {
    let mut report = CleanupReport::default();
    let mut note_transient = |error: Error| {
        if error.is_transient() && transient.is_none() {
            *transient = Some(error);
        }
    };
    let spec = &pipeline.spec;
    let me = owner_of(&ctx.settings.cluster_name, pipeline);
    let purpose = cleanup_use(pipeline);
    let broker = match connection::locate_for(&ctx.client, pipeline, purpose).await {
        Ok(broker) => broker,
        Err(e @ Error::Kube { .. }) if e.is_transient() => return Err(e),
        Err(e) => {
            report.not_cleaned_up.push(format!(
                "everything in RabbitMQ, since the broker could not be found: {}",
                e.public_message()
            ));
            note_transient(e);
            return Ok(report);
        }
    };
    let management = match ctx.brokers.get(&broker.endpoint) {
        Ok(management) => management,
        Err(e) => {
            report
                .not_cleaned_up
                .push(format!("everything in RabbitMQ: {}", public(e)));
            return Ok(report);
        }
    };
    // What the pipeline holds is what the broker's markers name its UID, read now.
    let markers = match management.markers().await {
        Ok(markers) => markers,
        Err(e) => {
            let e = Error::from(e);
            report
                .not_cleaned_up
                .push(format!("everything in RabbitMQ: {}", e.public_message()));
            note_transient(e);
            return Ok(report);
        }
    };
    let mut held = markers.held_by(&me.uid);
    // A topology the 0.1 releases marked whole as this pipeline's: its objects that no
    // marker of their own names.
    let legacy = legacy_topology_marker(&spec.rabbitmq.vhost, &spec.topology.queue);
    let legacy_ours = markers
        .owner_of_marker(&legacy)
        .is_some_and(|owner| owner.uid == me.uid);
    if legacy_ours {
        held.extend(
            topology_claims(&spec.rabbitmq.vhost, &spec.topology)
                .into_iter()
                .filter(|claim| markers.owner(claim).is_none()),
        );
    }
    let policy = spec.topology.deletion_policy;
    match retire(&management, &broker, &me, &held, &BTreeSet::new(), policy).await {
        Ok(retired) => {
            let users = retired
                .users_removed
                .iter()
                .map(|user| format!("user {user}"));
            report.removed.extend(users);
            report.removed.extend(retired.removed);
            report.kept.extend(retired.kept);
            report.not_cleaned_up.extend(retired.left_over);
        }
        Err(e) => {
            report.not_cleaned_up.push(format!(
                "what the pipeline holds in RabbitMQ: {}",
                e.public_message()
            ));
            note_transient(e);
            return Ok(report);
        }
    }
    if legacy_ours && let Err(e) = management.clear_owner(&legacy).await {
        let e = Error::from(e);
        report.not_cleaned_up.push(format!(
            "the owner marker {legacy:?}: {}",
            e.public_message()
        ));
        note_transient(e);
    }
    Ok(report)
}

/// What an event may say of a broker's failure (see [`Error::public_message`]).
fn public(error: topology::TopologyError) -> String {
    Error::from(error).public_message()
}
