//! Step 2 of a reconcile: check the spec and what the resolve step read, once, into a
//! [`Validated`] pipeline; the later steps take that and check nothing again. A pure
//! function: it reads and writes nothing, and generates nothing either.

use kube::ResourceExt;

use crate::controller::broker::secrets::SecretRole;
use crate::controller::error::Error;
use crate::controller::key::PipelineKey;
use crate::controller::kube::secrets::required_key;
use crate::controller::kube::ssa::ensure_ours;
use crate::controller::objects::worker_secret::{self, PASSWORD_KEY, USERNAME_KEY, WorkerUser};
use crate::controller::reconcile::resolve::{Resolved, ResolvedBroker};
use crate::spec::{MailerPipeline, MailerPipelineSpec};

/// What a PEM certificate begins with.
const PEM_CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";

/// A pipeline whose spec and referenced Secrets passed every check.
pub struct Validated<'a> {
    pub pipeline: &'a MailerPipeline,
    pub key: &'a PipelineKey,
    pub spec: &'a MailerPipelineSpec,
    pub broker: &'a ResolvedBroker,
    /// The user the workers connect as: the operator's own (with the password its
    /// Secret keeps, if any) or the one `spec.worker.userSecret` names.
    pub user: WorkerUser,
}

/// Checks `pipeline` and what was resolved for it.
pub fn validate<'a>(
    pipeline: &'a MailerPipeline,
    key: &'a PipelineKey,
    resolved: &'a Resolved,
    cluster: &str,
) -> Result<Validated<'a>, Error> {
    let spec = &pipeline.spec;
    spec.validate_for_operator()?;
    let namespace = key.namespace.clone();
    if pipeline.uid().is_none() {
        return Err(Error::IncompleteObject("metadata.uid"));
    }
    // What the operator would make must be its own before anything is written.
    ensure_ours("Deployment", resolved.owned.deployment.as_ref(), pipeline)?;
    ensure_ours("Secret", resolved.owned.worker_secret.as_ref(), pipeline)?;
    let broker = resolved
        .broker
        .as_ref()
        .ok_or(Error::IncompleteObject("spec.rabbitmq"))?;
    if let (Some(provider), Some(secret)) =
        (&spec.worker.provider, resolved.secret(SecretRole::Provider))
    {
        let key = &provider.url_secret_key_ref.key;
        required_key(secret, &namespace, key, SecretRole::Provider.wanted())?;
    }
    let ca = spec
        .worker
        .provider
        .as_ref()
        .and_then(|p| p.ca_secret_key_ref.as_ref());
    if let (Some(ca), Some(secret)) = (ca, resolved.secret(SecretRole::ProviderCa)) {
        let pem = required_key(secret, &namespace, &ca.key, SecretRole::ProviderCa.wanted())?;
        if !pem.contains(PEM_CERTIFICATE) {
            return Err(Error::InvalidSecretValue {
                namespace,
                name: ca.name.clone(),
                key: ca.key.clone(),
                problem: format!(
                    "it holds no PEM certificate ({PEM_CERTIFICATE}); put the CA certificate the provider's certificate chains to there"
                ),
            });
        }
    }
    let user = match resolved.secret(SecretRole::WorkerUser) {
        Some(secret) => {
            let wanted = SecretRole::WorkerUser.wanted();
            WorkerUser {
                username: required_key(secret, &namespace, USERNAME_KEY, wanted)?,
                password: Some(required_key(secret, &namespace, PASSWORD_KEY, wanted)?),
                managed: false,
            }
        }
        None => {
            worker_secret::managed_user(cluster, pipeline, resolved.owned.worker_secret.as_ref())
        }
    };
    Ok(Validated {
        pipeline,
        key,
        spec,
        broker,
        user,
    })
}
