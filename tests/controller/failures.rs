//! Failures: a broker or Secret that is gone, a missing key, a broker that does not
//! answer, and finding a RabbitmqCluster.

use mailer::controller::context::jittered;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use kube::runtime::controller::Action;
use mailer::controller::error_policy;
use serde_json::json;

use super::broker::{CLOSED_MANAGEMENT_URL, secret_uri};
use mailer_testkit::broker::{TestVhost, raw_api};
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

#[tokio::test]
async fn deletion_completes_when_the_broker_its_secret_or_its_cluster_is_gone() {
    // Past the cleanup deadline: a broker or cluster that is away is not waited for.
    let h = harness_with(Duration::ZERO);
    connection_secret(&h, CLOSED_MANAGEMENT_URL);
    let spec = |secret: &str| {
        PipelineSpec::new()
            .vhost("gone")
            .connection_secret(secret)
            .deletion_policy("Delete")
            .build()
    };
    h.seed_pipeline("unreachable", spec("conn"), true);
    h.seed_pipeline("secretless", spec("missing"), true);
    let clusterless = PipelineSpec::new()
        .cluster_ref(json!({"name": "rmq"}))
        .deletion_policy("Delete")
        .build();
    h.seed_pipeline("clusterless", clusterless, true);
    for (name, says) in [
        ("unreachable", "cannot reach"),
        ("secretless", "Secret prod/missing does not exist"),
        ("clusterless", "RabbitmqCluster prod/rmq: does not exist"),
    ] {
        h.mark_deleted(name);
        let (result, requests) = tokio::time::timeout(Duration::from_secs(60), h.reconcile(name))
            .await
            .expect("deletion does not hang");
        assert_eq!(result.unwrap(), Action::await_change());
        // What is left is said on the pipeline too, before its finalizer goes.
        assert_eq!(
            writes(&requests),
            [
                format!("PATCH {}/status", pipeline_path(name)),
                format!("POST {EVENTS_PATH}"),
                format!("PATCH {}", pipeline_path(name))
            ],
            "{name}"
        );
        let status = &write_to(
            &requests,
            "PATCH",
            &format!("{}/status", pipeline_path(name)),
        )
        .body["status"];
        let topology = condition(status, "TopologyReady");
        assert_eq!(topology["reason"], "CleanupIncomplete", "{status}");
        assert!(
            topology["message"]
                .as_str()
                .unwrap_or_default()
                .contains(says),
            "{status}"
        );
        let published = events(&requests);
        assert_eq!(
            (published[0].0.as_str(), published[0].1.as_str()),
            ("Warning", "CleanupIncomplete")
        );
        assert!(published[0].2.contains(says), "{name}: {published:?}");
        assert!(published[0].2.contains("NOT cleaned up"), "{published:?}");
    }
    assert!(
        h.metrics().contains(&format!(
            "mailer_controller_orphaned_objects_total{{namespace=\"{NS}\"}} 3"
        )),
        "{}",
        h.metrics()
    );
}

#[tokio::test]
async fn a_missing_secret_key_is_reported_once_and_waits_for_a_change() {
    let h = harness();
    h.seed_secret(
        "conn",
        &[("uri", secret_uri().as_str()), ("username", "guest")],
    );
    h.seed_pipeline("shop", PipelineSpec::new().build(), true);
    let (result, requests) = h.reconcile("shop").await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "missing-secret-key");
    let status = &write_to(
        &requests,
        "PATCH",
        &format!("{}/status", pipeline_path("shop")),
    )
    .body["status"];
    let topology = condition(status, "TopologyReady");
    assert_eq!(
        (topology["status"].as_str(), topology["reason"].as_str()),
        (Some("False"), Some("MissingSecretKey"))
    );
    assert!(
        topology["message"]
            .as_str()
            .unwrap()
            .contains("Secret prod/conn has no key \"password\"")
    );
    assert_eq!(condition(status, "Ready")["reason"], "MissingSecretKey");
    assert_eq!(events(&requests)[0].1, "ReconcileFailedMissingSecretKey");
    let policy = error_policy(Arc::new(h.pipeline("shop")), &error, h.ctx.clone());
    assert_eq!(
        policy,
        Action::requeue(jittered(
            RESYNC,
            &h.pipeline("shop").metadata.uid.expect("a uid")
        )),
        "a spec that cannot work waits until its resync"
    );

    let (result, requests) = h.reconcile("shop").await;
    assert!(result.is_err());
    assert_eq!(
        writes(&requests),
        Vec::<String>::new(),
        "the same failure writes nothing again"
    );
    assert!(h.metrics().contains(
        r#"mailer_controller_reconciles_total{result="error",category="missing-secret-key"} 2"#
    ));
    assert!(h.metrics().contains(&format!(
        "mailer_controller_pipeline_ready{{namespace=\"{NS}\",pipeline=\"shop\"}} 0"
    )));
}

