//! What applies to a queue in the end: the one policy RabbitMQ picked for it (the matching
//! policy of highest priority), merged with an operator policy, and the queue's own
//! arguments. A policy of ours that a policy of higher priority shadows does nothing, and
//! nothing else tells: [`shadowing`] says what it took away, [`delivery_limit`] what a
//! queue's delivery limit comes to.
//!
//! What `GET /api/queues/{vhost}/{queue}` reports, as seen on RabbitMQ 3.10.8 and 4.0.5
//! (a quorum queue, a policy of ours of priority 10, one of priority 20 matching it, an
//! operator policy):
//!
//! - `policy`, `operator_policy` and `effective_policy_definition` are statistics, not part
//!   of the queue's definition (`?disable_stats=true` leaves them out). The broker emits
//!   them every 5 s: a queue declared less than 5 to 10 s ago has none of the three keys,
//!   and after a policy changes the old ones are reported for up to 5 s more.
//! - Once reported: `policy` is the name of the one policy that applies, or `null`;
//!   `operator_policy` likewise; `effective_policy_definition` is `{}` when neither applies.
//! - `effective_policy_definition` is the applied policy's definition merged with the
//!   operator policy's, on both versions: with ours (`delivery-limit` 5 on 3.10, -1 on 4.0,
//!   `message-ttl` 300000, `overflow`) and an operator policy (`delivery-limit` 3,
//!   `max-length` 500) it was `{delivery-limit: 3, max-length: 500, message-ttl: 300000,
//!   overflow: reject-publish}` on both: the lower limit wins, and 4.0 takes 3 over -1.
//!   With the policy of priority 20 (`max-length` 1000) it was `{max-length: 1000}`:
//!   nothing of ours is left.
//! - `arguments` holds the queue's arguments, `x-delivery-limit` among them; the
//!   definition never includes them. RabbitMQ combines the two when it starts the queue:
//!   the lower of the two on 3.x; on 4.x the lower unless one is negative, then the
//!   higher, so `delivery-limit: -1` does not lift an argument of 7.

use std::fmt;

use rabbitmq_http_client::responses::QueueInfo;
use serde_json::{Map, Value};

use super::broker::BrokerCapabilities;
use super::management::{Management, QueueDepth};
use crate::topology::error::TopologyError;

mod shadowing;
pub use shadowing::{LostSetting, Shadowing, shadowing};

/// The delivery limit RabbitMQ 4.0 and later give a quorum queue that sets none.
pub const RABBITMQ_4_DEFAULT_DELIVERY_LIMIT: i64 = 20;
/// The queue argument that sets a delivery limit at declaration.
pub const DELIVERY_LIMIT_ARGUMENT: &str = "x-delivery-limit";
/// The policy key of the delivery limit.
pub const DELIVERY_LIMIT_KEY: &str = "delivery-limit";

/// What the management API says of the policies of one queue.
#[derive(Debug, Clone, PartialEq)]
pub enum QueuePolicy {
    /// There is no such queue.
    Missing,
    /// The queue exists, but the broker has not reported which policies apply to it yet
    /// (it does within 5 to 10 s of the queue's declaration).
    NotReported,
    Reported(EffectivePolicy),
}

/// What applies to one queue, as the management API last reported it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EffectivePolicy {
    pub queue: String,
    /// The one policy that applies, if any.
    pub policy: Option<String>,
    /// The operator policy that applies, if any.
    pub operator_policy: Option<String>,
    /// The policy's definition merged with the operator policy's.
    pub definition: Map<String, Value>,
    /// The queue's arguments, which no policy changes.
    pub arguments: Map<String, Value>,
}

/// How long after a write to a vhost the policies its queues report may still be the
/// ones before it (the broker emits them every 5 s).
pub const POLICY_REPORT_LAG: std::time::Duration = std::time::Duration::from_secs(10);

