//! Step 5 of a reconcile: bring RabbitMQ and Kubernetes to what is desired, each write
//! skipped when its object already is as desired. The worker Secret is saved before
//! the workers' password is set in RabbitMQ, so a password RabbitMQ knows is always kept
//! somewhere.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams};

use crate::controller::broker::in_use;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kube::keda::apis;
use crate::controller::kube::ssa::{apply_if_changed, ensure_ours};
use crate::controller::objects::autoscaling::{
    Autoscaling, asked_workers, desired_scaled_object, desired_trigger_authentication,
};
use crate::controller::objects::deployment::{SECRETS_HASH_ANNOTATION, deployment_name};
use crate::controller::objects::status::unchanged_spec;
use crate::controller::reconcile::claim::{Claimed, owner_of};
use crate::controller::reconcile::desired::Desired;
use crate::controller::reconcile::resolve::{LiveKeda, Resolved};
use crate::controller::reconcile::retire::retire;
use crate::controller::reconcile::validate::Validated;
use crate::controller::runtime::ahead::AMONG_OTHERS_WITHIN;
use crate::topology::ownership::{Claim, is_former_tier};
use crate::topology::{self, Change, UserChange, UserGrant};

/// How long a vhost's definitions, read for one reconcile, serve the others of the same
/// broker endpoint and vhost (while the operator writes nothing there): drift made by
/// someone else is found up to this much later than the resync that looks.
pub const SHARED_DEFINITIONS_MAX_AGE: Duration = Duration::from_secs(10);

/// What applying changed.
#[derive(Debug)]
pub struct Applied {
    /// Writes made to RabbitMQ's topology.
    pub topology_changes: Vec<Change>,
    /// Writes made to the worker's RabbitMQ user.
    pub user_changes: Vec<UserChange>,
    /// Objects in Kubernetes that existed and were applied again: changed by someone
    /// else when the spec is the one applied before, else by the spec's change.
    pub reapplied_objects: Vec<String>,
    /// The worker Deployment as it is now.
    pub deployment: Option<Deployment>,
    /// What was done in, or kept of, the vhost the pipeline left.
    pub left_behind: Vec<String>,
    /// Delay queues of tiers the spec no longer has, kept while they hold parked
    /// requests (see [`retire`]).
    pub draining: Vec<String>,
    /// Such queues, and their policies, removed now that they are empty.
    pub drained: Vec<String>,
}

/// How far applying went.
#[derive(Debug)]
pub enum Applying {
    /// Everything desired is so; with whether KEDA scales the workers.
    Done(Box<Applied>, Autoscaling),
    /// Only the vhost and the policies were written, with those of other pipelines of
    /// the vhost being made at once: the rest waits until the vhost's policies have
    /// settled (see [`topology::apply_shared`]). Nothing in Kubernetes was written.
    PoliciesAhead,
}

