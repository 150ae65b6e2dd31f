//! The consume loop: up to `prefetch` deliveries processed at once, each acked only once
//! its outcome is settled. A park or dead-letter publish that fails stops the worker
//! without acking that delivery, so the broker redelivers it and the send queue's
//! delivery limit catches a request that fails every time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info, warn};

use super::attempt::attempt_of;
use super::config::Timeouts;
use super::metrics::{OutcomeLabel, WorkerMetrics};
use super::outcome::{Attempted, Outcome, decide};
use super::publish::Publisher;
use crate::amqp::{ConnectError, PublishError, connect};
use crate::message::parse_request;
use crate::provider::Provider;
use crate::redact::redact_url;
use crate::telemetry::Health;

/// How often an idle loop tells [`Health`] it is still turning.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// What the consume loop needs, resolved and checked.
pub struct Worker {
    pub amqp_url: String,
    /// The user in `amqp_url`; parked and dead requests are published as this user.
    pub user: String,
    pub provider: Arc<dyn Provider>,
    pub max_attempts: u32,
    pub prefetch: u16,
    pub queue: String,
    pub retry_exchange: String,
    pub dead_exchange: String,
    pub send_key: String,
    pub timeouts: Timeouts,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(
        "cannot consume {queue}: {source}; does the queue exist (mailer topology apply creates it) and may this user read it?"
    )]
    Consume { queue: String, source: lapin::Error },
    #[error("the broker connection failed: {0}")]
    Channel(#[from] lapin::Error),
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

/// Why one delivery could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("acknowledging it failed: {0}")]
    Ack(lapin::Error),
}

/// State shared by every delivery's task.
struct Shared {
    provider: Arc<dyn Provider>,
    publisher: Publisher,
    max_attempts: u32,
    metrics: Arc<WorkerMetrics>,
}

impl Worker {
    /// Consumes until `shutdown` resolves (then returns `Ok` once in-flight deliveries are
    /// settled) or until something fails that a restart may fix (then `Err`).
    pub async fn run(
        self,
        metrics: Arc<WorkerMetrics>,
        health: Arc<Health>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), WorkerError> {
        let url = redact_url(&self.amqp_url);
        let connection = connect(&self.amqp_url, "mailer-worker", self.timeouts.connect).await?;
        let consume = connection.create_channel().await?;
        consume
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await?;
        let publish = connection.create_channel().await?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let mut consumer = consume
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|source| WorkerError::Consume {
                queue: self.queue.clone(),
                source,
            })?;
        let shared = Arc::new(Shared {
            provider: self.provider.clone(),
            publisher: Publisher::new(
                publish,
                &self.user,
                &self.send_key,
                &self.retry_exchange,
                &self.dead_exchange,
                self.timeouts.publish,
            ),
            max_attempts: self.max_attempts,
            metrics: metrics.clone(),
        });
        info!(broker = %url, queue = %self.queue, provider = %self.provider, prefetch = self.prefetch, "consuming");
        health.set_ready(true);

        let mut in_flight: JoinSet<Result<(), SettleError>> = JoinSet::new();
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        tokio::pin!(shutdown);
        let stopped: Result<(), WorkerError> = loop {
            health.beat();
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    info!("stopping: finishing the deliveries in flight");
                    break Ok(());
                }
                Some(done) = in_flight.join_next() => {
                    if let Some(e) = task_failure(done) {
                        break Err(e.into());
                    }
                }
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        let shared = shared.clone();
                        in_flight.spawn(async move { process(delivery, &shared).await });
                    }
                    Some(Err(e)) => break Err(WorkerError::Channel(e)),
                    None => break Err(WorkerError::ConsumerCancelled { queue: self.queue.clone() }),
                },
                _ = heartbeat.tick() => {}
            }
        };
        health.set_ready(false);

        // Take no more deliveries; those received but not started go back to the queue
        // when the channel closes.
        let _ = consume
            .basic_cancel(consumer.tag(), BasicCancelOptions::default())
            .await;
        let drained = drain(&mut in_flight, self.timeouts.shutdown).await;
        let _ = consume.close(200, "worker stopping".into()).await;
        let _ = connection.close(200, "worker stopping".into()).await;
        stopped?;
        drained
    }
}

