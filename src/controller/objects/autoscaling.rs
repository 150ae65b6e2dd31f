//! Autoscaling of the workers by the depth of the send queue, with KEDA.
//!
//! For `spec.worker.autoscaling` the operator makes a KEDA ScaledObject with a `rabbitmq`
//! trigger (`mode: QueueLength` on the send queue of the pipeline's vhost, `value`
//! = `messagesPerWorker`) and a TriggerAuthentication that hands KEDA the workers' own
//! AMQP URL from the Secret the pipeline owns: that user may read the send queue and do
//! nothing else there, which is all KEDA needs to count it. Both are named after the
//! worker Deployment and owned by the pipeline. KEDA's HorizontalPodAutoscaler owns the
//! Deployment's `replicas` then; the operator applies the Deployment without it.
//!
//! When KEDA is not installed (its API group is not served), nothing of it is applied
//! and the workers' condition says what to install; the rest of the pipeline works.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::DynamicObject;
use serde_json::json;

use crate::controller::error::Error;
use crate::controller::kube::keda::{scaled_object_resource, trigger_authentication_resource};
use crate::controller::objects::deployment::deployment_name;
use crate::controller::objects::meta::owned_meta;
use crate::controller::objects::worker_secret::{self, URL_KEY};
use crate::spec::{AutoscalingSpec, MailerPipeline};

/// What to install when KEDA is missing, for the workers' condition.
pub const INSTALL_KEDA: &str = "install KEDA (https://keda.sh/docs/deploy/, e.g. helm install keda kedacore/keda -n keda --create-namespace), or remove spec.worker.autoscaling and set spec.worker.replicas";

/// The ScaledObject that scales the pipeline's workers by its send queue.
pub fn desired_scaled_object(
    pipeline: &MailerPipeline,
    autoscaling: &AutoscalingSpec,
) -> Result<DynamicObject, Error> {
    let name = deployment_name(pipeline);
    let mut object = DynamicObject::new(&name, &scaled_object_resource());
    object.metadata = owned_meta(pipeline, name.clone())?;
    object.data = json!({"spec": {
        "scaleTargetRef": {"name": name},
        "minReplicaCount": autoscaling.min_replicas,
        "maxReplicaCount": autoscaling.max_replicas,
        "triggers": [{
            "type": "rabbitmq",
            "metadata": {
                "protocol": "amqp",
                "mode": "QueueLength",
                "value": autoscaling.messages_per_worker.to_string(),
                "queueName": pipeline.spec.topology.queue,
                "vhostName": pipeline.spec.rabbitmq.vhost,
            },
            "authenticationRef": {"name": name},
        }],
    }});
    Ok(object)
}

/// The TriggerAuthentication that gives KEDA the workers' AMQP URL.
pub fn desired_trigger_authentication(pipeline: &MailerPipeline) -> Result<DynamicObject, Error> {
    let name = deployment_name(pipeline);
    let mut object = DynamicObject::new(&name, &trigger_authentication_resource());
    object.metadata = owned_meta(pipeline, name)?;
    object.data = json!({"spec": {"secretTargetRef": [{
        "parameter": "host",
        "name": worker_secret::secret_name(pipeline),
        "key": URL_KEY,
    }]}});
    Ok(object)
}

/// What the autoscaling side of a reconcile found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Autoscaling {
    /// `spec.worker.autoscaling` is not set; what KEDA objects of the pipeline's were left
    /// from before are removed.
    Off,
    /// KEDA scales the workers.
    On,
    /// Autoscaling is asked for but KEDA is not installed.
    Unavailable,
}

/// How many workers the Deployment asks for now: under autoscaling, what KEDA's
/// autoscaler last set (Kubernetes' default of 1 when nothing set it yet).
pub fn desired_workers(pipeline: &MailerPipeline, live: Option<&Deployment>) -> i32 {
    match &pipeline.spec.worker.autoscaling {
        None => pipeline.spec.worker.replicas,
        Some(_) => live.map_or(1, asked_workers),
    }
}

/// The workers a Deployment asks for: its `spec.replicas`, Kubernetes' default of 1 when
/// nothing set it.
pub fn asked_workers(deployment: &Deployment) -> i32 {
    deployment
        .spec
        .as_ref()
        .and_then(|spec| spec.replicas)
        .unwrap_or(1)
}

/// Whether the worker Deployment has fewer ready workers than it asks for.
pub fn workers_short(deployment: &Deployment) -> bool {
    let ready = deployment
        .status
        .as_ref()
        .and_then(|status| status.ready_replicas)
        .unwrap_or(0);
    ready < asked_workers(deployment)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::controller::fixtures::pipeline;

    #[test]
    fn workers_are_short_while_fewer_are_ready_than_asked_for() {
        let deployment = |asked: Option<i32>, ready: Option<i32>| Deployment {
            spec: Some(k8s_openapi::api::apps::v1::DeploymentSpec {
                replicas: asked,
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::apps::v1::DeploymentStatus {
                ready_replicas: ready,
                ..Default::default()
            }),
            ..Deployment::default()
        };
        assert!(workers_short(&deployment(Some(2), Some(1))));
        assert!(workers_short(&deployment(None, None)), "1 asked by default");
        assert!(!workers_short(&deployment(Some(2), Some(2))));
        assert!(!workers_short(&deployment(Some(0), None)), "scaled to zero");
    }

    #[test]
    fn the_scaled_object_scales_the_workers_by_the_send_queue() {
        let p = pipeline(
            "rabbitmq: {vhost: shop}\ntopology: {queue: shop.out}\n\
             worker: {autoscaling: {minReplicas: 0, maxReplicas: 8, messagesPerWorker: 50}}",
        );
        let autoscaling = p.spec.worker.autoscaling.clone().unwrap();
        let object =
            serde_json::to_value(desired_scaled_object(&p, &autoscaling).unwrap()).unwrap();
        assert_eq!(object["apiVersion"], "keda.sh/v1alpha1");
        assert_eq!(object["kind"], "ScaledObject");
        assert_eq!(object["metadata"]["name"], "shop-worker");
        assert_eq!(object["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(
            object["spec"],
            json!({"scaleTargetRef": {"name": "shop-worker"}, "minReplicaCount": 0, "maxReplicaCount": 8,
                   "triggers": [{"type": "rabbitmq",
                                 "metadata": {"protocol": "amqp", "mode": "QueueLength", "value": "50",
                                              "queueName": "shop.out", "vhostName": "shop"},
                                 "authenticationRef": {"name": "shop-worker"}}]})
        );
    }

    #[test]
    fn the_trigger_authentication_reads_the_workers_url_from_the_pipelines_secret() {
        let object =
            serde_json::to_value(desired_trigger_authentication(&pipeline("{}")).unwrap()).unwrap();
        assert_eq!(object["kind"], "TriggerAuthentication");
        assert_eq!(
            object["spec"],
            json!({"secretTargetRef": [{"parameter": "host", "name": "shop-worker-amqp", "key": "url"}]})
        );
    }

    #[test]
    fn the_desired_count_is_the_autoscalers_under_autoscaling() {
        let fixed = pipeline("worker: {replicas: 3}");
        let live = Deployment {
            spec: Some(k8s_openapi::api::apps::v1::DeploymentSpec {
                replicas: Some(6),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(desired_workers(&fixed, Some(&live)), 3);
        let scaled = pipeline("worker: {autoscaling: {maxReplicas: 9}}");
        assert_eq!(desired_workers(&scaled, Some(&live)), 6);
        assert_eq!(desired_workers(&scaled, None), 1);
    }
}
