//! The consume loop: up to `prefetch` deliveries processed at once ([`super::in_flight`]:
//! small ones in the loop's own task, large ones on tasks of their own), each acked only
//! once its outcome is settled ([`super::delivery`]).
//!
//! How it stops:
//! - SIGTERM: no new delivery; those in flight are finished within the shutdown timeout.
//! - The consuming connection is lost: nothing in flight can be acked any more, so every
//!   send in flight is abandoned at once (a send whose DATA had not ended sends nothing;
//!   one whose DATA had ended may be sent twice), the broker redelivers them all, and the
//!   worker connects again (not ready meanwhile); it exits non-zero only when it has had
//!   no broker for the reconnect timeout (`MAIL_RECONNECT_TIMEOUT`).
//! - A delivery cannot be settled (a failed park or dead-letter publish, a failed ack):
//!   it is rejected with requeue, the rest in flight are finished, and the worker exits
//!   non-zero.
//!
//! While the broker blocks the publishing connection (a memory or disk alarm) no new
//! delivery is started and `/readyz` says not ready; acks keep flowing on the other
//! connection.
//!
//! While the provider cannot be reached or refuses the key ([`Provider::paused`]) no new
//! delivery is started either, and `/readyz` says so: the backlog stays in the queue
//! instead of being parked at the broker's speed. Each time the provider's pause is over,
//! one delivery is taken while none is in flight: its send probes the provider, and when
//! it is taken the loop takes deliveries as usual again. While the key is refused the
//! worker also tells the operator so, through the broker ([`super::signal`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::Connection;
use lapin::options::BasicCancelOptions;
use tracing::{error, info, warn};

use super::config::{RetryTiers, Timeouts, send_turns};
use super::delivery::{Shared, handle};
use super::error::WorkerError;
use super::in_flight::InFlight;
use super::links::{self, Events, LinkEvent, Links, Plan};
use super::metrics::{OutcomeLabel, WorkerMetrics};
use super::park::Publisher;
use super::signal::Signal;
use crate::provider::{PauseCause, Provider};
use crate::redact::redact_url;
use crate::telemetry::Health;

/// How often an idle loop tells [`Health`] it is still turning.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// How often the loop checks that its deliveries progress before it beats.
const PROGRESS_CHECK_EVERY: Duration = Duration::from_secs(1);
/// The pause before connecting again after a loss (each connect then retries with its
/// own backoff).
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
/// What `/readyz` says while publishing is blocked.
const BLOCKED: &str =
    "the broker blocks publishing (a memory or disk alarm); no new delivery is started";
/// What `/readyz` says while the provider cannot be reached.
const PROVIDER_UNREACHABLE: &str = "the provider cannot be reached (connecting to it keeps failing); \
     no new delivery is started but one at a time to probe it";
/// What `/readyz` says while the provider refuses the key.
const PROVIDER_REFUSES_KEY: &str = "the provider refuses the key (HTTP 401 or 403): fix it in the provider Secret; \
     no new delivery is started but one at a time to probe it, and no attempt is spent";

/// What the consume loop needs, resolved and checked.
pub struct Worker {
    pub amqp_url: String,
    /// The user in `amqp_url`; parked and dead requests are published as this user.
    pub user: String,
    pub provider: Arc<dyn Provider>,
    pub max_attempts: u32,
    /// The largest request body read; a larger one is dead-lettered as `too-large`.
    pub max_request_bytes: usize,
    pub prefetch: u16,
    pub queue: String,
    pub retry_exchange: String,
    /// The delay tiers on `retry_exchange`: a request whose attempt n failed for now
    /// parks in tier min(n, tiers), or a later one its provider's `Retry-After` asks for.
    pub retry_tiers: RetryTiers,
    pub dead_exchange: String,
    pub send_key: String,
    pub timeouts: Timeouts,
}

/// Why the loop stopped taking deliveries.
enum Stop {
    Asked,
    ConsumeLost(lapin::Error),
    Failed(WorkerError),
}

impl Worker {
    /// The connection that tells the operator the provider refuses the key, while
    /// `cause` says it does ([`super::signal`]).
    fn refused_signal(&self, cause: Option<PauseCause>) -> Option<Signal> {
        (cause == Some(PauseCause::CredentialsRefused))
            .then(|| Signal::raise(&self.amqp_url, self.timeouts.connect))
    }

