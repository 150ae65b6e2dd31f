//! Which pipeline owns what in a broker, so two pipelines never fight over one send
//! queue or one workers' user.
//!
//! Two checks, both before anything is written:
//!
//! - among the pipelines the controller knows (its caches), two that name the same
//!   broker (connection Secret or RabbitmqCluster), vhost and send queue collide; the
//!   newer one (by creationTimestamp, then name) is refused, the older one goes on;
//! - in the broker, an owner marker (see [`crate::topology::ownership`]) names the
//!   pipeline that owns a topology and a workers' user; one owned by another pipeline
//!   (of this cluster or another sharing the broker) is refused. A pipeline marks what
//!   it makes, and deleting it removes only what is marked as its own.

use std::sync::Arc;

use kube::ResourceExt;

use super::desired::Desired;
use super::error::Error;
use super::validate::Validated;
use crate::spec::MailerPipeline;
use crate::topology::Management;
use crate::topology::ownership::{Owner, topology_marker, user_marker};

/// The owner marker's value for `pipeline`.
pub fn owner_of(cluster: &str, pipeline: &MailerPipeline) -> Owner {
    Owner {
        cluster: cluster.to_string(),
        namespace: pipeline.namespace().unwrap_or_default(),
        name: pipeline.name_any(),
        uid: pipeline.uid().unwrap_or_default(),
    }
}

/// What identifies the broker objects a pipeline claims, as far as its spec says:
/// the broker it names, its vhost and its send queue.
fn claim_key(pipeline: &MailerPipeline) -> (String, &str, &str) {
    let namespace = pipeline.namespace().unwrap_or_default();
    let rabbitmq = &pipeline.spec.rabbitmq;
    let broker = match (&rabbitmq.connection_secret, &rabbitmq.cluster_ref) {
        (Some(secret), _) => format!("Secret {namespace}/{}", secret.name),
        (None, Some(cluster)) => format!(
            "RabbitmqCluster {}/{}",
            cluster.namespace.as_deref().unwrap_or(&namespace),
            cluster.name
        ),
        (None, None) => String::new(),
    };
    (
        broker,
        rabbitmq.vhost.as_str(),
        pipeline.spec.topology.queue.as_str(),
    )
}

/// Whether `a` and `b` name the same broker, vhost and send queue.
pub fn same_claim(a: &MailerPipeline, b: &MailerPipeline) -> bool {
    claim_key(a) == claim_key(b)
}

/// Fails when an older pipeline among `known` claims the same broker, vhost and send
/// queue as `pipeline`. Pipelines being deleted do not count: their claim is ending.
pub fn check_collisions(
    pipeline: &MailerPipeline,
    known: &[Arc<MailerPipeline>],
) -> Result<(), Error> {
    let key = claim_key(pipeline);
    let age = |p: &MailerPipeline| (p.creation_timestamp(), p.name_any(), p.namespace());
    let older = known
        .iter()
        .filter(|other| other.uid() != pipeline.uid())
        .filter(|other| other.metadata.deletion_timestamp.is_none())
        .filter(|other| claim_key(other) == key)
        .filter(|other| age(other) < age(pipeline))
        .min_by_key(|other| age(other));
    match older {
        Some(other) => Err(Error::Collision {
            other: format!(
                "{}/{}",
                other.namespace().unwrap_or_default(),
                other.name_any()
            ),
            broker: key.0,
            vhost: key.1.to_string(),
            queue: key.2.to_string(),
        }),
        None => Ok(()),
    }
}

/// Marks the pipeline's topology (and its workers' user, when the operator makes it) as
/// its own in the broker, after checking that no other pipeline owns either; writes
/// only markers that are missing.
pub async fn claim(valid: &Validated<'_>, desired: &Desired, cluster: &str) -> Result<(), Error> {
    let management = &valid.broker.management;
    let me = owner_of(cluster, valid.pipeline);
    let mut markers = vec![(
        topology_marker(&desired.topology.vhost, &valid.spec.topology.queue),
        format!(
            "the topology of queue {:?} in vhost {:?}",
            valid.spec.topology.queue, desired.topology.vhost
        ),
    )];
    if valid.credentials.managed {
        markers.push((
            user_marker(&valid.credentials.username),
            format!("the workers' user {:?}", valid.credentials.username),
        ));
    }
    let mut missing = Vec::new();
    for (marker, what) in markers {
        match management.owner(&marker).await? {
            Some(owner) if owner.uid == me.uid => {}
            Some(owner) => {
                return Err(Error::Owned {
                    what,
                    owner: owner.to_string(),
                });
            }
            None => missing.push(marker),
        }
    }
    for marker in missing {
        management.set_owner(&marker, &me).await?;
    }
    Ok(())
}

/// Why something in the broker is not removed with a pipeline.
#[derive(Debug)]
pub enum NotToRemove {
    /// Another pipeline owns it (its owner, in words).
    Foreign(String),
    /// Its marker could not be read.
    Unknown(Error),
}

/// `Ok` when what `marker` marks is this pipeline's to remove: marked as its own, or
/// not marked at all (made before markers existed).
pub async fn is_ours(management: &Management, marker: &str, me: &Owner) -> Result<(), NotToRemove> {
    match management.owner(marker).await {
        Ok(Some(owner)) if owner.uid != me.uid => {
            Err(NotToRemove::Foreign(format!("it belongs to {owner}")))
        }
        Ok(_) => Ok(()),
        Err(e) => Err(NotToRemove::Unknown(Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn pipeline(namespace: &str, name: &str, created: i64, yaml: &str) -> Arc<MailerPipeline> {
        let mut p = MailerPipeline::new(name, serde_yaml::from_str(yaml).unwrap());
        p.metadata.namespace = Some(namespace.into());
        p.metadata.uid = Some(format!("uid-{namespace}-{name}"));
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        Arc::new(p)
    }

    const CONN: &str = "rabbitmq: {connectionSecret: {name: conn}}";

    #[test]
    fn the_newer_of_two_pipelines_on_one_queue_is_refused() {
        let old = pipeline("prod", "b", 10, CONN);
        let new = pipeline("prod", "a", 20, CONN);
        let known = vec![old.clone(), new.clone()];
        assert!(check_collisions(&old, &known).is_ok());
        let error = check_collisions(&new, &known).unwrap_err();
        assert_eq!(error.reason(), "Conflict");
        assert!(error.to_string().contains("prod/b"), "{error}");
        // Created in the same second: the name decides.
        let twin = pipeline("prod", "c", 10, CONN);
        let known = vec![old.clone(), twin.clone()];
        assert!(check_collisions(&old, &known).is_ok());
        assert!(check_collisions(&twin, &known).is_err());
    }

    #[test]
    fn other_queues_vhosts_or_brokers_do_not_collide() {
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
