//! Publishing with publisher confirms and the mandatory flag, within a deadline: a publish
//! counts only when the broker confirmed it and routed it to a queue.

use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, PublisherConfirm};

use crate::mail::{self, MAIL_HEADER_PREFIX, REPLAYS_HEADER};

/// How long a publish may wait for the broker's confirm by default (`MAIL_PUBLISH_TIMEOUT`).
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// How much longer a publish may wait for its confirm for each whole MiB of its body:
/// the broker takes the body over the network, writes it, and copies it to a majority of
/// a quorum queue's nodes before it confirms. At this rate (1 MiB/s, far below a healthy
/// broker's) the publish timeout stays a deadline for a broker that does not answer, not
/// a bet on the size of a request.
pub const CONFIRM_ALLOWANCE_PER_MIB: Duration = Duration::from_secs(1);

/// The deadline of a publish of `body_bytes` with the publish timeout `floor`: `floor`,
/// plus [`CONFIRM_ALLOWANCE_PER_MIB`] for each whole MiB of the body (a 25 MiB request
/// gets 25s more; one under 1 MiB, nothing).
pub fn confirm_deadline(floor: Duration, body_bytes: usize) -> Duration {
    let mib = u32::try_from(body_bytes / (1024 * 1024)).unwrap_or(u32::MAX);
    floor.saturating_add(CONFIRM_ALLOWANCE_PER_MIB.saturating_mul(mib))
}

/// AMQP's persistent delivery mode.
pub const PERSISTENT: u8 = 2;

/// Why a publish did not take: what it stands for (a delivery, a dead letter) must stay.
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
    #[error("no channel to publish to {exchange} on")]
    NoChannel { exchange: String },
    #[error(
        "the broker returned a message to {exchange} that is not the one published (message id {returned:?}, published {published:?}); the worker stops rather than guess"
    )]
    ReturnMismatch {
        exchange: String,
        published: Option<String>,
        returned: Option<String>,
    },
    #[error(
        "a publish on the channel to {exchange} was given up before the broker confirmed it, so a message the broker returns can no longer be told apart; the worker stops rather than guess, and the broker redelivers what was in flight"
    )]
    Untrusted { exchange: String },
    #[error(
        "the broker did not confirm the publish to {exchange} within {}: is it blocking publishers (a memory or disk alarm), or has a queue behind it lost its quorum (its nodes down or cut off)?",
        humantime::format_duration(*after)
    )]
    Timeout { exchange: String, after: Duration },
}

impl PublishError {
    /// Whether the failure leaves the connection it happened on unfit for more publishes:
    /// a confirm that never came (the node may be cut off from the queue's quorum, which a
    /// new connection, perhaps to another node, gets round) or a channel whose returns can
    /// no longer be paired with their publishes. The worker connects again rather than
    /// stop; the deliveries in flight go back to the queue.
    pub fn leaves_the_connection_unusable(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Untrusted { .. })
    }
}

/// Publishes with the mandatory flag on `channel`, which must be in confirm mode, and
/// returns once the broker confirmed that a queue took it, or fails after `timeout` (and
/// the allowance for its size: [`confirm_deadline`]).
///
/// lapin pairs a returned message with the next confirm of its channel, so a caller must
/// have at most one publish in flight on `channel` (for many in flight on one channel, as
/// the worker parks, see [`super::PipelinedPublisher`]); a returned message that is not
/// this one (another message id) is an error rather than a guess.
pub async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    properties: BasicProperties,
    body: &[u8],
    timeout: Duration,
) -> Result<(), PublishError> {
    let published_id = properties.message_id().as_ref().map(|id| id.to_string());
    let publishing = async {
        let confirm = publish_mandatory(channel, exchange, routing_key, properties, body).await?;
        confirm.await.map_err(|source| PublishError::Channel {
            exchange: exchange.to_string(),
            source,
        })
    };
    let confirmation = within(timeout, body.len(), exchange, publishing).await?;
    if !confirmation.is_ack() {
        return Err(PublishError::Nacked {
            exchange: exchange.to_string(),
        });
    }
    // A returned message is acked too: the broker dropped it, so it did not take.
    if let Some(returned) = confirmation.take_message() {
        let returned_id = returned
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string());
        if returned_id != published_id {
            return Err(PublishError::ReturnMismatch {
                exchange: exchange.to_string(),
                published: published_id,
                returned: returned_id,
            });
        }
        return Err(PublishError::Unroutable {
            exchange: exchange.to_string(),
        });
    }
    Ok(())
}

