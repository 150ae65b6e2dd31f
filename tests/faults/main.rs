//! The fault suite (`make faults`): the worker, restarted as a kubelet would, against a
//! PRIVATE RabbitMQ node (`.ci/rabbitmq-node.sh`, never the shared brokers) that is
//! stopped, alarmed and stripped of its queues, and a real SMTP server that hangs or cuts
//! sessions or is down for minutes (`faults/smtp.rs`). Each test counts every request by
//! id and appends one line to `target/faults.md`: published, delivered, delivered twice,
//! dead-lettered by reason, still waiting in a queue, lost (must be 0), and how long the
//! worker took to exit or recover. Ignored by `cargo test`: `make faults` starts the node and runs them one at a
//! time, for RabbitMQ 3.10 and 4.0 (`MAILER_FAULT_BROKER`).

mod cluster;
mod flow;
mod kubelet;
mod large;
mod node;
mod on_cluster;
mod proxy;
mod smtp;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubelet::Kubelet;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use mailer_testkit::inproc::InProcess;
use mailer_testkit::process::{eventually, within};
use mailer_testkit::provider::TestProvider;
use mailer_testkit::smtp::SmtpServer;
use node::{Node, Pipeline, Undo};
use proxy::{Mode, SmtpProxy};
use serde_json::json;

/// Publishes the requests with ids `f-{i:04}` for `i` in `range`, to the recipient `to(i)`
/// gives.
async fn publish(
    pipeline: &Pipeline,
    range: std::ops::Range<usize>,
    to: impl Fn(usize) -> String,
) -> BTreeSet<String> {
    publish_bodies(pipeline, range, |i| {
        serde_json::to_vec(&json!({
            "from": "Shop <noreply@shop.example>", "to": [to(i)], "subject": "Hi", "text": "Hello"
        }))
        .unwrap()
    })
    .await
}