    /// Consumes until `shutdown` resolves (then returns `Ok` once in-flight deliveries are
    /// settled) or until something fails that a restart may fix (then `Err`). A lost
    /// connection is not such a failure: what was in flight is abandoned (the broker
    /// redelivers it), and the worker connects again, through the same address, not ready
    /// meanwhile, for up to the reconnect timeout without a broker.
    pub async fn run(
        self,
        metrics: Arc<WorkerMetrics>,
        health: Arc<Health>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), WorkerError> {
        tokio::pin!(shutdown);
        // Since when the worker has had no broker to consume from, after a loss.
        let mut lost_since: Option<Instant> = None;
        loop {
            let session = self
                .session(&metrics, &health, &mut shutdown, &mut lost_since)
                .await;
            let error = match session {
                Ok(()) => return Ok(()),
                Err(e) if e.is_connection_loss() && lost_since.is_some() => e,
                Err(e) => return Err(e),
            };
            let since = *lost_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.timeouts.reconnect {
                error!(error = %error, "no broker for longer than the reconnect timeout; the worker stops");
                return Err(error);
            }
            metrics.reconnecting();
            health.set_not_ready("reconnecting to the broker");
            warn!(error = %error, "the broker connection was lost; connecting again");
            let pause = tokio::time::sleep(RECONNECT_PAUSE);
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                () = pause => {}
            }
            health.beat();
        }
    }

    /// One session: connects, consumes until asked to stop or something fails. Connected
    /// (its consumer started), it clears `lost_since`; a loss of a connection sets it.
    async fn session(
        &self,
        metrics: &Arc<WorkerMetrics>,
        health: &Arc<Health>,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
        lost_since: &mut Option<Instant>,
    ) -> Result<(), WorkerError> {
        let plan = Plan {
            url: &self.amqp_url,
            queue: &self.queue,
            prefetch: self.prefetch,
            timeout: self.timeouts.connect,
        };
        if lost_since.is_none() {
            health.set_not_ready("connecting to the broker");
        }
        let links = tokio::select! {
            biased;
            () = shutdown.as_mut() => {
                info!("stopped before consuming");
                return Ok(());
            }
            links = links::open(&plan, health) => links?,
        };
        *lost_since = None;
        let Links {
            consume_connection,
            publish_connection,
            mut consume_events,
            mut publish_events,
            consume,
            publish,
            mut consumer,
        } = links;
        let shared = Arc::new(Shared {
            provider: self.provider.clone(),
            publisher: Publisher::new(
                publish,
                &self.user,
                &self.send_key,
                self.retry_tiers.clone(),
                &self.retry_exchange,
                &self.dead_exchange,
                self.timeouts.publish,
            ),
            max_attempts: self.max_attempts,
            max_request_bytes: self.max_request_bytes,
            metrics: metrics.clone(),
            send_timeout: self.timeouts.send,
            settle_timeout: self.timeouts.publish,
        });
        let url = redact_url(&self.amqp_url);
        info!(broker = %url, queue = %self.queue, provider = %self.provider, prefetch = self.prefetch, "consuming");
        // A provider still paused from before a reconnect holds the loop (and is told)
        // from the start.
        let paused = self.provider.paused().map(|pause| pause.cause);
        let mut holds = Holds {
            blocked: publish_connection.status().blocked(),
            provider_paused: paused,
            refused_signal: self.refused_signal(paused),
        };
        holds.show(health, metrics);

        let mut in_flight = InFlight::new();
        let turns = send_turns(self.prefetch, self.provider.concurrency());
        let bound = self
            .timeouts
            .longest_delivery(turns, self.max_request_bytes)
            + self.provider.longest_wait(self.prefetch);
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        let mut next_progress_check = Instant::now();
        let stop = loop {
            let now = Instant::now();
            // A delivery older than any it could take means the loop no longer makes
            // progress: stop beating, and /livez fails. Looked at once a second, not at
            // every turn: the heartbeat counts whole seconds.
            if now >= next_progress_check {
                if in_flight.progressing(bound, now) {
                    health.beat();
                }
                next_progress_check = now + PROGRESS_CHECK_EVERY;
            }
            let pause = self.provider.paused();
            let cause = pause.map(|pause| pause.cause);
            if cause != holds.provider_paused {
                holds.provider_paused = cause;
                match cause {
                    Some(PauseCause::Unreachable) => {
                        warn!(provider = %self.provider, "the provider cannot be reached: no new delivery is started but one at a time to probe it, each time its pause is over")
                    }
                    Some(PauseCause::CredentialsRefused) => {
                        warn!(provider = %self.provider, "the provider refuses the key: no new delivery is started but one at a time to probe it, each time its pause is over")
                    }
                    None => {
                        info!(provider = %self.provider, "the provider takes mail again: taking deliveries")
                    }
                }
                holds.refused_signal = self.refused_signal(cause);
                holds.show(health, metrics);
            }
            let until = pause.map(|pause| pause.until);
            let take = !holds.blocked && probe_due(until, now, in_flight.is_empty());
            let resume = until.filter(|until| *until > now);
            tokio::select! {
                biased;
                () = shutdown.as_mut() => {
                    info!("stopping: finishing the deliveries in flight");
                    break Stop::Asked;
                }
                Some(event) = consume_events.next() => {
                    if let LinkEvent::Lost(e) = event {
                        break Stop::ConsumeLost(e);
                    }
                }
                Some(event) = publish_events.next() => match event {
                    LinkEvent::Blocked(reason) => {
                        warn!(%reason, "the broker blocks publishing; no new delivery is started until it unblocks");
                        holds.blocked = true;
                        holds.show(health, metrics);
                    }
                    LinkEvent::Unblocked => {
                        info!("the broker unblocked publishing");
                        holds.blocked = false;
                        holds.show(health, metrics);
                    }
                    LinkEvent::Lost(e) => break Stop::Failed(WorkerError::PublishLost(e)),
                },
                Some(failure) = in_flight.next() => {
                    if let Some(e) = failure {
                        break Stop::Failed(e.into());
                    }
                }
                next = consumer.next(), if take => match next {
                    Some(Ok(delivery)) => {
                        in_flight.start(delivery.data.len(), handle(delivery, shared.clone()));
                    }
                    Some(Err(e)) => break Stop::ConsumeLost(e),
                    None => break Stop::Failed(WorkerError::ConsumerCancelled { queue: self.queue.clone() }),
                },
                // The provider's pause is over: take a delivery to probe it.
                () = sleep_until(resume), if resume.is_some() => {}
                _ = heartbeat.tick() => {}
            }
        };
        health.set_not_ready("stopping");

        let result = match stop {
            Stop::ConsumeLost(source) => {
                let abandoned = abandon(&mut in_flight, metrics).await;
                Err(WorkerError::ConsumeLost { source, abandoned })
            }
            Stop::Asked | Stop::Failed(_) => {
                // Take no more deliveries; those received but not started go back to the
                // queue when the channel closes.
                let cancel = consume.basic_cancel(consumer.tag(), BasicCancelOptions::default());
                let _ = tokio::time::timeout(self.timeouts.publish, cancel).await;
                let drained = drain(
                    &mut in_flight,
                    &mut consume_events,
                    metrics,
                    self.timeouts.shutdown,
                )
                .await;
                match stop {
                    Stop::Failed(e) => Err(e),
                    _ => drained,
                }
            }
        };
        // A connection that is gone makes this a loss the worker outlives, whatever
        // failure it caused first (a park that could not be published on it, say).
        let connected =
            consume_connection.status().connected() && publish_connection.status().connected();
        let close = self.timeouts.publish;
        close_all(&[&consume_connection, &publish_connection], close).await;
        match result {
            Err(e) if !connected || e.is_connection_loss() => {
                *lost_since = Some(Instant::now());
                Err(e)
            }
            Err(e) => {
                error!(error = %e, "the worker stops");
                Err(e)
            }
            ok => ok,
        }
    }
}

