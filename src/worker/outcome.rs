//! What happens to a delivery, as a pure function of what happened while processing it.

use std::time::Duration;

use crate::mail::DeadReason;

/// What processing a delivery found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    /// The provider accepted the mail.
    Sent,
    /// The attempt header could not be read, so neither could the attempt.
    MalformedAttempt { error: String },
    /// The body is not a valid mail request.
    MalformedRequest { attempt: u32, error: String },
    /// The body is larger than the worker's limit.
    TooLarge { attempt: u32, error: String },
    /// The provider refused it for good (e.g. an SMTP 5xx).
    FailedForGood { attempt: u32, error: String },
    /// It failed for now after reaching the provider (e.g. an SMTP 4xx, a connection
    /// cut mid-session, a timeout once a session was open), perhaps with the wait the
    /// provider asked for (an HTTP API's `Retry-After`).
    FailedForNow {
        attempt: u32,
        error: String,
        retry_after: Option<Duration>,
    },
    /// It failed for now before reaching the provider (e.g. a refused connection, no
    /// greeting, connecting paused): nobody saw the mail, so this was no attempt.
    NotReached { attempt: u32 },
}

/// What the worker does with the delivery before acknowledging it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ack,
    /// Publish to the retry exchange with this attempt number, in the tier of the attempt
    /// that failed, or a later one that waits at least `retry_after`.
    Park {
        next_attempt: u32,
        retry_after: Option<Duration>,
    },
    /// Publish to the dead-letter exchange with why.
    DeadLetter {
        reason: DeadReason,
        attempts: u32,
        error: String,
    },
}

/// The outcome table of the design: sent is acked; malformed, too large and
/// refused-for-good are dead-lettered at once; failed-for-now is parked until `max_attempts` is reached, then
/// given up. Attempts count sends that reached the provider: one that did not is parked
/// with its attempt unchanged, whatever it is, and so is never given up.
pub fn decide(attempted: Attempted, max_attempts: u32) -> Outcome {
    match attempted {
        Attempted::Sent => Outcome::Ack,
        Attempted::MalformedAttempt { error } => Outcome::DeadLetter {
            reason: DeadReason::Malformed,
            attempts: 0,
            error,
        },
        Attempted::MalformedRequest { attempt, error } => Outcome::DeadLetter {
            reason: DeadReason::Malformed,
            attempts: attempt,
            error,
        },
        Attempted::TooLarge { attempt, error } => Outcome::DeadLetter {
            reason: DeadReason::TooLarge,
            attempts: attempt,
            error,
        },
        Attempted::FailedForGood { attempt, error } => Outcome::DeadLetter {
            reason: DeadReason::Rejected,
            attempts: attempt,
            error,
        },
        Attempted::FailedForNow { attempt, error, .. } if attempt >= max_attempts => {
            Outcome::DeadLetter {
                reason: DeadReason::GaveUp,
                attempts: attempt,
                error,
            }
        }
        Attempted::FailedForNow {
            attempt,
            retry_after,
            ..
        } => Outcome::Park {
            next_attempt: attempt.saturating_add(1),
            retry_after,
        },
        Attempted::NotReached { attempt } => Outcome::Park {
            next_attempt: attempt,
            retry_after: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e() -> String {
        "boom".into()
    }

    #[test]
    fn the_outcome_table() {
        let cases = [
            (Attempted::Sent, Outcome::Ack),
            (
                Attempted::MalformedAttempt { error: e() },
                Outcome::DeadLetter {
                    reason: DeadReason::Malformed,
                    attempts: 0,
                    error: e(),
                },
            ),
            (
                Attempted::MalformedRequest {
                    attempt: 2,
                    error: e(),
                },
                Outcome::DeadLetter {
                    reason: DeadReason::Malformed,
                    attempts: 2,
                    error: e(),
                },
            ),
            (
                Attempted::TooLarge {
                    attempt: 2,
                    error: e(),
                },
                Outcome::DeadLetter {
                    reason: DeadReason::TooLarge,
                    attempts: 2,
                    error: e(),
                },
            ),
            (
                Attempted::FailedForGood {
                    attempt: 1,
                    error: e(),
                },
                Outcome::DeadLetter {
                    reason: DeadReason::Rejected,
                    attempts: 1,
                    error: e(),
                },
            ),
            (
                Attempted::FailedForNow {
                    attempt: 1,
                    error: e(),
                    retry_after: None,
                },
                Outcome::Park {
                    next_attempt: 2,
                    retry_after: None,
                },
            ),
            (
                Attempted::FailedForNow {
                    attempt: 4,
                    error: e(),
                    retry_after: None,
                },
                Outcome::Park {
                    next_attempt: 5,
                    retry_after: None,
                },
            ),
            (
                Attempted::FailedForNow {
                    attempt: 5,
                    error: e(),
                    retry_after: None,
                },
                Outcome::DeadLetter {
                    reason: DeadReason::GaveUp,
                    attempts: 5,
                    error: e(),
                },
            ),
            (
                Attempted::FailedForNow {
                    attempt: 9,
                    error: e(),
                    retry_after: None,
                },
                Outcome::DeadLetter {
                    reason: DeadReason::GaveUp,
                    attempts: 9,
                    error: e(),
                },
            ),
        ];
        for (attempted, expected) in cases {
            assert_eq!(decide(attempted.clone(), 5), expected, "{attempted:?}");
        }
    }

    #[test]
    fn a_send_that_never_reached_the_provider_keeps_its_attempt_and_is_never_given_up() {
        for attempt in [1, 4, 5, 9] {
            assert_eq!(
                decide(Attempted::NotReached { attempt }, 5),
                Outcome::Park {
                    next_attempt: attempt,
                    retry_after: None,
                },
                "attempt {attempt}"
            );
        }
        assert_eq!(
            decide(Attempted::NotReached { attempt: 1 }, 1),
            Outcome::Park {
                next_attempt: 1,
                retry_after: None,
            },
            "not even when one attempt is allowed"
        );
    }

    #[test]
    fn one_attempt_allowed_gives_up_at_once() {
        assert_eq!(
            decide(
                Attempted::FailedForNow {
                    attempt: 1,
                    error: e(),
                    retry_after: None,
                },
                1
            ),
            Outcome::DeadLetter {
                reason: DeadReason::GaveUp,
                attempts: 1,
                error: e()
            }
        );
    }

    #[test]
    fn the_wait_a_provider_asked_for_goes_with_the_park() {
        let wait = Some(Duration::from_secs(120));
        assert_eq!(
            decide(
                Attempted::FailedForNow {
                    attempt: 2,
                    error: e(),
                    retry_after: wait,
                },
                5
            ),
            Outcome::Park {
                next_attempt: 3,
                retry_after: wait,
            }
        );
    }
}
