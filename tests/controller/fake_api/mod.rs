//! An in-memory Kubernetes API server that behaves like kube-apiserver where the
//! controller's logic depends on it, behind `kube::Client` in the test process or served
//! over HTTP for a controller process (`serve`):
//!
//! - objects by path, with `resourceVersion`, `uid`, `creationTimestamp` and, for
//!   resources with a status subresource, `generation` (bumped by spec changes only);
//!   a write that changes nothing is no write;
//! - the `status` subresource apart from the object (`store.rs`);
//! - a stale `resourceVersion` on PUT or PATCH gets 409 Conflict;
//! - DELETE of an object with finalizers sets `deletionTimestamp`; it goes when the last
//!   finalizer is removed, and what it owns (owner references) goes with it;
//! - GET, POST, PUT, PATCH (merge, JSON patch, server-side apply) and DELETE;
//! - lists with label selectors and `limit`/`continue` pages, and metadata-only lists
//!   and watches (`Accept: …;as=PartialObjectMetadataList` / `PartialObjectMetadata`);
//! - watches streamed from a resourceVersion as things happen (`watch.rs`), so a
//!   controller sees its own writes come back;
//! - every request recorded, so a test can count and inspect writes.
//!
//! Each concern is a file of its own, so tests can add one (e.g. a fault) beside them.

pub mod address;
pub mod faults;
pub mod managers;
pub mod patch;
pub mod selector;
pub mod store;
pub mod watch;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::StatusCode;
use kube::Client;
use serde_json::{Value, json};

pub use address::Address;
pub use patch::merge;
pub use store::{ApiError, EventType, PatchKind, Store};

use address::Query;
use managers::Managers;
use selector::Selector;

/// One request the controller made.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub accept: String,
    /// The bearer token it came with: which client (e.g. which replica) sent it.
    pub token: String,
    pub body: Value,
    /// When the request arrived.
    pub at: std::time::Instant,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }

    pub fn is_watch(&self) -> bool {
        self.method == "GET" && Query::parse(&self.query).get("watch") == Some("true")
    }
}

struct State {
    store: Store,
    requests: Vec<Recorded>,
}

struct Shared {
    state: Mutex<State>,
    /// Who owns which fields, for server-side apply (`managers.rs`).
    managers: Mutex<Managers>,
    /// The newest resourceVersion, for watches to wait on.
    changed: tokio::sync::watch::Sender<u64>,
    faults: faults::Faults,
}

/// The fake server's state, shared with whatever answers the clients.
#[derive(Clone)]
pub struct FakeApi {
    shared: Arc<Shared>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    store: Store::default(),
                    requests: Vec::new(),
                }),
                managers: Mutex::new(Managers::default()),
                changed: tokio::sync::watch::channel(0).0,
                faults: faults::Faults::default(),
            }),
        }
    }
}

/// How long a watch lasts when the client names no `timeoutSeconds`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

impl FakeApi {
    /// A client whose requests this fake answers, in this process.
    pub fn client(&self) -> Client {
        Client::new(self.router(), "default")
    }

