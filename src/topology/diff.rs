//! Comparing what RabbitMQ has with what a pipeline needs: a pure function from the two
//! to the changes that make them agree, or to the conflicts no change may fix.

use std::fmt;

use serde_json::{Map, Value};

use super::desired::{Binding, Exchange, POLICY_PRIORITY, Policy, Queue, Topology};

/// An exchange as RabbitMQ reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedExchange {
    pub name: String,
    pub kind: String,
    pub durable: bool,
    pub auto_delete: bool,
}

/// A queue as RabbitMQ reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedQueue {
    pub name: String,
    pub queue_type: String,
    pub durable: bool,
    pub auto_delete: bool,
    pub exclusive: bool,
    pub arguments: Map<String, Value>,
}

/// A policy as RabbitMQ reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedPolicy {
    pub name: String,
    pub pattern: String,
    pub apply_to: String,
    pub priority: i16,
    pub definition: Map<String, Value>,
}

/// What one virtual host holds, as far as a pipeline cares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub vhost_exists: bool,
    pub exchanges: Vec<ObservedExchange>,
    pub queues: Vec<ObservedQueue>,
    /// Exchange-to-queue bindings.
    pub bindings: Vec<Binding>,
    pub policies: Vec<ObservedPolicy>,
}

/// One write that brings RabbitMQ closer to the desired topology.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    CreateVhost(String),
    CreateExchange(Exchange),
    CreateQueue(Queue),
    CreateBinding(Binding),
    /// Creates the policy, or replaces one of the same name that differs.
    PutPolicy {
        policy: Policy,
        previous: Option<ObservedPolicy>,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CreateVhost(name) => write!(f, "create vhost {name:?}"),
            Self::CreateExchange(e) => {
                write!(f, "create exchange {} ({})", e.name, e.kind.as_str())
            }
            Self::CreateQueue(q) => write!(f, "create queue {} (quorum)", q.name),
            Self::CreateBinding(b) => {
                write!(
                    f,
                    "create binding {} -> {} (routing key {:?})",
                    b.exchange, b.queue, b.routing_key
                )
            }
            Self::PutPolicy {
                policy,
                previous: None,
            } => {
                write!(
                    f,
                    "create policy {} on {}: {}",
                    policy.name,
                    policy.pattern,
                    Value::Object(policy.definition.clone())
                )
            }
            Self::PutPolicy {
                policy,
                previous: Some(previous),
            } => {
                write!(
                    f,
                    "update policy {}: {}",
                    policy.name,
                    policy_differences(policy, previous).join(", ")
                )
            }
        }
    }
}

/// An object that exists with properties the pipeline cannot work with and that only
/// deleting it could change. The mailer never deletes it: that could lose mail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// E.g. `queue "mail.send"`.
    pub object: String,
    /// What is there and what the pipeline needs.
    pub difference: String,
    /// What the user can do about it.
    pub remedy: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}; {}", self.object, self.difference, self.remedy)
    }
}

/// The changes that make `observed` match `desired`, in the order they must be made, or
/// every conflict found (nothing may be written while any remains).
pub fn plan(desired: &Topology, observed: &Observed) -> Result<Vec<Change>, Vec<Conflict>> {
    let mut changes = Vec::new();
    let mut conflicts = Vec::new();

    if !observed.vhost_exists {
        changes.push(Change::CreateVhost(desired.vhost.clone()));
    }
    for exchange in &desired.exchanges {
        match observed.exchanges.iter().find(|e| e.name == exchange.name) {
            None => changes.push(Change::CreateExchange(exchange.clone())),
            Some(found) => conflicts.extend(exchange_conflict(exchange, found)),
        }
    }
    for queue in &desired.queues {
        match observed.queues.iter().find(|q| q.name == queue.name) {
            None => changes.push(Change::CreateQueue(queue.clone())),
            Some(found) => conflicts.extend(queue_conflict(found)),
        }
    }
    for binding in &desired.bindings {
        if !observed.bindings.contains(binding) {
            changes.push(Change::CreateBinding(binding.clone()));
        }
    }
    for policy in &desired.policies {
        let previous = observed.policies.iter().find(|p| p.name == policy.name);
        if previous.is_none_or(|p| !policy_matches(policy, p)) {
            changes.push(Change::PutPolicy {
                policy: policy.clone(),
                previous: previous.cloned(),
            });
        }
    }

    if conflicts.is_empty() {
        Ok(changes)
    } else {
        Err(conflicts)
    }
}

