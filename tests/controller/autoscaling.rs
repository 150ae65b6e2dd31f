//! Autoscaling with KEDA: a ScaledObject on the send queue and a TriggerAuthentication
//! on the workers' Secret when KEDA is installed, `AutoscalingUnavailable` when it is not,
//! and the Deployment's replicas left to the autoscaler.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde_json::{Value, json};

use super::broker::secret_uri;
use super::broker::unique_pipeline;
use mailer_testkit::broker::TestVhost;
use mailer_testkit::operator::*;
use mailer_testkit::pipeline::PipelineSpec;

const KEDA: &str = "/apis/keda.sh/v1alpha1";

fn scaled_object_path(name: &str) -> String {
    format!("{KEDA}/namespaces/{NS}/scaledobjects/{name}")
}
fn trigger_authentication_path(name: &str) -> String {
    format!("{KEDA}/namespaces/{NS}/triggerauthentications/{name}")
}

fn spec(vhost: &str) -> Value {
    PipelineSpec::new().vhost(vhost).worker(json!({"replicas": 2, "autoscaling": {"minReplicas": 0, "maxReplicas": 10, "messagesPerWorker": 20}})).build()
}

fn status_of(h: &Harness, name: &str) -> Value {
    h.fake.get(&pipeline_path(name)).unwrap()["status"].clone()
}

#[tokio::test]
async fn without_keda_the_workers_say_what_to_install_and_nothing_crash_loops() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-no-keda");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&test_vhost.name), true);

    let (result, requests) = h.reconcile(&name).await;
    result.expect("a missing KEDA is no failure of the reconcile");
    let worker_deployment = format!("{name}-worker");
    assert!(
        writes(&requests).iter().all(|w| !w.contains("keda.sh")),
        "{:?}",
        writes(&requests)
    );
    let applied = write_to(&requests, "PATCH", &deployment_path(&worker_deployment));
    assert!(
        applied.body["spec"].get("replicas").is_none(),
        "the count is left to an autoscaler: {}",
        applied.body["spec"]
    );
    let status = status_of(&h, &name);
    assert_condition(&status, "TopologyReady", "True", None);
    let worker = condition(&status, "WorkerReady");
    assert_eq!(
        (worker["status"].as_str(), worker["reason"].as_str()),
        (Some("False"), Some("AutoscalingUnavailable"))
    );
    assert!(
        worker["message"].as_str().unwrap().contains("install KEDA"),
        "{worker}"
    );
    assert_eq!(
        condition(&status, "Ready")["reason"],
        "AutoscalingUnavailable"
    );

    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert_eq!(writes(&requests), Vec::<String>::new(), "steady");
}

