//! The objects and their history, with kube-apiserver's rules for writes: the server
//! owns `uid`, `creationTimestamp`, `deletionTimestamp`, `generation` and
//! `resourceVersion`; a stale `resourceVersion` is a conflict; a write that changes
//! nothing is no write (no new version, no watch event); the `status` subresource is
//! written apart from the object; `generation` counts changes of everything but metadata
//! and status; DELETE of an object with finalizers only marks it, and it goes when its
//! last finalizer does; what it owns goes with it (the garbage collector's part).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use serde_json::{Value, json};

use super::address::Address;
use super::admission::{self, now};
use super::discovery;
use super::patch;
use super::selector::Selector;

/// What a watch reports about one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change in the history watches read.
#[derive(Debug, Clone)]
pub struct Logged {
    pub version: u64,
    pub address: Address,
    pub kind: EventType,
    pub previous: Option<Value>,
    pub object: Value,
}

/// A refused request: the HTTP code, the `Status` reason and message.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn not_found(key: &str) -> Self {
        Self::new(404, "NotFound", format!("{key} not found"))
    }
}

/// The patch formats, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Apply,
    /// Applied by `strategic.rs` before the store sees it (`Store::patched`).
    Strategic,
}

/// Without `strict`: resources served whether or not an object of theirs exists; others
/// (a CRD's) are served once an object of theirs was stored, or they were installed.
const BUILT_IN: &[&str] = &[
    "/api/v1",
    "/apis/apps/v1",
    "/apis/coordination.k8s.io/v1",
    "/apis/events.k8s.io/v1",
    "/apis/mailer.dev/v1alpha1",
    "/apis/apiextensions.k8s.io/v1",
];

#[derive(Default)]
pub struct Store {
    objects: BTreeMap<String, Value>,
    log: Vec<Logged>,
    /// The newest resourceVersion handed out.
    pub version: u64,
    /// Versions up to this one were compacted away: a watch from them gets 410 Gone.
    pub compacted: u64,
    /// Resources a test installed (`FakeApi::install`).
    installed: BTreeSet<(String, String)>,
    /// Resources an object was stored of.
    seen: BTreeSet<(String, String)>,
    uids: u64,
    /// As a new cluster: only the built-in kinds of `discovery.rs` and what stored CRDs
    /// define are served (and what a test installed), and an object of a namespace
    /// that does not exist is refused. Otherwise any resource of the built-in groups is
    /// served, and mailer.dev's without its CRD.
    pub strict: bool,
}

impl Store {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Makes `prefix`/`resource` served (e.g. a CRD that was installed).
    pub fn install(&mut self, prefix: &str, resource: &str) {
        self.installed
            .insert((prefix.to_string(), resource.to_string()));
    }

    pub fn serves(&self, prefix: &str, resource: &str) -> bool {
        let key = (prefix.to_string(), resource.to_string());
        if self.installed.contains(&key) {
            return true;
        }
        if self.strict {
            self.served(prefix, resource).is_some()
        } else {
            BUILT_IN.contains(&prefix) || self.seen.contains(&key)
        }
    }

