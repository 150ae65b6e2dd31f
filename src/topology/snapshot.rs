//! A vhost's definitions read once for a pass over many of its pipelines: one request,
//! instead of [`READS_PER_PIPELINE`](super::READS_PER_PIPELINE) per pipeline.
//!
//! Definitions leave out exclusive queues (they die with their connection), so a queue
//! that the definitions lack is read by name before a plan may create it: a queue of
//! another kind in the way is then still found before the first write.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::TopologyError;
use super::desired::{Binding, Topology};
use super::diff::{Observed, ObservedExchange, ObservedPolicy, ObservedQueue};
use super::management::Management;

/// From this many pipelines of a pass in one vhost, the pass reads the vhost's
/// definitions once instead of each pipeline's objects by name. Fewer are cheaper by
/// name: the definitions of a vhost grow with everything in it.
pub const DEFINITIONS_FROM: usize = 8;

/// The objects of one vhost, by name. The arguments of queues and the definitions of
/// policies are kept as JSON text: parsed, each is a map of at least 640 bytes (a node of
/// a `BTreeMap`), ten times its text, and a vhost holds thousands.
#[derive(Debug, Default)]
pub struct Snapshot {
    exchanges: HashMap<String, ObservedExchange>,
    /// Each queue with empty arguments, and its arguments.
    queues: HashMap<String, (ObservedQueue, Box<str>)>,
    /// Exchange-to-queue bindings, by queue.
    bindings: HashMap<String, Vec<Binding>>,
    /// Each policy with an empty definition, and its definition.
    policies: HashMap<String, (ObservedPolicy, Box<str>)>,
}

impl Snapshot {
    /// The snapshot of the definitions in `body`, as `GET /api/definitions/{vhost}`
    /// returns them.
    pub fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        let set: Definitions = serde_json::from_slice(body)?;
        let mut snapshot = Snapshot::default();
        for e in set.exchanges {
            snapshot.exchanges.insert(e.name.clone(), exchange(e));
        }
        for q in set.queues {
            let mut queue = queue(q);
            let arguments = pack(&std::mem::take(&mut queue.arguments));
            snapshot
                .queues
                .insert(queue.name.clone(), (queue, arguments));
        }
        for b in set.bindings {
            if let Some(binding) = binding(b) {
                snapshot
                    .bindings
                    .entry(binding.queue.clone())
                    .or_default()
                    .push(binding);
            }
        }
        for p in set.policies {
            let mut policy = policy(p);
            let definition = pack(&std::mem::take(&mut policy.definition));
            snapshot
                .policies
                .insert(policy.name.clone(), (policy, definition));
        }
        Ok(snapshot)
    }

    /// What the snapshot holds of `topology`'s objects.
    pub fn observed(&self, topology: &Topology) -> Observed {
        Observed {
            vhost_exists: true,
            exchanges: topology
                .exchanges
                .iter()
                .filter_map(|e| self.exchanges.get(&e.name).cloned())
                .collect(),
            queues: topology
                .queues
                .iter()
                .filter_map(|q| self.queues.get(&q.name))
                .map(|(queue, arguments)| ObservedQueue {
                    arguments: unpack(arguments),
                    ..queue.clone()
                })
                .collect(),
            bindings: topology
                .queues
                .iter()
                .filter_map(|q| self.bindings.get(&q.name))
                .flatten()
                .cloned()
                .collect(),
            policies: topology
                .policies
                .iter()
                .filter_map(|p| self.policies.get(&p.name))
                .map(|(policy, definition)| ObservedPolicy {
                    definition: unpack(definition),
                    ..policy.clone()
                })
                .collect(),
        }
    }
}

/// What a client keeps for [`Management::shared_snapshot`]: by vhost, the definitions
/// last read and when, and when it last wrote there.
#[derive(Default)]
pub(super) struct SharedSnapshots {
    read: HashMap<String, (Instant, Option<Arc<Snapshot>>)>,
    written: HashMap<String, Instant>,
}

impl Management {
    /// Notes a write to `vhost` through this client: definitions read before it no longer
    /// serve.
    pub(super) fn wrote_to(&self, vhost: &str) {
        self.snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .written
            .insert(vhost.to_string(), Instant::now());
    }

