//! Failing fast while the SMTP server cannot be reached.
//!
//! When the server refuses connections (or does not answer them in time: its own timeout,
//! or the worker's send deadline, which drops the send), every send would
//! spend a connection attempt, up to the timeout, only to fail for now. After
//! [`FAILURES_BEFORE_PAUSE`] failed connects in a row the breaker pauses connecting: a
//! send that needs a new connection fails for now at once, with the last connect's
//! error, and did not reach the server ([`SendError::reached`]), so its request is parked
//! with its attempt unchanged. Once the pause is over one send tries again (the others
//! keep failing fast meanwhile); if it connects, sending resumes, else the pause doubles,
//! up to [`LONGEST_PAUSE`].
//!
//! The provider says when the pause ends ([`crate::provider::Provider::paused_until`]): the
//! worker takes no delivery while it lasts, and one at a time once it is over, so that one
//! send probes the server and the backlog stays in its queue. A pause is short beside the
//! delay queue's 5 minutes, so a server that comes back is used again within seconds.
//! Connections already open are still used.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::provider::{ErrorClass, SendError};

/// Failed connects in a row that start a pause.
pub(super) const FAILURES_BEFORE_PAUSE: u32 = 3;
/// The first pause; each failed try after it doubles it.
pub(super) const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause, which bounds how late a server that came back is noticed.
pub(super) const LONGEST_PAUSE: Duration = Duration::from_secs(10);

/// Whether a send may open a connection now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Gate {
    /// Connect.
    Connect,
    /// Do not connect: fail for now with this error.
    FailFast(SendError),
}

/// What a failed connect changed, to be logged once rather than per send.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Tripped {
    /// Nothing worth a line: still below the threshold, or already paused.
    No,
    /// Connecting is paused for this long, from now.
    Paused(Duration),
}

#[derive(Debug, Default)]
struct State {
    failures_in_row: u32,
    /// While set and in the future, sends fail fast; once past, the next send tries.
    paused_until: Option<Instant>,
    /// The error a failing-fast send reports: the last connect's, and the pause.
    fail_fast: Option<SendError>,
}

/// The breaker of one provider; see the [module documentation](self).
#[derive(Debug, Default)]
pub(super) struct ConnectBreaker {
    state: Mutex<State>,
}

impl ConnectBreaker {
    /// Whether a send may connect at `now`. When a pause is over, the first caller gets
    /// [`Gate::Connect`] and the pause is extended for everyone else while it tries, so
    /// one send probes the server at a time; a try that is dropped half-way only leaves
    /// the breaker paused until then.
    pub(super) fn gate(&self, now: Instant) -> Gate {
        let mut state = self.lock();
        let Some(until) = state.paused_until else {
            return Gate::Connect;
        };
        if now < until {
            return match &state.fail_fast {
                Some(error) => Gate::FailFast(error.clone()),
                None => Gate::Connect,
            };
        }
        let pause = pause_after(state.failures_in_row);
        state.paused_until = Some(now + pause);
        Gate::Connect
    }

    /// A connect failed for now with `error`.
    pub(super) fn failed(&self, now: Instant, error: &SendError) -> Tripped {
        let mut state = self.lock();
        state.failures_in_row = state.failures_in_row.saturating_add(1);
        if state.failures_in_row < FAILURES_BEFORE_PAUSE {
            return Tripped::No;
        }
        let pause = pause_after(state.failures_in_row);
        let was_paused = state.paused_until.is_some();
        state.paused_until = Some(now + pause);
        state.fail_fast = Some(
            SendError::for_now(
                error.class(),
                format!(
                    "{error} (connecting failed {} times in a row: not trying again for up to {})",
                    state.failures_in_row,
                    humantime::format_duration(pause)
                ),
            )
            .not_reached(),
        );
        if was_paused {
            Tripped::No
        } else {
            Tripped::Paused(pause)
        }
    }

    /// While connecting is paused, when the pause ends (or ended: the next send tries).
    pub(super) fn paused_until(&self) -> Option<Instant> {
        self.lock().paused_until
    }

    /// A connect succeeded: sends connect as usual again. True when that ends a pause.
    pub(super) fn connected(&self) -> bool {
        let mut state = self.lock();
        let was_paused = state.paused_until.is_some();
        *state = State::default();
        was_paused
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One connect through the breaker: say how it ended with [`finish`](Self::finish). One
/// that is dropped before it ended (the worker's send deadline, `MAIL_SEND_TIMEOUT`, came
/// first) counts as a connect that got no answer in time.
pub(super) struct Attempt<'a> {
    breaker: &'a ConnectBreaker,
    server: &'a str,
    ended: bool,
}

impl<'a> Attempt<'a> {
    pub(super) fn start(breaker: &'a ConnectBreaker, server: &'a str) -> Self {
        Self {
            breaker,
            server,
            ended: false,
        }
    }

    pub(super) fn finish(mut self, result: Result<(), &SendError>) {
        self.ended = true;
        match result {
            Ok(()) => {
                if self.breaker.connected() {
                    tracing::info!(server = %self.server, "the server answers again: connecting as usual");
                }
            }
            Err(error) => self.failed(error),
        }
    }

