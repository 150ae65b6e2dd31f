//! `mailer worker` sending through an HTTP API's stand-in ([`mailer_testkit::api`]): its
//! answers parked or dead-lettered as the outcome table says, and `MAIL_RATE_LIMIT`
//! holding the rate without parking or spending an attempt; a refused key holding the
//! mail without spending an attempt, and saying so.

use std::time::Duration;

use lapin::types::FieldTable;
use mailer_testkit::api::{Answer, ApiStandIn, Service};
use mailer_testkit::broker::{confirming_channel, publish};
use mailer_testkit::process::{eventually, exit_within, free_port, http_get, start_worker_with};
use serde_json::json;

use super::{dead_letters, pipeline, properties, ready, request, start_worker, terminate};

#[tokio::test]
async fn mail_goes_through_an_api_and_its_answers_park_or_dead_letter() {
    let api = ApiStandIn::start(Service::Ses).await;
    let vhost = pipeline("api-ses").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let mut worker = start_worker(&vhost, &api.url(), 5);
    let send = |id: String| {
        let channel = channel.clone();
        async move {
            let body = request(&["a@example.com"]);
            publish(
                &channel,
                "mail",
                "mail.send",
                &body,
                properties(&id, FieldTable::default()),
            )
            .await;
        }
    };

    // A 503 parks the request; its retry (attempt 2) is taken.
    api.answer_next([Answer::new(503, "Service Unavailable").with_header("retry-after", "1")]);
    send("parked-then-sent".into()).await;
    eventually(30, "the parked request sent on its retry", || async {
        (api.taken() == 1).then_some(())
    })
    .await;
    assert_eq!(api.requests(), 2, "the 503, then the retry");
    assert_eq!(
        api.received()[0].message_id,
        "<parked-then-sent@shop.example>"
    );

    // A 400 with SES's message dead-letters it as rejected, quoting SES.
    api.answer_next([Answer::new(
        400,
        json!({"message": "Email address is not verified."}).to_string(),
    )
    .with_header("x-amzn-ErrorType", "MessageRejected:")]);
    send("rejected".into()).await;
    let dead = dead_letters(&channel, 1, Duration::from_secs(30)).await;
    assert_eq!(dead[0].message_id, "rejected");
    assert_eq!(dead[0].reason.as_deref(), Some("rejected"));
    assert!(
        dead[0].error.contains(
            "ses://eu-west-1: HTTP 400 Bad Request: MessageRejected: Email address is not verified."
        ),
        "{}",
        dead[0].error
    );

    // Then mail flows, signed and checked, on the pooled connections.
    for n in 0..20 {
        send(format!("flow-{n}")).await;
    }
    eventually(30, "20 more mails taken", || async {
        (api.taken() == 21).then_some(())
    })
    .await;
    assert_eq!(api.problems(), Vec::<String>::new());
    assert!(api.connections() <= 16, "{} connections", api.connections());
    assert_eq!(ready(&channel, "mail.send.retry").await, 0);
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());
}

