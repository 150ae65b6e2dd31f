//! The reconcile of one MailerPipeline, every step in order, in this file:
//!
//! 1. [`resolve`]: read what the pipeline owns and everything it references; nothing is
//!    written, so a missing Secret or an unreachable broker fails here.
//! 2. [`validate`]: check the spec and what was read, once, into a validated pipeline
//!    (pure).
//! 3. [`desired`]: what should exist, as a pure function of the validated pipeline (a
//!    new workers' password is generated here).
//! 4. [`claim`]: what the pipeline holds in the broker, and the claims it needs, decided
//!    under the broker's locks; a pipeline refused here has written nothing.
//! 5. [`apply`]: make it so, each write skipped when already so; what the pipeline
//!    no longer needs goes last ([`retire`]). A pipeline made among others of its vhost
//!    stops after its policies and is reconciled again once the vhost's have settled
//!    ([`crate::controller::runtime::ahead`]).
//! 6. [`observe`]: the queues' depths and whether their policies apply as written.
//! 7. [`report`]: the status (written only when it changed), the gauges, the events.
//!
//! A pipeline being deleted is cleaned up instead ([`cleanup`]); one that cannot be
//! deserialized is reported as such ([`unreadable`]). The error policy at the end decides
//! when a failed pipeline is tried again.

pub mod apply;
pub mod claim;
pub mod cleanup;
pub mod desired;
pub mod observe;
pub mod report;
pub mod resolve;
pub mod retire;
pub mod revoke;
pub mod unreadable;
pub mod validate;

use std::sync::Arc;
use std::time::Instant;

use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::{Resource, ResourceExt};

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::key::PipelineKey;
use crate::controller::objects::autoscaling::{Autoscaling, workers_short};
use crate::controller::objects::worker_secret::generate_password;
use crate::controller::reasons::event;
use crate::controller::runtime::ahead::AHEAD_AT_MOST;
use crate::spec::MailerPipeline;
use crate::topology::{Change, Management, Requests, counted};
use apply::{Applied, Applying};
use observe::Observed;
use resolve::Owned;

/// The finalizer that holds a deleted pipeline until its RabbitMQ side is cleaned up.
pub const FINALIZER: &str = "mailer.dev/cleanup";

/// What steps 1 to 6 did and found, for the report.
#[derive(Debug)]
pub struct Converged {
    pub applied: Applied,
    /// Whether KEDA scales the workers.
    pub autoscaling: Autoscaling,
    pub observed: Observed,
    pub worker_user: String,
    /// The requests this reconcile made to RabbitMQ's management API (its client is
    /// shared with the others running at once): no write when it was in sync.
    pub rabbitmq: Requests,
}

