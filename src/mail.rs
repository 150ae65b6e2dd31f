//! The names, headers and numbers of the retries-and-dead-letters design.
//!
//! Everything that producers, the worker, the topology and the operator agree on is
//! defined here once; other modules refer to these constants instead of spelling the
//! strings again.

use std::time::Duration;

/// The direct exchange that producers publish mail requests to.
pub const EXCHANGE: &str = "mail";
/// The quorum queue the worker consumes; also the routing key of every request.
pub const SEND_QUEUE: &str = "mail.send";
/// The routing key of a mail request, on every exchange of the pipeline.
pub const SEND_KEY: &str = "mail.send";
/// The direct exchange a request that failed for now is parked through.
pub const RETRY_EXCHANGE: &str = "mail.retry";
/// The delay queue of the first delay tier: holds a parked request for the retry delay,
/// then dead-letters it back to [`EXCHANGE`] with [`SEND_KEY`]. The further tiers'
/// queues are named by [`retry_tier_queue`].
pub const RETRY_QUEUE: &str = "mail.send.retry";
/// The most delay tiers a pipeline may have (`spec.topology.retryDelays`).
pub const MAX_RETRY_TIERS: usize = 10;

/// The delay queue of tier `tier` (1-based) of a pipeline whose first delay queue is
/// `retry_queue`: tier 1 is `retry_queue` itself (`mail.send.retry`, the one-tier
/// pipeline's name), tier n > 1 is `retry_queue.n` (`mail.send.retry.2`, …). Names carry
/// the tier's position, not its delay, so changing a delay changes a policy, never a
/// queue.
pub fn retry_tier_queue(retry_queue: &str, tier: usize) -> String {
    match tier {
        0 | 1 => retry_queue.to_string(),
        n => format!("{retry_queue}.{n}"),
    }
}

/// The tier (1-based) whose delay queue is `queue` in a pipeline whose first delay queue
/// is `retry_queue`, if it is one of the [`MAX_RETRY_TIERS`].
pub fn retry_tier_number(retry_queue: &str, queue: &str) -> Option<usize> {
    (1..=MAX_RETRY_TIERS).find(|tier| retry_tier_queue(retry_queue, *tier) == queue)
}

/// The routing key a request parked in tier `tier` is published to [`RETRY_EXCHANGE`]
/// with, in a pipeline whose requests are routed by `send_key`: tier 1 keeps `send_key`
/// (the one-tier pipeline's binding), tier n > 1 uses its queue's name.
pub fn retry_tier_key(send_key: &str, retry_queue: &str, tier: usize) -> String {
    match tier {
        0 | 1 => send_key.to_string(),
        n => retry_tier_queue(retry_queue, n),
    }
}

/// The tier (1-based) a request whose attempt `failed_attempt` failed for now is parked
/// in, with `tiers` tiers: attempt n parks in tier min(n, tiers).
pub fn retry_tier_of(failed_attempt: u32, tiers: usize) -> usize {
    let attempt = usize::try_from(failed_attempt).unwrap_or(usize::MAX);
    attempt.clamp(1, tiers.max(1))
}

/// The tier a request parks in when the provider asked it to wait `retry_after` (an HTTP
/// API's `Retry-After`), with the tiers' `delays` in order: the tier of its attempt
/// (`by_attempt`, [`retry_tier_of`]), or a later one when that one's delay is shorter
/// than the wait: the first whose delay is at least the wait, else the last. Never an
/// earlier tier than the attempt's, so a provider cannot make retries come sooner than the
/// pipeline's schedule. Without the delays (none known), the attempt's tier.
pub fn retry_tier_waiting(by_attempt: usize, delays: &[Duration], retry_after: Duration) -> usize {
    let long_enough = delays
        .iter()
        .position(|delay| *delay >= retry_after)
        .map_or(delays.len(), |index| index + 1);
    by_attempt.max(long_enough)
}
/// The name of the AMQP connection a worker holds open, as its own broker user, while
/// its provider refuses the key (RabbitMQ shows connection names in the management API):
/// how the operator learns why the workers are not ready, for the pipeline's
/// `WorkerReady` condition, without reaching into the pods.
pub const CREDENTIALS_REFUSED_CONNECTION: &str = "mailer-worker: the provider refuses the key";
/// The vhost the operator keeps its claim locks in (`topology::claim_lock`), the same
/// for every operator sharing a broker: no pipeline may name it.
pub const CLAIM_LOCK_VHOST: &str = "mailer.claim-locks";
/// The fanout exchange that requests which never will succeed are published to.
pub const DEAD_EXCHANGE: &str = "mail.dead";
/// The queue bound to [`DEAD_EXCHANGE`] that keeps dead letters for people to inspect.
pub const DEAD_QUEUE: &str = "mail.send.dead";

/// The attempt a delivery is on; absent means the first attempt.
pub const ATTEMPT_HEADER: &str = "x-mail-attempt";
/// Why a request was dead-lettered: one of [`DeadReason`].
pub const DEAD_REASON_HEADER: &str = "x-mail-dead-reason";
/// How many attempts a dead letter had (0 when its attempt header was malformed).
pub const DEAD_ATTEMPTS_HEADER: &str = "x-mail-dead-attempts";
/// The error of a dead letter's last attempt.
pub const DEAD_ERROR_HEADER: &str = "x-mail-dead-error";
/// When a request was dead-lettered: an AMQP timestamp (seconds since the Unix epoch).
pub const DEAD_AT_HEADER: &str = "x-mail-dead-at";
/// How many times `mailer dead replay` has sent a dead letter again; absent means never.
/// Unlike the other `x-mail-` headers it survives parking and dead-lettering.
pub const REPLAYS_HEADER: &str = "x-mail-replays";
/// Every header the mailer sets starts with this; a request's copies are stripped
/// before ours are set ([`REPLAYS_HEADER`] excepted).
pub const MAIL_HEADER_PREFIX: &str = "x-mail-";

