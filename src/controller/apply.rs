//! Phase 4 of a reconcile: bring RabbitMQ and Kubernetes to what is desired, each write
//! skipped when its object already is as desired. The worker Secret is saved before
//! the workers' password is set in RabbitMQ, so a password RabbitMQ knows is always kept
//! somewhere.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

use super::deployment::SECRETS_HASH_ANNOTATION;
use super::desired::Desired;
use super::error::Error;
use super::resolve::Resolved;
use super::ssa::apply_if_changed;
use super::validate::Validated;
use crate::topology::ownership::user_marker;
use crate::topology::{self, Change, UserChange, UserGrant};

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
    /// Writing requests made to RabbitMQ's management API: 0 when it was in sync.
    pub rabbitmq_writes: usize,
}

pub async fn apply(
    client: &Client,
    valid: &Validated<'_>,
    resolved: &Resolved,
    desired: &Desired,
) -> Result<Applied, Error> {
    let namespace = &valid.namespace;
    let management = &valid.broker.management;
    let topology_changes = topology::apply(management, &desired.topology).await?;

    let mut reapplied_objects = Vec::new();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let live_secret = resolved.worker_secret.as_ref();
    let secret_name = kube::ResourceExt::name_any(&desired.worker_secret);
    let applied_secret = apply_if_changed(&secrets, &desired.worker_secret, live_secret)
        .await
        .map_err(|e| Error::kube(format!("apply Secret {namespace}/{secret_name}"), e))?;
    if applied_secret.is_some() && live_secret.is_some() {
        reapplied_objects.push(format!("Secret {secret_name}"));
    }

    let credentials = &valid.credentials;
    let mut user_changes = Vec::new();
    if let Some(permissions) = &desired.permissions {
        let grant = UserGrant {
            username: &credentials.username,
            password: &credentials.password,
            vhost: &desired.topology.vhost,
            permissions,
        };
        user_changes = management.ensure_user(&grant).await?;
    }
    if let Some(replaced) = &desired.replaced_user {
        // Only a user marked as this pipeline's, or not marked at all, is removed.
        let marker = user_marker(replaced);
        let owner = management.owner(&marker).await?;
        let ours =
            owner.is_none_or(|o| Some(o.uid.as_str()) == valid.pipeline.metadata.uid.as_deref());
        if ours && management.delete_user(replaced).await? {
            user_changes.push(UserChange::DeleteUser(replaced.clone()));
        }
        if ours {
            management.clear_owner(&marker).await?;
        }
    }

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let live = resolved.deployment.as_ref();
    let name = kube::ResourceExt::name_any(&desired.deployment);
    let applied = apply_if_changed(&deployments, &desired.deployment, live)
        .await
        .map_err(|e| Error::kube(format!("apply Deployment {namespace}/{name}"), e))?;
    // A Deployment whose Secrets' hash is the one desired differed in something else.
    if applied.is_some()
        && live.is_some_and(|live| {
            pod_annotation(live, SECRETS_HASH_ANNOTATION) == Some(&desired.secrets_hash)
        })
    {
        reapplied_objects.push(format!("Deployment {name}"));
    }
    Ok(Applied {
        topology_changes,
        user_changes,
        reapplied_objects,
        deployment: applied.or_else(|| resolved.deployment.clone()),
        rabbitmq_writes: management.writes(),
    })
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