/// Reconciles one pipeline: adds the finalizer, brings it about and reports, or, when it
/// is being deleted, cleans up and removes the finalizer.
pub async fn reconcile(pipeline: Arc<MailerPipeline>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let key = PipelineKey::of(pipeline.as_ref())?;
    let api: Api<MailerPipeline> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let result = finalizer(&api, FINALIZER, pipeline, |event| async {
        match event {
            FinalizerEvent::Apply(pipeline) => reconcile_live(&pipeline, &key, &ctx).await,
            FinalizerEvent::Cleanup(pipeline) => {
                // Deleted between its two reconciles: no second one is waited for.
                ctx.ahead.done(&key);
                cleanup::cleanup(&pipeline, &key, &ctx).await
            }
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

/// The steps of a pipeline that is not being deleted.
async fn reconcile_live(
    pipeline: &MailerPipeline,
    key: &PipelineKey,
    ctx: &Context,
) -> Result<Action, Error> {
    // 1. What it owns first: the status shows its workers even when a later step fails.
    let owned = resolve::owned(ctx, pipeline, key).await?;
    // Boxed: the steps' future is large, and a reconcile may run on a small stack. The
    // management API's requests are counted for this reconcile alone.
    let (outcome, rabbitmq) = counted(Box::pin(steps(ctx, pipeline, key, owned.clone()))).await;
    let outcome = match outcome {
        Ok(Stage::PoliciesAhead { management, vhost }) => {
            ctx.ahead.went_ahead(key, &management, &vhost);
            ctx.metrics.went_ahead();
            return Ok(Action::requeue(AHEAD_AT_MOST));
        }
        Ok(Stage::Converged(converged)) => Ok(Converged {
            rabbitmq,
            ..*converged
        }),
        Err(e) => Err(e),
    };
    ctx.ahead.done(key);
    if let Err(Error::NotAllowed { .. }) = &outcome {
        revoke_access(pipeline, ctx).await;
    }
    // 7. report
    report::report(pipeline, key, ctx, &outcome, owned.deployment.as_ref()).await?;
    outcome.map(|_| Action::requeue(ctx.resync_after(&resync_key(pipeline))))
}

/// How far steps 1 to 6 went.
enum Stage {
    Converged(Box<Converged>),
    /// The pipeline was made among others of its vhost and stopped after its policies
    /// (see [`crate::controller::runtime::ahead`]): nothing to report yet.
    PoliciesAhead {
        management: Arc<Management>,
        vhost: String,
    },
}

/// Steps 1 to 6.
async fn steps(
    ctx: &Context,
    pipeline: &MailerPipeline,
    key: &PipelineKey,
    owned: Owned,
) -> Result<Stage, Error> {
    let workers_short = owned.deployment.as_ref().is_some_and(workers_short);
    // 1. resolve
    let resolved = resolve::resolve(ctx, pipeline, key, owned).await?;
    // 2. validate
    let valid = validate::validate(pipeline, key, &resolved, &ctx.settings.cluster_name)?;
    // 3. desired
    let desired = desired::desired(&valid, &resolved, &ctx.settings, generate_password)?;
    // 4. claim
    let claimed = claim::claim(ctx, &valid, &desired).await?;
    // 5. apply
    let ahead = ctx.ahead.may_go_ahead(key);
    let (applied, autoscaling) =
        match apply::apply(ctx, &valid, &resolved, &desired, &claimed, ahead).await? {
            Applying::Done(applied, autoscaling) => (*applied, autoscaling),
            Applying::PoliciesAhead => {
                return Ok(Stage::PoliciesAhead {
                    management: valid.broker.management.clone(),
                    vhost: desired.topology.vhost.clone(),
                });
            }
        };
    // 6. observe, at most every `queue_depth_interval`; in between the status keeps the
    // last. Queues this reconcile made are known empty.
    let management = &valid.broker.management;
    let made_every_queue = desired.topology.queues.iter().all(|queue| {
        applied
            .topology_changes
            .iter()
            .any(|change| matches!(change, Change::CreateQueue(made) if made.name == queue.name))
    });
    let mut observed = match ctx.queue_depths_due(key) {
        _ if made_every_queue && applied.draining.is_empty() => {
            observe::just_made(&desired.topology, &valid.spec.topology)
        }
        true => {
            let spec = &valid.spec.topology;
            let draining = &applied.draining;
            observe::observe(management, &desired.topology, spec, draining).await
        }
        false => Observed::NOT_READ,
    };
    // Every time while workers are short, so the reason shows with their readiness.
    let worker_user = &desired.credentials.username;
    let vhost = &desired.topology.vhost;
    observed.provider_key =
        observe::provider_key(management, vhost, worker_user, workers_short).await;
    Ok(Stage::Converged(Box::new(Converged {
        applied,
        autoscaling,
        observed,
        worker_user: desired.credentials.username.clone(),
        rabbitmq: Requests::default(),
    })))
}

/// Reconciles a pipeline as the root watch read it: one that could not be deserialized
/// is reported on its object and fails, without holding up the others.
pub async fn reconcile_guarded(
    guard: Arc<DeserializeGuard<MailerPipeline>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ahead = ctx.ahead.clone();
    let _running = ahead.reconciling();
    match &guard.0 {
        Ok(pipeline) => reconcile(Arc::new(pipeline.clone()), ctx).await,
        Err(invalid) => {
            let started = Instant::now();
            let error = unreadable::report(&guard, invalid, &ctx).await;
            ctx.metrics
                .reconciled(Err(error.category()), started.elapsed());
            let key = PipelineKey::as_far_as_known(guard.as_ref());
            tracing::warn!(pipeline = %key, error = %error, "cannot read the pipeline");
            Err(error)
        }
    }
}

/// When a failed pipeline is tried again: soon, backing off, when the failure may pass
/// by itself; otherwise after the resync interval (a change of the pipeline or of a
/// Secret it names tries it at once).
pub fn error_policy<K: Resource>(pipeline: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.is_transient() {
        let key = PipelineKey::as_far_as_known(pipeline.as_ref());
        Action::requeue(ctx.next_backoff(&key))
    } else {
        Action::requeue(ctx.resync_after(&resync_key(pipeline.as_ref())))
    }
}

/// What places a pipeline in the resync interval: its uid, or `namespace/name`.
fn resync_key<K: Resource>(object: &K) -> String {
    object
        .meta()
        .uid
        .clone()
        .unwrap_or_else(|| PipelineKey::as_far_as_known(object).to_string())
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

/// A pipeline whose namespace its cluster no longer allows loses the workers' users the
/// operator made there. What fails is logged and tried again at the next reconcile; the
/// pipeline is told `NotAllowed` either way, and an event names the users removed.
async fn revoke_access(pipeline: &MailerPipeline, ctx: &Context) {
    match revoke::revoke(ctx, pipeline).await {
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
            tracing::warn!(pipeline = %pipeline.name_any(), error = %e, "could not remove the workers' users of a pipeline its cluster no longer allows; trying again at the next reconcile");
        }
    }
}
