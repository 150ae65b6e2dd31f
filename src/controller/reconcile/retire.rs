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

use std::collections::{BTreeMap, BTreeSet};

use crate::controller::broker::connection::Broker;
use crate::controller::error::Error;
use crate::spec::DeletionPolicy;
use crate::topology::desired::policy_name;
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
}

/// Gives up `claims`, all held by `me` in the broker of `management`.
pub async fn retire(
    management: &Management,
    broker: &Broker,
    me: &Owner,
    claims: &BTreeSet<Claim>,
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
                management.clear_owner(&claim.marker()).await?;
            }
            Claim::Exchange { vhost, .. } | Claim::Queue { vhost, .. } => {
                by_vhost.entry(vhost).or_default().push(claim);
            }
        }
    }
    for (vhost, claims) in by_vhost {
        retire_in_vhost(management, broker, me, vhost, &claims, policy, &mut retired).await?;
    }
    Ok(retired)
}

async fn retire_in_vhost(
    management: &Management,
    broker: &Broker,
    me: &Owner,
    vhost: &str,
    claims: &[&Claim],
    policy: DeletionPolicy,
    retired: &mut Retired,
) -> Result<(), Error> {
    if !management.vhost_exists(vhost).await? {
        // Gone with its vhost: there is nothing left to mark.
        for claim in claims {
            management.clear_owner(&claim.marker()).await?;
        }
        retired
            .kept
            .push(format!("nothing: vhost {vhost:?} does not exist"));
        return Ok(());
    }
    if policy == DeletionPolicy::Retain {
        for claim in claims {
            management.set_owner_of(claim, &me.retaining()).await?;
        }
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
    for claim in claims {
        let removed = report.removed.iter().any(|removed| match (removed, claim) {
            (Removed::Exchange(name), Claim::Exchange { name: claimed, .. })
            | (Removed::Queue(name), Claim::Queue { name: claimed, .. }) => name == claimed,
            _ => false,
        });
        if removed {
            management.clear_owner(&claim.marker()).await?;
        }
    }
    retired.removed.extend(
        report
            .removed
            .iter()
            .map(|removed| format!("{removed} in vhost {vhost:?}")),
    );
    for kept in &report.kept {
        match kept {
            Kept::Queue { name, why } => {
                let claim = Claim::Queue {
                    vhost: vhost.to_string(),
                    name: name.clone(),
                };
                management.set_owner_of(&claim, &me.retaining()).await?;
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
    Ok(())
}
