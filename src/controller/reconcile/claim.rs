//! The claim phase of a reconcile: which pipeline owns what in a broker, so a pipeline
//! acts only on what it can prove is its own.
//!
//! A pipeline claims every exchange and queue of its topology and the workers' user the
//! operator makes for it, with an owner marker per object in the broker (see
//! [`crate::topology::ownership`]) naming its UID. What it holds is what those markers
//! name, nothing a tenant can write: not its spec, not a Secret, not even the worker
//! Secret the operator made. Before anything is written:
//!
//! - what it holds and no longer wants (another vhost, other names, another user) is
//!   *retiring*: a retiring queue that still holds mail refuses the change, which would
//!   strand it;
//! - what it wants and does not hold is claimed: among the pipelines the controller
//!   knows (its caches), an older one (creationTimestamp, then UID) that wants one of the
//!   same names goes first; then, with the claims of the other reconciles of its vhost
//!   running at once and under the vhost's lock in the broker, the markers are read again
//!   and an object owned by another pipeline, or one that exists with no marker at all
//!   (made by hand, or by someone else), refuses the pipeline, which writes nothing. Only
//!   then are its markers written
//!   ([`crate::topology::management::claims_together`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::reconcile::desired::Desired;
use crate::controller::reconcile::validate::Validated;
use crate::spec::MailerPipeline;
use crate::topology::Management;
use crate::topology::claims::{ClaimAsk, LegacyTopology};
use crate::topology::management::claims_together::claim_together;
use crate::topology::ownership::{
    Claim, Markers, Owner, is_former_tier, legacy_topology_marker, topology_claims,
};

/// How long a claim waits for another claim of the same vhost (or user) to finish.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The owner marker's value for `pipeline`.
pub fn owner_of(cluster: &str, pipeline: &MailerPipeline) -> Owner {
    Owner {
        cluster: cluster.to_string(),
        namespace: pipeline.namespace().unwrap_or_default(),
        name: pipeline.name_any(),
        uid: pipeline.uid().unwrap_or_default(),
        retained: false,
    }
}

/// What the claim phase found.
#[derive(Debug, Default)]
pub struct Claimed {
    /// What the pipeline holds and no longer wants: its objects in a vhost it left or
    /// under names it changed, a workers' user it no longer uses. The apply phase
    /// retires them as `deletionPolicy` says.
    pub retiring: BTreeSet<Claim>,
}

/// Claims what `desired` needs for the pipeline, or refuses it before anything is
/// written (but the locks, in a vhost of their own: see [`crate::topology::claim_lock`]).
pub async fn claim(
    ctx: &Context,
    valid: &Validated<'_>,
    desired: &Desired,
) -> Result<Claimed, Error> {
    let management = &valid.broker.management;
    let me = owner_of(&ctx.settings.cluster_name, valid.pipeline);
    let markers = management
        .shared_markers(ctx.settings.definitions_max_age)
        .await?;
    let held = markers.held_by(&me.uid);
    let missing: Vec<&Claim> = desired
        .claims
        .iter()
        .filter(|claim| !held.contains(claim))
        .collect();
    // What the list already says is another's is refused without a lock.
    let foreign = refuse_foreign(&markers, &me, &missing);
    // Not held across the waits below: while a reconcile holds a version of the shared
    // markers, each marker written through the client copies all of them for the next
    // (at 1,000 pipelines, the reconciles waiting for their claims held a copy each).
    drop(markers);
    let retiring: BTreeSet<Claim> = held.difference(&desired.claims).cloned().collect();
    // A former delay tier's queue drains by itself: it is kept until then (see retire).
    let vhost = &desired.topology.vhost;
    let stranding = retiring
        .iter()
        .filter(|claim| !is_former_tier(vhost, &valid.spec.topology, claim));
    refuse_stranding(management, stranding).await?;
    if missing.is_empty() {
        return Ok(Claimed { retiring });
    }
    foreign?;
    // Only the rivals are copied out of the caches: a copy of every pipeline, held by each
    // reconcile while it waited for its claims, was most of a first pass's peak memory
    // (at 1,000 pipelines, about 27 of 68 MB live).
    let rivals = ctx.known_pipelines(|other| is_older_rival(valid.pipeline, other));
    check_collisions(valid.pipeline, &rivals)?;
    drop(rivals);
    let spec = valid.spec;
    let ask = ClaimAsk {
        owner: me,
        claims: missing.into_iter().cloned().collect(),
        legacy: Some(LegacyTopology {
            marker: legacy_topology_marker(&spec.rabbitmq.vhost, &spec.topology.queue),
            claims: topology_claims(&spec.rabbitmq.vhost, &spec.topology)
                .into_iter()
                .collect(),
        }),
    };
    claim_together(management, vhost, ask, ctx.settings.claim_window, LOCK_WAIT).await?;
    Ok(Claimed { retiring })
}

