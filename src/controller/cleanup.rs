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

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::connection;
use super::context::Context;
use super::deployment::deployment_name;
use super::error::Error;
use super::ownership::{NotToRemove, is_ours, owner_of};
use super::reasons::event;
use super::resolve::CAPABILITIES_MAX_AGE;
use super::worker_user::{self, managed_username};
use crate::spec::{DeletionPolicy, MailerPipeline};
use crate::topology::ownership::{topology_marker, user_marker};
use crate::topology::{self, BrokerCapabilities, EmptinessCheck, Management, Topology};

/// What a cleanup removed, and what it left with why.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub removed: Vec<String>,
    /// Left because the deletion policy says so.
    pub kept: Vec<String>,
    /// Left because it could not be removed.
    pub not_cleaned_up: Vec<String>,
}

pub async fn cleanup(pipeline: &MailerPipeline, ctx: &Context) -> Result<Action, Error> {
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
    let regarding = pipeline.object_ref(&());
    let mut note = Vec::new();
    if !report.removed.is_empty() {
        note.push(format!("removed {}", report.removed.join(", ")));
    }
    if !report.kept.is_empty() {
        note.push(format!("kept {}", report.kept.join(", ")));
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
        note.push(format!(
            "NOT cleaned up (remove by hand if unwanted): {}",
            report.not_cleaned_up.join("; ")
        ));
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
    let namespace = pipeline.namespace().unwrap_or_default();
    ctx.metrics.forget(&namespace, &pipeline.name_any());
    ctx.forget(&format!("{namespace}/{}", pipeline.name_any()));
    ctx.owned.forget(
        &namespace,
        &[
            deployment_name(pipeline),
            worker_user::secret_name(pipeline),
        ],
    );
    Ok(Action::await_change())
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
    let managed_user = spec
        .worker
        .user_secret
        .is_none()
        .then(|| managed_username(&ctx.settings.cluster_name, pipeline));
    let me = owner_of(&ctx.settings.cluster_name, pipeline);
    let broker = match connection::resolve(&ctx.client, pipeline).await {
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

    // The user goes first: RabbitMQ closes its connections, so the deliveries the
    // workers held return to their queue and are counted before a queue is deleted.
    // Only what is marked as this pipeline's (or not marked at all) is removed.
    if let Some(user) = &managed_user {
        let marker = user_marker(user);
        match is_ours(&management, &marker, &me).await {
            Ok(()) => {
                match management.delete_user(user).await {
                    Ok(true) => report.removed.push(format!("user {user}")),
                    Ok(false) => {}
                    Err(e) => {
                        let e = Error::from(e);
                        report
                            .not_cleaned_up
                            .push(format!("user {user}: {}", e.public_message()));
                        note_transient(e);
                    }
                }
                release(&management, &marker, &mut report, &mut note_transient).await;
            }
            Err(NotToRemove::Foreign(why)) => report.kept.push(format!("user {user}: {why}")),
            Err(NotToRemove::Unknown(e)) => {
                report
                    .not_cleaned_up
                    .push(format!("user {user}: {}", e.public_message()));
                note_transient(e);
            }
        }
    }
    let marker = topology_marker(&spec.rabbitmq.vhost, &spec.topology.queue);
    if let Err(not) = is_ours(&management, &marker, &me).await {
        let what = format!(
            "the topology of queue {:?} in vhost {:?}",
            spec.topology.queue, spec.rabbitmq.vhost
        );
        match not {
            NotToRemove::Foreign(why) => report.kept.push(format!("{what}: {why}")),
            NotToRemove::Unknown(e) => {
                report
                    .not_cleaned_up
                    .push(format!("{what}: {}", e.public_message()));
                note_transient(e);
            }
        }
        return Ok(report);
    }
    release(&management, &marker, &mut report, &mut note_transient).await;

    let policy = spec.topology.deletion_policy;
    // Deleting goes by the objects' names, which no capability changes; the broker is
    // asked for them only when something is to be deleted.
    let capabilities = match policy {
        DeletionPolicy::Retain => BrokerCapabilities::RABBITMQ_4,
        DeletionPolicy::Delete => {
            match management.capabilities_within(CAPABILITIES_MAX_AGE).await {
                Ok(capabilities) => capabilities,
                Err(e) => {
                    let e = Error::from(e);
                    report.not_cleaned_up.push(format!(
                        "the topology in vhost {:?}: {}",
                        spec.rabbitmq.vhost,
                        e.public_message()
                    ));
                    note_transient(e);
                    return Ok(report);
                }
            }
        }
    };
    let desired = match Topology::desired(&spec.rabbitmq.vhost, &spec.topology, capabilities) {
        Ok(desired) => desired,
        Err(e) => {
            if policy == DeletionPolicy::Delete {
                report
                    .not_cleaned_up
                    .push(format!("the topology, since the spec is invalid: {e}"));
            }
            return Ok(report);
        }
    };
    let amqp_url = broker.operator_amqp_url(&desired.vhost);
    match topology::delete(
        &management,
        &desired,
        policy,
        EmptinessCheck::Live(&amqp_url),
    )
    .await
    {
        Ok(deleted) => {
            report.removed.extend(deleted.removed);
            // Under Delete, whatever was kept was meant to go (a queue that still holds
            // mail, a broker that went away); under Retain, keeping is the point.
            let meant_to_go = policy == DeletionPolicy::Delete;
            for kept in deleted.kept {
                let nothing_there = kept.starts_with("nothing:");
                if meant_to_go && !nothing_there {
                    report.not_cleaned_up.push(kept);
                } else {
                    report.kept.push(kept);
                }
            }
        }
        Err(e) => {
            let e = Error::from(e);
            report.not_cleaned_up.push(format!(
                "the topology in vhost {:?}: {}",
                desired.vhost,
                e.public_message()
            ));
            note_transient(e);
        }
    }
    Ok(report)
}

/// Removes this pipeline's owner marker, so another pipeline may take what is left.
async fn release(
    management: &Management,
    marker: &str,
    report: &mut CleanupReport,
    note_transient: &mut impl FnMut(Error),
) {
    if let Err(e) = management.clear_owner(marker).await {
        let e = Error::from(e);
        report.not_cleaned_up.push(format!(
            "the owner marker {marker:?}: {}",
            e.public_message()
        ));
        note_transient(e);
    }
}

/// What an event may say of a broker's failure (see [`Error::public_message`]).
fn public(error: topology::TopologyError) -> String {
    Error::from(error).public_message()
}
