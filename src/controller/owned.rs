//! The objects the operator made for its pipelines (worker Deployments and Secrets), read
//! from the caches its watches keep instead of from the API server.
//!
//! Each controller watches them whole, selected by the operator's label (so only its own
//! Secrets, never another Secret's data, are held), with their `managedFields` dropped,
//! and the same watch triggers the reconciles of their pipelines: a change is in the
//! cache before the reconcile it causes starts. A cache keeps each object as its JSON
//! ([`Packed`]) and parses it again when a reconcile reads it: a worker Deployment is
//! about 2 KiB of JSON and 15 KiB parsed, so with thousands of pipelines the parsed
//! objects would be most of the operator's memory. A reconcile reads an object from a cache
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
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher::Event;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::error::Error;

/// How long a reconcile waits for the caches to sync (at start) before it reads from
/// the API server instead.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The caches of one controller (one watched namespace, or all).
#[derive(Clone, Default)]
pub struct OwnedStores {
    pub deployments: Packed<Deployment>,
    pub secrets: Packed<Secret>,
}

/// The objects of one kind a watch saw, by namespace and name, each kept as its JSON;
/// clones share it. It is ready once the watch's first list is in.
pub struct Packed<K> {
    objects: Arc<RwLock<Objects>>,
    ready: Arc<watch::Sender<bool>>,
    kind: PhantomData<fn() -> K>,
}

type Key = (String, String);

#[derive(Default)]
struct Objects {
    by_key: HashMap<Key, Box<[u8]>>,
    /// A list under way: it replaces `by_key` once complete, so objects deleted while
    /// the watch was away are forgotten.
    listing: Option<HashMap<Key, Box<[u8]>>>,
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
            ready: self.ready.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Default for Packed<K> {
    fn default() -> Self {
        Self {
            objects: Arc::default(),
            ready: Arc::new(watch::Sender::new(false)),
            kind: PhantomData,
        }
    }
}

impl<K: Resource + Serialize + DeserializeOwned> Packed<K> {
    /// Takes in one event of the watch.
    pub fn observe(&self, event: &Event<K>) {
        let mut objects = self
            .objects
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match event {
            Event::Init => objects.listing = Some(HashMap::new()),
            Event::InitApply(object) => {
                let listing = objects.listing.get_or_insert_with(HashMap::new);
                put(listing, object);
            }
            Event::InitDone => {
                let listed = objects.listing.take().unwrap_or_default();
                objects.by_key = listed;
                drop(objects);
                self.ready.send_replace(true);
            }
            Event::Apply(object) => put(&mut objects.by_key, object),
            Event::Delete(object) => {
                objects.by_key.remove(&key_of(object));
            }
        }
    }

    /// `namespace/name`, when the cache is ready and holds it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<K> {
        if !self.is_ready() {
            return None;
        }
        let objects = self
            .objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let packed = objects
            .by_key
            .get(&(namespace.to_string(), name.to_string()))?;
        serde_json::from_slice(packed).ok()
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Resolves once the watch's first list is in.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|ready| *ready).await;
    }
}

fn key_of<K: Resource>(object: &K) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// Keeps `object` as its JSON; one that cannot be written as JSON is not kept (and is
/// read from the API server instead).
fn put<K: Resource + Serialize>(objects: &mut HashMap<Key, Box<[u8]>>, object: &K) {
    let key = key_of(object);
    match serde_json::to_vec(object) {
        Ok(json) => objects.insert(key, json.into_boxed_slice()),
        Err(_) => objects.remove(&key),
    };
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
    + Serialize
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    fn store(stores: &OwnedStores) -> &Packed<Self>;
}

impl Owned for Deployment {
    const KIND: &'static str = "Deployment";
    fn store(stores: &OwnedStores) -> &Packed<Self> {
        &stores.deployments
    }
}

impl Owned for Secret {
    const KIND: &'static str = "Secret";
    fn store(stores: &OwnedStores) -> &Packed<Self> {
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
        let stores: Vec<Packed<K>> = lock(&self.scopes)
            .iter()
            .map(|stores| K::store(stores).clone())
            .collect();
        stores.iter().find_map(|store| store.get(namespace, name))
    }

    /// `namespace/name` from a cache, else from the API server.
    pub async fn read<K: Owned>(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, Error> {
        let stores: Vec<Packed<K>> = lock(&self.scopes)
            .iter()
            .map(|stores| K::store(stores).clone())
            .collect();
        let synced = futures::future::join_all(stores.iter().map(Packed::wait_until_ready));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, version: &str) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.into());
        secret.metadata.namespace = Some("prod".into());
        secret.metadata.resource_version = Some(version.into());
        secret
    }

    fn version(cache: &Packed<Secret>, name: &str) -> Option<String> {
        cache.get("prod", name)?.metadata.resource_version
    }

    #[test]
    fn a_packed_cache_follows_its_watch_and_a_relist_forgets_what_went() {
        let cache = Packed::<Secret>::default();
        cache.observe(&Event::Init);
        cache.observe(&Event::InitApply(secret("a", "1")));
        assert!(!cache.is_ready());
        assert_eq!(
            version(&cache, "a"),
            None,
            "not ready before its first list"
        );
        cache.observe(&Event::InitApply(secret("b", "1")));
        cache.observe(&Event::InitDone);
        assert!(cache.is_ready());
        assert_eq!(version(&cache, "a").as_deref(), Some("1"));

        cache.observe(&Event::Apply(secret("a", "2")));
        cache.observe(&Event::Delete(secret("b", "1")));
        assert_eq!(version(&cache, "a").as_deref(), Some("2"));
        assert_eq!(version(&cache, "b"), None);
        assert_eq!(cache.get("other", "a").map(|_| ()), None);

        // A relist: what it lacks is gone once it is complete, and until then the
        // cache answers from the previous list.
        cache.observe(&Event::Init);
        cache.observe(&Event::InitApply(secret("c", "1")));
        assert_eq!(version(&cache, "a").as_deref(), Some("2"));
        cache.observe(&Event::InitDone);
        assert_eq!(version(&cache, "a"), None);
        assert_eq!(version(&cache, "c").as_deref(), Some("1"));
    }
}
