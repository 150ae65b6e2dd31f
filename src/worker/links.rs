//! The worker's two connections to the broker: one consumes (and acks), one publishes
//! (parks and dead letters). RabbitMQ blocks a connection that publishes during a memory
//! or disk alarm, and lapin then holds back every frame on it; on a connection of their
//! own, acks keep flowing while publishing is blocked.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use lapin::options::{BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer, Event};
use tracing::warn;

use super::error::WorkerError;
use crate::amqp::{ConnectError, connect};
use crate::telemetry::Health;

/// Attempts to connect before the worker gives up (and the kubelet restarts it).
pub const CONNECT_ATTEMPTS: u32 = 5;
/// The wait after the first failed attempt; it doubles after each.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(15);
/// Publishing channels: one takes the publishes; the others take a request only while
/// the same one (a duplicate) is in flight there.
const PUBLISH_CHANNELS: usize = 2;

/// What a connection's events say to the consume loop.
#[derive(Debug)]
pub enum LinkEvent {
    /// The broker blocks publishing (a resource alarm), with its reason.
    Blocked(String),
    Unblocked,
    /// The connection failed or was closed by the broker.
    Lost(lapin::Error),
}

/// A connection's events, as [`events`] sorts them.
pub type Events = Pin<Box<dyn Stream<Item = LinkEvent> + Send>>;

/// Both connections, their channels and the consumer.
pub struct Links {
    pub consume_connection: Connection,
    pub publish_connection: Connection,
    pub consume_events: Events,
    pub publish_events: Events,
    pub consume: Channel,
    /// Channels in confirm mode: the first takes the publishes, the others one only while
    /// the same request is in flight on it ([`crate::amqp::pipelined`]).
    pub publish: Vec<Channel>,
    pub consumer: Consumer,
}

/// What [`open`] needs.
pub struct Plan<'a> {
    pub url: &'a str,
    pub queue: &'a str,
    pub prefetch: u16,
    pub timeout: Duration,
}

/// Connects both connections, retrying with backoff, and starts consuming. Each attempt
/// beats `health`, so a worker that is trying to connect is live.
pub async fn open(plan: &Plan<'_>, health: &Health) -> Result<Links, WorkerError> {
    let consume_connection = connect_retrying(plan, "mailer-worker-consume", health).await?;
    let consume_events = events(&consume_connection);
    let publish_connection = connect_retrying(plan, "mailer-worker-publish", health).await?;
    let publish_events = events(&publish_connection);
    let setup = async {
        let consume = consume_connection.create_channel().await?;
        consume
            .basic_qos(plan.prefetch, BasicQosOptions::default())
            .await?;
        let mut publish = Vec::with_capacity(PUBLISH_CHANNELS);
        for _ in 0..PUBLISH_CHANNELS {
            let channel = publish_connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            publish.push(channel);
        }
        let consumer = consume
            .basic_consume(
                plan.queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|source| WorkerError::Consume {
                queue: plan.queue.to_string(),
                source,
            })?;
        Ok::<_, WorkerError>((consume, publish, consumer))
    };
    let (consume, publish, consumer) = tokio::time::timeout(plan.timeout, setup)
        .await
        .map_err(|_| WorkerError::Timeout("opening channels and starting to consume"))??;
    Ok(Links {
        consume_connection,
        publish_connection,
        consume_events,
        publish_events,
        consume,
        publish,
        consumer,
    })
}

async fn connect_retrying(
    plan: &Plan<'_>,
    name: &str,
    health: &Health,
) -> Result<Connection, ConnectError> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        health.beat();
        match connect(plan.url, name, plan.timeout).await {
            Ok(connection) => return Ok(connection),
            Err(e) if attempt < CONNECT_ATTEMPTS => {
                warn!(error = %e, attempt, retry_in = %humantime::format_duration(backoff), "cannot connect to the broker yet");
                health.beat();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The events of a connection that matter to the loop. Listen right after connecting:
/// lapin drops events nobody listens to.
fn events(connection: &Connection) -> Events {
    Box::pin(connection.events_listener().filter_map(|event| async move {
        match event {
            Event::ConnectionBlocked(reason) => Some(LinkEvent::Blocked(reason)),
            Event::ConnectionUnblocked => Some(LinkEvent::Unblocked),
            Event::Error(e) => Some(LinkEvent::Lost(e)),
            _ => None,
        }
    }))
}
