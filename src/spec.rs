//! The `MailerPipeline` resource: what a user asks for.
//!
//! The same types are read by the standalone CLI from YAML files and by the operator as
//! the `mailer.dev/v1alpha1` custom resource, so their doc comments are the text that
//! `kubectl explain mailerpipeline.spec` shows.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mail;

mod status;
mod worker;

pub use status::{
    MailerPipelineStatus, QueueDepths, READY, RetryTierDepth, TOPOLOGY_READY, WORKER_READY,
    WorkerCounts,
};
pub use worker::{AutoscalingSpec, ImagePullPolicy, ProviderSpec, SecretKeySelector, WorkerSpec};

/// The longest name RabbitMQ accepts for an exchange or a queue, in bytes.
const MAX_NAME_BYTES: usize = 255;
/// The largest `message-ttl` RabbitMQ accepts, in milliseconds (2^32 - 1).
const MAX_TTL_MS: u128 = u32::MAX as u128;
/// CEL: every exchange and queue name of the pipeline is different from the others.
const DISTINCT_NAMES_RULE: &str = "[self.exchange, self.queue, self.retryExchange, self.retryQueue, self.deadExchange, self.deadQueue].all(n, [self.exchange, self.queue, self.retryExchange, self.retryQueue, self.deadExchange, self.deadQueue].filter(m, m == n).size() == 1)";
/// CEL: a name RabbitMQ does not reserve for itself.
const NOT_RESERVED_RULE: &str = "!self.startsWith('amq.')";
const NOT_RESERVED_MESSAGE: &str = "names starting with \"amq.\" are reserved by RabbitMQ";
/// CEL: the one delay and the delay tiers are two ways to say the same thing.
const ONE_WAY_TO_DELAY_RULE: &str = "!(has(self.retryDelay) && has(self.retryDelays))";

/// A mail-sending pipeline on RabbitMQ: its exchanges, quorum queues and policies, and
/// the workers that consume mail requests and send them.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema, Default)]
#[kube(
    group = "mailer.dev",
    version = "v1alpha1",
    kind = "MailerPipeline",
    namespaced,
    status = "MailerPipelineStatus",
    derive = "PartialEq",
    shortname = "mp",
    category = "mailer",
    doc = "A mail-sending pipeline on RabbitMQ: exchanges, quorum queues, policies and the workers that send mail.",
    // Columns as JSON: the attribute form repeats `type_ = "integer"`, which clippy takes
    // for a duplicated attribute.
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "description": "Whether the topology is in RabbitMQ and every worker is ready"}"#,
    printcolumn = r#"{"name": "Send", "type": "integer", "jsonPath": ".status.queues.send", "description": "Mail requests waiting to be sent"}"#,
    printcolumn = r#"{"name": "Retry", "type": "integer", "jsonPath": ".status.queues.retry", "description": "Requests waiting for their next attempt"}"#,
    printcolumn = r#"{"name": "Tiers", "type": "string", "priority": 1, "jsonPath": ".status.queues.retryByTier", "description": "Requests waiting in each delay tier, in tier order, e.g. 3/0/1/2 (with retryDelays), and in former tiers' queues still draining"}"#,
    printcolumn = r#"{"name": "Dead", "type": "integer", "jsonPath": ".status.queues.dead", "description": "Dead letters kept for people to inspect"}"#,
    printcolumn = r#"{"name": "Workers", "type": "integer", "jsonPath": ".status.workers.ready", "description": "Worker pods ready"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MailerPipelineSpec {
    /// Which RabbitMQ to use and how to reach it.
    #[serde(default)]
    pub rabbitmq: RabbitmqSpec,
    /// The exchanges, queues and policies of the pipeline. Every field has a default
    /// that matches the mailer's design.
    #[serde(default)]
    pub topology: TopologySpec,
    /// The workers that consume mail requests and send them.
    #[serde(default)]
    pub worker: WorkerSpec,
}

