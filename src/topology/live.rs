//! Live queue counts over AMQP: the management API's statistics lag by seconds, and
//! deciding whether a queue may be deleted must not rest on a stale count.

use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

/// A queue's load this instant, as the broker's own `queue.declare-ok` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveLoad {
    /// Messages ready for delivery (a quorum queue does not count unacknowledged ones).
    pub ready: u32,
    pub consumers: u32,
}

/// An AMQP connection to one vhost, used only for passive declares.
pub struct LiveQueues {
    connection: Connection,
}

impl LiveQueues {
    pub async fn connect(amqp_url: &str) -> Result<Self, String> {
        let connection = crate::amqp::connect(
            amqp_url,
            "mailer live queue counts",
            crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT,
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(Self { connection })
    }

    /// The load of `queue`, or `None` when it does not exist.
    pub async fn load(&self, queue: &str) -> Result<Option<LiveLoad>, String> {
        // A passive declare of a missing queue closes its channel, so each check gets one.
        let channel = self
            .connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        match channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await
        {
            Ok(q) => {
                let _ = channel.close(200, "checked".into()).await;
                Ok(Some(LiveLoad {
                    ready: q.message_count(),
                    consumers: q.consumer_count(),
                }))
            }
            Err(e) if e.to_string().contains("NOT_FOUND") => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "done".into()).await;
    }
}
