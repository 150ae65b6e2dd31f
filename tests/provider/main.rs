//! The providers against real servers: `tests/smtp_server.py`, an aiosmtpd server
//! (`pip install aiosmtpd`), for SMTP, the file system for `file://`, and the testkit's
//! stand-ins of the HTTP mail APIs for `ses://`, `sendgrid://`, `postmark://` and
//! `mailgun://` ([`api`]).
//!
//! These tests need `python3` with aiosmtpd; without it they fail rather than skip.

mod api;
mod reach;
mod tls;

use std::process::Command;

use mailer::message::{Mail, parse_request};
use mailer::provider::{self, ErrorClass};
use mailer_testkit::smtp::{SmtpServer, TempDir, closed_port};
use serde_json::json;

pub fn mail(to: &[&str], message_id: &str) -> Mail {
    mail_from("Shop <noreply@shop.example>", to, message_id)
}

fn mail_from(from: &str, to: &[&str], message_id: &str) -> Mail {
    let request = json!({
        "from": from,
        "to": to,
        "subject": "Your order",
        "text": "Thanks for your order.",
        "headers": {"X-Campaign": "autumn"}
    });
    parse_request(request.to_string().as_bytes(), Some(message_id)).expect("a valid request")
}

#[tokio::test]
async fn a_mail_is_delivered_with_its_headers_and_body() {
    let server = SmtpServer::start();
    let request = json!({
        "from": "Shop <noreply@shop.example>",
        "to": ["a@example.com", "b@example.com"],
        "cc": ["c@example.com"],
        "bcc": ["d@example.com"],
        "subject": "Your order",
        "text": "Thanks for your order.",
        "headers": {"X-Campaign": "autumn"}
    });
    let mail = parse_request(request.to_string().as_bytes(), Some("order-1")).expect("valid");

    server.provider("").send(mail).await.expect("delivered");

    let mails = server.mails();
    assert_eq!(mails.len(), 1, "one mail for all recipients");
    let stored = &mails[0];
    for header in [
        "From: Shop <noreply@shop.example>\r\n",
        "To: a@example.com, b@example.com\r\n",
        "Cc: c@example.com\r\n",
        "Subject: Your order\r\n",
        "Message-ID: <order-1@shop.example>\r\n",
        "X-Campaign: autumn\r\n",
    ] {
        assert!(stored.contains(header), "{header:?} missing in:\n{stored}");
    }
    assert!(!stored.contains("d@example.com"), "Bcc shows:\n{stored}");
    let (_, body) = stored.split_once("\r\n\r\n").expect("headers, then a body");
    assert!(body.contains("Thanks for your order."), "{stored}");
}

#[tokio::test]
async fn mails_reuse_one_connection() {
    let server = SmtpServer::start();
    let provider = server.provider("");
    for n in 1..=3 {
        provider
            .send(mail(&["a@example.com"], &format!("reuse-{n}")))
            .await
            .expect("delivered");
    }
    assert_eq!(server.mails().len(), 3);
    assert_eq!(server.sessions(), 1, "all three mails used one session");
}

#[tokio::test]
async fn concurrent_mails_open_no_more_connections_than_allowed() {
    let server = SmtpServer::start();
    let provider = server.provider("&connections=2");
    let mails: Vec<Mail> = (0..6)
        .map(|n| mail(&["a@example.com"], &format!("concurrent-{n}")))
        .collect();
    let sends = mails.into_iter().map(|mail| provider.send(mail));
    for result in futures::future::join_all(sends).await {
        result.expect("delivered");
    }
    assert_eq!(server.mails().len(), 6);
    let sessions = server.sessions();
    assert!((1..=2).contains(&sessions), "{sessions} sessions");
}

#[tokio::test]
async fn a_550_recipient_fails_for_good_with_the_reply() {
    let server = SmtpServer::start();
    let error = server
        .provider("")
        .send(mail(&["gone+550@example.com"], "refused-550"))
        .await
        .expect_err("refused");
    assert!(error.is_for_good(), "{error}");
    assert_eq!(error.class(), ErrorClass::PermanentReply);
    let message = error.to_string();
    assert!(message.contains("550 5.1.1 no such user"), "{message}");
    assert!(message.contains("gone+550@example.com"), "{message}");
    assert!(server.mails().is_empty());
}

