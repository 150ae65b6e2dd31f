//! One store of events, two APIs, as in kube-apiserver: `events.k8s.io/v1` (what the
//! operator writes) and core `v1` (what `kubectl describe` reads) are views of the same
//! objects, with fields renamed between them (`regarding` is `involvedObject`, `note`
//! is `message`, `reportingController` is `reportingComponent`, `deprecated*` are the
//! core fields without the prefix). They are stored as `events.k8s.io/v1`.

use serde_json::{Map, Value, json};

/// (events.k8s.io/v1 field, core v1 field)
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

pub const CORE_PREFIX: &str = "/api/v1";
pub const STORED_PREFIX: &str = "/apis/events.k8s.io/v1";

fn renamed(object: &Value, api_version: &str, from_core: bool) -> Value {
    let Some(fields) = object.as_object() else {
        return object.clone();
    };
    let mut out = Map::new();
    for (key, value) in fields {
        let key = RENAMED
            .iter()
            .find_map(|(new, core)| match from_core {
                true if key == core => Some(*new),
                false if key == new => Some(*core),
                _ => None,
            })
            .unwrap_or(key.as_str());
        out.insert(key.to_string(), value.clone());
    }
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}

/// A stored event as core `v1` shows it.
pub fn to_core(event: &Value) -> Value {
    renamed(event, "v1", false)
}

/// A core field selector's field as the stored event names it.
pub fn stored_field(core_field: &str) -> String {
    let (head, rest) = core_field
        .split_once('.')
        .map_or((core_field, None), |(h, r)| (h, Some(r)));
    let head = RENAMED
        .iter()
        .find(|(_, core)| *core == head)
        .map_or(head, |(new, _)| *new);
    match rest {
        Some(rest) => format!("{head}.{rest}"),
        None => head.to_string(),
    }
}

/// A core `v1` event as it is stored.
pub fn from_core(event: &Value) -> Value {
    if !event.is_object() {
        return event.clone();
    }
    renamed(event, "events.k8s.io/v1", true)
}
