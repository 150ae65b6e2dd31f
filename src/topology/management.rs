//! RabbitMQ's management HTTP API, through `rabbitmq_http_client`: reading what a vhost
//! holds and making one change at a time, with errors a user can act on.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rabbitmq_http_client::api::{Client, HttpClientError};
use rabbitmq_http_client::commons::{BindingDestinationType, ExchangeType, PolicyTarget};
use rabbitmq_http_client::requests::{
    BindingDeletionParams, ExchangeParams, PolicyParams, QueueParams, VirtualHostParams,
};
use url::Url;

use super::TopologyError;
use super::desired::{Binding, ExchangeKind, POLICY_PRIORITY};
use super::diff::{Change, Observed, ObservedExchange, ObservedPolicy, ObservedQueue};
use crate::redact::{MASK, credentials};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the management API is and who to be there.
#[derive(Clone, PartialEq, Eq)]
pub struct ManagementEndpoint {
    /// The API's base, e.g. `http://localhost:15672/api`, without credentials.
    api: Url,
    pub username: String,
    password: String,
}

impl ManagementEndpoint {
    /// From a URL like `http://user:password@host:15672`; `/api` is added when the path
    /// does not already end with it.
    pub fn parse(url: &str) -> Result<Self, TopologyError> {
        let parsed = Self::parse_base(url)?;
        let (username, password) = credentials(&parsed);
        if username.is_empty() {
            return Err(TopologyError::BadEndpoint(format!(
                "the management URL {} has no user name; write it as http://USER:PASSWORD@HOST:15672",
                crate::redact::redact_url(url)
            )));
        }
        Self::with_credentials(url, &username, &password)
    }

    /// From a URL and separately kept credentials (e.g. the keys of a Secret); any
    /// credentials in the URL itself are ignored.
    pub fn with_credentials(
        url: &str,
        username: &str,
        password: &str,
    ) -> Result<Self, TopologyError> {
        let mut api = Self::parse_base(url)?;
        let _ = api.set_username("");
        let _ = api.set_password(None);
        if !api.path().trim_end_matches('/').ends_with("/api") {
            let path = format!("{}/api", api.path().trim_end_matches('/'));
            api.set_path(&path);
        }
        let path = api.path().trim_end_matches('/').to_string();
        api.set_path(&path);
        Ok(Self {
            api,
            username: username.to_string(),
            password: password.to_string(),
        })
    }

