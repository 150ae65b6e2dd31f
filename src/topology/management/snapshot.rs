//! A vhost's definitions read once for a pass over many of its pipelines: one request,
//! instead of [`READS_PER_PIPELINE`](super::READS_PER_PIPELINE) per pipeline.
//!
//! Definitions leave out exclusive queues (they die with their connection), so a queue
//! that the definitions lack is read by name before a plan may create it: a queue of
//! another kind in the way is then still found before the first write.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use rabbitmq_http_client::responses::{
    BindingDefinitionWithoutVirtualHost, ExchangeDefinitionWithoutVirtualHost,
    PolicyWithoutVirtualHost, QueueDefinitionWithoutVirtualHost, VirtualHostDefinitionSet,
};

use super::Management;
use super::observe::{policy_target_name, queue_binding_of};
use crate::topology::desired::{Binding, Topology};
use crate::topology::diff::{Observed, ObservedExchange, ObservedPolicy, ObservedQueue};
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

/// What a client keeps for [`Management::shared_snapshot`]: by vhost, the definitions
/// last read and when, and when it last wrote there.
#[derive(Default)]
pub(in crate::topology) struct SharedSnapshots {
    read: HashMap<String, (Instant, Option<Arc<Snapshot>>)>,
    written: HashMap<String, Instant>,
}

impl Management {
    /// Notes a write to `vhost` through this client: definitions read before it no longer
    /// serve.
    pub(in crate::topology) fn wrote_to(&self, vhost: &str) {
        self.snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .written
            .insert(vhost.to_string(), Instant::now());
    }

    /// How long ago this client last wrote to `vhost`; `None` when it never did.
    pub fn since_written(&self, vhost: &str) -> Option<Duration> {
        self.snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .written
            .get(vhost)
            .map(Instant::elapsed)
    }

    /// The definitions of `vhost` as read at most `max_age` ago and after this client's
    /// last write there, else read now, but only when nothing was written there through
    /// this client for `max_age` (a vhost being built is read by name); `None` when there
    /// are none to use (always, for a zero `max_age`). One read at a time per client, so
    /// work running at once shares it.
    pub(in crate::topology) async fn shared_snapshot(
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
        Ok(Observed {
            vhost_exists: true,
            exchanges: topology
                .exchanges
                .iter()
                .filter_map(|e| snapshot.exchanges.get(&e.name).cloned())
                .collect(),
            queues: topology
                .queues
                .iter()
                .filter_map(|q| snapshot.queues.get(&q.name).cloned())
                .collect(),
            bindings: topology
                .queues
                .iter()
                .filter_map(|q| snapshot.bindings.get(&q.name))
                .flatten()
                .cloned()
                .collect(),
            policies: topology
                .policies
                .iter()
                .filter_map(|p| snapshot.policies.get(&p.name).cloned())
                .collect(),
        })
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
