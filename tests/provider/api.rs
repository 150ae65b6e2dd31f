//! The HTTP API providers against the testkit's stand-ins ([`mailer_testkit::api`]), which
//! check each request as the service does (SES's SigV4 signature with the test's key and
//! clock, the key, the path, the fields the service requires) and answer its documented
//! errors in turn.

use std::time::Duration;

use mailer::message::{Mail, parse_request};
use mailer::provider::{self, ErrorClass, Failure, PauseCause, Provider, SendError};
use mailer_testkit::api::{Answer, ApiStandIn, Received, SECRET, Service};
use mailer_testkit::smtp::closed_port;
use serde_json::{Value, json};

/// A mail with every field a provider maps.
fn full_mail(message_id: &str) -> Mail {
    let request = json!({
        "from": "Shop <noreply@shop.example>",
        "to": ["a@example.com", "Bea <b@example.com>"],
        "cc": ["c@example.com"],
        "bcc": ["d@example.com"],
        "reply_to": "help@shop.example",
        "subject": "Your order",
        "text": "Thanks for your order.",
        "html": "<p>Thanks for your order.</p>",
        "headers": {"X-Campaign": "autumn"}
    });
    parse_request(request.to_string().as_bytes(), Some(message_id)).expect("a valid request")
}

async fn send(provider: &dyn Provider, message_id: &str) -> Result<(), SendError> {
    provider.send(full_mail(message_id)).await
}

fn the_one(stand_in: &ApiStandIn) -> Received {
    assert_eq!(
        stand_in.problems(),
        Vec::<String>::new(),
        "{:?}",
        stand_in.service()
    );
    let mut received = stand_in.received();
    assert_eq!(received.len(), 1, "{:?}", stand_in.service());
    received.remove(0)
}

/// For the APIs that take the MIME message: the headers it carries, and no Bcc.
fn assert_raw_message(raw: &str) {
    for header in [
        "From: Shop <noreply@shop.example>\r\n",
        "To: a@example.com, Bea <b@example.com>\r\n",
        "Cc: c@example.com\r\n",
        "Reply-To: help@shop.example\r\n",
        "Subject: Your order\r\n",
        "Message-ID: <api-1@shop.example>\r\n",
        "X-Campaign: autumn\r\n",
    ] {
        assert!(raw.contains(header), "{header:?} missing in:\n{raw}");
    }
    assert!(raw.contains("Thanks for your order."), "{raw}");
    assert!(raw.contains("<p>Thanks for your order.</p>"), "{raw}");
    assert!(!raw.contains("d@example.com"), "the Bcc shows:\n{raw}");
}

#[tokio::test]
async fn each_api_gets_every_field_of_a_mail_as_it_documents_them() {
    for service in Service::ALL {
        let stand_in = ApiStandIn::start(service).await;
        let provider = provider::from_url(&stand_in.url()).expect("the stand-in's URL");
        send(provider.as_ref(), "api-1").await.unwrap_or_else(|e| {
            panic!("{service:?}: {e}; the stand-in: {:?}", stand_in.problems())
        });
        let mail = the_one(&stand_in);
        assert_eq!(mail.message_id, "<api-1@shop.example>", "{service:?}");
        let mut recipients = mail.recipients.clone();
        recipients.sort();
        assert_eq!(
            recipients,
            [
                "a@example.com",
                "b@example.com",
                "c@example.com",
                "d@example.com"
            ],
            "{service:?}"
        );
        let j = &mail.json;
        match service {
            Service::Ses => {
                assert_eq!(j["FromEmailAddress"], "noreply@shop.example");
                assert_eq!(
                    j["Destination"],
                    json!({"ToAddresses": ["a@example.com", "b@example.com"],
                           "CcAddresses": ["c@example.com"], "BccAddresses": ["d@example.com"]})
                );
                assert_raw_message(mail.raw.as_deref().expect("raw content"));
            }
            Service::SendGrid => {
                assert_eq!(
                    j["personalizations"],
                    json!([{"to": [{"email": "a@example.com"}, {"email": "b@example.com", "name": "Bea"}],
                            "cc": [{"email": "c@example.com"}], "bcc": [{"email": "d@example.com"}]}])
                );
                assert_eq!(
                    j["from"],
                    json!({"email": "noreply@shop.example", "name": "Shop"})
                );
                assert_eq!(j["reply_to"], json!({"email": "help@shop.example"}));
                assert_eq!(j["subject"], "Your order");
                assert_eq!(
                    j["content"],
                    json!([{"type": "text/plain", "value": "Thanks for your order."},
                           {"type": "text/html", "value": "<p>Thanks for your order.</p>"}])
                );
                assert_eq!(
                    j["headers"],
                    json!({"X-Campaign": "autumn", "Message-ID": "<api-1@shop.example>"})
                );
            }
            Service::Postmark => {
                assert_eq!(j["From"], "Shop <noreply@shop.example>");
                assert_eq!(j["To"], "a@example.com, Bea <b@example.com>");
                assert_eq!(j["Cc"], "c@example.com");
                assert_eq!(j["Bcc"], "d@example.com");
                assert_eq!(j["ReplyTo"], "help@shop.example");
                assert_eq!(j["Subject"], "Your order");
                assert_eq!(j["TextBody"], "Thanks for your order.");
                assert_eq!(j["HtmlBody"], "<p>Thanks for your order.</p>");
                assert_eq!(
                    j["Headers"],
                    json!([{"Name": "X-Campaign", "Value": "autumn"},
                           {"Name": "Message-ID", "Value": "<api-1@shop.example>"}])
                );
            }
            Service::Mailgun => {
                assert_eq!(
                    j["to"],
                    "a@example.com,b@example.com,c@example.com,d@example.com"
                );
                assert_raw_message(mail.raw.as_deref().expect("the message field"));
            }
        }
    }
}

