//! The objects the operator made for its pipelines (worker Deployments and Secrets), read
//! from the caches its watches keep instead of from the API server.
//!
//! Each controller watches them whole, selected by the operator's label (so only its own
//! Secrets, never another Secret's data, are held), with their `managedFields` dropped,
//! and the same watch triggers the reconciles of their pipelines: a change is in the
//! cache before the reconcile it causes starts. A reconcile reads an object from a cache
//! that has synced (a reconcile that starts before waits up to [`SYNC_WAIT`] for it);
//! one not there (a new pipeline, an object of that name the operator did not make, a
//! cache that did not sync in time, or a reconcile run without controllers, as some tests
//! do) is read from the API server, so the cache only saves requests and never
//! decides that something is missing.
//!
//! Nor does it hand back an object older than the operator's own last write of it: the
//! `resourceVersion` each write returned is kept, and a cached object of another version
//! (the cache not caught up yet, or someone changed it since) is read from the API server.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::error::Error;

/// How long a reconcile waits for the caches to sync (at start) before it reads from
/// the API server instead.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The caches of one controller (one watched namespace, or all).
#[derive(Clone)]
pub struct OwnedStores {
    pub deployments: Store<Deployment>,
    pub secrets: Store<Secret>,
}

/// Every controller's caches of owned objects.
#[derive(Default)]
pub struct OwnedCaches {
    scopes: Mutex<Vec<OwnedStores>>,
    /// The `resourceVersion` of the operator's last write of each object, by
    /// `(kind, namespace, name)`.
    written: Mutex<HashMap<(&'static str, String, String), String>>,
}

/// A kind of owned object and where its caches are.
pub trait Owned:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    fn store(stores: &OwnedStores) -> &Store<Self>;
}

impl Owned for Deployment {
    const KIND: &'static str = "Deployment";
    fn store(stores: &OwnedStores) -> &Store<Self> {
        &stores.deployments
    }
}

impl Owned for Secret {
    const KIND: &'static str = "Secret";
    fn store(stores: &OwnedStores) -> &Store<Self> {
        &stores.secrets
    }
}

impl OwnedCaches {
    pub fn register(&self, stores: OwnedStores) {
        lock(&self.scopes).push(stores);
    }

    /// Notes the operator's write of `object`, as the API server returned it.
    pub fn written<K: Owned>(&self, object: &K) {
        let key = (
            K::KIND,
            object.namespace().unwrap_or_default(),
            object.name_any(),
        );
        let mut written = lock(&self.written);
        match object.resource_version() {
            Some(version) => written.insert(key, version),
            None => written.remove(&key),
        };
    }

    /// Forgets the writes of the objects of the pipeline-owned `names` in `namespace`.
    pub fn forget(&self, namespace: &str, names: &[String]) {
        lock(&self.written).retain(|(_, ns, name), _| ns != namespace || !names.contains(name));
    }

    /// `namespace/name` from a cache that has synced, if one holds it, in the version the
    /// operator last wrote (when it wrote it since it started).
    pub fn cached<K: Owned>(&self, namespace: &str, name: &str) -> Option<K> {
        let found = self.in_stores::<K>(namespace, name)?;
        let key = (K::KIND, namespace.to_string(), name.to_string());
        let current = lock(&self.written)
            .get(&key)
            .is_none_or(|version| found.resource_version().as_ref() == Some(version));
        current.then_some(found)
    }

    fn in_stores<K: Owned>(&self, namespace: &str, name: &str) -> Option<K> {
        let key = ObjectRef::<K>::new(name).within(namespace);
        lock(&self.scopes).iter().find_map(|stores| {
            let store = K::store(stores);
            let synced = matches!(store.wait_until_ready().now_or_never(), Some(Ok(())));
            synced
                .then(|| store.get(&key))
                .flatten()
                .map(|found| found.as_ref().clone())
        })
    }

    /// `namespace/name` from a cache, else from the API server.
    pub async fn read<K: Owned>(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, Error> {
        let stores: Vec<Store<K>> = lock(&self.scopes)
            .iter()
            .map(|stores| K::store(stores).clone())
            .collect();
        let synced = futures::future::join_all(stores.iter().map(Store::wait_until_ready));
        let _ = tokio::time::timeout(SYNC_WAIT, synced).await;
        if let Some(found) = self.cached(namespace, name) {
            return Ok(Some(found));
        }
        Api::<K>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("read {} {namespace}/{name}", K::KIND), e))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
