//! A recording proxy in front of the real management API: it forwards every request to
//! the broker and records what passed, so a test counts the requests the mailer really
//! made, and how many were in flight at once, independently of the mailer's own counters.
//! The topology's tests, the controller's tests and the controller's benchmark include it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::Response;

/// One request that went through the proxy.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    /// The path below `/api/`, decoded, e.g. `queues/v/p1.mail.send`.
    pub path: String,
    pub started: Instant,
    pub finished: Instant,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// The kind of object, the first segment of the path: `queues`, `bindings`, ...
    pub fn kind(&self) -> &str {
        self.path.split('/').next().unwrap_or_default()
    }
}

struct Shared {
    upstream: String,
    client: reqwest::Client,
    /// How long each writing request is held before it is forwarded, so that writes a
    /// client sends at once are seen at once.
    write_delay: Duration,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    recorded: Mutex<Vec<Recorded>>,
}

/// The proxy, serving until it is dropped.
pub struct Proxy {
    shared: Arc<Shared>,
    port: u16,
    server: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy to the management API at `upstream` (`host:port`) that holds each write
    /// `write_delay`.
    pub async fn start(upstream: &str, write_delay: Duration) -> Self {
        let shared = Arc::new(Shared {
            upstream: format!("http://{upstream}"),
            client: reqwest::Client::new(),
            write_delay,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            recorded: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let app = Router::new().fallback(forward).with_state(shared.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the proxy serves");
        });
        Self {
            shared,
            port,
            server,
        }
    }

    /// The proxy's URL, e.g. `http://127.0.0.1:43210`, to give as the management API's.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A management client of the mailer that talks through the proxy.
    pub fn management(&self) -> mailer::topology::Management {
        let endpoint =
            mailer::topology::ManagementEndpoint::with_credentials(&self.url(), "guest", "guest")
                .expect("endpoint");
        mailer::topology::Management::new(&endpoint).expect("client")
    }

    /// Everything recorded so far, and forgets it.
    pub fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut *self.shared.recorded.lock().expect("records"))
    }

    /// The most requests that were in flight at once, and starts counting again.
    pub fn take_max_in_flight(&self) -> usize {
        self.shared.max_in_flight.swap(0, Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn forward(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let started = Instant::now();
    let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(ToString::to_string)
        .unwrap_or_default();
    let response = async {
        let body = to_bytes(body, usize::MAX)
            .await
            .map_err(|e| e.to_string())?;
        if parts.method != Method::GET {
            tokio::time::sleep(shared.write_delay).await;
        }
        let mut upstream = shared
            .client
            .request(
                parts.method.clone(),
                format!("{}{path_and_query}", shared.upstream),
            )
            .body(body);
        for (name, value) in &parts.headers {
            if name != header::HOST {
                upstream = upstream.header(name, value);
            }
        }
        let answer = upstream.send().await.map_err(|e| e.to_string())?;
        let status = answer.status();
        let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
        let bytes = answer.bytes().await.map_err(|e| e.to_string())?;
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = status;
        if let Some(content_type) = content_type {
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
        }
        Ok::<_, String>(response)
    }
    .await
    .unwrap_or_else(|e| {
        let mut response = Response::new(Body::from(e));
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response
    });
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    let path = percent_encoding::percent_decode_str(parts.uri.path()).decode_utf8_lossy();
    shared.recorded.lock().expect("records").push(Recorded {
        method: parts.method.clone(),
        path: path.strip_prefix("/api/").unwrap_or(&path).to_string(),
        started,
        finished: Instant::now(),
    });
    response
}