/// What keeps the loop from starting new deliveries, as `/readyz` and the gauges say.
struct Holds {
    /// The broker blocks the publishing connection.
    blocked: bool,
    /// The provider cannot be reached, or refuses the key.
    provider_paused: Option<PauseCause>,
    /// Held while the provider refuses the key, so the operator can tell
    /// ([`super::signal`]).
    refused_signal: Option<Signal>,
}

impl Holds {
    /// Marks the worker ready or not, and sets the gauges.
    fn show(&self, health: &Health, metrics: &WorkerMetrics) {
        metrics.set_blocked(self.blocked);
        metrics.set_provider_paused(self.provider_paused.is_some());
        match (self.blocked, self.provider_paused) {
            (true, _) => health.set_not_ready(BLOCKED),
            (false, Some(PauseCause::Unreachable)) => health.set_not_ready(PROVIDER_UNREACHABLE),
            (false, Some(PauseCause::CredentialsRefused)) => {
                health.set_not_ready(PROVIDER_REFUSES_KEY);
            }
            (false, None) => health.set_ready(true),
        }
    }
}

/// Whether the provider takes a delivery now: always while it is not paused; while it is,
/// one at a time once its pause is over (`idle`: none is in flight), to probe it.
fn probe_due(paused_until: Option<Instant>, now: Instant, idle: bool) -> bool {
    match paused_until {
        None => true,
        Some(until) => until <= now && idle,
    }
}

