//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! which client-go's typed clients send for built-in kinds: Helm's release storage
//! (Secrets) and `kubectl create namespace`. Decoded into the JSON the rest of this server
//! works on, for the kinds those clients write: Secret, ConfigMap and Namespace (their
//! metadata's name, generateName, namespace, uid, resourceVersion, labels, annotations
//! and finalizers; what the server owns is left out). Answers stay JSON, which those
//! clients accept too. Anything else is 415, as for an unknown media type.
//!
//! The encoding: the bytes `k8s\0`, then a `runtime.Unknown` message (1: TypeMeta
//! {1: apiVersion, 2: kind}, 2: the object's own message), each message the
//! generated.proto of k8s.io/api.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};

/// One field of a message: its number and its value (varint or bytes).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).ok_or("truncated varint")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint too long".into())
}

fn fields(bytes: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let key = varint(bytes, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((number, Field::Varint(varint(bytes, &mut at)?))),
            2 => {
                let len = usize::try_from(varint(bytes, &mut at)?).map_err(|e| e.to_string())?;
                let end = at
                    .checked_add(len)
                    .filter(|e| *e <= bytes.len())
                    .ok_or("truncated")?;
                out.push((number, Field::Bytes(&bytes[at..end])));
                at = end;
            }
            1 => at += 8,
            5 => at += 4,
            other => return Err(format!("wire type {other}")),
        }
    }
    Ok(out)
}

fn text(bytes: &[u8]) -> Value {
    json!(String::from_utf8_lossy(bytes))
}

/// A `map<string, …>` entry (1: key, 2: value).
fn entry(bytes: &[u8]) -> Result<(String, &[u8]), String> {
    let mut key = String::new();
    let mut value: &[u8] = &[];
    for (number, field) in fields(bytes)? {
        match (number, field) {
            (1, Field::Bytes(b)) => key = String::from_utf8_lossy(b).into_owned(),
            (2, Field::Bytes(b)) => value = b,
            _ => {}
        }
    }
    Ok((key, value))
}

fn object_meta(bytes: &[u8]) -> Result<Value, String> {
    let mut meta = Map::new();
    for (number, field) in fields(bytes)? {
        // Generated marshalling writes empty strings too; they mean "not set".
        let Field::Bytes(b) = field else { continue };
        if b.is_empty() {
            continue;
        }
        match number {
            1 => drop(meta.insert("name".into(), text(b))),
            2 => drop(meta.insert("generateName".into(), text(b))),
            3 => drop(meta.insert("namespace".into(), text(b))),
            5 => drop(meta.insert("uid".into(), text(b))),
            6 => drop(meta.insert("resourceVersion".into(), text(b))),
            11 | 12 => {
                let name = if number == 11 {
                    "labels"
                } else {
                    "annotations"
                };
                let (key, value) = entry(b)?;
                let map = meta.entry(name).or_insert_with(|| json!({}));
                map[key] = text(value);
            }
            14 => {
                let list = meta.entry("finalizers").or_insert_with(|| json!([]));
                if let Some(list) = list.as_array_mut() {
                    list.push(text(b));
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(meta))
}

/// The JSON of a protobuf-encoded body.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let envelope = body.strip_prefix(b"k8s\0").ok_or("no k8s protobuf magic")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (number, field) in fields(envelope)? {
        match (number, field) {
            (1, Field::Bytes(type_meta)) => {
                for (n, f) in fields(type_meta)? {
                    if let Field::Bytes(b) = f {
                        let s = String::from_utf8_lossy(b).into_owned();
                        if n == 1 {
                            api_version = s;
                        } else if n == 2 {
                            kind = s;
                        }
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let mut object = json!({"apiVersion": api_version, "kind": kind});
    for (number, field) in fields(raw)? {
        match (api_version.as_str(), kind.as_str(), number, field) {
            (_, _, 1, Field::Bytes(b)) => object["metadata"] = object_meta(b)?,
            ("v1", "Secret", 2, Field::Bytes(b)) => {
                let (key, value) = entry(b)?;
                object["data"][key] = json!(BASE64.encode(value));
            }
            ("v1", "Secret", 3, Field::Bytes(b)) => object["type"] = text(b),
            ("v1", "Secret", 4, Field::Bytes(b)) => {
                let (key, value) = entry(b)?;
                object["stringData"][key] = text(value);
            }
            ("v1", "Secret", 5, Field::Varint(v)) | ("v1", "ConfigMap", 4, Field::Varint(v)) => {
                object["immutable"] = json!(v != 0);
            }
            ("v1", "ConfigMap", 2, Field::Bytes(b)) => {
                let (key, value) = entry(b)?;
                object["data"][key] = text(value);
            }
            ("v1", "ConfigMap", 3, Field::Bytes(b)) => {
                let (key, value) = entry(b)?;
                object["binaryData"][key] = json!(BASE64.encode(value));
            }
            ("v1", "Namespace", 2, Field::Bytes(spec)) => {
                for (n, f) in fields(spec)? {
                    if let (1, Field::Bytes(b)) = (n, f) {
                        if !object["spec"]["finalizers"].is_array() {
                            object["spec"]["finalizers"] = json!([]);
                        }
                        if let Some(list) = object["spec"]["finalizers"].as_array_mut() {
                            list.push(text(b));
                        }
                    }
                }
            }
            ("v1", "Secret" | "ConfigMap" | "Namespace", _, _) => {}
            _ => {
                return Err(format!(
                    "{api_version} {kind} in protobuf is not decoded here"
                ));
            }
        }
    }
    Ok(object)
}
