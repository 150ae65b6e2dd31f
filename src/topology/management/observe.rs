//! Reading what RabbitMQ holds of a pipeline's objects, one request per named object, so
//! that what a pipeline costs does not grow with what else shares its vhost.
//!
//! A pipeline in sync costs [`READS_PER_PIPELINE`] requests: a GET of each of its
//! exchanges, queues and policies, and of each queue's bindings. Whether the vhost exists
//! is read once per vhost by whoever plans a pass ([`plan_all`](super::plan_all)).

use futures::future::try_join_all;
use rabbitmq_http_client::commons::{BindingDestinationType, PolicyTarget};
use rabbitmq_http_client::responses::{BindingInfo, ExchangeInfo, Policy, QueueInfo};

use super::Management;
use crate::topology::desired::{Binding, Topology};
use crate::topology::diff::{Observed, ObservedExchange, ObservedPolicy, ObservedQueue};
use crate::topology::error::TopologyError;

/// The reading requests of one pipeline whose objects all exist: 3 exchanges, 3 queues,
/// the bindings of each of the 3 queues, 3 policies.
pub const READS_PER_PIPELINE: usize = 12;

impl Management {
    /// Whether `vhost` exists.
    pub async fn vhost_exists(&self, vhost: &str) -> Result<bool, TopologyError> {
        match self.read(self.api.get_vhost(vhost)).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(self.error(&format!("read vhost {vhost:?}"), e)),
        }
    }

    /// What RabbitMQ holds of the objects `topology` names, in a vhost known to exist
    /// (`vhost_exists`; a missing vhost holds nothing, and nothing is read). The bindings
    /// read are those of the pipeline's queues that exist, so a binding of the pipeline is
    /// found whatever else is bound in the vhost.
    pub async fn observe_topology(
        &self,
        topology: &Topology,
        vhost_exists: bool,
    ) -> Result<Observed, TopologyError> {
        if !vhost_exists {
            return Ok(Observed::default());
        }
        let vhost = topology.vhost.as_str();
        let exchanges = try_join_all(
            topology
                .exchanges
                .iter()
                .map(|e| self.exchange(vhost, &e.name)),
        );
        let queues = try_join_all(topology.queues.iter().map(|q| self.queue(vhost, &q.name)));
        let policies = try_join_all(
            topology
                .policies
                .iter()
                .map(|p| self.policy(vhost, &p.name)),
        );
        let (exchanges, queues, policies) = futures::try_join!(exchanges, queues, policies)?;
        let mut observed = Observed {
            vhost_exists: true,
            exchanges: exchanges.into_iter().flatten().collect(),
            queues: Vec::new(),
            bindings: Vec::new(),
            policies: policies.into_iter().flatten().collect(),
        };
        for (queue, bindings) in queues.into_iter().flatten() {
            observed.queues.push(queue);
            observed.bindings.extend(bindings);
        }
        Ok(observed)
    }

    /// Everything in `vhost` a pipeline may care about, from four lists of the whole
    /// vhost. Its cost grows with everything in the vhost: for looking around, never per
    /// pipeline (that is [`observe_topology`](Self::observe_topology)).
    pub async fn observe(&self, vhost: &str) -> Result<Observed, TopologyError> {
        if !self.vhost_exists(vhost).await? {
            return Ok(Observed::default());
        }
        let (exchanges, queues, bindings, policies) = futures::try_join!(
            self.listed("list exchanges", self.api.list_exchanges_in(vhost)),
            self.listed("list queues", self.api.list_queues_in(vhost)),
            self.listed("list bindings", self.api.list_bindings_in(vhost)),
            self.listed("list policies", self.api.list_policies_in(vhost)),
        )?;
        Ok(Observed {
            vhost_exists: true,
            exchanges: exchanges.into_iter().map(observed_exchange).collect(),
            queues: queues.into_iter().map(observed_queue).collect(),
            bindings: bindings.into_iter().filter_map(queue_binding).collect(),
            policies: policies.into_iter().map(observed_policy).collect(),
        })
    }

    async fn listed<T>(
        &self,
        action: &str,
        request: impl Future<Output = Result<Vec<T>, rabbitmq_http_client::api::HttpClientError>>,
    ) -> Result<Vec<T>, TopologyError> {
        self.read(request).await.map_err(|e| self.error(action, e))
    }

    async fn exchange(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Option<ObservedExchange>, TopologyError> {
        match self.read(self.api.get_exchange_info(vhost, name)).await {
            Ok(e) => Ok(Some(observed_exchange(e))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(self.error(&format!("read exchange {name}"), e)),
        }
    }

    /// A queue and, when it exists, the exchange-to-queue bindings to it.
    pub(in crate::topology) async fn queue(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Option<(ObservedQueue, Vec<Binding>)>, TopologyError> {
        let Some(queue) = self.queue_info(vhost, name).await? else {
            return Ok(None);
        };
        let queue = observed_queue(queue);
        let bindings = match self.read(self.api.list_queue_bindings(vhost, name)).await {
            Ok(bindings) => bindings.into_iter().filter_map(queue_binding).collect(),
            // Deleted between the two reads: it is missing.
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(self.error(&format!("read the bindings of queue {name}"), e)),
        };
        Ok(Some((queue, bindings)))
    }

    async fn policy(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Option<ObservedPolicy>, TopologyError> {
        match self.read(self.api.get_policy(vhost, name)).await {
            Ok(p) => Ok(Some(observed_policy(p))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(self.error(&format!("read policy {name}"), e)),
        }
    }
}

fn observed_exchange(e: ExchangeInfo) -> ObservedExchange {
    ObservedExchange {
        name: e.name,
        kind: e.exchange_type,
        durable: e.durable,
        auto_delete: e.auto_delete,
    }
}

fn observed_queue(q: QueueInfo) -> ObservedQueue {
    ObservedQueue {
        name: q.name,
        queue_type: q.queue_type,
        durable: q.durable,
        auto_delete: q.auto_delete,
        exclusive: q.exclusive,
        arguments: q.arguments.0,
    }
}

fn queue_binding(b: BindingInfo) -> Option<Binding> {
    queue_binding_of(&b.destination_type, b.source, b.destination, b.routing_key)
}

/// An exchange-to-queue binding; `None` for the default exchange's implicit one and for
/// exchange-to-exchange bindings.
pub(in crate::topology) fn queue_binding_of(
    destination_type: &BindingDestinationType,
    source: String,
    destination: String,
    routing_key: String,
) -> Option<Binding> {
    let to_queue = *destination_type == BindingDestinationType::Queue && !source.is_empty();
    to_queue.then_some(Binding {
        exchange: source,
        queue: destination,
        routing_key,
    })
}

fn observed_policy(p: Policy) -> ObservedPolicy {
    ObservedPolicy {
        name: p.name,
        pattern: p.pattern,
        apply_to: policy_target_name(&p.apply_to).to_string(),
        priority: p.priority,
        definition: p.definition.0.unwrap_or_default(),
    }
}

pub(in crate::topology) fn policy_target_name(target: &PolicyTarget) -> &'static str {
    match target {
        PolicyTarget::Queues => "queues",
        PolicyTarget::ClassicQueues => "classic_queues",
        PolicyTarget::QuorumQueues => "quorum_queues",
        PolicyTarget::Streams => "streams",
        PolicyTarget::Exchanges => "exchanges",
        PolicyTarget::All => "all",
    }
}
