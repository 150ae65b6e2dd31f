//! The names, headers and numbers of the retries-and-dead-letters design.
//!
//! Everything that producers, the worker, the topology and the operator agree on is
//! defined here once; other modules refer to these constants instead of spelling the
//! strings again.

/// The direct exchange that producers publish mail requests to.
pub const EXCHANGE: &str = "mail";
/// The quorum queue the worker consumes; also the routing key of every request.
pub const SEND_QUEUE: &str = "mail.send";
/// The routing key of a mail request, on every exchange of the pipeline.
pub const SEND_KEY: &str = "mail.send";
/// The direct exchange a request that failed for now is parked through.
pub const RETRY_EXCHANGE: &str = "mail.retry";
/// The delay queue: holds a parked request for the retry delay, then dead-letters it
/// back to [`EXCHANGE`] with [`SEND_KEY`].
pub const RETRY_QUEUE: &str = "mail.send.retry";
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
