//! Pausing an API provider while it refuses our credentials.
//!
//! A 401 or 403 says the key is wrong, revoked or not allowed to send: every mail would
//! get the same answer. So after one, sends fail for now at once, without reaching the
//! provider (no attempt is spent, nothing is given up), for [`FIRST_PAUSE`]; then one
//! send tries again while the others keep failing fast. Each refusal in a row doubles the
//! pause, up to [`LONGEST_PAUSE`], so a key fixed in its Secret (and the workers rolled)
//! or restored at the provider is used again within a minute. The worker takes no
//! delivery while the pause lasts ([`Provider::paused`](super::Provider::paused)): mail
//! waits in its queue, and `/readyz` and the pipeline's `WorkerReady` condition say why.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{ErrorClass, Pause, PauseCause, SendError};

/// The pause after the first refusal.
pub(super) const FIRST_PAUSE: Duration = Duration::from_secs(5);
/// The longest pause.
pub(super) const LONGEST_PAUSE: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct State {
    refusals_in_row: u32,
    paused_until: Option<Instant>,
    /// The error a failing-fast send reports: the last refusal's.
    fail_fast: Option<SendError>,
}

/// The refusals of one provider; see the [module documentation](self).
#[derive(Debug, Default)]
pub(super) struct Refusals {
    state: Mutex<State>,
}

impl Refusals {
    /// Whether a send may go to the provider at `now`; else the error it fails with. When
    /// a pause is over, the first caller goes and the pause is extended for the others
    /// while it tries.
    pub(super) fn gate(&self, now: Instant) -> Result<(), SendError> {
        let mut state = self.lock();
        let Some(until) = state.paused_until else {
            return Ok(());
        };
        if now < until {
            return match &state.fail_fast {
                Some(error) => Err(error.clone()),
                None => Ok(()),
            };
        }
        state.paused_until = Some(now + pause_after(state.refusals_in_row));
        Ok(())
    }

    /// What a send that went to `provider` got: a refusal of our credentials starts or
    /// lengthens the pause and is returned as not reached; anything else ends a pause. A
    /// line says when a pause starts or ends.
    pub(super) fn answered(
        &self,
        provider: &dyn std::fmt::Display,
        result: Result<(), SendError>,
    ) -> Result<(), SendError> {
        let (result, change) = self.note(Instant::now(), result);
        match (change, &result) {
            (Some(Change::Paused(pause)), Err(error)) => tracing::warn!(
                %provider,
                "{error}; the provider refuses the key: no mail is sent (and no attempt spent) for {}, then one send tries again. Fix the key in the provider Secret",
                humantime::format_duration(pause)
            ),
            (Some(Change::Resumed), _) => {
                tracing::info!(%provider, "the provider takes the key again: sending as usual");
            }
            _ => {}
        }
        result
    }

    /// [`answered`](Self::answered) at `now`, and whether it started or ended a pause.
    fn note(
        &self,
        now: Instant,
        result: Result<(), SendError>,
    ) -> (Result<(), SendError>, Option<Change>) {
        let mut state = self.lock();
        match result {
            Err(error) if error.class() == ErrorClass::Auth => {
                state.refusals_in_row = state.refusals_in_row.saturating_add(1);
                let pause = pause_after(state.refusals_in_row);
                let was_paused = state.paused_until.is_some();
                state.paused_until = Some(now + pause);
                let error = error.not_reached();
                state.fail_fast = Some(
                    SendError::for_now(
                        ErrorClass::Auth,
                        format!(
                            "{error} (the provider refuses the key: not trying again for up to {})",
                            humantime::format_duration(pause)
                        ),
                    )
                    .not_reached(),
                );
                let change = (!was_paused).then_some(Change::Paused(pause));
                (Err(error), change)
            }
            other => {
                let was_paused = state.paused_until.is_some();
                *state = State::default();
                (other, was_paused.then_some(Change::Resumed))
            }
        }
    }

    pub(super) fn paused(&self) -> Option<Pause> {
        self.lock().paused_until.map(|until| Pause {
            until,
            cause: PauseCause::CredentialsRefused,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What an answer changed, to be logged once rather than per send.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    Paused(Duration),
    Resumed,
}

/// The pause after `refusals` refusals in a row: [`FIRST_PAUSE`], doubled for each
/// refusal after the first, at most [`LONGEST_PAUSE`].
fn pause_after(refusals: u32) -> Duration {
    let doublings = refusals.saturating_sub(1).min(16);
    FIRST_PAUSE
        .saturating_mul(1 << doublings)
        .min(LONGEST_PAUSE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> Result<(), SendError> {
        Err(SendError::for_now(
            ErrorClass::Auth,
            "api: HTTP 401 Unauthorized",
        ))
    }

    #[test]
    fn a_refusal_pauses_sends_without_spending_attempts_until_one_is_taken() {
        let refusals = Refusals::default();
        let start = Instant::now();
        assert_eq!(refusals.gate(start), Ok(()));
        let (result, change) = refusals.note(start, refused());
        let error = result.unwrap_err();
        assert!(!error.reached(), "a refused key spends no attempt");
        assert_eq!(change, Some(Change::Paused(FIRST_PAUSE)));
        let paused = refusals.paused().expect("paused");
        assert_eq!(paused.cause, PauseCause::CredentialsRefused);
        assert_eq!(paused.until, start + FIRST_PAUSE);

        // While paused, sends fail fast, not reached, quoting the refusal.
        let fast = refusals.gate(start + Duration::from_secs(1)).unwrap_err();
        assert!(!fast.reached() && fast.class() == ErrorClass::Auth);
        assert!(fast.message().contains("HTTP 401") && fast.message().contains("refuses the key"));

        // Once over, one send tries; a second refusal doubles the pause.
        let later = start + FIRST_PAUSE;
        assert_eq!(refusals.gate(later), Ok(()));
        assert!(
            refusals.gate(later).is_err(),
            "the others wait for the probe"
        );
        let (_, change) = refusals.note(later, refused());
        assert_eq!(change, None, "still paused: no new line");
        assert_eq!(
            refusals.paused().map(|p| p.until),
            Some(later + 2 * FIRST_PAUSE)
        );

        // A send that is taken ends the pause.
        let (result, change) = refusals.note(later, Ok(()));
        assert_eq!(result, Ok(()));
        assert_eq!(change, Some(Change::Resumed));
        assert_eq!(refusals.paused(), None);
        assert_eq!(refusals.gate(later), Ok(()));
    }

    #[test]
    fn other_failures_neither_pause_nor_change_their_attempt() {
        let refusals = Refusals::default();
        let busy = SendError::for_now(ErrorClass::TemporaryReply, "api: HTTP 503");
        let (result, change) = refusals.note(Instant::now(), Err(busy.clone()));
        assert_eq!(result, Err(busy));
        assert_eq!(change, None);
        assert_eq!(refusals.paused(), None);
    }

    #[test]
    fn pauses_double_up_to_a_minute() {
        let pauses: Vec<u64> = (1..=6).map(|n| pause_after(n).as_secs()).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 60, 60]);
    }
}
