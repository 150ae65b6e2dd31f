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

use super::TopologyError;
use super::broker::BrokerCapabilities;
use super::desired::Policy;
use super::management::Management;

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

impl Management {
    /// The policies that apply to `queue` in `vhost`, as the broker last reported them
    /// (its statistics lag by up to 5 s).
    pub async fn effective_policy(
        &self,
        vhost: &str,
        queue: &str,
    ) -> Result<QueuePolicy, TopologyError> {
        match self.read(self.api.get_queue_info(vhost, queue)).await {
            Ok(info) => Ok(queue_policy(info)),
            Err(e) if e.is_not_found() => Ok(QueuePolicy::Missing),
            Err(e) => Err(self.error(&format!("read queue {queue}"), e)),
        }
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

/// A policy of ours that does not apply as written: another policy applies instead, none
/// does, or an operator policy changes what it sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Shadowing {
    pub queue: String,
    /// The name of our policy.
    pub ours: String,
    /// The policy that applies to the queue, if any: ours when only an operator policy
    /// changes it.
    pub applied: Option<String>,
    pub operator_policy: Option<String>,
    /// What ours sets that the queue does not get, by key.
    pub lost: Vec<LostSetting>,
}

/// A key our policy sets, and what the queue has of it instead.
#[derive(Debug, Clone, PartialEq)]
pub struct LostSetting {
    pub key: String,
    pub ours: Value,
    /// The effective value, or `None` when the key is not set at all.
    pub now: Option<Value>,
}

impl Shadowing {
    /// Whether our policy is the one that applies (and only an operator policy changes it).
    pub fn ours_applies(&self) -> bool {
        self.applied.as_deref() == Some(self.ours.as_str())
    }
}

/// Whether `ours`, written for `effective.queue`, does not apply as written; `None` when
/// it applies and the queue gets every key it sets, with the same value. Keys that only
/// the other policy or the operator policy set are not our loss, and are not listed.
pub fn shadowing(ours: &Policy, effective: &EffectivePolicy) -> Option<Shadowing> {
    let lost: Vec<LostSetting> = ours
        .definition
        .iter()
        .filter_map(|(key, value)| {
            let now = effective.definition.get(key);
            let kept = now.is_some_and(|now| same_value(now, value));
            (!kept).then(|| LostSetting {
                key: key.clone(),
                ours: value.clone(),
                now: now.cloned(),
            })
        })
        .collect();
    let ours_applies = effective.policy.as_deref() == Some(ours.name.as_str());
    if ours_applies && lost.is_empty() {
        return None;
    }
    Some(Shadowing {
        queue: effective.queue.clone(),
        ours: ours.name.clone(),
        applied: effective.policy.clone(),
        operator_policy: effective.operator_policy.clone(),
        lost,
    })
}

/// JSON values equal as RabbitMQ takes them: numbers by value (300000 and 300000.0).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        _ => a == b,
    }
}

impl fmt::Display for Shadowing {
    /// One line, for a Kubernetes condition's message or a command's error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (queue, ours) = (&self.queue, &self.ours);
        match (&self.applied, &self.operator_policy) {
            (Some(applied), _) if applied != ours => write!(
                f,
                "policy {applied:?} applies to queue {queue:?} instead of {ours:?} (one of a higher priority wins)"
            )?,
            (None, _) => write!(
                f,
                "no policy applies to queue {queue:?}: {ours:?} is missing or does not match it"
            )?,
            (Some(_), Some(operator)) => write!(
                f,
                "operator policy {operator:?} overrides {ours:?} on queue {queue:?}"
            )?,
            (Some(_), None) => write!(
                f,
                "queue {queue:?} does not yet have what {ours:?} sets (the broker reports a policy's changes within 5 s)"
            )?,
        }
        let taken: Vec<String> = self
            .lost
            .iter()
            .filter(|lost| lost.now.is_none())
            .map(|lost| format!("{} {}", lost.key, lost.ours))
            .collect();
        let changed: Vec<String> = self
            .lost
            .iter()
            .filter_map(|lost| {
                let now = lost.now.as_ref()?;
                Some(format!("{} from {} to {now}", lost.key, lost.ours))
            })
            .collect();
        if !taken.is_empty() {
            write!(f, "; it takes away {}", taken.join(", "))?;
        }
        if !changed.is_empty() {
            write!(f, "; it changes {}", changed.join(", "))?;
        }
        Ok(())
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

