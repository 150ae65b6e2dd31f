//! Phase 1 of a reconcile: read everything the pipeline references (its broker, and the
//! broker's version through the management API; the Secrets it names; what it owns)
//! before anything is written, so a missing Secret or an unreachable broker fails the
//! reconcile with no write made.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::{Client, ResourceExt};

use super::connection::{self, Broker, get_secret};
use super::error::Error;
use super::owned::OwnedCaches;
use super::references::{SecretRole, secrets_read};
use super::worker_user;
use crate::spec::MailerPipeline;
use crate::topology::{BrokerCapabilities, Clients, Management};

/// How long the broker's version (what it supports) read by one reconcile serves the
/// others of the same broker endpoint: a broker upgraded from 3.x to 4.x gets the 4.x
/// topology within a minute.
pub const CAPABILITIES_MAX_AGE: Duration = Duration::from_secs(60);

/// The broker a pipeline uses, a client of its management API and what it supports.
pub struct ResolvedBroker {
    pub broker: Broker,
    /// The client the process shares for this endpoint (one pool of connections and one
    /// bound on requests in flight per broker, whatever the number of pipelines).
    pub management: Arc<Management>,
    pub capabilities: BrokerCapabilities,
}

/// Everything a pipeline references, as read now.
pub struct Resolved {
    /// `None` when the spec names no broker (the validate phase says so).
    pub broker: Option<ResolvedBroker>,
    /// The Secrets the spec names for the workers, by role (`Provider`, `ProviderCa`,
    /// `WorkerUser`).
    secrets: BTreeMap<SecretRole, Secret>,
    /// The Secret the pipeline owns with the workers' user and URL, as it is now.
    pub worker_secret: Option<Secret>,
    /// The worker Deployment as it is now.
    pub deployment: Option<Deployment>,
}

impl Resolved {
    /// The Secret read for `role`, if the spec names one.
    pub fn secret(&self, role: SecretRole) -> Option<&Secret> {
        self.secrets.get(&role)
    }
}

/// Reads what `pipeline` references; `deployment` is its worker Deployment, read before.
pub async fn resolve(
    client: &Client,
    brokers: &Clients,
    owned: &OwnedCaches,
    pipeline: &MailerPipeline,
    deployment: Option<Deployment>,
) -> Result<Resolved, Error> {
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let rabbitmq = &pipeline.spec.rabbitmq;
    let broker = if rabbitmq.connection_secret.is_some() || rabbitmq.cluster_ref.is_some() {
        let broker = connection::resolve(client, pipeline).await?;
        let management = brokers.get(&broker.endpoint)?;
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
    let secret_name = worker_user::secret_name(pipeline);
    let worker_secret = owned.read(client, &namespace, &secret_name).await?;
    Ok(Resolved {
        broker,
        secrets,
        worker_secret,
        deployment,
    })
}