#[tokio::test]
async fn transient_failures_back_off_per_pipeline() {
    let h = harness();
    connection_secret(&h, CLOSED_MANAGEMENT_URL);
    for name in ["a", "b"] {
        h.seed_pipeline(name, PipelineSpec::new().build(), true);
    }
    let (result, requests) = h.reconcile("a").await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "unreachable");
    let status = &write_to(
        &requests,
        "PATCH",
        &format!("{}/status", pipeline_path("a")),
    )
    .body["status"];
    assert!(
        condition(status, "TopologyReady")["message"]
            .as_str()
            .unwrap()
            .contains("cannot reach")
    );
    let delays: Vec<Action> = (0..3)
        .map(|_| error_policy(Arc::new(h.pipeline("a")), &error, h.ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [5, 10, 20].map(|s| Action::requeue(Duration::from_secs(s)))
    );
    assert_eq!(
        error_policy(Arc::new(h.pipeline("b")), &error, h.ctx.clone()),
        Action::requeue(Duration::from_secs(5)),
        "each pipeline backs off on its own"
    );
}

#[tokio::test]
async fn a_cluster_ref_finds_the_management_api_through_the_clusters_service() {
    let h = harness();
    h.fake.put(
        "/apis/rabbitmq.com/v1beta1/namespaces/data/rabbitmqclusters/rmq",
        json!({"apiVersion": "rabbitmq.com/v1beta1", "kind": "RabbitmqCluster", "metadata": {"name": "rmq", "namespace": "data",
               "annotations": {"rabbitmq.com/topology-allowed-namespaces": "prod"}}}),
    );
    h.fake.put(
        "/api/v1/namespaces/data/services/rmq",
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rmq", "namespace": "data"},
               "spec": {"ports": [{"name": "amqp", "port": 5672}, {"name": "management", "port": 15672}]}}),
    );
    h.fake.put(
        "/api/v1/namespaces/data/secrets/rmq-default-user",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rmq-default-user", "namespace": "data"},
               "data": {"username": BASE64.encode("admin"), "password": BASE64.encode("pw")}}),
    );
    h.seed_pipeline(
        "shop",
        PipelineSpec::new()
            .cluster_ref(json!({"name": "rmq", "namespace": "data"}))
            .build(),
        true,
    );
    let broker = mailer::controller::broker::connection::locate(&h.ctx.client, &h.pipeline("shop"))
        .await
        .unwrap();
    assert_eq!(broker.management_url, "http://rmq.data.svc:15672");
    assert_eq!(broker.endpoint.username, "admin");

    h.seed_pipeline(
        "other",
        PipelineSpec::new()
            .cluster_ref(json!({"name": "absent"}))
            .build(),
        true,
    );
    let error = mailer::controller::broker::connection::locate(&h.ctx.client, &h.pipeline("other"))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("RabbitmqCluster prod/absent: does not exist"),
        "{error}"
    );
}

#[tokio::test]
async fn deleting_a_pipeline_whose_vhost_is_gone_is_a_clean_deletion() {
    let h = harness();
    connection_secret(&h, &secret_uri());
    let vhost = TestVhost::fresh("controller-gone");
    let spec = PipelineSpec::new()
        .vhost(&vhost.name)
        .deletion_policy("Delete")
        .worker(json!({"userSecret": {"name": "own-user"}}))
        .build();
    h.seed_secret("own-user", &[("username", "guest"), ("password", "guest")]);
    h.seed_pipeline("shop", spec, true);
    h.reconcile("shop").await.0.expect("applied");
    // Someone removes the whole vhost.
    raw_api()
        .delete_vhost(&vhost.name, false)
        .await
        .expect("vhost removed");
    h.mark_deleted("shop");
    let (result, requests) = h.reconcile("shop").await;
    assert_eq!(result.unwrap(), Action::await_change());
    let published = events(&requests);
    assert_eq!(
        (published[0].0.as_str(), published[0].1.as_str()),
        ("Normal", "CleanedUp")
    );
    assert!(published[0].2.contains("does not exist"), "{published:?}");
    assert!(writes(&requests).contains(&format!("PATCH {}", pipeline_path("shop"))));
}

#[tokio::test]
async fn an_amqp_uri_with_credentials_is_refused_before_any_write_saying_why() {
    let h = harness();
    h.seed_secret(
        "conn",
        &[
            ("uri", secret_uri().as_str()),
            ("username", "guest"),
            ("password", "guest"),
            ("amqpUri", "amqp://guest:hunter2@127.0.0.1:5672"),
        ],
    );
    h.seed_pipeline("shop", PipelineSpec::new().build(), true);
    let (result, requests) = h.reconcile("shop").await;
    let error = result.unwrap_err();
    assert_eq!(error.category(), "invalid-secret-value", "{error}");
    let message = error.to_string();
    assert!(
        message.contains("Secret prod/conn, key \"amqpUri\"")
            && message.contains("must not hold credentials"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
    assert_eq!(
        writes(&requests),
        [
            format!("PATCH {}/status", pipeline_path("shop")),
            format!("POST {EVENTS_PATH}")
        ]
    );
}
