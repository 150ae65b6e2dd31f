//! `spec.worker.provider.caSecretKeyRef`: the CA of an internal relay reaches the workers
//! (a Secret volume and `MAIL_PROVIDER_CA_FILE`), so they send through a relay whose
//! certificate a private CA signed; a value that is no certificate is said before any
//! write; a new CA rolls the workers.

use lapin::BasicProperties;
use serde_json::json;

use super::broker::unique_pipeline;
use super::broker::{eventually, secret_uri};
use super::worker_pod;
use mailer_testkit::broker::{TestVhost, confirming_channel, publish};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;
use mailer_testkit::tls::TestCa;

#[tokio::test]
async fn the_workers_trust_the_relays_ca_and_a_new_ca_rolls_them() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-ca");
    connection_secret(&h, &secret_uri());
    let ca = TestCa::generate();
    // smtp:// requires STARTTLS: without the CA the worker could not trust this relay.
    let relay = ca.server("starttls", "server");
    h.seed_secret(
        "smtp",
        &[("url", &format!("smtp://127.0.0.1:{}", relay.port))],
    );
    h.seed_secret("relay-tls", &[("ca.crt", "not a certificate")]);
    let spec = PipelineSpec::new().vhost(&test_vhost.name).deletion_policy("Delete").worker(json!({"provider": {"urlSecretKeyRef": {"name": "smtp", "key": "url"},
                                              "caSecretKeyRef": {"name": "relay-tls", "key": "ca.crt"}}})).build();
    h.seed_pipeline(&name, spec, true);

    // A value that is no certificate: said, and nothing made.
    let (result, requests) = h.reconcile(&name).await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "invalid-secret-value", "{error}");
    assert!(
        error
            .to_string()
            .starts_with("Secret prod/relay-tls, key \"ca.crt\": it holds no PEM certificate"),
        "{error}"
    );
    assert_eq!(
        writes(&requests),
        [
            format!("PATCH {}/status", pipeline_path(&name)),
            format!("POST {EVENTS_PATH}")
        ]
    );
    let stored = h.fake.get(&pipeline_path(&name)).unwrap();
    assert_eq!(
        condition(&stored["status"], "Ready")["reason"],
        "InvalidSecretValue"
    );

    // The CA: the workers get it, and send through the relay.
    let ca_pem = std::fs::read_to_string(ca.file("ca.pem")).unwrap();
    h.seed_secret("relay-tls", &[("ca.crt", &ca_pem)]);
    let (result, _) = h.reconcile(&name).await;
    result.unwrap();
    let deployment_path = deployment_path(&format!("{name}-worker"));
    let hash_of = |h: &Harness| {
        h.fake.get(&deployment_path).unwrap()["spec"]["template"]["metadata"]["annotations"]
            ["mailer.dev/secrets-hash"]
            .clone()
    };
    let first_hash = hash_of(&h);
    let worker = worker_pod::start(&h, &deployment_path);
    let connection = test_vhost.connect().await;
    let channel = confirming_channel(&connection).await;
    let request = json!({"from": "Shop <noreply@shop.example>", "to": ["a@example.com"],
                         "subject": "Your order", "text": "Thanks."});
    publish(
        &channel,
        "mail",
        "mail.send",
        request.to_string().as_bytes(),
        BasicProperties::default().with_message_id("ca-1".into()),
    )
    .await;
    let _ = connection.close(200, "done".into()).await;
    eventually(30, "the mail to pass the relay over TLS", || async {
        relay
            .message_ids()
            .iter()
            .any(|id| id.starts_with("ca-1"))
            .then_some(())
    })
    .await;
    drop(worker);

    // A new CA (a rotation) changes the pod template, so the workers roll and read it.
    h.seed_secret("relay-tls", &[("ca.crt", &format!("{ca_pem}\n"))]);
    let (result, _) = h.reconcile(&name).await;
    result.unwrap();
    assert_ne!(hash_of(&h), first_hash, "a new CA rolls the workers");

    h.mark_deleted(&name);
    let (result, _) = h.reconcile(&name).await;
    result.unwrap();
}
