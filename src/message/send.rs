//! Publishing one request as a producer does (`mailer send`): persistent, with its message
//! id, confirmed and routed to a queue.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::ConfirmSelectOptions;

use crate::amqp::publish::PERSISTENT;
use crate::amqp::{ConnectError, PublishError, connect, publish_confirmed};
use crate::mail::REQUEST_CONTENT_TYPE;

/// Why a request was not published.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("the broker connection failed: {0}")]
    Channel(#[from] lapin::Error),
    #[error("{0}")]
    Publish(#[from] PublishError),
}

/// Where a request goes and how long each step may take.
#[derive(Debug, Clone)]
pub struct Destination<'a> {
    pub amqp_url: &'a str,
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub connect_timeout: Duration,
    pub publish_timeout: Duration,
}

/// Publishes `body` as a request with `message_id`, and returns once the broker confirmed
/// that a queue took it.
pub async fn publish_request(
    to: &Destination<'_>,
    body: &[u8],
    message_id: &str,
) -> Result<(), ProduceError> {
    let connection = connect(to.amqp_url, "mailer-send", to.connect_timeout).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let properties = BasicProperties::default()
        .with_content_type(REQUEST_CONTENT_TYPE.into())
        .with_message_id(message_id.into())
        .with_delivery_mode(PERSISTENT);
    let published = publish_confirmed(
        &channel,
        to.exchange,
        to.routing_key,
        properties,
        body,
        to.publish_timeout,
    )
    .await;
    let _ = tokio::time::timeout(to.publish_timeout, connection.close(200, "sent".into())).await;
    Ok(published?)
}
