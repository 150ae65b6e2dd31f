//! What the worker is configured with beside its queue's names: how long each step may
//! take, and the broker user of its URL. Its flags and environment are
//! [`crate::cli::worker`]'s.

use std::time::Duration;

use crate::amqp::publish::confirm_deadline;
use crate::mail::{retry_tier_of, retry_tier_waiting};

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
    #[error("MAIL_RETRY_DELAYS: {0}")]
    RetryDelays(String),
}

/// The delay tiers a worker parks requests in: each tier's routing key on the retry
/// exchange and, when known, its delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryTiers {
    /// In tier order; never empty.
    keys: Vec<String>,
    /// In tier order, as many as `keys`; or empty when not known, and then a provider's
    /// `Retry-After` chooses no tier.
    delays: Vec<Duration>,
}

impl RetryTiers {
    /// The one tier of a pipeline without tiers, routed by `send_key`.
    pub fn one(send_key: &str) -> Self {
        Self {
            keys: vec![send_key.to_string()],
            delays: Vec::new(),
        }
    }

    /// The tiers of a pipeline's topology, with their delays.
    pub fn of_topology(
        topology: &crate::spec::TopologySpec,
    ) -> Result<Self, crate::spec::FieldError> {
        Ok(Self {
            keys: topology.retry_tier_keys(),
            delays: topology.retry_delays()?,
        })
    }

    /// The tiers of `keys` (`MAIL_RETRY_KEYS`) and `delays` (`MAIL_RETRY_DELAYS`), or
    /// [`one`](Self::one) of `send_key` without keys.
    pub fn new(
        send_key: &str,
        keys: Option<Vec<String>>,
        delays: Option<Vec<Duration>>,
    ) -> Result<Self, ConfigError> {
        let Some(keys) = keys else {
            return match delays {
                Some(_) => Err(ConfigError::RetryDelays(
                    "given without MAIL_RETRY_KEYS; give both, one per delay tier".into(),
                )),
                None => Ok(Self::one(send_key)),
            };
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
        let delays = delays.unwrap_or_default();
        if !delays.is_empty() && delays.len() != keys.len() {
            return Err(ConfigError::RetryDelays(format!(
                "{} delays for {} tiers (MAIL_RETRY_KEYS); give one per tier",
                delays.len(),
                keys.len()
            )));
        }
        if delays.windows(2).any(|pair| pair[1] <= pair[0]) {
            return Err(ConfigError::RetryDelays(
                "the delays must be strictly increasing, one per tier in tier order".into(),
            ));
        }
        Ok(Self { keys, delays })
    }

    /// The routing key of the tier a request whose attempt `failed_attempt` failed for
    /// now parks in: the attempt's tier ([`retry_tier_of`]), or a later one that waits at
    /// least `retry_after`, the wait the provider asked for ([`retry_tier_waiting`]).
    pub fn key_for(&self, failed_attempt: u32, retry_after: Option<Duration>) -> &str {
        let tiers = self.keys.len();
        let by_attempt = retry_tier_of(failed_attempt, tiers);
        let tier = retry_after.map_or(by_attempt, |wait| {
            retry_tier_waiting(by_attempt, &self.delays, wait).min(tiers)
        });
        &self.keys[tier.clamp(1, tiers) - 1]
    }
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
        let one = RetryTiers::new("shop.send", None, None).unwrap();
        assert_eq!(one, RetryTiers::one("shop.send"));
        assert_eq!(one.key_for(3, Some(Duration::from_secs(3600))), "shop.send");
        let four: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let tiers = RetryTiers::new("x", Some(four.clone()), None).unwrap();
        let keys: Vec<&str> = (1..=5)
            .map(|attempt| tiers.key_for(attempt, None))
            .collect();
        assert_eq!(keys, ["a", "b", "c", "d", "d"]);
        for bad in [vec![], vec![String::new()], vec!["k".to_string(); 11]] {
            let e = RetryTiers::new("x", Some(bad), None)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("MAIL_RETRY_KEYS: "), "{e}");
        }
    }

    #[test]
    fn with_the_delays_a_retry_after_picks_a_tier_that_waits_long_enough() {
        let secs = Duration::from_secs;
        let keys: Vec<String> = ["t1", "t2", "t3"].map(String::from).to_vec();
        let delays = vec![secs(30), secs(300), secs(1800)];
        let tiers = RetryTiers::new("x", Some(keys.clone()), Some(delays)).unwrap();
        assert_eq!(tiers.key_for(1, None), "t1");
        assert_eq!(tiers.key_for(1, Some(secs(20))), "t1");
        assert_eq!(tiers.key_for(1, Some(secs(120))), "t2");
        assert_eq!(tiers.key_for(1, Some(secs(86_400))), "t3");
        assert_eq!(tiers.key_for(3, Some(secs(1))), "t3", "never sooner");
        let without_delays = RetryTiers::new("x", Some(keys.clone()), None).unwrap();
        assert_eq!(without_delays.key_for(1, Some(secs(120))), "t1");
        for (delays, why) in [
            (vec![secs(30)], "1 delays for 3 tiers"),
            (vec![secs(30), secs(30), secs(60)], "strictly increasing"),
        ] {
            let e = RetryTiers::new("x", Some(keys.clone()), Some(delays))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("MAIL_RETRY_DELAYS: ") && e.contains(why),
                "{e}"
            );
        }
        let e = RetryTiers::new("x", None, Some(vec![secs(30)])).unwrap_err();
        assert!(e.to_string().contains("without MAIL_RETRY_KEYS"), "{e}");
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
