//! The objects the operator made for its pipelines (worker Deployments and Secrets), read
//! from the caches its watches keep instead of from the API server.
//!
//! Each controller watches them whole, selected by the operator's label (so only its own
//! Secrets, never another Secret's data, are held), with their `managedFields` dropped,
//! and keeps each as its JSON text ([`Packed`]): a Deployment parsed takes about five
//! times the memory of its JSON, and a reconcile reads one object of a thousand. The
//! same watch triggers the reconciles of their pipelines: a change is in the
//! cache before the reconcile it causes starts. A reconcile reads an object from a cache
//! that has synced (a reconcile that starts before waits up to [`SYNC_WAIT`] for it:
//! through a signal of its own, since kube-runtime's `Store::wait_until_ready` wakes only
//! the last of several tasks waiting at once, and the others only at their timeout);
//! one not there (a new pipeline, an object of that name the operator did not make, a
//! cache that did not sync in time, or a reconcile run without controllers, as some tests
//! do) is read from the API server, so the cache only saves requests and never
//! decides that something is missing.
//!
//! Nor does it hand back an object older than the operator's own last write of it: the
//! `resourceVersion` each write returned is kept, and a cached object of another version
//! (the cache not caught up yet, or someone changed it since) is read from the API server.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::controller::error::Error;

/// How long a reconcile waits for the caches to sync (at start) before it reads from
/// the API server instead.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The caches of one controller (one watched namespace, or all).
#[derive(Clone)]
pub struct OwnedStores {
    pub deployments: Store<Packed<Deployment>>,
    pub secrets: Store<Packed<Secret>>,
}

/// Every controller's caches of owned objects.
#[derive(Default)]
pub struct OwnedCaches {
    scopes: Mutex<Vec<OwnedStores>>,
    /// How many registered scopes' caches have not synced yet.
    unsynced: Arc<tokio::sync::watch::Sender<usize>>,
    /// The `resourceVersion`s of the operator's last writes of each object, newest last,
    /// by `(kind, namespace, name)`: several, since reconciles of several pipelines write
    /// one object (a connection Secret they share) at about the same time.
    written: Mutex<HashMap<WriteKey, VecDeque<String>>>,
    /// The operator's writes in flight, by object.
    writing: Mutex<HashMap<WriteKey, usize>>,
    /// Signalled when a write in flight returns.
    write_returned: tokio::sync::Notify,
}

/// A write of one object in flight, from before it is sent until its result is noted;
/// see [`OwnedCaches::writing`].
pub struct Writing<'a> {
    caches: &'a OwnedCaches,
    key: WriteKey,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut writing = lock(&self.caches.writing);
        if let Some(count) = writing.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                writing.remove(&self.key);
            }
        }
        drop(writing);
        self.caches.write_returned.notify_waiters();
    }
}

/// How long a watch event waits for a write of its object in flight to return.
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// How many of the operator's writes of one object are remembered.
const WRITES_KEPT: usize = 32;

/// An object the operator writes: its kind, namespace and name.
type WriteKey = (&'static str, String, String);

fn note_write(
    written: &mut HashMap<WriteKey, VecDeque<String>>,
    key: WriteKey,
    version: Option<&String>,
) {
    match version {
        Some(version) => {
            let versions = written.entry(key).or_default();
            versions.push_back(version.clone());
            if versions.len() > WRITES_KEPT {
                versions.pop_front();
            }
        }
        None => {
            written.remove(&key);
        }
    }
}

/// A kind of owned object and where its caches are.
pub trait Owned:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    fn store(stores: &OwnedStores) -> &Store<Packed<Self>>;
}

impl Owned for Deployment {
    const KIND: &'static str = "Deployment";
    fn store(stores: &OwnedStores) -> &Store<Packed<Self>> {
        &stores.deployments
    }
}

impl Owned for Secret {
    const KIND: &'static str = "Secret";
    fn store(stores: &OwnedStores) -> &Store<Packed<Self>> {
        &stores.secrets
    }
}

