//! Step 1 of a reconcile: read what the pipeline owns (its worker Deployment and Secret,
//! from the watch caches) and everything it references (its broker, and the broker's
//! version through the management API; the Secrets it names; KEDA's objects of its
//! name) before anything is written, so a missing Secret or an unreachable broker fails
//! the reconcile with no write made.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};

use crate::controller::broker::connection::{self, Broker};
use crate::controller::broker::secrets::{SecretRole, secrets_read};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::key::PipelineKey;
use crate::controller::kube::keda::apis;
use crate::controller::kube::secrets::get_secret;
use crate::controller::kube::ssa::ensure_ours;
use crate::controller::objects::deployment::deployment_name;
use crate::controller::objects::worker_secret;
use crate::spec::MailerPipeline;
use crate::topology::{BrokerCapabilities, Management};

/// How long the broker's version (what it supports) read by one reconcile serves the
/// others of the same broker endpoint: a broker upgraded from 3.x to 4.x gets the 4.x
/// topology within a minute.
pub const CAPABILITIES_MAX_AGE: Duration = Duration::from_secs(60);

/// What the pipeline owns, as it is now: read first, so the status shows its workers
/// even when a later step fails.
#[derive(Clone, Default)]
pub struct Owned {
    /// The worker Deployment.
    pub deployment: Option<Deployment>,
    /// The Secret with the workers' user and URL.
    pub worker_secret: Option<Secret>,
}

/// The broker a pipeline uses, a client of its management API and what it supports.
pub struct ResolvedBroker {
    pub broker: Broker,
    /// The client the process shares for this endpoint (one pool of connections and one
    /// bound on requests in flight per broker, whatever the number of pipelines).
    pub management: Arc<Management>,
    pub capabilities: BrokerCapabilities,
}

/// KEDA's side of a pipeline as read before anything is written.
#[derive(Debug, Default)]
pub struct LiveKeda {
    pub installed: bool,
    pub authentication: Option<DynamicObject>,
    pub scaled_object: Option<DynamicObject>,
}

/// Everything a pipeline owns and references, as read now.
pub struct Resolved {
    pub owned: Owned,
    /// `None` when the spec names no broker (the validate step says so).
    pub broker: Option<ResolvedBroker>,
    /// The Secrets the spec names for the workers, by role (`Provider`, `ProviderCa`,
    /// `WorkerUser`).
    secrets: BTreeMap<SecretRole, Secret>,
    pub keda: LiveKeda,
}

impl Resolved {
    /// The Secret read for `role`, if the spec names one.
    pub fn secret(&self, role: SecretRole) -> Option<&Secret> {
        self.secrets.get(&role)
    }
}

/// Reads what the pipeline of `key` owns.
pub async fn owned(
    ctx: &Context,
    pipeline: &MailerPipeline,
    key: &PipelineKey,
) -> Result<Owned, Error> {
    let client = &ctx.client;
    let namespace = &key.namespace;
    let deployment = ctx
        .owned
        .read(client, namespace, &deployment_name(pipeline))
        .await?;
    let worker_secret = ctx
        .owned
        .read(client, namespace, &worker_secret::secret_name(pipeline))
        .await?;
    Ok(Owned {
        deployment,
        worker_secret,
    })
}

/// Reads what `pipeline` references, beside what it owns.
pub async fn resolve(
    ctx: &Context,
    pipeline: &MailerPipeline,
    key: &PipelineKey,
    owned: Owned,
) -> Result<Resolved, Error> {
    let client = &ctx.client;
    let rabbitmq = &pipeline.spec.rabbitmq;
    let broker = if rabbitmq.connection_secret.is_some() || rabbitmq.cluster_ref.is_some() {
        let broker = connection::locate(client, pipeline).await?;
        let management = ctx.brokers.get(&broker.endpoint)?;
        let capabilities = management.capabilities_within(CAPABILITIES_MAX_AGE).await?;
        Some(ResolvedBroker {
            broker,
            management,
            capabilities,
        })
    } else {
        None
    };
    let mut secrets = BTreeMap::new();
    for read in secrets_read(pipeline) {
        // The broker's Secrets were read with it, above.
        if matches!(
            read.role,
            SecretRole::Provider | SecretRole::ProviderCa | SecretRole::WorkerUser
        ) {
            let secret =
                get_secret(client, &read.namespace, &read.name, read.role.wanted()).await?;
            secrets.insert(read.role, secret);
        }
    }
    let keda = keda(ctx, pipeline, key).await?;
    Ok(Resolved {
        owned,
        broker,
        secrets,
        keda,
    })
}

/// Whether KEDA is installed and the pipeline's KEDA objects; under autoscaling, one of
/// their names that another controls is a `Conflict` here, before any write.
async fn keda(
    ctx: &Context,
    pipeline: &MailerPipeline,
    key: &PipelineKey,
) -> Result<LiveKeda, Error> {
    let client = &ctx.client;
    if !ctx.keda.installed(client).await? {
        return Ok(LiveKeda::default());
    }
    let name = deployment_name(pipeline);
    let namespace = &key.namespace;
    let [(authentications, _), (scaled_objects, _)] = apis(client, namespace);
    let live = LiveKeda {
        installed: true,
        authentication: read(&authentications, "TriggerAuthentication", namespace, &name).await?,
        scaled_object: read(&scaled_objects, "ScaledObject", namespace, &name).await?,
    };
    if pipeline.spec.worker.autoscaling.is_some() {
        ensure_ours(
            "TriggerAuthentication",
            live.authentication.as_ref(),
            pipeline,
        )?;
        ensure_ours("ScaledObject", live.scaled_object.as_ref(), pipeline)?;
    }
    Ok(live)
}

async fn read(
    api: &Api<DynamicObject>,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<DynamicObject>, Error> {
    api.get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("read {kind} {namespace}/{name}"), e))
}