fn exchange_conflict(wanted: &Exchange, found: &ObservedExchange) -> Option<Conflict> {
    let mut differences = Vec::new();
    if found.kind != wanted.kind.as_str() {
        differences.push(format!(
            "is a {} exchange, not {}",
            found.kind,
            wanted.kind.as_str()
        ));
    }
    if !found.durable {
        differences.push("is not durable".to_string());
    }
    if found.auto_delete {
        differences.push("is auto-delete".to_string());
    }
    (!differences.is_empty()).then(|| Conflict {
        object: format!("exchange {:?}", found.name),
        difference: format!("exists but {}", differences.join(" and ")),
        remedy: format!(
            "the pipeline needs a durable {} exchange: delete it yourself once nothing publishes to it, or choose another name in spec.topology",
            wanted.kind.as_str()
        ),
    })
}

fn queue_conflict(found: &ObservedQueue) -> Option<Conflict> {
    let mut differences = Vec::new();
    if found.queue_type != "quorum" {
        differences.push(format!("is a {} queue, not quorum", found.queue_type));
    }
    if !found.durable {
        differences.push("is not durable".to_string());
    }
    if found.auto_delete {
        differences.push("is auto-delete".to_string());
    }
    if found.exclusive {
        differences.push("is exclusive".to_string());
    }
    let mut extra: Vec<String> = found
        .arguments
        .iter()
        .filter(|(key, _)| key.as_str() != "x-queue-type")
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    if !extra.is_empty() {
        extra.sort();
        differences.push(format!(
            "was declared with arguments {} that a policy cannot override",
            extra.join(", ")
        ));
    }
    (!differences.is_empty()).then(|| Conflict {
        object: format!("queue {:?}", found.name),
        difference: format!("exists but {}", differences.join(" and ")),
        remedy: "RabbitMQ cannot change a queue's type or arguments, and the mailer never deletes a queue that may hold mail: \
                 move its messages to another queue (e.g. with a shovel) and delete it, or choose another name in spec.topology"
            .to_string(),
    })
}

fn policy_matches(wanted: &Policy, found: &ObservedPolicy) -> bool {
    found.pattern == wanted.pattern
        && found.apply_to == "queues"
        && found.priority == POLICY_PRIORITY
        && same_definition(&found.definition, &wanted.definition)
}

