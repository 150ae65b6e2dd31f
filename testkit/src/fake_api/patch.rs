//! The patch formats the controller sends: JSON merge patch (RFC 7386), JSON patch (RFC
//! 6902: test, add, remove, replace) and server-side apply, which is modelled as a merge
//! of the applied configuration (fields another manager set are kept; lists are replaced
//! whole, as for lists without merge keys).

use serde_json::Value;

/// RFC 7386 JSON merge patch: objects merge, `null` removes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// Applies RFC 6902 operations in order; the first that fails fails them all.
pub fn json_patch(object: &mut Value, ops: &Value) -> Result<(), String> {
    let mut patched = object.clone();
    for op in ops.as_array().ok_or("a JSON patch is a list")? {
        let path = op["path"].as_str().ok_or("an op needs a path")?;
        match op["op"].as_str() {
            Some("test") => {
                let found = patched.pointer(path).cloned().unwrap_or(Value::Null);
                if found != op["value"] {
                    return Err(format!("test of {path} failed: {found} != {}", op["value"]));
                }
            }
            Some("add") => add(&mut patched, path, op["value"].clone())?,
            Some("remove") => {
                remove(&mut patched, path)?;
            }
            Some("replace") => {
                remove(&mut patched, path)?;
                add(&mut patched, path, op["value"].clone())?;
            }
            other => return Err(format!("unsupported op {other:?}")),
        }
    }
    *object = patched;
    Ok(())
}

fn add(object: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let (parent, last) = path.rsplit_once('/').ok_or("bad path")?;
    let target = object.pointer_mut(parent).ok_or(format!("no {parent}"))?;
    match target {
        Value::Array(items) if last == "-" => items.push(value),
        Value::Array(items) => {
            let i: usize = last.parse().map_err(|_| "bad index")?;
            if i > items.len() {
                return Err(format!("no index {i} in {parent}"));
            }
            items.insert(i, value);
        }
        Value::Object(fields) => {
            fields.insert(unescape(last), value);
        }
        _ => return Err(format!("cannot add to {parent}")),
    }
    Ok(())
}

fn remove(object: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = path.rsplit_once('/').ok_or("bad path")?;
    let target = object.pointer_mut(parent).ok_or(format!("no {parent}"))?;
    match target {
        Value::Array(items) => {
            let i: usize = last.parse().map_err(|_| "bad index")?;
            if i >= items.len() {
                return Err(format!("no {path}"));
            }
            Ok(items.remove(i))
        }
        Value::Object(fields) => fields.remove(&unescape(last)).ok_or(format!("no {path}")),
        _ => Err(format!("cannot remove from {parent}")),
    }
}

/// RFC 6901: `~1` is `/`, `~0` is `~`.
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}
