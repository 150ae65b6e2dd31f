//! The reconcile's phases: resolve and validate come before any write, so a pipeline
//! that references something missing changes nothing in RabbitMQ or Kubernetes.

use serde_json::json;

use super::broker::secret_uri;
use super::broker::unique_pipeline;
use mailer_testkit::broker::{TestVhost, raw_api};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

#[tokio::test]
async fn a_missing_provider_secret_fails_the_reconcile_before_any_write() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let vhost = TestVhost::fresh("controller-unresolved");
    let user = worker_user(&name);
    connection_secret(&h, &secret_uri());
    let spec = PipelineSpec::new()
        .vhost(&vhost.name)
        .worker(json!({"provider": {"urlSecretKeyRef": {"name": "smtp", "key": "url"}}}))
        .build();
    h.seed_pipeline(&name, spec, true);

    let (result, requests) = h.reconcile(&name).await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "missing-secret", "{error}");
    assert!(
        error
            .to_string()
            .contains("Secret prod/smtp does not exist"),
        "{error}"
    );
    assert_eq!(
        writes(&requests),
        [
            format!("PATCH {}/status", pipeline_path(&name)),
            format!("POST {EVENTS_PATH}")
        ],
        "only the status and an event say so"
    );
    let admin = raw_api();
    assert!(
        admin.get_vhost(&vhost.name).await.is_err(),
        "no vhost was made"
    );
    assert!(admin.get_user(&user).await.is_err(), "no user was made");
    assert!(
        h.fake
            .get(&secret_path(&format!("{name}-worker-amqp")))
            .is_none()
    );

    // Once the Secret exists, everything is built.
    h.seed_secret("smtp", &[("url", "discard://")]);
    let (result, _) = h.reconcile(&name).await;
    result.unwrap();
    admin.get_user(&user).await.expect("the worker user exists");
}