    fn parse_base(url: &str) -> Result<Url, TopologyError> {
        let parsed = Url::parse(url).map_err(|e| {
            TopologyError::BadEndpoint(format!(
                "{} is not a management URL ({e}); write it as http://USER:PASSWORD@HOST:15672",
                crate::redact::redact_url(url)
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(TopologyError::BadEndpoint(format!(
                "{} is not a management URL: it must start with http:// or https:// and name a host",
                crate::redact::redact_url(url)
            )));
        }
        Ok(parsed)
    }

    /// The host the API runs on, to find the broker's AMQP listener on.
    pub fn host(&self) -> &str {
        self.api.host_str().unwrap_or("localhost")
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn is_tls(&self) -> bool {
        self.api.scheme() == "https"
    }
}

impl fmt::Display for ManagementEndpoint {
    /// The URL with the user name and a masked password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.api.clone();
        let _ = shown.set_username(&self.username);
        let _ = shown.set_password(Some(MASK));
        write!(f, "{shown}")
    }
}

impl fmt::Debug for ManagementEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManagementEndpoint({self})")
    }
}

/// A client of one broker's management API.
pub struct Management {
    pub(super) api: Client<String, String, String>,
    endpoint: ManagementEndpoint,
    writes: AtomicUsize,
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
            http,
            endpoint.api.to_string(),
            endpoint.username.clone(),
            endpoint.password.clone(),
        );
        Ok(Self {
            api,
            endpoint: endpoint.clone(),
            writes: AtomicUsize::new(0),
        })
    }

    pub fn endpoint(&self) -> &ManagementEndpoint {
        &self.endpoint
    }

    /// How many writing requests this client has made, so callers (and tests) can tell
    /// a reconcile that changed nothing from one that did.
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::Relaxed)
    }

    pub(super) fn count_write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn error(&self, action: &str, e: HttpClientError) -> TopologyError {
        TopologyError::from_http(&self.endpoint, action, e)
    }

    /// Everything in `vhost` a pipeline may care about. A missing vhost reads as empty.
    pub async fn observe(&self, vhost: &str) -> Result<Observed, TopologyError> {
        match self.api.get_vhost(vhost).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(Observed::default()),
            Err(e) => return Err(self.error(&format!("read vhost {vhost:?}"), e)),
        }
        let (exchanges, queues, bindings, policies) = futures::try_join!(
            async {
                self.api
                    .list_exchanges_in(vhost)
                    .await
                    .map_err(|e| self.error("list exchanges", e))
            },
            async {
                self.api
                    .list_queues_in(vhost)
                    .await
                    .map_err(|e| self.error("list queues", e))
            },
            async {
                self.api
                    .list_bindings_in(vhost)
                    .await
                    .map_err(|e| self.error("list bindings", e))
            },
            async {
                self.api
                    .list_policies_in(vhost)
                    .await
                    .map_err(|e| self.error("list policies", e))
            },
        )?;
        Ok(Observed {
            vhost_exists: true,
            exchanges: exchanges
                .into_iter()
                .map(|e| ObservedExchange {
                    name: e.name,
                    kind: e.exchange_type,
                    durable: e.durable,
                    auto_delete: e.auto_delete,
                })
                .collect(),
            queues: queues
                .into_iter()
                .map(|q| ObservedQueue {
                    name: q.name,
                    queue_type: q.queue_type,
                    durable: q.durable,
                    auto_delete: q.auto_delete,
                    exclusive: q.exclusive,
                    arguments: q.arguments.0,
                })
                .collect(),
            bindings: bindings
                .into_iter()
                .filter(|b| {
                    b.destination_type == BindingDestinationType::Queue && !b.source.is_empty()
                })
                .map(|b| Binding {
                    exchange: b.source,
                    queue: b.destination,
                    routing_key: b.routing_key,
                })
                .collect(),
            policies: policies
                .into_iter()
                .map(|p| ObservedPolicy {
                    name: p.name,
                    pattern: p.pattern,
                    apply_to: policy_target_name(&p.apply_to).to_string(),
                    priority: p.priority,
                    definition: p.definition.0.unwrap_or_default(),
                })
                .collect(),
        })
    }

    /// Makes one change in `vhost`.
    pub async fn write(&self, vhost: &str, change: &Change) -> Result<(), TopologyError> {
        self.count_write();
        let result = match change {
            Change::CreateVhost(name) => {
                let params = VirtualHostParams {
                    name,
                    description: Some("mail pipeline managed by mailer"),
                    tags: None,
                    default_queue_type: None,
                    tracing: false,
                };
                match self.api.create_vhost(&params).await {
                    Ok(()) => {
                        self.api
                            .grant_full_permissions(&self.endpoint.username, name)
                            .await
                    }
                    Err(e) => Err(e),
                }
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
                self.api.declare_exchange(vhost, &params).await
            }
            Change::CreateQueue(queue) => {
                self.api
                    .declare_queue(vhost, &QueueParams::new_quorum_queue(&queue.name, None))
                    .await
            }
            Change::CreateBinding(b) => {
                self.api
                    .bind_queue(vhost, &b.queue, &b.exchange, Some(&b.routing_key), None)
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
                self.api.declare_policy(&params).await
            }
        };
        result.map_err(|e| self.error(&change.to_string(), e))
    }

    pub async fn delete_binding(&self, vhost: &str, b: &Binding) -> Result<(), TopologyError> {
        self.count_write();
        let params = BindingDeletionParams {
            virtual_host: vhost,
            source: &b.exchange,
            destination: &b.queue,
            destination_type: BindingDestinationType::Queue,
            routing_key: &b.routing_key,
            arguments: None,
        };
        match self.api.delete_binding(&params, true).await {
            Err(e) if !e.is_not_found() => {
                Err(self.error(&format!("delete binding {} -> {}", b.exchange, b.queue), e))
            }
            _ => Ok(()),
        }
    }

    pub async fn delete_exchange(&self, vhost: &str, name: &str) -> Result<(), TopologyError> {
        self.count_write();
        self.api
            .delete_exchange(vhost, name, true)
            .await
            .map_err(|e| self.error(&format!("delete exchange {name}"), e))
    }

    pub async fn delete_queue(&self, vhost: &str, name: &str) -> Result<(), TopologyError> {
        self.count_write();
        self.api
            .delete_queue(vhost, name, true)
            .await
            .map_err(|e| self.error(&format!("delete queue {name}"), e))
    }

    pub async fn delete_policy(&self, vhost: &str, name: &str) -> Result<(), TopologyError> {
        self.count_write();
        self.api
            .delete_policy(vhost, name, true)
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
        match self.api.get_queue_info(vhost, name).await {
            Ok(q) => Ok(Some(QueueDepth {
                messages: q.message_count,
                unacknowledged: q.unacknowledged_message_count,
                consumers: u32::from(q.consumer_count),
            })),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(self.error(&format!("read queue {name}"), e)),
        }
    }
}

