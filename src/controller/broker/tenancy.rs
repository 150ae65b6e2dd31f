//! Which namespaces may use a RabbitmqCluster.
//!
//! A `clusterRef` hands the pipeline the cluster's default user, an administrator. So a
//! pipeline may name a RabbitmqCluster of another namespace only when that cluster says
//! so, with the annotation RabbitMQ's messaging-topology-operator reads for the same
//! purpose: `rabbitmq.com/topology-allowed-namespaces`, a comma-separated list of
//! namespaces, or `*` for every namespace. A cluster in the pipeline's own namespace is
//! always allowed.
//!
//! Allowing is not for ever: when a namespace leaves the annotation, its pipelines'
//! workers' users that the operator made in that cluster are removed
//! ([`crate::controller::reconcile::revoke`]), so their access ends with the permission,
//! while what the pipelines hold otherwise stays theirs (the mail in their queues
//! included).

use kube::api::DynamicObject;

use crate::controller::error::Error;
use crate::spec::MailerPipeline;

/// Whether a cluster of another namespace must allow the pipeline's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// To apply the pipeline: the cluster must allow its namespace.
    Apply,
    /// To take away what the operator gave the pipeline there (its namespace is no
    /// longer allowed): the cluster's credentials are used by the operator alone.
    Revoke,
}

/// The annotation on a RabbitmqCluster that lists the namespaces whose pipelines may
/// use it.
pub const ALLOWED_NAMESPACES_ANNOTATION: &str = "rabbitmq.com/topology-allowed-namespaces";

/// Whether a pipeline in `pipeline_namespace` may use `cluster`, which lives in
/// `cluster_namespace`; the error says which annotation to set when it may not.
pub fn check_allowed(
    cluster: &DynamicObject,
    cluster_namespace: &str,
    pipeline_namespace: &str,
) -> Result<(), Error> {
    if cluster_namespace == pipeline_namespace {
        return Ok(());
    }
    let listed = cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOWED_NAMESPACES_ANNOTATION))
        .is_some_and(|list| lists(list, pipeline_namespace));
    if listed {
        Ok(())
    } else {
        Err(Error::NotAllowed {
            cluster_namespace: cluster_namespace.to_string(),
            cluster: cluster.metadata.name.clone().unwrap_or_default(),
            namespace: pipeline_namespace.to_string(),
        })
    }
}

/// Whether the operator ever applied `pipeline`, as its status (which only the operator
/// writes) says: a pipeline never applied holds nothing anywhere, so nothing of a cluster
/// that does not allow it is read for it, not even to look.
pub fn was_applied(pipeline: &MailerPipeline) -> bool {
    pipeline
        .status
        .as_ref()
        .is_some_and(|s| s.applied_generation.is_some() || s.worker_user.is_some())
}

/// How a pipeline's cleanup finds its broker: one the operator applied may clean up in a
/// cluster that no longer allows its namespace, removing only what it holds there.
pub fn cleanup_use(pipeline: &MailerPipeline) -> Use {
    if was_applied(pipeline) {
        Use::Revoke
    } else {
        Use::Apply
    }
}

/// Whether the comma-separated `list` names `namespace` or holds `*`.
fn lists(list: &str, namespace: &str) -> bool {
    list.split(',')
        .map(str::trim)
        .any(|entry| entry == "*" || entry == namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::broker::connection::rabbitmq_cluster_resource;

    fn cluster(annotation: Option<&str>) -> DynamicObject {
        let mut cluster = DynamicObject::new("rmq", &rabbitmq_cluster_resource());
        if let Some(value) = annotation {
            cluster.metadata.annotations =
                Some([(ALLOWED_NAMESPACES_ANNOTATION.to_string(), value.to_string())].into());
        }
        cluster
    }

    #[test]
    fn the_own_namespace_is_always_allowed() {
        assert!(check_allowed(&cluster(None), "data", "data").is_ok());
    }

    #[test]
    fn another_namespace_needs_to_be_listed_or_a_star() {
        for allowed in ["shop", " billing , shop ", "*", "a,*"] {
            assert!(
                check_allowed(&cluster(Some(allowed)), "data", "shop").is_ok(),
                "{allowed:?}"
            );
        }
        for refused in [
            None,
            Some(""),
            Some("billing"),
            Some("shop2,sho"),
            Some("*shop"),
        ] {
            let error = check_allowed(&cluster(refused), "data", "shop").unwrap_err();
            assert_eq!(error.reason(), "NotAllowed");
            let message = error.to_string();
            assert!(
                message.contains(ALLOWED_NAMESPACES_ANNOTATION) && message.contains("data/rmq"),
                "{message}"
            );
        }
    }
}
