//! The Secrets a pipeline reads, listed in one place: what the resolve phase reads,
//! what the watch maps a changed Secret back to, and what rolls the workers.

use kube::ResourceExt;

use crate::spec::MailerPipeline;

/// Why a pipeline reads a Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SecretRole {
    /// `spec.rabbitmq.connectionSecret`: the management API and the operator's user.
    Connection,
    /// The default user of the RabbitmqCluster `spec.rabbitmq.clusterRef` names, by the
    /// cluster-operator's naming convention (its status may name another).
    ClusterDefaultUser,
    /// `spec.worker.provider.urlSecretKeyRef`: the workers' provider URL.
    Provider,
    /// `spec.worker.userSecret`: the workers' own RabbitMQ user.
    WorkerUser,
    /// `spec.worker.provider.caSecretKeyRef`: a CA the workers trust for TLS to the
    /// provider.
    ProviderCa,
}

impl SecretRole {
    /// What a Secret in this role must hold, for the message when it does not exist.
    pub fn wanted(self) -> &'static str {
        match self {
            Self::Connection => {
                "the keys uri (the management API URL, e.g. http://rabbitmq:15672), username and password, and optionally amqpUri (e.g. amqp://rabbitmq:5672)"
            }
            Self::ClusterDefaultUser => {
                "the cluster's default user (the cluster-operator creates it)"
            }
            Self::Provider => "the provider URL (smtp://, smtps://, file:// or discard://)",
            Self::WorkerUser => "the keys username and password of the workers' RabbitMQ user",
            Self::ProviderCa => {
                "the CA certificate (PEM, -----BEGIN CERTIFICATE-----) the provider's certificate chains to"
            }
        }
    }
}

/// A Secret a pipeline reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRead {
    pub namespace: String,
    pub name: String,
    pub role: SecretRole,
}

/// The cluster-operator's name for a RabbitmqCluster's default-user Secret.
pub fn default_user_secret(cluster: &str) -> String {
    format!("{cluster}-default-user")
}

/// Every Secret `pipeline` reads (its own worker Secret aside, which it writes).
pub fn secrets_read(pipeline: &MailerPipeline) -> Vec<SecretRead> {
    let own = pipeline.namespace().unwrap_or_default();
    let spec = &pipeline.spec;
    let read = |namespace: &str, name: &str, role| SecretRead {
        namespace: namespace.to_string(),
        name: name.to_string(),
        role,
    };
    let mut reads = Vec::new();
    if let Some(secret) = &spec.rabbitmq.connection_secret {
        reads.push(read(&own, &secret.name, SecretRole::Connection));
    }
    if let Some(cluster) = &spec.rabbitmq.cluster_ref {
        let namespace = cluster.namespace_or(&own);
        let name = default_user_secret(&cluster.name);
        reads.push(read(namespace, &name, SecretRole::ClusterDefaultUser));
    }
    if let Some(provider) = &spec.worker.provider {
        let name = &provider.url_secret_key_ref.name;
        reads.push(read(&own, name, SecretRole::Provider));
        if let Some(ca) = &provider.ca_secret_key_ref {
            reads.push(read(&own, &ca.name, SecretRole::ProviderCa));
        }
    }
    if let Some(user) = &spec.worker.user_secret {
        reads.push(read(&own, &user.name, SecretRole::WorkerUser));
    }
    reads
}

/// Whether `pipeline` reads the Secret `namespace/name`.
pub fn reads_secret(pipeline: &MailerPipeline, namespace: &str, name: &str) -> bool {
    secrets_read(pipeline)
        .iter()
        .any(|read| read.namespace == namespace && read.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::controller::fixtures::pipeline;

    #[test]
    fn a_pipeline_reads_the_secrets_it_names() {
        let p = pipeline(
            "rabbitmq: {connectionSecret: {name: conn}}\n\
             worker: {provider: {urlSecretKeyRef: {name: smtp, key: url}}, userSecret: {name: user}}",
        );
        let roles: Vec<_> = secrets_read(&p)
            .iter()
            .map(|r| (r.name.clone(), r.role))
            .collect();
        assert_eq!(
            roles,
            [
                ("conn".to_string(), SecretRole::Connection),
                ("smtp".to_string(), SecretRole::Provider),
                ("user".to_string(), SecretRole::WorkerUser)
            ]
        );
        assert!(!reads_secret(&p, "other", "conn"));
        assert!(!reads_secret(&p, "prod", "unrelated"));
        let c = pipeline("rabbitmq: {clusterRef: {name: rmq, namespace: data}}");
        assert!(reads_secret(&c, "data", "rmq-default-user"));
        assert!(!reads_secret(&c, "prod", "rmq-default-user"));
    }
}
