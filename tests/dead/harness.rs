//! A pipeline in a vhost of its own, its file for `mailer dead -f`, and the ways its dead
//! letters are made: by the real worker, by the broker, or published as the worker would.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use mailer::spec::MailerPipelineSpec;
use mailer::topology::{self, Topology};
use serde_json::{Value, json};

use mailer_testkit::broker::{
    TestBroker, TestVhost, amqp_base, confirming_channel, management, management_url, publish,
};
use mailer_testkit::process::{eventually, exit_within, start_worker, stop_worker};
use mailer_testkit::smtp::{SmtpServer, TempDir, closed_port};

pub const DEAD_QUEUE: &str = "mail.send.dead";
pub const SEND_QUEUE: &str = "mail.send";

/// A pipeline's topology (a retry delay of 1s) in a fresh vhost, and a channel to it.
pub struct Pipeline {
    pub vhost: TestVhost,
    pub spec: MailerPipelineSpec,
    pub file: PathBuf,
    _dir: TempDir,
    _connection: Connection,
    pub channel: Channel,
}

impl Pipeline {
    pub async fn new(test: &str) -> Self {
        let vhost = TestVhost::fresh(test);
        let spec: MailerPipelineSpec = serde_yaml::from_str(&format!(
            "rabbitmq: {{vhost: {}}}\ntopology: {{retryDelay: 1s}}",
            vhost.name
        ))
        .unwrap();
        let dir = TempDir::new("dead");
        let file = dir.0.join("pipeline.yaml");
        std::fs::write(
            &file,
            format!(
                "apiVersion: mailer.dev/v1alpha1\nkind: MailerPipeline\nmetadata: {{name: {test}}}\nspec:\n  rabbitmq: {{vhost: {}}}\n  topology: {{retryDelay: 1s}}\n",
                vhost.name
            ),
        )
        .unwrap();
        assert!(Self::apply_topology(&spec).await, "topology applied");
        let connection = vhost.connect().await;
        let channel = confirming_channel(&connection).await;
        Self {
            vhost,
            spec,
            file,
            _dir: dir,
            _connection: connection,
            channel,
        }
    }

    async fn apply_topology(spec: &MailerPipelineSpec) -> bool {
        let desired = Topology::desired(
            &spec.rabbitmq.vhost,
            &spec.topology,
            TestBroker::get().capabilities(),
        )
        .unwrap();
        topology::apply(&management(), &desired).await.is_ok()
    }

    /// Puts back whatever was changed by hand (e.g. a removed binding).
    pub async fn repair(&self) {
        assert!(Self::apply_topology(&self.spec).await, "topology repaired");
    }

    /// `mailer dead ARGS -f FILE`, with an AMQP URL that names no vhost (the file's is
    /// used): its exit code, standard output and standard error.
    pub fn dead(&self, args: &[&str]) -> (i32, String, String) {
        let output = self.dead_command(args).output().unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// `mailer dead ARGS -f FILE`, not started yet. The management API is the test
    /// broker's: the one beside the 4.0 broker's AMQP port would be the 3.10 broker's.
    pub fn dead_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mailer"));
        command
            .arg("dead")
            .args(args)
            .arg("-f")
            .arg(&self.file)
            .env("MAIL_AMQP_URL", amqp_base())
            .env("RABBITMQ_MANAGEMENT_URL", management_url())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        command
    }

