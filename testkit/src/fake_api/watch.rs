//! Watches as kube-apiserver streams them: one JSON event per line, `ADDED`,
//! `MODIFIED` and `DELETED` from the requested resourceVersion on (from the current
//! objects when none or "0" is given), as they happen, until `timeoutSeconds`; a
//! compacted resourceVersion gets an `ERROR` event with 410 Gone. With
//! `sendInitialEvents=true` (client-go's watch-list, as kubectl wait uses it) the current
//! objects come first, then a BOOKMARK that marks their end.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::FakeApi;
use super::address::Address;
use super::selector::Selector;
use super::store::EventType;

/// What one watch request asked for.
pub struct WatchRequest {
    pub collection: Address,
    pub selector: Selector,
    /// `None` (or "0"): start with the current objects.
    pub since: Option<u64>,
    /// `Accept: …;as=PartialObjectMetadata`: objects reduced to their metadata.
    pub metadata_only: bool,
    /// Events stored as events.k8s.io/v1, shown as core v1 (`events.rs`).
    pub core_events: bool,
    /// `sendInitialEvents=true` (client-go's watch-list): the current objects, then a
    /// BOOKMARK of this (apiVersion, kind) marking the end of them
    /// (`k8s.io/initial-events-end`).
    pub initial_events_end: Option<(String, String)>,
    pub timeout: Duration,
}

struct Watching {
    fake: FakeApi,
    request: WatchRequest,
    since: u64,
    deadline: Instant,
    changed: tokio::sync::watch::Receiver<u64>,
    lines: VecDeque<Bytes>,
    gone: bool,
}

/// The body of a watch response.
pub fn stream(
    fake: FakeApi,
    request: WatchRequest,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let mut changed = fake.changes();
    changed.borrow_and_update();
    let mut lines = VecDeque::new();
    let (since, gone) = fake.with_store(|store| match request.since {
        Some(since) if since < store.compacted => (since, true),
        Some(since) => (since, false),
        None => {
            for object in store.snapshot(&request.collection, &request.selector) {
                lines.push_back(line(EventType::Added, object, &request));
            }
            if let Some((api_version, kind)) = &request.initial_events_end {
                lines.push_back(to_line(&json!({"type": "BOOKMARK", "object": {
                    "apiVersion": api_version, "kind": kind,
                    "metadata": {"resourceVersion": store.version.to_string(),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}})));
            }
            (store.version, false)
        }
    });
    if gone {
        let status = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
            "message": format!("too old resource version: {since}")}});
        lines.push_back(to_line(&status));
    }
    let watching = Watching {
        deadline: Instant::now() + request.timeout,
        fake,
        request,
        since,
        changed,
        lines,
        gone,
    };
    futures::stream::unfold(watching, |mut w| async move {
        loop {
            if let Some(line) = w.lines.pop_front() {
                return Some((Ok(line), w));
            }
            if w.gone {
                return None;
            }
            w.changed.borrow_and_update();
            let (events, version) = w.fake.with_store(|store| {
                let events =
                    store.events_since(&w.request.collection, &w.request.selector, w.since);
                (events, store.version)
            });
            w.since = version;
            for (kind, object) in events {
                w.lines.push_back(line(kind, object, &w.request));
            }
            if !w.lines.is_empty() {
                continue;
            }
            tokio::select! {
                changed = w.changed.changed() => if changed.is_err() { return None },
                () = tokio::time::sleep_until(w.deadline) => return None,
            }
        }
    })
}

fn line(kind: EventType, object: Value, request: &WatchRequest) -> Bytes {
    let object = if request.core_events {
        super::events::to_core(&object)
    } else {
        object
    };
    let object = if request.metadata_only {
        metadata_of(&object)
    } else {
        object
    };
    to_line(&json!({"type": kind.as_str(), "object": object}))
}

fn to_line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// An object as `PartialObjectMetadata`: its metadata only.
pub fn metadata_of(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": object["metadata"].clone()})
}
