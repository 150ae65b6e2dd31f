//! `mailer worker` end to end: the real binary against the real RabbitMQ and a real SMTP
//! server (aiosmtpd), one vhost per test. Every row of the outcome table, header
//! carry-over, the unroutable park, SIGTERM and SIGKILL mid-stream; many parks in flight on
//! one channel, some unroutable; the request size limit; an HTTP API's stand-in and the
//! send rate; delay tiers.

pub mod api;
pub mod identity;
pub mod pipelined;
pub mod size;
pub mod tiers;

use std::collections::BTreeSet;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use lapin::options::BasicAckOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use mailer_testkit::broker::{
    TestVhost, confirming_channel, get_within, message_count, publish, text,
};
use mailer_testkit::process::exit_within;
use mailer_testkit::smtp::{SmtpServer, closed_port};
use serde_json::json;

/// Applies the default topology with a short retry delay to a fresh vhost.
async fn pipeline(test: &str) -> TestVhost {
    mailer_testkit::broker::pipeline(test, "").await
}

fn start_worker(vhost: &TestVhost, provider_url: &str, max_attempts: u32) -> Child {
    mailer_testkit::process::start_worker(&vhost.amqp_url(), provider_url, max_attempts)
}

fn terminate(child: &Child) {
    mailer_testkit::process::signal(child, "TERM");
}

fn request(to: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "from": "Shop <noreply@shop.example>",
        "to": to,
        "subject": "Your order",
        "text": "Thank you.",
        "headers": {"X-Campaign": "autumn"}
    }))
    .unwrap()
}

fn properties(message_id: &str, headers: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(message_id.into())
        .with_correlation_id(format!("corr-{message_id}").as_str().into())
        .with_headers(headers)
        .with_delivery_mode(2)
}

fn headers(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert(ShortString::from(*name), value.clone());
    }
    table
}

/// A dead letter, read and acked.
#[derive(Debug)]
struct DeadLetter {
    message_id: String,
    reason: Option<String>,
    attempts: Option<AMQPValue>,
    error: String,
    headers: FieldTable,
    properties: BasicProperties,
    body: Vec<u8>,
}

