//! Reading the dead queue without losing or reordering a dead letter.
//!
//! AMQP 0.9.1 cannot look at a quorum queue without delivering from it, and what was
//! measured on RabbitMQ 3.10.8 and 4.0.5 decides how a pass reads:
//!
//! - Every delivery that is returned counts: `x-delivery-count` grows by one per read, and
//!   RabbitMQ 4 drops a message at its 21st return unless the queue's policy lifts the
//!   limit (the topology gives the dead queue `delivery-limit: -1` there).
//! - Returning deliveries one by one, or many at once with `basic.nack(multiple)`, does
//!   not keep their order (more than 32 come back shuffled), and 3.10 puts a returned
//!   `basic.get` at the back of the queue. A consumer whose channel closes gets every
//!   delivery it held put back in their order, on both versions, behind the messages put
//!   back before and ahead of those never delivered. So a pass consumes, holds what it
//!   reads unacknowledged, and closes the channel; and it always reads the whole queue
//!   (a command that needs no more reads on without acting), since what it left unread
//!   may be messages put back by an earlier pass, which its own would then follow. What
//!   it did not remove is back where it was, before anything that arrived meanwhile.
//! - The put-back happens after the channel is closed, a moment later. A pass waits until
//!   the broker no longer counts its consumer (the put-back and the consumer's removal are
//!   one step of the queue), so the next command sees every dead letter.
//! - A consumer is sent at once as many deliveries as its prefetch allows, so a pass
//!   reads through consumers of [`WINDOW`] deliveries each, each opened when the one
//!   before is full and, before any is closed, all cancelled (a consumer with room left
//!   would be given what another puts back); then closed in turn.
//!
//! A removal (replay, purge) acks the delivery and then makes a round trip on the same
//! channel, so the ack has reached the broker before the next dead letter is read.

use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};

use super::DeadError;
use crate::amqp::connect;
use crate::amqp::connect::DEFAULT_CONNECT_TIMEOUT;

/// How many deliveries one consumer of a pass holds. The broker sends a consumer as many
/// as it may hold at once, so this bounds the deliveries waiting in memory; a bigger queue
/// is read through one consumer (and channel) per this many dead letters, up to RabbitMQ's
/// 2047 channels per connection: about two million.
pub const WINDOW: u16 = 1000;
/// How long a pass waits for the next delivery before it concludes that another consumer
/// took the rest.
const IDLE: Duration = Duration::from_secs(2);
/// How long the broker is given to take back what a pass held.
const PUT_BACK_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// A connection to the vhost of one dead queue.
pub struct DeadQueue {
    connection: Connection,
    pub name: String,
}

/// A queue's load this instant, as the broker's own `queue.declare-ok` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Messages ready for delivery; those a consumer holds are not counted.
    pub ready: u32,
    pub consumers: u32,
}

/// What to do with a dead letter once it was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Leave it in the queue, and read on.
    Keep,
    /// Remove it from the queue (acknowledge it), and read on.
    Remove,
    /// Leave it and every later one in the queue: the rest are read, to keep the order,
    /// but not handed on.
    Stop,
}

/// What a pass over the queue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// The queue when the pass began.
    pub depth: Depth,
    pub read: usize,
    /// How many were handed on before a [`Verdict::Stop`].
    pub visited: usize,
    pub removed: usize,
    /// Dead letters counted at the start that never came, because another consumer took
    /// them (or they were removed meanwhile).
    pub missed: usize,
    /// Whether the broker was seen to take back everything the pass held.
    pub put_back: bool,
}

/// A consumer and what it holds.
struct Window {
    channel: Channel,
    consumer: Consumer,
    prefetch: u16,
    held: usize,
}

impl DeadQueue {
    /// Connects to the broker and checks that `queue` exists.
    pub async fn open(amqp_url: &str, queue: &str) -> Result<Self, DeadError> {
        let connection = connect(amqp_url, "mailer-dead", DEFAULT_CONNECT_TIMEOUT).await?;
        let queue = Self {
            connection,
            name: queue.to_string(),
        };
        queue.depth().await?;
        Ok(queue)
    }

    /// The queue's load now, read live (the management API's statistics lag).
    pub async fn depth(&self) -> Result<Depth, DeadError> {
        // A passive declare of a missing queue closes its channel: one channel per look.
        let channel = self.channel().await?;
        let declared = declare_passive(&channel, &self.name).await;
        let _ = channel.close(200, "looked".into()).await;
        let declared = declared?;
        Ok(Depth {
            ready: declared.message_count(),
            consumers: declared.consumer_count(),
        })
    }

