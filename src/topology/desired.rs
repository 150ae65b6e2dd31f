//! The RabbitMQ objects a pipeline needs, as a pure function of its spec.
//!
//! Queues are declared with nothing but their type; everything that may change later
//! (delay, delivery limit, dead-lettering, length limits) lives in policies, because a
//! queue's arguments can never change once it is declared.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::broker::BrokerCapabilities;
use crate::spec::{InvalidSpec, TopologySpec};

/// Policies of ours win over catch-all policies of lower priority an operator may have.
pub const POLICY_PRIORITY: i16 = 10;
/// Policy names start with this, so a person can tell which policies the mailer owns.
pub const POLICY_PREFIX: &str = "mailer.";
/// A quorum queue's `delivery-limit` that means "no limit" (RabbitMQ 4.0 and later).
pub const NO_DELIVERY_LIMIT: i64 = -1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    Direct,
    Fanout,
}

impl ExchangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Fanout => "fanout",
        }
    }
}

/// A durable exchange that is never deleted automatically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub name: String,
    pub kind: ExchangeKind,
}

/// A quorum queue, declared with `x-queue-type: quorum` and no other argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    pub name: String,
}

/// A binding from an exchange to a queue.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Binding {
    pub exchange: String,
    pub queue: String,
    pub routing_key: String,
}

/// A policy that applies to queues only and matches exactly one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub name: String,
    pub pattern: String,
    pub definition: Map<String, Value>,
}

/// One delay tier: its queue, the routing key it is bound by from the retry exchange, and
/// how long a request parked there waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryTier {
    /// 1-based.
    pub tier: usize,
    pub queue: String,
    pub routing_key: String,
    pub delay: Duration,
}

/// The delay tiers of `t`, in order (one for a spec with `retryDelay` or neither); their
/// names are [`TopologySpec::retry_tier_queues`] and [`TopologySpec::retry_tier_keys`].
pub fn retry_tiers(t: &TopologySpec) -> Result<Vec<RetryTier>, InvalidSpec> {
    let delays = t.retry_delays().map_err(|e| InvalidSpec(vec![e]))?;
    Ok(delays
        .into_iter()
        .zip(t.retry_tier_queues().into_iter().zip(t.retry_tier_keys()))
        .enumerate()
        .map(|(i, (delay, (queue, routing_key)))| RetryTier {
            tier: i + 1,
            queue,
            routing_key,
            delay,
        })
        .collect())
}

/// Everything a pipeline needs in one virtual host. Queues, bindings and policies come in
/// the order send, retry (tier 1), dead, then the further delay tiers' in tier order.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub vhost: String,
    pub exchanges: Vec<Exchange>,
    pub queues: Vec<Queue>,
    pub bindings: Vec<Binding>,
    pub policies: Vec<Policy>,
}