#[tokio::test]
async fn with_keda_the_send_queue_scales_the_workers_and_their_count_is_left_to_it() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-keda");
    h.fake.install(KEDA, "scaledobjects");
    h.fake.install(KEDA, "triggerauthentications");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&test_vhost.name), true);
    let worker_deployment = format!("{name}-worker");

    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    for path in [
        trigger_authentication_path(&worker_deployment),
        scaled_object_path(&worker_deployment),
    ] {
        let apply = write_to(&requests, "PATCH", &path);
        assert_eq!(apply.content_type, "application/apply-patch+yaml");
        assert_eq!(
            apply.body["metadata"]["ownerReferences"][0]["name"],
            name.as_str()
        );
    }
    let scaled = h.fake.get(&scaled_object_path(&worker_deployment)).unwrap();
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"],
        worker_deployment.as_str()
    );
    assert_eq!(
        (
            scaled["spec"]["minReplicaCount"].as_i64(),
            scaled["spec"]["maxReplicaCount"].as_i64()
        ),
        (Some(0), Some(10))
    );
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(
        trigger["metadata"],
        json!({"protocol": "amqp", "mode": "QueueLength", "value": "20",
               "queueName": "mail.send", "vhostName": test_vhost.name})
    );
    let authentication = h
        .fake
        .get(&trigger_authentication_path(&worker_deployment))
        .unwrap();
    let target = &authentication["spec"]["secretTargetRef"][0];
    assert_eq!(target["parameter"], "host");
    // What KEDA does with it: inspect the send queue with the workers' least-privilege
    // user (a passive declare), which needs no permission beyond theirs.
    let url = h.secret_value(
        target["name"].as_str().unwrap(),
        target["key"].as_str().unwrap(),
    );
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let queue = channel
        .queue_declare(
            "mail.send".into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("KEDA's trigger can count the send queue");
    assert_eq!(queue.message_count(), 0);
    let _ = connection.close(200, "done".into()).await;

    // KEDA's autoscaler sets the count, as its own field manager: no write, no drift.
    let deployments: Api<Deployment> = Api::namespaced(h.ctx.client.clone(), NS);
    deployments
        .patch(
            &worker_deployment,
            &PatchParams::apply("keda-operator").force(),
            &Patch::Apply(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 4}}),
            ),
        )
        .await
        .unwrap();
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert_eq!(
        writes(&requests),
        [format!("PATCH {}/status", pipeline_path(&name))],
        "only the status, for the new count"
    );
    assert!(events(&requests).is_empty(), "{:?}", events(&requests));
    assert_eq!(status_of(&h, &name)["workers"]["desired"], 4);
    let stored = h.fake.get(&deployment_path(&worker_deployment)).unwrap();
    assert_eq!(stored["spec"]["replicas"], 4);
    assert_eq!(
        h.fake
            .field_owners(&deployment_path(&worker_deployment), &["spec", "replicas"]),
        ["keda-operator"],
        "the operator never took the count"
    );
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    assert_eq!(writes(&requests), Vec::<String>::new(), "steady");

    // Autoscaling turned off: KEDA's objects go, and the spec's count is applied again.
    let mut object = h.fake.get(&pipeline_path(&name)).unwrap();
    object["spec"]["worker"] = json!({"replicas": 2});
    h.fake.put(&pipeline_path(&name), object);
    let (result, requests) = h.reconcile(&name).await;
    result.unwrap();
    let done = writes(&requests);
    for path in [
        scaled_object_path(&worker_deployment),
        trigger_authentication_path(&worker_deployment),
    ] {
        assert!(done.contains(&format!("DELETE {path}")), "{done:?}");
        assert!(h.fake.get(&path).is_none());
    }
    let stored = h.fake.get(&deployment_path(&worker_deployment)).unwrap();
    assert_eq!(stored["spec"]["replicas"], 2);
    assert_eq!(
        h.fake
            .field_owners(&deployment_path(&worker_deployment), &["spec", "replicas"]),
        ["mailer-operator"]
    );
}

#[tokio::test]
async fn a_scaled_object_of_the_workers_name_that_is_not_ours_is_a_conflict_before_any_write() {
    let h = harness();
    let (name, _users) = unique_pipeline("shop");
    let test_vhost = TestVhost::fresh("controller-keda-foreign");
    h.fake.install(KEDA, "scaledobjects");
    h.fake.install(KEDA, "triggerauthentications");
    connection_secret(&h, &secret_uri());
    h.seed_pipeline(&name, spec(&test_vhost.name), true);
    let worker_deployment = format!("{name}-worker");
    let theirs = json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                        "metadata": {"name": worker_deployment, "namespace": NS},
                        "spec": {"scaleTargetRef": {"name": "something-else"}}});
    h.fake.put(&scaled_object_path(&worker_deployment), theirs);

    let (result, requests) = h.reconcile(&name).await;
    let error = result.unwrap_err();
    assert_eq!(error.reason(), "Conflict");
    assert!(
        error
            .to_string()
            .contains(&format!("ScaledObject {NS}/{worker_deployment}")),
        "{error}"
    );
    assert_eq!(
        writes(&requests),
        [
            format!("PATCH {}/status", pipeline_path(&name)),
            format!("POST {EVENTS_PATH}")
        ],
        "nothing made, in Kubernetes or RabbitMQ"
    );
    assert!(
        mailer_testkit::broker::raw_api()
            .get_user(&worker_user(&name))
            .await
            .is_err()
    );
    let stored = h.fake.get(&scaled_object_path(&worker_deployment)).unwrap();
    assert_eq!(stored["spec"]["scaleTargetRef"]["name"], "something-else");
}
