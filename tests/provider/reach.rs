//! Whether a failed send reached the SMTP server (so its attempt counts), when the
//! provider says it is paused, and what `MAIL_SEND_TIMEOUT` (`send_within`'s limit)
//! covers: the transaction, not the wait for a free connection of the pool.

use std::time::{Duration, Instant};

use mailer::provider::{self, ErrorClass, Provider};

use crate::mail;
use mailer_testkit::smtp::{SmtpServer, TempDir, closed_port};

fn smtp(port: u16, options: &str) -> std::sync::Arc<dyn Provider> {
    provider::from_url(&format!("smtp://127.0.0.1:{port}?tls=none{options}")).expect("valid")
}

#[tokio::test]
async fn refused_connects_and_the_pause_after_them_never_reach_the_server_until_it_answers() {
    let port = closed_port();
    let provider = smtp(port, "&timeout=5s");
    assert_eq!(provider.paused().map(|pause| pause.until), None);
    for n in 0..5 {
        let error = provider
            .send(mail(&["a@example.com"], &format!("refused-{n}")))
            .await
            .expect_err("nothing listens");
        assert!(!error.reached(), "send {n}: {error}");
        assert_eq!(error.class(), ErrorClass::Connect, "send {n}: {error}");
    }
    let pause = provider.paused().expect("paused after 3 refused connects");
    assert_eq!(pause.cause, mailer::provider::PauseCause::Unreachable);
    let until = pause.until;

    // The server comes back; once the pause is over the next send tries, and connects.
    let server = SmtpServer::start_on(port, TempDir::new("smtp"));
    tokio::time::sleep_until(until.into()).await;
    provider
        .send(mail(&["a@example.com"], "probe"))
        .await
        .expect("the probe connects");
    assert_eq!(
        provider.paused().map(|pause| pause.until),
        None,
        "no longer paused"
    );
    assert_eq!(server.mails().len(), 1);
}

#[tokio::test]
async fn a_refusal_or_a_deadline_after_the_greeting_reached_the_server() {
    let server = SmtpServer::start();
    let provider = server.provider("");
    let refused = provider
        .send(mail(&["busy+450@example.com"], "busy"))
        .await
        .expect_err("450");
    assert!(refused.reached(), "{refused}");

    let late = provider
        .send_within(
            mail(&["late+slow@example.com"], "late"),
            Duration::from_millis(200),
        )
        .await
        .expect_err("RCPT TO is answered after 500 ms");
    assert_eq!(late.class(), ErrorClass::Timeout, "{late}");
    assert!(late.reached(), "{late}");
    assert!(late.to_string().contains("(MAIL_SEND_TIMEOUT)"), "{late}");
}

#[tokio::test]
async fn a_server_that_never_greets_is_not_reached_within_the_deadline() {
    // Connections land in the listen backlog: TCP connects, and no one ever speaks.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    let port = silent.local_addr().expect("its address").port();
    let error = smtp(port, "")
        .send_within(
            mail(&["a@example.com"], "silent"),
            Duration::from_millis(300),
        )
        .await
        .expect_err("no greeting");
    assert_eq!(error.class(), ErrorClass::Timeout, "{error}");
    assert!(!error.reached(), "{error}");
}

#[tokio::test]
async fn the_send_deadline_starts_once_a_connection_is_free() {
    let server = SmtpServer::start();
    let provider = server.provider("&connections=1");
    // Five sends of half a second each on one connection: the last waits two seconds for
    // it, longer than the deadline, which its own transaction is well within.
    let limit = Duration::from_millis(1500);
    let started = Instant::now();
    let sends = (0..5).map(|n| {
        provider.send_within(mail(&["a+slow@example.com"], &format!("queued-{n}")), limit)
    });
    for (n, sent) in futures::future::join_all(sends)
        .await
        .into_iter()
        .enumerate()
    {
        sent.unwrap_or_else(|e| panic!("send {n} waited its turn, then sent: {e}"));
    }
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "the sends took turns on the one connection ({:?})",
        started.elapsed()
    );
    assert_eq!(server.mails().len(), 5);
    assert_eq!(server.sessions(), 1);
}
