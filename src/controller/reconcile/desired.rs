//! Step 3 of a reconcile: what the pipeline should have, as a pure function of the
//! validated pipeline: its RabbitMQ topology, what it claims there and its workers'
//! user and permissions, the worker Secret and the worker Deployment. Nothing is read or
//! written here; a new workers' password comes from the `generate` it is given.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;

use crate::controller::broker::secrets::SecretRole;
use crate::controller::context::Settings;
use crate::controller::error::Error;
use crate::controller::objects::deployment::{
    WorkerInputs, desired_deployment, keep_live_selector, secrets_hash,
};
use crate::controller::objects::worker_secret::{self, WorkerCredentials};
use crate::controller::reconcile::resolve::Resolved;
use crate::controller::reconcile::validate::Validated;
use crate::topology::ownership::{Claim, topology_claims};
use crate::topology::{Permissions, Topology};

/// Everything the apply phase brings about.
pub struct Desired {
    pub topology: Topology,
    /// The user the workers connect as, with its password.
    pub credentials: WorkerCredentials,
    /// The workers' permissions on the vhost, when the operator manages their user.
    pub permissions: Option<Permissions>,
    pub worker_secret: Secret,
    /// The hash of the Secrets the workers read, on the Deployment's pod template.
    pub secrets_hash: String,
    pub deployment: Deployment,
    /// What the pipeline claims in the broker: its topology's exchanges and queues, and
    /// the workers' user when the operator makes it.
    pub claims: BTreeSet<Claim>,
}

pub fn desired(
    valid: &Validated<'_>,
    resolved: &Resolved,
    settings: &Settings,
    generate: impl FnOnce() -> String,
) -> Result<Desired, Error> {
    let spec = valid.spec;
    let topology = Topology::desired(
        &spec.rabbitmq.vhost,
        &spec.topology,
        valid.broker.capabilities,
    )?;
    let credentials = valid.user.credentials(generate);
    let amqp_url =
        worker_secret::amqp_url(&valid.broker.broker.amqp, &credentials, &topology.vhost);
    let worker_secret = worker_secret::desired_secret(valid.pipeline, &credentials, &amqp_url)?;
    let mut read_by_workers = vec![&worker_secret];
    read_by_workers.extend(resolved.secret(SecretRole::Provider));
    read_by_workers.extend(resolved.secret(SecretRole::ProviderCa));
    let hash = secrets_hash(&read_by_workers);
    let inputs = WorkerInputs {
        default_image: &settings.worker_image,
        secrets_hash: &hash,
    };
    let mut deployment = desired_deployment(valid.pipeline, inputs)?;
    if let Some(live) = &resolved.owned.deployment {
        keep_live_selector(&mut deployment, live);
    }
    let mut claims: BTreeSet<Claim> = topology_claims(&topology.vhost, &spec.topology)
        .into_iter()
        .collect();
    if credentials.managed {
        claims.insert(Claim::User {
            name: credentials.username.clone(),
        });
    }
    Ok(Desired {
        claims,
        permissions: credentials
            .managed
            .then(|| Permissions::for_worker(&spec.topology)),
        topology,
        worker_secret,
        secrets_hash: hash,
        deployment,
        credentials,
    })
}