/// Which RabbitMQ to use and how to reach it.
///
/// The operator needs exactly one of `connectionSecret` and `clusterRef`. The standalone
/// `mailer topology` command is given the broker on its command line and needs neither.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("has(self.connectionSecret) != has(self.clusterRef)")
    .message("set exactly one of connectionSecret and clusterRef")
    .reason(kube::core::Reason::FieldValueRequired))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RabbitmqSpec {
    /// The virtual host that holds the pipeline. It is created when it does not exist.
    #[serde(default = "default_vhost")]
    #[schemars(length(min = 1))]
    pub vhost: String,
    /// A Secret in the pipeline's namespace with the keys `uri` (the management API URL,
    /// e.g. `http://rabbitmq:15672`), `username` and `password`: the convention of
    /// RabbitMQ's messaging-topology-operator. An optional key `amqpUri` (e.g.
    /// `amqp://rabbitmq:5672`) says where the workers connect; without it, the `uri`'s
    /// host on 5672 (5671 over TLS when `uri` is https). Set this or `clusterRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_secret: Option<SecretReference>,
    /// A RabbitmqCluster of RabbitMQ's cluster-operator; its default user and Service are
    /// used. Set this or `connectionSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_ref: Option<ClusterReference>,
}

impl Default for RabbitmqSpec {
    fn default() -> Self {
        Self {
            vhost: default_vhost(),
            connection_secret: None,
            cluster_ref: None,
        }
    }
}

/// A Secret in the same namespace as the pipeline.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretReference {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// A RabbitmqCluster resource (rabbitmq.com/v1beta1).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterReference {
    /// The RabbitmqCluster's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Its namespace; the pipeline's own when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl ClusterReference {
    /// The cluster's namespace: the one named, or `own` (the pipeline's) when none or an
    /// empty one is.
    pub fn namespace_or<'a>(&'a self, own: &'a str) -> &'a str {
        self.namespace
            .as_deref()
            .filter(|namespace| !namespace.is_empty())
            .unwrap_or(own)
    }
}

/// The exchanges, queues and policies of the pipeline.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[x_kube(validation = kube::core::Rule::new(DISTINCT_NAMES_RULE)
    .message("exchange, queue, retryExchange, retryQueue, deadExchange and deadQueue must all be different names")
    .reason(kube::core::Reason::FieldValueDuplicate))]
#[x_kube(validation = kube::core::Rule::new(ONE_WAY_TO_DELAY_RULE)
    .message("set retryDelay (one delay) or retryDelays (delay tiers), not both")
    .reason(kube::core::Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologySpec {
    /// The direct exchange producers publish mail requests to.
    #[serde(default = "default_exchange")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = kube::core::Rule::new(NOT_RESERVED_RULE).message(NOT_RESERVED_MESSAGE))]
    pub exchange: String,
    /// The quorum queue the workers consume. Its name is also the routing key of every
    /// mail request.
    #[serde(default = "default_queue")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = kube::core::Rule::new(NOT_RESERVED_RULE).message(NOT_RESERVED_MESSAGE))]
    pub queue: String,
    /// The direct exchange that requests which failed for now are parked through.
    #[serde(default = "default_retry_exchange")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = kube::core::Rule::new(NOT_RESERVED_RULE).message(NOT_RESERVED_MESSAGE))]
    pub retry_exchange: String,
    /// The delay queue (of the first delay tier): it holds a parked request for
    /// `retryDelay` (or the first of `retryDelays`), then sends it back to `exchange`.
    /// With delay tiers, tier n > 1 has its own queue, this name followed by `.n`
    /// (`mail.send.retry.2`, …).
    #[serde(default = "default_retry_queue")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = kube::core::Rule::new(NOT_RESERVED_RULE).message(NOT_RESERVED_MESSAGE))]
    pub retry_queue: String,
    /// The fanout exchange that requests which never will succeed are published to. Bind
    /// your own queues to it to be told of dead letters.
    #[serde(default = "default_dead_exchange")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = kube::core::Rule::new(NOT_RESERVED_RULE).message(NOT_RESERVED_MESSAGE))]
    pub dead_exchange: String,
    /// The quorum queue that keeps dead letters.
    #[serde(default = "default_dead_queue")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = kube::core::Rule::new(NOT_RESERVED_RULE).message(NOT_RESERVED_MESSAGE))]
    pub dead_queue: String,
    /// How long a request that failed for now waits before its next attempt, e.g. `30s`,
    /// `5m` or `1h30m`; 5m when neither this nor `retryDelays` is set. At least 1s and
    /// below 49 days (RabbitMQ's limit). Every attempt waits the same delay, since a
    /// quorum queue expires messages only from its head: for longer waits after later
    /// attempts, set `retryDelays` instead (not both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub retry_delay: Option<String>,
    /// Delay tiers, e.g. `[30s, 5m, 30m, 2h]`: strictly increasing, at most 10, each as
    /// `retryDelay`. A request whose attempt n failed for now waits in tier min(n, number
    /// of tiers), each tier its own delay queue (`retryQueue`, then `retryQueue.2`, …).
    /// Removing tiers removes their queues once they are empty; one that still holds
    /// parked requests is kept, and still returns them, until it is. Set this or
    /// `retryDelay`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 10))]
    pub retry_delays: Option<Vec<String>>,
    /// Deliveries of one request from `queue` before RabbitMQ dead-letters it to
    /// `deadExchange`; catches a request that makes the worker fail every time.
    #[serde(default = "default_delivery_limit")]
    #[schemars(range(min = 1))]
    pub delivery_limit: u32,
    /// The most requests the delay queue holds; when full it refuses new ones (so the
    /// worker stops instead of losing mail). Unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub retry_queue_max_length: Option<u64>,
    /// The most dead letters the dead-letter queue holds; when full it refuses new ones.
    /// Unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub dead_queue_max_length: Option<u64>,
    /// What deleting the pipeline does to RabbitMQ: `Retain` (the default) removes
    /// nothing; `Delete` removes the policies, bindings and exchanges, and each queue
    /// that holds no messages.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
}

impl Default for TopologySpec {
    fn default() -> Self {
        Self {
            exchange: default_exchange(),
            queue: default_queue(),
            retry_exchange: default_retry_exchange(),
            retry_queue: default_retry_queue(),
            dead_exchange: default_dead_exchange(),
            dead_queue: default_dead_queue(),
            retry_delay: None,
            retry_delays: None,
            delivery_limit: default_delivery_limit(),
            retry_queue_max_length: None,
            dead_queue_max_length: None,
            deletion_policy: DeletionPolicy::default(),
        }
    }
}

/// What deleting a pipeline does to its RabbitMQ objects.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum DeletionPolicy {
    /// Leave every exchange, queue, binding and policy in place.
    #[default]
    Retain,
    /// Remove policies, bindings and exchanges, and each queue that holds no messages.
    Delete,
}

