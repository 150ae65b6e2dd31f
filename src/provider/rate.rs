//! A send rate: at most so many mails per second from one worker (`MAIL_RATE_LIMIT`,
//! which the operator sets from `spec.worker.provider.rateLimit`).
//!
//! [`RateLimited`] wraps a provider: each send waits for its turn before the provider
//! starts on it, the turns an even `1 / rate` apart in the order sends ask for them, with
//! no burst beyond one. The wait is a wait for the provider's turn like a wait for a free
//! SMTP connection: it is not part of the send's deadline (`MAIL_SEND_TIMEOUT`), nothing
//! is parked, and no attempt is spent. A delivery waits while the worker holds it, so at
//! most `prefetch` wait at once and the rest stay in the queue.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant as Clock;

use futures::future::BoxFuture;

use super::{Provider, SendError};
use crate::message::Mail;

/// The highest rate taken, in mails per second.
pub const MAX_RATE: f64 = 1_000_000.0;

/// A provider that sends at most `per_second` mails a second.
pub struct RateLimited {
    inner: Arc<dyn Provider>,
    per_second: f64,
    /// The time between two turns.
    interval: Duration,
    /// When the next turn is: the earliest a send that asks now may start.
    next: Mutex<Clock>,
}

impl RateLimited {
    /// `per_second` must be positive and finite ([`parse_rate`] checks it); a rate above
    /// [`MAX_RATE`] is taken as `MAX_RATE`.
    pub fn new(inner: Arc<dyn Provider>, per_second: f64) -> Self {
        let per_second = per_second.clamp(1.0 / 86_400.0, MAX_RATE);
        Self {
            inner,
            per_second,
            interval: Duration::from_secs_f64(1.0 / per_second),
            next: Mutex::new(Clock::now()),
        }
    }

    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    /// Waits for this send's turn.
    async fn turn(&self) {
        let turn = {
            let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
            let turn = (*next).max(Clock::now());
            *next = turn + self.interval;
            turn
        };
        tokio::time::sleep_until(turn).await;
    }
}

/// `provider`, limited to `per_second` mails a second when a rate is given.
pub fn limited(provider: Arc<dyn Provider>, per_second: Option<f64>) -> Arc<dyn Provider> {
    match per_second {
        Some(rate) => Arc::new(RateLimited::new(provider, rate)),
        None => provider,
    }
}

/// Why a rate cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("{0:?} is not a number of mails per second, e.g. 14 or 2.5")]
    NotANumber(String),
    #[error("the rate must be above 0 and at most {MAX_RATE} mails per second")]
    OutOfRange,
}

/// A rate in mails per second, e.g. `14` or `2.5`.
pub fn parse_rate(text: &str) -> Result<f64, RateError> {
    let rate: f64 = text
        .trim()
        .parse()
        .map_err(|_| RateError::NotANumber(crate::text::truncate(text, 40).into_owned()))?;
    if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) {
        return Err(RateError::OutOfRange);
    }
    Ok(rate)
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl fmt::Debug for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimited")
            .field("inner", &self.inner)
            .field("per_second", &self.per_second)
            .finish_non_exhaustive()
    }
}

impl Provider for RateLimited {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            self.turn().await;
            self.inner.send(mail).await
        })
    }

    fn send_within(&self, mail: Mail, limit: Duration) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            self.turn().await;
            self.inner.send_within(mail, limit).await
        })
    }

    fn concurrency(&self) -> Option<NonZeroUsize> {
        self.inner.concurrency()
    }

    fn paused(&self) -> Option<super::Pause> {
        self.inner.paused()
    }

    fn longest_wait(&self, waiting: u16) -> Duration {
        self.interval.saturating_mul(u32::from(waiting)) + self.inner.longest_wait(waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::discard::DiscardProvider;

    fn mail() -> Mail {
        let request =
            br#"{"from":"a@shop.example","to":["b@shop.example"],"subject":"s","text":"t"}"#;
        crate::message::parse_request(request, Some("r")).expect("a valid request")
    }

    #[tokio::test(start_paused = true)]
    async fn sends_take_turns_an_even_interval_apart_from_the_first() {
        let limited = RateLimited::new(Arc::new(DiscardProvider), 50.0);
        let started = tokio::time::Instant::now();
        let sends = (0..101).map(|_| limited.send(mail()));
        for sent in futures::future::join_all(sends).await {
            assert!(sent.is_ok());
        }
        // 101 sends: the first at once, the last 100 intervals of 20ms later.
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(limited.longest_wait(16), Duration::from_millis(16 * 20));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_for_a_turn_is_not_part_of_the_send_deadline() {
        let limited = RateLimited::new(Arc::new(DiscardProvider), 1.0);
        let limit = Duration::from_millis(100);
        let sends = (0..3).map(|_| limited.send_within(mail(), limit));
        for sent in futures::future::join_all(sends).await {
            assert_eq!(
                sent,
                Ok(()),
                "the third waited 2s for its turn, then sent in time"
            );
        }
    }

    #[test]
    fn rates_are_positive_finite_numbers() {
        assert_eq!(parse_rate("14"), Ok(14.0));
        assert_eq!(parse_rate(" 2.5 "), Ok(2.5));
        for bad in ["0", "-1", "inf", "NaN", "2e7"] {
            assert_eq!(parse_rate(bad), Err(RateError::OutOfRange), "{bad}");
        }
        assert!(matches!(parse_rate("fast"), Err(RateError::NotANumber(_))));
    }
}