/// Applies what is desired, and says whether KEDA scales the workers. With
/// `policies_ahead`, a pipeline made among others of its vhost may stop after its
/// policies ([`Applying::PoliciesAhead`]).
pub async fn apply(
    ctx: &Context,
    valid: &Validated<'_>,
    resolved: &Resolved,
    desired: &Desired,
    claimed: &Claimed,
    policies_ahead: bool,
) -> Result<Applying, Error> {
    let client = &ctx.client;
    let namespace = &valid.key.namespace;
    let management = &valid.broker.management;
    let vhost = &desired.topology.vhost;
    let mut user_changes = Vec::new();
    let mut left_behind = Vec::new();
    let mut tiers = FormerTiers::default();
    // Before anything is made in the broker: what cleans it up needs this Secret.
    let connection_secret = valid.broker.broker.connection_secret.as_ref();
    if let Some(meta) = connection_secret {
        in_use::hold(client, &ctx.owned, valid.pipeline, meta).await?;
    }
    if !unchanged_spec(valid.pipeline) {
        // The spec may name another connection Secret than before.
        let keep = connection_secret.and_then(|meta| meta.name.as_deref());
        in_use::release_all_but(client, &ctx.owned, valid.pipeline, keep).await?;
    }
    let max_age = ctx.settings.definitions_max_age;
    if management.ensure_own_grant(vhost, max_age).await? {
        user_changes.push(UserChange::SetPermissions {
            user: management.endpoint().username.clone(),
            vhost: vhost.clone(),
        });
    }
    let shared = topology::apply_shared(
        management,
        &desired.topology,
        ctx.settings.definitions_max_age,
        ctx.settings.policy_window,
        policies_ahead.then_some(AMONG_OTHERS_WITHIN),
    )
    .await?;
    if shared.rest_deferred {
        return Ok(Applying::PoliciesAhead);
    }
    let topology_changes = shared.changes;

    let mut reapplied_objects = Vec::new();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let live_secret = resolved.owned.worker_secret.as_ref();
    let secret_name = kube::ResourceExt::name_any(&desired.worker_secret);
    let writing = ctx.owned.writing("Secret", namespace, &secret_name);
    let applied_secret = apply_if_changed(&secrets, &desired.worker_secret, live_secret)
        .await
        .map_err(|e| Error::kube(format!("apply Secret {namespace}/{secret_name}"), e))?;
    if let Some(applied) = &applied_secret {
        ctx.owned.written(applied);
    }
    drop(writing);
    if applied_secret.is_some() && live_secret.is_some() {
        reapplied_objects.push(format!("Secret {secret_name}"));
    }

    let credentials = &desired.credentials;
    if let Some(permissions) = &desired.permissions {
        let grant = UserGrant {
            username: &credentials.username,
            password: &credentials.password,
            vhost: &desired.topology.vhost,
            permissions,
        };
        user_changes.extend(management.ensure_user(&grant).await?);
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let live = resolved.owned.deployment.as_ref();
    let name = kube::ResourceExt::name_any(&desired.deployment);
    let writing = ctx.owned.writing("Deployment", namespace, &name);
    let applied = apply_if_changed(&deployments, &desired.deployment, live)
        .await
        .map_err(|e| Error::kube(format!("apply Deployment {namespace}/{name}"), e))?;
    if let Some(applied) = &applied {
        ctx.owned.written(applied);
    }
    drop(writing);
    // A Deployment whose Secrets' hash is the one desired differed in something else.
    if applied.is_some()
        && live.is_some_and(|live| {
            pod_annotation(live, SECRETS_HASH_ANNOTATION) == Some(&desired.secrets_hash)
        })
    {
        reapplied_objects.push(format!("Deployment {name}"));
    }
    // KEDA's objects reference the Deployment, so they follow it.
    let (autoscaling, reapplied) = apply_autoscaling(client, valid, &resolved.keda).await?;
    reapplied_objects.extend(reapplied);
    if !claimed.retiring.is_empty() {
        tiers.workers_rolled_out = applied.as_ref().or(live).is_none_or(rolled_out);
        retire_unwanted(
            valid,
            desired,
            &claimed.retiring,
            &ctx.settings.cluster_name,
            &mut user_changes,
            &mut left_behind,
            &mut tiers,
        )
        .await?;
    }
    let applied = Applied {
        left_behind,
        draining: tiers.draining,
        drained: tiers.drained,
        topology_changes,
        user_changes,
        reapplied_objects,
        deployment: applied.or_else(|| resolved.owned.deployment.clone()),
    };
    Ok(Applying::Done(Box::new(applied), autoscaling))
}

/// Gives up what the pipeline holds and no longer wants (see [`crate::controller::reconcile::retire`]): its
/// objects in a vhost it left or under names it changed, a workers' user it no longer
/// uses; and the workers' permissions on a vhost it left. The delay queues of tiers it
/// no longer has go when empty, and only once the workers have rolled out (see
/// [`FormerTiers`]).
async fn retire_unwanted(
    valid: &Validated<'_>,
    desired: &Desired,
    retiring: &BTreeSet<Claim>,
    cluster: &str,
    user_changes: &mut Vec<UserChange>,
    left_behind: &mut Vec<String>,
    tiers: &mut FormerTiers,
) -> Result<(), Error> {
    let management = &valid.broker.management;
    let credentials = &valid.user;
    let left: BTreeSet<&str> = retiring
        .iter()
        .filter_map(Claim::vhost)
        .filter(|vhost| *vhost != desired.topology.vhost)
        .collect();
    for vhost in left {
        if credentials.managed
            && management
                .remove_permissions(&credentials.username, vhost)
                .await?
        {
            user_changes.push(UserChange::RemovePermissions {
                user: credentials.username.clone(),
                vhost: vhost.to_string(),
            });
        }
    }
    let me = owner_of(cluster, valid.pipeline);
    let (former_tiers, others): (BTreeSet<Claim>, BTreeSet<Claim>) = retiring
        .iter()
        .cloned()
        .partition(|claim| is_former_tier(&desired.topology.vhost, &valid.spec.topology, claim));
    let retiring = if tiers.workers_rolled_out {
        retiring
    } else {
        // Held as they are until the rollout ends: the next reconcile counts them.
        tiers
            .draining
            .extend(former_tiers.iter().filter_map(|claim| match claim {
                Claim::Queue { name, .. } => Some(name.clone()),
                _ => None,
            }));
        &others
    };
    let retired = retire(
        management,
        &valid.broker.broker,
        &me,
        retiring,
        &former_tiers,
        valid.spec.topology.deletion_policy,
    )
    .await?;
    tiers.draining.extend(retired.draining);
    tiers.drained.extend(retired.drained);
    user_changes.extend(
        retired
            .users_removed
            .into_iter()
            .map(UserChange::DeleteUser),
    );
    left_behind.extend(retired.removed.iter().map(|r| format!("remove {r}")));
    left_behind.extend(retired.kept.iter().map(|r| format!("keep {r}")));
    left_behind.extend(retired.left_over.iter().map(|r| format!("keep {r}")));
    Ok(())
}

/// Applies (or removes) the pipeline's KEDA objects, writing only what differs; returns
/// the names of objects that existed and were applied again.
async fn apply_autoscaling(
    client: &Client,
    valid: &Validated<'_>,
    live: &LiveKeda,
) -> Result<(Autoscaling, Vec<String>), Error> {
    let pipeline = valid.pipeline;
    let namespace = &valid.key.namespace;
    let name = deployment_name(pipeline);
    let [(authentications, _), (scaled_objects, _)] = apis(client, namespace);
    let found = [
        (
            &authentications,
            "TriggerAuthentication",
            live.authentication.as_ref(),
        ),
        (&scaled_objects, "ScaledObject", live.scaled_object.as_ref()),
    ];
    let Some(autoscaling) = &pipeline.spec.worker.autoscaling else {
        // Only what is ours is removed.
        for (api, kind, object) in found {
            if object.is_some() && ensure_ours(kind, object, pipeline).is_ok() {
                api.delete(&name, &DeleteParams::default())
                    .await
                    .map_err(|e| Error::kube(format!("delete {kind} {namespace}/{name}"), e))?;
            }
        }
        return Ok((Autoscaling::Off, Vec::new()));
    };
    if !live.installed {
        return Ok((Autoscaling::Unavailable, Vec::new()));
    }
    let mut reapplied = Vec::new();
    for ((api, kind, object), desired) in found.into_iter().zip([
        desired_trigger_authentication(pipeline)?,
        desired_scaled_object(pipeline, autoscaling)?,
    ]) {
        let applied = apply_if_changed(api, &desired, object)
            .await
            .map_err(|e| Error::kube(format!("apply {kind} {namespace}/{name}"), e))?;
        if applied.is_some() && object.is_some() {
            reapplied.push(format!("{kind} {name}"));
        }
    }
    Ok((Autoscaling::On, reapplied))
}

/// The delay queues of tiers the spec no longer has, in the apply phase.
#[derive(Debug, Default)]
struct FormerTiers {
    /// Whether every worker runs the current template: until then a worker of the old
    /// one could park in a former tier between its count and its removal, so none goes.
    workers_rolled_out: bool,
    /// Kept: they hold parked requests, or the workers have not rolled out.
    draining: Vec<String>,
    /// Removed, with their policies, now that they are empty.
    drained: Vec<String>,
}

/// Whether every worker pod runs the Deployment's current template: the Deployment
/// controller has seen its latest spec, and all its pods are updated ones.
fn rolled_out(deployment: &Deployment) -> bool {
    let Some(status) = &deployment.status else {
        return false;
    };
    let wanted = asked_workers(deployment);
    let updated = status.updated_replicas.unwrap_or(0);
    status.observed_generation >= deployment.metadata.generation
        && updated >= wanted
        && status.replicas.unwrap_or(0) <= updated
}

fn pod_annotation<'a>(deployment: &'a Deployment, key: &str) -> Option<&'a String> {
    deployment
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(
        generation: i64,
        observed: i64,
        replicas: i32,
        updated: i32,
        total: i32,
    ) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"generation": generation},
            "spec": {"replicas": replicas, "selector": {}, "template": {}},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total}
        }))
        .unwrap()
    }

    #[test]
    fn rolled_out_once_every_pod_is_of_the_latest_template() {
        assert!(rolled_out(&deployment(3, 3, 2, 2, 2)));
        assert!(rolled_out(&deployment(3, 3, 0, 0, 0)), "scaled to zero");
        assert!(
            !rolled_out(&deployment(3, 2, 2, 2, 2)),
            "the new spec not yet seen"
        );
        assert!(
            !rolled_out(&deployment(3, 3, 2, 1, 2)),
            "one pod of the old template"
        );
        assert!(
            !rolled_out(&deployment(3, 3, 2, 2, 3)),
            "an old pod still terminating"
        );
        assert!(!rolled_out(&Deployment::default()), "no status yet");
    }
}
