//! Delay tiers end to end: `mailer worker` with `MAIL_RETRY_KEYS` parks a request whose
//! attempt n failed for now in tier min(n, tiers), and each tier's queue holds it for its
//! own delay before it comes back; and with `MAIL_RETRY_DELAYS`, a provider's
//! `Retry-After` moves a park to the first tier that waits that long.

use std::time::{Duration, Instant};

use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use mailer_testkit::api::{Answer, ApiStandIn, Service};
use mailer_testkit::broker::{confirming_channel, get_within, pipeline_of, publish};
use mailer_testkit::process::{eventually, exit_within, start_worker_with};
use mailer_testkit::smtp::SmtpServer;

use super::{properties, request, terminate};

/// The tiers' delays, in seconds: far enough apart that a park in the wrong tier shows.
const DELAYS: [u64; 4] = [1, 2, 3, 4];

/// One park seen in a tier: the attempt it was parked for, and when.
#[derive(Debug)]
struct Park {
    tier: usize,
    next_attempt: i64,
    at: Instant,
}

#[tokio::test]
async fn each_attempt_parks_in_its_tier_for_that_tiers_delay() {
    let smtp = SmtpServer::start();
    let (vhost, spec) = pipeline_of("tiers-park", "retryDelays: [1s, 2s, 3s, 4s]").await;
    let keys = spec.topology.retry_tier_keys();
    assert_eq!(keys.len(), DELAYS.len());
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let spies = spy_on_tiers(&channel, &keys).await;
    publish(
        &channel,
        "mail",
        "mail.send",
        &request(&["busy+450@example.com"]),
        properties("tiered", FieldTable::default()),
    )
    .await;
    let started = Instant::now();
    // Six attempts: the first four park in tiers 1 to 4, the fifth in tier 4 again, the
    // sixth is given up.
    let mut worker = start_worker_with(
        &vhost.amqp_url(),
        &format!("smtp://127.0.0.1:{}?tls=none", smtp.port),
        &[
            ("MAIL_MAX_ATTEMPTS", "6"),
            ("MAIL_RETRY_KEYS", keys.join(",").as_str()),
        ],
    );

    let parks = parks_seen(&channel, &spies, 5, Duration::from_secs(60)).await;
    let dead = get_within(&channel, "mail.send.dead", Duration::from_secs(30))
        .await
        .expect("given up after its sixth attempt");
    let waited = started.elapsed();
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());

    let placed: Vec<(i64, usize)> = parks.iter().map(|p| (p.next_attempt, p.tier)).collect();
    assert_eq!(
        placed,
        [(2, 1), (3, 2), (4, 3), (5, 4), (6, 4)],
        "attempt n parks in tier min(n, 4)"
    );
    // Between a park in tier t and the next park, the request waited out tier t's delay
    // (then failed again at once): it waited that tier's delay, and not a longer tier's.
    for pair in parks.windows(2) {
        let delay = Duration::from_secs(DELAYS[pair[0].tier - 1]);
        let between = pair[1].at - pair[0].at;
        assert!(
            between + Duration::from_millis(100) >= delay
                && between < delay + Duration::from_millis(900),
            "tier {} held attempt {} for {between:?}, not its {delay:?}: {parks:?}",
            pair[0].tier,
            pair[0].next_attempt - 1
        );
    }
    let total: u64 = [1, 2, 3, 4, 4].iter().sum();
    assert!(waited >= Duration::from_secs(total), "{waited:?}");
    let reason = dead
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| mailer_testkit::broker::text(h.inner().get("x-mail-dead-reason")));
    assert_eq!(reason.as_deref(), Some("gave-up"));
}

/// A copy of every park: a queue of the test's per tier, bound by the tier's key, so it
/// gets what the worker publishes to that tier and nothing else. Returns their names.
async fn spy_on_tiers(channel: &Channel, keys: &[String]) -> Vec<String> {
    let spies: Vec<String> = (1..=keys.len()).map(|tier| format!("spy.{tier}")).collect();
    for (spy, key) in spies.iter().zip(keys) {
        channel
            .queue_declare(
                spy.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare a spy queue");
        channel
            .queue_bind(
                spy.as_str().into(),
                "mail.retry".into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind a spy queue");
    }
    spies
}

/// Takes `count` parks from the spies, each with its tier and attempt, in the order seen.
async fn parks_seen(
    channel: &Channel,
    spies: &[String],
    count: usize,
    within: Duration,
) -> Vec<Park> {
    let mut parks: Vec<Park> = Vec::new();
    let deadline = Instant::now() + within;
    while parks.len() < count {
        assert!(
            Instant::now() < deadline,
            "{count} parks within {within:?}; saw {parks:?}"
        );
        for (i, spy) in spies.iter().enumerate() {
            let got = channel
                .basic_get(spy.as_str().into(), BasicGetOptions { no_ack: false })
                .await
                .expect("basic.get");
            if let Some(message) = got {
                let headers = message.delivery.properties.headers().clone();
                let attempt = headers
                    .as_ref()
                    .and_then(|h| h.inner().get("x-mail-attempt").cloned());
                let Some(AMQPValue::LongLongInt(next_attempt)) = attempt else {
                    panic!("a park without its attempt: {headers:?}");
                };
                parks.push(Park {
                    tier: i + 1,
                    next_attempt,
                    at: Instant::now(),
                });
                message
                    .delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .expect("ack");
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    parks
}

#[tokio::test]
async fn a_retry_after_parks_in_the_first_tier_that_waits_that_long() {
    let api = ApiStandIn::start(Service::SendGrid).await;
    let (vhost, spec) = pipeline_of("tiers-retry-after", "retryDelays: [1s, 2s, 4s, 8s]").await;
    let keys = spec.topology.retry_tier_keys();
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let spies = spy_on_tiers(&channel, &keys).await;
    // The first request's first attempt is asked to wait 3 s: tier 3 (4 s) is the first
    // that waits so long. The second's is asked an hour: longer than every tier, so the
    // last. Their second attempts are taken.
    api.answer_next([
        Answer::new(429, "Too Many Requests").with_header("retry-after", "3"),
        Answer::new(429, "Too Many Requests").with_header("retry-after", "3600"),
    ]);
    let mut worker = start_worker_with(
        &vhost.amqp_url(),
        &api.url(),
        &[
            ("MAIL_RETRY_KEYS", keys.join(",").as_str()),
            ("MAIL_RETRY_DELAYS", "1s,2s,4s,8s"),
            ("MAIL_PREFETCH", "1"),
        ],
    );
    for id in ["waits-3s", "waits-1h"] {
        publish(
            &channel,
            "mail",
            "mail.send",
            &request(&["a@example.com"]),
            properties(id, FieldTable::default()),
        )
        .await;
    }
    let parks = parks_seen(&channel, &spies, 2, Duration::from_secs(30)).await;
    let placed: Vec<(i64, usize)> = parks.iter().map(|p| (p.next_attempt, p.tier)).collect();
    assert_eq!(placed, [(2, 3), (2, 4)], "{parks:?}");
    eventually(30, "both sent on their second attempt", || async {
        (api.taken() == 2).then_some(())
    })
    .await;
    assert_eq!(api.requests(), 4, "two 429s, then the two retries");
    terminate(&worker);
    assert!(exit_within(&mut worker, Duration::from_secs(30)).success());
}
