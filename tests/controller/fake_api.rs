//! A small in-memory Kubernetes API server behind `kube::Client`, through tower-test's
//! mock service: it keeps objects by path, answers GET, POST, PUT, PATCH (apply, merge
//! and JSON patch) and DELETE as the real one does for what the controller uses, and
//! records every request so a test can assert what was written.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One request the controller made.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    requests: Vec<Recorded>,
    version: u64,
}

/// The fake server's state, shared with the task that answers the client.
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A client whose requests this fake answers.
    pub fn client(&self) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let fake = self.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                if is_watch(&parts) {
                    tokio::spawn(async move {
                        tokio::time::sleep(WATCH_LASTS).await;
                        respond.send_response(Response::new(Body::from(Vec::new())));
                    });
                    continue;
                }
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let (status, reply) = fake.answer(&parts, &bytes);
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap();
                respond.send_response(response);
            }
        });
        Client::new(service, "default")
    }

    /// Serves this fake over HTTP on a free port of 127.0.0.1, for a controller process
    /// to use through a kubeconfig; returns the server's URL.
    pub async fn serve(&self) -> String {
        let fake = self.clone();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let fake = fake.clone();
            async move {
                let (parts, body) = request.into_parts();
                if is_watch(&parts) {
                    tokio::time::sleep(WATCH_LASTS).await;
                    return Response::new(axum::body::Body::empty());
                }
                let bytes = axum::body::to_bytes(body, 16 << 20)
                    .await
                    .unwrap_or_default();
                let (status, reply) = fake.answer(&parts, &bytes);
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{address}")
    }

    /// Stores `object` at `path` (e.g. `/api/v1/namespaces/prod/secrets/conn`).
    pub fn put(&self, path: &str, mut object: Value) {
        let mut state = self.state.lock().unwrap();
        state.version += 1;
        object["metadata"]["resourceVersion"] = json!(state.version.to_string());
        state.objects.insert(path.to_string(), object);
    }

    /// Removes the object at `path`, as if someone deleted it.
    pub fn remove(&self, path: &str) {
        self.state.lock().unwrap().objects.remove(path);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    /// Every request since the last call.
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
    }

    fn answer(&self, parts: &http::request::Parts, bytes: &[u8]) -> (StatusCode, Value) {
        let method = parts.method.as_str().to_string();
        let path = parts.uri.path().to_string();
        let content_type = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let mut state = self.state.lock().unwrap();
        state.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: content_type.clone(),
            body: body.clone(),
        });
        let key = path.strip_suffix("/status").unwrap_or(&path).to_string();
        state.version += 1;
        let version = state.version.to_string();
        match method.as_str() {
            "GET" => match state.objects.get(&key) {
                Some(object) => (StatusCode::OK, object.clone()),
                None => {
                    // A list: the objects one path segment below (selectors are ignored).
                    let prefix = format!("{key}/");
                    let items: Vec<Value> = state
                        .objects
                        .iter()
                        .filter(|(k, _)| {
                            k.strip_prefix(&prefix)
                                .is_some_and(|rest| !rest.contains('/'))
                        })
                        .map(|(_, v)| v.clone())
                        .collect();
                    if items.is_empty() && !is_collection(&key) {
                        not_found(&key)
                    } else {
                        (
                            StatusCode::OK,
                            json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items}),
                        )
                    }
                }
            },
            "POST" => {
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or("unnamed")
                    .to_string();
                let key = format!("{key}/{name}");
                if state.objects.contains_key(&key) {
                    return status(StatusCode::CONFLICT, "AlreadyExists", &key);
                }
                let mut object = body;
                object["metadata"]["resourceVersion"] = json!(version);
                state.objects.insert(key, object.clone());
                (StatusCode::CREATED, object)
            }
            "PUT" => {
                let stored = state
                    .objects
                    .get(&key)
                    .map(|o| o["metadata"]["resourceVersion"].clone());
                match stored {
                    None => not_found(&key),
                    Some(current) if current != body["metadata"]["resourceVersion"] => {
                        status(StatusCode::CONFLICT, "Conflict", &key)
                    }
                    Some(_) => {
                        let mut object = body;
                        object["metadata"]["resourceVersion"] = json!(version);
                        state.objects.insert(key, object.clone());
                        (StatusCode::OK, object)
                    }
                }
            }
            "PATCH" => {
                let existing = state.objects.get(&key).cloned();
                let patched = if content_type.starts_with("application/apply-patch") {
                    // Server-side apply: the applied fields win; the status stays.
                    let mut object = existing.clone().unwrap_or(json!({}));
                    merge(&mut object, &body);
                    Some(object)
                } else if content_type.starts_with("application/merge-patch") {
                    existing.map(|mut object| {
                        merge(&mut object, &body);
                        object
                    })
                } else if content_type.starts_with("application/json-patch") {
                    match existing {
                        Some(mut object) => match json_patch(&mut object, &body) {
                            Ok(()) => Some(object),
                            Err(why) => {
                                return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &why);
                            }
                        },
                        None => None,
                    }
                } else {
                    return status(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "BadRequest",
                        &content_type,
                    );
                };
                match patched {
                    Some(mut object) => {
                        object["metadata"]["resourceVersion"] = json!(version);
                        state.objects.insert(key, object.clone());
                        (StatusCode::OK, object)
                    }
                    None => not_found(&key),
                }
            }
            "DELETE" => match state.objects.remove(&key) {
                Some(object) => (StatusCode::OK, object),
                None => not_found(&key),
            },
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", &method),
        }
    }
}

