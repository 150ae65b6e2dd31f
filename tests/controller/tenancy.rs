//! Tenancy: a pipeline may use a RabbitmqCluster of another namespace only when the
//! cluster lists the pipeline's namespace (or `*`) in
//! `rabbitmq.com/topology-allowed-namespaces`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

const CLUSTER: &str = "/apis/rabbitmq.com/v1beta1/namespaces/data/rabbitmqclusters/rmq";
const ADMIN_SECRET: &str = "/api/v1/namespaces/data/secrets/rmq-default-user";

/// A RabbitmqCluster `data/rmq` with its Service and default user, annotated so.
fn seed_cluster(h: &Harness, allowed: Option<&str>) {
    let mut metadata = json!({"name": "rmq", "namespace": "data"});
    if let Some(allowed) = allowed {
        metadata["annotations"] = json!({"rabbitmq.com/topology-allowed-namespaces": allowed});
    }
    h.fake.put(
        CLUSTER,
        json!({"apiVersion": "rabbitmq.com/v1beta1", "kind": "RabbitmqCluster", "metadata": metadata}),
    );
    h.fake.put(
        "/api/v1/namespaces/data/services/rmq",
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rmq", "namespace": "data"},
               "spec": {"ports": [{"name": "management", "port": 15672}]}}),
    );
    h.fake.put(
        ADMIN_SECRET,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rmq-default-user", "namespace": "data"},
               "data": {"username": BASE64.encode("admin"), "password": BASE64.encode("pw")}}),
    );
}

fn status_of(h: &Harness, name: &str) -> Value {
    h.fake.get(&pipeline_path(name)).unwrap()["status"].clone()
}

#[tokio::test]
async fn a_cluster_of_another_namespace_is_refused_unless_it_lists_the_namespace() {
    let h = harness();
    seed_cluster(&h, Some("billing"));
    let spec = PipelineSpec::new()
        .cluster_ref(json!({"name": "rmq", "namespace": "data"}))
        .deletion_policy("Delete")
        .build();
    h.seed_pipeline("shop", spec, true);

    let (result, requests) = h.reconcile("shop").await;
    let error = result.unwrap_err();
    assert_eq!(error.reason(), "NotAllowed");
    assert!(!error.is_transient(), "it waits for a change");
    assert!(
        !requests.iter().any(|r| r.path == ADMIN_SECRET),
        "the cluster's administrator Secret is not even read"
    );
    assert_eq!(
        writes(&requests),
        [
            format!("PATCH {}/status", pipeline_path("shop")),
            format!("POST {EVENTS_PATH}")
        ],
        "nothing is made for a refused pipeline"
    );
    let status = status_of(&h, "shop");
    let topology = condition(&status, "TopologyReady");
    assert_eq!(topology["reason"], "NotAllowed");
    let message = topology["message"].as_str().unwrap();
    assert!(
        message.contains("rabbitmq.com/topology-allowed-namespaces")
            && message.contains("data/rmq")
            && message.contains("prod"),
        "{message}"
    );
    assert_eq!(condition(&status, "Ready")["reason"], "NotAllowed");
    assert_eq!(events(&requests)[0].1, "ReconcileFailedNotAllowed");

    // Deleting a refused pipeline touches nothing of the other namespace's broker.
    h.mark_deleted("shop");
    let (result, requests) = h.reconcile("shop").await;
    result.unwrap();
    assert!(!requests.iter().any(|r| r.path == ADMIN_SECRET));
    let published = events(&requests);
    assert_eq!(published[0].1, "CleanupIncomplete");
    assert!(published[0].2.contains("does not allow"), "{published:?}");
}

#[tokio::test]
async fn a_cluster_that_lists_the_namespace_or_a_star_is_used() {
    for allowed in ["billing, prod", "*"] {
        let h = harness();
        seed_cluster(&h, Some(allowed));
        h.seed_pipeline(
            "shop",
            PipelineSpec::new()
                .cluster_ref(json!({"name": "rmq", "namespace": "data"}))
                .build(),
            true,
        );
        let broker =
            mailer::controller::broker::connection::locate(&h.ctx.client, &h.pipeline("shop"))
                .await
                .unwrap_or_else(|e| panic!("{allowed:?}: {e}"));
        assert_eq!(broker.endpoint.username, "admin", "{allowed:?}");
    }
}

