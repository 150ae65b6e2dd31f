//! Step 6 of a reconcile: what the pipeline's queues hold and whether their policies
//! apply as written, from one read of each queue (at most every 30 s per pipeline).

use futures::future::try_join_all;

use crate::spec::QueueDepths;
use crate::topology::desired::policy_name;
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

/// The depths of the send, retry and dead queues (`None` when the broker could not be
/// asked: the reconcile does not fail for that, the topology was just applied) and
/// whether their policies apply, from one read of each queue.
pub async fn observe(management: &Management, topology: &Topology) -> Observed {
    let vhost = topology.vhost.as_str();
    let read = try_join_all(
        topology
            .queues
            .iter()
            .map(|queue| management.queue_state(vhost, &queue.name)),
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
    let depths = QueueDepths {
        send: depth(0),
        retry: depth(1),
        dead: depth(2),
    };
    let settled = management
        .since_written(vhost)
        .is_none_or(|since| since >= POLICY_REPORT_LAG);
    let mut shadowed = Vec::new();
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

/// RabbitMQ's `messages` already counts the unacknowledged ones.
fn total(depth: QueueDepth) -> i64 {
    i64::try_from(depth.messages).unwrap_or(i64::MAX)
}
