//! Parking a request in the retry exchange and dead-lettering it, with publisher
//! confirms and the mandatory flag: a publish counts only when the broker confirmed it
//! and routed it somewhere.

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};

use crate::mail::{
    self, ATTEMPT_HEADER, DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_ERROR_HEADER,
    DEAD_REASON_HEADER, DeadReason, MAIL_HEADER_PREFIX, REPLAYS_HEADER,
};

/// AMQP's persistent delivery mode.
const PERSISTENT: u8 = 2;

/// Why a park or dead-letter publish did not take: the delivery must not be acked.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("publishing to {exchange} failed: {source}")]
    Channel {
        exchange: String,
        source: lapin::Error,
    },
    #[error("the broker refused the publish to {exchange} (nack): is a queue behind it full?")]
    Nacked { exchange: String },
    #[error(
        "the publish to {exchange} was returned as unroutable: is its binding missing? (mailer topology apply repairs it)"
    )]
    Unroutable { exchange: String },
}

/// Publishes the requests a worker parks or gives up on.
#[derive(Clone)]
pub struct Publisher {
    channel: Channel,
    /// The worker's own broker user; RabbitMQ refuses a publish whose user-id is another.
    user_id: String,
    routing_key: String,
    retry_exchange: String,
    dead_exchange: String,
}

impl Publisher {
    /// `channel` must be in confirm mode.
    pub fn new(
        channel: Channel,
        user_id: &str,
        routing_key: &str,
        retry_exchange: &str,
        dead_exchange: &str,
    ) -> Self {
        Self {
            channel,
            user_id: user_id.to_string(),
            routing_key: routing_key.to_string(),
            retry_exchange: retry_exchange.to_string(),
            dead_exchange: dead_exchange.to_string(),
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
                AMQPValue::LongString(LongString::from(cut(error, mail::MAX_DEAD_ERROR_BYTES))),
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
        publish_confirmed(&self.channel, exchange, &self.routing_key, properties, body).await
    }
}

/// Publishes with the mandatory flag on `channel`, which must be in confirm mode, and
/// returns once the broker confirmed that a queue took it.
pub async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    properties: BasicProperties,
    body: &[u8],
) -> Result<(), PublishError> {
    let failed = |source| PublishError::Channel {
        exchange: exchange.to_string(),
        source,
    };
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let confirm = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            options,
            body,
            properties,
        )
        .await
        .map_err(failed)?;
    let confirmation = confirm.await.map_err(failed)?;
    if !confirmation.is_ack() {
        return Err(PublishError::Nacked {
            exchange: exchange.to_string(),
        });
    }
    // A returned message is acked too: the broker dropped it, so it did not take.
    if confirmation.take_message().is_some() {
        return Err(PublishError::Unroutable {
            exchange: exchange.to_string(),
        });
    }
    Ok(())
}

/// Whether a header is the broker's (dead-lettering, delivery counting) or ours, and so
/// is not carried over to a republished request. How often a request was replayed stays
/// with it for good.
fn is_stripped(name: &str) -> bool {
    (name.starts_with(MAIL_HEADER_PREFIX) && name != REPLAYS_HEADER)
        || name == mail::DEATH_HEADER
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
        || name == "x-delivery-count"
        || name == "x-acquired-count"
}

/// The properties of a republished request: the original's content and identity, its
/// producer's headers, then `ours`; persistent, and from `user_id`.
pub fn republished(
    original: &BasicProperties,
    ours: &[(&str, AMQPValue)],
    user_id: &str,
) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(theirs) = original.headers() {
        for (name, value) in theirs.inner() {
            if !is_stripped(name.as_str()) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    for (name, value) in ours {
        headers.insert(ShortString::from(*name), value.clone());
    }
    let mut properties = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(PERSISTENT)
        .with_user_id(user_id.into());
    if let Some(v) = original.content_type() {
        properties = properties.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        properties = properties.with_content_encoding(v.clone());
    }
    if let Some(v) = original.message_id() {
        properties = properties.with_message_id(v.clone());
    }
    if let Some(v) = original.correlation_id() {
        properties = properties.with_correlation_id(v.clone());
    }
    if let Some(v) = original.kind() {
        properties = properties.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        properties = properties.with_app_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        properties = properties.with_timestamp(*v);
    }
    if let Some(v) = original.reply_to() {
        properties = properties.with_reply_to(v.clone());
    }
    properties
}

/// Now, in whole seconds since the Unix epoch, as AMQP timestamps count.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn original() -> BasicProperties {
        let mut headers = FieldTable::default();
        for (name, value) in [
            ("traceparent", "00-abc-def-01"),
            ("x-death", "broker"),
            ("x-first-death-reason", "expired"),
            ("x-last-death-queue", "mail.send.retry"),
            ("x-delivery-count", "3"),
            ("x-acquired-count", "3"),
            ("x-mail-attempt", "2"),
            ("x-mail-dead-reason", "gave-up"),
            ("x-mail-replays", "2"),
        ] {
            headers.insert(name.into(), AMQPValue::LongString(value.into()));
        }
        BasicProperties::default()
            .with_headers(headers)
            .with_content_type("application/json".into())
            .with_content_encoding("identity".into())
            .with_message_id("order-42".into())
            .with_correlation_id("corr".into())
            .with_type("welcome".into())
            .with_app_id("shop".into())
            .with_timestamp(1_700_000_000)
            .with_reply_to("replies".into())
            .with_user_id("someone-else".into())
            .with_expiration("1000".into())
            .with_priority(9)
            .with_delivery_mode(1)
    }

    #[test]
    fn a_republished_request_keeps_its_content_identity_and_producer_headers() {
        let ours = [(ATTEMPT_HEADER, AMQPValue::LongLongInt(3))];
        let p = republished(&original(), &ours, "mailer-worker");
        assert_eq!(
            p.content_type().as_ref().map(|s| s.as_str()),
            Some("application/json")
        );
        assert_eq!(
            p.content_encoding().as_ref().map(|s| s.as_str()),
            Some("identity")
        );
        assert_eq!(
            p.message_id().as_ref().map(|s| s.as_str()),
            Some("order-42")
        );
        assert_eq!(
            p.correlation_id().as_ref().map(|s| s.as_str()),
            Some("corr")
        );
        assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("welcome"));
        assert_eq!(p.app_id().as_ref().map(|s| s.as_str()), Some("shop"));
        assert_eq!(*p.timestamp(), Some(1_700_000_000));
        assert_eq!(p.reply_to().as_ref().map(|s| s.as_str()), Some("replies"));
        assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
        assert_eq!(
            p.user_id().as_ref().map(|s| s.as_str()),
            Some("mailer-worker"),
            "never the delivery's user-id"
        );
        assert_eq!(
            *p.expiration(),
            None,
            "a per-message TTL would cut the delay short"
        );
        let headers = p.headers().clone().unwrap();
        let names: Vec<&str> = headers.inner().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["traceparent", "x-mail-attempt", "x-mail-replays"]);
        assert_eq!(headers.inner()["x-mail-attempt"], AMQPValue::LongLongInt(3));
    }

    #[test]
    fn errors_are_cut_on_a_character_boundary() {
        assert_eq!(cut("short", 4096), "short");
        let long = "é".repeat(3000);
        let c = cut(&long, 4096);
        assert!(c.len() <= 4096 && c.len() >= 4095);
        assert!(c.chars().all(|ch| ch == 'é'));
    }
}
