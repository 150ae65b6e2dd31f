//! The controller's Prometheus metrics, served at `/metrics` by [`crate::telemetry`].

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `success` or `error`.
    pub result: &'static str,
    /// The error's category (see `Error::category`), or `none`.
    pub category: String,
}

/// Which of a pipeline's queues a depth is of.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum QueueRole {
    Send,
    Retry,
    Dead,
}

impl QueueRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Send => "send",
            Self::Retry => "retry",
            Self::Dead => "dead",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub namespace: String,
    pub pipeline: String,
    /// `send`, `retry` or `dead`.
    pub queue: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub namespace: String,
    pub pipeline: String,
    /// The delay tier, `1` to `10`.
    pub tier: u32,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PipelineLabels {
    pub namespace: String,
    pub pipeline: String,
}

#[derive(Clone)]
struct DurationHistogram;

impl MetricConstructor<Histogram> for DurationHistogram {
    fn new_metric(&self) -> Histogram {
        // 10 ms to about 82 s.
        Histogram::new(exponential_buckets(0.01, 2.0, 14))
    }
}

/// Every metric the controller exports.
#[derive(Clone)]
pub struct Metrics {
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_duration: Family<ReconcileLabels, Histogram, DurationHistogram>,
    queue_messages: Family<QueueLabels, Gauge>,
    retry_tier_messages: Family<TierLabels, Gauge>,
    drift_repairs: Family<PipelineLabels, Counter>,
    rabbitmq_writes: Family<PipelineLabels, Counter>,
    pipeline_ready: Family<PipelineLabels, Gauge>,
    orphaned_objects: Family<NamespaceLabels, Counter>,
    policies_ahead: Counter,
    leader: Gauge,
}