/// 1,200 mails at `MAIL_RATE_LIMIT=20`, a minute's worth: they reach the API at 20 a
/// second (within 10%, in any second as over the whole minute), and every one is sent on
/// its first attempt: nothing parked, nothing dead.
#[tokio::test]
async fn the_rate_limit_holds_within_ten_percent_and_spends_no_attempt() {
    const MAILS: usize = 1200;
    const RATE: f64 = 20.0;
    let api = ApiStandIn::start(Service::SendGrid).await;
    let vhost = pipeline("api-rate").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let body = request(&["a@example.com"]);
    for n in 0..MAILS {
        let id = format!("rate-{n:04}");
        publish(
            &channel,
            "mail",
            "mail.send",
            &body,
            properties(&id, FieldTable::default()),
        )
        .await;
    }
    let port = free_port();
    let http_addr = format!("127.0.0.1:{port}");
    let mut worker = start_worker_with(
        &vhost.amqp_url(),
        &api.url(),
        &[
            ("MAIL_RATE_LIMIT", "20"),
            ("MAIL_PREFETCH", "20"),
            ("MAIL_HTTP_ADDR", &http_addr),
        ],
    );
    eventually(120, "every mail taken", || async {
        (api.taken() == MAILS).then_some(())
    })
    .await;
    let received = api.received();
    let first = received[0].at;
    let span = received[MAILS - 1].at - first;
    let rate = (MAILS - 1) as f64 / span.as_secs_f64();
    println!("{MAILS} mails at MAIL_RATE_LIMIT={RATE} took {span:?}: {rate:.2} mails/s");
    assert!(
        (RATE * 0.9..=RATE * 1.1).contains(&rate),
        "{rate:.2} mails/s over {span:?}"
    );
    let busiest = received
        .iter()
        .map(|start| {
            received
                .iter()
                .filter(|r| r.at >= start.at && r.at - start.at < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or_default();
    assert!(
        busiest as f64 <= RATE * 1.1,
        "{busiest} mails in one second"
    );

    let mut ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), MAILS, "each mail once");
    let (_, metrics) = http_get(port, "/metrics").expect("the worker's metrics");
    let settled = |outcome: &str| {
        let series = format!("mailer_worker_deliveries_total{{outcome=\"{outcome}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap_or(u64::MAX))
    };
    assert_eq!(settled("sent"), MAILS as u64, "{metrics}");
    assert_eq!(settled("parked"), 0, "no attempt spent waiting");
    assert_eq!(settled("dead_lettered"), 0);
    assert_eq!(ready(&channel, "mail.send.retry").await, 0);
    assert_eq!(ready(&channel, "mail.send.dead").await, 0);
    assert_eq!(api.problems(), Vec::<String>::new());
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());
}

/// A key the API refuses (twice, then takes): the worker takes no more mail while it is
/// refused, spends no attempt (with `MAIL_MAX_ATTEMPTS=1` a spent one would give the mail
/// up), says why on `/readyz`, and holds the connection that tells the operator; once the
/// key is taken, every mail is sent and both go.
#[tokio::test]
async fn a_refused_key_holds_the_mail_spends_no_attempt_and_says_so() {
    const MAILS: usize = 3;
    let api = ApiStandIn::start(Service::SendGrid).await;
    let vhost = pipeline("api-refused-key").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    api.answer_next([
        Answer::new(401, json!({"errors": [{"message": "The provided authorization grant is invalid, expired, or revoked"}]}).to_string()),
        Answer::new(401, "Unauthorized"),
    ]);
    for n in 0..MAILS {
        publish(
            &channel,
            "mail",
            "mail.send",
            &request(&["a@example.com"]),
            properties(&format!("held-{n}"), FieldTable::default()),
        )
        .await;
    }
    let port = free_port();
    let http_addr = format!("127.0.0.1:{port}");
    let mut worker = start_worker_with(
        &vhost.amqp_url(),
        &api.url(),
        &[
            ("MAIL_MAX_ATTEMPTS", "1"),
            ("MAIL_PREFETCH", "1"),
            ("MAIL_HTTP_ADDR", &http_addr),
        ],
    );
    let management = mailer_testkit::broker::management();
    let signalled = || async {
        management
            .connection_names(&vhost.name, "guest")
            .await
            .expect("the vhost's connections")
            .iter()
            .any(|name| name == mailer::mail::CREDENTIALS_REFUSED_CONNECTION)
    };
    eventually(20, "/readyz says the provider refuses the key", || async {
        http_get(port, "/readyz").filter(|(status, body)| {
            *status == 503 && body.contains("the provider refuses the key")
        })
    })
    .await;
    eventually(20, "the connection that tells the operator", || async {
        signalled().await.then_some(())
    })
    .await;
    assert_eq!(api.taken(), 0, "nothing is sent while the key is refused");

    eventually(60, "every mail sent once the key is taken", || async {
        (api.taken() == MAILS).then_some(())
    })
    .await;
    assert_eq!(
        api.requests(),
        MAILS + 2,
        "one send at a time probed the refusing API"
    );
    assert_eq!(
        ready(&channel, "mail.send.dead").await,
        0,
        "no attempt was spent: nothing given up"
    );
    eventually(20, "ready again", || async {
        http_get(port, "/readyz").filter(|(status, _)| *status == 200)
    })
    .await;
    eventually(20, "the telling connection closed", || async {
        (!signalled().await).then_some(())
    })
    .await;
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());
}
