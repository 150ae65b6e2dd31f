//! Parking a request in the retry exchange and dead-lettering it, through
//! [`publish_confirmed`]: a publish counts only when the broker confirmed it and routed it
//! somewhere within the publish timeout. Each publish has a channel of its own while it is
//! in flight, so a returned message can only be its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;

use lapin::types::{AMQPValue, LongString};
use lapin::{BasicProperties, Channel};

use crate::amqp::{PublishError, publish_confirmed, republished};
use crate::mail::{
    ATTEMPT_HEADER, DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_ERROR_HEADER, DEAD_REASON_HEADER,
    DeadReason, MAX_DEAD_ERROR_CHARS,
};
use crate::text::truncate;

/// Publishes the requests a worker parks or gives up on.
#[derive(Clone)]
pub struct Publisher {
    /// Channels in confirm mode, one per delivery that may be in flight.
    channels: Arc<[Mutex<Channel>]>,
    next: Arc<AtomicUsize>,
    /// The worker's own broker user; RabbitMQ refuses a publish whose user-id is another.
    user_id: String,
    routing_key: String,
    retry_exchange: String,
    dead_exchange: String,
    timeout: Duration,
}

impl Publisher {
    /// `channels` must be in confirm mode, and not empty: as many as deliveries may be in
    /// flight, so that no publish waits for another.
    pub fn new(
        channels: Vec<Channel>,
        user_id: &str,
        routing_key: &str,
        retry_exchange: &str,
        dead_exchange: &str,
        timeout: Duration,
    ) -> Self {
        Self {
            channels: channels.into_iter().map(Mutex::new).collect(),
            next: Arc::new(AtomicUsize::new(0)),
            user_id: user_id.to_string(),
            routing_key: routing_key.to_string(),
            retry_exchange: retry_exchange.to_string(),
            dead_exchange: dead_exchange.to_string(),
            timeout,
        }
    }

    /// Puts the request in the delay queue with its next attempt counted.
    pub async fn park(
        &self,
        original: &BasicProperties,
        body: &[u8],
        next_attempt: u32,
    ) -> Result<(), PublishError> {
        let ours = [(ATTEMPT_HEADER, AMQPValue::LongLongInt(next_attempt.into()))];
        self.publish(
            &self.retry_exchange,
            republished(original, &ours, &self.user_id),
            body,
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
        self.publish(
            &self.dead_exchange,
            republished(original, &ours, &self.user_id),
            body,
        )
        .await
    }

    async fn publish(
        &self,
        exchange: &str,
        properties: BasicProperties,
        body: &[u8],
    ) -> Result<(), PublishError> {
        let n = self.channels.len().max(1);
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let free = (0..n).find_map(|i| self.channels.get((start + i) % n)?.try_lock().ok());
        let channel = match free {
            Some(channel) => channel,
            None => match self.channels.get(start) {
                Some(channel) => channel.lock().await,
                None => {
                    return Err(PublishError::NoChannel {
                        exchange: exchange.to_string(),
                    });
                }
            },
        };
        publish_confirmed(
            &channel,
            exchange,
            &self.routing_key,
            properties,
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