/// Publishes the requests with ids `f-{i:04}` for `i` in `range`, each with the body
/// `body(i)`.
async fn publish_bodies(
    pipeline: &Pipeline,
    range: std::ops::Range<usize>,
    body: impl Fn(usize) -> Vec<u8>,
) -> BTreeSet<String> {
    let connection = pipeline.connect().await;
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut ids = BTreeSet::new();
    for i in range {
        let id = format!("f-{i:04}");
        let body = body(i);
        let properties = BasicProperties::default()
            .with_message_id(id.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let confirm = channel
            .basic_publish(
                "mail".into(),
                "mail.send".into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &body,
                properties,
            )
            .await
            .expect("publish");
        assert!(confirm.await.expect("confirm").is_ack());
        ids.insert(id);
    }
    let _ = connection.close(200, "published".into()).await;
    ids
}

/// Messages ready in `queue` now.
async fn depth(pipeline: &Pipeline, queue: &str) -> u32 {
    let connection = pipeline.connect().await;
    let channel = connection.create_channel().await.expect("channel");
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = channel
        .queue_declare(queue.into(), passive, Default::default())
        .await;
    let _ = connection.close(200, "looked".into()).await;
    declared.map_or(0, |d| d.message_count())
}

/// Ids of the mails the SMTP server stored (one per stored mail, so repeats show).
fn delivered(smtp: &SmtpServer) -> Vec<String> {
    smtp.message_ids()
        .into_iter()
        .map(|id| id.split('@').next().unwrap_or_default().to_string())
        .collect()
}

fn distinct(ids: &[String]) -> usize {
    ids.iter().collect::<BTreeSet<_>>().len()
}

/// How long the tally goes on reading the queues after a read that found nothing, while a
/// request is missing: longer than the pipelines' delay (1s) and a dead-lettering hop. A
/// request the broker dead-letters itself (past the send queue's delivery limit, as the
/// stopped worker's deliveries return) is in no queue a read sees until the queue's
/// at-least-once dead-letter process has published it and had it confirmed, which can
/// take several seconds on a busy node: CI once counted such a request lost after 5 s. It
/// costs nothing when every request is found.
const TALLY_SETTLE: Duration = Duration::from_secs(30);

/// What became of every published request, once the worker stopped.
struct Tally {
    broker: String,
    fault: &'static str,
    published: BTreeSet<String>,
    delivered: Vec<String>,
    dead: Vec<(String, Option<String>)>,
    waiting: Vec<String>,
}

impl Tally {
    async fn take(
        fault: &'static str,
        pipeline: &Pipeline,
        published: BTreeSet<String>,
        delivered: Vec<String>,
    ) -> Self {
        let mut tally = Self {
            broker: pipeline.broker.label.clone(),
            fault,
            published,
            delivered,
            dead: Vec::new(),
            waiting: Vec::new(),
        };
        // The queues are read one after the other, and a parked request moves on its own
        // (its delay over, from mail.send.retry back to mail.send) after the worker has
        // stopped: one read can miss it between two queues. So they are read again until
        // every request is found, or for a while after the last read that found any; a
        // lost request is still missing then.
        let mut quiet_since = Instant::now();
        while !tally.lost().is_empty() && quiet_since.elapsed() < TALLY_SETTLE {
            let found = tally.take_round(pipeline).await;
            if found > 0 {
                quiet_since = Instant::now();
            } else {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        tally
    }

    /// Takes what the dead, send and delay queues hold; how many messages it found.
    async fn take_round(&mut self, pipeline: &Pipeline) -> usize {
        let dead = pipeline.take_all("mail.send.dead").await;
        let mut found = dead.len();
        self.dead.extend(dead);
        for queue in ["mail.send", "mail.send.retry"] {
            let waiting = pipeline.take_all(queue).await;
            found += waiting.len();
            self.waiting.extend(waiting.into_iter().map(|(id, _)| id));
        }
        found
    }

    fn twice(&self) -> usize {
        self.delivered.len() - distinct(&self.delivered)
    }

    fn lost(&self) -> Vec<&String> {
        let seen: BTreeSet<&String> = self
            .delivered
            .iter()
            .chain(self.dead.iter().map(|(id, _)| id))
            .chain(self.waiting.iter())
            .collect();
        self.published
            .iter()
            .filter(|id| !seen.contains(id))
            .collect()
    }

    /// Appends the fault's line to `target/faults.md`, prints it, and checks that nothing
    /// was lost.
    fn report(&self, timing: &str) {
        let line = self.line(timing);
        println!("{line}");
        let path = mailer_testkit::repo_root().join("target/faults.md");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("target/faults.md");
        writeln!(file, "{line}").expect("write the fault table");
        let lost = self.lost();
        assert!(lost.is_empty(), "{}: lost {lost:?}", self.fault);
    }

    /// The fault's line of the table.
    fn line(&self, timing: &str) -> String {
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, reason) in &self.dead {
            *reasons.entry(reason.as_deref().unwrap_or("?")).or_default() += 1;
        }
        let dead = if reasons.is_empty() {
            "0".to_string()
        } else {
            reasons
                .iter()
                .map(|(reason, n)| format!("{n} {reason}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.broker,
            self.fault,
            self.published.len(),
            distinct(&self.delivered),
            self.twice(),
            dead,
            self.waiting.len(),
            self.lost().len(),
            timing
        )
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn smtp_url(port: u16) -> String {
    format!("smtp://127.0.0.1:{port}?tls=none")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn large_mail_through_a_slow_smtp_server() {
    let pipeline = Pipeline::new("large", "").await;
    large::large_mail_through_a_slow_smtp_server(
        &pipeline,
        "requests at the size limit through a slow SMTP server",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn broker_restart_mid_stream() {
    let node = Node::get();
    let pipeline = Pipeline::new("restart", "").await;
    let smtp = SmtpServer::start();
    // A provider that takes about a quarter of a second a mail, so the restart finds
    // sends in flight.
    let proxy = SmtpProxy::start(smtp.port, Mode::Slow).await;
    let published = publish(&pipeline, 0..300, |_| "ok@example.com".into()).await;
    let kubelet = Kubelet::start(&pipeline.amqp_url(), &smtp_url(proxy.port), &[]);
    eventually(60, "50 mails delivered", || async {
        (distinct(&delivered(&smtp)) >= 50).then_some(())
    })
    .await;

    let stopped = Instant::now();
    let _restart = Undo(&["start_app"]);
    node.ctl(&["stop_app"]);
    // It connects again rather than exit: not ready while the broker is away.
    eventually(30, "/readyz not ready while the broker is away", || async {
        kubelet.readyz().filter(|(status, _)| *status == 503)
    })
    .await;
    let not_ready = stopped.elapsed();
    let probes_down = kubelet.probes();
    tokio::time::sleep_until((stopped + Duration::from_secs(5)).into()).await;
    let before = delivered(&smtp).len();
    node.ctl(&["start_app"]);
    let started = Instant::now();
    eventually(60, "delivering again", || async {
        (delivered(&smtp).len() > before).then_some(())
    })
    .await;
    let recovered = started.elapsed();
    eventually(150, "every mail delivered", || async {
        (distinct(&delivered(&smtp)) == published.len()).then_some(())
    })
    .await;
    let probes_up = kubelet.probes();
    let restarts = kubelet.restarts();
    kubelet.stop();
    let tally = Tally::take(
        "broker restart mid-stream (stop_app 5s, start_app)",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;
    tally.report(&format!(
        "not ready {} after stop_app; delivering {} after start_app; {restarts} restarts; probes (livez, readyz, metrics) {probes_down:?} while it was away, {probes_up:?} after",
        secs(not_ready),
        secs(recovered)
    ));
    assert!(tally.twice() <= 16, "at most one prefetch sent twice");
    assert_eq!(restarts, 0, "the worker connects again instead of exiting");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn memory_alarm_while_half_are_parked() {
    let node = Node::get();
    let pipeline = Pipeline::new("alarm", "").await;
    let smtp = SmtpServer::start();
    // Half the requests are refused once (451 at the end of DATA), so they are parked,
    // and parking publishes: the alarm really blocks the worker.
    let published = publish(&pipeline, 0..200, |i| {
        if i % 2 == 0 {
            "ok@example.com".into()
        } else {
            format!("f-{i:04}+451once@example.com")
        }
    })
    .await;
    let proxy = SmtpProxy::start(smtp.port, Mode::Slow).await;
    let kubelet = Kubelet::start(&pipeline.amqp_url(), &smtp_url(proxy.port), &[]);
    eventually(60, "20 mails delivered", || async {
        (distinct(&delivered(&smtp)) >= 20).then_some(())
    })
    .await;

    let alarmed = Instant::now();
    let clear = Undo(&["set_vm_memory_high_watermark", "0.4"]);
    node.ctl(&["set_vm_memory_high_watermark", "0.0000001"]);
    let (status, body) = eventually(20, "/readyz not ready while blocked", || async {
        kubelet.readyz().filter(|(status, _)| *status == 503)
    })
    .await;
    let not_ready = alarmed.elapsed();
    assert!(body.contains("blocks publishing"), "{status} {body}");
    let probes_blocked = kubelet.probes();
    tokio::time::sleep_until((alarmed + Duration::from_secs(20)).into()).await;
    drop(clear);
    let cleared = Instant::now();
    eventually(30, "/readyz ready again", || async {
        kubelet.readyz().filter(|(status, _)| *status == 200)
    })
    .await;
    let ready_again = cleared.elapsed();
    eventually(90, "every mail delivered", || async {
        (distinct(&delivered(&smtp)) == published.len()).then_some(())
    })
    .await;
    let restarts = kubelet.restarts();
    kubelet.stop();
    let tally = Tally::take(
        "memory alarm 20s, half parked once",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;
    tally.report(&format!(
        "not ready {} after the alarm (probes {probes_blocked:?}); ready {} after it cleared; {restarts} restarts",
        secs(not_ready),
        secs(ready_again)
    ));
    assert_eq!(tally.twice(), 0, "nothing sent twice");
    assert_eq!(restarts, 0, "the worker waits out a 20s alarm");
}

/// A memory alarm that outlasts `MAIL_PUBLISH_TIMEOUT` while parks that come back
/// unroutable share the publishing channel with dead letters that are routed: a park
/// given up at its deadline leaves a confirm that the broker completes later, and that
/// confirm may take another park's returned message with it. Nothing may then be acked
/// as parked that was returned.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn alarm_past_the_publish_timeout_with_unroutable_parks() {
    let node = Node::get();
    let pipeline = Pipeline::new("untrusted", "").await;
    // Parks come back unroutable: the retry exchange's binding is gone.
    let binding = mailer::topology::desired::Binding {
        exchange: "mail.retry".into(),
        queue: "mail.send.retry".into(),
        routing_key: "mail.send".into(),
    };
    node.management()
        .delete_binding(&pipeline.vhost, &binding)
        .await
        .expect("remove the retry binding");
    let smtp = SmtpServer::start();
    // Every third request is malformed (dead-lettered, routed), the others are refused
    // once (parked, unroutable) and sent at their next try.
    let published = publish(&pipeline, 0..150, |i| {
        if i % 3 == 0 {
            "not an address".into()
        } else {
            format!("f-{i:04}+451once@example.com")
        }
    })
    .await;
    let proxy = SmtpProxy::start(smtp.port, Mode::Slow).await;
    let kubelet = Kubelet::start(
        &pipeline.amqp_url(),
        &smtp_url(proxy.port),
        // Each request parked or sent gets a line, so a lost one shows which it was.
        &[
            ("MAIL_PUBLISH_TIMEOUT", "3s"),
            ("RUST_LOG", "warn,mailer::worker::delivery=debug"),
        ],
    );
    eventually(60, "some requests through", || async {
        (depth(&pipeline, "mail.send.dead").await >= 5).then_some(())
    })
    .await;
    let clear = Undo(&["set_vm_memory_high_watermark", "0.4"]);
    node.ctl(&["set_vm_memory_high_watermark", "0.0000001"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(clear);
    let cleared = Instant::now();
    let good = published.len() - published.len().div_ceil(3);
    // Not `eventually`: when they are not all delivered, the tally says where they went.
    let all_delivered = within(240, || async {
        (distinct(&delivered(&smtp)) == good).then_some(())
    })
    .await
    .is_some();
    let recovered = cleared.elapsed();
    let restarts = kubelet.restarts();
    // What the worker running now says, had it stalled (printed before it is stopped,
    // which fails when it does not stop).
    let [in_flight, blocked, paused] = [
        "mailer_worker_in_flight",
        "mailer_worker_publishing_blocked",
        "mailer_worker_provider_paused",
    ]
    .map(|name| kubelet.metric(name));
    let worker_then = format!(
        "the worker then: probes {:?}, {in_flight} deliveries in flight, \
         publishing blocked {blocked}, provider paused {paused}",
        kubelet.probes()
    );
    if !all_delivered {
        println!("not all delivered after 240s; {worker_then}");
    }
    kubelet.stop();
    let tally = Tally::take(
        "memory alarm 5s past a 3s publish timeout, unroutable parks among dead letters",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;
    let timing = if all_delivered {
        format!(
            "all delivered {} after the alarm cleared; {restarts} worker exits",
            secs(recovered)
        )
    } else {
        format!(
            "NOT all delivered {} after the alarm cleared; {restarts} worker exits; {worker_then}",
            secs(recovered)
        )
    };
    tally.report(&timing);
    assert!(all_delivered, "{}", tally.line(&timing));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn retry_queue_full() {
    let pipeline = Pipeline::new("full", "retryQueueMaxLength: 2").await;
    let smtp = SmtpServer::start();
    let published = publish(&pipeline, 0..30, |_| "busy+450@example.com".into()).await;
    let started = Instant::now();
    let kubelet = Kubelet::start(
        &pipeline.amqp_url(),
        &smtp_url(smtp.port),
        &[("MAIL_MAX_ATTEMPTS", "3")],
    );
    // The depth may count a request twice (dead-lettered by the worker, then again by the
    // delivery limit after its ack was lost), so it is at least the published count, with
    // nothing waiting in the send or delay queue.
    eventually(150, "every request dead-lettered", || async {
        let dead = depth(&pipeline, "mail.send.dead").await as usize;
        let waiting =
            depth(&pipeline, "mail.send").await + depth(&pipeline, "mail.send.retry").await;
        (dead >= published.len() && waiting == 0).then_some(())
    })
    .await;
    let took = started.elapsed();
    let restarts = kubelet.restarts();
    let failed = kubelet.exits_failed();
    kubelet.stop();
    let tally = Tally::take(
        "retry queue full (max-length 2, reject-publish)",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;
    tally.report(&format!(
        "all dead-lettered within {}; {restarts} worker exits, each non-zero",
        secs(took)
    ));
    assert!(failed, "a failed park exits non-zero");
    assert!(restarts > 0, "the full retry queue refused parks");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn send_queue_deleted() {
    let pipeline = Pipeline::new("deleted", "").await;
    let smtp = SmtpServer::start();
    let kubelet = Kubelet::start(&pipeline.amqp_url(), &smtp_url(smtp.port), &[]);
    eventually(30, "ready", || async {
        kubelet.readyz().filter(|(status, _)| *status == 200)
    })
    .await;
    let deleted = Instant::now();
    pipeline.delete_queue("mail.send").await;
    let exited = eventually(30, "the worker's exit", || async {
        kubelet.exited_after(deleted)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let probes_gone = kubelet.probes();
    pipeline.apply().await;
    let repaired = Instant::now();
    eventually(60, "ready again", || async {
        kubelet.readyz().filter(|(status, _)| *status == 200)
    })
    .await;
    let recovered = repaired.elapsed();
    let published = publish(&pipeline, 0..20, |_| "ok@example.com".into()).await;
    eventually(30, "every mail delivered", || async {
        (distinct(&delivered(&smtp)) == published.len()).then_some(())
    })
    .await;
    let failed = kubelet.exits_failed();
    kubelet.stop();
    let tally = Tally::take(
        "send queue deleted, then the topology applied",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;
    tally.report(&format!(
        "exit {} after the delete; probes {probes_gone:?} while it is missing; ready {} after apply",
        secs(exited - deleted),
        secs(recovered)
    ));
    assert!(failed, "a cancelled consumer exits non-zero");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn a_provider_that_panics() {
    let pipeline = Pipeline::new("panic", "").await;
    // Ten good requests behind twenty that panic: more than a prefetch of panics.
    let mut published = publish(&pipeline, 0..20, |_| "panic@example.com".into()).await;
    published.extend(publish(&pipeline, 20..30, |_| "ok@example.com".into()).await);
    let provider = Arc::new(TestProvider::default());
    let started = Instant::now();
    let worker = InProcess::start(&pipeline.amqp_url(), provider.clone(), 16);
    eventually(
        90,
        "the panicking ones dead-lettered, the good ones sent",
        || async {
            (depth(&pipeline, "mail.send.dead").await == 20 && worker.settled("sent") == 10)
                .then_some(())
        },
    )
    .await;
    let took = started.elapsed();
    let panicked = worker.settled("panicked");
    let ready = worker.health.is_ready();
    assert!(worker.stop().await.is_ok());
    let sent: Vec<String> = provider
        .sent
        .lock()
        .unwrap()
        .iter()
        .map(|id| {
            id.trim_matches(['<', '>'])
                .split('@')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(distinct(&sent), 10);
    let tally = Tally::take(
        "provider panics (20 of 30 requests)",
        &pipeline,
        published,
        sent,
    )
    .await;
    tally.report(&format!(
        "{panicked} panics rejected with requeue, counted; settled within {}; ready throughout: {ready}",
        secs(took)
    ));
    assert!(ready);
}