/// One queue as the management API last counted it: its messages and its policies.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueState {
    pub depth: QueueDepth,
    /// Never [`QueuePolicy::Missing`]: the queue exists.
    pub policy: QueuePolicy,
}

impl Management {
    /// The policies that apply to `queue` in `vhost`, as the broker last reported them
    /// (its statistics lag by up to 5 s).
    pub async fn effective_policy(
        &self,
        vhost: &str,
        queue: &str,
    ) -> Result<QueuePolicy, TopologyError> {
        Ok(self
            .queue_state(vhost, queue)
            .await?
            .map_or(QueuePolicy::Missing, |state| state.policy))
    }

    /// The messages and policies of `queue` in `vhost`, from one read; `None` when there
    /// is no such queue.
    pub async fn queue_state(
        &self,
        vhost: &str,
        queue: &str,
    ) -> Result<Option<QueueState>, TopologyError> {
        Ok(self.queue_info(vhost, queue).await?.map(|info| QueueState {
            depth: QueueDepth {
                messages: info.message_count,
                unacknowledged: info.unacknowledged_message_count,
                consumers: u32::from(info.consumer_count),
            },
            policy: queue_policy(info),
        }))
    }
}

/// An absent `effective_policy_definition` (the key missing, not `{}`) is a queue whose
/// statistics were not emitted yet.
fn queue_policy(info: QueueInfo) -> QueuePolicy {
    let Some(definition) = info.effective_policy_definition else {
        return QueuePolicy::NotReported;
    };
    QueuePolicy::Reported(EffectivePolicy {
        queue: info.name,
        policy: info.policy,
        operator_policy: info.operator_policy,
        definition: definition.0.unwrap_or_default(),
        arguments: info.arguments.0,
    })
}

/// How many times a message of a queue may be returned before RabbitMQ drops or
/// dead-letters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryLimit {
    Unlimited,
    Finite { limit: i64, from: LimitSource },
}

/// What sets a finite delivery limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSource {
    /// Nothing: RabbitMQ 4's default.
    Default,
    /// The queue's `x-delivery-limit` argument.
    Argument,
    /// The `delivery-limit` of the policy or the operator policy that apply (the merged
    /// definition does not tell which of the two, when both apply).
    Policy {
        policy: Option<String>,
        operator_policy: Option<String>,
    },
}

impl fmt::Display for LimitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => write!(
                f,
                "RabbitMQ 4's default of {RABBITMQ_4_DEFAULT_DELIVERY_LIMIT}"
            ),
            Self::Argument => write!(f, "queue argument {DELIVERY_LIMIT_ARGUMENT}"),
            Self::Policy {
                policy: Some(policy),
                operator_policy: Some(operator),
            } => write!(f, "policy {policy:?} or operator policy {operator:?}"),
            Self::Policy {
                policy: Some(policy),
                operator_policy: None,
            } => write!(f, "policy {policy:?}"),
            Self::Policy {
                policy: None,
                operator_policy: Some(operator),
            } => write!(f, "operator policy {operator:?}"),
            Self::Policy {
                policy: None,
                operator_policy: None,
            } => write!(f, "the queue's effective policy"),
        }
    }
}