#[tokio::test]
async fn a_450_recipient_fails_for_now() {
    let server = SmtpServer::start();
    let error = server
        .provider("")
        .send(mail(&["busy+450@example.com"], "refused-450"))
        .await
        .expect_err("refused");
    assert!(!error.is_for_good(), "{error}");
    assert_eq!(error.class(), ErrorClass::TemporaryReply);
    assert!(
        error.to_string().contains("450 4.2.0 mailbox busy"),
        "{error}"
    );
    assert!(server.mails().is_empty());
}

#[tokio::test]
async fn a_450_then_a_550_recipient_fails_for_good_and_sends_nothing() {
    let server = SmtpServer::start();
    let provider = server.provider("");
    let error = provider
        .send(mail(
            &[
                "ok@example.com",
                "busy+450@example.com",
                "gone+550@example.com",
            ],
            "partial",
        ))
        .await
        .expect_err("refused");
    assert!(error.is_for_good(), "{error}");
    assert_eq!(error.class(), ErrorClass::PermanentReply);
    let message = error.to_string();
    assert!(message.contains("450 4.2.0"), "{message}");
    assert!(message.contains("550 5.1.1"), "{message}");
    assert!(server.mails().is_empty(), "nobody got a partial send");

    // The connection was reset, not lost: the next mail goes over it.
    provider
        .send(mail(&["ok@example.com"], "after-reset"))
        .await
        .expect("delivered");
    assert_eq!(server.mails().len(), 1);
    assert_eq!(server.sessions(), 1);
}

#[tokio::test]
async fn a_5xx_to_the_session_fails_for_now_so_a_misconfigured_relay_dead_letters_nothing() {
    let server = SmtpServer::start();
    let cases = [
        ("noreply+530@shop.example", ErrorClass::Auth, "530 5.7.0"),
        (
            "noreply+554@shop.example",
            ErrorClass::Protocol,
            "554 5.7.1",
        ),
    ];
    for (from, class, reply) in cases {
        // A provider each: a refused login pauses the one that got it.
        let provider = server.provider("");
        let error = provider
            .send(mail_from(from, &["ok@example.com"], "session"))
            .await
            .expect_err("refused");
        assert!(!error.is_for_good(), "{error}");
        assert_eq!(error.class(), class, "{error}");
        assert!(error.to_string().contains(reply), "{error}");
        // A refused login spends no attempt and pauses sending; the others do neither.
        let auth = class == ErrorClass::Auth;
        assert_eq!(error.reached(), !auth, "{error}");
        assert_eq!(
            provider.paused().map(|pause| pause.cause),
            auth.then_some(mailer::provider::PauseCause::CredentialsRefused),
            "{error}"
        );
    }
    assert!(server.mails().is_empty());
}

#[tokio::test]
async fn a_550_recipient_then_a_closing_server_fails_for_good() {
    let server = SmtpServer::start();
    let error = server
        .provider("")
        .send(mail(
            &["gone+550@example.com", "later+421@example.com"],
            "closing",
        ))
        .await
        .expect_err("refused");
    assert!(error.is_for_good(), "{error}");
    assert_eq!(error.class(), ErrorClass::PermanentReply);
    let message = error.to_string();
    assert!(
        message.contains("550 5.1.1") && message.contains("421 4.3.2"),
        "{message}"
    );
    assert!(server.mails().is_empty());
}

#[tokio::test]
async fn a_closed_port_fails_for_now() {
    let provider = provider::from_url(&format!(
        "smtp://127.0.0.1:{}?tls=none&timeout=5s",
        closed_port()
    ))
    .expect("valid");
    let error = provider
        .send(mail(&["a@example.com"], "nowhere"))
        .await
        .expect_err("nothing listens");
    assert!(!error.is_for_good(), "{error}");
    assert_eq!(error.class(), ErrorClass::Connect, "{error}");
    assert!(error.to_string().starts_with("127.0.0.1:"), "{error}");
}