fn default_vhost() -> String {
    "/".into()
}
fn default_exchange() -> String {
    mail::EXCHANGE.into()
}
fn default_queue() -> String {
    mail::SEND_QUEUE.into()
}
fn default_retry_exchange() -> String {
    mail::RETRY_EXCHANGE.into()
}
fn default_retry_queue() -> String {
    mail::RETRY_QUEUE.into()
}
fn default_dead_exchange() -> String {
    mail::DEAD_EXCHANGE.into()
}
fn default_dead_queue() -> String {
    mail::DEAD_QUEUE.into()
}
fn default_delivery_limit() -> u32 {
    mail::DEFAULT_DELIVERY_LIMIT
}

/// One thing wrong with a spec: the field's path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    pub field: String,
    pub problem: String,
}

/// Everything wrong with a spec, reported together so a user fixes it in one go.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MailerPipeline: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidSpec(pub Vec<FieldError>);

impl TopologySpec {
    /// The delay of each tier, in order: `retryDelays`, else the one `retryDelay`, else
    /// the default. Call [`MailerPipelineSpec::validate`] first for every problem at once;
    /// this names the first.
    pub fn retry_delays(&self) -> Result<Vec<Duration>, FieldError> {
        let error = |field: &str, problem: String| FieldError {
            field: format!("spec.topology.{field}"),
            problem,
        };
        let Some(texts) = &self.retry_delays else {
            let text = self
                .retry_delay
                .as_deref()
                .unwrap_or(mail::DEFAULT_RETRY_DELAY);
            return parse_retry_delay(text)
                .map(|delay| vec![delay])
                .map_err(|problem| error("retryDelay", problem));
        };
        if self.retry_delay.is_some() {
            return Err(error(
                "retryDelays",
                "set retryDelay (one delay) or retryDelays (delay tiers), not both".into(),
            ));
        }
        if texts.is_empty() || texts.len() > mail::MAX_RETRY_TIERS {
            return Err(error(
                "retryDelays",
                format!(
                    "has {} delays; give 1 to {}",
                    texts.len(),
                    mail::MAX_RETRY_TIERS
                ),
            ));
        }
        let mut delays: Vec<Duration> = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let delay = parse_retry_delay(text)
                .map_err(|problem| error(&format!("retryDelays[{i}]"), problem))?;
            if let Some(previous) = delays.last()
                && delay <= *previous
            {
                return Err(error(
                    &format!("retryDelays[{i}]"),
                    format!(
                        "{text:?} is not longer than the tier before it ({:?}); the delays must be strictly increasing",
                        texts[i - 1]
                    ),
                ));
            }
            delays.push(delay);
        }
        Ok(delays)
    }

    /// How many delay tiers the spec asks for, whether or not its delays are valid (at
    /// most [`mail::MAX_RETRY_TIERS`]).
    pub fn retry_tier_count(&self) -> usize {
        self.retry_delays
            .as_ref()
            .map_or(1, |delays| delays.len().clamp(1, mail::MAX_RETRY_TIERS))
    }

    /// The delay queue of each tier, in order: `retryQueue`, `retryQueue.2`, …
    pub fn retry_tier_queues(&self) -> Vec<String> {
        (1..=self.retry_tier_count())
            .map(|tier| mail::retry_tier_queue(&self.retry_queue, tier))
            .collect()
    }

    /// The routing key of each tier on `retryExchange`, in order: `queue` (the send key)
    /// for the first, then each further tier's queue name.
    pub fn retry_tier_keys(&self) -> Vec<String> {
        (1..=self.retry_tier_count())
            .map(|tier| mail::retry_tier_key(&self.queue, &self.retry_queue, tier))
            .collect()
    }

    /// The six names with the field each comes from, in a fixed order.
    pub fn names(&self) -> [(&'static str, &str); 6] {
        [
            ("exchange", &self.exchange),
            ("queue", &self.queue),
            ("retryExchange", &self.retry_exchange),
            ("retryQueue", &self.retry_queue),
            ("deadExchange", &self.dead_exchange),
            ("deadQueue", &self.dead_queue),
        ]
    }
}

