//! The real RabbitMQ every integration test talks to, and a vhost of its own per test.
//!
//! `MAILER_TEST_BROKER` selects the broker: `3.10` (the default: the host's, AMQP 5672,
//! management 15672) or `4.0` (started by `.ci/rabbitmq4.sh`: AMQP 5673, management
//! 15673). Both use guest/guest from localhost. The first use checks that the broker
//! answering is the version asked for, so a run can never pass on the wrong broker.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use mailer::topology::{Management, ManagementEndpoint};

/// The broker the tests run against.
pub struct TestBroker {
    /// The major.minor version asked for, e.g. `4.0`.
    pub version: &'static str,
    pub amqp_port: u16,
    pub management_port: u16,
}

impl TestBroker {
    /// The broker `MAILER_TEST_BROKER` names.
    pub fn get() -> &'static TestBroker {
        static BROKER: OnceLock<TestBroker> = OnceLock::new();
        BROKER.get_or_init(|| {
            let asked = std::env::var("MAILER_TEST_BROKER").unwrap_or_default();
            let broker = match asked.as_str() {
                "" | "3.10" => TestBroker {
                    version: "3.10",
                    amqp_port: 5672,
                    management_port: 15672,
                },
                "4.0" => TestBroker {
                    version: "4.0",
                    amqp_port: 5673,
                    management_port: 15673,
                },
                other => panic!("MAILER_TEST_BROKER={other:?}: use 3.10 or 4.0"),
            };
            broker.check_version();
            broker
        })
    }

    /// Whether the broker is RabbitMQ 4 or later (a default delivery limit of 20 on
    /// quorum queues, `x-first-death-reason` kept from the first death, ...).
    pub fn is_4x(&self) -> bool {
        !self.version.starts_with("3.")
    }

    /// The capabilities the desired topology is built for on this broker.
    pub fn capabilities(&self) -> mailer::topology::BrokerCapabilities {
        if self.is_4x() {
            mailer::topology::BrokerCapabilities::RABBITMQ_4
        } else {
            mailer::topology::BrokerCapabilities::RABBITMQ_3
        }
    }

    /// Fails loudly when the broker on the ports is not the version asked for.
    fn check_version(&self) {
        let api = format!("http://127.0.0.1:{}/api", self.management_port);
        let found = crate::run_apart(move || async move {
            mailer::install_crypto_provider();
            let client = rabbitmq_http_client::api::Client::new(&api, "guest", "guest");
            client
                .overview()
                .await
                .map(|o| o.rabbitmq_version)
                .map_err(|e| e.to_string())
        })
        .expect("version check");
        match found {
            Ok(version) => assert!(
                version.starts_with(&format!("{}.", self.version)),
                "MAILER_TEST_BROKER={} but the broker on port {} is RabbitMQ {version}",
                self.version,
                self.management_port
            ),
            Err(e) => panic!(
                "RabbitMQ {} does not answer on management port {}: {e}; start it (.ci/run does; for 4.0: .ci/rabbitmq4.sh start)",
                self.version, self.management_port
            ),
        }
    }
}

/// The management API with guest's credentials, e.g. `http://guest:guest@127.0.0.1:15672`.
pub fn management_url() -> String {
    format!("http://guest:guest@{}", management_host())
}

/// `127.0.0.1:<management port>`.
pub fn management_host() -> String {
    format!("127.0.0.1:{}", TestBroker::get().management_port)
}

/// The broker over AMQP with guest's credentials, without a vhost.
pub fn amqp_base() -> String {
    format!(
        "amqp://guest:guest@127.0.0.1:{}",
        TestBroker::get().amqp_port
    )
}

/// A vhost made for one test, deleted when the value is dropped, so runs never see each
/// other's state.
pub struct TestVhost {
    pub name: String,
}

impl TestVhost {
    /// A fresh, not yet created vhost name; `apply` creates it.
    pub fn fresh(test: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("mailer-test-{test}-{}-{n}", std::process::id());
        let vhost = Self { name };
        vhost.delete_now();
        vhost
    }

    /// A fresh vhost that exists, with guest given full permissions on it.
    pub async fn created(test: &str) -> Self {
        let vhost = Self::fresh(test);
        let api = raw_api();
        api.create_vhost(&rabbitmq_http_client::requests::VirtualHostParams {
            name: &vhost.name,
            description: None,
            tags: None,
            default_queue_type: None,
            tracing: false,
        })
        .await
        .expect("create the test vhost");
        api.grant_full_permissions("guest", &vhost.name)
            .await
            .expect("grant guest permissions");
        vhost
    }

    pub fn amqp_url(&self) -> String {
        mailer::amqp::address::with_vhost(&amqp_base(), &self.name).expect("AMQP URL")
    }

    pub async fn connect(&self) -> Connection {
        Connection::connect(&self.amqp_url(), ConnectionProperties::default())
            .await
            .expect("connect over AMQP")
    }

    fn delete_now(&self) {
        let name = self.name.clone();
        // Drop cannot be async: delete on a runtime of its own, on a thread of its own.
        let _ = crate::run_apart(move || async move {
            let api = raw_api();
            // The operator's owner markers of the vhost's objects are global
            // parameters (see mailer::topology::ownership): they go with it.
            let legacy = format!("mailer-owner|topology|{name}|");
            for parameter in api
                .list_global_runtime_parameters()
                .await
                .unwrap_or_default()
            {
                let value = serde_json::Value::from(parameter.value);
                let of_vhost = mailer::topology::ownership::marked_claims(&parameter.name, &value)
                    .iter()
                    .any(|claim| claim.vhost() == Some(name.as_str()));
                if of_vhost || parameter.name.starts_with(&legacy) {
                    let _ = api.clear_global_runtime_parameter(&parameter.name).await;
                }
            }
            api.delete_vhost(&name, true).await.is_ok()
        });
    }
}