/// A server that closes every connection before its greeting, counting them.
async fn hanging_up_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a local port");
    let port = listener.local_addr().expect("its address").port();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            // Counted before the client can see the connection end.
            counter.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, accepted)
}

#[tokio::test]
async fn a_server_that_keeps_hanging_up_is_left_alone_and_sends_fail_for_now_at_once() {
    use std::sync::atomic::Ordering;
    let (port, accepted) = hanging_up_server().await;
    let provider = provider::from_url(&format!(
        "smtp://127.0.0.1:{port}?tls=none&timeout=5s&connections=1"
    ))
    .expect("valid");
    let mut errors = Vec::new();
    for n in 0..5 {
        let error = provider
            .send(mail(&["a@example.com"], &format!("hang-up-{n}")))
            .await
            .expect_err("the server hangs up");
        errors.push(error);
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "three connects in a row failed, then none was tried: {errors:#?}"
    );
    for error in &errors {
        assert!(!error.is_for_good(), "parked, not dead-lettered: {error}");
        assert_eq!(error.class(), errors[0].class(), "{error}");
    }
    let paused = errors[3].to_string();
    assert!(
        paused.starts_with(&errors[2].to_string())
            && paused.contains("connecting failed 3 times in a row: not trying again for up to 1s"),
        "names the last failure and the pause: {paused}"
    );
}

#[tokio::test]
async fn a_server_without_starttls_is_refused_when_tls_is_required() {
    let server = SmtpServer::start();
    let provider = provider::from_url(&format!("smtp://127.0.0.1:{}", server.port)).expect("valid");
    let error = provider
        .send(mail(&["a@example.com"], "needs-tls"))
        .await
        .expect_err("no STARTTLS");
    assert!(!error.is_for_good(), "{error}");
    assert_eq!(error.class(), ErrorClass::Tls);
    assert!(
        error
            .to_string()
            .contains("use tls=opportunistic or tls=none"),
        "says what to fix: {error}"
    );
    assert!(server.mails().is_empty());
}

#[tokio::test]
async fn a_pooled_connection_the_server_dropped_is_replaced() {
    let server = SmtpServer::start();
    let provider = server.provider("");
    provider
        .send(mail(&["a@example.com"], "before-restart"))
        .await
        .expect("delivered");

    let server = server.restart();
    provider
        .send(mail(&["a@example.com"], "after-restart"))
        .await
        .expect("delivered over a new connection");
    let mails = server.mails();
    assert_eq!(mails.len(), 2, "each server stored one mail");
    assert!(mails[1].contains("<after-restart@shop.example>"));
}

#[tokio::test]
async fn the_file_provider_writes_a_parseable_eml_named_after_the_message_id() {
    let dir = TempDir::new("file");
    let out = dir.0.join("out");
    let url = url::Url::from_directory_path(&out).expect("an absolute path");
    let provider = provider::from_url(url.as_str()).expect("valid");
    provider
        .send(mail(&["a@example.com"], "order-7"))
        .await
        .expect("written");

    let path = out.join("order-7@shop.example.eml");
    assert!(path.is_file(), "{} is missing", path.display());
    let names: Vec<_> = std::fs::read_dir(&out)
        .expect("the directory")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");

    // Python's email package, a parser no one here wrote, reads it back.
    let parsed = Command::new("python3")
        .arg("-c")
        .arg(
            "import email, sys\n\
             m = email.message_from_binary_file(open(sys.argv[1], 'rb'))\n\
             print(m['Message-ID']); print(m['Subject']); print(m['X-Campaign'])\n\
             print(m.get_payload(decode=True).decode().strip())",
        )
        .arg(&path)
        .output()
        .expect("python3 runs");
    assert!(parsed.status.success(), "{parsed:?}");
    assert_eq!(
        String::from_utf8_lossy(&parsed.stdout),
        "<order-7@shop.example>\nYour order\nautumn\nThanks for your order.\n"
    );
}

#[tokio::test]
async fn the_discard_provider_accepts_every_mail() {
    let provider = provider::from_url("discard://").expect("valid");
    provider
        .send(mail(&["gone+550@example.com"], "dropped"))
        .await
        .expect("accepted");
}
