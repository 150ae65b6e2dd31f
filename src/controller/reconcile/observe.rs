//! Step 6 of a reconcile: what the pipeline's queues hold and whether their policies
//! apply as written, from one read of each queue (at most every 30 s per pipeline).

use futures::future::try_join_all;

use crate::mail::retry_tier_number;
use crate::spec::{QueueDepths, RetryTierDepth, TopologySpec};
use crate::topology::desired::{policy_name, retry_tiers};
use crate::topology::effective::{POLICY_REPORT_LAG, QueuePolicy, Shadowing, shadowing};
use crate::topology::{Management, QueueDepth, Topology};

/// What observing the queues found.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// `None` when they were not read this time, or could not be.
    pub queues: Option<QueueDepths>,
    pub policies: PolicyCheck,
}

impl Observed {
    /// Nothing read this time: the status keeps what it last showed.
    pub const NOT_READ: Observed = Observed {
        queues: None,
        policies: PolicyCheck::NotChecked,
    };
}

/// Whether the pipeline's policies apply to its queues as written (RabbitMQ applies
/// one policy per queue, the matching one of highest priority, and an operator policy
/// may override what it sets).
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyCheck {
    /// Not known this time: not read, a write to the vhost too recent for the broker to
    /// have reported its queues' policies since, or a queue too new to have them.
    NotChecked,
    /// Read: each policy that does not apply as written (none when all do).
    Checked(Vec<Shadowing>),
}

/// The depths of the send, retry (each delay tier's, and of `draining`, the former tiers'
/// queues still kept) and dead queues (`None` when the broker could not be asked: the
/// reconcile does not fail for that, the topology was just applied) and whether their
/// policies apply, from one read of each queue. `topology` is `spec`'s.
pub async fn observe(
    management: &Management,
    topology: &Topology,
    spec: &TopologySpec,
    draining: &[String],
) -> Observed {
    let vhost = topology.vhost.as_str();
    let names = topology.queues.iter().map(|queue| &queue.name);
    let read = try_join_all(
        names
            .chain(draining)
            .map(|name| management.queue_state(vhost, name)),
    )
    .await;
    let states = match read {
        Ok(states) => states,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the queues");
            return Observed::NOT_READ;
        }
    };
    let depth = |i: usize| {
        states
            .get(i)
            .and_then(Option::as_ref)
            .map(|state| total(state.depth))
    };
    let depths = queue_depths(topology, spec, draining, depth);
    let settled = management
        .since_written(vhost)
        .is_none_or(|since| since >= POLICY_REPORT_LAG);
    let mut shadowed = Vec::new();
    // A former tier's policy is checked no more: it is not the topology's.
    for (queue, state) in topology.queues.iter().zip(&states) {
        let reported = match state.as_ref().map(|s| &s.policy) {
            Some(QueuePolicy::Reported(effective)) if settled => effective,
            _ => {
                return Observed {
                    queues: Some(depths),
                    policies: PolicyCheck::NotChecked,
                };
            }
        };
        let ours = topology
            .policies
            .iter()
            .find(|policy| policy.name == policy_name(&queue.name));
        shadowed.extend(ours.and_then(|ours| shadowing(ours, reported)));
    }
    Observed {
        queues: Some(depths),
        policies: PolicyCheck::Checked(shadowed),
    }
}

/// The depths from `depth` of each queue of `topology` (by its index, as it orders them:
/// send, retry tier 1, dead, the further tiers), then of each of `draining`. The retry
/// depth is the sum of the tiers' (`None` if one could not be counted); the tiers are
/// listed one by one with tiers or a former tier.
fn queue_depths(
    topology: &Topology,
    spec: &TopologySpec,
    draining: &[String],
    depth: impl Fn(usize) -> Option<i64>,
) -> QueueDepths {
    let tiers = retry_tiers(spec).unwrap_or_default();
    // Tier 1 is the second queue; further tiers follow the three of one tier.
    let index_of = |tier: usize| if tier == 1 { 1 } else { tier + 1 };
    let retry = (1..=tiers.len().max(1))
        .map(|tier| depth(index_of(tier)))
        .sum::<Option<i64>>();
    let mut retry_tiers = Vec::new();
    if tiers.len() > 1 || !draining.is_empty() {
        let number = |tier: usize| u32::try_from(tier).unwrap_or(u32::MAX);
        retry_tiers.extend(tiers.iter().map(|tier| RetryTierDepth {
            tier: number(tier.tier),
            queue: tier.queue.clone(),
            delay: Some(humantime::format_duration(tier.delay).to_string()),
            messages: depth(index_of(tier.tier)),
            draining: false,
        }));
        retry_tiers.extend(
            draining
                .iter()
                .enumerate()
                .map(|(i, queue)| RetryTierDepth {
                    tier: number(retry_tier_number(&spec.retry_queue, queue).unwrap_or(0)),
                    queue: queue.clone(),
                    delay: None,
                    messages: depth(topology.queues.len() + i),
                    draining: true,
                }),
        );
    }
    QueueDepths {
        send: depth(0),
        retry,
        dead: depth(2),
        retry_tiers,
    }
}

/// RabbitMQ's `messages` already counts the unacknowledged ones.
fn total(depth: QueueDepth) -> i64 {
    i64::try_from(depth.messages).unwrap_or(i64::MAX)
}