impl Topology {
    /// The topology `t` asks for in `vhost`, on a broker with `broker`'s capabilities.
    /// The spec is taken as validated once by its reader
    /// ([`MailerPipelineSpec::validate`](crate::spec::MailerPipelineSpec::validate)), so
    /// names are not checked again; a retry delay that does not parse is still refused,
    /// since it could not be turned into a TTL.
    pub fn desired(
        vhost: &str,
        t: &TopologySpec,
        broker: BrokerCapabilities,
    ) -> Result<Self, InvalidSpec> {
        let tiers = retry_tiers(t)?;

        let exchanges = vec![
            Exchange {
                name: t.exchange.clone(),
                kind: ExchangeKind::Direct,
            },
            Exchange {
                name: t.retry_exchange.clone(),
                kind: ExchangeKind::Direct,
            },
            Exchange {
                name: t.dead_exchange.clone(),
                kind: ExchangeKind::Fanout,
            },
        ];
        let further = &tiers[1..];
        let queues = [&t.queue, &t.retry_queue, &t.dead_queue]
            .into_iter()
            .chain(further.iter().map(|tier| &tier.queue))
            .map(|name| Queue { name: name.clone() })
            .collect();
        // The send queue's name is the routing key of every request, so a request parked
        // through the retry exchange comes back to it under the same key. The further
        // tiers are bound by their own keys; each dead-letters with the send key.
        let mut bindings = vec![
            Binding {
                exchange: t.exchange.clone(),
                queue: t.queue.clone(),
                routing_key: t.queue.clone(),
            },
            Binding {
                exchange: t.retry_exchange.clone(),
                queue: t.retry_queue.clone(),
                routing_key: t.queue.clone(),
            },
            Binding {
                exchange: t.dead_exchange.clone(),
                queue: t.dead_queue.clone(),
                routing_key: String::new(),
            },
        ];
        bindings.extend(further.iter().map(|tier| Binding {
            exchange: t.retry_exchange.clone(),
            queue: tier.queue.clone(),
            routing_key: tier.routing_key.clone(),
        }));

        let retry = |tier: &RetryTier| {
            let mut retry = json!({
                "message-ttl": tier.delay.as_millis() as u64,
                "dead-letter-exchange": t.exchange,
                "dead-letter-routing-key": t.queue,
                "dead-letter-strategy": "at-least-once",
                "overflow": "reject-publish",
            });
            if let Some(max) = t.retry_queue_max_length {
                retry["max-length"] = json!(max);
            }
            policy_for(&tier.queue, retry)
        };
        let send = json!({
            "delivery-limit": t.delivery_limit,
            "dead-letter-exchange": t.dead_exchange,
            "dead-letter-strategy": "at-least-once",
            "overflow": "reject-publish",
        });
        let mut policies = vec![
            policy_for(&t.queue, send),
            retry(&tiers[0]),
            policy_for(&t.dead_queue, dead_queue_policy(t, broker)),
        ];
        policies.extend(further.iter().map(retry));

        Ok(Self {
            vhost: vhost.to_string(),
            exchanges,
            queues,
            bindings,
            policies,
        })
    }
}

/// The dead queue's policy. Reading a dead letter (`mailer dead list`, the management
/// UI's "get messages") delivers it and returns it, which counts as a delivery, so on
/// RabbitMQ 4.x, whose quorum queues have a default delivery limit of 20, the policy lifts
/// the limit, or every dead letter would be dropped at its 21st look. RabbitMQ 3.x has no
/// default limit and refuses -1, so there the policy says nothing about it.
///
/// The policy is there on every broker, even with nothing else to say, because RabbitMQ
/// applies one policy per queue, the matching one of highest priority: a catch-all policy
/// of a user with a lower priority than ours (a `max-length` that drops the oldest, a
/// `message-ttl`, a delivery limit) never applies to dead letters. `overflow:
/// reject-publish` keeps a length limit, ours or an operator policy's, from dropping the
/// oldest dead letter: the worker's dead-letter publish is refused instead, and the request
/// stays in the send queue.
fn dead_queue_policy(t: &TopologySpec, broker: BrokerCapabilities) -> Value {
    let mut dead = json!({"overflow": "reject-publish"});
    if broker.default_delivery_limit {
        dead["delivery-limit"] = json!(NO_DELIVERY_LIMIT);
    }
    if let Some(max) = t.dead_queue_max_length {
        dead["max-length"] = json!(max);
    }
    dead
}

fn policy_for(queue: &str, definition: Value) -> Policy {
    let Value::Object(definition) = definition else {
        unreachable!("policy definitions are built as JSON objects")
    };
    Policy {
        name: policy_name(queue),
        pattern: exact_pattern(queue),
        definition,
    }
}

/// The name of the policy of `queue`.
pub fn policy_name(queue: &str) -> String {
    format!("{POLICY_PREFIX}{queue}")
}

/// A regular expression that matches exactly `name` and nothing else.
pub fn exact_pattern(name: &str) -> String {
    format!("^{}$", escape_regex(name))
}

/// A regular expression that matches exactly one of `names` and nothing else.
pub fn exact_alternatives(names: &[&str]) -> String {
    let escaped: Vec<String> = names.iter().map(|name| escape_regex(name)).collect();
    format!("^({})$", escaped.join("|"))
}