/// The delivery limit of a quorum queue with `effective`'s policies and arguments, as
/// RabbitMQ resolves it: the policy's (merged with the operator policy's) and the
/// argument's, the lower of the two if both are set, but on 4.x the higher if either is
/// negative; on 4.x a negative limit means none, and no limit at all means 20. A value
/// that is not an integer (RabbitMQ refuses those) is taken as not set.
pub fn delivery_limit(effective: &EffectivePolicy, broker: BrokerCapabilities) -> DeliveryLimit {
    let from_policy = effective
        .definition
        .get(DELIVERY_LIMIT_KEY)
        .and_then(Value::as_i64)
        .map(|limit| {
            let from = LimitSource::Policy {
                policy: effective.policy.clone(),
                operator_policy: effective.operator_policy.clone(),
            };
            (limit, from)
        });
    let from_argument = effective
        .arguments
        .get(DELIVERY_LIMIT_ARGUMENT)
        .and_then(Value::as_i64)
        .map(|limit| (limit, LimitSource::Argument));
    let negative_lifts = broker.default_delivery_limit;
    let resolved = match (from_policy, from_argument) {
        (Some(policy), Some(argument)) => {
            let either_negative = policy.0 < 0 || argument.0 < 0;
            // Ties go to the argument: no policy can take it away.
            let higher_wins = negative_lifts && either_negative;
            Some(
                if (policy.0 > argument.0) == higher_wins && policy.0 != argument.0 {
                    policy
                } else {
                    argument
                },
            )
        }
        (one, other) => one.or(other),
    };
    match resolved {
        Some((limit, _)) if negative_lifts && limit < 0 => DeliveryLimit::Unlimited,
        Some((limit, from)) => DeliveryLimit::Finite { limit, from },
        None if negative_lifts => DeliveryLimit::Finite {
            limit: RABBITMQ_4_DEFAULT_DELIVERY_LIMIT,
            from: LimitSource::Default,
        },
        None => DeliveryLimit::Unlimited,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn effective(policy: Option<&str>, definition: Value, arguments: Value) -> EffectivePolicy {
        EffectivePolicy {
            queue: "mail.send.dead".into(),
            policy: policy.map(str::to_string),
            operator_policy: None,
            definition: map(definition),
            arguments: map(arguments),
        }
    }

    fn finite(limit: i64, from: LimitSource) -> DeliveryLimit {
        DeliveryLimit::Finite { limit, from }
    }

    fn policy(name: &str) -> LimitSource {
        LimitSource::Policy {
            policy: Some(name.into()),
            operator_policy: None,
        }
    }

    const V3: BrokerCapabilities = BrokerCapabilities::RABBITMQ_3;
    const V4: BrokerCapabilities = BrokerCapabilities::RABBITMQ_4;

    #[test]
    fn without_a_limit_3x_has_none_and_4x_has_20() {
        let none = effective(None, json!({}), json!({"x-queue-type": "quorum"}));
        assert_eq!(delivery_limit(&none, V3), DeliveryLimit::Unlimited);
        assert_eq!(delivery_limit(&none, V4), finite(20, LimitSource::Default));
        let shadowed = effective(Some("platform.all"), json!({"max-length": 1000}), json!({}));
        assert_eq!(
            delivery_limit(&shadowed, V4),
            finite(20, LimitSource::Default)
        );
    }

    #[test]
    fn a_negative_limit_lifts_it_on_4x_only_with_no_finite_argument() {
        let ours = effective(
            Some("mailer.mail.send.dead"),
            json!({"delivery-limit": -1}),
            json!({}),
        );
        assert_eq!(delivery_limit(&ours, V4), DeliveryLimit::Unlimited);
        let with_argument = effective(
            Some("mailer.mail.send.dead"),
            json!({"delivery-limit": -1}),
            json!({"x-delivery-limit": 7}),
        );
        assert_eq!(
            delivery_limit(&with_argument, V4),
            finite(7, LimitSource::Argument),
            "RabbitMQ 4 takes the higher when one is negative"
        );
        let both_negative = effective(
            Some("p"),
            json!({"delivery-limit": -1}),
            json!({"x-delivery-limit": -5}),
        );
        assert_eq!(delivery_limit(&both_negative, V4), DeliveryLimit::Unlimited);
        let argument_lifts = effective(
            Some("p"),
            json!({"delivery-limit": 30}),
            json!({"x-delivery-limit": -1}),
        );
        assert_eq!(delivery_limit(&argument_lifts, V4), finite(30, policy("p")));
    }

    #[test]
    fn the_lower_of_policy_and_argument_wins() {
        for broker in [V3, V4] {
            let policy_lower = effective(
                Some("p"),
                json!({"delivery-limit": 5}),
                json!({"x-delivery-limit": 7}),
            );
            assert_eq!(
                delivery_limit(&policy_lower, broker),
                finite(5, policy("p"))
            );
            let argument_lower = effective(
                Some("p"),
                json!({"delivery-limit": 9}),
                json!({"x-delivery-limit": 7}),
            );
            assert_eq!(
                delivery_limit(&argument_lower, broker),
                finite(7, LimitSource::Argument)
            );
            let tie = effective(
                Some("p"),
                json!({"delivery-limit": 7}),
                json!({"x-delivery-limit": 7}),
            );
            assert_eq!(
                delivery_limit(&tie, broker),
                finite(7, LimitSource::Argument)
            );
            let argument_only = effective(None, json!({}), json!({"x-delivery-limit": 1000}));
            assert_eq!(
                delivery_limit(&argument_only, broker),
                finite(1000, LimitSource::Argument)
            );
        }
    }

    #[test]
    fn a_limit_on_3x_is_finite_whatever_its_sign_and_a_non_integer_is_not_a_limit() {
        let on_3 = effective(Some("p"), json!({"delivery-limit": 50}), json!({}));
        assert_eq!(delivery_limit(&on_3, V3), finite(50, policy("p")));
        // 3.x refuses a negative limit; were one there, it would not mean "none".
        let negative = effective(Some("p"), json!({"delivery-limit": -1}), json!({}));
        assert_eq!(delivery_limit(&negative, V3), finite(-1, policy("p")));
        let text = effective(Some("p"), json!({"delivery-limit": "5"}), json!({}));
        assert_eq!(delivery_limit(&text, V3), DeliveryLimit::Unlimited);
    }

    #[test]
    fn a_limit_names_the_policies_that_may_have_set_it() {
        let mut both = effective(
            Some("mailer.mail.send.dead"),
            json!({"delivery-limit": 3}),
            json!({}),
        );
        both.operator_policy = Some("limits".into());
        let DeliveryLimit::Finite { limit: 3, from } = delivery_limit(&both, V4) else {
            panic!("finite");
        };
        assert_eq!(
            from.to_string(),
            r#"policy "mailer.mail.send.dead" or operator policy "limits""#
        );
        both.policy = None;
        assert_eq!(
            delivery_limit(&both, V4),
            finite(
                3,
                LimitSource::Policy {
                    policy: None,
                    operator_policy: Some("limits".into())
                }
            )
        );
        for (source, text) in [
            (LimitSource::Default, "RabbitMQ 4's default of 20"),
            (LimitSource::Argument, "queue argument x-delivery-limit"),
            (policy("platform.all"), r#"policy "platform.all""#),
            (
                LimitSource::Policy {
                    policy: None,
                    operator_policy: Some("op".into()),
                },
                r#"operator policy "op""#,
            ),
        ] {
            assert_eq!(source.to_string(), text);
        }
    }

    #[test]
    fn a_queue_without_statistics_yet_is_not_reported() {
        let info: QueueInfo = serde_json::from_value(json!({
            "name": "q", "vhost": "v", "type": "quorum", "durable": true,
            "auto_delete": false, "exclusive": false,
            "arguments": {"x-queue-type": "quorum"},
        }))
        .unwrap();
        assert_eq!(queue_policy(info), QueuePolicy::NotReported);
        let info: QueueInfo = serde_json::from_value(json!({
            "name": "q", "vhost": "v", "type": "quorum", "durable": true,
            "auto_delete": false, "exclusive": false,
            "arguments": {"x-queue-type": "quorum", "x-delivery-limit": 7},
            "policy": null, "operator_policy": null, "effective_policy_definition": {},
        }))
        .unwrap();
        assert_eq!(
            queue_policy(info),
            QueuePolicy::Reported(EffectivePolicy {
                queue: "q".into(),
                policy: None,
                operator_policy: None,
                definition: Map::new(),
                arguments: map(json!({"x-queue-type": "quorum", "x-delivery-limit": 7})),
            })
        );
    }
}
