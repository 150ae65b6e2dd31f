//! The SMTP server's faults: one that accepts and never answers, one that cuts sessions
//! in the middle of DATA, and one that is down for three minutes under a backlog.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::kubelet::Kubelet;
use crate::node::Pipeline;
use crate::proxy::{Mode, SmtpProxy};
use crate::{Tally, delivered, depth, distinct, publish, secs, smtp_url};
use mailer_testkit::process::{eventually, within};
use mailer_testkit::smtp::SmtpServer;

/// What `/readyz` says while the provider is paused.
const PROVIDER_PAUSED: &str = "the provider cannot be reached";

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn smtp_server_that_never_answers() {
    let pipeline = Pipeline::new("silent", "").await;
    let smtp = SmtpServer::start();
    let proxy = SmtpProxy::start(smtp.port, Mode::Silent).await;
    let published = publish(&pipeline, 0..30, |_| "ok@example.com".into()).await;
    // One attempt allowed: a send that waited for the greeting in vain never reached the
    // server and costs no attempt; one that counted would be given up.
    let kubelet = Kubelet::start(
        &pipeline.amqp_url(),
        &smtp_url(proxy.port),
        &[("MAIL_SEND_TIMEOUT", "3s"), ("MAIL_MAX_ATTEMPTS", "1")],
    );
    // The first sends time out waiting for the greeting; then the provider pauses
    // connecting, and the worker takes no delivery but one to probe after each pause.
    eventually(30, "/readyz: the provider cannot be reached", || async {
        kubelet
            .readyz()
            .filter(|(status, body)| *status == 503 && body.contains(PROVIDER_PAUSED))
    })
    .await;
    let before_probe = proxy.silent_sessions();
    eventually(30, "a probe after the first pause", || async {
        (proxy.silent_sessions() > before_probe).then_some(())
    })
    .await;
    let sessions = proxy.silent_sessions();
    let parked = kubelet.parked();
    assert!(
        parked < published.len(),
        "{parked} parked: the worker stopped taking the backlog"
    );
    let probes_hanging = kubelet.probes();
    proxy.set(Mode::Pass);
    let answering = Instant::now();
    eventually(90, "every mail delivered", || async {
        (distinct(&delivered(&smtp)) == published.len()).then_some(())
    })
    .await;
    let took = answering.elapsed();
    let restarts = kubelet.restarts();
    kubelet.stop();
    let tally = Tally::take(
        "SMTP server accepts and never answers (MAIL_SEND_TIMEOUT 3s, MAIL_MAX_ATTEMPTS 1)",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;
    tally.report(&format!(
        "{sessions} sessions timed out before the greeting, then the provider paused and the worker took deliveries only to probe it ({parked} parked, attempts unchanged), probes {probes_hanging:?}; all delivered {} after it answers; {restarts} restarts",
        secs(took)
    ));
    assert!(tally.dead.is_empty(), "no attempt counted");
    assert_eq!(restarts, 0);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn smtp_server_dropping_mid_data() {
    let pipeline = Pipeline::new("cut", "").await;
    let smtp = SmtpServer::start();
    let proxy = SmtpProxy::start(smtp.port, Mode::CutMidData).await;
    let published = publish(&pipeline, 0..30, |_| "ok@example.com".into()).await;
    let kubelet = Kubelet::start(&pipeline.amqp_url(), &smtp_url(proxy.port), &[]);
    eventually(30, "sessions cut", || async {
        (depth(&pipeline, "mail.send.retry").await > 0).then_some(())
    })
    .await;
    let probes_cutting = kubelet.probes();
    proxy.set(Mode::Pass);
    let passing = Instant::now();
    eventually(90, "every mail delivered", || async {
        (distinct(&delivered(&smtp)) == published.len()).then_some(())
    })
    .await;
    let took = passing.elapsed();
    let restarts = kubelet.restarts();
    kubelet.stop();
    let tally = Tally::take(
        "SMTP server drops the connection mid-DATA",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;
    tally.report(&format!(
        "cut sends parked, probes {probes_cutting:?}; all delivered {} after it stops cutting; {restarts} restarts",
        secs(took)
    ));
    assert_eq!(
        tally.twice(),
        0,
        "a send cut before DATA's end sent nothing"
    );
}

/// Issue 21's outage: 1,000 mails queued, `maxAttempts` 5, a retry delay of 30s, and the
/// SMTP server killed for three minutes once 100 are delivered. Before, the worker parked
/// the whole backlog again every 30s, each time with an attempt more, and gave most of it
/// up within the outage.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "disturbs a private broker node: make faults"]
async fn smtp_server_down_for_three_minutes_under_a_backlog() {
    const OUTAGE: Duration = Duration::from_secs(180);
    let pipeline = Pipeline::new("outage", "retryDelay: 30s").await;
    pipeline.copy_parks_to("test.parks").await;
    let smtp = SmtpServer::start();
    let published = publish(&pipeline, 0..1000, |_| "ok@example.com".into()).await;
    let kubelet = Kubelet::start(
        &pipeline.amqp_url(),
        &smtp_url(smtp.port),
        &[("MAIL_MAX_ATTEMPTS", "5")],
    );
    eventually(60, "100 mails delivered", || async {
        (distinct(&delivered(&smtp)) >= 100).then_some(())
    })
    .await;

    // Killed: its sessions are reset, and connections to its port refused.
    let (port, mail_dir) = smtp.kill();
    let down = Instant::now();
    let not_ready = within(30, || async {
        kubelet
            .readyz()
            .filter(|(status, body)| *status == 503 && body.contains(PROVIDER_PAUSED))
            .map(|_| down.elapsed())
    })
    .await;
    let paused = kubelet.sample("mailer_worker_provider_paused");
    let probes_down = kubelet.probes();
    tokio::time::sleep_until((down + OUTAGE).into()).await;
    let parked_in_outage = kubelet.parked();
    let waiting_in_outage =
        depth(&pipeline, "mail.send").await + depth(&pipeline, "mail.send.retry").await;

    let smtp = SmtpServer::start_on(port, mail_dir);
    let up = Instant::now();
    let before = delivered(&smtp).len();
    let resumed = within(60, || async {
        (delivered(&smtp).len() > before).then(|| up.elapsed())
    })
    .await;
    eventually(300, "every mail delivered or dead-lettered", || async {
        let dead = depth(&pipeline, "mail.send.dead").await as usize;
        (distinct(&delivered(&smtp)) + dead >= published.len()).then_some(())
    })
    .await;
    let settled = up.elapsed();
    let restarts = kubelet.restarts();
    kubelet.stop();
    let parks = pipeline.take_attempts("test.parks").await;
    let tally = Tally::take(
        "SMTP server killed for 3 minutes under 1,000 queued (maxAttempts 5, retryDelay 30s)",
        &pipeline,
        published,
        delivered(&smtp),
    )
    .await;

    let mut by_attempt: BTreeMap<i64, usize> = BTreeMap::new();
    for (_, attempt) in &parks {
        *by_attempt.entry(attempt.unwrap_or(0)).or_default() += 1;
    }
    let counted: BTreeSet<&String> = parks
        .iter()
        .filter(|(_, attempt)| *attempt != Some(1))
        .map(|(id, _)| id)
        .collect();
    let time = |d: Option<Duration>| d.map_or("never".to_string(), secs);
    tally.report(&format!(
        "{parked_in_outage} parks in the outage, {waiting_in_outage} waiting in the queues at its end; parks by x-mail-attempt {by_attempt:?}; /readyz 503 (provider) {} after the kill, paused gauge {paused}, probes {probes_down:?}; delivering {} after the server came back, all settled in {}; {restarts} restarts",
        time(not_ready),
        time(resumed),
        secs(settled)
    ));
    assert!(tally.dead.is_empty(), "nothing given up for an outage");
    assert!(
        counted.len() <= 4 && by_attempt.keys().all(|attempt| (1..=2).contains(attempt)),
        "only the sends cut mid-session (one per connection at most) counted an attempt: {counted:?}"
    );
    assert!(tally.twice() <= 4, "at most the sessions cut sent twice");
    assert!(
        parked_in_outage < 100,
        "the worker stopped taking the backlog: {parked_in_outage} parks"
    );
    assert!(
        not_ready.is_some() && paused == 1.0,
        "/readyz and the gauge say so"
    );
    assert_eq!(restarts, 0);
}
