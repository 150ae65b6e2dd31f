//! The private broker node a fault run disturbs (`.ci/rabbitmq-node.sh`), and a pipeline
//! in a vhost of its own on a broker: that node, or the cluster's front
//! ([`super::cluster`]).

use std::process::Command;
use std::sync::OnceLock;

use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::AMQPValue;
use lapin::{Connection, ConnectionProperties};
use mailer::topology::{BrokerCapabilities, Management, ManagementEndpoint, Topology};

/// The node `MAILER_FAULT_BROKER` (3.10 or 4.0) names.
pub struct Node {
    pub version: &'static str,
    pub amqp_port: u16,
    pub management_port: u16,
}

impl Node {
    pub fn get() -> &'static Node {
        static NODE: OnceLock<Node> = OnceLock::new();
        NODE.get_or_init(|| {
            let node = match std::env::var("MAILER_FAULT_BROKER").as_deref() {
                Ok("3.10") => Node {
                    version: "3.10",
                    amqp_port: 5682,
                    management_port: 15682,
                },
                Ok("4.0") => Node {
                    version: "4.0",
                    amqp_port: 5683,
                    management_port: 15683,
                },
                other => panic!(
                    "MAILER_FAULT_BROKER={other:?}: set 3.10 or 4.0 and start the node with .ci/rabbitmq-node.sh start VERSION (make faults does)"
                ),
            };
            let overview = node.ctl(&["status"]);
            assert!(
                overview.contains(&format!("RabbitMQ version: {}", node.version)),
                "the private node is not RabbitMQ {}: {overview}",
                node.version
            );
            node
        })
    }

    /// `rabbitmqctl ARGS` against the node; its output.
    pub fn ctl(&self, args: &[&str]) -> String {
        let script = mailer_testkit::repo_root().join(".ci/rabbitmq-node.sh");
        let output = Command::new(script)
            .arg("ctl")
            .arg(self.version)
            .args(args)
            .output()
            .expect("run .ci/rabbitmq-node.sh");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "rabbitmqctl {args:?}: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        text
    }

    pub fn management(&self) -> Management {
        self.broker().management()
    }

    pub fn capabilities(&self) -> BrokerCapabilities {
        if self.version == "3.10" {
            BrokerCapabilities::RABBITMQ_3
        } else {
            BrokerCapabilities::RABBITMQ_4
        }
    }

    /// The node as the broker of a pipeline.
    pub fn broker(&self) -> Broker {
        Broker {
            label: self.version.to_string(),
            amqp: format!("127.0.0.1:{}", self.amqp_port),
            management: format!("127.0.0.1:{}", self.management_port),
            capabilities: self.capabilities(),
        }
    }
}

/// Where a pipeline's broker answers, guest/guest: a node, or a front of several.
#[derive(Debug, Clone)]
pub struct Broker {
    /// What the fault table calls it (its broker column).
    pub label: String,
    /// `host:port` of AMQP.
    pub amqp: String,
    /// `host:port` of the management API.
    pub management: String,
    pub capabilities: BrokerCapabilities,
}

impl Broker {
    pub fn management(&self) -> Management {
        let url = format!("http://guest:guest@{}", self.management);
        Management::new(&ManagementEndpoint::parse(&url).expect("endpoint")).expect("client")
    }
}

/// Undoes a fault when dropped, so a failing test leaves the node as it found it.
pub struct Undo(pub &'static [&'static str]);

impl Drop for Undo {
    fn drop(&mut self) {
        Node::get().ctl(self.0);
    }
}

/// A pipeline in a fresh vhost of a broker, deleted when dropped.
pub struct Pipeline {
    pub vhost: String,
    pub topology: String,
    pub broker: Broker,
}

impl Pipeline {
    /// On the private node: applies the default topology with a retry delay of 1s (unless
    /// `topology` sets one) and `topology` on top.
    pub async fn new(fault: &str, topology: &str) -> Self {
        Self::on(Node::get().broker(), fault, topology).await
    }

    /// The same on `broker`.
    pub async fn on(broker: Broker, fault: &str, topology: &str) -> Self {
        let pipeline = Self {
            vhost: format!("mailer-fault-{fault}-{}", std::process::id()),
            topology: topology.to_string(),
            broker,
        };
        pipeline.apply().await;
        pipeline
    }