impl Drop for TestVhost {
    fn drop(&mut self) {
        self.delete_now();
    }
}

/// A fresh vhost with the default topology applied, a retry delay of 1s, and `topology`
/// (YAML flow mappings, e.g. `retryQueueMaxLength: 2`) on top.
pub async fn pipeline(test: &str, topology: &str) -> TestVhost {
    let extra = if topology.is_empty() {
        String::new()
    } else {
        format!(", {topology}")
    };
    pipeline_of(test, &format!("retryDelay: 1s{extra}")).await.0
}

/// A fresh vhost with the topology of `topology` (the inside of a YAML flow mapping, e.g.
/// `retryDelays: [1s, 2s]`) applied, and the pipeline's spec.
pub async fn pipeline_of(
    test: &str,
    topology: &str,
) -> (TestVhost, mailer::spec::MailerPipelineSpec) {
    let vhost = TestVhost::fresh(test);
    let spec = spec_in(&vhost, topology);
    apply_topology(&spec).await;
    (vhost, spec)
}

/// The spec of a pipeline in `vhost` with `topology` (as [`pipeline_of`]'s).
pub fn spec_in(vhost: &TestVhost, topology: &str) -> mailer::spec::MailerPipelineSpec {
    let spec: mailer::spec::MailerPipelineSpec = serde_yaml::from_str(&format!(
        "rabbitmq: {{vhost: {}}}\ntopology: {{{topology}}}",
        vhost.name
    ))
    .expect("a valid pipeline");
    spec.validate().expect("a valid pipeline");
    spec
}

/// Applies `spec`'s topology, as `mailer topology apply` does before it removes former
/// tiers.
pub async fn apply_topology(spec: &mailer::spec::MailerPipelineSpec) {
    let capabilities = TestBroker::get().capabilities();
    mailer::topology::apply(
        &management(),
        &mailer::topology::Topology::desired(&spec.rabbitmq.vhost, &spec.topology, capabilities)
            .expect("a topology"),
    )
    .await
    .expect("topology");
}

pub fn management() -> Management {
    Management::new(&ManagementEndpoint::parse(&management_url()).expect("endpoint"))
        .expect("client")
}

fn raw_api_base() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| format!("http://{}/api", management_host()))
}

/// The management API without any of the mailer's code in between, to check what the
/// broker really holds.
/// Who owns `claim` as the operator reads the markers (either format), as JSON: the
/// owner's `cluster`, `namespace`, `name`, `uid` and `retained`.
pub async fn owner_of(claim: &mailer::topology::ownership::Claim) -> Option<serde_json::Value> {
    let markers = management().markers().await.expect("read the markers");
    markers
        .owner(claim)
        .map(|owner| serde_json::to_value(owner).expect("an owner as JSON"))
}

pub fn raw_api() -> rabbitmq_http_client::api::Client<&'static str, &'static str, &'static str> {
    mailer::install_crypto_provider();
    rabbitmq_http_client::api::Client::new(raw_api_base(), "guest", "guest")
}

/// A channel with publisher confirms on.
pub async fn confirming_channel(connection: &Connection) -> Channel {
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    channel
}

/// Publishes and waits for the broker's confirm.
pub async fn publish(
    channel: &Channel,
    exchange: &str,
    key: &str,
    body: &[u8],
    properties: BasicProperties,
) {
    let confirm = channel
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            body,
            properties,
        )
        .await
        .expect("publish");
    let confirmation = confirm.await.expect("confirm");
    assert!(
        confirmation.is_ack(),
        "the broker did not ack the publish to {exchange}: {confirmation:?}"
    );
    assert!(
        confirmation.take_message().is_none(),
        "the publish to {exchange} was returned as unroutable"
    );
}

/// Polls `queue` with basic.get until a message arrives or `within` passes.
pub async fn get_within(
    channel: &Channel,
    queue: &str,
    within: Duration,
) -> Option<lapin::message::BasicGetMessage> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .expect("basic.get")
        {
            return Some(message);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Messages in `queue` this instant (a passive declare, not the management API's lagging
/// statistics), or `None` when it does not exist.
pub async fn live_count(connection: &Connection, queue: &str) -> Option<u32> {
    let channel = connection.create_channel().await.expect("channel");
    message_count(&channel, queue).await.ok()
}

/// Messages in `queue` this instant, through a passive declare on `channel` (which the
/// broker closes when the queue does not exist).
pub async fn message_count(channel: &Channel, queue: &str) -> Result<u32, lapin::Error> {
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await?;
    Ok(declared.message_count())
}

pub fn no_args() -> FieldTable {
    FieldTable::default()
}

/// Removes the `mail.retry` -> `mail.send.retry` binding by hand, as an operator might.
pub async fn remove_retry_binding(vhost: &TestVhost) {
    let binding = mailer::topology::desired::Binding {
        exchange: "mail.retry".into(),
        queue: "mail.send.retry".into(),
        routing_key: "mail.send".into(),
    };
    management()
        .delete_binding(&vhost.name, &binding)
        .await
        .expect("remove the binding");
}

/// A header's value as text, when it is a string.
pub fn text(value: Option<&lapin::types::AMQPValue>) -> Option<String> {
    match value? {
        lapin::types::AMQPValue::LongString(s) => {
            Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        lapin::types::AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}
