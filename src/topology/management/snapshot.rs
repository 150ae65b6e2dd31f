//! A vhost's definitions read once for a pass over many of its pipelines: one request,
//! instead of [`READS_PER_PIPELINE`](super::READS_PER_PIPELINE) per pipeline.
//!
//! Definitions leave out exclusive queues (they die with their connection), so a queue
//! that the definitions lack is read by name before a plan may create it: a queue of
//! another kind in the way is then still found before the first write. Work that holds
//! claims on its queues ([`Management::shared_observe`]) need not: a claim is decided on
//! the vhost's list of every queue, exclusive ones included.
//!
//! The definitions a client shares between work running at once are kept current by
//! that client's own writes: an exchange, queue, binding or policy it made is added to
//! them when the broker has taken it, so a vhost being built by many reconciles is read
//! once, not by name for each. Any other write there (a removal, a failed write, a
//! declaration over AMQP) stops them serving until they are read again.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use rabbitmq_http_client::responses::{
    BindingDefinitionWithoutVirtualHost, ExchangeDefinitionWithoutVirtualHost,
    PolicyWithoutVirtualHost, QueueDefinitionWithoutVirtualHost, VirtualHostDefinitionSet,
};
use serde_json::{Map, Value};

use super::Management;
use super::observe::{policy_target_name, queue_binding_of};
use crate::topology::desired::{Binding, POLICY_PRIORITY, Topology};
use crate::topology::diff::{Change, Observed, ObservedExchange, ObservedPolicy, ObservedQueue};
use crate::topology::error::TopologyError;

/// From this many pipelines of a pass in one vhost, the pass reads the vhost's
/// definitions once instead of each pipeline's objects by name. Fewer are cheaper by
/// name: the definitions of a vhost grow with everything in it.
pub const DEFINITIONS_FROM: usize = 8;

/// The objects of one vhost, by name.
#[derive(Debug, Default)]
pub struct Snapshot {
    exchanges: HashMap<String, ObservedExchange>,
    queues: HashMap<String, ObservedQueue>,
    /// Exchange-to-queue bindings, by queue.
    bindings: HashMap<String, Vec<Binding>>,
    policies: HashMap<String, ObservedPolicy>,
}

impl Snapshot {
    /// What this holds of `topology`'s objects.
    fn of(&self, topology: &Topology) -> Observed {
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
                .filter_map(|q| self.queues.get(&q.name).cloned())
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
                .filter_map(|p| self.policies.get(&p.name).cloned())
                .collect(),
        }
    }

    /// Adds what `change` made, as the definitions would show it once the broker took it.
    fn add(&mut self, change: &Change) {
        match change {
            Change::CreateVhost(_) => {}
            Change::CreateExchange(e) => {
                let exchange = ObservedExchange {
                    name: e.name.clone(),
                    kind: e.kind.as_str().to_string(),
                    durable: true,
                    auto_delete: false,
                };
                self.exchanges.insert(e.name.clone(), exchange);
            }
            Change::CreateQueue(q) => {
                let arguments = Map::from_iter([("x-queue-type".into(), Value::from("quorum"))]);
                let queue = ObservedQueue {
                    name: q.name.clone(),
                    queue_type: "quorum".into(),
                    durable: true,
                    auto_delete: false,
                    exclusive: false,
                    arguments,
                };
                self.queues.insert(q.name.clone(), queue);
            }
            Change::CreateBinding(b) => {
                let bindings = self.bindings.entry(b.queue.clone()).or_default();
                if !bindings.contains(b) {
                    bindings.push(b.clone());
                }
            }
            Change::PutPolicy { policy, .. } => {
                let observed = ObservedPolicy {
                    name: policy.name.clone(),
                    pattern: policy.pattern.clone(),
                    apply_to: "queues".into(),
                    priority: POLICY_PRIORITY,
                    definition: policy.definition.clone(),
                };
                self.policies.insert(policy.name.clone(), observed);
            }
        }
    }
}

/// How many times [`Management::shared_observe`] reads a vhost's definitions while this
/// client makes the vhost, before it reads the pipeline by name instead.
const READS_WHILE_MADE: usize = 2;

