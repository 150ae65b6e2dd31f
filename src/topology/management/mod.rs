//! RabbitMQ's management HTTP API, through `rabbitmq_http_client`: one pooled client per
//! broker endpoint, with a bound on the requests it has in flight, making one change at a
//! time with errors a user can act on. Reading a pipeline's objects is in [`observe`],
//! a vhost's definitions read once for many in [`snapshot`], the owner markers in
//! [`markers`], policies of many reconciles written together in [`together`]; where the
//! API is and who to be there is [`endpoint`], and how its failures read is [`errors`].
//! What this client keeps for a while (definitions, markers, open policy batches) is
//! defined beside what reads it, so nothing it holds imports it back.

mod batches;
pub mod claims_together;
mod connections;
mod counting;
mod endpoint;
mod errors;
pub mod markers;
pub mod observe;
pub mod snapshot;
pub mod together;

pub use counting::{Requests, counted};
pub use endpoint::ManagementEndpoint;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use rabbitmq_http_client::api::{Client, HttpClientError};
use rabbitmq_http_client::commons::{BindingDestinationType, ExchangeType, PolicyTarget};
use rabbitmq_http_client::requests::{
    BindingDeletionParams, ExchangeParams, PolicyParams, QueueParams, VirtualHostParams,
};
use rabbitmq_http_client::responses::QueueInfo;

use super::broker::BrokerCapabilities;
use super::desired::{Binding, ExchangeKind, POLICY_PRIORITY};
use super::diff::Change;
use crate::topology::error::TopologyError;
use batches::VhostBatches;
use markers::SharedMarkers;
use snapshot::SharedSnapshots;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The most requests of the topology one client has in flight at once, reads and writes
/// together. The management API serves each request on the broker's own schedulers, so
/// more at once only makes each slower (and starves the broker's message traffic); 8
/// keeps a broker on two cores busy without queueing work inside it.
pub const MAX_IN_FLIGHT: usize = 8;

/// Clients of management APIs, one per endpoint and user, each made at its first use and
/// kept as long as this is: what [`Management::shared`] keeps for the whole process. Its
/// connections belong to the tokio runtime that first used it, so work on another
/// runtime (each test has its own) keeps clients of its own.
#[derive(Default)]
pub struct Clients {
    by_endpoint: Mutex<HashMap<ManagementEndpoint, Arc<Management>>>,
}

impl Clients {
    /// The client of `endpoint`.
    pub fn get(&self, endpoint: &ManagementEndpoint) -> Result<Arc<Management>, TopologyError> {
        let mut clients = self
            .by_endpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = clients.get(endpoint) {
            return Ok(client.clone());
        }
        let client = Arc::new(Management::new(endpoint)?);
        clients.insert(endpoint.clone(), client.clone());
        Ok(client)
    }
}

/// A client of one broker's management API. Its HTTP connections are pooled and kept
/// alive, so one client serves every pipeline of a pass (share it by reference).
pub struct Management {
    pub(super) api: Client<String, String, String>,
    /// The same pooled connections as `api`, for [`get_json_unless_refused`](Self::get_json_unless_refused).
    http: reqwest::Client,
    endpoint: ManagementEndpoint,
    reads: AtomicUsize,
    writes: AtomicUsize,
    in_flight: tokio::sync::Semaphore,
    /// The broker's capabilities and when they were read, for
    /// [`capabilities_within`](Self::capabilities_within).
    pub(super) capabilities: Mutex<Option<(Instant, BrokerCapabilities)>>,
    /// Definitions shared by work running at once ([`shared_observe`](Self::shared_observe)).
    pub(super) snapshots: Mutex<SharedSnapshots>,
    /// Held while definitions are read for [`shared_observe`](Self::shared_observe).
    pub(super) snapshot_read: tokio::sync::Mutex<()>,
    /// By vhost, when this client's user was last found granted there
    /// ([`ensure_own_grant`](Self::ensure_own_grant)).
    pub(in crate::topology) own_grants: Mutex<HashMap<String, Instant>>,
    /// Owner markers shared by work running at once ([`shared_markers`](Self::shared_markers)).
    pub(super) markers: Mutex<SharedMarkers>,
    /// Held while the markers are read for [`shared_markers`](Self::shared_markers).
    pub(super) markers_read: tokio::sync::Mutex<()>,
    /// Policies of work running at once, gathered per vhost
    /// ([`together::put_policies_together`]).
    pub(super) policy_batches: VhostBatches<together::Submission>,
    /// Claims of work running at once, gathered per vhost
    /// ([`claims_together::claim_together`]).
    pub(super) claim_batches: VhostBatches<claims_together::Submission>,
    /// Whether the claim locks' vhost is known to exist, with this user's permissions
    /// ([`crate::topology::claim_lock`]).
    /// Held while it is made, so claims running at once make it once.
    pub(in crate::topology) lock_vhost_ready: tokio::sync::Mutex<bool>,
}