/// The documented errors of `service` (a 400 with the service's own message among
/// them), each with the outcome it must map to and what the error must quote.
fn documented_errors(service: Service) -> Vec<(Answer, Failure, ErrorClass, &'static str)> {
    use ErrorClass::{Auth, PermanentReply, TemporaryReply};
    use Failure::{ForGood, ForNow};
    let json_error = |status, body: Value| Answer::new(status, body.to_string());
    let mut errors = vec![
        (
            json_error(429, json!({"message": "Too Many Requests"}))
                .with_header("retry-after", "7"),
            ForNow,
            TemporaryReply,
            "(Retry-After: 7s)",
        ),
        (
            Answer::new(500, "Internal Server Error"),
            ForNow,
            TemporaryReply,
            "HTTP 500",
        ),
        (
            Answer::new(503, "Service Unavailable"),
            ForNow,
            TemporaryReply,
            "HTTP 503",
        ),
        (Answer::new(401, "Unauthorized"), ForNow, Auth, "HTTP 401"),
        (Answer::new(403, "Forbidden"), ForNow, Auth, "HTTP 403"),
    ];
    let rejected = match service {
        Service::Ses => json_error(
            400,
            json!({"message": "Email address is not verified. The following identities failed the check in region EU-WEST-1: noreply@shop.example"}),
        )
        .with_header("x-amzn-ErrorType", "MessageRejected:"),
        Service::SendGrid => json_error(
            400,
            json!({"errors": [{"message": "Does not contain a valid address.", "field": "from.email", "help": null}]}),
        ),
        Service::Postmark => json_error(
            422,
            json!({"ErrorCode": 300, "Message": "Invalid 'To' address: 'a@example'."}),
        ),
        Service::Mailgun => json_error(
            400,
            json!({"message": "'from' parameter is not a valid address. please check documentation"}),
        ),
    };
    let said = match service {
        Service::Ses => "MessageRejected: Email address is not verified.",
        Service::SendGrid => "from.email: Does not contain a valid address.",
        Service::Postmark => "ErrorCode 300: Invalid 'To' address",
        Service::Mailgun => "'from' parameter is not a valid address",
    };
    errors.push((rejected, ForGood, PermanentReply, said));
    match service {
        Service::Ses => errors.push((
            json_error(
                400,
                json!({"message": "Sending is paused for this account."}),
            )
            .with_header("x-amzn-ErrorType", "SendingPausedException:"),
            ForNow,
            TemporaryReply,
            "SendingPausedException: Sending is paused",
        )),
        Service::Postmark => errors.push((
            json_error(
                422,
                json!({"ErrorCode": 10, "Message": "Bad or missing API token"}),
            ),
            ForNow,
            Auth,
            "ErrorCode 10: Bad or missing API token",
        )),
        Service::SendGrid | Service::Mailgun => {}
    }
    errors
}