/// What a client keeps for [`Management::shared_observe`]: by vhost, the definitions
/// last read and when (kept current by the client's own writes since), when it last
/// wrote there, and last wrote what they cannot follow, and what it made while they were
/// being read.
#[derive(Default)]
pub(in crate::topology) struct SharedSnapshots {
    read: HashMap<String, (Instant, Option<Snapshot>)>,
    written: HashMap<String, Instant>,
    unfollowed: HashMap<String, Instant>,
    /// By vhost whose definitions are being read: what this client made meanwhile, which
    /// the answer may or may not show yet.
    made_while_reading: HashMap<String, Vec<Change>>,
}

impl Management {
    /// Notes a write to `vhost` through this client that its kept definitions cannot
    /// follow (a removal, a failed write): they no longer serve.
    pub(in crate::topology) fn wrote_to(&self, vhost: &str) {
        let mut shared = self.shared_snapshots();
        let now = Instant::now();
        shared.written.insert(vhost.to_string(), now);
        shared.unfollowed.insert(vhost.to_string(), now);
        shared.read.remove(vhost);
    }

    /// Notes that `changes` were made in `vhost` through this client: its kept
    /// definitions show them from now on (a vhost created is read again: it may have
    /// existed, with objects of its own).
    pub(in crate::topology) fn made<'a>(
        &self,
        vhost: &str,
        changes: impl IntoIterator<Item = &'a Change>,
    ) {
        let mut shared = self.shared_snapshots();
        shared.written.insert(vhost.to_string(), Instant::now());
        for change in changes {
            if let Some(made) = shared.made_while_reading.get_mut(vhost) {
                made.push(change.clone());
            }
            if matches!(change, Change::CreateVhost(_)) {
                shared.read.remove(vhost);
            } else if let Some((_, Some(snapshot))) = shared.read.get_mut(vhost) {
                snapshot.add(change);
            }
        }
    }

    /// How long ago this client last wrote to `vhost` (made or removed something);
    /// `None` when it never did.
    pub fn since_written(&self, vhost: &str) -> Option<Duration> {
        self.shared_snapshots()
            .written
            .get(vhost)
            .map(Instant::elapsed)
    }

    fn shared_snapshots(&self) -> std::sync::MutexGuard<'_, SharedSnapshots> {
        self.snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What `topology`'s vhost holds of its objects, from the vhost's definitions as read
    /// at most `max_age` ago and kept current by this client's own writes since, else read
    /// now; but not while something this client wrote there in the last `max_age` could
    /// not be followed (then it is read by name). `None` when there are none to use
    /// (always, for a zero `max_age`; and for a vhost missing or this user may not read
    /// whole). One read at a time per client, so work running at once shares it.
    ///
    /// For work that holds claims on the topology's queues: a queue the definitions lack
    /// (an exclusive one would be) is not read by name, as a claim was decided on the
    /// vhost's list of every queue.
    pub(in crate::topology) async fn shared_observe(
        &self,
        topology: &Topology,
        max_age: Duration,
    ) -> Result<Option<Observed>, TopologyError> {
        if max_age.is_zero() {
            return Ok(None);
        }
        let vhost = topology.vhost.as_str();
        let cached = |this: &Self| {
            let shared = this.shared_snapshots();
            let written = shared.unfollowed.get(vhost).copied();
            if written.is_some_and(|at| at.elapsed() < max_age) {
                return Some(None);
            }
            match shared.read.get(vhost) {
                Some((at, found)) if at.elapsed() < max_age && written.is_none_or(|w| w < *at) => {
                    Some(found.as_ref().map(|snapshot| snapshot.of(topology)))
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
        // The vhost made while its definitions were read: the answer may be from before,
        // so they are read again at once (once), rather than every object of the
        // pipeline by name, as the reconciles of a first pass would then do.
        for _ in 0..READS_WHILE_MADE {
            let at = Instant::now();
            self.shared_snapshots()
                .made_while_reading
                .insert(vhost.to_string(), Vec::new());
            let read = self.snapshot(vhost).await;
            let mut shared = self.shared_snapshots();
            let made = shared.made_while_reading.remove(vhost).unwrap_or_default();
            // A vhost this user may not read whole is read by name until `max_age`
            // passed, and so is one whose definitions could not be read (those waiting
            // meanwhile do not each wait for another try).
            let (mut kept, found) = match read {
                Ok(snapshot) => (snapshot, Ok(())),
                Err(e) => (None, Err(e)),
            };
            if made.iter().any(|c| matches!(c, Change::CreateVhost(_))) {
                found?;
                continue;
            }
            if let Some(snapshot) = &mut kept {
                made.iter().for_each(|change| snapshot.add(change));
            }
            let observed = kept.as_ref().map(|snapshot| snapshot.of(topology));
            shared.read.insert(vhost.to_string(), (at, kept));
            return found.map(|()| observed);
        }
        // Made again while read again: read by name this time.
        Ok(None)
    }

    /// The definitions of `vhost`, or `None` when this user may not read them (they need
    /// the administrator tag) or the vhost went away: then read by name instead.
    pub async fn snapshot(&self, vhost: &str) -> Result<Option<Snapshot>, TopologyError> {
        let action = format!("read the definitions of vhost {vhost:?}");
        let Some(set) = self
            .get_json_unless_refused::<VirtualHostDefinitionSet>(&["definitions", vhost], &action)
            .await?
        else {
            return Ok(None);
        };
        let mut snapshot = Snapshot::default();
        for e in set.exchanges {
            snapshot.exchanges.insert(e.name.clone(), exchange(e));
        }
        for q in set.queues {
            snapshot.queues.insert(q.name.clone(), queue(q));
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
            snapshot.policies.insert(p.name.clone(), policy(p));
        }
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
        Ok(snapshot.of(topology))
    }
}

fn exchange(e: ExchangeDefinitionWithoutVirtualHost) -> ObservedExchange {
    ObservedExchange {
        name: e.name,
        kind: e.exchange_type,
        durable: e.durable,
        auto_delete: e.auto_delete,
    }
}

/// A queue from its definition, which has no type of its own before RabbitMQ 4: the
/// `x-queue-type` argument says it, and a queue without one is classic. A queue in the
/// definitions is never exclusive.
fn queue(q: QueueDefinitionWithoutVirtualHost) -> ObservedQueue {
    let queue_type = q
        .arguments
        .0
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
        arguments: q.arguments.0,
    }
}

fn binding(b: BindingDefinitionWithoutVirtualHost) -> Option<Binding> {
    queue_binding_of(&b.destination_type, b.source, b.destination, b.routing_key)
}

fn policy(p: PolicyWithoutVirtualHost) -> ObservedPolicy {
    ObservedPolicy {
        name: p.name,
        pattern: p.pattern,
        apply_to: policy_target_name(&p.apply_to).to_string(),
        priority: p.priority,
        definition: p.definition.0.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::TopologySpec;
    use crate::topology::BrokerCapabilities;
    use crate::topology::diff::plan;

    fn desired(spec: &TopologySpec, capabilities: BrokerCapabilities) -> Topology {
        Topology::desired("/", spec, capabilities).expect("a valid topology")
    }

    /// What the client adds for its own writes is what the definitions would show: a
    /// topology planned on an empty vhost, its changes added, plans to nothing.
    #[test]
    fn what_a_client_made_is_kept_as_in_sync() {
        let tiers: TopologySpec = serde_json::from_value(serde_json::json!({
            "retryDelays": ["10s", "1m", "10m"]
        }))
        .expect("a spec with tiers");
        for spec in [TopologySpec::default(), tiers] {
            for capabilities in [
                BrokerCapabilities::RABBITMQ_3,
                BrokerCapabilities::RABBITMQ_4,
            ] {
                let topology = desired(&spec, capabilities);
                let mut snapshot = Snapshot::default();
                let made = plan(&topology, &snapshot.of(&topology)).expect("no conflict");
                assert!(made.len() > 6, "{made:?}");
                made.iter().for_each(|change| snapshot.add(change));
                let again = plan(&topology, &snapshot.of(&topology)).expect("no conflict");
                assert_eq!(again, Vec::new(), "{capabilities:?}");
            }
        }
    }
}
