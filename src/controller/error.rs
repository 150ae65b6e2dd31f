//! Why a reconcile failed, in words a user can act on and in a bounded category for
//! metric labels and event reasons.

use crate::spec::InvalidSpec;
use crate::topology::TopologyError;
use crate::topology::claims::ClaimError;

/// What a refused pipeline can do to have names of its own.
const OWN_NAMES: &str = "Give this pipeline names of its own (spec.topology: exchange, retryExchange, deadExchange, queue, retryQueue, deadQueue, e.g. prefixed with its name), or another spec.rabbitmq.vhost";

/// Why a reconcile of a pipeline failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidSpec(#[from] InvalidSpec),
    #[error("Secret {namespace}/{name} does not exist; create it with {wanted}")]
    MissingSecret {
        namespace: String,
        name: String,
        /// What the Secret should hold, e.g. "the keys uri, username and password".
        wanted: String,
    },
    #[error("Secret {namespace}/{name} has no key {key:?}; add {what} under that key")]
    MissingSecretKey {
        namespace: String,
        name: String,
        key: String,
        /// What the key should hold, e.g. "the provider URL".
        what: String,
    },
    #[error("Secret {namespace}/{name}, key {key:?}: {problem}")]
    InvalidSecretValue {
        namespace: String,
        name: String,
        key: String,
        /// What is wrong with the value and what to put there instead.
        problem: String,
    },
    #[error("RabbitmqCluster {namespace}/{name}: {problem}")]
    Cluster {
        namespace: String,
        name: String,
        problem: String,
    },
    #[error(
        "RabbitmqCluster {cluster_namespace}/{cluster} does not allow pipelines of namespace {namespace}; its owner may add {namespace} (or *) to its annotation rabbitmq.com/topology-allowed-namespaces (comma-separated), or use a cluster in namespace {namespace}"
    )]
    NotAllowed {
        cluster_namespace: String,
        cluster: String,
        /// The pipeline's namespace.
        namespace: String,
    },
    #[error(
        "{kind} {namespace}/{name} exists and is not this pipeline's ({}); the operator never takes over an object it does not control: rename or remove that {kind}, or rename the pipeline",
        .controller.as_deref().map_or_else(|| "it has no controller".to_string(), |c| format!("its controller is {c}"))
    )]
    NotOurs {
        kind: String,
        namespace: String,
        name: String,
        /// `Kind name` of its controller, if it has one.
        controller: Option<String>,
    },
    #[error(
        "{what} in RabbitMQ belongs to {owner}; nothing was changed. {own}, or delete the other pipeline", own = OWN_NAMES
    )]
    Owned {
        /// What is owned, e.g. `queue "mail.send" in vhost "shop"`.
        what: String,
        /// The owner, as its marker names it.
        owner: String,
    },
    #[error(
        "{what} exists in RabbitMQ and no pipeline's owner marker names it (it was made by hand, by mailer topology apply, or by someone else); the operator never takes over what it did not make, and nothing was changed. {own}; or have the broker's administrator remove it", own = OWN_NAMES
    )]
    Unclaimed {
        /// What exists, e.g. `exchange "mail" in vhost "shop"`.
        what: String,
    },
    #[error(
        "MailerPipeline {other} is older and also wants {what} on the same broker ({broker}); nothing was changed. {own}, or delete one of them", own = OWN_NAMES
    )]
    Collision {
        /// `namespace/name` of the older pipeline.
        other: String,
        broker: String,
        /// What both want, e.g. `queue "mail.send" in vhost "shop"`.
        what: String,
    },
    #[error(
        "queue {queue:?} in vhost {vhost:?} holds {messages} messages, and the spec no longer names it (spec.topology or spec.rabbitmq.vhost changed): no worker would ever take them, so nothing was changed. Set the name back; or move the mail first: make a second pipeline with the new names, switch the producers to it, and change or delete this one once the queue is empty"
    )]
    QueueNotEmpty {
        vhost: String,
        queue: String,
        messages: u64,
    },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("the Kubernetes API failed to {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("the MailerPipeline has no {0}")]
    IncompleteObject(&'static str),
    /// The object does not deserialize into this operator's MailerPipeline (a field it
    /// does not know, a value of another type): a CRD newer than the operator.
    #[error(
        "the operator cannot read this MailerPipeline ({0}); upgrade the operator to the version of the CRD, or fix the field named"
    )]
    Unreadable(String),
}

/// Every category an [`Error`] can have, e.g. to describe the metric label's values.
pub const CATEGORIES: &[&str] = &[
    "invalid-spec",
    "missing-secret",
    "missing-secret-key",
    "invalid-secret-value",
    "cluster",
    "not-allowed",
    "bad-endpoint",
    "unreachable",
    "unauthorized",
    "forbidden",
    "refused",
    "conflict",
    "queue-not-empty",
    "kube-api",
    "incomplete-object",
    "unreadable",
];

