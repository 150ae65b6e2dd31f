//! Why the worker stopped.

use super::delivery::SettleError;
use crate::amqp::ConnectError;

/// Why the worker stopped before it was asked to, or could not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(
        "cannot consume {queue}: {source}; does the queue exist (mailer topology apply creates it) and may this user read it?"
    )]
    Consume { queue: String, source: lapin::Error },
    #[error("the broker did not answer in time while {0}")]
    Timeout(&'static str),
    #[error("the broker connection failed: {0}")]
    Channel(#[from] lapin::Error),
    #[error(
        "the connection that consumes was lost ({source}); {abandoned} deliveries in flight were abandoned and the broker redelivers them"
    )]
    ConsumeLost {
        source: lapin::Error,
        abandoned: usize,
    },
    #[error("the connection that publishes was lost: {0}")]
    PublishLost(lapin::Error),
    #[error(
        "the broker stopped delivering from {queue} (the consumer was cancelled: was the queue deleted?)"
    )]
    ConsumerCancelled { queue: String },
    #[error(
        "a delivery could not be settled, so the worker stops and the broker will redeliver it: {0}"
    )]
    Settle(#[from] SettleError),
    #[error(
        "{0} deliveries were still in flight after the shutdown timeout; the broker will redeliver them"
    )]
    ShutdownTimeout(usize),
}

impl WorkerError {
    /// Whether the broker went away (a connection lost, or none to be had) or left the
    /// connection unfit for publishing (a confirm that never came, as on a node cut off
    /// from the quorum): the worker connects again rather than stop, for up to its
    /// reconnect timeout.
    pub fn is_connection_loss(&self) -> bool {
        match self {
            Self::Connect(_)
            | Self::ConsumeLost { .. }
            | Self::PublishLost(_)
            | Self::Channel(_)
            | Self::Timeout(_) => true,
            Self::Settle(SettleError::Publish(publish)) => publish.leaves_the_connection_unusable(),
            // The connection went while the consumer was being set up (a node pausing as
            // it is cut off from the others closes its connections): not the queue's or
            // the user's fault, which the broker would say on the channel.
            Self::Consume { source, .. } => lost_connection(source),
            _ => false,
        }
    }
}

/// Whether `error` is the connection's, not a channel's refusal (a missing queue, a
/// permission).
fn lost_connection(error: &lapin::Error) -> bool {
    error.is_io_error()
        || error.is_amqp_hard_error()
        || matches!(
            error.kind(),
            lapin::ErrorKind::MissingHeartbeatError | lapin::ErrorKind::InvalidConnectionState(_)
        )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::amqp::PublishError;

    fn settle(publish: PublishError) -> WorkerError {
        WorkerError::Settle(SettleError::Publish(publish))
    }

    #[test]
    fn a_publish_never_confirmed_or_untrusted_reconnects_and_a_refused_one_stops() {
        let exchange = || "mail.retry".to_string();
        let reconnects = [
            settle(PublishError::Timeout {
                exchange: exchange(),
                after: Duration::from_secs(30),
            }),
            settle(PublishError::Untrusted {
                exchange: exchange(),
            }),
        ];
        for error in &reconnects {
            assert!(error.is_connection_loss(), "{error}");
        }
        let stops = [
            settle(PublishError::Nacked {
                exchange: exchange(),
            }),
            settle(PublishError::Unroutable {
                exchange: exchange(),
            }),
            WorkerError::ShutdownTimeout(3),
        ];
        for error in &stops {
            assert!(!error.is_connection_loss(), "{error}");
        }
    }

    #[test]
    fn a_connection_lost_while_the_consumer_is_set_up_reconnects() {
        let aborted = std::io::Error::from(std::io::ErrorKind::ConnectionAborted);
        let lost = WorkerError::Consume {
            queue: "mail.send".into(),
            source: lapin::Error::from(aborted),
        };
        assert!(lost.is_connection_loss(), "{lost}");
        let refused = WorkerError::Consume {
            queue: "mail.send".into(),
            source: lapin::Error::from(lapin::ErrorKind::InvalidChannelState(
                lapin::ChannelState::Closed,
                "basic.consume",
            )),
        };
        assert!(!refused.is_connection_loss(), "{refused}");
    }
}
