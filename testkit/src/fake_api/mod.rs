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
//! For the clients people use (kubectl, Helm), `FakeApi::cluster` is a new cluster:
//! only the built-in kinds and what stored CRDs define are served, and namespaces must
//! exist; it answers discovery and `/version` (`discovery.rs`), the OpenAPI v2 and v3
//! documents (`openapi.rs`), Tables for `kubectl get` (`table.rs`), field selectors,
//! core `v1` events as a view of `events.k8s.io/v1` ones (`events.rs`), strategic merge
//! patches (`strategic.rs`), protobuf bodies of typed clients (`protobuf.rs`), and
//! fills in what kube-apiserver does on writes
//! (`admission.rs`).
//!
//! Each concern is a file of its own, so tests can add one (e.g. a fault) beside them.

pub mod address;
pub mod admission;
pub mod discovery;
pub mod events;
pub mod faults;
pub mod managers;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod selector;
pub mod store;
pub mod strategic;
pub mod table;
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
    /// The built-in kinds' OpenAPI definitions, for `/openapi/*` and strategic merge
    /// patches (`openapi.rs`); without them those answer 404 and 415.
    definitions: Option<Arc<openapi::Definitions>>,
}

/// The fake server's state, shared with whatever answers the clients.
#[derive(Clone)]
pub struct FakeApi {
    shared: Arc<Shared>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self::with(Store::default(), None)
    }
}

/// How long a watch lasts when the client names no `timeoutSeconds`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

