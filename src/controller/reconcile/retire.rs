//! Giving up claims in a broker: what a pipeline no longer wants (the apply phase), all
//! it holds when it is deleted (cleanup), its workers' users when its namespace may no
//! longer use the broker (revocation). Only what an owner marker proves the pipeline's
//! own is ever given to this, so nothing of anyone else's is touched.
//!
//! A user is removed (RabbitMQ closes its connections, so deliveries its workers held
//! go back to their queue before any queue is counted). Exchanges and queues go as
//! `deletionPolicy` says: under `Delete` they are removed, each queue only when it holds
//! no message, with their policies; what stays (`Retain`, or a queue that holds mail) is
//! marked as retained, for a later pipeline of the same name to take over, and is no
//! longer held.
//!
//! The delay queue of a tier the spec no longer has is the exception
//! ([`is_former_tier`](crate::topology::ownership::is_former_tier)), whatever
//! `deletionPolicy` says: it is removed when empty, and while it holds parked requests it
//! is kept with its policy and binding, still held, so they still return to the send
//! queue and the next reconcile tries again.

use std::collections::{BTreeMap, BTreeSet};

use crate::controller::broker::connection::Broker;
use crate::controller::error::Error;
use crate::spec::DeletionPolicy;
use crate::topology::desired::policy_name;
use crate::topology::management::markers::GiveUp;
use crate::topology::ownership::{Claim, Owner};
use crate::topology::{self, EmptinessCheck, Kept, Management, Removal, Removed};

/// What giving up claims did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Retired {
    /// Users removed from the broker.
    pub users_removed: Vec<String>,
    /// Exchanges, queues and policies removed, e.g. `queue mail.send in vhost "shop"`.
    pub removed: Vec<String>,
    /// Left in place on purpose (and marked as retained), or already gone.
    pub kept: Vec<String>,
    /// Meant to go but still there (a queue that holds mail), marked as retained.
    pub left_over: Vec<String>,
    /// Delay queues of former tiers kept, still held, while they hold parked requests (or
    /// their messages could not be counted), e.g. `mail.send.retry.3`.
    pub draining: Vec<String>,
    /// Delay queues of former tiers, and their policies, removed now that they are empty
    /// (not in `removed`).
    pub drained: Vec<String>,
}

/// What to do with a queue that is kept because it holds mail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WhenFull {
    /// Mark it as retained: it is no longer held.
    Retain,
    /// Keep holding it, to try again at the next reconcile.
    Hold,
}

/// Gives up `claims`, all held by `me` in the broker of `management`; those also in
/// `former_tiers` are delay queues of tiers the spec no longer has (see the module).
pub async fn retire(
    management: &Management,
    broker: &Broker,
    me: &Owner,
    claims: &BTreeSet<Claim>,
    former_tiers: &BTreeSet<Claim>,
    policy: DeletionPolicy,
) -> Result<Retired, Error> {
    let mut retired = Retired::default();
    let mut by_vhost: BTreeMap<&str, Vec<&Claim>> = BTreeMap::new();
    for claim in claims {
        match claim {
            Claim::User { name } => {
                if management.delete_user(name).await? {
                    retired.users_removed.push(name.clone());
                }
                management.give_up(me, &[claim], GiveUp::Release).await?;
            }
            Claim::Exchange { vhost, .. } | Claim::Queue { vhost, .. } => {
                by_vhost.entry(vhost).or_default().push(claim);
            }
        }
    }
    for (vhost, claims) in by_vhost {
        let (tiers, others): (Vec<&Claim>, Vec<&Claim>) = claims
            .into_iter()
            .partition(|claim| former_tiers.contains(*claim));
        for (claims, policy, when_full) in [
            (others, policy, WhenFull::Retain),
            (tiers, DeletionPolicy::Delete, WhenFull::Hold),
        ] {
            if !claims.is_empty() {
                let how = (policy, when_full);
                retire_in_vhost(management, broker, me, vhost, &claims, how, &mut retired).await?;
            }
        }
    }
    Ok(retired)
}

async fn retire_in_vhost(
    management: &Management,
    broker: &Broker,
    me: &Owner,
    vhost: &str,
    claims: &[&Claim],
    (policy, when_full): (DeletionPolicy, WhenFull),
    retired: &mut Retired,
) -> Result<(), Error> {
    if !management.vhost_exists(vhost).await? {
        // Gone with its vhost: there is nothing left to mark.
        management.give_up(me, claims, GiveUp::Release).await?;
        retired
            .kept
            .push(format!("nothing: vhost {vhost:?} does not exist"));
        return Ok(());
    }
    if policy == DeletionPolicy::Retain {
        management.give_up(me, claims, GiveUp::Retain).await?;
        retired.kept.push(format!(
            "everything in vhost {vhost:?} (deletionPolicy Retain)"
        ));
        return Ok(());
    }
    let mut removal = Removal {
        vhost: vhost.to_string(),
        ..Removal::default()
    };
    for claim in claims {
        match claim {
            Claim::Exchange { name, .. } => removal.exchanges.push(name.clone()),
            Claim::Queue { name, .. } => {
                removal.queues.push(name.clone());
                removal.policies.push(policy_name(name));
            }
            Claim::User { .. } => {}
        }
    }
    let amqp_url = broker.operator_amqp_url(vhost);
    let report =
        topology::delete_named(management, &removal, EmptinessCheck::Live(&amqp_url)).await?;
    let gone: Vec<&Claim> = claims
        .iter()
        .copied()
        .filter(|claim| {
            report.removed.iter().any(|removed| match (removed, claim) {
                (Removed::Exchange(name), Claim::Exchange { name: claimed, .. })
                | (Removed::Queue(name), Claim::Queue { name: claimed, .. }) => name == claimed,
                _ => false,
            })
        })
        .collect();
    management.give_up(me, &gone, GiveUp::Release).await?;
    let removed = report
        .removed
        .iter()
        .map(|removed| format!("{removed} in vhost {vhost:?}"));
    match when_full {
        WhenFull::Retain => retired.removed.extend(removed),
        WhenFull::Hold => retired.drained.extend(removed),
    }
    let mut left_over = Vec::new();
    for kept in &report.kept {
        match kept {
            Kept::Queue { name, .. } if when_full == WhenFull::Hold => {
                retired.draining.push(name.clone());
            }
            Kept::Queue { name, why } => {
                left_over.push(Claim::Queue {
                    vhost: vhost.to_string(),
                    name: name.clone(),
                });
                retired
                    .left_over
                    .push(format!("in vhost {vhost:?}, queue {name}: {why}"));
            }
            Kept::Unreachable { error, .. } => {
                // Tried again by the next reconcile: the markers still say what is held.
                return Err(Error::Topology(topology::TopologyError::Unreachable {
                    endpoint: management.endpoint().to_string(),
                    reason: error.clone(),
                }));
            }
            Kept::VhostGone { .. } | Kept::Retained { .. } | Kept::PolicyOfKeptQueue { .. } => {}
        }
    }
    let left_over: Vec<&Claim> = left_over.iter().collect();
    management.give_up(me, &left_over, GiveUp::Retain).await?;
    Ok(())
}