/// Takes `n` messages from the dead-letter queue, waiting at most `within` for each.
async fn dead_letters(channel: &Channel, n: usize, within: Duration) -> Vec<DeadLetter> {
    let mut found = Vec::new();
    while found.len() < n {
        let Some(message) = get_within(channel, "mail.send.dead", within).await else {
            panic!(
                "only {} of {n} dead letters arrived: {found:#?}",
                found.len()
            );
        };
        let properties = message.delivery.properties.clone();
        let headers = properties.headers().clone().unwrap_or_default();
        found.push(DeadLetter {
            message_id: properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default(),
            reason: text(headers.inner().get("x-mail-dead-reason")),
            attempts: headers.inner().get("x-mail-dead-attempts").cloned(),
            error: text(headers.inner().get("x-mail-dead-error")).unwrap_or_default(),
            headers,
            properties,
            body: message.delivery.data.clone(),
        });
        message
            .delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
    found.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    found
}

/// Messages ready in `queue` this instant (a passive declare, not the lagging statistics).
async fn ready(channel: &Channel, queue: &str) -> u32 {
    message_count(channel, queue)
        .await
        .expect("passive declare")
}

/// The Message-IDs of the mails the SMTP server stored.
fn delivered_ids(smtp: &SmtpServer) -> Vec<String> {
    smtp.message_ids()
}

#[tokio::test]
async fn every_row_of_the_outcome_table_holds_end_to_end() {
    let smtp = SmtpServer::start();
    let vhost = pipeline("table").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;

    let ok = request(&["ok@example.com", "also+ok@example.com"]);
    let cases: Vec<(&str, Vec<u8>, FieldTable)> = vec![
        ("a-sent", ok.clone(), headers(&[("traceparent", AMQPValue::LongString("00-1-2-01".into()))])),
        ("b-attempt-string", ok.clone(), headers(&[("x-mail-attempt", AMQPValue::LongString("2".into()))])),
        ("c-attempt-float", ok.clone(), headers(&[("x-mail-attempt", AMQPValue::Double(2.0))])),
        ("d-attempt-bool", ok.clone(), headers(&[("x-mail-attempt", AMQPValue::Boolean(true))])),
        ("e-attempt-timestamp", ok.clone(), headers(&[("x-mail-attempt", AMQPValue::Timestamp(2))])),
        ("f-attempt-zero", ok.clone(), headers(&[("x-mail-attempt", AMQPValue::LongLongInt(0))])),
        ("g-attempt-negative", ok.clone(), headers(&[("x-mail-attempt", AMQPValue::ShortShortInt(-3))])),
        ("h-body-not-json", b"{not json".to_vec(), FieldTable::default()),
        ("i-body-injection", serde_json::to_vec(&json!({"from": "a@example.com", "to": ["b@example.com"], "subject": "hi\r\nBcc: x@evil.example", "text": "x"})).unwrap(), FieldTable::default()),
        ("j-rejected", request(&["nobody+550@example.com"]), FieldTable::default()),
        ("k-some-refused", request(&["ok@example.com", "busy+450@example.com", "gone+550@example.com"]), FieldTable::default()),
        (
            "l-for-now",
            request(&["busy+450@example.com"]),
            headers(&[
                ("traceparent", AMQPValue::LongString("00-abc-def-01".into())),
                ("x-death", AMQPValue::LongString("forged".into())),
                ("x-delivery-count", AMQPValue::LongLongInt(7)),
            ]),
        ),
        ("m-last-attempt-u8", request(&["busy+450@example.com"]), headers(&[("x-mail-attempt", AMQPValue::ShortShortUInt(3))])),
        ("n-second-attempt-i16-sent", ok.clone(), headers(&[("x-mail-attempt", AMQPValue::ShortInt(2))])),
    ];
    for (id, body, h) in &cases {
        publish(
            &channel,
            "mail",
            "mail.send",
            body,
            properties(id, h.clone()),
        )
        .await;
    }

    let mut worker = start_worker(
        &vhost,
        &format!("smtp://127.0.0.1:{}?tls=none", smtp.port),
        3,
    );
    // l-for-now is tried at attempts 1, 2 and 3, a second apart, before it is given up.
    let dead = dead_letters(&channel, 12, Duration::from_secs(30)).await;
    terminate(&worker);
    assert!(
        exit_within(&mut worker, Duration::from_secs(30)).success(),
        "SIGTERM ends the worker with 0"
    );

    let by_id = |id: &str| {
        dead.iter()
            .find(|d| d.message_id == id)
            .unwrap_or_else(|| panic!("no dead letter {id}"))
    };
    for id in [
        "b-attempt-string",
        "c-attempt-float",
        "d-attempt-bool",
        "e-attempt-timestamp",
        "f-attempt-zero",
        "g-attempt-negative",
    ] {
        let d = by_id(id);
        assert_eq!(d.reason.as_deref(), Some("malformed"), "{id}");
        assert_eq!(
            d.attempts,
            Some(AMQPValue::LongLongInt(0)),
            "{id}: a malformed attempt header counts 0 attempts"
        );
        assert!(d.error.contains("x-mail-attempt"), "{id}: {}", d.error);
        assert!(
            !d.headers.inner().contains_key("x-mail-attempt"),
            "{id}: a dead letter has no attempt header"
        );
    }
    assert!(by_id("b-attempt-string").error.contains("string"));
    assert!(by_id("f-attempt-zero").error.contains("not positive"));
    for id in ["h-body-not-json", "i-body-injection"] {
        let d = by_id(id);
        assert_eq!(d.reason.as_deref(), Some("malformed"), "{id}");
        assert_eq!(d.attempts, Some(AMQPValue::LongLongInt(1)), "{id}");
    }
    assert!(
        by_id("i-body-injection").error.contains("subject"),
        "{}",
        by_id("i-body-injection").error
    );
    let rejected = by_id("j-rejected");
    assert_eq!(rejected.reason.as_deref(), Some("rejected"));
    assert!(rejected.error.contains("550"), "{}", rejected.error);
    let mixed = by_id("k-some-refused");
    assert_eq!(
        mixed.reason.as_deref(),
        Some("rejected"),
        "any 5xx makes it rejected: {}",
        mixed.error
    );

    let gave_up = by_id("l-for-now");
    assert_eq!(gave_up.reason.as_deref(), Some("gave-up"));
    assert_eq!(gave_up.attempts, Some(AMQPValue::LongLongInt(3)));
    assert!(gave_up.error.contains("450"), "{}", gave_up.error);
    // The dead queue itself adds x-delivery-count as it delivers; the forged 7 is gone.
    let delivery_count = gave_up.headers.inner().get("x-delivery-count");
    assert!(
        matches!(delivery_count, None | Some(AMQPValue::LongLongInt(0))),
        "{delivery_count:?}"
    );
    let names: BTreeSet<&str> = gave_up
        .headers
        .inner()
        .keys()
        .map(|k| k.as_str())
        .filter(|k| *k != "x-delivery-count")
        .collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "traceparent",
            "x-mail-dead-at",
            "x-mail-dead-attempts",
            "x-mail-dead-error",
            "x-mail-dead-reason"
        ]),
        "the producer's headers survive every retry; the broker's and ours are replaced"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        matches!(gave_up.headers.inner().get("x-mail-dead-at"), Some(AMQPValue::Timestamp(at)) if now.abs_diff(*at) < 120),
        "the dead letter says when it died: {:?}",
        gave_up.headers.inner().get("x-mail-dead-at")
    );
    assert_eq!(
        text(gave_up.headers.inner().get("traceparent")).as_deref(),
        Some("00-abc-def-01")
    );
    assert_eq!(
        gave_up.properties.user_id().as_ref().map(|s| s.as_str()),
        Some("guest")
    );
    assert_eq!(
        gave_up
            .properties
            .correlation_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("corr-l-for-now")
    );
    assert_eq!(
        gave_up
            .properties
            .content_type()
            .as_ref()
            .map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(*gave_up.properties.delivery_mode(), Some(2));
    assert_eq!(gave_up.body, request(&["busy+450@example.com"]));

    let last = by_id("m-last-attempt-u8");
    assert_eq!(last.reason.as_deref(), Some("gave-up"));
    assert_eq!(last.attempts, Some(AMQPValue::LongLongInt(3)));

    // Only the requests whose every recipient was accepted were sent, once each.
    let mut delivered = delivered_ids(&smtp);
    delivered.sort();
    assert_eq!(
        delivered,
        [
            "a-sent@shop.example",
            "n-second-attempt-i16-sent@shop.example"
        ]
    );
    assert_eq!(ready(&channel, "mail.send").await, 0);
    assert_eq!(ready(&channel, "mail.send.retry").await, 0);
}

