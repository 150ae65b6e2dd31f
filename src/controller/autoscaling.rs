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

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use super::deployment::deployment_name;
use super::error::Error;
use super::meta::owned_meta;
use super::ssa::{apply_if_changed, ensure_ours};
use super::worker_user::{self, URL_KEY};
use crate::spec::{AutoscalingSpec, MailerPipeline};

/// KEDA's API group and version.
pub const KEDA_GROUP_VERSION: &str = "keda.sh/v1alpha1";
/// What to install when KEDA is missing, for the workers' condition.
pub const INSTALL_KEDA: &str = "install KEDA (https://keda.sh/docs/deploy/, e.g. helm install keda kedacore/keda -n keda --create-namespace), or remove spec.worker.autoscaling and set spec.worker.replicas";

/// KEDA's ScaledObject.
pub fn scaled_object_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"),
        "scaledobjects",
    )
}

/// KEDA's TriggerAuthentication.
pub fn trigger_authentication_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("keda.sh", "v1alpha1", "TriggerAuthentication"),
        "triggerauthentications",
    )
}

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
        "name": worker_user::secret_name(pipeline),
        "key": URL_KEY,
    }]}});
    Ok(object)
}

/// How long one reconcile's finding of whether KEDA is installed serves the others: KEDA
/// installed later is used within a minute.
pub const KEDA_DISCOVERY_MAX_AGE: Duration = Duration::from_secs(60);

/// Whether KEDA is installed, as last found out, shared by every reconcile.
#[derive(Default)]
pub struct KedaDiscovery {
    found: Mutex<Option<(Instant, bool)>>,
}

impl KedaDiscovery {
    /// Whether KEDA is installed, as found out at most [`KEDA_DISCOVERY_MAX_AGE`] ago, else
    /// asked now.
    pub async fn installed(&self, client: &Client) -> Result<bool, Error> {
        let lock = || {
            self.found
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let fresh = *lock();
        if let Some((at, installed)) = fresh
            && at.elapsed() < KEDA_DISCOVERY_MAX_AGE
        {
            return Ok(installed);
        }
        let installed = keda_installed(client).await?;
        *lock() = Some((Instant::now(), installed));
        Ok(installed)
    }
}

/// Whether the API server serves KEDA's ScaledObject and TriggerAuthentication.
pub async fn keda_installed(client: &Client) -> Result<bool, Error> {
    match client.list_api_group_resources(KEDA_GROUP_VERSION).await {
        Ok(list) => {
            let served = |plural: &str| list.resources.iter().any(|r| r.name == plural);
            Ok(served("scaledobjects") && served("triggerauthentications"))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(Error::kube(format!("discover {KEDA_GROUP_VERSION}"), e)),
    }
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

/// KEDA's side of a pipeline as read before anything is written.
#[derive(Debug, Default)]
pub struct LiveKeda {
    installed: bool,
    authentication: Option<DynamicObject>,
    scaled_object: Option<DynamicObject>,
}

fn apis(client: &Client, namespace: &str) -> [(Api<DynamicObject>, &'static str); 2] {
    [
        (
            Api::namespaced_with(
                client.clone(),
                namespace,
                &trigger_authentication_resource(),
            ),
            "TriggerAuthentication",
        ),
        (
            Api::namespaced_with(client.clone(), namespace, &scaled_object_resource()),
            "ScaledObject",
        ),
    ]
}

/// Reads whether KEDA is installed and the pipeline's KEDA objects; under autoscaling,
/// one of their names that another controls is a `Conflict` here, before any write.
pub async fn resolve(
    client: &Client,
    discovery: &KedaDiscovery,
    pipeline: &MailerPipeline,
    namespace: &str,
) -> Result<LiveKeda, Error> {
    if !discovery.installed(client).await? {
        return Ok(LiveKeda::default());
    }
    let name = deployment_name(pipeline);
    let [(authentications, _), (scaled_objects, _)] = apis(client, namespace);
    let live = LiveKeda {
        installed: true,
        authentication: read(&authentications, "TriggerAuthentication", namespace, &name).await?,
        scaled_object: read(&scaled_objects, "ScaledObject", namespace, &name).await?,
    };
    if pipeline.spec.worker.autoscaling.is_some() {
        ensure_ours(
            "TriggerAuthentication",
            live.authentication.as_ref(),
            pipeline,
        )?;
        ensure_ours("ScaledObject", live.scaled_object.as_ref(), pipeline)?;
    }
    Ok(live)
}

/// Applies (or removes) the pipeline's KEDA objects, writing only what differs; returns
/// the names of objects that existed and were applied again.
pub async fn converge(
    client: &Client,
    pipeline: &MailerPipeline,
    namespace: &str,
    live: LiveKeda,
) -> Result<(Autoscaling, Vec<String>), Error> {
    let name = deployment_name(pipeline);
    let [(authentications, _), (scaled_objects, _)] = apis(client, namespace);
    let found = [
        (
            &authentications,
            "TriggerAuthentication",
            live.authentication,
        ),
        (&scaled_objects, "ScaledObject", live.scaled_object),
    ];
    let Some(autoscaling) = &pipeline.spec.worker.autoscaling else {
        // Only what is ours is removed.
        for (api, kind, object) in found {
            if object.is_some() && ensure_ours(kind, object.as_ref(), pipeline).is_ok() {
                api.delete(&name, &DeleteParams::default())
                    .await
                    .map_err(|e| Error::kube(format!("delete {kind} {namespace}/{name}"), e))?;
            }
        }
        return Ok((Autoscaling::Off, Vec::new()));
    };
    if !live.installed {
        return Ok((Autoscaling::Unavailable, Vec::new()));
    }
    let mut reapplied = Vec::new();
    for ((api, kind, object), desired) in found.into_iter().zip([
        desired_trigger_authentication(pipeline)?,
        desired_scaled_object(pipeline, autoscaling)?,
    ]) {
        let applied = apply_if_changed(api, &desired, object.as_ref())
            .await
            .map_err(|e| Error::kube(format!("apply {kind} {namespace}/{name}"), e))?;
        if applied.is_some() && object.is_some() {
            reapplied.push(format!("{kind} {name}"));
        }
    }
    Ok((Autoscaling::On, reapplied))
}

async fn read(
    api: &Api<DynamicObject>,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<DynamicObject>, Error> {
    api.get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("read {kind} {namespace}/{name}"), e))
}

/// How many workers the Deployment asks for now: under autoscaling, what KEDA's
/// autoscaler last set (Kubernetes' default of 1 when nothing set it yet).
pub fn desired_workers(pipeline: &MailerPipeline, live: Option<&Deployment>) -> i32 {
    match &pipeline.spec.worker.autoscaling {
        None => pipeline.spec.worker.replicas,
        Some(_) => live
            .and_then(|d| d.spec.as_ref())
            .and_then(|s| s.replicas)
            .unwrap_or(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(yaml: &str) -> MailerPipeline {
        let mut p = MailerPipeline::new("shop", serde_yaml::from_str(yaml).unwrap());
        p.metadata.namespace = Some("prod".into());
        p.metadata.uid = Some("uid-1".into());
        p
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