impl Management {
    pub fn new(endpoint: &ManagementEndpoint) -> Result<Self, TopologyError> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| TopologyError::BadEndpoint(format!("cannot build an HTTP client: {e}")))?;
        let api = Client::from_http_client(
            http.clone(),
            endpoint.api.to_string(),
            endpoint.username.clone(),
            endpoint.password().to_string(),
        );
        Ok(Self {
            api,
            http,
            endpoint: endpoint.clone(),
            reads: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
            in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
            capabilities: Mutex::new(None),
            snapshots: Mutex::default(),
            snapshot_read: tokio::sync::Mutex::new(()),
            own_grants: Mutex::default(),
            markers: Mutex::default(),
            markers_read: tokio::sync::Mutex::new(()),
            policy_batches: VhostBatches::default(),
            claim_batches: VhostBatches::default(),
            lock_vhost_ready: tokio::sync::Mutex::new(false),
        })
    }

    /// The client of `endpoint` that the whole process shares, made at its first use: one
    /// pool of connections and one bound on the requests in flight per broker endpoint
    /// and user, however many pipelines use it at once. It is kept for the life of the
    /// process (one per endpoint and set of credentials ever used). Its
    /// [`writes`](Self::writes) and [`reads`](Self::reads) count for every user of it.
    pub fn shared(endpoint: &ManagementEndpoint) -> Result<Arc<Self>, TopologyError> {
        static CLIENTS: OnceLock<Clients> = OnceLock::new();
        CLIENTS.get_or_init(Clients::default).get(endpoint)
    }

    pub fn endpoint(&self) -> &ManagementEndpoint {
        &self.endpoint
    }

    /// How many writing requests this client has made, so callers (and tests) can tell
    /// a pass that changed nothing from one that did. A client shared by work running at
    /// once counts for all of it: count one piece of work with [`counted`].
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::Relaxed)
    }

    /// How many reading requests of the topology this client has made.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::Relaxed)
    }

    pub(super) fn count_write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        counting::tally_writes(1);
    }

    /// Runs a reading request once fewer than [`MAX_IN_FLIGHT`] are under way.
    pub(super) async fn read<T>(&self, request: impl Future<Output = T>) -> T {
        // The semaphore is never closed, so acquiring it cannot fail.
        let _permit = self.in_flight.acquire().await.ok();
        self.reads.fetch_add(1, Ordering::Relaxed);
        counting::tally_read();
        request.await
    }

    /// Runs a writing request once fewer than [`MAX_IN_FLIGHT`] are under way.
    pub(super) async fn bounded_write<T>(&self, request: impl Future<Output = T>) -> T {
        let _permit = self.in_flight.acquire().await.ok();
        self.count_write();
        request.await
    }

    /// GETs the JSON at `segments` below the API (each one percent-encoded), or `None` when
    /// the broker answers 400, 401, 403 or 404. It bypasses `rabbitmq_http_client`, which
    /// captures and symbolizes a backtrace for every error response but a 404: that maps
    /// the binary's symbols again and keeps them for the life of the process
    /// (`docs/benchmarks.md`, the controller's notes), for an answer that some reads get
    /// in normal operation (RabbitMQ 4 answers 400 for the definitions of a vhost that
    /// does not exist yet). Counted and bounded as [`read`](Self::read).
    pub(super) async fn get_json_unless_refused<T: serde::de::DeserializeOwned>(
        &self,
        segments: &[&str],
        action: &str,
    ) -> Result<Option<T>, TopologyError> {
        let (status, body) = self.get(segments).await?;
        if matches!(status, 400 | 401 | 403 | 404) {
            return Ok(None);
        }
        self.answer(status, body, action).map(Some)
    }

    /// GETs the JSON at `segments` below the API (each one percent-encoded), or `None` when
    /// there is no such object (404); 401 and 403 are errors. Counted and bounded as
    /// [`read`](Self::read).
    pub(super) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        segments: &[&str],
        action: &str,
    ) -> Result<Option<T>, TopologyError> {
        self.get_json_with(segments, &[], action).await
    }

    /// [`get_json`](Self::get_json) with `query`'s parameters (e.g. `columns`, which
    /// lists answer with only the fields named).
    pub(super) async fn get_json_with<T: serde::de::DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
        action: &str,
    ) -> Result<Option<T>, TopologyError> {
        let (status, body) = self.get_with(segments, query).await?;
        if status == 404 {
            return Ok(None);
        }
        if let Some(refused) = self.refusal_of_user(status, action) {
            return Err(refused);
        }
        self.answer(status, body, action).map(Some)
    }

    /// The error of a 401 or 403 answer: the endpoint refused this user, or this action.
    fn refusal_of_user(&self, status: u16, action: &str) -> Option<TopologyError> {
        match status {
            401 => Some(TopologyError::Unauthorized {
                endpoint: self.endpoint.to_string(),
                user: self.endpoint.username.clone(),
            }),
            403 => Some(TopologyError::Forbidden {
                endpoint: self.endpoint.to_string(),
                user: self.endpoint.username.clone(),
                action: action.to_string(),
            }),
            _ => None,
        }
    }

    /// A queue's details, or `None` when there is no such queue. Read through
    /// [`get_json`](Self::get_json): RabbitMQ 4.0.5 answers a quorum queue with the key
    /// `online` twice for a while after one of its members' nodes went away, which
    /// `rabbitmq_http_client`'s own read rejects as a duplicate field.
    pub async fn queue_info(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Option<QueueInfo>, TopologyError> {
        self.get_json(&["queues", vhost, name], &format!("read queue {name}"))
            .await
    }

    /// One GET below the API: the answer's status and body, read under the same permit
    /// as the request (its transfer is part of it).
    async fn get(
        &self,
        segments: &[&str],
    ) -> Result<(u16, reqwest::Result<bytes::Bytes>), TopologyError> {
        self.get_with(segments, &[]).await
    }

    async fn get_with(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<(u16, reqwest::Result<bytes::Bytes>), TopologyError> {
        let mut url = self.endpoint.url_of(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        self.read(async {
            let response = self
                .http
                .get(url)
                .basic_auth(&self.endpoint.username, Some(self.endpoint.password()))
                .send()
                .await?;
            let status = response.status().as_u16();
            Ok::<_, reqwest::Error>((status, response.bytes().await))
        })
        .await
        .map_err(|e| TopologyError::unreachable(&self.endpoint, &e))
    }

    /// The decoded body of a successful answer; an unsuccessful one is refused with the
    /// broker's reason.
    fn answer<T: serde::de::DeserializeOwned>(
        &self,
        status: u16,
        body: reqwest::Result<bytes::Bytes>,
        action: &str,
    ) -> Result<T, TopologyError> {
        if !(200..300).contains(&status) {
            let reason = body
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            return Err(TopologyError::Refused {
                action: action.to_string(),
                status,
                reason: crate::text::truncate(&reason, 200).into_owned(),
            });
        }
        let body = body.map_err(|e| TopologyError::unreachable(&self.endpoint, &e))?;
        decode(&body).map_err(|e| TopologyError::Refused {
            action: action.to_string(),
            status,
            reason: format!("its answer is not what RabbitMQ's management API sends: {e}"),
        })
    }

    /// PUTs `body` at `segments` below the API (each one percent-encoded) and returns the
    /// answer's status, bypassing `rabbitmq_http_client` for the reason
    /// [`get_json_unless_refused`](Self::get_json_unless_refused) says. Counted and
    /// bounded as [`bounded_write`](Self::bounded_write); 401 and 403 are errors.
    pub(super) async fn put_json(
        &self,
        segments: &[&str],
        body: &serde_json::Value,
        action: &str,
    ) -> Result<u16, TopologyError> {
        let url = self.endpoint.url_of(segments);
        let status = self
            .bounded_write(async {
                let response = self
                    .http
                    .put(url)
                    .basic_auth(&self.endpoint.username, Some(self.endpoint.password()))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.to_string())
                    .send()
                    .await?;
                let status = response.status().as_u16();
                // The body is read so the connection goes back to the pool.
                let _ = response.bytes().await;
                Ok::<_, reqwest::Error>(status)
            })
            .await
            .map_err(|e| TopologyError::unreachable(&self.endpoint, &e))?;
        match self.refusal_of_user(status, action) {
            Some(refused) => Err(refused),
            None => Ok(status),
        }
    }

    pub(super) fn error(&self, action: &str, e: HttpClientError) -> TopologyError {
        TopologyError::from_http(&self.endpoint, action, e)
    }

    /// Makes one change in `vhost`, and logs it once the broker took it.
    pub async fn write(&self, vhost: &str, change: &Change) -> Result<(), TopologyError> {
        match self.request(vhost, change).await {
            Ok(()) => {
                self.made(vhost, [change]);
                tracing::info!(vhost = %vhost, change = %change, "topology changed");
                Ok(())
            }
            Err(e) => {
                // It may have been made all the same.
                self.wrote_to(vhost);
                Err(self.error(&change.to_string(), e))
            }
        }
    }

    /// The requests of one change, each counted and bounded.
    async fn request(&self, vhost: &str, change: &Change) -> Result<(), HttpClientError> {
        match change {
            Change::CreateVhost(name) => {
                self.create_vhost_granted(name, "mail pipeline managed by mailer")
                    .await
            }
            Change::CreateExchange(exchange) => {
                let params = ExchangeParams {
                    name: &exchange.name,
                    exchange_type: match exchange.kind {
                        ExchangeKind::Direct => ExchangeType::Direct,
                        ExchangeKind::Fanout => ExchangeType::Fanout,
                    },
                    durable: true,
                    auto_delete: false,
                    arguments: None,
                };
                self.bounded_write(self.api.declare_exchange(vhost, &params))
                    .await
            }
            Change::CreateQueue(queue) => {
                let params = QueueParams::new_quorum_queue(&queue.name, None);
                self.bounded_write(self.api.declare_queue(vhost, &params))
                    .await
            }
            Change::CreateBinding(b) => {
                self.bounded_write(self.api.bind_queue(
                    vhost,
                    &b.queue,
                    &b.exchange,
                    Some(&b.routing_key),
                    None,
                ))
                .await
            }
            Change::PutPolicy { policy, .. } => {
                let params = PolicyParams {
                    vhost,
                    name: &policy.name,
                    pattern: &policy.pattern,
                    apply_to: PolicyTarget::Queues,
                    priority: i32::from(POLICY_PRIORITY),
                    definition: policy.definition.clone(),
                };
                self.bounded_write(self.api.declare_policy(&params)).await
            }
        }
    }

    /// Creates vhost `name` (a PUT: one that exists is left as it is) and grants this
    /// client's user full permissions there.
    pub(super) async fn create_vhost_granted(
        &self,
        name: &str,
        description: &str,
    ) -> Result<(), HttpClientError> {
        let params = VirtualHostParams {
            name,
            description: Some(description),
            tags: None,
            default_queue_type: None,
            tracing: false,
        };
        self.bounded_write(self.api.create_vhost(&params)).await?;
        self.bounded_write(
            self.api
                .grant_full_permissions(&self.endpoint.username, name),
        )
        .await?;
        self.own_grants().insert(name.to_string(), Instant::now());
        Ok(())
    }

    pub async fn delete_binding(&self, vhost: &str, b: &Binding) -> Result<(), TopologyError> {
        self.wrote_to(vhost);
        let params = BindingDeletionParams {
            virtual_host: vhost,
            source: &b.exchange,
            destination: &b.queue,
            destination_type: BindingDestinationType::Queue,
            routing_key: &b.routing_key,
            arguments: None,
        };
        match self
            .bounded_write(self.api.delete_binding(&params, true))
            .await
        {
            Err(e) if !e.is_not_found() => {
                Err(self.error(&format!("delete binding {} -> {}", b.exchange, b.queue), e))
            }
            _ => Ok(()),
        }
    }

    pub async fn delete_exchange(&self, vhost: &str, name: &str) -> Result<(), TopologyError> {
        self.wrote_to(vhost);
        self.bounded_write(self.api.delete_exchange(vhost, name, true))
            .await
            .map_err(|e| self.error(&format!("delete exchange {name}"), e))
    }

    pub async fn delete_queue(&self, vhost: &str, name: &str) -> Result<(), TopologyError> {
        self.wrote_to(vhost);
        self.bounded_write(self.api.delete_queue(vhost, name, true))
            .await
            .map_err(|e| self.error(&format!("delete queue {name}"), e))
    }

    pub async fn delete_policy(&self, vhost: &str, name: &str) -> Result<(), TopologyError> {
        self.wrote_to(vhost);
        self.bounded_write(self.api.delete_policy(vhost, name, true))
            .await
            .map_err(|e| self.error(&format!("delete policy {name}"), e))
    }

    /// Messages in a queue, ready and unacknowledged, as the API's statistics last
    /// counted them (they lag by seconds); `None` when there is no such queue.
    pub async fn queue_depth(
        &self,
        vhost: &str,
        name: &str,
    ) -> Result<Option<QueueDepth>, TopologyError> {
        Ok(self.queue_info(vhost, name).await?.map(|q| QueueDepth {
            messages: q.message_count,
            unacknowledged: q.unacknowledged_message_count,
            consumers: u32::from(q.consumer_count),
        }))
    }
}

/// A management API answer decoded as `T`: straight from the text, so that only `T` is
/// held (a vhost's definitions with a thousand pipelines are megabytes of text, and
/// several times that as a JSON value); when that fails, through a JSON value, where a key
/// given twice keeps its last value instead of failing the read (serde's derived
/// decoding rejects duplicate fields, which RabbitMQ 4.0.5 sends for a quorum queue's
/// `online`).
fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> serde_json::Result<T> {
    serde_json::from_slice::<T>(body)
        .or_else(|_| serde_json::from_slice::<serde_json::Value>(body).and_then(T::deserialize))
}

/// A queue's load as the management API last counted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueDepth {
    pub messages: u64,
    pub unacknowledged: u64,
    pub consumers: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_queue_answered_with_online_twice_is_read() {
        let body = include_bytes!("testdata/quorum-queue-online-twice.json");
        let strict = serde_json::from_slice::<QueueInfo>(body);
        assert!(
            strict.is_err(),
            "the fixture no longer shows the broker's duplicate key"
        );
        let info: QueueInfo = decode(body).expect("the answer is read");
        assert_eq!(info.name, "mail.send");
        assert_eq!(info.message_count, 12);
        let online = info.online.expect("online members").to_string();
        assert!(
            online.contains("mq-1") && !online.contains("mq-2"),
            "the last of the two keys counts: {online}"
        );
    }

    #[test]
    fn one_client_is_shared_per_endpoint_and_user() {
        let endpoint = |url: &str| ManagementEndpoint::parse(url).unwrap();
        let a = Management::shared(&endpoint("http://u:p@rabbit-a:15672")).unwrap();
        let again = Management::shared(&endpoint("http://u:p@rabbit-a:15672/api")).unwrap();
        let other_user = Management::shared(&endpoint("http://v:p@rabbit-a:15672")).unwrap();
        let other_host = Management::shared(&endpoint("http://u:p@rabbit-b:15672")).unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert!(!Arc::ptr_eq(&a, &other_user));
        assert!(!Arc::ptr_eq(&a, &other_host));
    }
}