/// A queue's load as the management API last counted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueDepth {
    pub messages: u64,
    pub unacknowledged: u64,
    pub consumers: u32,
}

fn policy_target_name(target: &PolicyTarget) -> &'static str {
    match target {
        PolicyTarget::Queues => "queues",
        PolicyTarget::ClassicQueues => "classic_queues",
        PolicyTarget::QuorumQueues => "quorum_queues",
        PolicyTarget::Streams => "streams",
        PolicyTarget::Exchanges => "exchanges",
        PolicyTarget::All => "all",
    }
}

impl TopologyError {
    fn from_http(endpoint: &ManagementEndpoint, action: &str, e: HttpClientError) -> Self {
        match e {
            HttpClientError::RequestError { error, .. } => {
                let reason = if error.is_timeout() {
                    "it did not answer in time".to_string()
                } else if error.is_connect() {
                    "the connection was refused or failed".to_string()
                } else {
                    error.to_string()
                };
                TopologyError::Unreachable {
                    endpoint: endpoint.to_string(),
                    reason,
                }
            }
            HttpClientError::ClientErrorResponse { status_code, .. }
                if status_code.as_u16() == 401 =>
            {
                TopologyError::Unauthorized {
                    endpoint: endpoint.to_string(),
                    user: endpoint.username.clone(),
                }
            }
            HttpClientError::ClientErrorResponse { status_code, .. }
                if status_code.as_u16() == 403 =>
            {
                TopologyError::Forbidden {
                    endpoint: endpoint.to_string(),
                    user: endpoint.username.clone(),
                    action: action.to_string(),
                }
            }
            HttpClientError::ClientErrorResponse {
                status_code,
                error_details,
                body,
                ..
            }
            | HttpClientError::ServerErrorResponse {
                status_code,
                error_details,
                body,
                ..
            } => {
                let reason = error_details
                    .as_ref()
                    .and_then(|d| d.reason().map(str::to_string))
                    .or(body)
                    .unwrap_or_default();
                TopologyError::Refused {
                    action: action.to_string(),
                    status: status_code.as_u16(),
                    reason,
                }
            }
            other => TopologyError::Refused {
                action: action.to_string(),
                status: 0,
                reason: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_keeps_credentials_out_of_its_url_and_its_display() {
        let e = ManagementEndpoint::parse("http://guest:s3cret@localhost:15672").unwrap();
        assert_eq!(e.api.as_str(), "http://localhost:15672/api");
        assert_eq!(e.username, "guest");
        assert_eq!(e.password(), "s3cret");
        assert_eq!(e.to_string(), "http://guest:***@localhost:15672/api");
        assert!(!format!("{e:?}").contains("s3cret"));
    }

    #[test]
    fn an_api_path_is_kept() {
        let e = ManagementEndpoint::with_credentials("https://rmq.example/rabbit/api/", "u", "p")
            .unwrap();
        assert_eq!(e.api.as_str(), "https://rmq.example/rabbit/api");
        assert!(e.is_tls());
    }

    #[test]
    fn bad_endpoints_say_what_to_write_without_the_password() {
        for url in [
            "localhost:15672",
            "amqp://u:hunter2@h:5672",
            "http://localhost:15672",
            "http://u:hunter2@[::1",
        ] {
            let err = ManagementEndpoint::parse(url).unwrap_err().to_string();
            assert!(
                err.contains("http://USER:PASSWORD@HOST:15672")
                    || err.contains("must start with http"),
                "{err}"
            );
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
