//! The request size limit (`MAIL_MAX_REQUEST_BYTES`): a 25 MiB request sent whole with
//! the limit raised to 32 MiB, one over the limit dead-lettered as `too-large` with its
//! body, `mailer send` refusing one over its limit before publishing, and a limit that is
//! not one refused at start.
//!
//! On RabbitMQ 4 the broker itself refuses messages over 16 MiB unless its
//! `max_message_size` is raised: `.ci/rabbitmq4.sh start` sets 64 MiB.

use std::process::Command;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::AMQPValue;

use mailer_testkit::broker::{TestBroker, confirming_channel, get_within, pipeline, text};
use mailer_testkit::process::{eventually, start_worker_with, stop_worker};
use mailer_testkit::smtp::SmtpServer;

const MIB: usize = 1024 * 1024;

/// A valid request of exactly `size` bytes: a text body of short ASCII lines.
fn request_of(size: usize) -> Vec<u8> {
    let body = |text: &str| {
        serde_json::to_vec(&serde_json::json!({
            "from": "Shop <noreply@shop.example>",
            "to": ["ok@example.com"],
            "subject": "The catalogue",
            "text": text,
        }))
        .expect("JSON")
    };
    let line = "The autumn catalogue, page after page of it, all in plain text.\n";
    // Each line takes one byte more in JSON ("\n" is written "\\n").
    let fixed = body("").len();
    let lines = (size - fixed) / (line.len() + 1);
    let mut text = line.repeat(lines);
    text.push_str(&" ".repeat(size - fixed - lines * (line.len() + 1)));
    let request = body(&text);
    assert_eq!(request.len(), size);
    request
}

/// Publishes `body` as request `id`, saying plainly when the broker refuses its size.
async fn publish_large(channel: &lapin::Channel, id: &str, body: &[u8]) {
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(id.into())
        .with_delivery_mode(2);
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let confirmed = async {
        channel
            .basic_publish("mail".into(), "mail.send".into(), options, body, properties)
            .await?
            .await
    };
    match confirmed.await {
        Ok(confirm) => assert!(confirm.is_ack(), "{id}: not acked"),
        Err(e) => panic!(
            "RabbitMQ {} refused a request of {} bytes ({e}); RabbitMQ 4 needs its \
             max_message_size raised above 16 MiB (.ci/rabbitmq4.sh start does)",
            TestBroker::get().version,
            body.len()
        ),
    }
}

#[tokio::test]
async fn a_25_mib_request_is_sent_whole_with_the_limit_raised_to_32_mib() {
    let smtp = SmtpServer::start();
    let vhost = pipeline("large", "").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    publish_large(&channel, "catalogue", &request_of(25 * MIB)).await;
    let worker = start_worker_with(
        &vhost.amqp_url(),
        &format!("smtp://127.0.0.1:{}?tls=none", smtp.port),
        &[("MAIL_MAX_REQUEST_BYTES", "32Mi")],
    );
    let mails = eventually(60, "the catalogue delivered", || async {
        let mails = smtp.mails();
        (!mails.is_empty()).then_some(mails)
    })
    .await;
    stop_worker(worker);
    assert_eq!(mails.len(), 1);
    assert!(mails[0].contains("<catalogue@shop.example>"));
    assert!(
        mails[0].len() > 25 * MIB - 64 * 1024,
        "the whole text: {} bytes",
        mails[0].len()
    );
    assert_eq!(crate::ready(&channel, "mail.send.dead").await, 0);
    assert_eq!(crate::ready(&channel, "mail.send.retry").await, 0);
}

#[tokio::test]
async fn a_request_over_the_limit_is_dead_lettered_as_too_large_with_its_body() {
    let smtp = SmtpServer::start();
    let vhost = pipeline("too-large", "").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let request = request_of(10 * MIB + 1);
    publish_large(&channel, "one-byte-over", &request).await;
    // The default limit, 10 MiB.
    let worker = start_worker_with(
        &vhost.amqp_url(),
        &format!("smtp://127.0.0.1:{}?tls=none", smtp.port),
        &[],
    );
    let dead = get_within(&channel, "mail.send.dead", Duration::from_secs(30))
        .await
        .expect("a dead letter");
    stop_worker(worker);
    let headers = dead
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    let header = |name: &str| headers.inner().get(name);
    assert_eq!(
        text(header("x-mail-dead-reason")).as_deref(),
        Some("too-large")
    );
    assert_eq!(
        header("x-mail-dead-attempts"),
        Some(&AMQPValue::LongLongInt(1))
    );
    assert_eq!(
        text(header("x-mail-dead-error")).as_deref(),
        Some(
            "the request is 10485761 bytes (10.0 MiB), over the limit of 10485760 bytes \
             (10 MiB) (MAIL_MAX_REQUEST_BYTES)"
        )
    );
    assert!(dead.delivery.data == request, "the request as it came");
    assert!(smtp.mails().is_empty(), "nothing sent");
}

#[tokio::test]
async fn mailer_send_refuses_a_request_over_its_limit_before_publishing() {
    let vhost = pipeline("send-large", "").await;
    let file = std::env::temp_dir().join(format!("mailer-large-{}.json", std::process::id()));
    std::fs::write(&file, request_of(2048)).expect("write the request");
    let send = |limit: &str| {
        Command::new(env!("CARGO_BIN_EXE_mailer"))
            .args(["send", "--amqp-url", &vhost.amqp_url(), "--json"])
            .arg(&file)
            .args(["--max-request-bytes", limit])
            .output()
            .expect("mailer send runs")
    };
    let refused = send("1Ki");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("the request is 2048 bytes (2 KiB), over the limit of 1024 bytes (1 KiB)")
            && err.contains("not published")
            && err.contains("spec.worker.maxRequestSize"),
        "{err}"
    );
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    assert_eq!(crate::ready(&channel, "mail.send").await, 0);

    let sent = send("2Ki");
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert_eq!(crate::ready(&channel, "mail.send").await, 1);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_limit_that_is_not_one_stops_the_worker_at_start() {
    for (limit, says) in [
        ("ten megs", "is not a size"),
        ("1Gi", "the limit must be from 1Ki to 512Mi"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_mailer"))
            .arg("worker")
            .env("MAIL_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f")
            .env("MAIL_PROVIDER_URL", "discard://")
            .env("MAIL_MAX_REQUEST_BYTES", limit)
            .output()
            .expect("mailer worker runs");
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{limit}: {err}");
        assert!(
            err.contains("--max-request-bytes") && err.contains(says),
            "{limit}: {err}"
        );
    }
}