    /// Serves this fake over HTTP on a free port of 127.0.0.1, for a controller process
    /// to use through a kubeconfig; returns the server's URL.
    pub async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = self.router();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{address}")
    }

    fn router(&self) -> axum::Router {
        let fake = self.clone();
        axum::Router::new().fallback(move |request: Request| {
            let fake = fake.clone();
            async move { Ok::<_, Infallible>(fake.handle(request).await) }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the store; wakes the watches when it wrote.
    pub fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let (result, version) = {
            let mut state = self.lock();
            let result = f(&mut state.store);
            (result, state.store.version)
        };
        self.shared.changed.send_if_modified(|seen| {
            let newer = version > *seen;
            *seen = version;
            newer
        });
        result
    }

    fn faults(&self) -> &faults::Faults {
        &self.shared.faults
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// Stores `object` at `path` (e.g. `/api/v1/namespaces/prod/secrets/conn`) as an
    /// administrator would, status included; watches see it.
    pub fn put(&self, path: &str, object: Value) {
        let address = Address::parse(path).unwrap_or_else(|| panic!("not an object path: {path}"));
        self.with_store(|store| store.put(&address, object));
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.lock().store.get(path).cloned()
    }

    /// Deletes the object at `path` as `kubectl delete` would: with finalizers it is
    /// only marked (`deletionTimestamp`).
    pub fn delete(&self, path: &str) -> Result<Value, ApiError> {
        let address = Address::parse(path).unwrap_or_else(|| panic!("not an object path: {path}"));
        self.with_store(|store| store.delete(&address))
    }

    /// Makes a resource served (its CRD installed), e.g.
    /// `install("/apis/rabbitmq.com/v1beta1", "rabbitmqclusters")`.
    pub fn install(&self, prefix: &str, resource: &str) {
        self.with_store(|store| store.install(prefix, resource));
    }

    /// Forgets the history, so watches from an older resourceVersion get 410 Gone.
    pub fn compact(&self) {
        self.with_store(Store::compact);
    }

    /// Every request since the last call.
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.lock().requests)
    }

    async fn handle(&self, request: Request) -> Response {
        let (parts, body) = request.into_parts();
        let bytes = axum::body::to_bytes(body, 64 << 20)
            .await
            .unwrap_or_default();
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let recorded = Recorded {
            method: parts.method.as_str().to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: header("content-type"),
            accept: header("accept"),
            token: header("authorization")
                .trim_start_matches("Bearer ")
                .to_string(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            at: std::time::Instant::now(),
        };
        self.lock().requests.push(recorded.clone());
        self.wait_while_stalled(&recorded.path).await;
        self.wait_if_slow(&recorded.path).await;
        if self.write_fails(&recorded.method, &recorded.path) {
            let e = ApiError::new(500, "InternalError", "injected failure");
            return json_response(e.code, &status(&e));
        }
        match self.answer(&recorded) {
            Ok(Answer::Object(code, object)) => json_response(code, &object),
            Ok(Answer::Watch(request)) => Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Body::from_stream(watch::stream(self.clone(), request)))
                .unwrap_or_default(),
            Err(e) => json_response(e.code, &status(&e)),
        }
    }

    fn answer(&self, request: &Recorded) -> Result<Answer, ApiError> {
        let Some(address) = Address::parse(&request.path) else {
            return self.discovery(&request.path);
        };
        let query = Query::parse(&request.query);
        let metadata_only = request.accept.contains("as=PartialObjectMetadata");
        let served = self.with_store(|s| s.serves(&address.prefix, &address.resource));
        if !served {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        let body = request.body.clone();
        match (request.method.as_str(), &address.name) {
            ("GET", None) => {
                let selector = Selector::parse(query.get("labelSelector").unwrap_or_default())
                    .map_err(|why| ApiError::new(400, "BadRequest", why))?;
                if matches!(query.get("watch"), Some("true" | "1")) {
                    let since = query
                        .get("resourceVersion")
                        .filter(|v| !v.is_empty() && *v != "0")
                        .map(|v| v.parse().map_err(|_| ApiError::new(400, "BadRequest", v)))
                        .transpose()?;
                    let timeout = query
                        .get("timeoutSeconds")
                        .and_then(|t| t.parse().ok())
                        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
                    return Ok(Answer::Watch(watch::WatchRequest {
                        collection: address,
                        selector,
                        since,
                        metadata_only,
                        timeout,
                    }));
                }
                let limit = query
                    .get("limit")
                    .and_then(|l| l.parse().ok())
                    .filter(|l| *l > 0);
                let (items, next, version) = self.with_store(|s| {
                    let (items, next) = s.list(&address, &selector, query.get("continue"), limit);
                    (items, next, s.version)
                });
                let items: Vec<Value> = if metadata_only {
                    items.iter().map(watch::metadata_of).collect()
                } else {
                    items
                };
                let kind = if metadata_only {
                    "PartialObjectMetadataList"
                } else {
                    "List"
                };
                let api_version = if metadata_only {
                    "meta.k8s.io/v1"
                } else {
                    "v1"
                };
                let mut metadata = json!({"resourceVersion": version.to_string()});
                if let Some(next) = next {
                    metadata["continue"] = json!(next);
                }
                Ok(Answer::Object(
                    200,
                    json!({"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items}),
                ))
            }
            ("GET", Some(_)) => {
                let object = self
                    .get(&address.key())
                    .ok_or_else(|| ApiError::not_found(&address.key()))?;
                Ok(Answer::Object(
                    200,
                    if metadata_only {
                        watch::metadata_of(&object)
                    } else {
                        object
                    },
                ))
            }
            ("POST", None) => self
                .with_store(|s| s.create(&address, body))
                .map(|o| Answer::Object(201, o)),
            ("PUT", Some(_)) => {
                let previous = self.get(&address.key());
                let written = self.with_store(|s| s.replace(&address, body))?;
                self.owned_by_writer(&address, &query, previous.as_ref(), &written);
                Ok(Answer::Object(200, written))
            }
            ("PATCH", Some(_)) => {
                let kind = patch_kind(&request.content_type).ok_or_else(|| {
                    ApiError::new(415, "UnsupportedMediaType", request.content_type.clone())
                })?;
                let previous = self.get(&address.key());
                let body = match (kind, query.get("fieldManager")) {
                    (PatchKind::Apply, Some(manager)) if address.subresource.is_none() => {
                        let force = query.get("force") == Some("true");
                        self.managers().apply(
                            &address.key(),
                            manager,
                            force,
                            previous.as_ref(),
                            &body,
                        )?
                    }
                    _ => body,
                };
                let written = self.with_store(|s| s.patch(&address, kind, body))?;
                if kind != PatchKind::Apply {
                    self.owned_by_writer(&address, &query, previous.as_ref(), &written);
                }
                Ok(Answer::Object(200, written))
            }
            ("DELETE", Some(_)) => {
                let deleted = self.with_store(|s| s.delete(&address))?;
                if self.get(&address.key()).is_none() {
                    self.managers().forget(&address.key());
                }
                Ok(Answer::Object(200, deleted))
            }
            (method, _) => Err(ApiError::new(405, "MethodNotAllowed", method.to_string())),
        }
    }

    fn managers(&self) -> std::sync::MutexGuard<'_, Managers> {
        self.shared
            .managers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Who owns which field of the object at `path`, e.g. `["spec", "replicas"]`.
    pub fn field_owners(&self, path: &str, field: &[&str]) -> Vec<String> {
        self.managers().owners_of(path, field)
    }

    /// A write other than an apply, by the `fieldManager` it names: that manager owns
    /// what it changed.
    fn owned_by_writer(
        &self,
        address: &Address,
        query: &Query,
        previous: Option<&Value>,
        written: &Value,
    ) {
        if let (None, Some(manager)) = (&address.subresource, query.get("fieldManager")) {
            self.managers()
                .updated(&address.key(), manager, previous, written);
        }
    }

    /// `GET /apis/<group>/<version>`: the resources served there.
    fn discovery(&self, path: &str) -> Result<Answer, ApiError> {
        let prefix = path.trim_end_matches('/');
        let resources = self.with_store(|s| s.resources_under(prefix));
        if resources.is_empty() {
            return Err(ApiError::not_found(path));
        }
        let group_version = prefix
            .trim_start_matches("/apis/")
            .trim_start_matches("/api/");
        let resources: Vec<Value> = resources
            .iter()
            .map(|r| json!({"name": r, "namespaced": true, "kind": "", "verbs": ["get", "list", "watch"]}))
            .collect();
        Ok(Answer::Object(
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
        ))
    }
}

enum Answer {
    Object(u16, Value),
    Watch(watch::WatchRequest),
}

fn patch_kind(content_type: &str) -> Option<PatchKind> {
    if content_type.starts_with("application/apply-patch") {
        Some(PatchKind::Apply)
    } else if content_type.starts_with("application/merge-patch") {
        Some(PatchKind::Merge)
    } else if content_type.starts_with("application/json-patch") {
        Some(PatchKind::Json)
    } else {
        None
    }
}

fn status(e: &ApiError) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "reason": e.reason, "message": e.message, "code": e.code})
}

fn json_response(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .unwrap_or_default()
}
