//! One delivery, from its bytes to its settled outcome: read, send, then ack, park or
//! dead-letter it. A delivery is acked only once its outcome took; when it cannot be
//! settled it is rejected with requeue (the one return that RabbitMQ 3.x and 4.x both
//! count toward the delivery limit) and the worker stops.

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use lapin::Acker;
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicRejectOptions};
use tracing::{Instrument, debug, error, warn};

use super::attempt::attempt_of;
use super::metrics::{OutcomeLabel, WorkerMetrics};
use super::outcome::{Attempted, Outcome, decide};
use super::park::Publisher;
use crate::amqp::PublishError;
use crate::message::{read_request, size, unique_id};
use crate::provider::Provider;

/// State shared by every delivery in flight.
pub struct Shared {
    pub provider: Arc<dyn Provider>,
    pub publisher: Publisher,
    pub max_attempts: u32,
    /// The largest request body read; a larger one is dead-lettered as `too-large`.
    pub max_request_bytes: usize,
    pub metrics: Arc<WorkerMetrics>,
    /// The deadline of one send, the whole SMTP transaction (not the wait for a free
    /// connection: [`Provider::send_within`]).
    pub send_timeout: Duration,
    /// The deadline of an ack or a reject.
    pub settle_timeout: Duration,
}

/// Why one delivery could not be settled: the worker stops.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error("{0}; the delivery was rejected with requeue")]
    Publish(#[from] PublishError),
    #[error("acknowledging it failed: {0}")]
    Ack(lapin::Error),
    #[error("its channel no longer takes acknowledgements (the connection was lost?)")]
    AckRefused,
    #[error("{what} it took longer than {}", humantime::format_duration(*after))]
    Timeout { what: &'static str, after: Duration },
    #[error("rejecting it with requeue failed: {0}")]
    Requeue(String),
}

/// Processes one delivery to its settled outcome. A panic while processing it rejects it
/// with requeue and is counted, so it never holds a prefetch slot.
pub async fn handle(delivery: Delivery, shared: Arc<Shared>) -> Result<(), SettleError> {
    let acker = delivery.acker.clone();
    match AssertUnwindSafe(process(delivery, &shared))
        .catch_unwind()
        .await
    {
        Ok(settled) => settled,
        Err(panic) => {
            shared.metrics.settled(OutcomeLabel::Panicked);
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            error!(panic = %what, "processing a delivery panicked; rejecting it with requeue");
            requeue(&acker, shared.settle_timeout).await
        }
    }
}

async fn process(mut delivery: Delivery, shared: &Shared) -> Result<(), SettleError> {
    // The request's bytes, taken without a copy and shared with the mail until it is sent.
    let request = Bytes::from(std::mem::take(&mut delivery.data));
    // A request without a message id gets one now, kept when it is parked, so that every
    // attempt sends the same Message-ID.
    let generated = delivery.properties.message_id().is_none().then(unique_id);
    let message_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str())
        .or(generated.as_deref())
        .unwrap_or_default();
    // At debug level only: at the default level a span would format its fields for each
    // delivery, and the lines logged at info and above carry the message id themselves.
    let span = tracing::debug_span!("delivery", message_id, attempt = tracing::field::Empty);
    async {
        let _in_flight = InFlightGauge::enter(&shared.metrics);
        let attempted = attempt(&delivery, request.clone(), message_id, shared).await;
        let outcome = decide(attempted, shared.max_attempts);
        let request = Request {
            delivery: &delivery,
            bytes: request,
            message_id,
            generated_id: generated.as_deref(),
        };
        settle(request, outcome, shared).await
    }
    .instrument(span)
    .await
}

/// A delivery being settled: its request's bytes, and its message id.
struct Request<'a> {
    delivery: &'a Delivery,
    bytes: Bytes,
    message_id: &'a str,
    /// The id given to a request that came without one, to park it with.
    generated_id: Option<&'a str>,
}

impl Request<'_> {
    /// The properties to republish the request with: its own, with the generated
    /// message id when it had none (the one clone, only on that rare path).
    fn properties(&self) -> Cow<'_, BasicProperties> {
        match self.generated_id {
            Some(id) => Cow::Owned(self.delivery.properties.clone().with_message_id(id.into())),
            None => Cow::Borrowed(&self.delivery.properties),
        }
    }
}