impl Error {
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source,
        }
    }

    /// A bounded name for the kind of error: one of [`CATEGORIES`].
    pub fn category(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "invalid-spec",
            Self::MissingSecret { .. } => "missing-secret",
            Self::MissingSecretKey { .. } => "missing-secret-key",
            Self::InvalidSecretValue { .. } => "invalid-secret-value",
            Self::Cluster { .. } => "cluster",
            Self::NotAllowed { .. } => "not-allowed",
            Self::NotOurs { .. }
            | Self::Owned { .. }
            | Self::Unclaimed { .. }
            | Self::Collision { .. } => "conflict",
            Self::QueueNotEmpty { .. } => "queue-not-empty",
            Self::Topology(TopologyError::InvalidSpec(_)) => "invalid-spec",
            Self::Topology(e) => e.category(),
            Self::Kube { .. } => "kube-api",
            Self::IncompleteObject(_) => "incomplete-object",
            Self::Unreadable(_) => "unreadable",
        }
    }

    /// What the pipeline's status and events say: the error's text, except that what a
    /// broker answered is never copied there. A management API's error body is the
    /// broker's text (it may quote objects of other tenants, or anything a proxy in
    /// front of it returns); it stays in the operator's log, which logs every failure.
    pub fn public_message(&self) -> String {
        match self {
            Self::Topology(TopologyError::Refused { action, status, .. }) => {
                let status = match status {
                    0 => "no HTTP answer".to_string(),
                    code => format!("HTTP {code}"),
                };
                format!(
                    "RabbitMQ refused to {action} ({status}); the operator's log (kubectl logs of the mailer-operator pod) has the broker's answer"
                )
            }
            other => other.to_string(),
        }
    }

    /// The category in the PascalCase Kubernetes uses for event and condition reasons,
    /// e.g. `MissingSecretKey`.
    pub fn reason(&self) -> String {
        pascal_case(self.category())
    }

    /// Whether trying again soon, with nothing changed, may succeed. Other errors wait
    /// for a change of the pipeline or of a Secret it names (both are watched), or for
    /// the periodic resync.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Topology(e) => e.is_transient(),
            Self::Kube { source, .. } => match source {
                kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..),
                _ => true,
            },
            // The cluster-operator may still be creating the cluster's Secret or Service.
            Self::Cluster { .. } => true,
            // The workers, still on the names before, may empty the queue.
            Self::QueueNotEmpty { .. } => true,
            Self::InvalidSpec(_)
            | Self::MissingSecret { .. }
            | Self::MissingSecretKey { .. }
            | Self::InvalidSecretValue { .. }
            | Self::NotAllowed { .. }
            | Self::NotOurs { .. }
            | Self::Owned { .. }
            | Self::Unclaimed { .. }
            | Self::Collision { .. }
            | Self::IncompleteObject(_)
            | Self::Unreadable(_) => false,
        }
    }
}

/// `missing-secret-key` as `MissingSecretKey`.
pub fn pascal_case(kebab: &str) -> String {
    kebab
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect(),
                None => String::new(),
            }
        })
        .collect()
}

impl From<ClaimError> for Error {
    fn from(error: ClaimError) -> Self {
        match error {
            ClaimError::Owned { what, owner } => Self::Owned { what, owner },
            ClaimError::Unclaimed { what } => Self::Unclaimed { what },
            ClaimError::Broker(e) => Self::Topology(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_bounded_and_read_as_reasons() {
        let missing = Error::MissingSecretKey {
            namespace: "shop".into(),
            name: "smtp".into(),
            key: "url".into(),
            what: "the provider URL".into(),
        };
        assert!(CATEGORIES.contains(&missing.category()));
        assert_eq!(missing.reason(), "MissingSecretKey");
        assert_eq!(
            missing.to_string(),
            "Secret shop/smtp has no key \"url\"; add the provider URL under that key"
        );
        assert!(!missing.is_transient());
        let unreachable = Error::from(TopologyError::Unreachable {
            endpoint: "http://u:***@h:15672/api".into(),
            reason: "refused".into(),
        });
        assert!(CATEGORIES.contains(&unreachable.category()));
        assert!(unreachable.is_transient());
        let conflict = Error::from(TopologyError::Conflict {
            vhost: "v".into(),
            conflicts: vec![],
        });
        assert_eq!(conflict.reason(), "Conflict");
        assert!(!conflict.is_transient());
    }

    #[test]
    fn what_a_broker_answered_stays_out_of_the_public_message() {
        let refused = Error::from(TopologyError::Refused {
            action: "declare queue \"mail.send\"".into(),
            status: 400,
            reason: "<html>tenant-b secrets</html>".into(),
        });
        let message = refused.public_message();
        assert!(!message.contains("tenant-b"), "{message}");
        assert!(message.contains("declare queue") && message.contains("HTTP 400"));
        assert!(refused.to_string().contains("tenant-b"), "the log keeps it");
        let missing = Error::IncompleteObject("namespace");
        assert_eq!(missing.public_message(), missing.to_string());
    }
}