    /// A channel in confirm mode on the same connection, to publish on.
    pub async fn confirming_channel(&self) -> Result<Channel, DeadError> {
        let channel = self.channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|source| self.read_error(source))?;
        Ok(channel)
    }

    /// Reads the dead letters that are in the queue now, in their order, handing each to
    /// `visit`, and puts back all it did not remove. Consumers of at most `window`
    /// deliveries each are used ([`WINDOW`] but for tests).
    pub async fn pass(
        &self,
        window: u16,
        mut visit: impl AsyncFnMut(&Delivery) -> Result<Verdict, DeadError>,
    ) -> Result<Pass, DeadError> {
        let depth = self.depth().await?;
        let mut pass = Pass {
            depth,
            ..Pass::default()
        };
        let planned = depth.ready as usize;
        let mut windows: Vec<Window> = Vec::new();
        let mut stopped = false;
        let outcome = loop {
            if pass.read >= planned {
                break Ok(());
            }
            if windows
                .last()
                .is_none_or(|w| w.held >= usize::from(w.prefetch))
            {
                let prefetch = (planned - pass.read).min(usize::from(window.max(1))) as u16;
                match self.open_window(prefetch).await {
                    Ok(opened) => windows.push(opened),
                    Err(e) => break Err(e),
                }
            }
            let Some(current) = windows.last_mut() else {
                break Ok(());
            };
            let delivery = match tokio::time::timeout(IDLE, current.consumer.next()).await {
                Err(_idle) => {
                    pass.missed = planned - pass.read;
                    break Ok(());
                }
                Ok(Some(Ok(delivery))) => delivery,
                Ok(Some(Err(source))) => break Err(self.read_error(source)),
                Ok(None) => {
                    break Err(DeadError::Cancelled {
                        queue: self.name.clone(),
                    });
                }
            };
            pass.read += 1;
            current.held += 1;
            if stopped {
                continue;
            }
            pass.visited += 1;
            match visit(&delivery).await {
                Ok(Verdict::Keep) => {}
                Ok(Verdict::Remove) => match self.remove(current, &delivery).await {
                    Ok(()) => pass.removed += 1,
                    Err(e) => break Err(e),
                },
                Ok(Verdict::Stop) => stopped = true,
                Err(e) => break Err(e),
            }
        };
        pass.put_back = self.put_back(windows, depth.consumers).await;
        outcome.map(|()| pass)
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "done".into()).await;
    }

    async fn channel(&self) -> Result<Channel, DeadError> {
        self.connection
            .create_channel()
            .await
            .map_err(|source| self.read_error(source))
    }

    async fn open_window(&self, prefetch: u16) -> Result<Window, DeadError> {
        let channel = self.channel().await?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|source| self.read_error(source))?;
        let consumer = channel
            .basic_consume(
                self.name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|source| self.read_error(source))?;
        Ok(Window {
            channel,
            consumer,
            prefetch,
            held: 0,
        })
    }

    /// Acks the delivery, then waits for a round trip on its channel: the broker has the
    /// ack once that returns.
    async fn remove(&self, window: &mut Window, delivery: &Delivery) -> Result<(), DeadError> {
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(|source| self.read_error(source))?;
        window.held -= 1;
        declare_passive(&window.channel, &self.name).await?;
        Ok(())
    }

    /// Closes the windows in the order they were opened, each once the broker has taken
    /// back what the one before held, so the dead letters go back in their order. `others`
    /// is how many consumers the queue had before the pass.
    ///
    /// Every consumer is cancelled first: the last window may have room left (after a
    /// removal, or a stop), and would otherwise be given the dead letters the first one
    /// puts back, and put them back after all the others. A cancelled consumer keeps
    /// what it holds, and is still counted, until its channel closes.
    async fn put_back(&self, windows: Vec<Window>, others: u32) -> bool {
        for window in &windows {
            let _ = window
                .channel
                .basic_cancel(window.consumer.tag(), BasicCancelOptions::default())
                .await;
        }
        let mut all_back = true;
        let mut still_open = windows.len() as u32;
        for window in windows {
            still_open -= 1;
            let _ = window.channel.close(200, "read".into()).await;
            all_back &= self.wait_for_consumers(others + still_open).await;
        }
        all_back
    }

    /// Waits until the queue counts at most `at_most` consumers.
    async fn wait_for_consumers(&self, at_most: u32) -> bool {
        let deadline = Instant::now() + PUT_BACK_TIMEOUT;
        loop {
            match self.depth().await {
                Ok(depth) if depth.consumers <= at_most => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn read_error(&self, source: lapin::Error) -> DeadError {
        DeadError::Read {
            queue: self.name.clone(),
            source,
        }
    }
}

async fn declare_passive(channel: &Channel, queue: &str) -> Result<lapin::Queue, DeadError> {
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
        .map_err(|source| {
            if source.to_string().contains("NOT_FOUND") {
                DeadError::NoQueue {
                    queue: queue.to_string(),
                }
            } else {
                DeadError::Read {
                    queue: queue.to_string(),
                    source,
                }
            }
        })
}