/// Reads the attempt and the request, and sends the mail.
async fn attempt(
    delivery: &Delivery,
    request: Bytes,
    message_id: &str,
    shared: &Shared,
) -> Attempted {
    let attempt = match attempt_of(delivery.properties.headers().as_ref()) {
        Ok(attempt) => attempt,
        Err(e) => {
            return Attempted::MalformedAttempt {
                error: format!("malformed request: {e}"),
            };
        }
    };
    tracing::Span::current().record("attempt", attempt);
    if let Err(e) = size::check(request.len(), shared.max_request_bytes) {
        return Attempted::TooLarge {
            attempt,
            error: format!("{e} (MAIL_MAX_REQUEST_BYTES)"),
        };
    }
    let mail = match read_request(request, Some(message_id)) {
        Ok(mail) => mail,
        Err(e) => {
            return Attempted::MalformedRequest {
                attempt,
                error: format!("malformed request: {e}"),
            };
        }
    };
    let started = Instant::now();
    let sent = shared.provider.send_within(mail, shared.send_timeout).await;
    shared.metrics.send_took(started.elapsed().as_secs_f64());
    match sent {
        Ok(()) => Attempted::Sent,
        Err(e) => {
            shared.metrics.provider_error(e.class().as_str());
            if e.is_for_good() {
                Attempted::FailedForGood {
                    attempt,
                    error: e.to_string(),
                }
            } else if !e.reached() {
                debug!(error = %e, "the send did not reach the provider; its attempt does not count");
                Attempted::NotReached { attempt }
            } else {
                Attempted::FailedForNow {
                    attempt,
                    error: e.to_string(),
                    retry_after: e.retry_after(),
                }
            }
        }
    }
}

/// Carries out `outcome`, acking only once it took.
async fn settle(
    request: Request<'_>,
    outcome: Outcome,
    shared: &Shared,
) -> Result<(), SettleError> {
    let published = match &outcome {
        Outcome::Ack => Ok(()),
        Outcome::Park {
            next_attempt,
            retry_after,
        } => {
            shared
                .publisher
                .park(
                    &request.properties(),
                    &request.bytes,
                    *next_attempt,
                    *retry_after,
                )
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
                    &request.properties(),
                    &request.bytes,
                    *reason,
                    *attempts,
                    error,
                )
                .await
        }
    };
    let Request {
        delivery,
        bytes,
        message_id,
        ..
    } = request;
    // Settled or not, the request's bytes are not needed any more.
    drop(bytes);
    if let Err(e) = published {
        shared.metrics.settled(OutcomeLabel::PublishFailed);
        warn!(message_id, error = %e, "could not settle the delivery; rejecting it with requeue and stopping");
        requeue(&delivery.acker, shared.settle_timeout).await?;
        return Err(e.into());
    }
    if let Err(e) = ack(&delivery.acker, shared.settle_timeout).await {
        shared.metrics.settled(OutcomeLabel::AckFailed);
        return Err(e);
    }
    match outcome {
        Outcome::Ack => {
            shared.metrics.settled(OutcomeLabel::Sent);
            debug!("sent");
        }
        Outcome::Park { next_attempt, .. } => {
            // Counted in mailer_worker_deliveries_total{outcome="parked"}; a line each
            // only at debug, since a provider that is down parks every request.
            shared.metrics.settled(OutcomeLabel::Parked);
            debug!(
                message_id,
                next_attempt, "failed for now; parked for a later attempt"
            );
        }
        Outcome::DeadLetter {
            reason,
            attempts,
            error,
        } => {
            shared.metrics.dead_lettered(reason);
            warn!(message_id, %reason, attempts, %error, "dead-lettered");
        }
    }
    Ok(())
}

/// Acks, and says so only when the broker's channel took it: lapin answers `Ok(false)`
/// for a delivery whose channel is gone, which the broker will redeliver.
async fn ack(acker: &Acker, timeout: Duration) -> Result<(), SettleError> {
    match tokio::time::timeout(timeout, acker.ack(BasicAckOptions::default())).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(SettleError::AckRefused),
        Ok(Err(e)) => Err(SettleError::Ack(e)),
        Err(_) => Err(SettleError::Timeout {
            what: "acknowledging",
            after: timeout,
        }),
    }
}

/// Gives the delivery back to the broker, which counts it toward the delivery limit.
async fn requeue(acker: &Acker, timeout: Duration) -> Result<(), SettleError> {
    let options = BasicRejectOptions { requeue: true };
    match tokio::time::timeout(timeout, acker.reject(options)).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(SettleError::Requeue(
            "its channel is gone; the broker requeues it anyway".into(),
        )),
        Ok(Err(e)) => Err(SettleError::Requeue(e.to_string())),
        Err(_) => Err(SettleError::Timeout {
            what: "rejecting",
            after: timeout,
        }),
    }
}

/// Counts a delivery in the in-flight gauge for as long as it lives.
struct InFlightGauge<'a>(&'a WorkerMetrics);

impl<'a> InFlightGauge<'a> {
    fn enter(metrics: &'a WorkerMetrics) -> Self {
        metrics.in_flight().inc();
        Self(metrics)
    }
}

impl Drop for InFlightGauge<'_> {
    fn drop(&mut self) {
        self.0.in_flight().dec();
    }
}