    /// The definitions of `vhost` as read at most `max_age` ago and after this client's
    /// last write there, else read now, but only when nothing was written there through
    /// this client for `max_age` (a vhost being built is read by name); `None` when there
    /// are none to use (always, for a zero `max_age`). One read at a time per client, so
    /// work running at once shares it.
    pub(super) async fn shared_snapshot(
        &self,
        vhost: &str,
        max_age: Duration,
    ) -> Result<Option<Arc<Snapshot>>, TopologyError> {
        if max_age.is_zero() {
            return Ok(None);
        }
        let cached = |this: &Self| {
            let shared = this
                .snapshots
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let written = shared.written.get(vhost).copied();
            if written.is_some_and(|at| at.elapsed() < max_age) {
                return Some(None);
            }
            match shared.read.get(vhost) {
                Some((at, found)) if at.elapsed() < max_age && written.is_none_or(|w| w < *at) => {
                    Some(found.clone())
                }
                _ => None,
            }
        };
        if let Some(found) = cached(self) {
            return Ok(found);
        }
        let _reading = self.snapshot_read.lock().await;
        if let Some(found) = cached(self) {
            return Ok(found);
        }
        let at = Instant::now();
        // A vhost this user may not read whole is read by name until `max_age` passed,
        // and so is one whose definitions could not be read (those waiting meanwhile do
        // not each wait for another try).
        let (kept, found) = match self.snapshot(vhost).await {
            Ok(snapshot) => {
                let kept = snapshot.map(Arc::new);
                (kept.clone(), Ok(kept))
            }
            Err(e) => (None, Err(e)),
        };
        self.snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .read
            .insert(vhost.to_string(), (at, kept));
        found
    }

    /// The definitions of `vhost`, or `None` when this user may not read them (they need
    /// the administrator tag) or the vhost does not exist: then read by name instead.
    ///
    /// Requested without the management client library, whose error for a refused
    /// request (RabbitMQ answers 400 for the definitions of a vhost that does not exist,
    /// as every vhost of a first pass) captures and symbolizes a backtrace: tens of
    /// megabytes of the binary's debug information mapped and parsed, and kept. Parsed
    /// into only the fields a pipeline's objects are compared by.
    pub async fn snapshot(&self, vhost: &str) -> Result<Option<Snapshot>, TopologyError> {
        let action = format!("read the definitions of vhost {vhost:?}");
        let path = format!(
            "definitions/{}",
            percent_encoding::utf8_percent_encode(vhost, percent_encoding::NON_ALPHANUMERIC)
        );
        let (status, body) = self
            .read(async {
                let response = self.get(&path).send().await?;
                let status = response.status();
                let body = response.bytes().await?;
                Ok((status, body))
            })
            .await
            .map_err(|e: reqwest::Error| TopologyError::unreachable(self.endpoint(), &e))?;
        match status.as_u16() {
            200..=299 => {}
            400 | 401 | 403 | 404 => return Ok(None),
            code => {
                return Err(TopologyError::Refused {
                    action,
                    status: code,
                    reason: crate::text::truncate_bytes(
                        String::from_utf8_lossy(&body).into_owned(),
                        300,
                    ),
                });
            }
        }
        let snapshot = Snapshot::parse(&body).map_err(|e| TopologyError::Refused {
            action,
            status: status.as_u16(),
            reason: format!("the answer is not a vhost's definitions: {e}"),
        })?;
        Ok(Some(snapshot))
    }

    /// What `snapshot` holds of `topology`'s objects, each queue it lacks read by name
    /// first; when any such queue exists after all, the pipeline is read by name.
    pub async fn observe_in_snapshot(
        &self,
        topology: &Topology,
        snapshot: &Snapshot,
    ) -> Result<Observed, TopologyError> {
        let lacking = topology
            .queues
            .iter()
            .filter(|q| !snapshot.queues.contains_key(&q.name));
        let found =
            futures::future::try_join_all(lacking.map(|q| self.queue(&topology.vhost, &q.name)))
                .await?;
        if found.iter().any(Option::is_some) {
            return self.observe_topology(topology, true).await;
        }
        Ok(snapshot.observed(topology))
    }
}

/// A map as the JSON text [`unpack`] reads back; nothing for an empty one.
fn pack(map: &Map<String, Value>) -> Box<str> {
    if map.is_empty() {
        return Box::default();
    }
    serde_json::to_string(map)
        .unwrap_or_default()
        .into_boxed_str()
}

fn unpack(text: &str) -> Map<String, Value> {
    serde_json::from_str(text).unwrap_or_default()
}

/// What `GET /api/definitions/{vhost}` returns, as far as it is read: the rest (the
/// vhost's parameters, limits, metadata, the objects' other fields) is skipped, not kept.
#[derive(Deserialize)]
struct Definitions {
    #[serde(default)]
    exchanges: Vec<DefinedExchange>,
    #[serde(default)]
    queues: Vec<DefinedQueue>,
    #[serde(default)]
    bindings: Vec<DefinedBinding>,
    #[serde(default)]
    policies: Vec<DefinedPolicy>,
}

#[derive(Deserialize)]
struct DefinedExchange {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    durable: bool,
    auto_delete: bool,
}

#[derive(Deserialize)]
struct DefinedQueue {
    name: String,
    durable: bool,
    auto_delete: bool,
    #[serde(default)]
    arguments: Map<String, Value>,
}

#[derive(Deserialize)]
struct DefinedBinding {
    source: String,
    destination: String,
    destination_type: String,
    routing_key: String,
}

#[derive(Deserialize)]
struct DefinedPolicy {
    name: String,
    pattern: String,
    #[serde(rename = "apply-to")]
    apply_to: String,
    priority: i16,
    #[serde(default)]
    definition: Option<Map<String, Value>>,
}

