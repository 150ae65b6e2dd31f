//! What a request keeps across its attempts: one Message-ID, even when its producer gave
//! it no AMQP message id, so a receiver can tell a retry from a new mail.

use lapin::BasicProperties;
use serde_json::json;

use mailer_testkit::broker::{confirming_channel, pipeline, publish};
use mailer_testkit::process::{eventually, start_worker, stop_worker};
use mailer_testkit::smtp::SmtpServer;

#[tokio::test]
async fn a_request_without_a_message_id_sends_the_same_message_id_on_every_attempt() {
    let smtp = SmtpServer::start();
    let vhost = pipeline("identity", "").await;
    let connection = vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let body = serde_json::to_vec(&json!({
        "from": "Shop <noreply@shop.example>",
        "to": ["retry+451once@example.com"],
        "subject": "Your order",
        "text": "Thank you."
    }))
    .unwrap();
    // No message id, and a priority that must survive the park.
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_priority(3);
    publish(&channel, "mail", "mail.send", &body, properties).await;

    // The first attempt is refused with 451 at the end of DATA, so it is parked; the
    // second, a second later, is delivered.
    let worker = start_worker(
        &vhost.amqp_url(),
        &format!("smtp://127.0.0.1:{}?tls=none", smtp.port),
        3,
    );
    let delivered = eventually(30, "the retried mail delivered", || async {
        let ids = smtp.message_ids();
        (!ids.is_empty()).then_some(ids)
    })
    .await;
    stop_worker(worker);
    let refused = smtp.refused_message_ids();
    assert_eq!(
        refused.len(),
        1,
        "the first attempt reached DATA: {refused:?}"
    );
    assert_eq!(delivered, refused, "one Message-ID across attempts");
    let id = &delivered[0];
    let (local, domain) = id.split_once('@').expect("an id with a domain");
    assert_eq!(domain, "shop.example");
    assert!(
        local.len() == 32 && local.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
}