    fn failed(&self, error: &SendError) {
        if let Tripped::Paused(pause) = self.breaker.failed(Instant::now(), error) {
            tracing::warn!(
                server = %self.server,
                "{error}; sends fail for now without connecting for {} (then one tries again)",
                humantime::format_duration(pause)
            );
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.failed(&SendError::for_now(
                ErrorClass::Timeout,
                format!(
                    "{}: connecting: no greeting before the send's deadline",
                    self.server
                ),
            ));
        }
    }
}

/// The pause after `failures` failed connects in a row: [`FIRST_PAUSE`] at the
/// threshold, doubled for each failure after it, at most [`LONGEST_PAUSE`].
fn pause_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(FAILURES_BEFORE_PAUSE).min(16);
    FIRST_PAUSE
        .saturating_mul(1 << doublings)
        .min(LONGEST_PAUSE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Failure;

    fn refused() -> SendError {
        SendError::for_now(
            ErrorClass::Connect,
            "127.0.0.1:2525: connecting: Connection refused (os error 111)",
        )
    }

    fn fail_fast(gate: Gate) -> SendError {
        match gate {
            Gate::FailFast(error) => error,
            Gate::Connect => panic!("the breaker let a send connect"),
        }
    }

    #[test]
    fn connects_until_the_threshold_then_fails_fast_with_the_last_error_for_now() {
        let breaker = ConnectBreaker::default();
        let start = Instant::now();
        for _ in 1..FAILURES_BEFORE_PAUSE {
            assert_eq!(breaker.gate(start), Gate::Connect);
            assert_eq!(breaker.failed(start, &refused()), Tripped::No);
        }
        assert_eq!(breaker.gate(start), Gate::Connect);
        assert_eq!(
            breaker.failed(start, &refused()),
            Tripped::Paused(FIRST_PAUSE)
        );

        assert_eq!(breaker.paused_until(), Some(start + FIRST_PAUSE));
        let error = fail_fast(breaker.gate(start + Duration::from_millis(999)));
        assert_eq!(error.failure(), Failure::ForNow);
        assert_eq!(error.class(), ErrorClass::Connect);
        assert!(
            !error.reached(),
            "a send failing fast never reached the server"
        );
        assert_eq!(
            error.message(),
            "127.0.0.1:2525: connecting: Connection refused (os error 111) \
             (connecting failed 3 times in a row: not trying again for up to 1s)"
        );
    }

    /// A breaker paused by refused connects, and the instant its first pause is over.
    fn paused() -> (ConnectBreaker, Instant) {
        let breaker = ConnectBreaker::default();
        let start = Instant::now();
        for _ in 0..FAILURES_BEFORE_PAUSE {
            breaker.failed(start, &refused());
        }
        (breaker, start + FIRST_PAUSE)
    }

    #[test]
    fn after_a_pause_one_send_tries_while_the_others_keep_failing_fast() {
        let (breaker, over) = paused();
        assert_eq!(breaker.paused_until(), Some(over));
        assert_eq!(breaker.gate(over), Gate::Connect, "the probe");
        // The others wait while it tries.
        assert_eq!(breaker.paused_until(), Some(over + FIRST_PAUSE));
        fail_fast(breaker.gate(over));
        fail_fast(breaker.gate(over + Duration::from_millis(500)));

        // The probe fails: the pause doubles, and it is not logged again.
        assert_eq!(breaker.failed(over, &refused()), Tripped::No);
        fail_fast(breaker.gate(over + FIRST_PAUSE));
        assert_eq!(breaker.gate(over + FIRST_PAUSE * 2), Gate::Connect);

        // The next probe connects: everyone connects again, and a new run of failures
        // starts from nothing.
        assert!(breaker.connected());
        assert_eq!(breaker.paused_until(), None);
        assert_eq!(breaker.gate(over + FIRST_PAUSE * 2), Gate::Connect);
        assert!(!breaker.connected());
        assert_eq!(breaker.failed(over, &refused()), Tripped::No);
        assert_eq!(breaker.gate(over), Gate::Connect);
    }

    #[test]
    fn a_probe_that_never_reports_only_delays_the_next_one() {
        let (breaker, over) = paused();
        assert_eq!(breaker.gate(over), Gate::Connect);
        // That send was dropped before its connect ended: no failed() or connected().
        assert_eq!(breaker.gate(over + FIRST_PAUSE), Gate::Connect);
    }

    #[test]
    fn connects_dropped_by_the_send_deadline_count_as_answered_too_late() {
        let breaker = ConnectBreaker::default();
        for _ in 0..FAILURES_BEFORE_PAUSE {
            drop(Attempt::start(&breaker, "relay:25"));
        }
        let error = fail_fast(breaker.gate(Instant::now()));
        assert_eq!(error.class(), ErrorClass::Timeout);
        assert!(
            error
                .message()
                .starts_with("relay:25: connecting: no greeting before the send's deadline"),
            "{error}"
        );

        Attempt::start(&breaker, "relay:25").finish(Ok(()));
        assert_eq!(breaker.gate(Instant::now()), Gate::Connect);
    }

    #[test]
    fn the_pause_doubles_up_to_the_longest() {
        let pauses: Vec<u64> = (FAILURES_BEFORE_PAUSE..FAILURES_BEFORE_PAUSE + 6)
            .map(|failures| pause_after(failures).as_secs())
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 10, 10]);
        assert_eq!(pause_after(u32::MAX), LONGEST_PAUSE);
    }
}