/// The namespace of a pipeline that is gone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    namespace: String,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `mailer_controller_`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            reconcile_duration: Family::new_with_constructor(DurationHistogram),
            queue_messages: Family::default(),
            retry_tier_messages: Family::default(),
            drift_repairs: Family::default(),
            rabbitmq_writes: Family::default(),
            pipeline_ready: Family::default(),
            orphaned_objects: Family::default(),
            policies_ahead: Counter::default(),
            leader: Gauge::default(),
        };
        let registry = registry.sub_registry_with_prefix("mailer_controller");
        registry.register(
            "reconciles",
            "Reconciles of MailerPipelines, by result and error category",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles of MailerPipelines took",
            metrics.reconcile_duration.clone(),
        );
        registry.register(
            "queue_messages",
            "Messages in each queue of each pipeline, as RabbitMQ's management API last counted them",
            metrics.queue_messages.clone(),
        );
        registry.register(
            "retry_tier_messages",
            "Requests waiting in each delay tier's queue of each pipeline with delay tiers (retryDelays), or of a former tier while it drains; queue=\"retry\" of queue_messages is their sum",
            metrics.retry_tier_messages.clone(),
        );
        registry.register(
            "drift_repairs",
            "Reconciles that found RabbitMQ or the worker Deployment changed behind the operator's back and put them right",
            metrics.drift_repairs.clone(),
        );
        registry.register(
            "rabbitmq_writes",
            "Writing requests made to RabbitMQ's management API for each pipeline; flat while everything is in sync",
            metrics.rabbitmq_writes.clone(),
        );
        registry.register(
            "pipeline_ready",
            "1 while the pipeline's Ready condition is True, else 0",
            metrics.pipeline_ready.clone(),
        );
        registry.register(
            "orphaned_objects",
            "What deleted pipelines left in RabbitMQ because it could not be removed (each left-over a deletion's CleanupIncomplete event lists), by the pipeline's namespace",
            metrics.orphaned_objects.clone(),
        );
        registry.register(
            "policies_ahead",
            "Reconciles that wrote a new pipeline's policies ahead of its exchanges and queues, as it was made among others of its vhost; a second reconcile makes the rest",
            metrics.policies_ahead.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and reconciles, else 0",
            metrics.leader.clone(),
        );
        metrics
    }

    /// A reconcile stopped after the pipeline's policies (see
    /// [`crate::controller::runtime::ahead`]).
    pub fn went_ahead(&self) {
        self.policies_ahead.inc();
    }

    pub fn reconciled(&self, outcome: Result<(), &'static str>, took: Duration) {
        let labels = match outcome {
            Ok(()) => ReconcileLabels {
                result: "success",
                category: "none".to_string(),
            },
            Err(category) => ReconcileLabels {
                result: "error",
                category: category.to_string(),
            },
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub fn set_queue_depth(&self, namespace: &str, pipeline: &str, queue: QueueRole, depth: i64) {
        self.queue_messages
            .get_or_create(&QueueLabels {
                namespace: namespace.to_string(),
                pipeline: pipeline.to_string(),
                queue: queue.as_str(),
            })
            .set(depth);
    }

    /// Sets the depth of each tier in `tiers` (tier, messages) and drops the series of
    /// the tiers not in it.
    pub fn set_retry_tiers(&self, namespace: &str, pipeline: &str, tiers: &[(u32, i64)]) {
        let labels = |tier: u32| TierLabels {
            namespace: namespace.to_string(),
            pipeline: pipeline.to_string(),
            tier,
        };
        for tier in 1..=crate::mail::MAX_RETRY_TIERS as u32 {
            match tiers.iter().find(|(t, _)| *t == tier) {
                Some((_, depth)) => {
                    self.retry_tier_messages
                        .get_or_create(&labels(tier))
                        .set(*depth);
                }
                None => {
                    self.retry_tier_messages.remove(&labels(tier));
                }
            }
        }
    }

    pub fn drift_repaired(&self, namespace: &str, pipeline: &str) {
        self.drift_repairs
            .get_or_create(&PipelineLabels {
                namespace: namespace.to_string(),
                pipeline: pipeline.to_string(),
            })
            .inc();
    }

    pub fn rabbitmq_written(&self, namespace: &str, pipeline: &str, writes: usize) {
        self.rabbitmq_writes
            .get_or_create(&PipelineLabels {
                namespace: namespace.to_string(),
                pipeline: pipeline.to_string(),
            })
            .inc_by(u64::try_from(writes).unwrap_or(u64::MAX));
    }

    pub fn set_ready(&self, namespace: &str, pipeline: &str, ready: bool) {
        self.pipeline_ready
            .get_or_create(&PipelineLabels {
                namespace: namespace.to_string(),
                pipeline: pipeline.to_string(),
            })
            .set(i64::from(ready));
    }

    /// Drops a deleted pipeline's series, so they do not linger at their last value.
    pub fn forget(&self, namespace: &str, pipeline: &str) {
        for queue in [QueueRole::Send, QueueRole::Retry, QueueRole::Dead] {
            self.queue_messages.remove(&QueueLabels {
                namespace: namespace.to_string(),
                pipeline: pipeline.to_string(),
                queue: queue.as_str(),
            });
        }
        self.set_retry_tiers(namespace, pipeline, &[]);
        let labels = PipelineLabels {
            namespace: namespace.to_string(),
            pipeline: pipeline.to_string(),
        };
        self.drift_repairs.remove(&labels);
        self.rabbitmq_writes.remove(&labels);
        self.pipeline_ready.remove(&labels);
    }

    /// Counts what a deleted pipeline of `namespace` left behind.
    pub fn orphaned(&self, namespace: &str, left: usize) {
        self.orphaned_objects
            .get_or_create(&NamespaceLabels {
                namespace: namespace.to_string(),
            })
            .inc_by(u64::try_from(left).unwrap_or(u64::MAX));
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.reconciled(Ok(()), Duration::from_millis(20));
        metrics.reconciled(Err("unreachable"), Duration::from_millis(20));
        metrics.set_queue_depth("prod", "shop", QueueRole::Dead, 7);
        metrics.drift_repaired("prod", "shop");
        metrics.rabbitmq_written("prod", "shop", 3);
        metrics.set_leader(true);
        metrics.set_ready("prod", "shop", true);
        metrics.set_ready("prod", "mail", false);
        metrics.orphaned("prod", 2);
        let out = text(&registry);
        for line in [
            r#"mailer_controller_reconciles_total{result="success",category="none"} 1"#,
            r#"mailer_controller_reconciles_total{result="error",category="unreachable"} 1"#,
            r#"mailer_controller_queue_messages{namespace="prod",pipeline="shop",queue="dead"} 7"#,
            r#"mailer_controller_drift_repairs_total{namespace="prod",pipeline="shop"} 1"#,
            r#"mailer_controller_rabbitmq_writes_total{namespace="prod",pipeline="shop"} 3"#,
            "mailer_controller_leader 1",
            r#"mailer_controller_orphaned_objects_total{namespace="prod"} 2"#,
            r#"mailer_controller_pipeline_ready{namespace="prod",pipeline="shop"} 1"#,
            r#"mailer_controller_pipeline_ready{namespace="prod",pipeline="mail"} 0"#,
            "mailer_controller_reconcile_duration_seconds_bucket",
        ] {
            assert!(out.contains(line), "{line} missing from\n{out}");
        }
        metrics.forget("prod", "shop");
        let out = text(&registry);
        assert!(!out.contains(r#"pipeline="shop",queue"#));
        assert!(!out.contains(r#"pipeline_ready{namespace="prod",pipeline="shop"}"#));
    }
}
