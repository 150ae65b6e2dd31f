//! Field managers of server-side apply, as kube-apiserver keeps them in `managedFields`,
//! for what the controller's coexistence depends on:
//!
//! - an apply makes its manager own every field it sets (lists whole, as lists without
//!   merge keys); a field another manager owns with another value is a 409 Conflict,
//!   unless the apply is forced, which takes it over;
//! - a field a manager applied before and now leaves out is removed, unless another
//!   manager owns it too; fields set by other managers are kept;
//! - any other write with a `fieldManager` (a merge patch, an update, as an autoscaler
//!   scaling a Deployment) makes that manager own the fields it changed.
//!
//! Only objects, not their status subresource, are tracked.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::store::ApiError;

/// A field's path, e.g. `["spec", "replicas"]`.
type Field = Vec<String>;

/// Who owns which fields of which object (by the object's key).
#[derive(Default)]
pub struct Managers {
    owned: BTreeMap<String, BTreeMap<String, BTreeSet<Field>>>,
}

/// Fields the server owns, never a manager's.
fn is_server_field(field: &[String]) -> bool {
    matches!(
        field.first().map(String::as_str),
        Some("apiVersion" | "kind" | "status")
    ) || (field.first().map(String::as_str) == Some("metadata")
        && matches!(
            field.get(1).map(String::as_str),
            Some(
                "name"
                    | "namespace"
                    | "resourceVersion"
                    | "uid"
                    | "generation"
                    | "creationTimestamp"
                    | "managedFields"
            )
        ))
}

/// Every leaf field of `value` (objects are walked into, anything else is a leaf).
fn leaves(value: &Value) -> BTreeSet<Field> {
    fn walk(value: &Value, at: &mut Field, out: &mut BTreeSet<Field>) {
        match value {
            Value::Object(fields) if !fields.is_empty() => {
                for (key, child) in fields {
                    at.push(key.clone());
                    walk(child, at, out);
                    at.pop();
                }
            }
            _ => {
                if !is_server_field(at) && !at.is_empty() {
                    out.insert(at.clone());
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

fn at<'a>(value: &'a Value, field: &[String]) -> Option<&'a Value> {
    field.iter().try_fold(value, |v, key| v.get(key))
}

/// Sets `field` to `null` in `patch`, so a merge patch removes it.
fn set_null(patch: &mut Value, field: &[String]) {
    let mut target = patch;
    for key in &field[..field.len() - 1] {
        if !target.get(key).is_some_and(Value::is_object) {
            target[key.as_str()] = Value::Object(Map::new());
        }
        target = &mut target[key.as_str()];
    }
    if let Some(last) = field.last() {
        target[last.as_str()] = Value::Null;
    }
}

impl Managers {
    /// What an apply by `manager` of `applied` onto `live` writes, as a merge patch
    /// (the applied fields, and `null` for each field this manager gives up alone); or
    /// 409 when it would change a field another manager owns and is not forced.
    pub fn apply(
        &mut self,
        key: &str,
        manager: &str,
        force: bool,
        live: Option<&Value>,
        applied: &Value,
    ) -> Result<Value, ApiError> {
        let wanted = leaves(applied);
        let owners = self.owned.entry(key.to_string()).or_default();
        let live = live.cloned().unwrap_or(Value::Null);
        let mut conflicts = Vec::new();
        for field in &wanted {
            let differs = at(&live, field) != at(applied, field);
            for (other, fields) in owners.iter() {
                if other != manager && fields.contains(field) && differs {
                    conflicts.push(format!("{} (owned by {other:?})", field.join(".")));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!("Apply failed with conflicts: {}", conflicts.join(", ")),
            ));
        }
        let mut patch = applied.clone();
        let before = owners.remove(manager).unwrap_or_default();
        for field in before.difference(&wanted) {
            let shared = owners.values().any(|fields| fields.contains(field));
            if !shared && at(&live, field).is_some() {
                set_null(&mut patch, field);
            }
        }
        for (other, fields) in owners.iter_mut() {
            if other != manager {
                fields.retain(|field| {
                    !(wanted.contains(field) && at(&live, field) != at(applied, field))
                });
            }
        }
        owners.insert(manager.to_string(), wanted);
        Ok(patch)
    }

    /// Records that `manager` wrote `next` over `previous` by a write other than apply:
    /// it owns what changed.
    pub fn updated(&mut self, key: &str, manager: &str, previous: Option<&Value>, next: &Value) {
        let empty = Value::Null;
        let previous = previous.unwrap_or(&empty);
        let changed: BTreeSet<Field> = leaves(next)
            .into_iter()
            .filter(|field| at(previous, field) != at(next, field))
            .collect();
        if changed.is_empty() {
            return;
        }
        let owners = self.owned.entry(key.to_string()).or_default();
        for fields in owners.values_mut() {
            fields.retain(|field| !changed.contains(field));
        }
        owners
            .entry(manager.to_string())
            .or_default()
            .extend(changed);
    }

    /// The managers of `key`'s fields, e.g. for a test to assert who owns `replicas`.
    pub fn owners_of(&self, key: &str, field: &[&str]) -> Vec<String> {
        let field: Field = field.iter().map(|s| (*s).to_string()).collect();
        self.owned
            .get(key)
            .into_iter()
            .flatten()
            .filter(|(_, fields)| fields.contains(&field))
            .map(|(manager, _)| manager.clone())
            .collect()
    }

    /// Forgets a deleted object.
    pub fn forget(&mut self, key: &str) {
        self.owned.remove(key);
    }
}
