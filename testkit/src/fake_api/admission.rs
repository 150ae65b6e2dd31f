//! What kube-apiserver fills in on a write, for the kinds whose clients read it back:
//!
//! - a Secret's `stringData` is merged into `data` (base64) and never stored; its `type`
//!   defaults to `Opaque`;
//! - a Namespace gets the label `kubernetes.io/metadata.name`, the `kubernetes`
//!   finalizer in its spec and `status.phase: Active`;
//! - a CustomResourceDefinition is accepted at once: `status.acceptedNames` are its
//!   names, its `NamesAccepted` and `Established` conditions are True and its storage
//!   version is in `status.storedVersions` (Helm waits for Established, and its resource
//!   is served from then on, see `discovery.rs`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::address::Address;

pub fn admit(address: &Address, previous: Option<&Value>, next: &mut Value) {
    match (address.prefix.as_str(), address.resource.as_str()) {
        ("/api/v1", "secrets") => secret(next),
        ("/api/v1", "namespaces") => namespace(address, next),
        ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions") => {
            crd(previous, next);
        }
        _ => {}
    }
}

fn secret(next: &mut Value) {
    if let Some(Value::Object(strings)) = next.as_object_mut().and_then(|o| o.remove("stringData"))
    {
        if !next["data"].is_object() {
            next["data"] = json!({});
        }
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default();
            next["data"][key] = json!(BASE64.encode(text));
        }
    }
    if next["type"].as_str().is_none_or(str::is_empty) {
        next["type"] = json!("Opaque");
    }
}

fn namespace(address: &Address, next: &mut Value) {
    let name = address.name.clone().unwrap_or_default();
    if !next["metadata"]["labels"].is_object() {
        next["metadata"]["labels"] = json!({});
    }
    next["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
    if next["spec"]["finalizers"].is_null() {
        next["spec"]["finalizers"] = json!(["kubernetes"]);
    }
    if next["status"]["phase"].is_null() {
        next["status"]["phase"] = json!("Active");
    }
}

fn crd(previous: Option<&Value>, next: &mut Value) {
    let names = next["spec"]["names"].clone();
    let mut accepted = names.clone();
    if accepted["singular"].is_null() {
        let kind = names["kind"].as_str().unwrap_or_default().to_lowercase();
        accepted["singular"] = json!(kind);
    }
    if accepted["listKind"].is_null() {
        let kind = names["kind"].as_str().unwrap_or_default();
        accepted["listKind"] = json!(format!("{kind}List"));
    }
    let storage: Vec<Value> = next["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == json!(true))
        .map(|v| v["name"].clone())
        .collect();
    let mut stored = previous
        .and_then(|p| p["status"]["storedVersions"].as_array().cloned())
        .unwrap_or_default();
    for version in storage {
        if !stored.contains(&version) {
            stored.push(version);
        }
    }
    // Conditions keep their transition time while they hold.
    let since = previous
        .and_then(|p| p["status"]["conditions"][0]["lastTransitionTime"].as_str())
        .map_or_else(now, str::to_string);
    let condition = |type_: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": "True", "lastTransitionTime": since,
               "reason": reason, "message": message})
    };
    next["status"] = json!({
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": accepted,
        "storedVersions": stored,
    });
}

/// Now, as the API server writes times (RFC 3339, seconds).
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