#[tokio::test]
async fn an_unroutable_park_stops_the_worker_and_the_delivery_limit_dead_letters_it() {
    let vhost = pipeline("unroutable").await;
    mailer_testkit::broker::remove_retry_binding(&vhost).await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    publish(
        &channel,
        "mail",
        "mail.send",
        &request(&["a@example.com"]),
        properties("stuck", FieldTable::default()),
    )
    .await;

    // The provider refuses the connection (failed for now), the park is returned as
    // unroutable, so each worker rejects the delivery with requeue and exits non-zero.
    // Each run returns it once (the reject) or twice (when the broker redelivered it to
    // the stopping worker, whose channel then closed): every return counts toward the
    // delivery limit of 5 on RabbitMQ 3.x and 4.x, and the sixth dead-letters it.
    let provider = format!("smtp://127.0.0.1:{}?tls=none&timeout=2s", closed_port());
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(
            runs <= 6,
            "the delivery limit should have dead-lettered it by now"
        );
        let mut worker = start_worker(&vhost, &provider, 5);
        let status = exit_within(&mut worker, Duration::from_secs(30));
        assert!(
            !status.success(),
            "a failed park must stop the worker with an error"
        );
        // The broker returns the delivery once it has seen the connection go: wait until
        // the request is back in mail.send, or dead-lettered.
        let deadline = Instant::now() + Duration::from_secs(10);
        let dead = loop {
            if ready(&channel, "mail.send.dead").await > 0 {
                break true;
            }
            if ready(&channel, "mail.send").await > 0 {
                break false;
            }
            assert!(
                Instant::now() < deadline,
                "the request is neither back in mail.send nor dead-lettered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if dead {
            break;
        }
    }
    assert!(
        (3..=6).contains(&runs),
        "five returns are allowed, the sixth dead-letters it: {runs} runs"
    );
    let dead = get_within(&channel, "mail.send.dead", Duration::from_secs(10))
        .await
        .expect("dead-lettered by the broker");
    let h = dead
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    assert_eq!(
        text(h.inner().get("x-first-death-reason")).as_deref(),
        Some("delivery_limit"),
        "{h:?}"
    );
    assert_eq!(
        dead.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("stuck")
    );
}

/// Publishes `n` good requests with ids `m-0000`….
async fn publish_many(channel: &Channel, n: usize) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let id = format!("m-{i:04}");
        publish(
            channel,
            "mail",
            "mail.send",
            &request(&["ok@example.com"]),
            properties(&id, FieldTable::default()),
        )
        .await;
        ids.insert(format!("{id}@shop.example"));
    }
    ids
}

