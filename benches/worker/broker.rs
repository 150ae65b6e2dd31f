//! The real RabbitMQ at 127.0.0.1: a fresh vhost per scenario with the pipeline's
//! topology applied, filling the send queue, and the two bare loops the worker is
//! compared with.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use mailer::spec::{MailerPipelineSpec, TopologySpec};
use mailer::topology::{self, Management, ManagementEndpoint, Topology};

/// The broker's AMQP and management ports: `MAILER_BENCH_BROKER` is `3.10` (5672 and
/// 15672, the default), `4.0` (5673 and 15673, `.ci/rabbitmq4.sh start`) or `cluster`
/// (the HAProxy front of the three-node 4.0 cluster of `.ci/rabbitmq-cluster.sh start`,
/// whose ports the script prints; 0 when it is not running, which the first request
/// reports).
pub fn ports() -> (u16, u16) {
    match std::env::var("MAILER_BENCH_BROKER").as_deref() {
        Ok("4.0") => (5673, 15673),
        Ok("cluster") => cluster_ports(),
        _ => (5672, 15672),
    }
}

/// The cluster front's AMQP and management ports, asked of the script once.
fn cluster_ports() -> (u16, u16) {
    static PORTS: std::sync::OnceLock<(u16, u16)> = std::sync::OnceLock::new();
    *PORTS.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/rabbitmq-cluster.sh");
        let printed = std::process::Command::new(script)
            .arg("ports")
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        let mut ports = printed.split_whitespace().map(|p| p.parse().unwrap_or(0));
        (ports.next().unwrap_or(0), ports.next().unwrap_or(0))
    })
}

fn management_url() -> String {
    format!("http://guest:guest@127.0.0.1:{}", ports().1)
}

fn management_api() -> String {
    format!("http://127.0.0.1:{}/api", ports().1)
}

fn amqp_base() -> String {
    format!("amqp://guest:guest@127.0.0.1:{}", ports().0)
}
pub const USER: &str = "guest";
/// The worker's default prefetch, used by the worker and by both bare loops.
pub const PREFETCH: u16 = mailer::mail::DEFAULT_PREFETCH;
/// Publishes awaiting their confirm while the send queue is filled.
const PRELOAD_WINDOW: usize = 512;

/// The management API without the mailer in between, to create and delete vhosts.
pub fn raw_api() -> rabbitmq_http_client::api::Client<String, &'static str, &'static str> {
    mailer::install_crypto_provider();
    rabbitmq_http_client::api::Client::new(management_api(), USER, "guest")
}

/// The broker's version, or why it cannot be reached.
pub async fn broker_version() -> Result<String> {
    let overview = raw_api().overview().await.with_context(|| {
        format!(
            "the RabbitMQ management API at {} does not answer (guest/guest)",
            management_api()
        )
    })?;
    Ok(overview.rabbitmq_version)
}

/// A vhost made for one scenario, holding the pipeline's topology (quorum queues, a
/// retry delay of one hour so parked requests stay parked), deleted when dropped.
pub struct BenchVhost {
    pub name: String,
    pub topology: TopologySpec,
}

impl BenchVhost {
    pub async fn create(scenario: &str) -> Result<Self> {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let name = format!("mailer-bench-{scenario}-{}-{millis}", std::process::id());
        let mut spec = MailerPipelineSpec::default();
        spec.rabbitmq.vhost = name.clone();
        spec.topology.retry_delay = Some("1h".into());
        spec.worker.prefetch = PREFETCH;
        let management = Management::new(&ManagementEndpoint::parse(&management_url())?)?;
        let desired = Topology::desired(
            &spec.rabbitmq.vhost,
            &spec.topology,
            management.capabilities().await?,
        )?;
        let vhost = Self {
            name,
            topology: spec.topology.clone(),
        };
        topology::apply(&management, &desired)
            .await
            .with_context(|| format!("apply the topology in vhost {}", vhost.name))?;
        Ok(vhost)
    }

    pub fn amqp_url(&self) -> String {
        mailer::amqp::address::with_vhost(&amqp_base(), &self.name).expect("an AMQP URL")
    }

    pub async fn connect(&self) -> Result<Connection> {
        Connection::connect(&self.amqp_url(), ConnectionProperties::default())
            .await
            .with_context(|| format!("connect to vhost {} over AMQP", self.name))
    }

    /// Publishes `n` copies of `body` to the pipeline's exchange, each with a message id
    /// of its own, mandatory and confirmed, and checks they all landed in the queue.
    pub async fn fill(&self, connection: &Connection, n: usize, body: &[u8]) -> Result<()> {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let mut pending = std::collections::VecDeque::with_capacity(PRELOAD_WINDOW);
        for i in 0..n {
            let properties = BasicProperties::default()
                .with_content_type(mailer::mail::REQUEST_CONTENT_TYPE.into())
                .with_message_id(format!("bench-{i}").into())
                .with_delivery_mode(2);
            let confirm = channel
                .basic_publish(
                    self.topology.exchange.as_str().into(),
                    self.topology.queue.as_str().into(),
                    options,
                    body,
                    properties,
                )
                .await?;
            pending.push_back(confirm);
            if pending.len() >= PRELOAD_WINDOW {
                confirmed(pending.pop_front().expect("a pending publish").await?)?;
            }
        }
        for confirm in pending {
            confirmed(confirm.await?)?;
        }
        let _ = channel.close(200, "filled".into()).await;
        let ready = self.ready(connection, &self.topology.queue).await?;
        ensure!(
            ready as usize == n,
            "{} holds {ready} requests after publishing {n}",
            self.topology.queue
        );
        Ok(())
    }

