//! Exchanges, queues and bindings written over AMQP instead of the management API.
//!
//! The management API declares each of these on an AMQP channel it opens inside the
//! broker for that one request, which makes quorum queues slower to declare than a few
//! AMQP channels do (`docs/benchmarks.md`). So a first apply of many pipelines, when it
//! is given an AMQP URL (`mailer topology apply --amqp-url`), declares them on
//! [`MAX_IN_FLIGHT`] channels per vhost. Vhosts and policies have no AMQP method and stay
//! on the management API, and every read does: what is declared here is only what the
//! plan found missing, so a declare never meets an object with other arguments.

use std::collections::BTreeMap;

use futures::future::try_join_all;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ErrorKind, ExchangeKind as AmqpExchangeKind};

use super::desired::ExchangeKind;
use super::diff::Change;
use super::error::TopologyError;
use super::management::{MAX_IN_FLIGHT, Management};
use crate::amqp::address::with_vhost;
use crate::amqp::connect;
use crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT;

/// Where exchanges, queues and bindings are declared: the broker's AMQP URL (its vhost
/// is replaced by each pipeline's). The user needs `configure` on the exchanges and
/// queues, `write` on the exchanges and `read` on the queues it binds.
#[derive(Debug, Clone)]
pub struct AmqpDeclarer {
    url: String,
}

impl AmqpDeclarer {
    pub fn new(amqp_url: &str) -> Result<Self, TopologyError> {
        with_vhost(amqp_url, "/").map_err(TopologyError::BadEndpoint)?;
        Ok(Self {
            url: amqp_url.to_string(),
        })
    }

    /// Opens one connection per vhost of `vhosts`, with [`MAX_IN_FLIGHT`] channels each.
    pub(super) async fn open(&self, vhosts: &[&str]) -> Result<Declaring, TopologyError> {
        let mut connections = BTreeMap::new();
        for &vhost in vhosts {
            if connections.contains_key(vhost) {
                continue;
            }
            let url = with_vhost(&self.url, vhost).map_err(TopologyError::BadEndpoint)?;
            let unreachable = |reason: String| TopologyError::Refused {
                action: format!("open an AMQP connection to vhost {vhost:?}"),
                status: 0,
                reason,
            };
            let connection = connect(&url, "mailer topology", DEFAULT_CONNECT_TIMEOUT)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let mut channels = Vec::with_capacity(MAX_IN_FLIGHT);
            for _ in 0..MAX_IN_FLIGHT {
                channels.push(
                    connection
                        .create_channel()
                        .await
                        .map_err(|e| unreachable(e.to_string()))?,
                );
            }
            connections.insert(vhost.to_string(), (connection, channels));
        }
        Ok(Declaring { connections })
    }
}

/// The connections of one apply, closed by [`Declaring::close`].
pub(super) struct Declaring {
    connections: BTreeMap<String, (Connection, Vec<Channel>)>,
}

impl Declaring {
    /// Makes each of `changes` (exchanges, queues, bindings), spread over the channels of
    /// its vhost, one at a time per channel; counted as writes of `management`.
    pub async fn write_all(
        &self,
        management: &Management,
        changes: &[(&str, &Change)],
    ) -> Result<(), TopologyError> {
        let mut lanes: Vec<(&Channel, Vec<(&str, &Change)>)> = Vec::new();
        for (vhost, (_, channels)) in &self.connections {
            let mine = changes.iter().filter(|(v, _)| v == vhost);
            let first_lane = lanes.len();
            lanes.extend(channels.iter().map(|channel| (channel, Vec::new())));
            for (i, change) in mine.enumerate() {
                lanes[first_lane + i % channels.len()].1.push(*change);
            }
        }
        try_join_all(
            lanes
                .into_iter()
                .map(|(channel, lane)| declare_in_turn(management, channel, lane)),
        )
        .await?;
        Ok(())
    }

    pub async fn close(self) {
        for (_, (connection, _)) in self.connections {
            let _ = connection.close(200, "topology applied".into()).await;
        }
    }
}

/// Declares `lane`'s changes one after the other on `channel`.
async fn declare_in_turn(
    management: &Management,
    channel: &Channel,
    lane: Vec<(&str, &Change)>,
) -> Result<(), TopologyError> {
    for (vhost, change) in lane {
        management.wrote_to(vhost);
        management.count_write();
        declare(channel, change).await?;
        tracing::info!(vhost = %vhost, change = %change, "topology changed");
    }
    Ok(())
}

async fn declare(channel: &Channel, change: &Change) -> Result<(), TopologyError> {
    let result = match change {
        Change::CreateExchange(exchange) => {
            let kind = match exchange.kind {
                ExchangeKind::Direct => AmqpExchangeKind::Direct,
                ExchangeKind::Fanout => AmqpExchangeKind::Fanout,
            };
            let options = ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(
                    exchange.name.as_str().into(),
                    kind,
                    options,
                    FieldTable::default(),
                )
                .await
        }
        Change::CreateQueue(queue) => {
            let mut arguments = FieldTable::default();
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            let options = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            channel
                .queue_declare(queue.name.as_str().into(), options, arguments)
                .await
                .map(|_| ())
        }
        Change::CreateBinding(binding) => {
            channel
                .queue_bind(
                    binding.queue.as_str().into(),
                    binding.exchange.as_str().into(),
                    binding.routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
        }
        Change::CreateVhost(_) | Change::PutPolicy { .. } => {
            return Err(TopologyError::Refused {
                action: change.to_string(),
                status: 0,
                reason: "vhosts and policies are written through the management API".into(),
            });
        }
    };
    result.map_err(|e| refused(change, &e))
}

/// The broker's refusal, with its AMQP reply code (403 access refused, 404 not found,
/// 406 precondition failed, 5xx the broker's own failure) as the status.
fn refused(change: &Change, error: &lapin::Error) -> TopologyError {
    let status = match error.kind() {
        ErrorKind::ProtocolError(amqp) => amqp.get_id(),
        _ => 0,
    };
    TopologyError::Refused {
        action: change.to_string(),
        status,
        reason: error.to_string(),
    }
}