    /// The message ids `mailer dead list --output json` prints, in order; asserts it
    /// succeeded and warned of nothing.
    pub fn listed(&self, args: &[&str]) -> Vec<String> {
        let (code, out, err) = self.dead(&[&["list", "--output", "json"], args].concat());
        assert_eq!(code, 0, "{err}");
        assert!(err.is_empty(), "no warning expected: {err}");
        json_lines(&out)
            .iter()
            .map(|line| line["message_id"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Messages ready in `queue` this instant (a passive declare).
    pub async fn ready(&self, queue: &str) -> u32 {
        self.declare_passive(queue).await.message_count()
    }

    /// Consumers of `queue` this instant.
    pub async fn consumers(&self, queue: &str) -> u32 {
        self.declare_passive(queue).await.consumer_count()
    }

    async fn declare_passive(&self, queue: &str) -> lapin::Queue {
        let options = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        self.channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await
            .expect("passive declare")
    }

    /// Waits until `queue` holds `n` ready messages.
    pub async fn wait_for(&self, queue: &str, n: u32) {
        eventually(60, &format!("{n} messages in {queue}"), || async {
            (self.ready(queue).await == n).then_some(())
        })
        .await;
    }

    /// Publishes a request to the pipeline's exchange.
    pub async fn send(&self, id: &str, body: &[u8], headers: FieldTable) {
        publish(
            &self.channel,
            "mail",
            SEND_QUEUE,
            body,
            properties(id, headers),
        )
        .await;
    }

    /// Publishes a dead letter as the worker makes one, to the dead exchange.
    pub async fn publish_dead(&self, id: &str, reason: &str, to: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let headers = headers(&[
            ("traceparent", string("00-abc-def-01")),
            ("x-mail-dead-reason", string(reason)),
            ("x-mail-dead-attempts", AMQPValue::LongLongInt(5)),
            (
                "x-mail-dead-error",
                string("smtp: 450 4.2.0 try again later"),
            ),
            ("x-mail-dead-at", AMQPValue::Timestamp(now)),
        ]);
        publish(
            &self.channel,
            "mail.dead",
            SEND_QUEUE,
            &request(&[to]),
            properties(id, headers),
        )
        .await;
    }

    /// Runs a worker until the dead queue holds `dead` messages, then stops it.
    pub async fn work_until_dead(&self, provider_url: &str, max_attempts: u32, dead: u32) {
        let worker = start_worker(&self.vhost.amqp_url(), provider_url, max_attempts);
        self.wait_for(DEAD_QUEUE, dead).await;
        stop_worker(worker);
    }

    /// Makes the broker dead-letter request `id` from the send queue after its delivery
    /// limit, as after a crash loop: its park fails (the retry binding is gone), so the
    /// worker stops without acking, again and again. The request first went through the
    /// delay queue, so its first death is `expired` and its newest `delivery_limit`.
    pub async fn make_delivery_limit(&self, id: &str) {
        mailer_testkit::broker::remove_retry_binding(&self.vhost).await;
        let parked = headers(&[("x-mail-attempt", AMQPValue::LongLongInt(2))]);
        publish(
            &self.channel,
            "",
            "mail.send.retry",
            &request(&["ok@example.com"]),
            properties(id, parked),
        )
        .await;
        self.wait_for(SEND_QUEUE, 1).await;
        // Connection refused: failed for now, so the worker parks it, which fails.
        let provider = format!("smtp://127.0.0.1:{}?tls=none&timeout=2s", closed_port());
        for run in 1.. {
            assert!(run <= 10, "the delivery limit should have dead-lettered it");
            let mut worker = start_worker(&self.vhost.amqp_url(), &provider, 5);
            let status = exit_within(&mut worker, Duration::from_secs(30));
            assert!(!status.success(), "a failed park stops the worker");
            let dead = eventually(10, "the request back in mail.send or dead", || async {
                match (self.ready(DEAD_QUEUE).await, self.ready(SEND_QUEUE).await) {
                    (1, _) => Some(true),
                    (0, 1) => Some(false),
                    _ => None,
                }
            })
            .await;
            if dead {
                break;
            }
        }
        self.repair().await;
    }
}

/// The SMTP server's provider URL.
pub fn smtp_url(smtp: &SmtpServer) -> String {
    format!("smtp://127.0.0.1:{}?tls=none", smtp.port)
}

pub fn request(to: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "from": "Shop <noreply@shop.example>",
        "to": to,
        "subject": "Your order",
        "text": "Thank you.",
    }))
    .unwrap()
}

pub fn properties(message_id: &str, headers: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(message_id.into())
        .with_headers(headers)
        .with_delivery_mode(2)
}

pub fn headers(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert(ShortString::from(*name), value.clone());
    }
    table
}

pub fn string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Each line of `text` parsed as JSON.
pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The ids `id-000`, `id-001`, … up to `n`.
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}
