//! What the worker is configured with beside its queue's names: how long each step may
//! take, and the broker user of its URL. Its flags and environment are
//! [`crate::cli::worker`]'s.

use std::time::Duration;

/// How long a worker without a broker goes on connecting again by default: longer than a
/// rolling restart of a cluster's nodes takes, so such a restart costs no worker restart.
pub const DEFAULT_RECONNECT_TIMEOUT: Duration = Duration::from_secs(300);

/// How long each step of the worker may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One attempt to connect to the broker.
    pub connect: Duration,
    /// A publish's confirm, a cancel, a close.
    pub publish: Duration,
    /// One send, the whole SMTP transaction.
    pub send: Duration,
    /// Waiting for deliveries in flight when stopping.
    pub shutdown: Duration,
    /// How long the worker goes on connecting again without a broker, after a loss,
    /// before it exits.
    pub reconnect: Duration,
}

impl Timeouts {
    /// The longest one delivery can take when nothing hangs: its send, its park or
    /// dead-letter publish and its ack, and some slack. A delivery in flight for longer
    /// means the worker is stuck, and `/livez` says so.
    pub fn longest_delivery(&self) -> Duration {
        self.send + self.publish * 2 + Duration::from_secs(10)
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT,
            publish: crate::amqp::publish::DEFAULT_PUBLISH_TIMEOUT,
            send: Duration::from_secs(60),
            shutdown: Duration::from_secs(30),
            reconnect: DEFAULT_RECONNECT_TIMEOUT,
        }
    }
}

/// A value the worker cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("MAIL_AMQP_URL: {0}")]
    AmqpUrl(String),
    #[error("MAIL_PROVIDER_URL: {0}")]
    ProviderUrl(#[from] crate::provider::ProviderUrlError),
}

/// The broker user of an AMQP URL (`guest` when it names none), or which value is wrong.
pub fn amqp_user(amqp_url: &str) -> Result<String, ConfigError> {
    crate::amqp::address::amqp_user(amqp_url).map_err(ConfigError::AmqpUrl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_named_without_their_password() {
        for url in ["http://u:hunter2@h", "nonsense", "amqp://u:hunter2@"] {
            let e = amqp_user(url).unwrap_err().to_string();
            assert!(e.starts_with("MAIL_AMQP_URL: "), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