    /// Applies (or repairs) the pipeline's topology.
    pub async fn apply(&self) {
        let mut fields = Vec::new();
        if !self.topology.contains("retryDelay:") {
            fields.push("retryDelay: 1s");
        }
        if !self.topology.is_empty() {
            fields.push(&self.topology);
        }
        let spec: mailer::spec::MailerPipelineSpec = serde_yaml::from_str(&format!(
            "rabbitmq: {{vhost: {}}}\ntopology: {{{}}}",
            self.vhost,
            fields.join(", ")
        ))
        .expect("a valid pipeline");
        let desired = Topology::desired(
            &spec.rabbitmq.vhost,
            &spec.topology,
            self.broker.capabilities,
        )
        .expect("a topology");
        mailer::topology::apply(&self.broker.management(), &desired)
            .await
            .expect("apply the topology");
    }

    pub fn amqp_url(&self) -> String {
        let base = format!("amqp://guest:guest@{}", self.broker.amqp);
        mailer::amqp::address::with_vhost(&base, &self.vhost).expect("AMQP URL")
    }

    pub async fn connect(&self) -> Connection {
        Connection::connect(&self.amqp_url(), ConnectionProperties::default())
            .await
            .expect("connect to the broker")
    }

    pub async fn delete_queue(&self, queue: &str) {
        let connection = self.connect().await;
        let channel = connection.create_channel().await.expect("channel");
        channel
            .queue_delete(queue.into(), Default::default())
            .await
            .expect("delete the queue");
        let _ = connection.close(200, "deleted".into()).await;
    }

    /// Declares `queue` and binds it to the retry exchange beside the delay queue, so it
    /// gets a copy of every park.
    pub async fn copy_parks_to(&self, queue: &str) {
        let connection = self.connect().await;
        let channel = connection.create_channel().await.expect("channel");
        channel
            .queue_declare(queue.into(), Default::default(), Default::default())
            .await
            .expect("declare the copy queue");
        channel
            .queue_bind(
                queue.into(),
                "mail.retry".into(),
                "mail.send".into(),
                Default::default(),
                Default::default(),
            )
            .await
            .expect("bind it to the retry exchange");
        let _ = connection.close(200, "bound".into()).await;
    }

    /// Takes every message of `queue`: its message id and its `x-mail-attempt`.
    pub async fn take_attempts(&self, queue: &str) -> Vec<(String, Option<i64>)> {
        self.take(queue, |headers| {
            match headers?.inner().get("x-mail-attempt")? {
                AMQPValue::LongLongInt(n) => Some(*n),
                _ => None,
            }
        })
        .await
    }

    /// Takes every message of `queue`: its message id and why it died, if it did.
    pub async fn take_all(&self, queue: &str) -> Vec<(String, Option<String>)> {
        self.take(queue, dead_reason).await
    }

    /// Takes every message of `queue`: its message id and what `read` makes of its
    /// headers.
    async fn take<T>(
        &self,
        queue: &str,
        read: impl Fn(Option<&lapin::types::FieldTable>) -> T,
    ) -> Vec<(String, T)> {
        let connection = self.connect().await;
        let channel = connection.create_channel().await.expect("channel");
        let mut taken = Vec::new();
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        if channel
            .queue_declare(queue.into(), passive, Default::default())
            .await
            .is_err()
        {
            return taken;
        }
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .expect("basic.get")
        {
            let properties = &message.delivery.properties;
            let id = properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default();
            taken.push((id, read(properties.headers().as_ref())));
            message
                .delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack");
        }
        let _ = connection.close(200, "taken".into()).await;
        taken
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let vhost = self.vhost.clone();
        let api = format!("http://{}/api", self.broker.management);
        let _ = mailer_testkit::run_apart(move || async move {
            let client = rabbitmq_http_client::api::Client::new(&api, "guest", "guest");
            let _ = client.delete_vhost(&vhost, true).await;
        });
    }
}

/// Why a dead letter died: the worker's `x-mail-dead-reason`, else the broker's own,
/// from the newest `x-death` entry.
fn dead_reason(headers: Option<&lapin::types::FieldTable>) -> Option<String> {
    let headers = headers?.inner();
    let text = |value: &AMQPValue| match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    };
    if let Some(reason) = headers.get("x-mail-dead-reason").and_then(text) {
        return Some(reason);
    }
    match headers.get("x-death")? {
        AMQPValue::FieldArray(deaths) => match deaths.as_slice().first()? {
            AMQPValue::FieldTable(death) => death.inner().get("reason").and_then(text),
            _ => None,
        },
        _ => None,
    }
}
