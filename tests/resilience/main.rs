//! The worker when things go wrong that the shared brokers can show without being
//! disturbed: a peer that never speaks AMQP, a panicking provider, the consuming
//! connection closed by the broker mid-send, an SMTP server that refuses every
//! connection for a while. (Broker restarts and alarms run on private
//! nodes: tests/faults/, `make faults`.)

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use lapin::BasicProperties;
use mailer_testkit::broker::{
    TestVhost, confirming_channel, get_within, pipeline, publish, raw_api, text,
};
use mailer_testkit::inproc::{InProcess, settled};
use mailer_testkit::process::{
    eventually, exit_within, free_port, http_get, signal, start_worker_with, stop_worker,
};
use mailer_testkit::provider::TestProvider;
use mailer_testkit::smtp::{SmtpServer, TempDir, closed_port};
use serde_json::json;

fn request(to: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "from": "shop@example.com", "to": [to], "subject": "Hi", "text": "Hello"
    }))
    .unwrap()
}

fn properties(id: &str) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(id.into())
        .with_delivery_mode(2)
}

async fn ready(vhost: &TestVhost, queue: &str) -> u32 {
    let connection = vhost.connect().await;
    let channel = connection.create_channel().await.unwrap();
    let declared = channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .expect("passive declare");
    let _ = connection.close(200, "looked".into()).await;
    declared.message_count()
}

#[tokio::test]
async fn sigterm_while_connecting_to_a_silent_peer_stops_at_once_and_the_probes_say_why() {
    // A peer that accepts TCP and never speaks AMQP.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let amqp = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f",
        silent.local_addr().unwrap().port()
    );
    let http = free_port();
    let addr = format!("127.0.0.1:{http}");
    let mut worker = start_worker_with(
        &amqp,
        "discard://",
        &[("MAIL_HTTP_ADDR", &addr), ("MAIL_CONNECT_TIMEOUT", "1s")],
    );
    let (status, body) = eventually(10, "/readyz", || async { http_get(http, "/readyz") }).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("connecting"), "{body}");
    // Past the first timed-out attempt, into the retries: still live, since it is trying.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(http_get(http, "/livez").map(|(s, _)| s), Some(200));
    signal(&worker, "TERM");
    let started = std::time::Instant::now();
    assert!(exit_within(&mut worker, Duration::from_secs(5)).success());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn a_broker_that_refuses_connections_is_given_up_after_five_attempts_with_backoff() {
    let amqp = format!("amqp://guest:guest@127.0.0.1:{}/%2f", free_port());
    let started = std::time::Instant::now();
    let mut worker = start_worker_with(&amqp, "discard://", &[("MAIL_CONNECT_TIMEOUT", "1s")]);
    let status = exit_within(&mut worker, Duration::from_secs(40));
    assert!(!status.success(), "giving up exits non-zero");
    // Waits of 1, 2, 4 and 8 seconds between the five attempts.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(15) && took < Duration::from_secs(25),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_panicking_provider_never_leaks_a_delivery() {
    let vhost = pipeline("panic", "").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    // More panicking requests than the prefetch: if a panic held its delivery, the worker
    // would stall with every slot taken, and the good ones behind them would never go.
    let panicking = 20;
    for i in 0..panicking {
        let id = format!("p-{i:02}");
        publish(
            &channel,
            "mail",
            "mail.send",
            &request("panic@example.com"),
            properties(&id),
        )
        .await;
    }
    for i in 0..4 {
        let id = format!("ok-{i}");
        publish(
            &channel,
            "mail",
            "mail.send",
            &request("ok@example.com"),
            properties(&id),
        )
        .await;
    }
    let provider = Arc::new(TestProvider::default());
    let worker = InProcess::start(&vhost.amqp_url(), provider.clone(), 16);

    // Each panicking request is rejected with requeue until the delivery limit
    // dead-letters it (six deliveries each).
    let mut dead = Vec::new();
    while dead.len() < panicking {
        let message = get_within(&channel, "mail.send.dead", Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("only {} of {panicking} dead-lettered", dead.len()));
        let headers = message
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        assert_eq!(
            text(headers.inner().get("x-first-death-reason")).as_deref(),
            Some("delivery_limit")
        );
        dead.push(
            message
                .delivery
                .properties
                .message_id()
                .clone()
                .unwrap()
                .to_string(),
        );
        message
            .delivery
            .acker
            .ack(Default::default())
            .await
            .unwrap();
    }
    eventually(10, "the good requests sent", || async {
        (worker.settled("sent") == 4).then_some(())
    })
    .await;
    assert_eq!(worker.settled("panicked"), 6 * panicking as u64);
    assert!(worker.health.is_ready());
    assert!(worker.stop().await.is_ok());
    assert_eq!(ready(&vhost, "mail.send").await, 0);
}

