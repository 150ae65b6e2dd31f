//! Parking a request in the retry exchange and dead-lettering it, through
//! [`PipelinedPublisher`]: a publish counts only when the broker confirmed it and routed it
//! somewhere within the publish timeout. Many publishes are in flight on one channel, each
//! matched exactly to a returned message (see [`crate::amqp::pipelined`]).

use std::time::Duration;

use lapin::types::{AMQPValue, LongString};
use lapin::{BasicProperties, Channel};

use crate::amqp::{PipelinedPublisher, PublishError, republished};
use crate::mail::{
    ATTEMPT_HEADER, DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_ERROR_HEADER, DEAD_REASON_HEADER,
    DeadReason, MAX_DEAD_ERROR_CHARS,
};
use crate::text::truncate;
use crate::worker::config::RetryTiers;

/// Publishes the requests a worker parks or gives up on.
#[derive(Clone)]
pub struct Publisher {
    publisher: PipelinedPublisher,
    /// The worker's own broker user; RabbitMQ refuses a publish whose user-id is another.
    user_id: String,
    routing_key: String,
    /// The delay tiers' routing keys and delays.
    retry_tiers: RetryTiers,
    retry_exchange: String,
    dead_exchange: String,
    timeout: Duration,
}

impl Publisher {
    /// `channels` must be in confirm mode, and not empty: the first takes the publishes,
    /// the others one only while the same request is in flight on the first.
    pub fn new(
        channels: Vec<Channel>,
        user_id: &str,
        routing_key: &str,
        retry_tiers: RetryTiers,
        retry_exchange: &str,
        dead_exchange: &str,
        timeout: Duration,
    ) -> Self {
        Self {
            publisher: PipelinedPublisher::new(channels),
            user_id: user_id.to_string(),
            routing_key: routing_key.to_string(),
            retry_tiers,
            retry_exchange: retry_exchange.to_string(),
            dead_exchange: dead_exchange.to_string(),
            timeout,
        }
    }

    /// Puts the request in the delay queue of its tier with its next attempt counted: the
    /// attempt that failed, `next_attempt - 1`, picks the tier, or a later one that waits
    /// at least `retry_after`, the wait the provider asked for ([`RetryTiers::key_for`]).
    pub async fn park(
        &self,
        original: &BasicProperties,
        body: &[u8],
        next_attempt: u32,
        retry_after: Option<Duration>,
    ) -> Result<(), PublishError> {
        let ours = [(ATTEMPT_HEADER, AMQPValue::LongLongInt(next_attempt.into()))];
        let key = self
            .retry_tiers
            .key_for(next_attempt.saturating_sub(1), retry_after);
        self.publisher
            .publish(
                &self.retry_exchange,
                key,
                republished(original, &ours, &self.user_id),
                body,
                self.timeout,
            )
            .await
    }

    /// Publishes the request to the dead-letter exchange with why, and no attempt header.
    pub async fn dead_letter(
        &self,
        original: &BasicProperties,
        body: &[u8],
        reason: DeadReason,
        attempts: u32,
        error: &str,
    ) -> Result<(), PublishError> {
        let error = truncate(error, MAX_DEAD_ERROR_CHARS);
        let ours = [
            (
                DEAD_REASON_HEADER,
                AMQPValue::LongString(LongString::from(reason.as_str())),
            ),
            (
                DEAD_ATTEMPTS_HEADER,
                AMQPValue::LongLongInt(attempts.into()),
            ),
            (
                DEAD_ERROR_HEADER,
                AMQPValue::LongString(LongString::from(error.as_ref())),
            ),
            (DEAD_AT_HEADER, AMQPValue::Timestamp(unix_now())),
        ];
        self.publisher
            .publish(
                &self.dead_exchange,
                &self.routing_key,
                republished(original, &ours, &self.user_id),
                body,
                self.timeout,
            )
            .await
    }
}

/// Now, in whole seconds since the Unix epoch, as AMQP timestamps count.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