#[tokio::test]
async fn each_documented_error_maps_to_its_outcome() {
    for service in Service::ALL {
        let stand_in = ApiStandIn::start(service).await;
        let errors = documented_errors(service);
        stand_in.answer_next(errors.iter().map(|(answer, ..)| answer.clone()));
        for (n, (answer, failure, class, quoted)) in errors.iter().enumerate() {
            // A provider each: a refused key pauses the one that got it.
            let provider = provider::from_url(&stand_in.url()).expect("the stand-in's URL");
            let error = send(provider.as_ref(), &format!("error-{n}"))
                .await
                .expect_err("the stand-in answered an error");
            let what = format!("{service:?} {}: {error}", answer.status);
            assert_eq!(error.failure(), *failure, "{what}");
            assert_eq!(error.class(), *class, "{what}");
            // A refused key spends no attempt; any other answer does.
            assert_eq!(error.reached(), *class != ErrorClass::Auth, "{what}");
            assert!(error.message().contains(quoted), "{what}");
            assert!(error.message().starts_with(&provider.to_string()), "{what}");
            let retry_after = (answer.status == 429).then_some(Duration::from_secs(7));
            assert_eq!(error.retry_after(), retry_after, "{what}");
        }
        let provider = provider::from_url(&stand_in.url()).expect("the stand-in's URL");
        send(provider.as_ref(), "after-the-errors")
            .await
            .unwrap_or_else(|e| panic!("{service:?}: {e}"));
        assert_eq!(
            the_one(&stand_in).message_id,
            "<after-the-errors@shop.example>"
        );
        assert_eq!(stand_in.requests(), errors.len() + 1, "{service:?}");
    }
}

#[tokio::test]
async fn a_refused_key_pauses_the_provider_until_a_send_is_taken() {
    let stand_in = ApiStandIn::start(Service::Postmark).await;
    let provider = provider::from_url(&stand_in.url()).expect("the stand-in's URL");
    stand_in.answer_next([Answer::new(401, "Unauthorized")]);
    let refused = send(provider.as_ref(), "refused").await.expect_err("a 401");
    assert!(
        !refused.reached() && refused.class() == ErrorClass::Auth,
        "{refused}"
    );
    let pause = provider.paused().expect("paused by the refusal");
    assert_eq!(pause.cause, PauseCause::CredentialsRefused);
    // While paused, a send fails at once and never reaches the provider.
    let fast = send(provider.as_ref(), "while-paused")
        .await
        .expect_err("paused");
    assert!(
        !fast.reached() && fast.message().contains("HTTP 401"),
        "{fast}"
    );
    assert_eq!(stand_in.requests(), 1, "the paused send reached nobody");
    // Once the pause is over, a send tries; the stand-in takes it, and the pause ends.
    tokio::time::sleep_until(pause.until.into()).await;
    send(provider.as_ref(), "after-the-pause")
        .await
        .expect("taken once the key is accepted again");
    assert_eq!(provider.paused(), None);
    assert_eq!(stand_in.requests(), 2);
}

#[tokio::test]
async fn a_wrong_key_is_refused_by_the_service_and_fails_for_now_as_auth_without_showing_it() {
    for service in Service::ALL {
        let stand_in = ApiStandIn::start(service).await;
        let wrong = "wr0ng/Key+s3cret";
        let provider = provider::from_url(&stand_in.url_with_key(wrong)).expect("a URL");
        let error = send(provider.as_ref(), "wrong-key")
            .await
            .expect_err("the stand-in refuses the key");
        let what = format!("{service:?}: {error}");
        assert_eq!(error.failure(), Failure::ForNow, "{what}");
        assert_eq!(error.class(), ErrorClass::Auth, "{what}");
        for shown in [
            error.to_string(),
            format!("{provider}"),
            format!("{provider:?}"),
        ] {
            assert!(!shown.contains(wrong) && !shown.contains(SECRET), "{shown}");
        }
        assert_eq!(stand_in.problems().len(), 1, "{what}");
        assert!(stand_in.received().is_empty());
    }
    // SES: the signature itself is checked, not only the key id.
    let stand_in = ApiStandIn::start(Service::Ses).await;
    send(
        provider::from_url(&stand_in.url_with_key("t3st/Secret+Kez"))
            .unwrap()
            .as_ref(),
        "x",
    )
    .await
    .expect_err("a signature with another secret");
    assert!(
        stand_in.problems()[0].contains("the signature does not match"),
        "{:?}",
        stand_in.problems()
    );
}