fn parse_retry_delay(text: &str) -> Result<Duration, String> {
    let delay = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}); write it like 30s, 5m or 1h30m"))?;
    if delay < Duration::from_secs(1) {
        return Err(format!("{text:?} is shorter than the least delay, 1s"));
    }
    if delay.as_millis() >= MAX_TTL_MS {
        return Err(format!(
            "{text:?} is too long: RabbitMQ's message-ttl must be below {MAX_TTL_MS} ms (about 49 days)"
        ));
    }
    Ok(delay)
}

impl MailerPipelineSpec {
    /// Checks what the schema cannot: durations, names and their collisions, ranges.
    pub fn validate(&self) -> Result<(), InvalidSpec> {
        let mut errors = Vec::new();
        let mut problem = |field: &str, problem: String| {
            errors.push(FieldError {
                field: format!("spec.{field}"),
                problem,
            })
        };

        if self.rabbitmq.vhost.is_empty() {
            problem(
                "rabbitmq.vhost",
                "must not be empty (the default vhost is \"/\")".into(),
            );
        } else if self.rabbitmq.vhost == crate::mail::CLAIM_LOCK_VHOST {
            problem(
                "rabbitmq.vhost",
                format!(
                    "{:?} holds the operator's claim locks; choose another vhost",
                    crate::mail::CLAIM_LOCK_VHOST
                ),
            );
        }
        if self.rabbitmq.connection_secret.is_some() && self.rabbitmq.cluster_ref.is_some() {
            problem(
                "rabbitmq",
                "set connectionSecret or clusterRef, not both".into(),
            );
        }

        let topology = &self.topology;
        let mut seen = BTreeSet::new();
        for (field, name) in topology.names() {
            let field = format!("topology.{field}");
            if name.is_empty() {
                problem(&field, "must not be empty".into());
            } else if name.len() > MAX_NAME_BYTES {
                problem(
                    &field,
                    format!(
                        "is {} bytes long; RabbitMQ allows at most {MAX_NAME_BYTES}",
                        name.len()
                    ),
                );
            } else if name.starts_with("amq.") {
                problem(
                    &field,
                    format!("{name:?} starts with \"amq.\", which RabbitMQ reserves"),
                );
            } else if !seen.insert(name) {
                problem(
                    &field,
                    format!(
                        "{name:?} is also the name of another exchange or queue of this pipeline; every name must be distinct"
                    ),
                );
            }
        }
        if let Err(e) = topology.retry_delays() {
            let field = e.field.strip_prefix("spec.").unwrap_or(&e.field);
            problem(field, e.problem);
        }
        // The workers get the tiers' routing keys as one comma-separated variable.
        if topology.retry_tier_count() > 1 {
            for (field, name) in [
                ("queue", &topology.queue),
                ("retryQueue", &topology.retry_queue),
            ] {
                if name.contains(',') {
                    problem(
                        &format!("topology.{field}"),
                        format!(
                            "{name:?} has a comma, which a routing key of a delay tier cannot have (the workers get them comma-separated)"
                        ),
                    );
                }
            }
        }
        for tier_queue in topology.retry_tier_queues().iter().skip(1) {
            if tier_queue.len() > MAX_NAME_BYTES {
                problem(
                    "topology.retryQueue",
                    format!(
                        "its delay tier's queue {tier_queue:?} would be {} bytes long; RabbitMQ allows at most {MAX_NAME_BYTES}",
                        tier_queue.len()
                    ),
                );
            } else if seen.contains(tier_queue.as_str()) {
                problem(
                    "topology.retryDelays",
                    format!(
                        "the delay tier's queue {tier_queue:?} would have the name of another exchange or queue of this pipeline; choose another retryQueue or name"
                    ),
                );
            }
        }
        if topology.delivery_limit == 0 {
            problem("topology.deliveryLimit", "must be at least 1".into());
        }
        if topology.retry_queue_max_length == Some(0) {
            problem(
                "topology.retryQueueMaxLength",
                "must be at least 1 (leave it out for no limit)".into(),
            );
        }
        if topology.dead_queue_max_length == Some(0) {
            problem(
                "topology.deadQueueMaxLength",
                "must be at least 1 (leave it out for no limit)".into(),
            );
        }

        let worker = &self.worker;
        if worker.replicas < 0 {
            problem("worker.replicas", "must not be negative".into());
        }
        if let Some(autoscaling) = &worker.autoscaling {
            if autoscaling.min_replicas < 0 {
                problem(
                    "worker.autoscaling.minReplicas",
                    "must not be negative".into(),
                );
            }
            if autoscaling.max_replicas < 1 {
                problem(
                    "worker.autoscaling.maxReplicas",
                    "must be at least 1".into(),
                );
            }
            if autoscaling.min_replicas > autoscaling.max_replicas {
                problem(
                    "worker.autoscaling.minReplicas",
                    format!(
                        "{} is above maxReplicas ({})",
                        autoscaling.min_replicas, autoscaling.max_replicas
                    ),
                );
            }
            if autoscaling.messages_per_worker == 0 {
                problem(
                    "worker.autoscaling.messagesPerWorker",
                    "must be at least 1".into(),
                );
            }
        }
        if worker.max_attempts == 0 {
            problem("worker.maxAttempts", "must be at least 1".into());
        }
        if worker.prefetch == 0 {
            problem("worker.prefetch", "must be at least 1".into());
        }
        if let Err(e) = worker.max_request_bytes() {
            problem("worker.maxRequestSize", e.to_string());
        }
        if worker.termination_grace_period_seconds < 1 {
            problem(
                "worker.terminationGracePeriodSeconds",
                "must be at least 1".into(),
            );
        }
        if worker.image.as_deref() == Some("") {
            problem(
                "worker.image",
                "must not be empty (leave it out for the operator's own image)".into(),
            );
        }
        if let Some(provider) = &worker.provider {
            let selector = &provider.url_secret_key_ref;
            if selector.name.is_empty() || selector.key.is_empty() {
                problem(
                    "worker.provider.urlSecretKeyRef",
                    "needs both the Secret's name and the key".into(),
                );
            }
            if provider.rate_limit == Some(0) {
                problem(
                    "worker.provider.rateLimit",
                    "must be at least 1 mail per second (leave it out for no limit)".into(),
                );
            }
        }

        if errors.is_empty() {
            Ok(())
        } else {
            Err(InvalidSpec(errors))
        }
    }

    /// What [`validate`](Self::validate) checks, and what the operator needs besides:
    /// exactly one of `connectionSecret` and `clusterRef`, to find the broker by.
    pub fn validate_for_operator(&self) -> Result<(), InvalidSpec> {
        let mut errors = match self.validate() {
            Ok(()) => Vec::new(),
            Err(InvalidSpec(errors)) => errors,
        };
        if self.rabbitmq.connection_secret.is_none() && self.rabbitmq.cluster_ref.is_none() {
            errors.push(FieldError {
                field: "spec.rabbitmq".into(),
                problem: "set connectionSecret (a Secret with uri, username and password) or clusterRef (a RabbitmqCluster)".into(),
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(InvalidSpec(errors))
        }
    }
}

#[cfg(test)]
mod tests;
