//! Publishing with confirms and the mandatory flag with several publishes in flight on one
//! channel, each told exactly whether the broker returned it as unroutable.
//!
//! One channel with many publishes in flight lets the broker confirm them in batches
//! (`basic.ack` with `multiple`): on the park path that costs less CPU, here and in the
//! broker, than a channel per publish in flight (docs/benchmarks.md).
//!
//! lapin (4.12) cannot say which publish a `basic.return` was for: it hands a returned
//! message to whichever confirm it completes next, and for a `multiple` ack it completes
//! the pending tags in no particular order. So each publish is matched to a returned
//! message by what was published ([`Key`]), never by which confirm carried it:
//!
//! - Two publishes with the same key are never in flight on one lane (channel): a second
//!   one takes another lane, or waits. A returned message then names one publish.
//! - The broker sends a publish's `basic.return` before any ack covering it, and lapin
//!   handles frames in order, each completed confirm taking the oldest waiting return; so
//!   once a publish's own confirm has completed, its return (if any) is attached to a
//!   confirm that has completed too.
//! - lapin completes every tag of one ack under one lock; polling `wait_for_confirms` once
//!   takes that lock, so afterwards every confirm completed so far is visible. Then the
//!   confirm of every publish on the lane that was reserved before its own completed is
//!   looked at (a later one was handed to lapin after it, so cannot carry its return), and
//!   each returned message marks the publish whose key it carries. Only then does a
//!   publish learn its outcome. A publish leaving the lane first takes in its own confirm.
//! - lapin numbers a publish (the delivery tag its confirm waits for) and then queues its
//!   frames, two steps under two locks of its own in the first poll of `basic_publish`.
//!   Two publishes handed to it at once from two threads can go out in the other order
//!   than they were numbered, and the broker's confirm of each then completes the other's:
//!   an unroutable publish confirmed before its `basic.return` arrived would be taken for
//!   routed. So a lane's publishes are handed to lapin one at a time (every poll of
//!   `basic_publish` under the lane's numbering lock), and go out in the order numbered.
//! - Every confirm is polled only under its lane's lock, its own publish's too. A
//!   `Shared` future that one thread is polling reads as pending to another, so a look
//!   racing the owner's poll of a completed confirm would miss it, and the returned
//!   message it carried: another publish would be taken for routed, and the request it
//!   parked acked and lost.
//! - A publish given up before its confirm completed (its deadline passed, or its task was
//!   dropped) leaves a confirm that lapin still completes later, and that confirm may take
//!   another publish's returned message with it, unseen. So giving one up makes its lane
//!   *untrusted*: every publish still in flight there, and every later one, fails
//!   ([`PublishError::Untrusted`]) rather than take a missing return for routed; no new
//!   publish is placed there. The worker stops on such a failure, and the broker redelivers
//!   what was in flight (a request may be parked twice; none is lost).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel};
use tokio::sync::Notify;

use super::PublishError;
use super::publish::{publish_mandatory, within};

/// What identifies a publish among those in flight on a lane: where it went, its message
/// id and its body (by length and hash; two bodies that collide only share no lane).
///
/// The fields are compared in the order declared: those that tell two parks apart first.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    body_hash: u64,
    body_len: usize,
    message_id: Option<String>,
    exchange: String,
    routing_key: String,
}

impl Key {
    fn new(exchange: &str, routing_key: &str, message_id: Option<&str>, body: &[u8]) -> Self {
        let mut hasher = DefaultHasher::new();
        body.hash(&mut hasher);
        Self {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            message_id: message_id.map(str::to_string),
            body_len: body.len(),
            body_hash: hasher.finish(),
        }
    }
}

/// A completed confirm, as every publish on the lane may look at it.
#[derive(Clone, Debug)]
enum Confirmed {
    Done {
        ack: bool,
        /// The key of the message returned with this confirm, which may be another's.
        returned: Option<Key>,
    },
    Failed(lapin::Error),
}

impl Confirmed {
    fn of(confirmation: Result<Confirmation, lapin::Error>) -> Self {
        match confirmation {
            Ok(confirmation) => {
                let ack = confirmation.is_ack();
                let returned = confirmation.take_message().map(|m| {
                    let d = &m.delivery;
                    Key::new(
                        d.exchange.as_str(),
                        d.routing_key.as_str(),
                        d.properties.message_id().as_ref().map(|id| id.as_str()),
                        &d.data,
                    )
                });
                Self::Done { ack, returned }
            }
            Err(e) => Self::Failed(e),
        }
    }
}

type SharedConfirm = Shared<BoxFuture<'static, Confirmed>>;