fn refuse_foreign(markers: &Markers, me: &Owner, wanted: &[&Claim]) -> Result<(), Error> {
    for claim in wanted {
        if let Some(owner) = markers.owner(claim).filter(|owner| !me.may_take(owner)) {
            return Err(Error::Owned {
                what: claim.to_string(),
                owner: owner.to_string(),
            });
        }
    }
    Ok(())
}

/// Refuses a change that would leave a queue the pipeline holds behind with mail in it
/// and no worker (as the management API last counted it).
async fn refuse_stranding(
    management: &Management,
    retiring: impl Iterator<Item = &Claim>,
) -> Result<(), Error> {
    for claim in retiring {
        let Claim::Queue { vhost, name } = claim else {
            continue;
        };
        if let Some(depth) = management.queue_depth(vhost, name).await?
            && depth.messages > 0
        {
            return Err(Error::QueueNotEmpty {
                vhost: vhost.clone(),
                queue: name.clone(),
                messages: depth.messages,
            });
        }
    }
    Ok(())
}

/// The broker a pipeline's spec names, as far as its spec says.
fn broker_of(pipeline: &MailerPipeline) -> String {
    let namespace = pipeline.namespace().unwrap_or_default();
    let rabbitmq = &pipeline.spec.rabbitmq;
    match (&rabbitmq.connection_secret, &rabbitmq.cluster_ref) {
        (Some(secret), _) => format!("Secret {namespace}/{}", secret.name),
        (None, Some(cluster)) => format!(
            "RabbitmqCluster {}/{}",
            cluster.namespace_or(&namespace),
            cluster.name
        ),
        (None, None) => String::new(),
    }
}

/// The first of the names `a` and `b` both claim on the same broker, if any.
fn shared_claim(a: &MailerPipeline, b: &MailerPipeline) -> Option<Claim> {
    // Every name a topology claims is in its vhost.
    if a.spec.rabbitmq.vhost != b.spec.rabbitmq.vhost || broker_of(a) != broker_of(b) {
        return None;
    }
    let theirs = topology_claims(&b.spec.rabbitmq.vhost, &b.spec.topology);
    topology_claims(&a.spec.rabbitmq.vhost, &a.spec.topology)
        .into_iter()
        .find(|claim| theirs.contains(claim))
}

/// Which of two pipelines made together claims first: the older.
fn age(pipeline: &MailerPipeline) -> (Option<Time>, Option<String>) {
    (pipeline.creation_timestamp(), pipeline.uid())
}

/// The first name `other` would refuse `pipeline` in [`check_collisions`], if it is a
/// rival: older, not being deleted, and wanting that name on the same broker.
fn rival_claim(pipeline: &MailerPipeline, other: &MailerPipeline) -> Option<Claim> {
    let rival = other.uid() != pipeline.uid()
        && other.metadata.deletion_timestamp.is_none()
        && age(other) < age(pipeline);
    rival.then(|| shared_claim(pipeline, other)).flatten()
}

/// Whether `other` could refuse `pipeline`'s claims in [`check_collisions`].
pub fn is_older_rival(pipeline: &MailerPipeline, other: &MailerPipeline) -> bool {
    rival_claim(pipeline, other).is_some()
}

