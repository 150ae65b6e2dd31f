//! `status`: what the operator last found, written by it and read by people.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The condition that says whether the pipeline's exchanges, queues, bindings, policies
/// and worker user are in RabbitMQ as the spec asks.
pub const TOPOLOGY_READY: &str = "TopologyReady";
/// The condition that says whether every worker pod asked for is ready.
pub const WORKER_READY: &str = "WorkerReady";
/// Both of the above.
pub const READY: &str = "Ready";

/// What the operator last found: the pipeline's conditions, queue depths and workers.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailerPipelineStatus {
    /// The `metadata.generation` of the spec this status describes; when it is behind
    /// the resource's generation, the operator has not yet acted on the latest change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `metadata.generation` of the spec the operator last applied in full. A
    /// difference the operator finds while the generation is this one was made behind its
    /// back (drift); `observedGeneration` is written after failed attempts too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_generation: Option<i64>,
    /// `TopologyReady`, `WorkerReady` and `Ready`, each with a reason and a message that
    /// says what to do when it is not `True`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Messages in the pipeline's queues, as RabbitMQ's management API last counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<QueueDepths>,
    /// Worker pods ready and asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkerCounts>,
    /// The RabbitMQ user the workers connect as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_user: Option<String>,
}

/// Messages (ready and unacknowledged) in each queue of the pipeline; a queue is absent
/// when it could not be counted.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueDepths {
    /// Mail requests waiting to be sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<i64>,
    /// Requests that failed for now, waiting for their next attempt: in all the delay
    /// tiers' queues together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<i64>,
    /// With delay tiers (`retryDelays`), or while a former tier's queue drains: the
    /// requests waiting in each tier's queue, in tier order, then the former tiers'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_tiers: Vec<RetryTierDepth>,
    /// `retryTiers` in one line, for `kubectl get -o wide`: each tier's count in tier
    /// order, e.g. `3/0/1/2` (`?` for one not counted), then `+5 draining` for what the
    /// former tiers' queues hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_by_tier: Option<String>,
    /// Dead letters: requests that never will succeed, kept for people to inspect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead: Option<i64>,
}

/// The requests waiting in one delay tier's queue.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryTierDepth {
    /// The tier, from 1.
    pub tier: u32,
    /// The tier's delay queue, e.g. `mail.send.retry.2`.
    pub queue: String,
    /// The tier's delay, e.g. `5m`; absent for a former tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Requests waiting there; absent when they could not be counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<i64>,
    /// A tier the spec no longer has: its queue is kept, still returning what it holds to
    /// the send queue, until it is empty, and then removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

/// Worker pods ready and asked for.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCounts {
    /// Worker pods that pass their readiness probe.
    pub ready: i32,
    /// Worker pods asked for (`spec.worker.replicas`).
    pub desired: i32,
}

impl MailerPipelineStatus {
    /// The condition of `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether the condition of `type_` is `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }
}