#[tokio::test]
async fn sends_reuse_the_pooled_connection() {
    for service in Service::ALL {
        let stand_in = ApiStandIn::start(service).await;
        let provider = provider::from_url(&stand_in.url()).expect("the stand-in's URL");
        for n in 0..20 {
            send(provider.as_ref(), &format!("reuse-{n}"))
                .await
                .expect("sent");
        }
        assert_eq!(stand_in.taken(), 20, "{service:?}");
        assert_eq!(
            stand_in.connections(),
            1,
            "{service:?}: one connection for 20 sends"
        );
        let at_once = (0..8).map(|n| provider.send(full_mail(&format!("at-once-{n}"))));
        for sent in futures::future::join_all(at_once).await {
            sent.expect("sent");
        }
        assert!(
            stand_in.connections() <= 8,
            "{service:?}: {}",
            stand_in.connections()
        );
        let before = stand_in.connections();
        send(provider.as_ref(), "after").await.expect("sent");
        assert_eq!(
            stand_in.connections(),
            before,
            "{service:?}: the pool's connections kept"
        );
    }
}

#[tokio::test]
async fn an_api_that_cannot_be_reached_fails_for_now_without_an_attempt() {
    for service in Service::ALL {
        let endpoint = format!("http://127.0.0.1:{}", closed_port());
        let url = service.url_with_key(SECRET, &endpoint);
        let provider = provider::from_url(&url).expect("a URL");
        let error = send(provider.as_ref(), "unreachable")
            .await
            .expect_err("nothing listens");
        assert_eq!(error.failure(), Failure::ForNow, "{service:?}: {error}");
        assert_eq!(error.class(), ErrorClass::Connect, "{service:?}: {error}");
        assert!(!error.reached(), "{service:?}: {error}");
        assert!(!error.to_string().contains(SECRET), "{error}");
    }
}

#[tokio::test]
async fn an_api_that_answers_too_late_fails_for_now_at_the_send_deadline() {
    for service in Service::ALL {
        let stand_in = ApiStandIn::start(service).await;
        let provider = provider::from_url(&stand_in.url()).expect("the stand-in's URL");
        stand_in.answer_next([Answer::new(200, "{}").after(Duration::from_secs(5))]);
        let started = std::time::Instant::now();
        let error = provider
            .send_within(full_mail("late"), Duration::from_millis(300))
            .await
            .expect_err("no answer within the deadline");
        assert!(started.elapsed() < Duration::from_secs(3), "{service:?}");
        assert_eq!(error.failure(), Failure::ForNow, "{service:?}: {error}");
        assert_eq!(error.class(), ErrorClass::Timeout, "{service:?}: {error}");
        assert!(
            error.reached(),
            "{service:?}: the request was under way: {error}"
        );
        // The provider goes on: a new connection for the next mail if need be.
        send(provider.as_ref(), "after-late").await.expect("sent");
        assert_eq!(stand_in.taken(), 1, "{service:?}");
    }
}

#[tokio::test]
async fn sendgrid_refuses_a_mail_without_a_to_recipient_before_sending_it() {
    let stand_in = ApiStandIn::start(Service::SendGrid).await;
    let provider = provider::from_url(&stand_in.url()).expect("the stand-in's URL");
    let request = json!({"from": "noreply@shop.example", "bcc": ["d@example.com"],
                         "subject": "s", "text": "t"});
    let mail = parse_request(request.to_string().as_bytes(), Some("bcc-only")).expect("valid");
    let error = provider.send(mail).await.expect_err("SendGrid needs a to");
    assert!(error.is_for_good(), "{error}");
    assert!(
        error.message().contains("at least one to recipient"),
        "{error}"
    );
    assert_eq!(stand_in.requests(), 0);
}