async fn abandon(in_flight: &mut InFlight, metrics: &WorkerMetrics) -> usize {
    let abandoned = in_flight.abandon().await;
    for _ in 0..abandoned {
        metrics.settled(OutcomeLabel::Abandoned);
    }
    abandoned
}

/// Waits for deliveries in flight to settle, at most `timeout`; abandons them at once
/// when the consuming connection is lost meanwhile.
async fn drain(
    in_flight: &mut InFlight,
    consume_events: &mut Events,
    metrics: &WorkerMetrics,
    timeout: Duration,
) -> Result<(), WorkerError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut first_error = None;
    loop {
        tokio::select! {
            next = in_flight.next() => match next {
                Some(Some(e)) => {
                    first_error.get_or_insert(e);
                }
                Some(None) => {}
                None => break,
            },
            Some(LinkEvent::Lost(source)) = consume_events.next() => {
                let abandoned = abandon(in_flight, metrics).await;
                return Err(WorkerError::ConsumeLost { source, abandoned });
            }
            () = tokio::time::sleep_until(deadline) => {
                let left = abandon(in_flight, metrics).await;
                return Err(WorkerError::ShutdownTimeout(left));
            }
        }
    }
    first_error.map_or(Ok(()), |e| Err(e.into()))
}

/// Closes the connections (and so their channels), each within `timeout`.
async fn close_all(connections: &[&Connection], timeout: Duration) {
    for connection in connections {
        let _ =
            tokio::time::timeout(timeout, connection.close(200, "worker stopping".into())).await;
    }
}

/// Sleeps until `until`, or forever without one. Built only when polled, so a loop turn
/// without a pause to wait out creates no timer.
async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_provider_takes_one_delivery_at_a_time_once_its_pause_is_over() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        assert!(probe_due(None, now, false), "not paused: as many as come");
        assert!(!probe_due(Some(later), now, true), "paused");
        assert!(probe_due(Some(now), now, true), "the pause is over");
        assert!(
            !probe_due(Some(now - Duration::from_secs(1)), now, false),
            "one probe at a time"
        );
    }

    #[test]
    fn readiness_says_what_holds_the_loop() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = WorkerMetrics::register(&mut registry);
        let health = Health::new(Duration::from_secs(60));
        let mut holds = Holds {
            blocked: false,
            provider_paused: Some(PauseCause::Unreachable),
            refused_signal: None,
        };
        holds.show(&health, &metrics);
        assert!(!health.is_ready());
        assert!(
            health
                .not_ready_because()
                .starts_with("the provider cannot be reached")
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("\nmailer_worker_provider_paused 1\n"),
            "{text}"
        );
        holds.blocked = true;
        holds.show(&health, &metrics);
        assert_eq!(health.not_ready_because(), BLOCKED, "the alarm says more");
        holds.blocked = false;
        holds.provider_paused = Some(PauseCause::CredentialsRefused);
        holds.show(&health, &metrics);
        assert!(
            health
                .not_ready_because()
                .starts_with("the provider refuses the key")
        );
        holds.provider_paused = None;
        holds.show(&health, &metrics);
        assert!(health.is_ready());
    }
}
