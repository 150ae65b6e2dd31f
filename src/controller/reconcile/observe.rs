//! Step 6 of a reconcile: what the pipeline's queues hold and whether their policies
//! apply as written, from one read of each queue (at most every 30 s per pipeline).

use futures::future::try_join_all;

use crate::mail::{CREDENTIALS_REFUSED_CONNECTION, retry_tier_number};
use crate::spec::{QueueDepths, RetryTierDepth, TopologySpec};
use crate::topology::desired::{policy_name, retry_tiers};
use crate::topology::effective::{POLICY_REPORT_LAG, QueuePolicy, Shadowing, shadowing};
use crate::topology::{Management, QueueDepth, Topology};

/// What observing the queues and the workers found.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// `None` when they were not read this time, or could not be.
    pub queues: Option<QueueDepths>,
    pub policies: PolicyCheck,
    pub provider_key: KeyCheck,
}

impl Observed {
    /// Nothing read this time: the status keeps what it last showed.
    pub const NOT_READ: Observed = Observed {
        queues: None,
        policies: PolicyCheck::NotChecked,
        provider_key: KeyCheck::NotChecked,
    };
}

/// Whether the workers' provider refuses their key, as the workers tell it
/// ([`crate::worker::signal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCheck {
    /// Not known this time: the status keeps what it last showed.
    NotChecked,
    Refused,
    /// Not refused, or every worker is ready (then nothing is read).
    NotRefused,
}

/// Whether the workers' provider refuses their key: read from the broker (the
/// connections of `worker_user` in `vhost`) only while `workers_short` (some workers are
/// not ready), so a pipeline whose workers are ready costs no request for it.
pub async fn provider_key(
    management: &Management,
    vhost: &str,
    worker_user: &str,
    workers_short: bool,
) -> KeyCheck {
    if !workers_short {
        return KeyCheck::NotRefused;
    }
    match management.connection_names(vhost, worker_user).await {
        Ok(names)
            if names
                .iter()
                .any(|name| name == CREDENTIALS_REFUSED_CONNECTION) =>
        {
            KeyCheck::Refused
        }
        Ok(_) => KeyCheck::NotRefused,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the workers' connections");
            KeyCheck::NotChecked
        }
    }
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
                    provider_key: KeyCheck::NotChecked,
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
        provider_key: KeyCheck::NotChecked,
    }
}

/// What a reconcile that made every queue of `topology` (of `spec`) knows without a
/// read: each is empty, as made (the API's statistics of a queue this new would say no
/// more), and the broker cannot have reported their policies yet.
pub fn just_made(topology: &Topology, spec: &TopologySpec) -> Observed {
    Observed {
        queues: Some(queue_depths(topology, spec, &[], |_| Some(0))),
        policies: PolicyCheck::NotChecked,
        provider_key: KeyCheck::NotChecked,
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
        retry_by_tier: by_tier(&retry_tiers),
        retry_tiers,
    }
}

/// `tiers` in one line: `3/0/1/2`, then `+5 draining` for the former tiers'; `None` for
/// none.
fn by_tier(tiers: &[RetryTierDepth]) -> Option<String> {
    let (draining, current): (Vec<&RetryTierDepth>, Vec<&RetryTierDepth>) =
        tiers.iter().partition(|tier| tier.draining);
    if current.is_empty() {
        return None;
    }
    let count = |tier: &RetryTierDepth| tier.messages.map_or("?".to_string(), |n| n.to_string());
    let mut line = current
        .iter()
        .map(|tier| count(tier))
        .collect::<Vec<_>>()
        .join("/");
    if !draining.is_empty() {
        let held: Option<i64> = draining.iter().map(|tier| tier.messages).sum();
        let held = held.map_or("?".to_string(), |n| n.to_string());
        line.push_str(&format!(" +{held} draining"));
    }
    Some(line)
}

/// RabbitMQ's `messages` already counts the unacknowledged ones.
fn total(depth: QueueDepth) -> i64 {
    i64::try_from(depth.messages).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::BrokerCapabilities;

    fn depths(yaml: &str, draining: &[String], counts: &[Option<i64>]) -> QueueDepths {
        let spec: TopologySpec = serde_yaml::from_str(yaml).unwrap();
        let topology = Topology::desired("/", &spec, BrokerCapabilities::RABBITMQ_4).unwrap();
        queue_depths(&topology, &spec, draining, |i| {
            counts.get(i).copied().flatten()
        })
    }

    #[test]
    fn one_tier_shows_as_before() {
        let d = depths("{}", &[], &[Some(4), Some(2), Some(1)]);
        assert_eq!((d.send, d.retry, d.dead), (Some(4), Some(2), Some(1)));
        assert!(d.retry_tiers.is_empty());
        assert_eq!(d.retry_by_tier, None);
    }

    #[test]
    fn tiers_are_counted_one_by_one_and_summed() {
        // Queues in the topology's order: send, tier 1, dead, tier 2, tier 3; then the
        // former tier 4 that drains.
        let counts = [Some(9), Some(3), Some(1), Some(0), Some(2), Some(5)];
        let draining = ["mail.send.retry.4".to_string()];
        let d = depths("{retryDelays: [30s, 5m, 2h]}", &draining, &counts);
        assert_eq!((d.send, d.retry, d.dead), (Some(9), Some(5), Some(1)));
        let tiers: Vec<_> = d
            .retry_tiers
            .iter()
            .map(|t| {
                (
                    t.tier,
                    t.queue.as_str(),
                    t.delay.as_deref(),
                    t.messages,
                    t.draining,
                )
            })
            .collect();
        assert_eq!(
            tiers,
            [
                (1, "mail.send.retry", Some("30s"), Some(3), false),
                (2, "mail.send.retry.2", Some("5m"), Some(0), false),
                (3, "mail.send.retry.3", Some("2h"), Some(2), false),
                (4, "mail.send.retry.4", None, Some(5), true)
            ]
        );
        assert_eq!(d.retry_by_tier.as_deref(), Some("3/0/2 +5 draining"));
        let uncounted = depths(
            "{retryDelays: [1s, 2s]}",
            &[],
            &[Some(0), None, Some(0), Some(7)],
        );
        assert_eq!(
            uncounted.retry, None,
            "a sum with a tier not counted is not known"
        );
        assert_eq!(uncounted.retry_by_tier.as_deref(), Some("?/7"));
    }
}
