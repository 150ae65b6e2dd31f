//! What the worker is configured with beside its queue's names: how long each step may
//! take, and the broker user of its URL. Its flags and environment are
//! [`crate::cli::worker`]'s.

use std::time::Duration;

use crate::amqp::publish::confirm_deadline;

/// How long a worker without a broker goes on connecting again by default: longer than a
/// rolling restart of a cluster's nodes takes, so such a restart costs no worker restart.
pub const DEFAULT_RECONNECT_TIMEOUT: Duration = Duration::from_secs(300);

/// How long each step of the worker may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One attempt to connect to the broker.
    pub connect: Duration,
    /// A publish's confirm (plus an allowance for its size:
    /// [`crate::amqp::publish::confirm_deadline`]), a cancel, a close.
    pub publish: Duration,
    /// One send, the whole SMTP transaction; not the wait for a free connection.
    pub send: Duration,
    /// Waiting for deliveries in flight when stopping.
    pub shutdown: Duration,
    /// How long the worker goes on connecting again without a broker, after a loss,
    /// before it exits.
    pub reconnect: Duration,
}

impl Timeouts {
    /// The longest one delivery can take when nothing hangs: its send, after waiting for
    /// `turns - 1` sends ahead of it (the deliveries a worker holds beyond the sends its
    /// provider makes at once), its park or dead-letter publish of up to `largest_body`
    /// bytes, its ack, and some slack. A delivery in flight for longer means the worker is
    /// stuck, and `/livez` says so.
    pub fn longest_delivery(&self, turns: u32, largest_body: usize) -> Duration {
        self.send.saturating_mul(turns.max(1))
            + confirm_deadline(self.publish, largest_body)
            + self.publish
            + Duration::from_secs(10)
    }
}

/// How many sends in a row a delivery may wait through, its own included: `prefetch`
/// deliveries shared by a provider that makes `concurrency` sends at once (all at once
/// when it sets no bound).
pub fn send_turns(prefetch: u16, concurrency: Option<std::num::NonZeroUsize>) -> u32 {
    let at_once = concurrency.map_or(usize::from(prefetch), std::num::NonZeroUsize::get);
    let turns = usize::from(prefetch.max(1)).div_ceil(at_once);
    u32::try_from(turns).unwrap_or(u32::MAX)
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
    #[error("MAIL_RETRY_KEYS: {0}")]
    RetryKeys(String),
}

/// The routing key of each delay tier, in tier order: `given` (`MAIL_RETRY_KEYS`), or the
/// one tier of a pipeline without tiers, routed by `send_key`.
pub fn retry_keys(send_key: &str, given: Option<Vec<String>>) -> Result<Vec<String>, ConfigError> {
    let Some(keys) = given else {
        return Ok(vec![send_key.to_string()]);
    };
    if keys.is_empty() || keys.len() > crate::mail::MAX_RETRY_TIERS {
        return Err(ConfigError::RetryKeys(format!(
            "{} routing keys; give one per delay tier, 1 to {}",
            keys.len(),
            crate::mail::MAX_RETRY_TIERS
        )));
    }
    if keys.iter().any(String::is_empty) {
        return Err(ConfigError::RetryKeys(
            "an empty routing key; give one per delay tier, separated by commas".into(),
        ));
    }
    Ok(keys)
}

/// The broker user of an AMQP URL (`guest` when it names none), or which value is wrong.
pub fn amqp_user(amqp_url: &str) -> Result<String, ConfigError> {
    crate::amqp::address::amqp_user(amqp_url).map_err(ConfigError::AmqpUrl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_may_wait_for_the_sends_ahead_of_it_on_the_providers_connections() {
        let four = std::num::NonZeroUsize::new(4);
        assert_eq!(send_turns(16, four), 4);
        assert_eq!(send_turns(17, four), 5);
        assert_eq!(send_turns(2, four), 1);
        assert_eq!(send_turns(16, None), 1);
        let timeouts = Timeouts::default();
        assert_eq!(
            timeouts.longest_delivery(4, 1000),
            Duration::from_secs(4 * 60 + 2 * 30 + 10)
        );
        assert_eq!(
            timeouts.longest_delivery(0, 1000),
            timeouts.longest_delivery(1, 1000)
        );
        assert_eq!(
            timeouts.longest_delivery(1, 25 << 20),
            Duration::from_secs(60 + 2 * 30 + 25 + 10),
            "the publish of a 25 MiB request may take 25s more"
        );
    }

    #[test]
    fn retry_keys_default_to_the_one_tier_of_the_send_key() {
        assert_eq!(retry_keys("shop.send", None).unwrap(), ["shop.send"]);
        let four: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        assert_eq!(retry_keys("x", Some(four.clone())).unwrap(), four);
        for bad in [vec![], vec![String::new()], vec!["k".to_string(); 11]] {
            let e = retry_keys("x", Some(bad)).unwrap_err().to_string();
            assert!(e.starts_with("MAIL_RETRY_KEYS: "), "{e}");
        }
    }

    #[test]
    fn bad_urls_are_named_without_their_password() {
        for url in ["http://u:hunter2@h", "nonsense", "amqp://u:hunter2@"] {
            let e = amqp_user(url).unwrap_err().to_string();
            assert!(e.starts_with("MAIL_AMQP_URL: "), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
