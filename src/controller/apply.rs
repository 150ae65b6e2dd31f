//! Phase 4 of a reconcile: bring RabbitMQ and Kubernetes to what is desired, each write
//! skipped when its object already is as desired. The worker Secret is saved before
//! the workers' password is set in RabbitMQ, so a password RabbitMQ knows is always kept
//! somewhere.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::context::Context;
use super::converge::unchanged_spec;
use super::deployment::SECRETS_HASH_ANNOTATION;
use super::desired::Desired;
use super::error::Error;
use super::in_use;
use super::ownership::{Claimed, owner_of};
use super::resolve::Resolved;
use super::retire::retire;
use super::ssa::apply_if_changed;
use super::validate::Validated;
use crate::topology::ownership::Claim;
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
}

pub async fn apply(
    ctx: &Context,
    valid: &Validated<'_>,
    resolved: &Resolved,
    desired: &Desired,
    claimed: &Claimed,
) -> Result<Applied, Error> {
    let client = &ctx.client;
    let namespace = &valid.namespace;
    let management = &valid.broker.management;
    let vhost = &desired.topology.vhost;
    let mut user_changes = Vec::new();
    let mut left_behind = Vec::new();
    // Before anything is made in the broker: what cleans it up needs this Secret.
    let connection_secret = valid.broker.broker.connection_secret.as_ref();
    if let Some(meta) = connection_secret {
        in_use::hold(client, valid.pipeline, meta).await?;
    }
    if !unchanged_spec(valid.pipeline) {
        // The spec may name another connection Secret than before.
        let keep = connection_secret.and_then(|meta| meta.name.as_deref());
        in_use::release_all_but(client, valid.pipeline, keep).await?;
    }
    if management.ensure_own_grant(vhost).await? {
        user_changes.push(UserChange::SetPermissions {
            user: management.endpoint().username.clone(),
            vhost: vhost.clone(),
        });
    }
    let topology_changes = topology::apply_shared(
        management,
        &desired.topology,
        ctx.settings.definitions_max_age,
    )
    .await?;

    let mut reapplied_objects = Vec::new();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let live_secret = resolved.worker_secret.as_ref();
    let secret_name = kube::ResourceExt::name_any(&desired.worker_secret);
    let applied_secret = apply_if_changed(&secrets, &desired.worker_secret, live_secret)
        .await
        .map_err(|e| Error::kube(format!("apply Secret {namespace}/{secret_name}"), e))?;
    if let Some(applied) = &applied_secret {
        ctx.owned.written(applied);
    }
    if applied_secret.is_some() && live_secret.is_some() {
        reapplied_objects.push(format!("Secret {secret_name}"));
    }

    let credentials = &valid.credentials;
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
    let live = resolved.deployment.as_ref();
    let name = kube::ResourceExt::name_any(&desired.deployment);
    let applied = apply_if_changed(&deployments, &desired.deployment, live)
        .await
        .map_err(|e| Error::kube(format!("apply Deployment {namespace}/{name}"), e))?;
    if let Some(applied) = &applied {
        ctx.owned.written(applied);
    }
    // A Deployment whose Secrets' hash is the one desired differed in something else.
    if applied.is_some()
        && live.is_some_and(|live| {
            pod_annotation(live, SECRETS_HASH_ANNOTATION) == Some(&desired.secrets_hash)
        })
    {
        reapplied_objects.push(format!("Deployment {name}"));
    }
    if !claimed.retiring.is_empty() {
        retire_unwanted(
            valid,
            desired,
            &claimed.retiring,
            &ctx.settings.cluster_name,
            &mut user_changes,
            &mut left_behind,
        )
        .await?;
    }
    Ok(Applied {
        left_behind,
        topology_changes,
        user_changes,
        reapplied_objects,
        deployment: applied.or_else(|| resolved.deployment.clone()),
    })
}

/// Gives up what the pipeline holds and no longer wants (see [`super::retire`]): its
/// objects in a vhost it left or under names it changed, a workers' user it no longer
/// uses; and the workers' permissions on a vhost it left.
async fn retire_unwanted(
    valid: &Validated<'_>,
    desired: &Desired,
    retiring: &BTreeSet<Claim>,
    cluster: &str,
    user_changes: &mut Vec<UserChange>,
    left_behind: &mut Vec<String>,
) -> Result<(), Error> {
    let management = &valid.broker.management;
    let credentials = &valid.credentials;
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
    let retired = retire(
        management,
        &valid.broker.broker,
        &me,
        retiring,
        valid.spec.topology.deletion_policy,
    )
    .await?;
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
