//! Bringing RabbitMQ and Kubernetes to what a pipeline asks for, in phases: validate,
//! resolve the broker, apply the topology and the worker user, then the worker Secret
//! and Deployment. Every write is skipped when its object already is as desired.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::autoscaling::{self, Autoscaling};
use super::connection::{self, get_secret, required_key};
use super::context::Settings;
use super::deployment::{
    SECRETS_HASH_ANNOTATION, WorkerInputs, deployment_name, desired_deployment, keep_live_selector,
    secrets_hash,
};
use super::error::Error;
use super::ssa::{apply_if_changed, ensure_ours};
use super::worker_user::{self, WorkerCredentials};
use crate::spec::{MailerPipeline, QueueDepths};
use crate::topology::{
    self, Change, Management, Permissions, QueueDepth, Topology, UserChange, UserGrant,
};

/// What converging changed and found.
#[derive(Debug)]
pub struct Converged {
    /// Writes made to RabbitMQ's topology.
    pub topology_changes: Vec<Change>,
    /// Writes made to the worker's RabbitMQ user.
    pub user_changes: Vec<UserChange>,
    /// Objects in Kubernetes that had been changed by someone else and were put back.
    pub repaired_objects: Vec<String>,
    /// The worker Deployment as it is now.
    pub deployment: Option<Deployment>,
    /// Whether KEDA scales the workers.
    pub autoscaling: Autoscaling,
    pub queues: Option<QueueDepths>,
    pub worker_user: String,
    /// Writing requests made to RabbitMQ's management API: 0 when it was in sync.
    pub rabbitmq_writes: usize,
}

/// Applies everything `pipeline` asks for. `live_deployment` is the worker Deployment
/// as read before; it is returned unchanged when nothing needed applying.
pub async fn converge(
    client: &Client,
    settings: &Settings,
    pipeline: &MailerPipeline,
    live_deployment: Option<Deployment>,
) -> Result<Converged, Error> {
    pipeline.spec.validate_for_operator()?;
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;

    // What the operator would make must be its own before anything is written anywhere.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret_name = worker_user::secret_name(pipeline);
    let live_secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|e| Error::kube(format!("read Secret {namespace}/{secret_name}"), e))?;
    ensure_ours("Deployment", live_deployment.as_ref(), pipeline)?;
    ensure_ours("Secret", live_secret.as_ref(), pipeline)?;

    let broker = connection::resolve(client, pipeline).await?;
    let management = Management::new(&broker.endpoint)?;
    let desired_topology = Topology::desired(&pipeline.spec, management.capabilities().await?)?;
    let topology_changes = topology::apply(&management, &desired_topology).await?;

    let credentials = worker_user::credentials(client, pipeline, live_secret.as_ref()).await?;
    let mut user_changes = ensure_worker_user(&management, pipeline, &credentials).await?;
    if let Some(replaced) = worker_user::replaced_managed_user(live_secret.as_ref(), &credentials)
        && management.delete_user(&replaced).await?
    {
        user_changes.push(UserChange::DeleteUser(replaced));
    }

    let amqp_url = worker_user::amqp_url(&broker, &credentials, &desired_topology.vhost)?;
    let worker_secret = worker_user::desired_secret(pipeline, &credentials, &amqp_url)?;
    let mut repaired_objects = Vec::new();
    if apply_if_changed(&secrets, &worker_secret, live_secret.as_ref())
        .await
        .map_err(|e| Error::kube(format!("apply Secret {namespace}/{secret_name}"), e))?
        .is_some()
        && live_secret.is_some()
        && unchanged_spec(pipeline)
    {
        repaired_objects.push(format!("Secret {secret_name}"));
    }

    let provider_secret = match &pipeline.spec.worker.provider {
        Some(provider) => {
            let selector = &provider.url_secret_key_ref;
            let what = "the provider URL (smtp://, smtps://, file:// or discard://)";
            let secret = get_secret(client, &namespace, &selector.name, what).await?;
            required_key(&secret, &namespace, &selector.key, what)?;
            Some(secret)
        }
        None => None,
    };
    let mut read_by_workers = vec![&worker_secret];
    read_by_workers.extend(provider_secret.as_ref());
    let hash = secrets_hash(&read_by_workers);
    let inputs = WorkerInputs {
        default_image: &settings.worker_image,
        secrets_hash: &hash,
    };
    let mut desired = desired_deployment(pipeline, inputs)?;
    if let Some(live) = &live_deployment {
        keep_live_selector(&mut desired, live);
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let name = deployment_name(pipeline);
    let applied = apply_if_changed(&deployments, &desired, live_deployment.as_ref())
        .await
        .map_err(|e| Error::kube(format!("apply Deployment {namespace}/{name}"), e))?;
    if applied.is_some()
        && live_deployment
            .as_ref()
            .is_some_and(|live| pod_annotation(live, SECRETS_HASH_ANNOTATION) == Some(&hash))
        && unchanged_spec(pipeline)
    {
        repaired_objects.push(format!("Deployment {name}"));
    }

    let (autoscaling, keda_repaired) =
        autoscaling::converge(client, pipeline, &namespace, unchanged_spec(pipeline)).await?;
    repaired_objects.extend(keda_repaired);

    let queues = queue_depths(&management, pipeline).await;
    Ok(Converged {
        topology_changes,
        user_changes,
        repaired_objects,
        deployment: applied.or(live_deployment),
        autoscaling,
        queues,
        worker_user: credentials.username,
        rabbitmq_writes: management.writes(),
    })
}

async fn ensure_worker_user(
    management: &Management,
    pipeline: &MailerPipeline,
    credentials: &WorkerCredentials,
) -> Result<Vec<UserChange>, Error> {
    if !credentials.managed {
        return Ok(Vec::new());
    }
    let permissions = Permissions::for_worker(&pipeline.spec.topology);
    let grant = UserGrant {
        username: &credentials.username,
        password: &credentials.password,
        vhost: &pipeline.spec.rabbitmq.vhost,
        permissions: &permissions,
    };
    Ok(management.ensure_user(&grant).await?)
}

/// Whether the spec is the one the last status was written for, so a difference found
/// now was made by someone else (drift) rather than asked for.
pub fn unchanged_spec(pipeline: &MailerPipeline) -> bool {
    let observed = pipeline.status.as_ref().and_then(|s| s.observed_generation);
    observed.is_some() && observed == pipeline.metadata.generation
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

/// The depths of the send, retry and dead queues; `None` when the broker could not be
/// asked (the reconcile does not fail for that: the topology was just applied).
async fn queue_depths(management: &Management, pipeline: &MailerPipeline) -> Option<QueueDepths> {
    let vhost = &pipeline.spec.rabbitmq.vhost;
    let topology = &pipeline.spec.topology;
    let depth = |queue: &str| {
        let queue = queue.to_string();
        async move {
            let found = management.queue_depth(vhost, &queue).await;
            found.map(|d| d.map(total))
        }
    };
    let read = futures::try_join!(
        depth(&topology.queue),
        depth(&topology.retry_queue),
        depth(&topology.dead_queue)
    );
    match read {
        Ok((send, retry, dead)) => Some(QueueDepths { send, retry, dead }),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the queue depths");
            None
        }
    }
}

/// RabbitMQ's `messages` already counts the unacknowledged ones.
fn total(depth: QueueDepth) -> i64 {
    i64::try_from(depth.messages).unwrap_or(i64::MAX)
}