/// Waits until the SMTP server has stored at least `n` mails.
fn wait_for_mails(smtp: &SmtpServer, n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while smtp.mails().len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} mails arrived",
            smtp.mails().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn sigterm_mid_stream_settles_what_is_in_flight_and_loses_nothing() {
    let smtp = SmtpServer::start();
    let vhost = pipeline("sigterm").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let published = publish_many(&channel, 300).await;

    let mut worker = start_worker(
        &vhost,
        &format!("smtp://127.0.0.1:{}?tls=none", smtp.port),
        5,
    );
    wait_for_mails(&smtp, 20, Duration::from_secs(30));
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());

    let delivered = delivered_ids(&smtp);
    let unique: BTreeSet<String> = delivered.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        delivered.len(),
        "a graceful stop sends nothing twice"
    );
    let left = ready(&channel, "mail.send").await as usize;
    assert!(left > 0, "the test should stop the worker mid-stream");
    assert_eq!(
        delivered.len() + left,
        published.len(),
        "every request was sent or is still queued"
    );
}

#[tokio::test]
async fn sigkill_mid_stream_loses_nothing() {
    let smtp = SmtpServer::start();
    let vhost = pipeline("sigkill").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let published = publish_many(&channel, 300).await;
    let provider = format!("smtp://127.0.0.1:{}?tls=none", smtp.port);

    let mut worker = start_worker(&vhost, &provider, 5);
    wait_for_mails(&smtp, 20, Duration::from_secs(30));
    worker.kill().expect("SIGKILL");
    let _ = worker.wait();
    assert!(
        ready(&channel, "mail.send").await > 0,
        "the test should kill the worker mid-stream"
    );

    let mut worker = start_worker(&vhost, &provider, 5);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let delivered: BTreeSet<String> = delivered_ids(&smtp).into_iter().collect();
        if delivered == published {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} requests were delivered",
            delivered.len(),
            published.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());
    assert_eq!(ready(&channel, "mail.send").await, 0);
    assert_eq!(
        ready(&channel, "mail.send.dead").await,
        0,
        "nothing was dead-lettered"
    );
}

#[test]
fn a_missing_or_invalid_setting_stops_the_worker_at_start_with_one_line() {
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Env, i32, &str); 4] = [
        (&[("MAIL_PROVIDER_URL", "discard://")], 2, "--amqp-url"),
        (
            &[
                ("MAIL_AMQP_URL", "amqp://guest:hunter2@127.0.0.1:5672/%2f"),
                ("MAIL_PROVIDER_URL", "pigeon://"),
            ],
            1,
            "MAIL_PROVIDER_URL",
        ),
        (
            &[
                ("MAIL_AMQP_URL", "amqp://guest:hunter2@127.0.0.1:5672/%2f"),
                ("MAIL_PROVIDER_URL", "discard://"),
                ("MAIL_PREFETCH", "0"),
            ],
            2,
            "--prefetch",
        ),
        (
            &[
                ("MAIL_AMQP_URL", "amqp://guest:hunter2@127.0.0.1:1/%2f"),
                ("MAIL_PROVIDER_URL", "discard://"),
            ],
            1,
            "cannot connect",
        ),
    ];
    for (env, code, expected) in cases {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mailer"));
        command
            .arg("worker")
            .env("MAIL_HTTP_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "off");
        for var in ["MAIL_AMQP_URL", "MAIL_PROVIDER_URL", "MAIL_PREFETCH"] {
            command.env_remove(var);
        }
        command.envs(env.iter().copied());
        let output = command.output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{env:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{env:?}: {err}");
        assert!(
            err.contains(expected) && !err.contains("hunter2"),
            "{env:?}: {err}"
        );
    }
}

#[tokio::test]
async fn mailer_send_publishes_a_request_the_worker_delivers() {
    let smtp = SmtpServer::start();
    let vhost = pipeline("send").await;
    let output = Command::new(env!("CARGO_BIN_EXE_mailer"))
        .args([
            "send",
            "--from",
            "Shop <noreply@shop.example>",
            "--to",
            "ok@example.com",
            "--subject",
            "Hi",
            "--text",
            "Hello",
        ])
        .args(["--message-id", "by-hand", "--amqp-url", &vhost.amqp_url()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut worker = start_worker(
        &vhost,
        &format!("smtp://127.0.0.1:{}?tls=none", smtp.port),
        5,
    );
    wait_for_mails(&smtp, 1, Duration::from_secs(30));
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());
    assert_eq!(delivered_ids(&smtp), ["by-hand@shop.example"]);
}