#[tokio::test]
async fn losing_the_consuming_connection_abandons_every_send_at_once_connects_again_and_loses_nothing()
 {
    let vhost = pipeline("lost", "").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    for i in 0..20 {
        let id = format!("m-{i:02}");
        publish(
            &channel,
            "mail",
            "mail.send",
            &request("ok@example.com"),
            properties(&id),
        )
        .await;
    }
    // Sends that outlast the connection: when it goes, all are mid-send.
    let provider = Arc::new(TestProvider {
        delay: Duration::from_secs(15),
        ..Default::default()
    });
    let worker = InProcess::start(&vhost.amqp_url(), provider.clone(), 8);
    eventually(30, "8 sends under way", || async {
        (provider.started.lock().unwrap().len() == 8).then_some(())
    })
    .await;

    // The broker closes the worker's consuming connection, as it does when a node stops.
    let api = raw_api();
    let consuming = || async {
        let listed = api.list_connections_in(&vhost.name).await.ok()?;
        listed
            .into_iter()
            .find(|c| c.client_properties.connection_name == "mailer-worker-consume")
    };
    let first = eventually(30, "the consuming connection listed", consuming).await;
    api.close_connection(&first.name, Some("test: the connection goes"), false)
        .await
        .expect("close the connection");
    let closed = std::time::Instant::now();
    eventually(5, "every send in flight abandoned", || async {
        (worker.settled("abandoned") == 8).then_some(())
    })
    .await;
    assert!(closed.elapsed() < Duration::from_secs(5));
    assert!(provider.sent.lock().unwrap().is_empty(), "no send went on");

    // It connects again instead of exiting, and takes the redelivered requests.
    let again = eventually(30, "a new consuming connection", || async {
        consuming().await.filter(|c| c.name != first.name)
    })
    .await;
    assert_ne!(again.name, first.name);
    eventually(30, "8 sends under way again", || async {
        (provider.started.lock().unwrap().len() == 16).then_some(())
    })
    .await;
    assert!(!worker.run.is_finished(), "the worker did not exit");
    assert!(worker.health.is_ready(), "ready again once connected");
    let mut metrics = String::new();
    prometheus_client::encoding::text::encode(&mut metrics, &worker.registry).expect("encode");
    assert!(
        metrics.contains("mailer_worker_reconnects_total 1"),
        "{metrics}"
    );

    // Stopped, it finishes what it holds: 8 sent, the other 12 still waiting.
    assert!(worker.stop().await.is_ok());
    assert_eq!(provider.sent.lock().unwrap().len(), 8);
    eventually(30, "the rest back in mail.send", || async {
        (ready(&vhost, "mail.send").await == 12).then_some(())
    })
    .await;
}

#[tokio::test]
async fn returns_are_matched_to_their_own_publish_when_many_are_in_flight() {
    let vhost = pipeline("returns", "").await;
    mailer_testkit::broker::remove_retry_binding(&vhost).await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    // Eight parks that the broker returns (no binding behind mail.retry) and eight dead
    // letters that it routes, all in flight at once: a return paired with another
    // publish's confirm would fail a dead letter, or worse, take a returned park as done.
    for i in 0..8 {
        let id = format!("later-{i}");
        publish(
            &channel,
            "mail",
            "mail.send",
            &request("later@example.com"),
            properties(&id),
        )
        .await;
        let id = format!("bad-{i}");
        publish(&channel, "mail", "mail.send", b"not json", properties(&id)).await;
    }
    let provider = Arc::new(TestProvider {
        delay: Duration::from_millis(200),
        ..Default::default()
    });
    let worker = InProcess::start(&vhost.amqp_url(), provider, 16);
    let result = tokio::time::timeout(Duration::from_secs(30), worker.run)
        .await
        .expect("the worker stops")
        .expect("the worker's task");
    let error = result
        .expect_err("a returned park stops the worker")
        .to_string();
    assert!(error.contains("returned as unroutable"), "{error}");
    assert!(!error.contains("not the one published"), "{error}");
    assert_eq!(settled(&worker.registry, "publish_failed"), 8);
    assert_eq!(settled(&worker.registry, "dead_lettered"), 8);
    eventually(30, "the parks back in mail.send", || async {
        (ready(&vhost, "mail.send").await == 8).then_some(())
    })
    .await;
    assert_eq!(ready(&vhost, "mail.send.dead").await, 8);
}

