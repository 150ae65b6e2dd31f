//! The reconcile of one MailerPipeline: the finalizer around converging it (or cleaning
//! up after it), then its status and events (the [`report`](super::report) phase), and
//! the error policy that decides when a failed pipeline is tried again.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::{Resource, ResourceExt};

use super::cleanup::cleanup;
use super::context::Context;
use super::converge::converge;
use super::deployment::deployment_name;
use super::error::Error;
use super::reasons::event;
use super::report::report;
use super::tenancy::revoke;
use super::unreadable;
use crate::spec::MailerPipeline;

/// The finalizer that holds a deleted pipeline until its RabbitMQ side is cleaned up.
pub const FINALIZER: &str = "mailer.dev/cleanup";

/// Reconciles one pipeline: adds the finalizer, converges it and writes its status, or,
/// when it is being deleted, cleans up and removes the finalizer.
pub async fn reconcile(pipeline: Arc<MailerPipeline>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let key = key_of(pipeline.as_ref());
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

/// Reconciles a pipeline as the root watch read it: one that could not be deserialized
/// is reported on its object and fails, without holding up the others.
pub async fn reconcile_guarded(
    guard: Arc<DeserializeGuard<MailerPipeline>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    match &guard.0 {
        Ok(pipeline) => reconcile(Arc::new(pipeline.clone()), ctx).await,
        Err(invalid) => {
            let started = Instant::now();
            let error = unreadable::report(&guard, invalid, &ctx).await;
            ctx.metrics
                .reconciled(Err(error.category()), started.elapsed());
            tracing::warn!(pipeline = %key_of(guard.as_ref()), error = %error, "cannot read the pipeline");
            Err(error)
        }
    }
}

/// When a failed pipeline is tried again: soon, backing off, when the failure may pass
/// by itself; otherwise after the resync interval (a change of the pipeline or of a
/// Secret it names tries it at once).
pub fn error_policy<K: Resource>(pipeline: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.is_transient() {
        Action::requeue(ctx.next_backoff(&key_of(pipeline.as_ref())))
    } else {
        Action::requeue(ctx.resync_after(&resync_key(pipeline.as_ref())))
    }
}

/// What places a pipeline in the resync interval: its uid, or `namespace/name`.
fn resync_key<K: Resource>(object: &K) -> String {
    object.meta().uid.clone().unwrap_or_else(|| key_of(object))
}

/// `namespace/name`, the key of a pipeline's backoff and logs.
fn key_of<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
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

/// Converges the pipeline, then reports: its status (written only when it changed),
/// metrics and events.
async fn apply(pipeline: &MailerPipeline, ctx: &Context) -> Result<Action, Error> {
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let worker_deployment = deployment_name(pipeline);
    let live: Option<Deployment> = ctx
        .owned
        .read(&ctx.client, &namespace, &worker_deployment)
        .await?;
    let outcome = converge(ctx, pipeline, live.clone()).await;
    if let Err(Error::NotAllowed { .. }) = &outcome {
        revoke_access(pipeline, ctx).await;
    }
    report(pipeline, ctx, &outcome, live.as_ref()).await?;
    outcome.map(|_| Action::requeue(ctx.resync_after(&resync_key(pipeline))))
}

/// A pipeline whose namespace its cluster no longer allows loses the workers' users the
/// operator made there. What fails is logged and tried again at the next reconcile; the
/// pipeline is told `NotAllowed` either way, and an event names the users removed.
async fn revoke_access(pipeline: &MailerPipeline, ctx: &Context) {
    match revoke(ctx, pipeline).await {
        Ok(users) if users.is_empty() => {}
        Ok(users) => {
            tracing::info!(users = ?users, "removed the workers' users of a pipeline its cluster no longer allows");
            ctx.publish(
                &pipeline.object_ref(&()),
                EventType::Warning,
                event::ACCESS_REVOKED,
                "Revoke",
                format!(
                    "removed the workers' RabbitMQ user {}: the cluster no longer allows this namespace",
                    users.join(", ")
                ),
            )
            .await;
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not remove the workers' users of a pipeline its cluster no longer allows; trying again at the next reconcile");
        }
    }
}