    /// Messages ready in `queue` right now (a passive declare, not the lagging statistics).
    pub async fn ready(&self, connection: &Connection, queue: &str) -> Result<u32> {
        let channel = connection.create_channel().await?;
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await?;
        let _ = channel.close(200, "counted".into()).await;
        Ok(declared.message_count())
    }

    /// Empties `queue` (the parked requests of a park run), returning how many it held.
    pub async fn purge(&self, connection: &Connection, queue: &str) -> Result<u32> {
        let channel = connection.create_channel().await?;
        let purged = channel
            .queue_purge(queue.into(), QueuePurgeOptions::default())
            .await?;
        let _ = channel.close(200, "purged".into()).await;
        Ok(purged)
    }
}

impl Drop for BenchVhost {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop cannot be async: delete on a runtime of its own, on a thread of its own.
        let deleted = mailer_testkit::run_apart(move || async move {
            raw_api().delete_vhost(&name, true).await.is_ok()
        });
        if !matches!(deleted, Ok(true)) {
            eprintln!("warning: could not delete vhost {}", self.name);
        }
    }
}

fn confirmed(confirmation: lapin::Confirmation) -> Result<()> {
    ensure!(confirmation.is_ack(), "the broker nacked a publish");
    ensure!(
        confirmation.take_message().is_none(),
        "a publish was returned as unroutable"
    );
    Ok(())
}

/// A consuming channel at the worker's prefetch, and its consumer.
async fn consume(connection: &Connection, queue: &str) -> Result<(Channel, lapin::Consumer)> {
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((channel, consumer))
}

async fn next_delivery(consumer: &mut lapin::Consumer) -> Result<Delivery> {
    match consumer.next().await {
        Some(delivery) => Ok(delivery?),
        None => bail!("the consumer was cancelled"),
    }
}

async fn stop(channel: Channel, consumer: lapin::Consumer, connection: Connection) {
    let _ = channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await;
    let _ = channel.close(200, "done".into()).await;
    let _ = connection.close(200, "done".into()).await;
}

/// The broker's own limit on the ack path: consume `n` deliveries at the worker's
/// prefetch and ack each one, with up to a prefetch's worth of acks under way (as the
/// worker, which acks each delivery from the task that processed it). Timed from
/// consume-ok to the last ack.
pub async fn bare_ack(vhost: &BenchVhost, n: usize) -> Result<Duration> {
    let connection = vhost.connect().await?;
    let (channel, mut consumer) = consume(&connection, &vhost.topology.queue).await?;
    let started = Instant::now();
    let mut acks = FuturesUnordered::new();
    let (mut received, mut acked) = (0, 0);
    while acked < n {
        tokio::select! {
            Some(done) = acks.next() => {
                done?;
                acked += 1;
            }
            delivery = next_delivery(&mut consumer), if received < n => {
                let delivery = delivery?;
                received += 1;
                acks.push(async move { delivery.acker.ack(BasicAckOptions::default()).await });
            }
        }
    }
    let took = started.elapsed();
    stop(channel, consumer, connection).await;
    Ok(took)
}

/// The broker's own limit on the park path: consume `n` deliveries at the worker's
/// prefetch; for each, publish it to the retry exchange (mandatory, on a confirming
/// channel), wait for the confirm, then ack it; up to a prefetch's worth at once.
pub async fn bare_park(vhost: &BenchVhost, n: usize) -> Result<Duration> {
    let connection = vhost.connect().await?;
    let publish = connection.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let (channel, mut consumer) = consume(&connection, &vhost.topology.queue).await?;
    let exchange = vhost.topology.retry_exchange.as_str();
    let key = vhost.topology.queue.as_str();
    let started = Instant::now();
    let mut parks = FuturesUnordered::new();
    let (mut received, mut parked) = (0, 0);
    while parked < n {
        tokio::select! {
            Some(done) = parks.next() => {
                done?;
                parked += 1;
            }
            delivery = next_delivery(&mut consumer), if received < n => {
                let delivery = delivery?;
                received += 1;
                parks.push(park_one(&publish, exchange, key, delivery));
            }
        }
    }
    let took = started.elapsed();
    stop(channel, consumer, connection).await;
    Ok(took)
}

async fn park_one(publish: &Channel, exchange: &str, key: &str, delivery: Delivery) -> Result<()> {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    headers.insert("x-mail-attempt".into(), AMQPValue::LongLongInt(2));
    let properties = delivery
        .properties
        .clone()
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_user_id(USER.into());
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let confirmation = publish
        .basic_publish(
            exchange.into(),
            key.into(),
            options,
            &delivery.data,
            properties,
        )
        .await?
        .await?;
    confirmed(confirmation)?;
    delivery.acker.ack(BasicAckOptions::default()).await?;
    Ok(())
}