struct Entry {
    id: u64,
    key: Key,
    /// None while the publish is being handed to lapin.
    confirm: Option<SharedConfirm>,
    completed: Option<Confirmed>,
    /// A returned message carried this entry's key.
    returned: bool,
    /// This entry's confirm carried a returned message that no publish in flight sent.
    stray: Option<Key>,
}

#[derive(Default)]
struct LaneState {
    next_id: u64,
    entries: Vec<Entry>,
    /// A publish was given up before its confirm completed: see the module's doc.
    untrusted: bool,
}

impl LaneState {
    /// The publish `id` leaves the lane, first taking in its own confirm if it completed
    /// (a returned message it carried is not lost); one that leaves before its own
    /// confirm completed makes the lane untrusted.
    fn leave(&mut self, id: u64) {
        let Some(index) = self.entries.iter().position(|e| e.id == id) else {
            return;
        };
        self.take_in(index);
        if self.entries[index].completed.is_none() {
            self.untrusted = true;
        }
        self.entries.remove(index);
    }

    /// Takes in every confirm of a publish numbered before `horizon` that completed so
    /// far, and marks whom each returned message was for. A confirm registered later
    /// cannot carry the return of one that completed before `horizon` was taken, and is
    /// taken in by its own publish.
    fn take_in_before(&mut self, horizon: u64) {
        for index in 0..self.count_before(horizon) {
            self.take_in(index);
        }
    }

    /// Whether every publish numbered before `horizon` has been handed to lapin: one still
    /// being handed may hold a confirm that carries the return of another.
    fn handed_before(&self, horizon: u64) -> bool {
        self.entries[..self.count_before(horizon)]
            .iter()
            .all(|e| e.confirm.is_some())
    }

    /// How many publishes in flight were numbered before `horizon`: the entries are in
    /// the order they were numbered.
    fn count_before(&self, horizon: u64) -> usize {
        self.entries.partition_point(|e| e.id < horizon)
    }

    /// Takes in the confirm of the entry at `index` if it completed, marking whom a
    /// returned message it carried was for.
    fn take_in(&mut self, index: usize) {
        let entry = &mut self.entries[index];
        if entry.completed.is_some() {
            return;
        }
        let Some(confirm) = entry.confirm.as_mut() else {
            return;
        };
        // Polled in place: lapin's completion wakes whoever awaits the publish through the
        // shared future, whichever clone is polled here.
        let mut context = Context::from_waker(Waker::noop());
        let Poll::Ready(completed) = confirm.poll_unpin(&mut context) else {
            return;
        };
        if let Confirmed::Done {
            returned: Some(key),
            ..
        } = &completed
        {
            match self.entries.iter().position(|e| e.key == *key) {
                Some(owner) => self.entries[owner].returned = true,
                None => self.entries[index].stray = Some(key.clone()),
            }
        }
        self.entries[index].completed = Some(completed);
    }
}

/// One confirming channel and the publishes in flight on it.
struct Lane {
    channel: Channel,
    /// Held while a publish is handed to lapin, so that the lane's publishes go out in the
    /// order lapin numbered them (see the module's doc).
    numbering: Mutex<()>,
    state: Mutex<LaneState>,
    /// Signalled when an entry gets its confirm or leaves.
    changed: Notify,
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn numbering(&self) -> MutexGuard<'_, ()> {
        self.numbering
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Publishes with confirms and the mandatory flag on a few channels, many in flight on each.
#[derive(Clone)]
pub struct PipelinedPublisher {
    lanes: Arc<[Lane]>,
}

/// Removes its entry from the lane when the publish ends (or is dropped), first taking in
/// its confirm if it completed, so that a returned message it carried is not lost.
struct Slot<'a> {
    lane: &'a Lane,
    id: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.lane.lock().leave(self.id);
        self.lane.changed.notify_waiters();
    }
}

impl PipelinedPublisher {
    /// `channels` must be in confirm mode, not empty, and used by nothing else. Publishes
    /// go to the first; the others take a publish only while one with the same key is in
    /// flight there.
    pub fn new(channels: Vec<Channel>) -> Self {
        Self {
            lanes: channels
                .into_iter()
                .map(|channel| Lane {
                    channel,
                    numbering: Mutex::new(()),
                    state: Mutex::new(LaneState::default()),
                    changed: Notify::new(),
                })
                .collect(),
        }
    }