/// Waits for deliveries in flight to settle, at most `timeout`.
async fn drain(
    in_flight: &mut JoinSet<Result<(), SettleError>>,
    timeout: Duration,
) -> Result<(), WorkerError> {
    let deadline = Instant::now() + timeout;
    let mut first_error = None;
    while !in_flight.is_empty() {
        match tokio::time::timeout_at(deadline.into(), in_flight.join_next()).await {
            Ok(Some(done)) => {
                if let Some(e) = task_failure(done) {
                    first_error.get_or_insert(e);
                }
            }
            Ok(None) => break,
            Err(_) => {
                let left = in_flight.len();
                in_flight.abort_all();
                return Err(WorkerError::ShutdownTimeout(left));
            }
        }
    }
    first_error.map_or(Ok(()), |e| Err(e.into()))
}

fn task_failure(
    done: Result<Result<(), SettleError>, tokio::task::JoinError>,
) -> Option<SettleError> {
    match done {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        // A panicking task never acked its delivery; the broker redelivers it.
        Err(e) => {
            warn!(error = %e, "a delivery's task ended abnormally");
            None
        }
    }
}

/// Processes one delivery to its settled outcome.
async fn process(delivery: Delivery, shared: &Shared) -> Result<(), SettleError> {
    let message_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string());
    let span = tracing::info_span!(
        "delivery",
        message_id = message_id.as_deref().unwrap_or(""),
        attempt = tracing::field::Empty
    );
    async {
        let _in_flight = InFlight::enter(&shared.metrics);
        let attempted = attempt(&delivery, message_id.as_deref(), shared).await;
        let outcome = decide(attempted, shared.max_attempts);
        settle(&delivery, outcome, shared).await
    }
    .instrument(span)
    .await
}

/// Reads the attempt and the request, and sends the mail.
async fn attempt(delivery: &Delivery, message_id: Option<&str>, shared: &Shared) -> Attempted {
    let attempt = match attempt_of(delivery.properties.headers().as_ref()) {
        Ok(attempt) => attempt,
        Err(e) => {
            return Attempted::MalformedAttempt {
                error: format!("malformed request: {e}"),
            };
        }
    };
    tracing::Span::current().record("attempt", attempt);
    let mail = match parse_request(&delivery.data, message_id) {
        Ok(mail) => mail,
        Err(e) => {
            return Attempted::MalformedRequest {
                attempt,
                error: format!("malformed request: {e}"),
            };
        }
    };
    let started = Instant::now();
    let sent = shared.provider.send(&mail).await;
    shared.metrics.send_took(started.elapsed().as_secs_f64());
    match sent {
        Ok(()) => Attempted::Sent,
        Err(e) => {
            shared.metrics.provider_error(e.class().as_str());
            let error = e.to_string();
            if e.is_for_good() {
                Attempted::FailedForGood { attempt, error }
            } else {
                Attempted::FailedForNow { attempt, error }
            }
        }
    }
}

/// Carries out `outcome`, acking only once it took.
async fn settle(delivery: &Delivery, outcome: Outcome, shared: &Shared) -> Result<(), SettleError> {
    let published = match &outcome {
        Outcome::Ack => Ok(()),
        Outcome::Park { next_attempt } => {
            shared
                .publisher
                .park(&delivery.properties, &delivery.data, *next_attempt)
                .await
        }
        Outcome::DeadLetter {
            reason,
            attempts,
            error,
        } => {
            shared
                .publisher
                .dead_letter(
                    &delivery.properties,
                    &delivery.data,
                    *reason,
                    *attempts,
                    error,
                )
                .await
        }
    };
    if let Err(e) = published {
        shared.metrics.settled(OutcomeLabel::PublishFailed);
        warn!(error = %e, "could not settle the delivery; leaving it unacknowledged");
        return Err(e.into());
    }
    delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .map_err(SettleError::Ack)?;
    match outcome {
        Outcome::Ack => {
            shared.metrics.settled(OutcomeLabel::Sent);
            debug!("sent");
        }
        Outcome::Park { next_attempt } => {
            shared.metrics.settled(OutcomeLabel::Parked);
            info!(next_attempt, "failed for now; parked for a later attempt");
        }
        Outcome::DeadLetter {
            reason,
            attempts,
            error,
        } => {
            shared.metrics.dead_lettered(reason);
            warn!(%reason, attempts, %error, "dead-lettered");
        }
    }
    Ok(())
}

/// Counts a delivery in the in-flight gauge for as long as it lives.
struct InFlight<'a>(&'a WorkerMetrics);

impl<'a> InFlight<'a> {
    fn enter(metrics: &'a WorkerMetrics) -> Self {
        metrics.in_flight().inc();
        Self(metrics)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight().dec();
    }
}