fn exchange(e: DefinedExchange) -> ObservedExchange {
    ObservedExchange {
        name: e.name,
        kind: e.kind,
        durable: e.durable,
        auto_delete: e.auto_delete,
    }
}

/// A queue from its definition, which has no type of its own before RabbitMQ 4: the
/// `x-queue-type` argument says it, and a queue without one is classic. A queue in the
/// definitions is never exclusive.
fn queue(q: DefinedQueue) -> ObservedQueue {
    let queue_type = q
        .arguments
        .get("x-queue-type")
        .and_then(|t| t.as_str())
        .unwrap_or("classic")
        .to_string();
    ObservedQueue {
        name: q.name,
        queue_type,
        durable: q.durable,
        auto_delete: q.auto_delete,
        exclusive: false,
        arguments: q.arguments,
    }
}

/// An exchange-to-queue binding; `None` for exchange-to-exchange ones and those of the
/// default exchange (which definitions do not list anyway).
fn binding(b: DefinedBinding) -> Option<Binding> {
    let to_queue = b.destination_type == "queue" && !b.source.is_empty();
    to_queue.then_some(Binding {
        exchange: b.source,
        queue: b.destination,
        routing_key: b.routing_key,
    })
}

/// The policy's target keeps the definitions' name for it (`queues`, `quorum_queues`,
/// ...), the one a policy read by name is given too.
fn policy(p: DefinedPolicy) -> ObservedPolicy {
    ObservedPolicy {
        name: p.name,
        pattern: p.pattern,
        apply_to: p.apply_to,
        priority: p.priority,
        definition: p.definition.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::BrokerCapabilities;

    /// Definitions as RabbitMQ 4.0 exports them, with one pipeline's objects (and one
    /// object of someone else's).
    fn definitions() -> String {
        serde_json::json!({
            "rabbitmq_version": "4.0.5",
            "parameters": [], "limits": {}, "metadata": {"description": ""},
            "exchanges": [
                {"name": "mail", "type": "direct", "durable": true, "auto_delete": false,
                 "internal": false, "arguments": {}},
                {"name": "theirs", "type": "topic", "durable": true, "auto_delete": false,
                 "internal": false, "arguments": {}}
            ],
            "queues": [
                {"name": "mail.send", "durable": true, "auto_delete": false,
                 "arguments": {"x-queue-type": "quorum"}},
                {"name": "mail.send.retry", "durable": true, "auto_delete": false, "arguments": {}}
            ],
            "bindings": [
                {"source": "mail", "destination": "mail.send", "destination_type": "queue",
                 "routing_key": "mail.send", "arguments": {}},
                {"source": "mail", "destination": "theirs", "destination_type": "exchange",
                 "routing_key": "x", "arguments": {}}
            ],
            "policies": [
                {"name": "mailer.mail.send", "pattern": "^mail\\.send$", "apply-to": "queues",
                 "definition": {"delivery-limit": 5, "dead-letter-exchange": "mail.retry"},
                 "priority": 10}
            ]
        })
        .to_string()
    }

    #[test]
    fn definitions_give_the_objects_of_a_pipeline_as_read_by_name() {
        let snapshot = Snapshot::parse(definitions().as_bytes()).unwrap();
        let spec: crate::spec::TopologySpec = serde_yaml::from_str("{}").unwrap();
        let topology = Topology::desired("v", &spec, BrokerCapabilities::RABBITMQ_4).unwrap();
        let observed = snapshot.observed(&topology);
        assert!(observed.vhost_exists);
        assert_eq!(
            observed.exchanges,
            [ObservedExchange {
                name: "mail".into(),
                kind: "direct".into(),
                durable: true,
                auto_delete: false,
            }]
        );
        let send = &observed.queues[0];
        assert_eq!(
            (send.name.as_str(), send.queue_type.as_str()),
            ("mail.send", "quorum")
        );
        assert_eq!(send.arguments["x-queue-type"], "quorum");
        let retry = &observed.queues[1];
        assert_eq!(retry.queue_type, "classic", "no x-queue-type: classic");
        assert!(retry.arguments.is_empty());
        assert_eq!(
            observed.bindings,
            [Binding {
                exchange: "mail".into(),
                queue: "mail.send".into(),
                routing_key: "mail.send".into(),
            }]
        );
        let policy = &observed.policies[0];
        assert_eq!(policy.apply_to, "queues");
        assert_eq!(policy.priority, 10);
        assert_eq!(policy.definition["delivery-limit"], 5);
        assert_eq!(policy.definition["dead-letter-exchange"], "mail.retry");
    }

    #[test]
    fn an_answer_that_is_not_definitions_is_an_error() {
        assert!(Snapshot::parse(b"<html>").is_err());
        assert!(Snapshot::parse(br#"{"queues": [{"name": 1}]}"#).is_err());
        let empty = Snapshot::parse(b"{}").unwrap();
        assert!(empty.queues.is_empty());
    }
}