    /// Publishes with the mandatory flag and returns once the broker confirmed that a queue
    /// took it, or fails after `timeout` and the allowance for its size
    /// ([`super::publish::confirm_deadline`]).
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        properties: BasicProperties,
        body: &[u8],
        timeout: Duration,
    ) -> Result<(), PublishError> {
        let published_id = properties.message_id().as_ref().map(|id| id.to_string());
        let key = Key::new(exchange, routing_key, published_id.as_deref(), body);
        let publishing = async {
            let slot = self.reserve(exchange, key).await?;
            let handing =
                publish_mandatory(&slot.lane.channel, exchange, routing_key, properties, body);
            let mut handing = std::pin::pin!(handing);
            // Polled under the lane's numbering lock: see the module's doc on why.
            let confirm = std::future::poll_fn(|cx| {
                let _numbering = slot.lane.numbering();
                handing.as_mut().poll(cx)
            })
            .await?;
            let mut confirm = async move { Confirmed::of(confirm.await) }.boxed().shared();
            {
                let mut state = slot.lane.lock();
                if let Some(entry) = state.entries.iter_mut().find(|e| e.id == slot.id) {
                    entry.confirm = Some(confirm.clone());
                }
            }
            slot.lane.changed.notify_waiters();
            // Polled under the lane's lock, as the others' publishes poll it (see the
            // module's doc on why).
            std::future::poll_fn(|cx| {
                let _polling = slot.lane.lock();
                confirm.poll_unpin(cx).map(drop)
            })
            .await;
            // Only a confirm registered before ours completed can carry our return.
            let horizon = slot.lane.lock().next_id;
            // Every tag of the ack that completed ours is completed once this takes
            // lapin's lock; the future itself is not wanted.
            let _ = slot.lane.channel.wait_for_confirms().now_or_never();
            self.outcome(&slot, horizon, exchange, published_id.as_deref())
                .await
        };
        within(timeout, body.len(), exchange, publishing).await
    }

    /// A place for `key` on the first lane where no publish with that key is in flight.
    async fn reserve(&self, exchange: &str, key: Key) -> Result<Slot<'_>, PublishError> {
        let first = self.lanes.first().ok_or_else(|| PublishError::NoChannel {
            exchange: exchange.to_string(),
        })?;
        loop {
            let changed = first.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lanes.iter().all(|lane| lane.lock().untrusted) {
                return Err(PublishError::Untrusted {
                    exchange: exchange.to_string(),
                });
            }
            for lane in self.lanes.iter() {
                let mut state = lane.lock();
                if !state.untrusted && state.entries.iter().all(|e| e.key != key) {
                    let id = state.next_id;
                    state.next_id += 1;
                    state.entries.push(Entry {
                        id,
                        key: key.clone(),
                        confirm: None,
                        completed: None,
                        returned: false,
                        stray: None,
                    });
                    return Ok(Slot { lane, id });
                }
            }
            // Every lane has one like it in flight: wait for the first lane to change.
            changed.await;
        }
    }

    /// The outcome of the publish in `slot`, whose confirm completed: once every entry on
    /// the lane older than `horizon` has its confirm, all confirms completed so far are
    /// taken in.
    async fn outcome(
        &self,
        slot: &Slot<'_>,
        horizon: u64,
        exchange: &str,
        published_id: Option<&str>,
    ) -> Result<(), PublishError> {
        loop {
            let changed = slot.lane.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = slot.lane.lock();
                if state.untrusted {
                    return Err(PublishError::Untrusted {
                        exchange: exchange.to_string(),
                    });
                }
                if state.handed_before(horizon) {
                    state.take_in_before(horizon);
                    let entry = state.entries.iter().find(|e| e.id == slot.id);
                    if let Some(entry) = entry
                        && let Some(completed) = &entry.completed
                    {
                        return verdict(entry, completed, exchange, published_id);
                    }
                }
            }
            changed.await;
        }
    }
}