/// `name` with every regular-expression metacharacter escaped.
fn escape_regex(name: &str) -> String {
    let mut escaped = String::with_capacity(name.len() + 6);
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> crate::spec::MailerPipelineSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn topology(yaml: &str) -> Topology {
        let spec = spec(yaml);
        Topology::desired(
            &spec.rabbitmq.vhost,
            &spec.topology,
            BrokerCapabilities::RABBITMQ_3,
        )
        .unwrap()
    }

    #[test]
    fn the_default_topology_is_the_designs() {
        let t = topology("rabbitmq: {vhost: shop}");
        assert_eq!(t.vhost, "shop");
        let exchanges: Vec<_> = t
            .exchanges
            .iter()
            .map(|e| (e.name.as_str(), e.kind))
            .collect();
        assert_eq!(
            exchanges,
            [
                ("mail", ExchangeKind::Direct),
                ("mail.retry", ExchangeKind::Direct),
                ("mail.dead", ExchangeKind::Fanout)
            ]
        );
        let queues: Vec<_> = t.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(queues, ["mail.send", "mail.send.retry", "mail.send.dead"]);
        let bindings: Vec<_> = t
            .bindings
            .iter()
            .map(|b| {
                (
                    b.exchange.as_str(),
                    b.queue.as_str(),
                    b.routing_key.as_str(),
                )
            })
            .collect();
        assert_eq!(
            bindings,
            [
                ("mail", "mail.send", "mail.send"),
                ("mail.retry", "mail.send.retry", "mail.send"),
                ("mail.dead", "mail.send.dead", "")
            ]
        );
        assert_eq!(t.policies.len(), 3);
        assert_eq!(t.policies[0].name, "mailer.mail.send");
        assert_eq!(t.policies[0].pattern, r"^mail\.send$");
        assert_eq!(
            Value::Object(t.policies[0].definition.clone()),
            json!({"delivery-limit": 5, "dead-letter-exchange": "mail.dead", "dead-letter-strategy": "at-least-once", "overflow": "reject-publish"})
        );
        assert_eq!(t.policies[1].name, "mailer.mail.send.retry");
        assert_eq!(t.policies[1].pattern, r"^mail\.send\.retry$");
        assert_eq!(
            Value::Object(t.policies[1].definition.clone()),
            json!({"message-ttl": 300000, "dead-letter-exchange": "mail", "dead-letter-routing-key": "mail.send", "dead-letter-strategy": "at-least-once", "overflow": "reject-publish"})
        );
        assert_eq!(t.policies[2].name, "mailer.mail.send.dead");
        assert_eq!(t.policies[2].pattern, r"^mail\.send\.dead$");
        assert_eq!(
            Value::Object(t.policies[2].definition.clone()),
            json!({"overflow": "reject-publish"})
        );
    }

    #[test]
    fn on_rabbitmq_4_the_dead_queue_has_no_delivery_limit() {
        let spec = spec("topology: {deadQueueMaxLength: 50}").topology;
        let on_4 = Topology::desired("/", &spec, BrokerCapabilities::RABBITMQ_4).unwrap();
        assert_eq!(
            Value::Object(on_4.policies[2].definition.clone()),
            json!({"delivery-limit": -1, "max-length": 50, "overflow": "reject-publish"})
        );
        let on_3 = Topology::desired("/", &spec, BrokerCapabilities::RABBITMQ_3).unwrap();
        assert_eq!(
            Value::Object(on_3.policies[2].definition.clone()),
            json!({"max-length": 50, "overflow": "reject-publish"})
        );
        assert_eq!(
            on_3.policies[..2],
            on_4.policies[..2],
            "only the dead queue's policy depends on the version"
        );
    }

    #[test]
    fn other_names_give_the_same_shape() {
        let t = topology(
            "topology: {exchange: shop, queue: shop.out, retryExchange: shop.later, retryQueue: shop.wait, \
             deadExchange: shop.dead, deadQueue: shop.graveyard, retryDelay: 1h30m, deliveryLimit: 7, \
             retryQueueMaxLength: 1000, deadQueueMaxLength: 50}",
        );
        assert_eq!(
            t.bindings[1],
            Binding {
                exchange: "shop.later".into(),
                queue: "shop.wait".into(),
                routing_key: "shop.out".into()
            }
        );
        assert_eq!(t.policies[0].definition["delivery-limit"], json!(7));
        assert_eq!(
            t.policies[0].definition["dead-letter-exchange"],
            json!("shop.dead")
        );
        assert_eq!(t.policies[1].definition["message-ttl"], json!(5_400_000));
        assert_eq!(
            t.policies[1].definition["dead-letter-exchange"],
            json!("shop")
        );
        assert_eq!(
            t.policies[1].definition["dead-letter-routing-key"],
            json!("shop.out")
        );
        assert_eq!(t.policies[1].definition["max-length"], json!(1000));
        assert_eq!(t.policies[2].pattern, r"^shop\.graveyard$");
        assert_eq!(
            Value::Object(t.policies[2].definition.clone()),
            json!({"max-length": 50, "overflow": "reject-publish"})
        );
    }

    #[test]
    fn each_delay_tier_has_its_queue_binding_and_ttl() {
        let t = topology("topology: {retryDelays: [1s, 2s, 3s, 4s], retryQueueMaxLength: 9}");
        let queues: Vec<_> = t.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(
            queues,
            [
                "mail.send",
                "mail.send.retry",
                "mail.send.dead",
                "mail.send.retry.2",
                "mail.send.retry.3",
                "mail.send.retry.4"
            ]
        );
        let from_retry: Vec<_> = t
            .bindings
            .iter()
            .filter(|b| b.exchange == "mail.retry")
            .map(|b| (b.queue.as_str(), b.routing_key.as_str()))
            .collect();
        assert_eq!(
            from_retry,
            [
                ("mail.send.retry", "mail.send"),
                ("mail.send.retry.2", "mail.send.retry.2"),
                ("mail.send.retry.3", "mail.send.retry.3"),
                ("mail.send.retry.4", "mail.send.retry.4")
            ]
        );
        let retry_policies: Vec<_> = t
            .policies
            .iter()
            .filter(|p| p.name.starts_with("mailer.mail.send.retry"))
            .map(|p| {
                (
                    p.name.as_str(),
                    p.pattern.as_str(),
                    Value::Object(p.definition.clone()),
                )
            })
            .collect();
        let expect = |ttl: u64| {
            json!({"message-ttl": ttl, "dead-letter-exchange": "mail", "dead-letter-routing-key": "mail.send",
                   "dead-letter-strategy": "at-least-once", "overflow": "reject-publish", "max-length": 9})
        };
        assert_eq!(
            retry_policies,
            [
                (
                    "mailer.mail.send.retry",
                    r"^mail\.send\.retry$",
                    expect(1000)
                ),
                (
                    "mailer.mail.send.retry.2",
                    r"^mail\.send\.retry\.2$",
                    expect(2000)
                ),
                (
                    "mailer.mail.send.retry.3",
                    r"^mail\.send\.retry\.3$",
                    expect(3000)
                ),
                (
                    "mailer.mail.send.retry.4",
                    r"^mail\.send\.retry\.4$",
                    expect(4000)
                )
            ]
        );
    }

    #[test]
    fn one_tier_is_the_one_delay() {
        let one = topology("topology: {retryDelays: [5m]}");
        assert_eq!(one, topology("topology: {retryDelay: 5m}"));
        assert_eq!(one, topology("{}"));
    }

    #[test]
    fn an_invalid_spec_gives_no_topology() {
        for yaml in [
            "topology: {retryDelay: banana}",
            "topology: {retryDelays: [2m, 1m]}",
            "topology: {retryDelay: 1m, retryDelays: [2m]}",
        ] {
            let spec = spec(yaml).topology;
            assert!(
                Topology::desired("/", &spec, BrokerCapabilities::RABBITMQ_4).is_err(),
                "{yaml}"
            );
        }
    }

    #[test]
    fn patterns_escape_every_regex_metacharacter() {
        assert_eq!(
            exact_pattern("a.b*c+(d)|[e]{f}^$?\\"),
            r"^a\.b\*c\+\(d\)\|\[e\]\{f\}\^\$\?\\$"
        );
        assert_eq!(
            exact_alternatives(&["mail.retry", "mail.dead"]),
            r"^(mail\.retry|mail\.dead)$"
        );
    }
}
