//! KEDA through the Kubernetes API: its resources, and whether it is installed (its API
//! group served, asked at most once a minute). What a pipeline's KEDA objects should say
//! is [`crate::controller::objects::autoscaling`]'s.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};

use crate::controller::error::Error;

/// KEDA's API group and version.
pub const KEDA_GROUP_VERSION: &str = "keda.sh/v1alpha1";
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

/// The APIs of a namespace's TriggerAuthentications and ScaledObjects, with their kinds.
pub fn apis(client: &Client, namespace: &str) -> [(Api<DynamicObject>, &'static str); 2] {
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
