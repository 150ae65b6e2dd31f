//! Strategic merge patch (`application/strategic-merge-patch+json`), as kube-apiserver
//! applies one to a built-in kind, reading each field's `x-kubernetes-patch-strategy`
//! and `x-kubernetes-patch-merge-key` from the kind's OpenAPI schema:
//!
//! - maps merge, `null` removes a field; `$patch: replace` replaces a map,
//!   `$patch: delete` removes it, `$retainKeys` keeps only the keys named;
//! - a list with strategy `merge` and a merge key merges element by element (an element
//!   `{key, $patch: delete}` removes one, `{$patch: replace}` replaces the list); one of
//!   primitives with strategy `merge` gains the patch's values, and
//!   `$deleteFromPrimitiveList/<field>` removes some; `$setElementOrder/<field>` orders
//!   the result; any other list is replaced whole.
//!
//! Custom resources refuse it (415), as kube-apiserver does.

use serde_json::{Map, Value};

use super::openapi::Definitions;

/// Applies `patch` to `original`, whose schema is `schema`.
pub fn apply(
    definitions: &Definitions,
    schema: &Value,
    original: &Value,
    patch: &Value,
) -> Result<Value, String> {
    let Value::Object(patch) = patch else {
        return Err("a strategic merge patch is an object".into());
    };
    let mut out = original.clone();
    merge_map(definitions, Some(schema), &mut out, patch)?;
    Ok(out)
}

fn property<'a>(
    definitions: &'a Definitions,
    schema: Option<&'a Value>,
    key: &str,
) -> Option<&'a Value> {
    let schema = definitions.resolve(schema?);
    schema["properties"]
        .get(key)
        .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
}

fn items<'a>(definitions: &'a Definitions, schema: Option<&'a Value>) -> Option<&'a Value> {
    let schema = definitions.resolve(schema?);
    schema.get("items")
}

/// `value` without patch directives, for where it replaces what was there.
fn clean(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(clean).collect()),
        other => other.clone(),
    }
}

fn merge_map(
    definitions: &Definitions,
    schema: Option<&Value>,
    target: &mut Value,
    patch: &Map<String, Value>,
) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = clean(&Value::Object(patch.clone()));
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type {other:?}")),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Some(retained) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retained.iter().filter_map(Value::as_str).collect();
        if let Some(fields) = target.as_object_mut() {
            fields.retain(|k, _| keep.contains(&k.as_str()));
        }
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let gone = value.as_array().cloned().unwrap_or_default();
            if let Some(list) = target.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|v| !gone.contains(v));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        let child_schema = property(definitions, schema, key);
        let fields = target.as_object_mut().expect("an object");
        if value.is_null() {
            fields.remove(key);
            continue;
        }
        let current = fields.remove(key).unwrap_or(Value::Null);
        let merged = match value {
            Value::Object(child) if current.is_object() || child.contains_key("$patch") => {
                let mut current = current;
                merge_map(definitions, child_schema, &mut current, child)?;
                current
            }
            Value::Object(_) => clean(value),
            Value::Array(list) => merge_list(definitions, child_schema, current, list)?,
            other => other.clone(),
        };
        if !merged.is_null() {
            fields.insert(key.clone(), merged);
        }
    }
    for (key, order) in patch {
        if let Some(field) = key.strip_prefix("$setElementOrder/") {
            let merge_key = definitions
                .resolve(property(definitions, schema, field).unwrap_or(&Value::Null))
                .get("x-kubernetes-patch-merge-key")
                .and_then(Value::as_str)
                .map(str::to_string);
            if let Some(list) = target.get_mut(field).and_then(Value::as_array_mut) {
                set_order(
                    list,
                    order.as_array().map_or(&[][..], Vec::as_slice),
                    merge_key.as_deref(),
                );
            }
        }
    }
    Ok(())
}

fn merge_list(
    definitions: &Definitions,
    schema: Option<&Value>,
    current: Value,
    patch: &[Value],
) -> Result<Value, String> {
    let resolved = schema.map(|s| definitions.resolve(s));
    let strategy = resolved
        .and_then(|s| s["x-kubernetes-patch-strategy"].as_str())
        .unwrap_or_default();
    if !strategy.split(',').any(|s| s == "merge") {
        return Ok(clean(&Value::Array(patch.to_vec())));
    }
    let merge_key = resolved.and_then(|s| s["x-kubernetes-patch-merge-key"].as_str());
    let mut list = current.as_array().cloned().unwrap_or_default();
    if patch.iter().any(|p| p["$patch"] == "replace") {
        return Ok(clean(&Value::Array(
            patch
                .iter()
                .filter(|p| p["$patch"] != "replace")
                .cloned()
                .collect(),
        )));
    }
    let item_schema = items(definitions, schema);
    for element in patch {
        match (element, merge_key) {
            (Value::Object(fields), Some(key)) => {
                let found = list.iter().position(|e| e[key] == fields[key]);
                if element["$patch"] == "delete" {
                    if let Some(i) = found {
                        list.remove(i);
                    }
                    continue;
                }
                match found {
                    Some(i) => merge_map(definitions, item_schema, &mut list[i], fields)?,
                    None => list.push(clean(element)),
                }
            }
            (Value::Object(_), None) => {
                return Err("a merge list of objects needs a merge key".into());
            }
            (primitive, _) => {
                if !list.contains(primitive) {
                    list.push(primitive.clone());
                }
            }
        }
    }
    Ok(Value::Array(list))
}

/// Orders `list` as `order` names its elements (by merge key, or by value); those it
/// does not name keep their places after them.
fn set_order(list: &mut [Value], order: &[Value], merge_key: Option<&str>) {
    let rank = |element: &Value| {
        order
            .iter()
            .position(|o| match merge_key {
                Some(key) => o[key] == element[key],
                None => o == element,
            })
            .unwrap_or(order.len())
    };
    list.sort_by_key(rank);
}