impl OwnedCaches {
    /// Adds a controller's caches. One task waits for them to sync, the only waiter on
    /// each store (kube-runtime wakes one of several), and tells the reconciles waiting
    /// in [`read`](Self::read).
    pub fn register(&self, stores: OwnedStores) {
        lock(&self.scopes).push(stores.clone());
        self.unsynced.send_modify(|unsynced| *unsynced += 1);
        let unsynced = self.unsynced.clone();
        tokio::spawn(async move {
            // A store whose writer is gone never syncs: reads go to the API server.
            let _ = stores.deployments.wait_until_ready().await;
            let _ = stores.secrets.wait_until_ready().await;
            unsynced.send_modify(|unsynced| *unsynced = unsynced.saturating_sub(1));
        });
    }

    /// Notes the operator's write of `object`, as the API server returned it.
    pub fn written<K: Owned>(&self, object: &K) {
        let key = (
            K::KIND,
            object.namespace().unwrap_or_default(),
            object.name_any(),
        );
        note_write(
            &mut lock(&self.written),
            key,
            object.resource_version().as_ref(),
        );
    }

    /// Notes the operator's write of a `kind` object's metadata (a Secret it holds, say),
    /// in the version the API server returned.
    pub fn written_meta(&self, kind: &'static str, meta: &ObjectMeta) {
        let key = (
            kind,
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        note_write(
            &mut lock(&self.written),
            key,
            meta.resource_version.as_ref(),
        );
    }

    /// Whether the `kind` object of `meta` is in the very version the operator last wrote:
    /// a watch event of it is the operator's own write coming back, which triggers no
    /// reconcile.
    pub fn is_own_write(&self, kind: &'static str, meta: &ObjectMeta) -> bool {
        let key = (
            kind,
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        meta.resource_version.as_ref().is_some_and(|version| {
            lock(&self.written)
                .get(&key)
                .is_some_and(|versions| versions.contains(version))
        })
    }

    /// Marks a write of the `kind` object `namespace/name` as in flight until the value
    /// returned is dropped, which the caller does once it noted the write's result: a
    /// watch event of the object waits for it ([`writes_done`](Self::writes_done)).
    pub fn writing(&self, kind: &'static str, namespace: &str, name: &str) -> Writing<'_> {
        let key = (kind, namespace.to_string(), name.to_string());
        *lock(&self.writing).entry(key.clone()).or_default() += 1;
        Writing { caches: self, key }
    }

    /// Returns once no write of the `kind` object of `meta` is in flight (at most
    /// [`WRITE_WAIT`]).
    pub async fn writes_done(&self, kind: &'static str, meta: &ObjectMeta) {
        let key = (
            kind,
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        let waited = async {
            loop {
                let returned = self.write_returned.notified();
                tokio::pin!(returned);
                returned.as_mut().enable();
                if !lock(&self.writing).contains_key(&key) {
                    return;
                }
                returned.await;
            }
        };
        let _ = tokio::time::timeout(WRITE_WAIT, waited).await;
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
            .and_then(VecDeque::back)
            .is_none_or(|version| found.meta.resource_version.as_ref() == Some(version));
        if !current {
            return None;
        }
        // A cached object that does not parse back (it cannot: it was serialized from
        // the type) is read from the API server instead.
        found.unpack()
    }

    fn in_stores<K: Owned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<std::sync::Arc<Packed<K>>> {
        let key = ObjectRef::<Packed<K>>::new(name).within(namespace);
        lock(&self.scopes).iter().find_map(|stores| {
            let store = K::store(stores);
            let synced = matches!(store.wait_until_ready().now_or_never(), Some(Ok(())));
            synced.then(|| store.get(&key)).flatten()
        })
    }

    /// `namespace/name` from a cache, else from the API server.
    pub async fn read<K: Owned>(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, Error> {
        let mut unsynced = self.unsynced.subscribe();
        let synced = unsynced.wait_for(|unsynced| *unsynced == 0);
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

/// An owned object as its cache keeps it: the metadata that the cache and the
/// controller's owner mapping read, and the whole object (but its `managedFields`) as
/// JSON, parsed again only when a reconcile reads it.
pub struct Packed<K> {
    meta: ObjectMeta,
    json: Box<str>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Owned> Packed<K> {
    /// `object` without its `managedFields`, packed. Serializing an object just parsed
    /// from the API server does not fail; if it did, the empty text would not
    /// [`unpack`](Self::unpack), and the reconcile would read the object from the API
    /// server.
    pub fn pack(mut object: K) -> Self {
        object.managed_fields_mut().clear();
        let json = serde_json::to_string(&object)
            .unwrap_or_default()
            .into_boxed_str();
        Self {
            meta: std::mem::take(object.meta_mut()),
            json,
            kind: PhantomData,
        }
    }

    pub fn unpack(&self) -> Option<K> {
        serde_json::from_str(&self.json).ok()
    }

    /// A watch's event of whole objects as one of packed objects.
    pub fn pack_event(event: watcher::Event<K>) -> watcher::Event<Self> {
        use watcher::Event;
        match event {
            Event::Apply(object) => Event::Apply(Self::pack(object)),
            Event::Delete(object) => Event::Delete(Self::pack(object)),
            Event::InitApply(object) => Event::InitApply(Self::pack(object)),
            Event::Init => Event::Init,
            Event::InitDone => Event::InitDone,
        }
    }
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            meta: self.meta.clone(),
            json: self.json.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Debug for Packed<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("name", &self.meta.name)
            .field("namespace", &self.meta.namespace)
            .field("bytes", &self.json.len())
            .finish()
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Packed<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn deployment() -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "shop-worker", "namespace": "mail", "resourceVersion": "42",
                "ownerReferences": [{"apiVersion": "mailer.dev/v1alpha1", "kind": "MailerPipeline",
                                     "name": "shop", "uid": "u-1", "controller": true}],
                "managedFields": [{"manager": "mailer", "operation": "Apply"}]
            },
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "shop"}},
                     "template": {"spec": {"containers": [{"name": "worker", "image": "mailer"}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_packed_object_unpacks_whole_but_for_its_managed_fields() {
        let packed = Packed::pack(deployment());
        let expected = deployment();
        let unpacked = packed.unpack().expect("unpacks");
        assert_eq!(unpacked.spec, expected.spec);
        assert!(unpacked.managed_fields().is_empty());
        assert_eq!(
            unpacked.metadata.owner_references,
            expected.metadata.owner_references
        );
    }

    #[test]
    fn a_packed_object_keeps_what_the_cache_and_the_owner_mapping_read() {
        let packed = Packed::pack(deployment());
        assert_eq!(packed.name_any(), "shop-worker");
        assert_eq!(packed.namespace().as_deref(), Some("mail"));
        assert_eq!(packed.resource_version().as_deref(), Some("42"));
        let owner: &OwnerReference = &packed.owner_references()[0];
        assert_eq!((owner.name.as_str(), owner.uid.as_str()), ("shop", "u-1"));
        assert_eq!(Packed::<Deployment>::kind(&()), "Deployment");
        assert_eq!(Packed::<Deployment>::api_version(&()), "apps/v1");
        assert!(packed.managed_fields().is_empty());
    }

    #[test]
    fn every_watch_event_is_packed_as_itself() {
        use watcher::Event;
        let name = |event: &Event<Packed<Deployment>>| match event {
            Event::Apply(p) | Event::Delete(p) | Event::InitApply(p) => Some(p.name_any()),
            Event::Init | Event::InitDone => None,
        };
        let shop = Some("shop-worker".to_string());
        assert!(
            matches!(Packed::pack_event(Event::Apply(deployment())), e @ Event::Apply(_) if name(&e) == shop)
        );
        assert!(
            matches!(Packed::pack_event(Event::Delete(deployment())), e @ Event::Delete(_) if name(&e) == shop)
        );
        assert!(
            matches!(Packed::pack_event(Event::InitApply(deployment())), e @ Event::InitApply(_) if name(&e) == shop)
        );
        assert!(matches!(
            Packed::<Deployment>::pack_event(Event::Init),
            Event::Init
        ));
        assert!(matches!(
            Packed::<Deployment>::pack_event(Event::InitDone),
            Event::InitDone
        ));
    }
}