fn verdict(
    entry: &Entry,
    completed: &Confirmed,
    exchange: &str,
    published_id: Option<&str>,
) -> Result<(), PublishError> {
    let exchange = exchange.to_string();
    match completed {
        Confirmed::Failed(source) => Err(PublishError::Channel {
            exchange,
            source: source.clone(),
        }),
        Confirmed::Done { ack: false, .. } => Err(PublishError::Nacked { exchange }),
        Confirmed::Done { .. } if entry.returned => Err(PublishError::Unroutable { exchange }),
        Confirmed::Done { .. } => match &entry.stray {
            // A returned message no publish in flight sent: stop rather than guess.
            Some(stray) => Err(PublishError::ReturnMismatch {
                exchange,
                published: published_id.map(str::to_string),
                returned: stray.message_id.clone(),
            }),
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, key: Key) -> Entry {
        Entry {
            id,
            key,
            confirm: None,
            completed: None,
            returned: false,
            stray: None,
        }
    }

    fn completed(done: Confirmed) -> SharedConfirm {
        async move { done }.boxed().shared()
    }

    #[test]
    fn a_returned_message_marks_the_publish_it_was_for_not_the_confirm_that_carried_it() {
        let a = Key::new("mail.retry", "mail.send", Some("a"), b"first");
        let b = Key::new("mail.retry", "mail.send", Some("b"), b"second");
        let mut state = LaneState::default();
        state.entries.push(entry(0, a.clone()));
        state.entries.push(entry(1, b.clone()));
        // lapin gave b's return to a's confirm.
        state.entries[0].confirm = Some(completed(Confirmed::Done {
            ack: true,
            returned: Some(b),
        }));
        state.entries[1].confirm = Some(completed(Confirmed::Done {
            ack: true,
            returned: None,
        }));
        state.take_in_before(u64::MAX);
        let [first, second] = &state.entries[..] else {
            panic!("two entries");
        };
        let a_verdict = verdict(first, first.completed.as_ref().unwrap(), "x", Some("a"));
        let b_verdict = verdict(second, second.completed.as_ref().unwrap(), "x", Some("b"));
        assert!(a_verdict.is_ok(), "a routed: {a_verdict:?}");
        assert!(
            matches!(b_verdict, Err(PublishError::Unroutable { .. })),
            "b returned: {b_verdict:?}"
        );
    }

    #[test]
    fn a_returned_message_that_no_publish_sent_fails_the_one_that_carried_it() {
        let a = Key::new("mail.retry", "mail.send", Some("a"), b"first");
        let other = Key::new("mail.retry", "mail.send", Some("z"), b"other");
        let mut state = LaneState::default();
        state.entries.push(entry(0, a));
        state.entries[0].confirm = Some(completed(Confirmed::Done {
            ack: true,
            returned: Some(other),
        }));
        state.take_in_before(u64::MAX);
        let e = &state.entries[0];
        let v = verdict(e, e.completed.as_ref().unwrap(), "x", Some("a"));
        assert!(
            matches!(v, Err(PublishError::ReturnMismatch { .. })),
            "{v:?}"
        );
    }

    #[test]
    fn only_confirms_numbered_before_the_horizon_are_taken_in() {
        let keys: Vec<Key> = (0..3)
            .map(|i| Key::new("e", "k", Some(&i.to_string()), b"body"))
            .collect();
        let mut state = LaneState::default();
        for (id, key) in keys.iter().enumerate() {
            state.entries.push(entry(id as u64, key.clone()));
            state.entries[id].confirm = Some(completed(Confirmed::Done {
                ack: true,
                returned: None,
            }));
        }
        // The first confirm carries the second publish's return.
        state.entries[0].confirm = Some(completed(Confirmed::Done {
            ack: true,
            returned: Some(keys[1].clone()),
        }));
        state.take_in_before(2);
        let taken: Vec<bool> = state
            .entries
            .iter()
            .map(|e| e.completed.is_some())
            .collect();
        assert_eq!(taken, [true, true, false]);
        assert!(state.entries[1].returned);
        // The third is taken in when it leaves.
        state.leave(2);
        assert!(!state.untrusted);
    }

    #[test]
    fn a_publish_given_up_before_its_confirm_makes_its_lane_untrusted() {
        let mut state = LaneState::default();
        state
            .entries
            .push(entry(0, Key::new("e", "k", Some("done"), b"1")));
        state.entries[0].confirm = Some(completed(Confirmed::Done {
            ack: true,
            returned: None,
        }));
        state
            .entries
            .push(entry(1, Key::new("e", "k", Some("pending"), b"2")));
        state.entries[1].confirm = Some(futures::future::pending().boxed().shared());
        // The one whose confirm completed leaves: the lane is still trusted.
        state.leave(0);
        assert!(!state.untrusted);
        // The one still waiting for its confirm is given up.
        state.leave(1);
        assert!(state.untrusted);
        assert!(state.entries.is_empty());
    }

    #[test]
    fn the_same_body_with_another_message_id_is_another_key() {
        let a = Key::new("e", "k", Some("a"), b"same");
        assert_eq!(a, Key::new("e", "k", Some("a"), b"same"));
        assert_ne!(a, Key::new("e", "k", Some("b"), b"same"));
        assert_ne!(a, Key::new("e", "k", Some("a"), b"other"));
        assert_ne!(a, Key::new("f", "k", Some("a"), b"same"));
    }
}
