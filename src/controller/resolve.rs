//! Phase 1 of a reconcile: read everything the pipeline references (its broker, and the
//! broker's version through the management API; the Secrets it names; what it owns)
//! before anything is written, so a missing Secret or an unreachable broker fails the
//! reconcile with no write made.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::connection::{self, Broker, get_secret};
use super::error::Error;
use super::references::{SecretRole, secrets_read};
use super::worker_user;
use crate::spec::MailerPipeline;
use crate::topology::{BrokerCapabilities, Management};

/// The broker a pipeline uses, a client of its management API and what it supports.
pub struct ResolvedBroker {
    pub broker: Broker,
    pub management: Management,
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
    pipeline: &MailerPipeline,
    deployment: Option<Deployment>,
) -> Result<Resolved, Error> {
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let rabbitmq = &pipeline.spec.rabbitmq;
    let broker = if rabbitmq.connection_secret.is_some() || rabbitmq.cluster_ref.is_some() {
        let broker = connection::resolve(client, pipeline).await?;
        let management = Management::new(&broker.endpoint)?;
        let capabilities = management.capabilities().await?;
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
    let worker_secret = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get_opt(&secret_name)
        .await
        .map_err(|e| Error::kube(format!("read Secret {namespace}/{secret_name}"), e))?;
    Ok(Resolved {
        broker,
        secrets,
        worker_secret,
        deployment,
    })
}
