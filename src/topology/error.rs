//! Why the topology could not be read, applied or deleted, in a bounded category.

use super::diff::Conflict;
use crate::spec::InvalidSpec;

/// Why the topology could not be read, applied or deleted.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TopologyError {
    #[error(transparent)]
    InvalidSpec(#[from] InvalidSpec),
    #[error("{0}")]
    BadEndpoint(String),
    #[error(
        "cannot reach the RabbitMQ management API at {endpoint}: {reason}; check that the broker is running with the management plugin enabled (rabbitmq-plugins enable rabbitmq_management) and that the URL is right"
    )]
    Unreachable { endpoint: String, reason: String },
    #[error(
        "the RabbitMQ management API at {endpoint} refused user {user:?} (401 Unauthorized): check the user name and password"
    )]
    Unauthorized { endpoint: String, user: String },
    #[error(
        "user {user:?} may not {action} through the management API at {endpoint} (403 Forbidden): give it the administrator tag (the operator needs it to write its owner markers; mailer topology alone can do with the policymaker tag and configure permissions on the vhost)"
    )]
    Forbidden {
        endpoint: String,
        user: String,
        action: String,
    },
    #[error("RabbitMQ refused to {action} ({status}): {reason}")]
    Refused {
        action: String,
        status: u16,
        reason: String,
    },
    #[error("vhost {vhost:?} already holds objects the pipeline cannot use, and nothing was changed: {}", .conflicts.iter().map(ToString::to_string).collect::<Vec<_>>().join(" | "))]
    Conflict {
        vhost: String,
        conflicts: Vec<Conflict>,
    },
}

impl TopologyError {
    /// A bounded name for the kind of error, for metric labels and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "invalid-spec",
            Self::BadEndpoint(_) => "bad-endpoint",
            Self::Unreachable { .. } => "unreachable",
            Self::Unauthorized { .. } => "unauthorized",
            Self::Forbidden { .. } => "forbidden",
            Self::Refused { .. } => "refused",
            Self::Conflict { .. } => "conflict",
        }
    }

    /// Whether trying again later, with the same spec, may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. }
                | Self::Refused {
                    status: 0 | 500..,
                    ..
                }
        )
    }
}