/// The broker's record of each time it dead-lettered a message, newest first: an array of
/// tables with `reason`, `queue`, `time`, `count`, `exchange` and `routing-keys`.
pub const DEATH_HEADER: &str = "x-death";

/// The longest `x-mail-dead-error` value, in characters (16 KiB at most), so a header
/// frame stays far within the broker's frame size.
pub const MAX_DEAD_ERROR_CHARS: usize = 4096;

/// Attempts before a request that keeps failing for now is given up.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// Deliveries of one request from `mail.send` before the broker dead-letters it.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 5;
/// How long a parked request waits in the delay queue.
pub const DEFAULT_RETRY_DELAY: &str = "5m";
/// Unacknowledged deliveries a worker holds, and so processes, at once.
pub const DEFAULT_PREFETCH: u16 = 16;

/// The content type of a mail request.
pub const REQUEST_CONTENT_TYPE: &str = "application/json";
/// The largest request body the worker accepts unless told otherwise
/// (`MAIL_MAX_REQUEST_BYTES`, `spec.worker.maxRequestSize`); a larger one is dead-lettered
/// as [`DeadReason::TooLarge`].
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 10 * 1024 * 1024;

/// Why a request was dead-lettered: the value of [`DEAD_REASON_HEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeadReason {
    /// The request, or its attempt header, could not be understood.
    Malformed,
    /// It failed for now on every one of its attempts.
    GaveUp,
    /// The provider refused it for good (an SMTP 5xx): retrying only delays the bad news.
    Rejected,
    /// Its body is larger than the worker's limit (`MAIL_MAX_REQUEST_BYTES`): well-formed
    /// or not, this worker never reads it. Raise the limit and replay it, or drop it.
    TooLarge,
}

impl DeadReason {
    pub const ALL: [DeadReason; 4] = [
        Self::Malformed,
        Self::GaveUp,
        Self::Rejected,
        Self::TooLarge,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::GaveUp => "gave-up",
            Self::Rejected => "rejected",
            Self::TooLarge => "too-large",
        }
    }
}

impl std::fmt::Display for DeadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why RabbitMQ itself dead-lettered a message: the `reason` of an [`DEATH_HEADER`] entry.
/// A request has one of these, and no [`DEAD_REASON_HEADER`], when the broker moved it
/// to the dead exchange (e.g. from the send queue after its delivery limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BrokerDeadReason {
    /// Delivered more often than the queue's delivery limit allows.
    DeliveryLimit,
    /// Its time to live ran out.
    Expired,
    /// Dropped from the head of a queue at its length limit.
    Maxlen,
    /// A consumer rejected it without requeueing.
    Rejected,
}

impl BrokerDeadReason {
    pub const ALL: [BrokerDeadReason; 4] = [
        Self::DeliveryLimit,
        Self::Expired,
        Self::Maxlen,
        Self::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeliveryLimit => "delivery_limit",
            Self::Expired => "expired",
            Self::Maxlen => "maxlen",
            Self::Rejected => "rejected",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_n_parks_in_tier_n_up_to_the_last() {
        let four: Vec<usize> = (1..=7).map(|attempt| retry_tier_of(attempt, 4)).collect();
        assert_eq!(four, [1, 2, 3, 4, 4, 4, 4]);
        assert_eq!(retry_tier_of(1, 1), 1);
        assert_eq!(retry_tier_of(9, 1), 1);
        assert_eq!(retry_tier_of(0, 3), 1, "no attempt 0; the first tier");
        assert_eq!(retry_tier_of(u32::MAX, MAX_RETRY_TIERS), MAX_RETRY_TIERS);
    }

    #[test]
    fn a_retry_after_moves_a_request_to_the_first_tier_that_waits_long_enough() {
        let secs = Duration::from_secs;
        // 30s, 5m, 30m, 2h
        let delays = [secs(30), secs(300), secs(1800), secs(7200)];
        let tier = |by_attempt, wait| retry_tier_waiting(by_attempt, &delays, secs(wait));
        assert_eq!(tier(1, 10), 1, "a shorter wait keeps the attempt's tier");
        assert_eq!(tier(1, 30), 1, "a wait of exactly the tier's delay fits it");
        assert_eq!(tier(1, 31), 2);
        assert_eq!(tier(1, 600), 3);
        assert_eq!(tier(1, 86_400), 4, "longer than every tier: the last");
        assert_eq!(tier(3, 60), 3, "never earlier than the attempt's tier");
        assert_eq!(
            retry_tier_waiting(2, &[], secs(3600)),
            2,
            "no delays known: the attempt's tier"
        );
    }

    #[test]
    fn the_first_tier_keeps_the_one_tier_names() {
        assert_eq!(retry_tier_queue(RETRY_QUEUE, 1), RETRY_QUEUE);
        assert_eq!(retry_tier_key(SEND_KEY, RETRY_QUEUE, 1), SEND_KEY);
        assert_eq!(retry_tier_queue(RETRY_QUEUE, 2), "mail.send.retry.2");
        assert_eq!(
            retry_tier_key(SEND_KEY, RETRY_QUEUE, 10),
            "mail.send.retry.10"
        );
        assert_eq!(retry_tier_number(RETRY_QUEUE, "mail.send.retry"), Some(1));
        assert_eq!(
            retry_tier_number(RETRY_QUEUE, "mail.send.retry.10"),
            Some(10)
        );
        assert_eq!(retry_tier_number(RETRY_QUEUE, "mail.send.retry.11"), None);
        assert_eq!(retry_tier_number(RETRY_QUEUE, "mail.send.dead"), None);
    }
}
