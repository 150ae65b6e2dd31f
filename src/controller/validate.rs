//! Phase 2 of a reconcile: check the spec and what the resolve phase read, once, into a
//! [`Validated`] pipeline; the later phases take that and check nothing again.

use kube::ResourceExt;

use super::connection::required_key;
use super::error::Error;
use super::references::SecretRole;
use super::resolve::{Resolved, ResolvedBroker};
use super::ssa::ensure_ours;
use super::worker_user::{self, PASSWORD_KEY, USERNAME_KEY, WorkerCredentials};
use crate::spec::{MailerPipeline, MailerPipelineSpec};

/// What a PEM certificate begins with.
const PEM_CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";

/// A pipeline whose spec and referenced Secrets passed every check.
pub struct Validated<'a> {
    pub pipeline: &'a MailerPipeline,
    pub namespace: String,
    pub name: String,
    pub spec: &'a MailerPipelineSpec,
    pub broker: &'a ResolvedBroker,
    /// The user the workers connect as: the operator's own (its password kept from its
    /// Secret, or new) or the one `spec.worker.userSecret` names.
    pub credentials: WorkerCredentials,
}

/// Checks `pipeline` and what was resolved for it.
pub fn validate<'a>(
    pipeline: &'a MailerPipeline,
    resolved: &'a Resolved,
    cluster: &str,
) -> Result<Validated<'a>, Error> {
    let spec = &pipeline.spec;
    spec.validate_for_operator()?;
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    if pipeline.uid().is_none() {
        return Err(Error::IncompleteObject("metadata.uid"));
    }
    // What the operator would make must be its own before anything is written.
    ensure_ours("Deployment", resolved.deployment.as_ref(), pipeline)?;
    ensure_ours("Secret", resolved.worker_secret.as_ref(), pipeline)?;
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
    let credentials = match resolved.secret(SecretRole::WorkerUser) {
        Some(secret) => {
            let wanted = SecretRole::WorkerUser.wanted();
            WorkerCredentials {
                username: required_key(secret, &namespace, USERNAME_KEY, wanted)?,
                password: required_key(secret, &namespace, PASSWORD_KEY, wanted)?,
                managed: false,
            }
        }
        None => worker_user::managed_credentials(
            cluster,
            pipeline,
            resolved.worker_secret.as_ref(),
            worker_user::generate_password,
        ),
    };
    Ok(Validated {
        pipeline,
        name: pipeline.name_any(),
        namespace,
        spec,
        broker,
        credentials,
    })
}
