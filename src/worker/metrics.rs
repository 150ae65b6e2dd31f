//! The worker's Prometheus metrics. Every label value comes from a small fixed set.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::mail::DeadReason;

/// Defines [`OutcomeLabel`], its label values and [`OutcomeLabel::ALL`] from one list, so
/// that no variant can be missing from `ALL`.
macro_rules! outcome_labels {
    ($($(#[$doc:meta])* $variant:ident => $value:literal,)*) => {
        /// How a delivery was settled: the `outcome` label of `mailer_worker_deliveries_total`.
        #[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
        pub enum OutcomeLabel {
            $($(#[$doc])* $variant,)*
        }

        impl OutcomeLabel {
            /// Every outcome, in the order declared.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $value,)*
                }
            }
        }
    };
}

outcome_labels! {
    Sent => "sent",
    Parked => "parked",
    DeadLettered => "dead_lettered",
    /// The park or dead-letter publish failed; the delivery goes back to the broker.
    /// Not the design's "failed for now", which is `parked`.
    PublishFailed => "publish_failed",
    /// Acknowledging it failed (its channel is gone); the broker redelivers it.
    AckFailed => "ack_failed",
    /// Processing it panicked; it was rejected with requeue.
    Panicked => "panicked",
    /// The broker connection was lost while it was in flight: its send was abandoned and
    /// the broker redelivers it.
    Abandoned => "abandoned",
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: &'static str,
}

/// What the worker counts; cheap to clone-share behind an `Arc`.
#[derive(Debug)]
pub struct WorkerMetrics {
    deliveries: Family<OutcomeLabels, Counter>,
    dead_letters: Family<ReasonLabels, Counter>,
    provider_errors: Family<ClassLabels, Counter>,
    send_duration: Histogram,
    in_flight: Gauge,
    blocked: Gauge,
    provider_paused: Gauge,
    reconnects: Counter,
}

impl WorkerMetrics {
    /// Registers the worker's metrics, named `mailer_worker_*`, in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            deliveries: Family::default(),
            dead_letters: Family::default(),
            provider_errors: Family::default(),
            send_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            in_flight: Gauge::default(),
            blocked: Gauge::default(),
            provider_paused: Gauge::default(),
            reconnects: Counter::default(),
        };
        let registry = registry.sub_registry_with_prefix("mailer_worker");
        registry.register(
            "deliveries",
            "Deliveries settled, by outcome",
            metrics.deliveries.clone(),
        );
        registry.register(
            "dead_letters",
            "Requests dead-lettered, by reason",
            metrics.dead_letters.clone(),
        );
        registry.register(
            "provider_errors",
            "Sends that failed, by class of failure",
            metrics.provider_errors.clone(),
        );
        registry.register(
            "send_duration_seconds",
            "Time the provider took to accept or refuse a mail",
            metrics.send_duration.clone(),
        );
        registry.register(
            "reconnects",
            "Times the worker lost its broker connection and connected again instead of exiting",
            metrics.reconnects.clone(),
        );
        registry.register(
            "in_flight",
            "Deliveries being processed",
            metrics.in_flight.clone(),
        );
        registry.register(
            "publishing_blocked",
            "1 while the broker blocks the worker's publishing connection (a memory or disk alarm)",
            metrics.blocked.clone(),
        );
        registry.register(
            "provider_paused",
            "1 while the provider cannot be reached and the worker takes no new delivery, but one at a time to probe it",
            metrics.provider_paused.clone(),
        );
        metrics
    }

    pub fn settled(&self, outcome: OutcomeLabel) {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// The deliveries settled with `outcome` so far, as `/metrics` would count them
    /// (read without encoding every metric, as a caller that polls it wants).
    pub fn settled_count(&self, outcome: OutcomeLabel) -> u64 {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .get()
    }

    pub fn dead_lettered(&self, reason: DeadReason) {
        self.settled(OutcomeLabel::DeadLettered);
        self.dead_letters
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub fn provider_error(&self, class: &'static str) {
        self.provider_errors
            .get_or_create(&ClassLabels { class })
            .inc();
    }

    pub fn send_took(&self, seconds: f64) {
        self.send_duration.observe(seconds);
    }

    pub fn set_blocked(&self, blocked: bool) {
        self.blocked.set(i64::from(blocked));
    }

    pub fn set_provider_paused(&self, paused: bool) {
        self.provider_paused.set(i64::from(paused));
    }

    /// One more loss of the broker connection, connected again.
    pub fn reconnecting(&self) {
        self.reconnects.inc();
    }

    pub fn in_flight(&self) -> &Gauge {
        &self.in_flight
    }
}