    /// The resources served under `prefix` that no definition describes (installed by
    /// a test, or without `strict` stored), for its discovery document.
    pub fn resources_under(&self, prefix: &str) -> Vec<String> {
        let seen = (!self.strict).then_some(&self.seen);
        self.installed
            .iter()
            .chain(seen.into_iter().flatten())
            .filter(|(p, _)| p == prefix)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Every object whose key starts with `prefix`.
    /// The CRDs stored.
    fn crds(&self) -> Vec<Value> {
        self.objects_under(&format!("{}/", discovery::CRDS))
    }

    /// Everything served: the built-in kinds, then what the stored CRDs add.
    pub fn all_served(&self) -> Vec<discovery::Served> {
        discovery::all(&self.crds())
    }

    /// The resource served at `prefix` named `plural`.
    pub fn served(&self, prefix: &str, plural: &str) -> Option<discovery::Served> {
        discovery::find(&self.crds(), prefix, plural)
    }

    pub fn objects_under(&self, prefix: &str) -> Vec<Value> {
        self.objects
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// With `strict`, an object of a namespace that does not exist is refused.
    fn check_namespace(&self, address: &Address) -> Result<(), ApiError> {
        match &address.namespace {
            Some(namespace)
                if self.strict
                    && !self
                        .objects
                        .contains_key(&format!("/api/v1/namespaces/{namespace}")) =>
            {
                Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("namespaces {namespace:?} not found"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// One page of `collection`'s objects that `selector` selects, after the key
    /// `after`; and the key to continue from when more follow.
    pub fn list(
        &self,
        collection: &Address,
        selector: &Selector,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> (Vec<Value>, Option<String>) {
        // A namespace's objects of a resource (and a cluster-scoped resource's) sit
        // together under their collection's path, as in kube-apiserver's storage: only
        // those are walked. A list across every namespace walks everything.
        let under = collection
            .namespace
            .is_some()
            .then(|| format!("{}/", collection.collection_key()));
        let start = match (after, &under) {
            (Some(key), _) => Bound::Excluded(key.to_string()),
            (None, Some(under)) => Bound::Included(under.clone()),
            (None, None) => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut last = None;
        for (key, object) in self.objects.range((start, Bound::Unbounded)) {
            if under
                .as_ref()
                .is_some_and(|under| !key.starts_with(under.as_str()))
            {
                break;
            }
            let selected = Address::parse(key).is_some_and(|a| collection.contains(&a))
                && selector.matches(object);
            if !selected {
                continue;
            }
            if limit.is_some_and(|limit| items.len() == limit) {
                return (items, last);
            }
            items.push(object.clone());
            last = Some(key.clone());
        }
        (items, None)
    }

    /// Every current object of `collection` that `selector` selects.
    pub fn snapshot(&self, collection: &Address, selector: &Selector) -> Vec<Value> {
        self.list(collection, selector, None, None).0
    }

    /// What a watch of `collection` with `selector` reports after `since`: an object
    /// that starts to be selected is ADDED, one that stops being selected is DELETED.
    pub fn events_since(
        &self,
        collection: &Address,
        selector: &Selector,
        since: u64,
    ) -> Vec<(EventType, Value)> {
        let first = self.log.partition_point(|e| e.version <= since);
        self.log[first..]
            .iter()
            .filter(|e| collection.contains(&e.address))
            .filter_map(|e| {
                let was = e.previous.as_ref().is_some_and(|p| selector.matches(p));
                let is = selector.matches(&e.object);
                let kind = match (e.kind, was, is) {
                    (EventType::Deleted, true, _) => EventType::Deleted,
                    (EventType::Deleted, false, _) => return None,
                    (_, false, true) => EventType::Added,
                    (_, true, true) => EventType::Modified,
                    (_, true, false) => EventType::Deleted,
                    (_, false, false) => return None,
                };
                Some((kind, e.object.clone()))
            })
            .collect()
    }

    /// Forgets the history: watches from an older version get 410 Gone.
    pub fn compact(&mut self) {
        self.log.clear();
        self.compacted = self.version;
    }

    /// POST to a collection.
    pub fn create(&mut self, collection: &Address, mut body: Value) -> Result<Value, ApiError> {
        let name = match body["metadata"]["name"].as_str() {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => match body["metadata"]["generateName"].as_str() {
                Some(prefix) => {
                    self.uids += 1;
                    format!("{prefix}{:05x}", self.uids)
                }
                None => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "metadata.name: Required value",
                    ));
                }
            },
        };
        let address = collection.with_name(&name);
        self.check_namespace(&address)?;
        if self.objects.contains_key(&address.key()) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", address.resource),
            ));
        }
        if address.has_status_subresource() {
            strip(&mut body, "status");
        }
        self.commit(&address, None, body)
    }

    /// PUT of an object or its status.
    pub fn replace(&mut self, address: &Address, body: Value) -> Result<Value, ApiError> {
        let previous = self.existing(address)?;
        check_version(&previous, &body)?;
        let next = self.split_status(address, &previous, body);
        self.commit(address, Some(previous), next)
    }

    /// PATCH of an object or its status; server-side apply creates a missing object.
    pub fn patch(
        &mut self,
        address: &Address,
        kind: PatchKind,
        body: Value,
    ) -> Result<Value, ApiError> {
        let Some(previous) = self.objects.get(&address.key()).cloned() else {
            if kind == PatchKind::Apply && address.subresource.is_none() {
                self.check_namespace(address)?;
                let mut body = body;
                if address.has_status_subresource() {
                    strip(&mut body, "status");
                }
                return self.commit(address, None, body);
            }
            return Err(ApiError::not_found(&address.key()));
        };
        if body.is_object() {
            check_version(&previous, &body)?;
        }
        let mut patched = previous.clone();
        match kind {
            PatchKind::Merge | PatchKind::Apply => patch::merge(&mut patched, &body),
            PatchKind::Json => patch::json_patch(&mut patched, &body)
                .map_err(|why| ApiError::new(422, "Invalid", why))?,
            PatchKind::Strategic => {
                return Err(ApiError::new(415, "UnsupportedMediaType", "strategic"));
            }
        }
        let next = self.split_status(address, &previous, patched);
        self.commit(address, Some(previous), next)
    }

    /// A PATCH whose result `patched` was made elsewhere (a strategic merge patch):
    /// `patch`'s resourceVersion, if any, must be the current one.
    pub fn patched(
        &mut self,
        address: &Address,
        patch: &Value,
        patched: Value,
    ) -> Result<Value, ApiError> {
        let previous = self.existing(address)?;
        check_version(&previous, patch)?;
        let next = self.split_status(address, &previous, patched);
        self.commit(address, Some(previous), next)
    }

    /// DELETE: an object with finalizers is marked for deletion and stays until its last
    /// finalizer is removed; one without goes at once, and so does what it owns.
    pub fn delete(&mut self, address: &Address) -> Result<Value, ApiError> {
        let previous = self.existing(address)?;
        let finalizers = previous["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if !finalizers {
            return Ok(self.remove(address, previous));
        }
        if !previous["metadata"]["deletionTimestamp"].is_null() {
            return Ok(previous);
        }
        let mut next = previous.clone();
        next["metadata"]["deletionTimestamp"] = json!(now());
        next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        // As kube-apiserver does: the mark is a change a generation-watching controller
        // must see.
        if address.tracks_generation() {
            let generation = previous["metadata"]["generation"].as_i64().unwrap_or(0);
            next["metadata"]["generation"] = json!(generation + 1);
        }
        Ok(self.record(address, Some(previous), next))
    }

    /// Stores `object` as a test seeds it: its status too, with the server's
    /// bookkeeping (resourceVersion, uid, generation) applied.
    pub fn put(&mut self, address: &Address, object: Value) -> Value {
        let previous = self.objects.get(&address.key()).cloned();
        match self.commit(address, previous, object) {
            Ok(stored) => stored,
            Err(e) => panic!("the fake API refused to store {}: {e:?}", address.key()),
        }
    }

    fn existing(&self, address: &Address) -> Result<Value, ApiError> {
        self.objects
            .get(&address.key())
            .cloned()
            .ok_or_else(|| ApiError::not_found(&address.key()))
    }

    /// What a write to `address` makes of `previous` and the written `body`: a write
    /// to `/status` changes only the status; one to an object with a status subresource
    /// never changes its status.
    fn split_status(&self, address: &Address, previous: &Value, body: Value) -> Value {
        if address.subresource.as_deref() == Some("status") {
            let mut next = previous.clone();
            set_or_strip(&mut next, "status", body.get("status").cloned());
            next
        } else if address.has_status_subresource() {
            let mut next = body;
            set_or_strip(&mut next, "status", previous.get("status").cloned());
            next
        } else {
            body
        }
    }

    /// A write, with what the server owns kept or filled in; no write at all when
    /// nothing changed.
    fn commit(
        &mut self,
        address: &Address,
        previous: Option<Value>,
        mut next: Value,
    ) -> Result<Value, ApiError> {
        let address = address.with_name(address.name.as_deref().unwrap_or_default());
        if !next["metadata"].is_object() {
            next["metadata"] = json!({});
        }
        let name = address.name.clone().unwrap_or_default();
        next["metadata"]["name"] = json!(name);
        if let Some(namespace) = &address.namespace {
            next["metadata"]["namespace"] = json!(namespace);
        }
        strip_meta(&mut next, "managedFields");
        admission::admit(&address, previous.as_ref(), &mut next);
        match &previous {
            Some(previous) => {
                for owned in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ] {
                    let kept = previous["metadata"].get(owned).cloned();
                    set_or_strip(&mut next["metadata"], owned, kept);
                }
                if !previous["metadata"]["deletionTimestamp"].is_null() {
                    let before = finalizers(previous);
                    if let Some(added) = finalizers(&next).difference(&before).next() {
                        return Err(ApiError::new(
                            422,
                            "Invalid",
                            format!(
                                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [{added}]"
                            ),
                        ));
                    }
                }
                if address.tracks_generation() && spec_of(previous) != spec_of(&next) {
                    let generation = previous["metadata"]["generation"].as_i64().unwrap_or(0);
                    next["metadata"]["generation"] = json!(generation + 1);
                }
                if without_version(previous) == without_version(&next) {
                    return Ok(previous.clone());
                }
            }
            None => {
                if next["metadata"]["uid"].as_str().is_none_or(str::is_empty) {
                    self.uids += 1;
                    next["metadata"]["uid"] = json!(format!("uid-{:08}", self.uids));
                }
                if next["metadata"]["creationTimestamp"].is_null() {
                    next["metadata"]["creationTimestamp"] = json!(now());
                }
                strip_meta(&mut next, "deletionTimestamp");
                if address.tracks_generation() {
                    next["metadata"]["generation"] = json!(1);
                }
            }
        }
        self.seen
            .insert((address.prefix.clone(), address.resource.clone()));
        let deleting = !next["metadata"]["deletionTimestamp"].is_null();
        if deleting && finalizers(&next).is_empty() {
            return Ok(self.remove(&address, next));
        }
        Ok(self.record(&address, previous, next))
    }

    /// Stores `next` under a new version and logs it.
    fn record(&mut self, address: &Address, previous: Option<Value>, mut next: Value) -> Value {
        self.version += 1;
        next["metadata"]["resourceVersion"] = json!(self.version.to_string());
        let kind = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.objects.insert(address.key(), next.clone());
        self.log.push(Logged {
            version: self.version,
            address: address.clone(),
            kind,
            previous,
            object: next.clone(),
        });
        next
    }

    /// Removes the object for good, then what it owns.
    fn remove(&mut self, address: &Address, mut last: Value) -> Value {
        let previous = self.objects.remove(&address.key());
        self.version += 1;
        last["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.log.push(Logged {
            version: self.version,
            address: address.clone(),
            kind: EventType::Deleted,
            previous: previous.or_else(|| Some(last.clone())),
            object: last.clone(),
        });
        if let Some(uid) = last["metadata"]["uid"].as_str() {
            let dependents: Vec<Address> = self
                .objects
                .iter()
                .filter(|(_, object)| {
                    object["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|owners| owners.iter().any(|o| o["uid"] == uid))
                })
                .filter_map(|(key, _)| Address::parse(key))
                .filter(|dependent| dependent.namespace == address.namespace)
                .collect();
            for dependent in dependents {
                let _ = self.delete(&dependent);
            }
        }
        last
    }
}

fn check_version(previous: &Value, body: &Value) -> Result<(), ApiError> {
    match body["metadata"]["resourceVersion"].as_str() {
        Some(wanted)
            if !wanted.is_empty()
                && Some(wanted) != previous["metadata"]["resourceVersion"].as_str() =>
        {
            Err(ApiError::new(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again",
            ))
        }
        _ => Ok(()),
    }
}

fn finalizers(object: &Value) -> BTreeSet<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// What `generation` counts: everything but metadata and status.
fn spec_of(object: &Value) -> Value {
    let mut spec = object.clone();
    for field in ["metadata", "status", "kind", "apiVersion"] {
        strip(&mut spec, field);
    }
    spec
}

fn without_version(object: &Value) -> Value {
    let mut object = object.clone();
    strip_meta(&mut object, "resourceVersion");
    object
}

fn strip(object: &mut Value, field: &str) {
    if let Some(fields) = object.as_object_mut() {
        fields.remove(field);
    }
}

fn strip_meta(object: &mut Value, field: &str) {
    strip(&mut object["metadata"], field);
}

fn set_or_strip(object: &mut Value, field: &str, value: Option<Value>) {
    match value {
        Some(value) if !value.is_null() => object[field] = value,
        _ => strip(object, field),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secret(namespace: &str, name: &str) -> (Address, Value) {
        let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
        let address = Address::parse(&path).expect("an object's path");
        let object = json!({"metadata": {"namespace": namespace, "name": name}});
        (address, object)
    }

    fn names(items: &[Value]) -> Vec<String> {
        items
            .iter()
            .map(|o| {
                format!("{}/{}", o["metadata"]["namespace"], o["metadata"]["name"]).replace('"', "")
            })
            .collect()
    }

    /// A namespace's list walks only what is stored under its collection, and pages on
    /// through it; a list across namespaces still sees every one.
    #[test]
    fn a_namespaces_list_holds_its_own_objects_page_by_page() {
        let mut store = Store::default();
        for (namespace, name) in [("a", "x"), ("b", "y"), ("b", "z"), ("bb", "w"), ("c", "v")] {
            let (address, object) = secret(namespace, name);
            store.put(&address, object);
        }
        let everything = Selector::default();
        let in_b = Address::parse("/api/v1/namespaces/b/secrets").expect("a collection");
        let (first, next) = store.list(&in_b, &everything, None, Some(1));
        assert_eq!(names(&first), ["b/y"]);
        let (rest, next) = store.list(&in_b, &everything, next.as_deref(), Some(1));
        assert_eq!((names(&rest), next), (vec!["b/z".to_string()], None));
        let all = Address::parse("/api/v1/secrets").expect("a collection");
        let (every, _) = store.list(&all, &everything, None, None);
        assert_eq!(names(&every), ["a/x", "b/y", "b/z", "bb/w", "c/v"]);
    }
}