#[tokio::test]
async fn a_cluster_of_the_own_namespace_needs_no_annotation() {
    let h = harness();
    let annotation_free = json!({"apiVersion": "rabbitmq.com/v1beta1", "kind": "RabbitmqCluster",
                                 "metadata": {"name": "rmq", "namespace": NS}});
    h.fake.put(
        &format!("/apis/rabbitmq.com/v1beta1/namespaces/{NS}/rabbitmqclusters/rmq"),
        annotation_free,
    );
    h.fake.put(
        &format!("/api/v1/namespaces/{NS}/services/rmq"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rmq", "namespace": NS}}),
    );
    h.seed_secret(
        "rmq-default-user",
        &[("username", "admin"), ("password", "pw")],
    );
    h.seed_pipeline(
        "shop",
        PipelineSpec::new()
            .cluster_ref(json!({"name": "rmq"}))
            .build(),
        true,
    );
    mailer::controller::broker::connection::locate(&h.ctx.client, &h.pipeline("shop"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cluster_of_another_namespace_that_does_not_exist_gets_the_same_answer() {
    let h = harness();
    seed_cluster(&h, Some("billing"));
    let refused = |name: &str| {
        PipelineSpec::new()
            .cluster_ref(json!({"name": name, "namespace": "data"}))
            .build()
    };
    h.seed_pipeline("forbidden", refused("rmq"), true);
    h.seed_pipeline("missing", refused("nothing-here"), true);
    let forbidden = h.reconcile("forbidden").await.0.unwrap_err();
    let missing = h.reconcile("missing").await.0.unwrap_err();
    assert_eq!(forbidden.reason(), "NotAllowed");
    assert_eq!(missing.reason(), forbidden.reason());
    assert_eq!(missing.is_transient(), forbidden.is_transient());
    assert_eq!(
        missing.to_string(),
        forbidden
            .to_string()
            .replace("data/rmq", "data/nothing-here"),
        "nothing tells a tenant which clusters exist elsewhere"
    );
    let message = |name: &str| {
        condition(&status_of(&h, name), "TopologyReady")["message"]
            .as_str()
            .unwrap_or_default()
            .replace(name, "")
    };
    assert_eq!(
        message("missing").replace("nothing-here", "rmq"),
        message("forbidden")
    );
}

#[tokio::test]
async fn an_empty_cluster_namespace_is_the_pipelines_own() {
    let h = harness();
    h.fake.put(
        &format!("/apis/rabbitmq.com/v1beta1/namespaces/{NS}/rabbitmqclusters/rmq"),
        json!({"apiVersion": "rabbitmq.com/v1beta1", "kind": "RabbitmqCluster",
               "metadata": {"name": "rmq", "namespace": NS}}),
    );
    h.fake.put(
        &format!("/api/v1/namespaces/{NS}/services/rmq"),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rmq", "namespace": NS}}),
    );
    h.seed_secret(
        "rmq-default-user",
        &[("username", "admin"), ("password", "pw")],
    );
    h.seed_pipeline(
        "shop",
        PipelineSpec::new()
            .cluster_ref(json!({"name": "rmq", "namespace": ""}))
            .build(),
        true,
    );
    let broker = mailer::controller::broker::connection::locate(&h.ctx.client, &h.pipeline("shop"))
        .await
        .expect("the cluster of its own namespace, which needs no annotation");
    assert_eq!(broker.management_url, format!("http://rmq.{NS}.svc:15672"));
    let reads = mailer::controller::broker::secrets::secrets_read(&h.pipeline("shop"));
    assert!(
        reads
            .iter()
            .any(|r| r.namespace == NS && r.name == "rmq-default-user"),
        "{reads:?}"
    );
}
