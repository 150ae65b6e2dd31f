//! Local stand-ins for the HTTP mail APIs (SES v2, SendGrid v3, Postmark, Mailgun), for the
//! providers' tests and the worker's benchmark.
//!
//! Each checks a request as the real service does ([`checks`]): the key (for SES the
//! SigV4 signature, verified by hand with the test's key and clock: [`sigv4`]), the path,
//! the content type, the fields the service requires, and answers a request that fails a
//! check as the service would (401, 403, 400), recording the problem. A request that
//! passes is answered with the next scripted [`Answer`] when one is queued (the
//! documented errors, in turn), else as the service answers a mail it took, and then
//! recorded as [`Received`]. It counts requests and TCP connections, to show reuse.

pub mod checks;
pub mod sigv4;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// The SES access key id the stand-in takes.
pub const KEY_ID: &str = "AKIDMAILERTEST";
/// The secret (SES) or API key (the others) the stand-in takes: with a `/` and a `+`, to
/// show that the URL's percent-encoding is read.
pub const SECRET: &str = "t3st/Secret+Key";
/// SES's region.
pub const REGION: &str = "eu-west-1";
/// Mailgun's sending domain.
pub const DOMAIN: &str = "mg.shop.example";

/// Which API a stand-in plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Ses,
    SendGrid,
    Postmark,
    Mailgun,
}

impl Service {
    pub const ALL: [Service; 4] = [Self::Ses, Self::SendGrid, Self::Postmark, Self::Mailgun];

    pub fn name(self) -> &'static str {
        match self {
            Self::Ses => "ses",
            Self::SendGrid => "sendgrid",
            Self::Postmark => "postmark",
            Self::Mailgun => "mailgun",
        }
    }

    /// The provider URL with `key`, pointed at `endpoint`.
    pub fn url_with_key(self, key: &str, endpoint: &str) -> String {
        let key = utf8_percent_encode(key, NON_ALPHANUMERIC);
        match self {
            Self::Ses => format!("ses://{KEY_ID}:{key}@{REGION}?endpoint={endpoint}"),
            Self::SendGrid => format!("sendgrid://:{key}@api.sendgrid.com?endpoint={endpoint}"),
            Self::Postmark => format!("postmark://:{key}@api.postmarkapp.com?endpoint={endpoint}"),
            Self::Mailgun => format!("mailgun://:{key}@{DOMAIN}?endpoint={endpoint}"),
        }
    }
}

/// An answer the stand-in gives instead of taking a mail.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    /// How long the stand-in waits before it answers.
    pub delay: std::time::Duration,
}

impl Answer {
    pub fn new(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay: std::time::Duration::ZERO,
        }
    }

    /// The same answer, given after `delay`.
    pub fn after(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::IM_A_TEAPOT);
        let content_type = if self.body.starts_with('{') {
            "application/json"
        } else {
            "text/plain"
        };
        let mut response = (status, self.body).into_response();
        response.headers_mut().insert(
            "content-type",
            content_type.parse().expect("a header value"),
        );
        for (name, value) in self.headers {
            let name = axum::http::HeaderName::from_bytes(name.as_bytes());
            if let (Ok(name), Ok(value)) = (name, value.parse()) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }
}

/// A mail the stand-in took.
#[derive(Debug, Clone)]
pub struct Received {
    /// When it arrived.
    pub at: std::time::Instant,
    /// The `Message-ID` it carried, with its angle brackets.
    pub message_id: String,
    /// Everyone it goes to, as the request named them to the service.
    pub recipients: Vec<String>,
    /// The request's JSON (for Mailgun, its form fields but the message).
    pub json: Value,
    /// The MIME message, for the APIs that take one (SES raw content, Mailgun).
    pub raw: Option<String>,
}

struct Shared {
    service: Service,
    key: String,
    script: Mutex<VecDeque<Answer>>,
    received: Mutex<Vec<Received>>,
    /// Whether to keep what was received (a benchmark keeps only counts).
    keep: bool,
    taken: AtomicUsize,
    problems: Mutex<Vec<String>>,
    requests: AtomicUsize,
    connections: AtomicUsize,
}

/// A stand-in API on 127.0.0.1, stopped when dropped.
pub struct ApiStandIn {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl ApiStandIn {
    /// Starts a stand-in of `service` that keeps every mail it takes.
    pub async fn start(service: Service) -> Self {
        Self::start_with(service, true).await
    }

    /// Starts a stand-in of `service`; `keep` false keeps only counts (for a benchmark).
    pub async fn start_with(service: Service, keep: bool) -> Self {
        let shared = Arc::new(Shared {
            service,
            key: SECRET.to_string(),
            script: Mutex::default(),
            received: Mutex::default(),
            keep,
            taken: AtomicUsize::new(0),
            problems: Mutex::default(),
            requests: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the API stand-in");
        let addr = listener.local_addr().expect("its address");
        let counted = shared.clone();
        let listener = listener.tap_io(move |stream| {
            let _ = stream.set_nodelay(true);
            counted.connections.fetch_add(1, Ordering::Relaxed);
        });
        let app = Router::new()
            .fallback(handle)
            .layer(DefaultBodyLimit::max(64 << 20))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { shared, addr, task }
    }

    pub fn service(&self) -> Service {
        self.shared.service
    }

    /// `http://127.0.0.1:PORT`, the providers' `endpoint=`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The provider URL, with the key the stand-in takes.
    pub fn url(&self) -> String {
        self.shared.service.url_with_key(SECRET, &self.endpoint())
    }

    /// The provider URL with another key, which the stand-in refuses.
    pub fn url_with_key(&self, key: &str) -> String {
        self.shared.service.url_with_key(key, &self.endpoint())
    }

    /// Queues answers for the next requests that pass the checks, in order.
    pub fn answer_next(&self, answers: impl IntoIterator<Item = Answer>) {
        self.shared.script.lock().unwrap().extend(answers);
    }

    /// The mails taken, in the order they came.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// How many mails were taken.
    pub fn taken(&self) -> usize {
        self.shared.taken.load(Ordering::Relaxed)
    }

    /// Why requests failed the checks, in order.
    pub fn problems(&self) -> Vec<String> {
        self.shared.problems.lock().unwrap().clone()
    }

    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// TCP connections accepted.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

impl Drop for ApiStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let checked = checks::check(shared.service, &shared.key, &method, &uri, &headers, &body);
    let received = match checked {
        Ok(received) => received,
        Err(refused) => {
            shared.problems.lock().unwrap().push(format!(
                "{} {}: {}",
                refused.status,
                uri.path(),
                refused.problem
            ));
            return refused.answer.into_response();
        }
    };
    let scripted = shared.script.lock().unwrap().pop_front();
    if let Some(answer) = scripted {
        tokio::time::sleep(answer.delay).await;
        return answer.into_response();
    }
    shared.taken.fetch_add(1, Ordering::Relaxed);
    let accepted = checks::accepted(shared.service, &received);
    if shared.keep {
        shared.received.lock().unwrap().push(received);
    }
    accepted.into_response()
}