#[tokio::test]
async fn connections_ask_for_small_frames_unless_the_url_names_a_size() {
    // lapin keeps 64 frames of buffer per connection: at the broker's 128 KiB, 8 MiB.
    let vhost = TestVhost::created("frames").await;
    let timeout = Duration::from_secs(10);
    let ours = mailer::amqp::connect(&vhost.amqp_url(), "frames", timeout)
        .await
        .expect("connects");
    assert_eq!(
        ours.configuration().frame_max(),
        mailer::amqp::connect::DEFAULT_FRAME_MAX
    );
    let named = format!("{}?frame_max=65536", vhost.amqp_url());
    let theirs = mailer::amqp::connect(&named, "frames", timeout)
        .await
        .expect("connects");
    assert_eq!(theirs.configuration().frame_max(), 65_536);
    let _ = ours.close(200, "done".into()).await;
    let _ = theirs.close(200, "done".into()).await;
}

/// A sample of the worker's `/metrics` on `port`: the series named exactly `series`
/// (labels included), 0 when it has none yet.
fn sample(port: u16, series: &str) -> Option<f64> {
    let (200, text) = http_get(port, "/metrics")? else {
        return None;
    };
    let prefix = format!("{series} ");
    Some(
        text.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map_or(0.0, |n| n.trim().parse().expect("a number")),
    )
}

const PARKED: &str = "mailer_worker_deliveries_total{outcome=\"parked\"}";

#[tokio::test]
async fn a_provider_that_refuses_every_connection_stops_consumption_and_costs_no_attempt() {
    let vhost = pipeline("outage", "").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    // A copy of every park, to read the attempt it was parked with.
    channel
        .queue_declare("test.parks".into(), Default::default(), Default::default())
        .await
        .expect("declare the copy queue");
    channel
        .queue_bind(
            "test.parks".into(),
            "mail.retry".into(),
            "mail.send".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .expect("bind it to the retry exchange");
    for i in 0..40 {
        let id = format!("m-{i:02}");
        publish(
            &channel,
            "mail",
            "mail.send",
            &request("ok@example.com"),
            properties(&id),
        )
        .await;
    }
    // Nothing listens on the SMTP port yet. One attempt allowed: any failure that counted
    // would dead-letter its request as gave-up.
    let smtp_port = closed_port();
    let http = free_port();
    let addr = format!("127.0.0.1:{http}");
    let worker = start_worker_with(
        &vhost.amqp_url(),
        &format!("smtp://127.0.0.1:{smtp_port}?tls=none"),
        &[
            ("MAIL_HTTP_ADDR", &addr),
            ("MAIL_MAX_ATTEMPTS", "1"),
            ("MAIL_PREFETCH", "4"),
        ],
    );
    eventually(20, "/readyz: the provider cannot be reached", || async {
        http_get(http, "/readyz")
            .filter(|(status, body)| *status == 503 && body.contains("provider cannot be reached"))
    })
    .await;
    assert_eq!(sample(http, "mailer_worker_provider_paused"), Some(1.0));
    // The first four sends failed (three refused connects, then the pause); then one
    // delivery probes at the end of each pause (1s, then 2s).
    eventually(20, "two probes after the first sends", || async {
        sample(http, PARKED).filter(|parked| *parked >= 6.0)
    })
    .await;
    let waiting = ready(&vhost, "mail.send").await + ready(&vhost, "mail.send.retry").await;
    assert!(
        waiting >= 30,
        "the backlog stays in the queues, not parked over and over: {waiting} waiting"
    );

    let smtp = SmtpServer::start_on(smtp_port, TempDir::new("smtp"));
    eventually(60, "every mail delivered", || async {
        (smtp.message_ids().len() >= 40).then_some(())
    })
    .await;
    eventually(10, "/readyz ready again", || async {
        http_get(http, "/readyz").filter(|(status, _)| *status == 200)
    })
    .await;
    assert_eq!(sample(http, "mailer_worker_provider_paused"), Some(0.0));
    let parks = sample(http, PARKED).expect("metrics");
    stop_worker(worker);

    let ids = smtp.message_ids();
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), distinct.len()), (40, 40), "each sent once");
    assert_eq!(ready(&vhost, "mail.send.dead").await, 0, "none given up");
    let mut attempts = Vec::new();
    while let Some(park) = get_within(&channel, "test.parks", Duration::ZERO).await {
        let headers = park
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        attempts.push(headers.inner().get("x-mail-attempt").cloned());
    }
    assert_eq!(attempts.len() as f64, parks, "every park copied");
    assert!(
        attempts
            .iter()
            .all(|a| *a == Some(lapin::types::AMQPValue::LongLongInt(1))),
        "parked with the attempt unchanged: {attempts:?}"
    );
}