/// Fails when an older pipeline among `known` wants one of the names `pipeline` wants on
/// the same broker: of two pipelines made together, the older claims first. Pipelines
/// being deleted do not count: their claim is ending. (Pipelines that name the same
/// broker through different Secrets are told apart by the markers in the broker.)
pub fn check_collisions(
    pipeline: &MailerPipeline,
    known: &[Arc<MailerPipeline>],
) -> Result<(), Error> {
    let older = known
        .iter()
        .filter_map(|other| rival_claim(pipeline, other).map(|claim| (other, claim)))
        .min_by_key(|(other, _)| age(other));
    match older {
        Some((other, claim)) => Err(Error::Collision {
            other: format!(
                "{}/{}",
                other.namespace().unwrap_or_default(),
                other.name_any()
            ),
            broker: broker_of(pipeline),
            what: claim.to_string(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn pipeline(namespace: &str, name: &str, created: i64, yaml: &str) -> Arc<MailerPipeline> {
        let mut p = crate::controller::fixtures::pipeline_named(namespace, name, yaml);
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        Arc::new(p)
    }

    const CONN: &str = "rabbitmq: {connectionSecret: {name: conn}}";

    #[test]
    fn the_newer_of_two_pipelines_on_one_name_is_refused() {
        let old = pipeline("prod", "b", 10, CONN);
        let new = pipeline("prod", "a", 20, CONN);
        let known = vec![old.clone(), new.clone()];
        assert!(check_collisions(&old, &known).is_ok());
        let error = check_collisions(&new, &known).unwrap_err();
        assert_eq!(error.reason(), "Conflict");
        assert!(error.to_string().contains("prod/b"), "{error}");
        // Created in the same second: the UID decides, the same way for both.
        let twin = pipeline("prod", "c", 10, CONN);
        let known = vec![old.clone(), twin.clone()];
        assert_ne!(
            check_collisions(&old, &known).is_ok(),
            check_collisions(&twin, &known).is_ok(),
            "exactly one of the two goes on"
        );
    }

    #[test]
    fn only_an_older_pipeline_wanting_a_name_on_the_same_broker_is_a_rival() {
        let old = pipeline("prod", "b", 10, CONN);
        let new = pipeline("prod", "a", 20, CONN);
        assert!(is_older_rival(&new, &old));
        assert!(!is_older_rival(&old, &new), "newer");
        assert!(!is_older_rival(&old, &old), "itself");
        let elsewhere = pipeline(
            "prod",
            "c",
            5,
            "rabbitmq: {connectionSecret: {name: conn}, vhost: other}",
        );
        assert!(!is_older_rival(&new, &elsewhere), "another vhost");
        let mut going = (*old).clone();
        going.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(30).unwrap()));
        assert!(!is_older_rival(&new, &going), "being deleted");
    }

    #[test]
    fn a_second_pipeline_sharing_any_name_in_a_vhost_collides() {
        let old = pipeline("prod", "a", 10, CONN);
        // Only the send queue differs: the exchanges and the other queues are shared.
        let only_queue = pipeline(
            "prod",
            "b",
            20,
            "rabbitmq: {connectionSecret: {name: conn}}\ntopology: {queue: other.send}",
        );
        let error = check_collisions(&only_queue, std::slice::from_ref(&old)).unwrap_err();
        assert!(error.to_string().contains("exchange \"mail\""), "{error}");
        // Another's dead queue as its send queue.
        let dead_as_send = pipeline(
            "prod",
            "c",
            20,
            "rabbitmq: {connectionSecret: {name: conn}}\ntopology: {queue: mail.send.dead, exchange: x, retryExchange: x.retry, deadExchange: x.dead, retryQueue: x.retry.q, deadQueue: x.dead.q}",
        );
        let error = check_collisions(&dead_as_send, &[old]).unwrap_err();
        assert!(
            error.to_string().contains("queue \"mail.send.dead\""),
            "{error}"
        );
    }

    #[test]
    fn names_of_their_own_other_vhosts_or_brokers_do_not_collide() {
        let old = pipeline("prod", "a", 10, CONN);
        for yaml in [
            "rabbitmq: {connectionSecret: {name: conn}}\ntopology: {queue: other.send, exchange: other, retryExchange: other.retry, retryQueue: other.send.retry, deadExchange: other.dead, deadQueue: other.send.dead}",
            "rabbitmq: {connectionSecret: {name: conn}, vhost: other}",
            "rabbitmq: {connectionSecret: {name: conn2}}",
        ] {
            let new = pipeline("prod", "b", 20, yaml);
            assert!(
                check_collisions(&new, &[old.clone(), new.clone()]).is_ok(),
                "{yaml}"
            );
        }
        // The same Secret name in another namespace is another broker, as far as the
        // specs say (the markers in the broker catch it when it is the same).
        let elsewhere = pipeline("staging", "b", 20, CONN);
        assert!(check_collisions(&elsewhere, &[old, elsewhere.clone()]).is_ok());
    }
}