/// Definitions compare by value, with numbers compared as numbers (`5` and `5.0` agree).
fn same_definition(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|(key, value)| b.get(key).is_some_and(|other| same_value(value, other)))
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// What differs between a policy and the one it replaces, as `key was → now` phrases.
fn policy_differences(wanted: &Policy, found: &ObservedPolicy) -> Vec<String> {
    let mut out = Vec::new();
    if found.pattern != wanted.pattern {
        out.push(format!("pattern {} -> {}", found.pattern, wanted.pattern));
    }
    if found.apply_to != "queues" {
        out.push(format!("apply-to {} -> queues", found.apply_to));
    }
    if found.priority != POLICY_PRIORITY {
        out.push(format!("priority {} -> {POLICY_PRIORITY}", found.priority));
    }
    let mut keys: Vec<&String> = wanted
        .definition
        .keys()
        .chain(found.definition.keys())
        .collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        match (found.definition.get(key), wanted.definition.get(key)) {
            (Some(was), Some(now)) if !same_value(was, now) => {
                out.push(format!("{key} {was} -> {now}"))
            }
            (None, Some(now)) => out.push(format!("{key} (unset) -> {now}")),
            (Some(was), None) => out.push(format!("{key} {was} -> (unset)")),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::spec::TopologySpec;

    fn desired() -> Topology {
        Topology::desired(
            "/",
            &TopologySpec::default(),
            crate::topology::BrokerCapabilities::RABBITMQ_3,
        )
        .unwrap()
    }

    /// What RabbitMQ reports right after the desired topology was applied.
    fn in_sync(t: &Topology) -> Observed {
        Observed {
            vhost_exists: true,
            exchanges: t
                .exchanges
                .iter()
                .map(|e| ObservedExchange {
                    name: e.name.clone(),
                    kind: e.kind.as_str().into(),
                    durable: true,
                    auto_delete: false,
                })
                .collect(),
            queues: t
                .queues
                .iter()
                .map(|q| ObservedQueue {
                    name: q.name.clone(),
                    queue_type: "quorum".into(),
                    durable: true,
                    auto_delete: false,
                    exclusive: false,
                    arguments: json!({"x-queue-type": "quorum"})
                        .as_object()
                        .unwrap()
                        .clone(),
                })
                .collect(),
            bindings: t.bindings.clone(),
            policies: t
                .policies
                .iter()
                .map(|p| ObservedPolicy {
                    name: p.name.clone(),
                    pattern: p.pattern.clone(),
                    apply_to: "queues".into(),
                    priority: POLICY_PRIORITY,
                    definition: p.definition.clone(),
                })
                .collect(),
        }
    }

    #[test]
    fn an_empty_broker_needs_everything_in_dependency_order() {
        let changes = plan(&desired(), &Observed::default()).unwrap();
        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 1 + 3 + 3 + 3 + 3, "{text:#?}");
        assert_eq!(text[0], r#"create vhost "/""#);
        assert_eq!(text[1], "create exchange mail (direct)");
        assert_eq!(text[4], "create queue mail.send (quorum)");
        assert_eq!(
            text[7],
            r#"create binding mail -> mail.send (routing key "mail.send")"#
        );
        assert!(
            text[10].starts_with(r"create policy mailer.mail.send on ^mail\.send$: "),
            "{}",
            text[10]
        );
    }

    #[test]
    fn a_broker_in_sync_needs_nothing() {
        let t = desired();
        assert_eq!(plan(&t, &in_sync(&t)), Ok(vec![]));
    }

    #[test]
    fn numbers_that_come_back_as_floats_still_agree() {
        let t = desired();
        let mut observed = in_sync(&t);
        observed.policies[1]
            .definition
            .insert("message-ttl".into(), json!(300000.0));
        assert_eq!(plan(&t, &observed), Ok(vec![]));
    }

    #[test]
    fn a_missing_binding_and_an_edited_policy_come_back() {
        let t = desired();
        let mut observed = in_sync(&t);
        observed.bindings.remove(1);
        observed.policies[1]
            .definition
            .insert("message-ttl".into(), json!(1000));
        observed.policies[1].definition.remove("overflow");
        observed.policies[0].priority = 0;
        let changes = plan(&t, &observed).unwrap();
        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                r#"create binding mail.retry -> mail.send.retry (routing key "mail.send")"#,
                "update policy mailer.mail.send: priority 0 -> 10",
                r#"update policy mailer.mail.send.retry: message-ttl 1000 -> 300000, overflow (unset) -> "reject-publish""#,
            ]
        );
    }

    #[test]
    fn a_classic_queue_is_a_conflict_that_names_it_and_what_to_do() {
        let t = desired();
        let mut observed = in_sync(&t);
        observed.queues[0].queue_type = "classic".into();
        observed.queues[0].arguments = json!({"x-max-length": 10}).as_object().unwrap().clone();
        observed.exchanges[2].kind = "direct".into();
        let conflicts = plan(&t, &observed).unwrap_err();
        assert_eq!(conflicts.len(), 2);
        assert_eq!(conflicts[0].object, r#"exchange "mail.dead""#);
        assert_eq!(
            conflicts[0].difference,
            "exists but is a direct exchange, not fanout"
        );
        assert_eq!(conflicts[1].object, r#"queue "mail.send""#);
        assert!(
            conflicts[1]
                .difference
                .contains("is a classic queue, not quorum"),
            "{}",
            conflicts[1]
        );
        assert!(
            conflicts[1].difference.contains("x-max-length=10"),
            "{}",
            conflicts[1]
        );
        assert!(conflicts[1].remedy.contains("shovel"));
    }
}