/// Whether `path` names a collection: its last segment is a plural resource name.
fn is_collection(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or_default();
    [
        "mailerpipelines",
        "deployments",
        "secrets",
        "leases",
        "events",
    ]
    .contains(&last)
}

/// How long a watch lasts: it reports nothing and ends, and the watcher watches again;
/// the delay keeps that from spinning.
const WATCH_LASTS: std::time::Duration = std::time::Duration::from_millis(300);

fn is_watch(parts: &http::request::Parts) -> bool {
    parts.uri.query().unwrap_or_default().contains("watch=true")
}

fn not_found(key: &str) -> (StatusCode, Value) {
    status(StatusCode::NOT_FOUND, "NotFound", key)
}

fn status(code: StatusCode, reason: &str, message: &str) -> (StatusCode, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": reason, "message": message, "code": code.as_u16()}),
    )
}

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

/// The JSON patch operations kube-runtime's finalizer helper sends: test, add, remove.
fn json_patch(object: &mut Value, ops: &Value) -> Result<(), String> {
    for op in ops.as_array().ok_or("a JSON patch is a list")? {
        let path = op["path"].as_str().ok_or("an op needs a path")?;
        let (parent, last) = path.rsplit_once('/').ok_or("bad path")?;
        match op["op"].as_str() {
            Some("test") => {
                let found = object.pointer(path).cloned().unwrap_or(Value::Null);
                if found != op["value"] {
                    return Err(format!("test of {path} failed: {found} != {}", op["value"]));
                }
            }
            Some("add") => {
                let target = object.pointer_mut(parent).ok_or(format!("no {parent}"))?;
                match target {
                    Value::Array(items) if last == "-" => items.push(op["value"].clone()),
                    Value::Array(items) => {
                        let i: usize = last.parse().map_err(|_| "bad index")?;
                        items.insert(i, op["value"].clone());
                    }
                    Value::Object(fields) => {
                        fields.insert(last.to_string(), op["value"].clone());
                    }
                    _ => return Err(format!("cannot add to {parent}")),
                }
            }
            Some("remove") => {
                let target = object.pointer_mut(parent).ok_or(format!("no {parent}"))?;
                match target {
                    Value::Array(items) => {
                        let i: usize = last.parse().map_err(|_| "bad index")?;
                        if i >= items.len() {
                            return Err(format!("no {path}"));
                        }
                        items.remove(i);
                    }
                    Value::Object(fields) => {
                        fields.remove(last).ok_or(format!("no {path}"))?;
                    }
                    _ => return Err(format!("cannot remove from {parent}")),
                }
            }
            other => return Err(format!("unsupported op {other:?}")),
        }
    }
    Ok(())
}