    fn retry_policy() -> Policy {
        Policy {
            name: "mailer.mail.send.retry".into(),
            pattern: r"^mail\.send\.retry$".into(),
            definition: map(json!({
                "message-ttl": 300000,
                "dead-letter-exchange": "mail",
                "overflow": "reject-publish",
            })),
        }
    }

    fn retry_queue(policy: Option<&str>, definition: Value) -> EffectivePolicy {
        EffectivePolicy {
            queue: "mail.send.retry".into(),
            ..effective(policy, definition, json!({}))
        }
    }

    #[test]
    fn ours_applied_as_written_is_not_shadowed() {
        let ours = retry_policy();
        let applied = retry_queue(
            Some("mailer.mail.send.retry"),
            json!({"message-ttl": 300000.0, "dead-letter-exchange": "mail", "overflow": "reject-publish", "max-length": 10}),
        );
        assert_eq!(shadowing(&ours, &applied), None);
    }

    #[test]
    fn a_policy_of_higher_priority_takes_away_what_ours_sets() {
        let ours = retry_policy();
        let other = retry_queue(
            Some("platform.all"),
            json!({"overflow": "reject-publish", "max-length": 1000}),
        );
        let shadowed = shadowing(&ours, &other).expect("shadowed");
        assert_eq!(shadowed.applied.as_deref(), Some("platform.all"));
        assert!(!shadowed.ours_applies());
        let keys: Vec<&str> = shadowed.lost.iter().map(|l| l.key.as_str()).collect();
        assert_eq!(keys, ["dead-letter-exchange", "message-ttl"]);
        assert_eq!(
            shadowed.to_string(),
            r#"policy "platform.all" applies to queue "mail.send.retry" instead of "mailer.mail.send.retry" (one of a higher priority wins); it takes away dead-letter-exchange "mail", message-ttl 300000"#
        );
    }

    #[test]
    fn another_policy_that_sets_the_same_is_still_named() {
        let ours = retry_policy();
        let same = retry_queue(
            Some("copy"),
            json!({"message-ttl": 300000, "dead-letter-exchange": "mail", "overflow": "reject-publish"}),
        );
        let shadowed = shadowing(&ours, &same).expect("another policy applies");
        assert!(shadowed.lost.is_empty());
        assert_eq!(
            shadowed.to_string(),
            r#"policy "copy" applies to queue "mail.send.retry" instead of "mailer.mail.send.retry" (one of a higher priority wins)"#
        );
    }

    #[test]
    fn no_policy_at_all_loses_everything() {
        let ours = retry_policy();
        let none = retry_queue(None, json!({}));
        let shadowed = shadowing(&ours, &none).expect("shadowed");
        assert_eq!(shadowed.lost.len(), 3);
        assert!(
            shadowed.to_string().starts_with(
                r#"no policy applies to queue "mail.send.retry": "mailer.mail.send.retry" is missing or does not match it; it takes away "#
            ),
            "{shadowed}"
        );
    }

    #[test]
    fn an_operator_policy_that_changes_a_key_of_ours_shadows_it() {
        let ours = Policy {
            name: "mailer.mail.send.dead".into(),
            pattern: r"^mail\.send\.dead$".into(),
            definition: map(json!({"delivery-limit": -1, "overflow": "reject-publish"})),
        };
        let mut overridden = effective(
            Some("mailer.mail.send.dead"),
            json!({"delivery-limit": 3, "overflow": "reject-publish", "max-length": 500}),
            json!({}),
        );
        overridden.operator_policy = Some("limits".into());
        let shadowed = shadowing(&ours, &overridden).expect("shadowed");
        assert!(shadowed.ours_applies());
        assert_eq!(
            shadowed.lost,
            [LostSetting {
                key: "delivery-limit".into(),
                ours: json!(-1),
                now: Some(json!(3)),
            }]
        );
        assert_eq!(
            shadowed.to_string(),
            r#"operator policy "limits" overrides "mailer.mail.send.dead" on queue "mail.send.dead"; it changes delivery-limit from -1 to 3"#
        );
    }

    #[test]
    fn a_policy_changed_since_the_last_report_is_said_to_be_pending() {
        let ours = retry_policy();
        let stale = retry_queue(
            Some("mailer.mail.send.retry"),
            json!({"message-ttl": 60000, "dead-letter-exchange": "mail", "overflow": "reject-publish"}),
        );
        let shadowed = shadowing(&ours, &stale).expect("differs");
        assert_eq!(
            shadowed.to_string(),
            r#"queue "mail.send.retry" does not yet have what "mailer.mail.send.retry" sets (the broker reports a policy's changes within 5 s); it changes message-ttl from 300000 to 60000"#
        );
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