/// Hands one publish with the mandatory flag to lapin on `channel`; the caller awaits
/// its confirm.
pub(super) async fn publish_mandatory(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    properties: BasicProperties,
    body: &[u8],
) -> Result<PublisherConfirm, PublishError> {
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            options,
            body,
            properties,
        )
        .await
        .map_err(|source| PublishError::Channel {
            exchange: exchange.to_string(),
            source,
        })
}

/// `publishing`, or [`PublishError::Timeout`] when the broker has not confirmed it after
/// `timeout` and the allowance for a body of `body_bytes` ([`confirm_deadline`]).
pub(super) async fn within<T>(
    timeout: Duration,
    body_bytes: usize,
    exchange: &str,
    publishing: impl Future<Output = Result<T, PublishError>>,
) -> Result<T, PublishError> {
    let timeout = confirm_deadline(timeout, body_bytes);
    tokio::time::timeout(timeout, publishing)
        .await
        .map_err(|_| PublishError::Timeout {
            exchange: exchange.to_string(),
            after: timeout,
        })?
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

/// The properties of a republished request: every property of the original (content,
/// identity, priority, its producer's headers) then `ours`; persistent, and from
/// `user_id` (RabbitMQ refuses a publish whose user-id is another user). Its expiration
/// is left out: the broker already moved it into `x-death`, and it would cut the retry
/// delay short.
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
    if let Some(v) = original.priority() {
        properties = properties.with_priority(*v);
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
    if let Some(v) = original.cluster_id() {
        properties = properties.with_cluster_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        properties = properties.with_timestamp(*v);
    }
    if let Some(v) = original.reply_to() {
        properties = properties.with_reply_to(v.clone());
    }
    properties
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::ATTEMPT_HEADER;

    #[test]
    fn the_confirm_deadline_grows_by_a_second_for_each_whole_mib() {
        let floor = Duration::from_secs(30);
        assert_eq!(confirm_deadline(floor, 0), floor);
        assert_eq!(confirm_deadline(floor, (1 << 20) - 1), floor);
        assert_eq!(
            confirm_deadline(floor, 1 << 20),
            floor + Duration::from_secs(1)
        );
        assert_eq!(
            confirm_deadline(floor, 25 << 20),
            Duration::from_secs(55),
            "a 25 MiB request"
        );
        assert_eq!(
            confirm_deadline(Duration::from_secs(3), 512 << 20),
            Duration::from_secs(3 + 512)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_may_wait_its_sizes_allowance_and_no_longer() {
        let floor = Duration::from_secs(3);
        let never = std::future::pending::<Result<(), PublishError>>;
        let started = tokio::time::Instant::now();
        let error = within(floor, 10 << 20, "mail.retry", never())
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(13));
        assert_eq!(
            error.to_string(),
            "the broker did not confirm the publish to mail.retry within 13s: is it blocking publishers (a memory or disk alarm), or has a queue behind it lost its quorum (its nodes down or cut off)?"
        );
    }

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
            .with_cluster_id("eu".into())
            .with_timestamp(1_700_000_000)
            .with_reply_to("replies".into())
            .with_user_id("someone-else".into())
            .with_expiration("1000".into())
            .with_priority(9)
            .with_delivery_mode(1)
    }

    #[test]
    fn a_republished_request_keeps_every_property_and_producer_header() {
        let ours = [(ATTEMPT_HEADER, AMQPValue::LongLongInt(3))];
        let p = republished(&original(), &ours, "mailer-worker");
        let text = |v: &Option<ShortString>| v.as_ref().map(|s| s.to_string());
        assert_eq!(text(p.content_type()).as_deref(), Some("application/json"));
        assert_eq!(text(p.content_encoding()).as_deref(), Some("identity"));
        assert_eq!(text(p.message_id()).as_deref(), Some("order-42"));
        assert_eq!(text(p.correlation_id()).as_deref(), Some("corr"));
        assert_eq!(text(p.kind()).as_deref(), Some("welcome"));
        assert_eq!(text(p.app_id()).as_deref(), Some("shop"));
        assert_eq!(text(p.cluster_id()).as_deref(), Some("eu"));
        assert_eq!(text(p.reply_to()).as_deref(), Some("replies"));
        assert_eq!(*p.timestamp(), Some(1_700_000_000));
        assert_eq!(*p.priority(), Some(9));
        assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
        assert_eq!(
            text(p.user_id()).as_deref(),
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
}
