//! Server-side printing, as `kubectl get` asks for it (`Accept:
//! application/json;as=Table;v=v1;g=meta.k8s.io`): a `meta.k8s.io/v1` Table whose
//! columns are a CRD version's `additionalPrinterColumns` after Name (Name and Age when it
//! has none), or for a built-in kind what kube-apiserver's printer shows (Deployment,
//! Secret, Namespace, CustomResourceDefinition; Name and Age for the others). Each row
//! carries the object's metadata (`PartialObjectMetadata`), as with kube-apiserver's
//! default `includeObject=Metadata`.

use serde_json::{Value, json};

use super::discovery::Served;

pub fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// A Table of `objects` (one object for a GET of one, every item for a list).
pub fn of(served: Option<&Served>, objects: &[Value], resource_version: &str) -> Value {
    let columns = columns(served);
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let cells: Vec<Value> = columns.iter().map(|c| (c.cell)(object)).collect();
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"].clone()}})
        })
        .collect();
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.kind, "format": c.format,
                   "description": c.description, "priority": c.priority})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
           "metadata": {"resourceVersion": resource_version},
           "columnDefinitions": definitions, "rows": rows})
}

type Cell = Box<dyn Fn(&Value) -> Value>;

struct Column {
    name: String,
    kind: String,
    format: String,
    description: String,
    priority: i64,
    cell: Cell,
}

fn column(name: &str, kind: &str, description: &str, cell: Cell) -> Column {
    Column {
        name: name.into(),
        kind: kind.into(),
        format: if name == "Name" {
            "name".into()
        } else {
            String::new()
        },
        description: description.into(),
        priority: 0,
        cell,
    }
}

fn name() -> Column {
    column(
        "Name",
        "string",
        "Name must be unique within a namespace.",
        Box::new(|o| o["metadata"]["name"].clone()),
    )
}

fn age() -> Column {
    column(
        "Age",
        "string",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        Box::new(|o| json!(age_of(&o["metadata"]["creationTimestamp"]))),
    )
}

fn columns(served: Option<&Served>) -> Vec<Column> {
    let Some(served) = served else {
        return vec![name(), age()];
    };
    if served.schema.is_some() || !served.printer_columns.is_empty() {
        return custom_columns(served);
    }
    let int = |v: &Value| json!(v.as_i64().unwrap_or(0));
    match (served.group.as_str(), served.kind.as_str()) {
        ("apps", "Deployment") => vec![
            name(),
            column(
                "Ready",
                "string",
                "Number of the pod with ready state",
                Box::new(|o| {
                    let ready = o["status"]["readyReplicas"].as_i64().unwrap_or(0);
                    let wanted = o["spec"]["replicas"].as_i64().unwrap_or(1);
                    json!(format!("{ready}/{wanted}"))
                }),
            ),
            column(
                "Up-to-date",
                "integer",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                Box::new(move |o| int(&o["status"]["updatedReplicas"])),
            ),
            column(
                "Available",
                "integer",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                Box::new(move |o| int(&o["status"]["availableReplicas"])),
            ),
            age(),
        ],
        ("", "Secret") => vec![
            name(),
            column(
                "Type",
                "string",
                "The type of the secret",
                Box::new(|o| o["type"].clone()),
            ),
            column(
                "Data",
                "string",
                "The number of entries in the data field",
                Box::new(|o| json!(o["data"].as_object().map_or(0, |d| d.len()))),
            ),
            age(),
        ],
        ("", "Namespace") => vec![
            name(),
            column(
                "Status",
                "string",
                "The status of the namespace",
                Box::new(|o| o["status"]["phase"].clone()),
            ),
            age(),
        ],
        ("apiextensions.k8s.io", "CustomResourceDefinition") => vec![
            name(),
            column(
                "Created At",
                "date",
                "",
                Box::new(|o| o["metadata"]["creationTimestamp"].clone()),
            ),
        ],
        _ => vec![name(), age()],
    }
}

/// A CRD version's columns, as apiextensions-apiserver's table convertor makes them.
fn custom_columns(served: &Served) -> Vec<Column> {
    if served.printer_columns.is_empty() {
        return vec![name(), age()];
    }
    let mut columns = vec![name()];
    for definition in &served.printer_columns {
        let path = definition["jsonPath"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = definition["type"].as_str().unwrap_or("string").to_string();
        let cell_kind = kind.clone();
        columns.push(Column {
            name: definition["name"].as_str().unwrap_or_default().into(),
            kind: kind.clone(),
            format: definition["format"].as_str().unwrap_or_default().into(),
            description: definition["description"]
                .as_str()
                .unwrap_or_default()
                .into(),
            priority: definition["priority"].as_i64().unwrap_or(0),
            cell: Box::new(move |o| match json_path(o, &path).first() {
                None => Value::Null,
                Some(value) => cell(&cell_kind, value),
            }),
        });
    }
    columns
}

fn cell(kind: &str, value: &Value) -> Value {
    match (kind, value) {
        ("string", Value::String(_)) => value.clone(),
        ("string", other) => json!(other.to_string()),
        ("date", Value::String(_)) => json!(age_of(value)),
        ("integer", v) if v.is_i64() => value.clone(),
        ("number", v) if v.is_number() => value.clone(),
        ("boolean", Value::Bool(_)) => value.clone(),
        _ => Value::Null,
    }
}

/// The values a JSONPath of printer columns finds: `.a.b`, `.a[0]`, `.a[*].b` and
/// `.a[?(@.k=="v")].b`.
pub fn json_path(object: &Value, path: &str) -> Vec<Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut current = vec![object.clone()];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let key = &after[..end];
            current = current.iter().filter_map(|v| v.get(key).cloned()).collect();
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let Some(end) = after.find(']') else {
                return Vec::new();
            };
            let inside = &after[..end];
            rest = &after[end + 1..];
            let items: Vec<Value> = current
                .iter()
                .filter_map(Value::as_array)
                .flatten()
                .cloned()
                .collect();
            current = if inside == "*" {
                items
            } else if let Ok(i) = inside.parse::<usize>() {
                items.get(i).cloned().into_iter().collect()
            } else if let Some(filter) = inside
                .strip_prefix("?(@.")
                .and_then(|f| f.strip_suffix(')'))
            {
                let Some((field, wanted)) = filter.split_once("==") else {
                    return Vec::new();
                };
                let wanted = wanted.trim().trim_matches('"').trim_matches('\'');
                items
                    .into_iter()
                    .filter(|item| {
                        json_path(item, &format!(".{}", field.trim()))
                            .first()
                            .is_some_and(|v| {
                                v.as_str().map_or(v.to_string(), str::to_string) == wanted
                            })
                    })
                    .collect()
            } else {
                return Vec::new();
            };
        } else {
            return Vec::new();
        }
    }
    current
}

/// How long ago `timestamp` was, as kube-apiserver prints it (`HumanDuration`).
pub fn age_of(timestamp: &Value) -> String {
    let Some(text) = timestamp.as_str() else {
        return "<unknown>".into();
    };
    let Ok(then) = text.parse::<k8s_openapi::jiff::Timestamp>() else {
        return "<invalid>".into();
    };
    let seconds = k8s_openapi::jiff::Timestamp::now().as_second() - then.as_second();
    human_duration(seconds)
}

pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}
