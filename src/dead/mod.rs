//! `mailer dead`: list, inspect, replay and purge a pipeline's dead letters, without
//! losing, reordering or duplicating any (but the one in flight when a replay is killed).
//!
//! Reading is a [`queue::DeadQueue::pass`]; what a dead letter says about itself is a
//! [`letter::DeadLetter`]; which ones a command acts on is a [`filter::Filter`].

pub mod filter;
pub mod inspect;
pub mod letter;
pub mod limit;
pub mod purge;
pub mod queue;
pub mod render;
pub mod replay;
pub mod show;
pub mod value;

pub use filter::Filter;
pub use letter::DeadLetter;
pub use queue::{DeadQueue, Pass, Verdict};

use std::time::SystemTime;

use lapin::message::Delivery;

use crate::amqp::{ConnectError, PublishError};

/// Where a pipeline's dead letters are, and where a replay sends them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The broker and the pipeline's vhost.
    pub amqp_url: String,
    /// The broker's management API, to check the dead queue's delivery limit with;
    /// `None` for the one beside the AMQP listener ([`limit::management_beside`]).
    pub management_url: Option<String>,
    pub dead_queue: String,
    /// The exchange producers publish requests to.
    pub exchange: String,
    /// The routing key of a request.
    pub send_key: String,
}

/// Why a `mailer dead` command could not finish.
#[derive(Debug, thiserror::Error)]
pub enum DeadError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(
        "there is no queue {queue} in the vhost: check the pipeline file (or --queue) and the vhost of the AMQP URL"
    )]
    NoQueue { queue: String },
    #[error("cannot read {queue}: {source} (the user needs read permission on it)")]
    Read { queue: String, source: lapin::Error },
    #[error("the broker cancelled the read of {queue}: was the queue deleted?")]
    Cancelled { queue: String },
    #[error(
        "{done}, then stopped at {message_id}: {source}; it and the rest are still in the dead queue"
    )]
    Replay {
        done: String,
        message_id: String,
        source: PublishError,
    },
    #[error("{0}")]
    Interrupted(String),
    #[error(
        "will not read queue {queue:?} in vhost {vhost:?}: its delivery limit is {limit} ({why}), so every read would bring each dead letter closer to being dropped. {advice}"
    )]
    DeliveryLimit {
        queue: String,
        vhost: String,
        limit: i64,
        why: String,
        advice: String,
    },
    #[error(
        "will not read queue {queue:?} in vhost {vhost:?} on RabbitMQ {version}: its delivery limit could not be checked ({reason}), and every read of a queue whose limit is finite (RabbitMQ 4 sets 20 unless a policy lifts it) brings each dead letter closer to being dropped. Pass --management-url (or RABBITMQ_MANAGEMENT_URL) with a user that may read the queue there, then run this again."
    )]
    LimitUnchecked {
        queue: String,
        vhost: String,
        version: String,
        reason: String,
    },
    #[error("{0}")]
    BadManagementUrl(String),
    #[error("no dead letter in {queue} has message id {message_id:?} ({read} read)")]
    NotFound {
        queue: String,
        message_id: String,
        read: usize,
    },
}

/// What a pass over the dead letters that match a filter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matched {
    pub pass: Pass,
    /// How many dead letters matched and were handed on.
    pub matched: usize,
}

/// Connects to the dead queue of `target`, once [`limit::check`] found that reading it
/// cannot drop a dead letter; says on standard error when that could not be checked.
pub async fn open_checked(target: &Target) -> Result<DeadQueue, DeadError> {
    let queue = DeadQueue::open(&target.amqp_url, &target.dead_queue).await?;
    match limit::check(target).await {
        Ok(limit::Checked::Unlimited) => {}
        Ok(limit::Checked::Unchecked { version, reason }) => eprintln!(
            "warning: the delivery limit of {} could not be checked ({reason}); reading it anyway, since RabbitMQ {version} sets none unless a policy or the queue's x-delivery-limit does. Pass --management-url to check it",
            target.dead_queue
        ),
        Err(e) => {
            queue.close().await;
            return Err(e);
        }
    }
    Ok(queue)
}

/// Reads `queue` once, handing every dead letter that matches `filter`, up to its limit,
/// to `act`, which says what becomes of it; every other one is left where it is.
pub async fn for_each_match(
    queue: &DeadQueue,
    filter: &Filter,
    mut act: impl AsyncFnMut(&Delivery, DeadLetter) -> Result<Verdict, DeadError>,
) -> Result<Matched, DeadError> {
    let now = SystemTime::now();
    let mut matched = 0;
    let pass = queue
        .pass(queue::WINDOW, async |delivery| {
            if filter.is_full(matched) {
                return Ok(Verdict::Stop);
            }
            let letter = DeadLetter::read(&delivery.properties, &delivery.data);
            if !filter.matches(&letter, now) {
                return Ok(Verdict::Keep);
            }
            matched += 1;
            act(delivery, letter).await
        })
        .await?;
    warn_about(&pass, &queue.name);
    Ok(Matched { pass, matched })
}

/// Says on standard error what a pass could not see or do, so a short list is never
/// taken for the whole queue.
fn warn_about(pass: &Pass, queue: &str) {
    let others = pass.depth.consumers;
    if others > 0 {
        eprintln!(
            "warning: {others} other consumer(s) on {queue}: the dead letters they hold were not read, and they may take the ones read when they are put back"
        );
    }
    if pass.missed > 0 {
        eprintln!(
            "warning: {} counted at the start never came: another consumer took them",
            value::dead_letters(pass.missed)
        );
    }
    if !pass.put_back {
        eprintln!(
            "warning: the broker has not yet confirmed that it took back the dead letters read; they are not lost, but a command run at once may not see them all"
        );
    }
}