impl FakeApi {
    fn with(store: Store, definitions: Option<openapi::Definitions>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    store,
                    requests: Vec::new(),
                }),
                managers: Mutex::new(Managers::default()),
                changed: tokio::sync::watch::channel(0).0,
                faults: faults::Faults::default(),
                definitions: definitions.map(Arc::new),
            }),
        }
    }

    /// A new cluster (see the module's doc): nothing but the built-in kinds served, no
    /// namespace, no CRD; `definitions` are the built-in kinds' OpenAPI schemas.
    pub fn cluster(definitions: Option<openapi::Definitions>) -> Self {
        let mut store = Store::default();
        store.strict = true;
        Self::with(store, definitions)
    }

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
            body: if header("content-type").contains("protobuf") {
                protobuf::decode(&bytes).unwrap_or(Value::Null)
            } else {
                serde_json::from_slice(&bytes)
                    .or_else(|_| serde_yaml::from_slice(&bytes))
                    .unwrap_or(Value::Null)
            },
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
            Ok(Answer::Warned(code, object, warnings)) => {
                let mut response = json_response(code, &object);
                for warning in warnings {
                    let text = format!(
                        "299 - {}",
                        serde_json::to_string(&warning).unwrap_or_default()
                    );
                    if let Ok(value) = http::HeaderValue::from_str(&text) {
                        response.headers_mut().append("warning", value);
                    }
                }
                response
            }
            Ok(Answer::Watch(request)) => Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Body::from_stream(watch::stream(self.clone(), request)))
                .unwrap_or_default(),
            Err(e) => json_response(e.code, &status(&e)),
        }
    }

    fn answer(&self, request: &Recorded) -> Result<Answer, ApiError> {
        let Some(mut address) = Address::parse(&request.path) else {
            return self.non_resource(&request.path);
        };
        let query = Query::parse(&request.query);
        let metadata_only = request.accept.contains("as=PartialObjectMetadata");
        let as_table = table::wanted(&request.accept);
        let (served, definition) = self.with_store(|s| {
            (
                s.serves(&address.prefix, &address.resource),
                s.served(&address.prefix, &address.resource),
            )
        });
        if !served {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        let group = definition
            .as_ref()
            .map(|d| d.group.clone())
            .unwrap_or_default();
        // Core events are a view of the events.k8s.io ones, which are what is stored.
        let core_events = address.prefix == events::CORE_PREFIX && address.resource == "events";
        if request.is_write()
            && request.method != "DELETE"
            && request.content_type.contains("protobuf")
            && request.body.is_null()
        {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (not {})",
                    request.content_type
                ),
            ));
        }
        let mut body = request.body.clone();
        if core_events {
            address.prefix = events::STORED_PREFIX.to_string();
            body = events::from_core(&body);
        }
        let warnings = if matches!(request.method.as_str(), "POST" | "PUT" | "PATCH")
            && !request.content_type.starts_with("application/json-patch")
            && address.subresource.as_deref() != Some("scale")
        {
            let validation = query.get("fieldValidation").unwrap_or("Warn");
            self.validate_fields(&address, &mut body, validation)?
        } else {
            Vec::new()
        };
        let written = |code: u16, object: Value| {
            if warnings.is_empty() {
                Answer::Object(code, object)
            } else {
                Answer::Warned(code, object, warnings.clone())
            }
        };
        let view = |object: Value| {
            if core_events {
                events::to_core(&object)
            } else {
                object
            }
        };
        match (request.method.as_str(), &address.name) {
            ("GET", None) => {
                let fields = query.get("fieldSelector").unwrap_or_default();
                let fields = if core_events {
                    fields
                        .split(',')
                        .map(|f| events::stored_field(f.trim()))
                        .collect::<Vec<_>>()
                        .join(",")
                } else {
                    fields.to_string()
                };
                let selector = Selector::parse(query.get("labelSelector").unwrap_or_default())
                    .and_then(|s| {
                        s.with_fields(&fields, |field| {
                            let stored_group = if core_events { "events.k8s.io" } else { &group };
                            selector::fields_supported(stored_group, &address.resource, field)
                        })
                    })
                    .map_err(|why| ApiError::new(400, "BadRequest", why))?;
                if matches!(query.get("watch"), Some("true" | "1")) {
                    let initial = query.get("sendInitialEvents") == Some("true");
                    let since = query
                        .get("resourceVersion")
                        .filter(|_| !initial)
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
                        core_events,
                        initial_events_end: initial.then(|| match &definition {
                            Some(d) => (d.group_version(), d.kind.clone()),
                            None => ("v1".to_string(), "Status".to_string()),
                        }),
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
                let items: Vec<Value> = items.into_iter().map(view).collect();
                if as_table {
                    let mut table = table::of(definition.as_ref(), &items, &version.to_string());
                    if let Some(next) = next {
                        table["metadata"]["continue"] = json!(next);
                    }
                    return Ok(Answer::Object(200, table));
                }
                let items: Vec<Value> = if metadata_only {
                    items.iter().map(watch::metadata_of).collect()
                } else {
                    items
                };
                let (kind, api_version) = match &definition {
                    _ if metadata_only => (
                        "PartialObjectMetadataList".to_string(),
                        "meta.k8s.io/v1".to_string(),
                    ),
                    Some(d) => (format!("{}List", d.kind), d.group_version()),
                    None => ("List".to_string(), "v1".to_string()),
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
                let object = view(object);
                let version = object["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                Ok(Answer::Object(
                    200,
                    if as_table {
                        table::of(definition.as_ref(), std::slice::from_ref(&object), &version)
                    } else if metadata_only {
                        watch::metadata_of(&object)
                    } else {
                        object
                    },
                ))
            }
            ("POST", None) => self
                .with_store(|s| s.create(&address, body))
                .map(|o| written(201, view(o))),
            ("PUT", Some(_)) => {
                let previous = self.get(&address.key());
                let object = self.with_store(|s| s.replace(&address, body))?;
                self.owned_by_writer(&address, &query, previous.as_ref(), &object);
                Ok(written(200, view(object)))
            }
            ("PATCH", Some(_)) => {
                let kind = patch_kind(&request.content_type).ok_or_else(|| {
                    ApiError::new(415, "UnsupportedMediaType", request.content_type.clone())
                })?;
                let previous = self.get(&address.key());
                if kind == PatchKind::Strategic {
                    let object = self.strategic_patch(&address, definition.as_ref(), &body)?;
                    self.owned_by_writer(&address, &query, previous.as_ref(), &object);
                    return Ok(written(200, view(object)));
                }
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
                let object = self.with_store(|s| s.patch(&address, kind, body))?;
                if kind != PatchKind::Apply {
                    self.owned_by_writer(&address, &query, previous.as_ref(), &object);
                }
                Ok(written(200, view(object)))
            }
            ("DELETE", Some(_)) => {
                let deleted = self.with_store(|s| s.delete(&address))?;
                if self.get(&address.key()).is_none() {
                    self.managers().forget(&address.key());
                }
                Ok(Answer::Object(200, view(deleted)))
            }
            (method, _) => Err(ApiError::new(405, "MethodNotAllowed", method.to_string())),
        }
    }

    /// kube-apiserver's field validation of a written body, by the kind's schema (when
    /// this fake has the definitions): unknown fields are dropped, with a warning each
    /// (`Warn`, the default), or refused (`Strict`), or dropped silently (`Ignore`).
    fn validate_fields(
        &self,
        address: &Address,
        body: &mut Value,
        validation: &str,
    ) -> Result<Vec<String>, ApiError> {
        let Some(definitions) = self.shared.definitions.clone() else {
            return Ok(Vec::new());
        };
        let Some(served) = self.with_store(|s| s.served(&address.prefix, &address.resource)) else {
            return Ok(Vec::new());
        };
        let schema = match &served.schema {
            Some(_) => openapi::crd_definition(&served),
            None => match definitions.of_kind(&served.group, &served.version, &served.kind) {
                Some((_, schema)) => schema.clone(),
                None => return Ok(Vec::new()),
            },
        };
        let unknown = openapi::prune(Some(&definitions), &schema, body);
        if unknown.is_empty() || validation == "Ignore" {
            return Ok(Vec::new());
        }
        let messages: Vec<String> = unknown
            .iter()
            .map(|field| format!("unknown field {field:?}"))
            .collect();
        if validation == "Strict" {
            return Err(ApiError::new(
                400,
                "BadRequest",
                format!(
                    "{} in version {:?} cannot be handled as a {}: strict decoding error: {}",
                    served.kind,
                    served.group_version(),
                    served.kind,
                    messages.join(", ")
                ),
            ));
        }
        Ok(messages)
    }

    /// A strategic merge patch of a built-in kind, by its OpenAPI schema.
    fn strategic_patch(
        &self,
        address: &Address,
        definition: Option<&discovery::Served>,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let unsupported = || {
            ApiError::new(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        };
        let definitions = self.shared.definitions.clone().ok_or_else(unsupported)?;
        let served = definition
            .filter(|d| d.schema.is_none())
            .ok_or_else(unsupported)?;
        let (_, schema) = definitions
            .of_kind(&served.group, &served.version, &served.kind)
            .ok_or_else(unsupported)?;
        self.with_store(|s| {
            let previous = s
                .get(&address.key())
                .cloned()
                .ok_or_else(|| ApiError::not_found(&address.key()))?;
            let patched = strategic::apply(&definitions, schema, &previous, patch)
                .map_err(|why| ApiError::new(422, "Invalid", why))?;
            s.patched(address, patch, patched)
        })
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

    /// What is not an object: `/version`, discovery, OpenAPI.
    fn non_resource(&self, path: &str) -> Result<Answer, ApiError> {
        let path = path.trim_end_matches('/');
        let (served, extra) = self.with_store(|s| (s.all_served(), s.resources_under(path)));
        let strict = self.with_store(|s| s.strict);
        let found = match path {
            "/version" => Some(discovery::version()),
            "/api" if strict => Some(discovery::core_versions()),
            "/apis" if strict => Some(discovery::groups(&served)),
            "/openapi/v2" => self
                .shared
                .definitions
                .as_ref()
                .map(|d| openapi::v2(d, &served)),
            _ if path.starts_with("/openapi/v3") => self
                .shared
                .definitions
                .as_ref()
                .and_then(|d| openapi::v3(d, &served, path)),
            _ => match path.split('/').collect::<Vec<_>>().as_slice() {
                ["", "apis", group] if strict => discovery::group(&served, group),
                _ => discovery::resource_list(&served, path, &extra),
            },
        };
        found
            .map(|document| Answer::Object(200, document))
            .ok_or_else(|| ApiError::not_found(path))
    }
}

enum Answer {
    Object(u16, Value),
    /// An answer with `Warning` headers (unknown fields dropped).
    Warned(u16, Value, Vec<String>),
    Watch(watch::WatchRequest),
}

fn patch_kind(content_type: &str) -> Option<PatchKind> {
    if content_type.starts_with("application/apply-patch") {
        Some(PatchKind::Apply)
    } else if content_type.starts_with("application/merge-patch") {
        Some(PatchKind::Merge)
    } else if content_type.starts_with("application/json-patch") {
        Some(PatchKind::Json)
    } else if content_type.starts_with("application/strategic-merge-patch") {
        Some(PatchKind::Strategic)
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
